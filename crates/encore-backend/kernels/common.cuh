// common.cuh: helpers shared by every kernel file.
//
// NOTE: the Rust loader (and scripts/check-kernels.py) textually PREPENDS this file to
// every `kernels/*.cu` before NVRTC compiles it, so the .cu files must not include it.
// NVRTC has no C++ standard library: only builtin types and the CUDA headers below.
//
// Conventions for every kernel:
// - All arithmetic is in f32; each output element is rounded to its dtype once.
// - Launch shapes depend only on tensor shapes; per-step values (ids, positions, slots,
//   lengths, block tables, sampling parameters) are read from device memory, and every
//   index read from memory is range-checked before it is used as an address.
// - Element offsets that can exceed 2^31 are computed in `long long`.
// - 16-byte vector paths are only taken when the host has checked alignment (a `vec`
//   flag argument); otherwise the kernel falls back to scalar accesses.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

typedef __nv_bfloat16 bf16;
typedef __half f16;

#define FULL_MASK 0xffffffffu

// Programmatic dependent launch (sm_90+). The host launches every encore kernel with
// programmatic stream serialisation allowed, so a kernel may start while the one before it
// on the stream is still finishing; `pdl_enter()`, the first statement of every kernel,
// waits until that predecessor has completed and its writes are visible (a no-op when
// there is none or the launch had no such attribute), then lets the next kernel start
// launching its CTAs, which hides launch latency between dependent kernels. The gemvs
// issue their first weight loads before it (weights never depend on the kernel before);
// nothing they read or write that a kernel may produce is touched before it.
__device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// Tensor parallelism's peer-memory collectives (allreduce.cu; the pushed all-reduce of
// gemv.cu's gemv_push_* and allreduce.cu's pushed_rms_norm_*).
#define AR_MAX_RANKS 8
// The pushed all-reduce's peer table: every rank's staging [3][AR_MAX_RANKS][cap] bytes
// (call c % 3, source rank), all-ones bits where not written (gemv.cu's PUSH).
struct ArPush {
    char* bufs[AR_MAX_RANKS];
    const unsigned int* abort; // the group's abort word (ar_aborted)
};
// The group's abort word: page-locked host memory every rank maps, which the host sets
// when a rank fails (`Backend::abort_group`). A kernel spinning on its peers (the
// one-shot flags, the pushed data) reads it every AR_ABORT_POLL + 1 rounds (a read over
// PCIe, only once a wait has lasted that long) and stops waiting once it is set: it then
// finishes on whatever its buffers hold (the group is broken and its results are
// discarded), so no rank spins forever on a peer that failed.
#define AR_ABORT_POLL 0x3FFu
// A pushed value: all-ones bits mark a slot not yet written, so an output with those bits
// (a NaN) is stored as the canonical NaN instead.
__device__ __forceinline__ bf16 push_value(bf16 v) {
    return __bfloat16_as_ushort(v) == 0xFFFFu ? __ushort_as_bfloat16(0x7FC0u) : v;
}
__device__ __forceinline__ f16 push_value(f16 v) {
    return __half_as_ushort(v) == 0xFFFFu ? __ushort_as_half(0x7E00u) : v;
}
__device__ __forceinline__ float push_value(float v) {
    return __float_as_uint(v) == 0xFFFFFFFFu ? __uint_as_float(0x7FC00000u) : v;
}
// Whether a 16-byte vector of pushed elements of `bytes` each still holds an unwritten one.
__device__ __forceinline__ bool push_unwritten(const uint4& u, int bytes) {
    const unsigned int w[4] = {u.x, u.y, u.z, u.w};
    bool any = false;
#pragma unroll
    for (int i = 0; i < 4; i++)
        any |= bytes == 4 ? w[i] == 0xFFFFFFFFu
                          : ((w[i] & 0xFFFFu) == 0xFFFFu || (w[i] >> 16) == 0xFFFFu);
    return any;
}
__device__ __forceinline__ unsigned int ld_volatile_u32(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.volatile.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ uint4 ld_volatile16(const void* p) {
    uint4 r;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p)
                 : "memory");
    return r;
}
__device__ __forceinline__ void st_release_sys(unsigned int* p, unsigned int v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned int ld_acquire_sys(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
// Whether the group's abort word (host memory the host writes: a system-scope load) is set.
__device__ __forceinline__ bool ar_aborted(const unsigned int* abort) {
    return abort != nullptr && ld_acquire_sys(abort) != 0u;
}
// Staging a peer writes, read past L1 (the same addresses hold new values every other call).
__device__ __forceinline__ uint4 ld_cg16(const void* p) {
    return __ldcg(reinterpret_cast<const uint4*>(p));
}

#define NEG_INF (__int_as_float(0xff800000))

// Logit soft-capping on a score in log2 units: C tanh(s / C), where C = cap * log2(e) > 0
// (`cap tanh(x / cap)` on the natural-units score x = s / log2(e)).
__device__ __forceinline__ float softcap_l2(float s, float c) { return c * tanhf(s / c); }
#define POS_INF (__int_as_float(0x7f800000))

// Per-dtype conversions and 16-byte vector (un)packing. `V` is the number of elements in
// one 16-byte vector.
template <typename T> struct Ty;

template <> struct Ty<float> {
    static constexpr int V = 4;
    static __device__ __forceinline__ float to_f32(float x) { return x; }
    static __device__ __forceinline__ float from_f32(float x) { return x; }
    static __device__ __forceinline__ void unpack(const uint4& u, float* o) {
        o[0] = __uint_as_float(u.x);
        o[1] = __uint_as_float(u.y);
        o[2] = __uint_as_float(u.z);
        o[3] = __uint_as_float(u.w);
    }
    static __device__ __forceinline__ uint4 pack(const float* f) {
        return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
                          __float_as_uint(f[3]));
    }
};

template <> struct Ty<bf16> {
    static constexpr int V = 8;
    static __device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
    static __device__ __forceinline__ bf16 from_f32(float x) { return __float2bfloat16_rn(x); }
    // A bf16 is the top half of an f32: widening is a shift / mask.
    static __device__ __forceinline__ void unpack2(unsigned int w, float* o) {
        o[0] = __uint_as_float(w << 16);
        o[1] = __uint_as_float(w & 0xffff0000u);
    }
    static __device__ __forceinline__ unsigned int pack2(float a, float b) {
        __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<unsigned int*>(&h);
    }
    static __device__ __forceinline__ void unpack(const uint4& u, float* o) {
        unpack2(u.x, o);
        unpack2(u.y, o + 2);
        unpack2(u.z, o + 4);
        unpack2(u.w, o + 6);
    }
    static __device__ __forceinline__ uint4 pack(const float* f) {
        return make_uint4(pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]),
                          pack2(f[6], f[7]));
    }
};

template <> struct Ty<f16> {
    static constexpr int V = 8;
    static __device__ __forceinline__ float to_f32(f16 x) { return __half2float(x); }
    static __device__ __forceinline__ f16 from_f32(float x) { return __float2half_rn(x); }
    static __device__ __forceinline__ void unpack2(unsigned int w, float* o) {
        __half2 h = *reinterpret_cast<__half2*>(&w);
        float2 f = __half22float2(h);
        o[0] = f.x;
        o[1] = f.y;
    }
    static __device__ __forceinline__ unsigned int pack2(float a, float b) {
        __half2 h = __floats2half2_rn(a, b);
        return *reinterpret_cast<unsigned int*>(&h);
    }
    static __device__ __forceinline__ void unpack(const uint4& u, float* o) {
        unpack2(u.x, o);
        unpack2(u.y, o + 2);
        unpack2(u.z, o + 4);
        unpack2(u.w, o + 6);
    }
    static __device__ __forceinline__ uint4 pack(const float* f) {
        return make_uint4(pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]),
                          pack2(f[6], f[7]));
    }
};

template <typename T> __device__ __forceinline__ float to_f32(T x) { return Ty<T>::to_f32(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x) {
    return Ty<T>::from_f32(x);
}

// 16-byte loads / stores. `p` must be 16-byte aligned (the caller's `vec` flag says so).
template <typename T> __device__ __forceinline__ uint4 ld16(const T* p) {
    return *reinterpret_cast<const uint4*>(p);
}
// Through the read-only (non-coherent) path: only for data no thread of the grid writes.
template <typename T> __device__ __forceinline__ uint4 ldg16(const T* p) {
    return __ldg(reinterpret_cast<const uint4*>(p));
}
template <typename T> __device__ __forceinline__ void st16(T* p, uint4 u) {
    *reinterpret_cast<uint4*>(p) = u;
}
// Load one vector of Ty<T>::V elements as f32.
template <typename T> __device__ __forceinline__ void load_vec(const T* p, float* o) {
    Ty<T>::unpack(ld16(p), o);
}
template <typename T> __device__ __forceinline__ void store_vec(T* p, const float* f) {
    st16(p, Ty<T>::pack(f));
}

// silu(g) * u with silu(x) = x / (1 + e^-x): the one formula of silu_mul.cu and of gemv.cu's
// fused activation.
__device__ __forceinline__ float silu_mul_f32(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

// act(g) * u for the gated MLP's activations (args.rs's `Activation::code`): 0 SiLU,
// 1 GELU with tanh, 2 GELU with erf, 3 ReLU^2, 4 gpt-oss's clamped SwiGLU; the CPU's
// `Activation::gated`.
__device__ __forceinline__ float act_mul_f32(int act, float g, float u) {
    switch (act) {
        case 1: {
            const float inner = 0.7978846f * (g + 0.044715f * g * g * g);
            return 0.5f * g * (1.0f + tanhf(inner)) * u;
        }
        case 2:
            return 0.5f * g * (1.0f + erff(g * 0.70710678f)) * u;
        case 3: {
            const float r = fmaxf(g, 0.0f);
            return r * r * u;
        }
        case 4: {
            // gpt-oss's clamped SwiGLU (args.rs's SWIGLU_OAI_LIMIT 7, SWIGLU_OAI_ALPHA 1.702).
            const float gc = fminf(g, 7.0f);
            const float uc = fminf(fmaxf(u, -7.0f), 7.0f);
            return (uc + 1.0f) * (gc / (1.0f + expf(-1.702f * gc)));
        }
        default:
            return silu_mul_f32(g, u);
    }
}

// The factor on a softmax's unnormalised output (attention): 1 / l, or with an attention
// sink (gpt-oss: one more logit whose probability is dropped, args.rs's `Attention::sinks`)
// e^(m - m') / (l e^(m - m') + e^(s - m')), m' = max(m, s); m is what l and the output are
// relative to, in log2 units (the scores carry log2 e), s the head's sink logit (natural
// units, not scaled); 0 when l is 0 (no key seen: zeros, sink or not).
template <typename T>
__device__ __forceinline__ float softmax_inv(float m, float l, const T* sinks, long long head) {
    if (!(l > 0.0f)) return 0.0f;
    if (sinks == nullptr) return 1.0f / l;
    const float s = to_f32(sinks[head]) * 1.4426950408889634f;
    const float m2 = fmaxf(m, s);
    const float c = exp2f(m - m2);
    return c / (l * c + exp2f(s - m2));
}

// Warp reductions (all lanes get the result).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}
__device__ __forceinline__ unsigned long long warp_sum_u64(unsigned long long v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// Block reductions: every thread of the block must call them (they synchronise) and gets
// the result. `sh` is a 32-entry shared array; it may be reused right after the call.
// blockDim.x must be a multiple of 32.
__device__ __forceinline__ float block_sum(float v, float* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < nwarps ? sh[lane] : 0.0f;
    v = warp_sum(v);
    __syncthreads();
    return v;
}
__device__ __forceinline__ float block_max(float v, float* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_max(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < nwarps ? sh[lane] : NEG_INF;
    v = warp_max(v);
    __syncthreads();
    return v;
}
__device__ __forceinline__ unsigned long long block_sum_u64(unsigned long long v,
                                                            unsigned long long* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum_u64(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < nwarps ? sh[lane] : 0ull;
    v = warp_sum_u64(v);
    __syncthreads();
    return v;
}
__device__ __forceinline__ int block_max_int(int v, int* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = __reduce_max_sync(FULL_MASK, v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < nwarps ? sh[lane] : (int)0x80000000;
    v = __reduce_max_sync(FULL_MASK, v);
    __syncthreads();
    return v;
}

// Asynchronous 16-byte global -> shared copy (cp.async.cg: L2 only, bypassing L1);
// `valid == false` writes 16 zero bytes and reads nothing from `gmem`.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    const unsigned int dst = (unsigned int)__cvta_generic_to_shared(smem);
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(n)
                 : "memory");
}
// An 8- or 4-byte cp.async (through L1: .cg copies only 16), zero-filled when !valid.
template <int N> __device__ __forceinline__ void cp_async_ca(void* smem, const void* gmem, bool valid) {
    const unsigned int dst = (unsigned int)__cvta_generic_to_shared(smem);
    const int n = valid ? N : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(gmem), "n"(N),
                 "r"(n)
                 : "memory");
}
// Close this thread's current group of cp.async copies.
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Wait until at most N of this thread's committed groups are still pending.
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Tensor-core helpers (attention_prefill.cu, the quantized mma in qmma_impl). Fragments of
// mma.sync m16n8k16 for lane L (g = L / 4, t = L % 4; two 16-bit elements per 32-bit
// register, the lower column in the low half):
//   A (16x16, row-major): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B (16x8, "col"):      b0 (k = 2t..2t+1, n = g), b1 (k = 2t+8..2t+9, n = g)
//   C (16x8, f32):        c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1)
template <typename T> struct Mma16816;
template <> struct Mma16816<bf16> {
    static __device__ __forceinline__ void mma(float* c, const unsigned int* a,
                                               unsigned int b0, unsigned int b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct Mma16816<f16> {
    static __device__ __forceinline__ void mma(float* c, const unsigned int* a,
                                               unsigned int b0, unsigned int b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// Four 8x8 16-bit matrices (addr: a shared-window address): lanes 8i..8i+7 give the row addresses (16 bytes each) of
// matrix i; register i of lane L receives elements [L / 4][2 (L % 4)] and
// [L / 4][2 (L % 4) + 1] of matrix i (low half first).
__device__ __forceinline__ void ldmatrix_x4(unsigned int addr, unsigned int& r0,
                                               unsigned int& r1, unsigned int& r2,
                                               unsigned int& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// The same, transposed: register i of lane L receives elements [2 (L % 4)][L / 4] and
// [2 (L % 4) + 1][L / 4] of matrix i (low half first).
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned int addr, unsigned int& r0,
                                                     unsigned int& r1, unsigned int& r2,
                                                     unsigned int& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

