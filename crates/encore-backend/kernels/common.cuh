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
// 1 GELU with tanh, 2 GELU with erf, 3 ReLU^2; the CPU's `Activation::apply`.
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
        default:
            return silu_mul_f32(g, u);
    }
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

// ---------------------------------------------------------------------------------------
// Quantized weights: the shared machinery of the q_*.cu files (one per format; each defines
// its format struct and instantiates QUANT_KERNELS). The device layout is src/quant.rs's: a
// row of nb = k / BE blocks is [quant bytes of every block][scale bytes of every block][pad
// to 16], rows at ROW_BYTES; block b's quant bytes are 16-byte aligned (if w is), its scale
// bytes only as aligned as SB.
//
// qgemv: `out[m, n] = sum_k x[m, k] * decode(w)[n, k] (+ bias[n])` for m_rows <= M <= 8, the
// decode-time matmul with a quantized weight (Backend::matmul's semantics: f32 accumulation,
// each output rounded once, the bias added in f32 before that). It is gemv.cu's design with
// the weight decoded in registers: a CTA of QG_WARPS warps; a warp owns R = 2 rows (or, with
// ACT, the gate and up rows of one output); `ksplit` warps share those rows and reduce in
// shared memory in a fixed order. A row is cut into *units*, one lane's share of a block (a
// format's UPB units per block): 32 consecutive units form a chunk, lane l takes unit l of
// each chunk its warp owns (chunks part, part + ksplit, ...), so a warp's loads cover whole
// blocks, and because 32 is a multiple of UPB a lane's position in its block (`sub`) is the
// same in every chunk. Quant bytes are streamed with 16-byte loads that do not allocate in L1
// (the lanes of a block read adjacent 16-byte pieces, a warp load touches whole 32-byte
// sectors); scale bytes with the narrowest aligned loads (lanes of one block read the same
// address, which the load coalesces); x through L1 (every warp of the grid re-reads it).
// UNROLL chunks' loads are in flight before any is used.
//
// The arithmetic: a unit's values come in runs of 16 consecutive k that share a scale.
// Most formats decode a value as `A * F + B` with F = 0.5 + q / 256 built by one byte
// permute (q < 128 placed in bits 16..23 under the exponent of 0.5: exact), so a run adds
// A * sum(F * x) + B * sum(x) to the accumulator: one FMA per value and row, the sum of x
// shared by the warp's rows. Q8_0 and FP8 decode the value itself and add A * sum(v * x).
// The reference (quant.rs) decodes with other roundings; the difference is in the f32
// accumulation's last bits.
//
// dequant: decode every value exactly as quant.rs does (same f32 operations in the same
// order, no contraction) and round it to T once; out is dense [n, k].

#define QG_THREADS 256
#define QG_WARPS (QG_THREADS / 32)

// Streaming loads (ld.global.nc, no L1 allocation) of 16, 8, 4 and 2 bytes. (Plain loads
// where __CUDA_ARCH__ is not defined: a host build of these files for testing.)
__device__ __forceinline__ uint4 q_ld128(const void* p) {
#ifdef __CUDA_ARCH__
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
#else
    return *reinterpret_cast<const uint4*>(p);
#endif
}
__device__ __forceinline__ uint2 q_ld64(const void* p) {
#ifdef __CUDA_ARCH__
    uint2 r;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n"
                 : "=r"(r.x), "=r"(r.y)
                 : "l"(p));
    return r;
#else
    return *reinterpret_cast<const uint2*>(p);
#endif
}
__device__ __forceinline__ unsigned int q_ld32(const void* p) {
#ifdef __CUDA_ARCH__
    unsigned int r;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];\n" : "=r"(r) : "l"(p));
    return r;
#else
    return *reinterpret_cast<const unsigned int*>(p);
#endif
}
__device__ __forceinline__ unsigned int q_ld16(const void* p) {
#ifdef __CUDA_ARCH__
    unsigned short r;
    asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];\n" : "=h"(r) : "l"(p));
    return r;
#else
    return *reinterpret_cast<const unsigned short*>(p);
#endif
}

// Word i (0..3, a constant after unrolling) of a 16-byte vector.
__device__ __forceinline__ unsigned int q_word(const uint4& u, int i) {
    return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w;
}
// The f16 in the low 16 bits of `bits`.
__device__ __forceinline__ float q_f16(unsigned int bits) {
    return __half2float(__ushort_as_half((unsigned short)(bits & 0xffffu)));
}
// The two f16 of a word (low half first).
__device__ __forceinline__ float2 q_f16x2(unsigned int bits) {
    __half2 h = *reinterpret_cast<__half2*>(&bits);
    return __half22float2(h);
}
// 0.5 + b / 256 for byte i of v (b < 128; i a constant after unrolling): one PRMT. A q of
// n bits stored as b = q << (7 - n) gives F = 0.5 + q / 2^(n + 1).
__device__ __forceinline__ float q_mag(unsigned int v, int i) {
    return __uint_as_float(__byte_perm(0x3F000000u, v, 0x3010u | ((4 + i) << 8)));
}
// q_mag of the four bytes of v, in byte order.
__device__ __forceinline__ void q_mag4(unsigned int v, float* f) {
#pragma unroll
    for (int e = 0; e < 4; ++e) f[e] = q_mag(v, e);
}
// v << s for s >= 0, v >> -s otherwise (s a constant after unrolling).
__device__ __forceinline__ unsigned int q_shift(unsigned int v, int s) {
    return s >= 0 ? v << s : v >> -s;
}
// Bits 0..3 of t moved to bit 6 of bytes 0..3 (the fifth bits of four 5-bit values stored
// as q << 2).
__device__ __forceinline__ unsigned int q_spread4(unsigned int t) {
    return ((t & 0xFu) * 0x08102040u) & 0x40404040u;
}

// One run of 16 consecutive k (x + m * k + 0..15, 16-byte aligned) for the warp's R rows.
// SH > 0: f holds F = 0.5 + q / 2^SH (q_mag of the byte q << (8 - SH)) and
// the values are alpha * q + beta, so
//   acc[r][m] += alpha[r] * (2^SH sum(F x) - 2^(SH-1) sum(x)) + beta[r] * sum(x)
// (sum(x) shared by the rows). The q sit in the top bits of F's mantissa, so the 0.5 that
// cancels costs about one bit of the f32 sums. SH == 0: f holds the values themselves and
// acc += alpha * sum(f x).
template <typename T, int M, int R, int SH>
__device__ __forceinline__ void q_run16(const T* __restrict__ x, int k, int m_rows,
                                        const float (&f)[R][16], const float (&alpha)[R],
                                        const float (&beta)[R], float (&acc)[R][M]) {
    constexpr int V = Ty<T>::V;
    constexpr float SCALE = (float)(1 << SH);
#pragma unroll
    for (int m = 0; m < M; ++m) {
        if (M == 1 || m < m_rows) {
            float xv[16];
#pragma unroll
            for (int v = 0; v < 16 / V; ++v)
                Ty<T>::unpack(ldg16(x + (long long)m * k + v * V), xv + v * V);
            float sx = 0.0f, sxh = 0.0f;
            if (SH > 0) {
                float s0 = xv[0], s1 = xv[1];
#pragma unroll
                for (int i = 2; i < 16; i += 2) {
                    s0 += xv[i];
                    s1 += xv[i + 1];
                }
                sx = s0 + s1;
                sxh = -0.5f * SCALE * sx;
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                float s = f[r][0] * xv[0];
#pragma unroll
                for (int i = 1; i < 16; ++i) s = fmaf(f[r][i], xv[i], s);
                if (SH > 0) {
                    acc[r][m] = fmaf(alpha[r], fmaf(SCALE, s, sxh), acc[r][m]);
                    acc[r][m] = fmaf(beta[r], sx, acc[r][m]);
                } else {
                    acc[r][m] = fmaf(alpha[r], s, acc[r][m]);
                }
            }
        }
    }
}

// Bytes of one device row of k values of format F.
template <class F> __device__ __forceinline__ long long q_row_bytes(int k) {
    return ((long long)(k / F::BE) * (F::QB + F::SB) + 15) & ~15ll;
}

// The end of a gemv (gemv.cu's gemv_impl, qgemv_impl below): each warp's R x M partial
// sums are reduced over its lanes (every lane gets the sums), then over the ksplit warps
// of the same rows through `red` [warps][R * M] in a fixed order; part 0 then holds them.
template <int M, int R>
__device__ __forceinline__ void gemv_reduce(float (&acc)[R][M], float (*red)[R * M], int lane,
                                            int warp, int part, int ksplit) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] = warp_sum(acc[r][m]);
    if (ksplit > 1) {
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int m = 0; m < M; ++m) red[warp][r * M + m] = acc[r][m];
        }
        __syncthreads();
        if (part == 0) {
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int m = 0; m < M; ++m) {
                    float s = 0.0f;
                    for (int p = 0; p < ksplit; ++p) s += red[warp + p][r * M + m];
                    acc[r][m] = s;
                }
        }
    }
}
// A gemv's outputs, on part 0 after gemv_reduce: lane r * M + m calls store(m, n, value)
// for row n = n0 + r < n_rows and m < m_rows, value = the sum plus bias[n] in f32 (not yet
// rounded).
template <typename T, int M, int R, typename Store>
__device__ __forceinline__ void gemv_each_output(const float (&acc)[R][M],
                                                 const T* __restrict__ bias, int n0,
                                                 int n_rows, int m_rows, int lane,
                                                 Store store) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int n = n0 + r;
        if (n < n_rows) {
            const float b = bias != nullptr ? to_f32(bias[n]) : 0.0f;
#pragma unroll
            for (int m = 0; m < M; ++m)
                if (lane == r * M + m && m < m_rows) store(m, n, acc[r][m] + b);
        }
    }
}
// The gate/up gemv's output: gate and up rounded to T as a matmul would, then
// act(gate) * up rounded to the output type.
template <typename T, typename OutT>
__device__ __forceinline__ void gemv_store_act(int act, float gate, float up, OutT* out) {
    const float g = to_f32(from_f32<T>(gate));
    const float u = to_f32(from_f32<T>(up));
    *out = from_f32<OutT>(act_mul_f32(act, g, u));
}

// ACT: M = 1, R = 2: the warp of output j reads gate row j and up row n_rows + j, rounds
// both sums to T as a matmul would and writes out[j] = act(gate) * up rounded to T, exactly
// what matmul + silu_mul.cu's act_mul produce (gemv.cu's gemv_act).
template <class F, typename T, typename OutT, int M, int R, bool ACT>
__device__ __forceinline__ void qgemv_impl(const T* __restrict__ x,
                                           const unsigned char* __restrict__ w,
                                           const T* __restrict__ bias, OutT* __restrict__ out,
                                           int m_rows, int n_rows, int k, int ksplit,
                                           int act = 0) {
    constexpr int UN = F::UNROLL;
    static_assert(32 % F::UPB == 0, "a chunk holds whole blocks");
    static_assert(!ACT || (M == 1 && R == 2), "ACT pairs one gate row with one up row");
    __shared__ float red[QG_WARPS][R * M];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int OUTS = ACT ? 1 : R;
    const int rows_per_cta = QG_WARPS / ksplit * OUTS;
    const int n0 = blockIdx.x * rows_per_cta + (warp / ksplit) * OUTS;
    const int part = warp - (warp / ksplit) * ksplit;
    const int nb = k / F::BE;
    const long long row_bytes = q_row_bytes<F>(k);
    const int units = nb * F::UPB;
    const int nfull = units >> 5, nchunks = (units + 31) >> 5;
    const int sub = lane & (F::UPB - 1);

    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;

    // Rows past the end re-read the last row (never written): no per-load branches.
    const unsigned char* wr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int row = ACT ? n0 + r * n_rows : min(n0 + r, n_rows - 1);
        wr[r] = w + (long long)row * row_bytes;
    }
    // The first round of weight loads goes out before the PDL wait, as in gemv.cu.
    typename F::Unit un[UN][R];
#ifdef GEMV_LATE_LOADS
    const bool early = false;
#else
    const bool early = n0 < n_rows && part + (UN - 1) * ksplit < nfull;
#endif
    if (early) {
#pragma unroll
        for (int u = 0; u < UN; ++u) {
            const int b = (((part + u * ksplit) << 5) + lane) / F::UPB;
#pragma unroll
            for (int r = 0; r < R; ++r) F::load(un[u][r], wr[r], nb, b, sub);
        }
    }
    pdl_enter();

    if (n0 < n_rows) {
        int c = part;
        for (; c + (UN - 1) * ksplit < nfull; c += UN * ksplit) {
            if (!early || c != part) {
#pragma unroll
                for (int u = 0; u < UN; ++u) {
                    const int b = (((c + u * ksplit) << 5) + lane) / F::UPB;
#pragma unroll
                    for (int r = 0; r < R; ++r) F::load(un[u][r], wr[r], nb, b, sub);
                }
            }
#pragma unroll
            for (int u = 0; u < UN; ++u) {
                const int b = (((c + u * ksplit) << 5) + lane) / F::UPB;
                F::template dot<T, M, R>(un[u], sub, x + (long long)b * F::BE, k, m_rows, acc);
            }
        }
        // The rest, one chunk at a time (the last one may be partial).
        for (; c < nchunks; c += ksplit) {
            const int unit = (c << 5) + lane;
            if (unit < units) {
                const int b = unit / F::UPB;
                typename F::Unit un[R];
#pragma unroll
                for (int r = 0; r < R; ++r) F::load(un[r], wr[r], nb, b, sub);
                F::template dot<T, M, R>(un, sub, x + (long long)b * F::BE, k, m_rows, acc);
            }
        }
    }
    gemv_reduce<M, R>(acc, red, lane, warp, part, ksplit);
    if (ACT) {
        if (part == 0 && n0 < n_rows && lane == 0)
            gemv_store_act<T>(act, acc[0][0], acc[R - 1][0], out + n0);
    } else if (part == 0) {
        gemv_each_output<T, M, R>(acc, bias, n0, n_rows, m_rows, lane,
                                  [&](int m, int n, float v) {
                                      out[(long long)m * n_rows + n] = from_f32<OutT>(v);
                                  });
    }
}

// Where a mixture-of-experts layer's experts lie (every expert kernel takes one): expert e
// is slot s = slot_of[e] (the expert cache's slots under a weight budget), or s = e when
// slot_of is null (the stacks: gate/up [2 E I, H], down [E H, I]). Slot s's gate rows start
// at gu + s * gu_stride, its up rows up_off bytes further, its down rows at dn + s *
// dn_stride. The stacks: gu_stride = I row bytes, up_off = E I row bytes, dn_stride = H row
// bytes.
struct MoeExperts {
    const unsigned char* gu;
    const unsigned char* dn;
    const int* slot_of;
    long long gu_stride, up_off, dn_stride;
};
__device__ __forceinline__ long long moe_slot(const MoeExperts& m, int e) {
    return m.slot_of != nullptr ? (long long)m.slot_of[e] : (long long)e;
}
__device__ __forceinline__ const unsigned char* moe_gate(const MoeExperts& m, int e) {
    return m.gu + moe_slot(m, e) * m.gu_stride;
}
__device__ __forceinline__ const unsigned char* moe_down(const MoeExperts& m, int e) {
    return m.dn + moe_slot(m, e) * m.dn_stride;
}

// qmoe: a mixture-of-experts layer's quantized experts for a few token rows (Backend::moe's
// decode path; moe.cu routes first and holds the dense version). Expert rows are short (a
// Qwen3-30B-A3B expert's down rows are 768 values: 6 Q4_K units), so a warp is cut into
// lane groups of G lanes (a power of two, at least a row's units or 32), each owning one
// output: its lanes take units gl, gl + G, ... of the output's rows (the loads of a group
// cover whole blocks, as qgemv's chunks do) and reduce by shuffles inside the group.
// qmoe_gate_up: grid (ceil(inter / outputs per CTA), pairs); the group of output j of pair
//   p = t * top_k + s reads expert e = ids[p]'s gate row j and up row j (MoeExperts: in the
//   stacks, rows e I + j and (E + e) I + j) against x[t] and writes act[p, j] =
//   silu(round_T(g)) * round_T(u), rounded to T.
// qmoe_down: grid (ceil(hidden / (2 * 32 / G)), n); a lane group owns outputs h, h + 1 of
//   token t and reads down rows h, h + 1 of a chosen expert against act[p]; the sum
//   of w[p] * round_T(dot) over the slots is f32, in slot order, rounded once (moe.cu's).
// An expert id out of range (never written by moe_route) contributes nothing.
template <class F, typename T, int R>
__device__ __forceinline__ void qmoe_dot(const unsigned char* const (&wr)[R],
                                         const T* __restrict__ x, int k, int gl, int g,
                                         float (&acc)[R][1]) {
    const int nb = k / F::BE;
    const int units = nb * F::UPB;
    const int sub = gl & (F::UPB - 1);
    for (int unit = gl; unit < units; unit += g) {
        const int b = unit / F::UPB;
        typename F::Unit un[R];
#pragma unroll
        for (int r = 0; r < R; ++r) F::load(un[r], wr[r], nb, b, sub);
        F::template dot<T, 1, R>(un, sub, x + (long long)b * F::BE, k, 1, acc);
    }
}

// The sum over a lane group of g lanes (a power of two <= 32, groups aligned to g): every
// lane of the warp must call it.
__device__ __forceinline__ float qmoe_group_sum(float v, int g) {
    for (int o = g >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

template <class F, typename T>
__device__ __forceinline__ void qmoe_gate_up_impl(const T* __restrict__ x, const MoeExperts& w,
                                                  const int* __restrict__ ids, T* __restrict__ act,
                                                  int hidden, int inter, int experts, int top_k,
                                                  int g) {
    const int gl = threadIdx.x & (g - 1);
    const int j = blockIdx.x * (QG_THREADS / g) + threadIdx.x / g;
    const long long p = blockIdx.y;
    const int e = ids[p];
    const bool live = j < inter && e >= 0 && e < experts;
    float acc[2][1] = {{0.0f}, {0.0f}};
    if (live) {
        const long long row_bytes = q_row_bytes<F>(hidden);
        const unsigned char* gate = moe_gate(w, e) + j * row_bytes;
        const unsigned char* const wr[2] = {gate, gate + w.up_off};
        qmoe_dot<F, T, 2>(wr, x + (p / top_k) * hidden, hidden, gl, g, acc);
    }
    const float sg = qmoe_group_sum(acc[0][0], g), su = qmoe_group_sum(acc[1][0], g);
    if (j < inter && gl == 0)
        act[p * inter + j] = from_f32<T>(live ? silu_mul_f32(to_f32(from_f32<T>(sg)),
                                                             to_f32(from_f32<T>(su)))
                                              : 0.0f);
}

// The down projection: CTA (x, t) owns outputs h0 .. h0 + 2 G' (G' = 32 / g lane groups of
// a warp, two outputs each) of token t; warp w takes slots w, w + QG_WARPS, .. (the slots'
// expert rows in parallel: at batch 1 the CTAs alone would not fill the GPU), rounds each
// product to T into shared memory, and one thread per output sums them in slot order.
#define QMOE_MAX_TOP_K 32
template <class F, typename T>
__device__ __forceinline__ void qmoe_down_impl(const T* __restrict__ act, const MoeExperts& down,
                                               const int* __restrict__ ids,
                                               const float* __restrict__ weights,
                                               T* __restrict__ out, int hidden, int inter,
                                               int experts, int top_k, int g) {
    __shared__ float red[QMOE_MAX_TOP_K][64];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gl = lane & (g - 1), grp = lane / g;
    const int outs = 2 * (32 / g);
    const int h0 = blockIdx.x * outs;
    const int h = h0 + 2 * grp;
    const long long t = blockIdx.y;
    const long long row_bytes = q_row_bytes<F>(inter);
    for (int s = warp; s < top_k; s += QG_WARPS) {
        const long long p = t * top_k + s;
        const int e = ids[p];
        const bool live = h < hidden && e >= 0 && e < experts;
        float acc[2][1] = {{0.0f}, {0.0f}};
        if (live) {
            // A second row past the end re-reads the first (never written).
            const unsigned char* d = moe_down(down, e) + (long long)h * row_bytes;
            const unsigned char* const wr[2] = {d, h + 1 < hidden ? d + row_bytes : d};
            qmoe_dot<F, T, 2>(wr, act + p * inter, inter, gl, g, acc);
        }
        const float y0 = qmoe_group_sum(acc[0][0], g), y1 = qmoe_group_sum(acc[1][0], g);
        if (gl == 0) {
            red[s][2 * grp] = live ? to_f32(from_f32<T>(y0)) : 0.0f;
            red[s][2 * grp + 1] = live ? to_f32(from_f32<T>(y1)) : 0.0f;
        }
    }
    __syncthreads();
    const int o = threadIdx.x;
    if (o < outs && h0 + o < hidden) {
        float total = 0.0f;
        for (int s = 0; s < top_k; ++s) {
            const int e = ids[t * top_k + s];
            if (e >= 0 && e < experts) total = fmaf(weights[t * top_k + s], red[s][o], total);
        }
        out[t * hidden + h0 + o] = from_f32<T>(total);
    }
}

// Values 32 gi .. 32 gi + 31 of a row of format F: its bytes (F::load32, into F::Raw), then
// the values (F::decode_raw, bit-identical to quant.rs's decode_block).
template <class F>
__device__ __forceinline__ void q_decode32(const unsigned char* row, int nb, int gi, float* v) {
    typename F::Raw r;
    F::load32(row, nb, gi, r);
    F::decode_raw(r, gi, v);
}

// Dense T [n_rows, k] from a quantized [n_rows, k]: one thread per 32 consecutive values
// (q_decode32), written as 16-byte vectors (out 16-byte aligned; k a multiple of 32).
template <class F, typename T>
__device__ __forceinline__ void qdequant_impl(const unsigned char* __restrict__ w,
                                              T* __restrict__ out, int n_rows, int k) {
    constexpr int V = Ty<T>::V;
    const int nb = k / F::BE;
    const long long row_bytes = q_row_bytes<F>(k);
    const int groups = k >> 5;
    const long long total = (long long)n_rows * groups;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x; g < total; g += stride) {
        const long long row = g / groups;
        const int gi = (int)(g - row * groups);
        float v[32];
        q_decode32<F>(w + row * row_bytes, nb, gi, v);
        T* o = out + row * k + gi * 32;
#pragma unroll
        for (int i = 0; i < 32; i += V) store_vec(o + i, v + i);
    }
}

// Quantized weights on the tensor cores (x of more than 8 rows in bf16 or f16: prefill and
// large decode batches). out[M, N] = x[M, K] · decode(w)ᵀ (+ bias) with a CTA tile of BM (32,
// 64 or 128) rows of x by QM_BN = 128 rows of w by QM_BK = 64 values of k; 8 warps in 2 (m) by
// 4 (n), each (BM / 2) x 32 as m16n8k16 tiles. Per k tile the x tile streams into shared
// memory by cp.async while each thread loads one 32-value group of w (F::load32), decodes it
// (F::decode_raw) and stores it as T: the weight is decoded once per CTA, in shared memory,
// never written to global memory. Two stages in shared memory (tile t + 1 is decoded while
// tile t multiplies), and w's bytes are loaded two tiles ahead, in registers. Rows of
// shared memory are padded to QM_BK + 8 elements, so ldmatrix is free of bank conflicts.
// k need not be a multiple of QM_BK (it is one of 32): the tail is zero-filled.
// Split-K on grid z: with gridDim.z > 1, CTA z sums k tiles [z T / Z, (z + 1) T / Z) and
// writes f32 partials to ws[z][M][N]; qmma_reduce adds them in z order (deterministic).
#define QM_BN 128
#define QM_BK 64
#define QM_LD (QM_BK + 8)
#define QM_THREADS 256
// Dynamic shared memory of the BM variant; `qmma_smem_bytes` in quant.rs mirrors it.
#define QM_SMEM_BYTES(BM) (2 * ((BM) + QM_BN) * QM_LD * 2)

// Stage `stage` of the x tile for k tile kt: cp.async, one group (see qmma_impl).
template <typename T, int BM>
__device__ __forceinline__ void qmma_load_x(T* sA, int stage, int kt, const T* __restrict__ x,
                                            int m0, int m_rows, int k) {
    const int tid = threadIdx.x;
    T* a = sA + stage * BM * QM_LD;
#pragma unroll
    for (int i = 0; i < BM * (QM_BK / 8) / QM_THREADS; ++i) {
        const int c = tid + i * QM_THREADS;
        const int r = c >> 3, part = c & 7;
        const int kk = kt * QM_BK + part * 8;
        const bool ok = m0 + r < m_rows && kk < k;
        cp_async16(a + r * QM_LD + part * 8, ok ? x + (long long)(m0 + r) * k + kk : x, ok);
    }
    cp_async_commit();
}

// Whether format F decodes a 32-value group straight to bf16 pairs with integer and bf16x2
// ops (`F::decode_bf16`), for a bf16 qmma; a format's file specializes it.
template <class F> struct QDecodeBf16 {
    static constexpr bool value = false;
};
template <class A, class B> struct QSame {
    static constexpr bool value = false;
};
template <class A> struct QSame<A, A> {
    static constexpr bool value = true;
};
// a * b + c on bf16 pairs, rounded once.
__device__ __forceinline__ unsigned int q_bf2_fma(unsigned int a, unsigned int b, unsigned int c) {
    unsigned int d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
// The bf16 pair (x, x).
__device__ __forceinline__ unsigned int q_bf2(float x) {
    const unsigned int h = __bfloat16_as_ushort(__float2bfloat16_rn(x));
    return h | (h << 16);
}

// The K-quants' (Q4_K, Q5_K) scale bytes `s`: d and dmin (f16) in s.x, then 12 bytes of
// 6-bit scales and mins. The scales (sc) and mins (mn) of sub-blocks 0..3 (word 0) and
// 4..7 (word 1), one per byte (quant.rs's scale_min_k4 for all eight at once).
__device__ __forceinline__ void q_k4_scales(const uint4& s, unsigned int (&sc)[2],
                                            unsigned int (&mn)[2]) {
    sc[0] = s.y & 0x3F3F3F3Fu;
    mn[0] = s.z & 0x3F3F3F3Fu;
    sc[1] = (s.w & 0x0F0F0F0Fu) | ((s.y >> 2) & 0x30303030u);
    mn[1] = ((s.w >> 4) & 0x0F0F0F0Fu) | ((s.z >> 2) & 0x30303030u);
}
// d * sc and dmin * m of sub-block j (each product rounded once), as quant.rs decodes.
__device__ __forceinline__ float2 q_k4_sub(const uint4& s, int j) {
    unsigned int sc[2], mn[2];
    q_k4_scales(s, sc, mn);
    const float2 dd = q_f16x2(s.x);
    const unsigned int scw = (j >> 2) ? sc[1] : sc[0], mnw = (j >> 2) ? mn[1] : mn[0];
    const float scj = (float)((scw >> (8 * (j & 3))) & 0xFFu);
    const float mj = (float)((mnw >> (8 * (j & 3))) & 0xFFu);
    return make_float2(__fmul_rn(dd.x, scj), __fmul_rn(dd.y, mj));
}

// Four integers below 128, one a byte of `q`, as two bf16 pairs in byte order: `lo` =
// (q0, q1), `hi` = (q2, q3), each (q - off) * s + c. PRMT spreads a pair to the low bits of
// two halves and LOP3 or-s in 0x4300, the bf16 128 + q; fma by 1 and `neg` (the pair
// -(128 + off), e.g. 0xC308C308 for off 8) leaves q - off exactly; fma by `s` and `c`
// (bf16 pairs) rounds once. About 2 instructions a value, against 6 through f32.
__device__ __forceinline__ void q_bf2_bytes(unsigned int q, unsigned int neg, unsigned int s,
                                            unsigned int c, unsigned int& lo, unsigned int& hi) {
    const unsigned int p01 = __byte_perm(q, 0u, 0x4140) | 0x43004300u;
    const unsigned int p23 = __byte_perm(q, 0u, 0x4342) | 0x43004300u;
    lo = q_bf2_fma(q_bf2_fma(p01, 0x3F803F80u, neg), s, c);
    hi = q_bf2_fma(q_bf2_fma(p23, 0x3F803F80u, neg), s, c);
}
// bf16 pairs: -0 (c of a plain product), -128 (off 0).
#define Q_BF2_NEG0 0x80008000u
#define Q_BF2_M128 0xC300C300u
// The bf16 pairs (hi, hi) and (lo, lo) of `x` split as hi = bf16(x), lo = bf16(x - hi)
// (x - hi is exact): x to 16 significant bits, for q_bf2_bytes_split.
__device__ __forceinline__ void q_bf2_split(float x, unsigned int& hi, unsigned int& lo) {
    const float h = __bfloat162float(__float2bfloat16_rn(x));
    hi = q_bf2(h);
    lo = q_bf2(x - h);
}
// As q_bf2_bytes with c = -0, for a scale s = hi + lo (q_bf2_split): (q - off) * lo rounded,
// then (q - off) * hi plus it rounded once, so each value is (q - off) * s rounded to bf16
// once (within 2^-16 of it), not the product of an already rounded scale (two roundings of
// up to 2^-9 each, the first shared by a whole sub-block).
__device__ __forceinline__ void q_bf2_bytes_split(unsigned int q, unsigned int neg,
                                                  unsigned int s_hi, unsigned int s_lo,
                                                  unsigned int& lo, unsigned int& hi) {
    const unsigned int p01 = __byte_perm(q, 0u, 0x4140) | 0x43004300u;
    const unsigned int p23 = __byte_perm(q, 0u, 0x4342) | 0x43004300u;
    const unsigned int q01 = q_bf2_fma(p01, 0x3F803F80u, neg);
    const unsigned int q23 = q_bf2_fma(p23, 0x3F803F80u, neg);
    lo = q_bf2_fma(q01, s_hi, q_bf2_fma(q01, s_lo, Q_BF2_NEG0));
    hi = q_bf2_fma(q23, s_hi, q_bf2_fma(q23, s_lo, Q_BF2_NEG0));
}

// This thread's group gi of the w tile (row t / 2, group 2 kt + t % 2) into stage `stage`
// as T, from the bytes `raw` loaded earlier (zeros past k).
template <class F, typename T>
__device__ __forceinline__ void qmma_store_w(T* sB, int stage, const typename F::Raw& raw,
                                             int gi, int groups) {
    const int tid = threadIdx.x;
    T* b = sB + stage * QM_BN * QM_LD + (tid >> 1) * QM_LD + (tid & 1) * 32;
    if constexpr (QDecodeBf16<F>::value && QSame<T, bf16>::value) {
        unsigned int o[16];
        if (gi < groups) {
            F::decode_bf16(raw, gi, o);
        } else {
#pragma unroll
            for (int i = 0; i < 16; ++i) o[i] = 0u;
        }
        uint4* d = reinterpret_cast<uint4*>(b);
#pragma unroll
        for (int i = 0; i < 4; ++i) d[i] = make_uint4(o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]);
        return;
    }
    float v[32];
    if (gi < groups) {
        F::decode_raw(raw, gi, v);
    } else {
#pragma unroll
        for (int i = 0; i < 32; ++i) v[i] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 32; i += 8) store_vec(b + i, v + i);
}

// The main loop of qmma_impl and the grouped MoE GEMM (gmoe_impl): k tiles [kt0, kt1) of
// this CTA's x tile (`load_x(stage, kt)` issues its cp.async copies and commits them) by
// the 128 w rows whose thread row (threadIdx.x / 2) is `wrow`, accumulated into `acc` in
// the mma fragment layout (warp (wm, wn): rows wm BM / 2 + mt 16 + g (+ 8), columns wn 32 +
// nt 8 + 2 t4 (+ 1)).
template <class F, typename T, int BM, class LoadX>
__device__ __forceinline__ void qmma_core(T* sA, T* sB, LoadX load_x,
                                          const unsigned char* __restrict__ wrow, int k, int kt0,
                                          int kt1, float (&acc)[BM / 32][4][4]) {
    constexpr int MT = BM / 32;  // m16 tiles per warp
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = warp >> 2, wn = warp & 3;
    const int nb = k / F::BE;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

    const unsigned int a_sh = (unsigned int)__cvta_generic_to_shared(sA);
    const unsigned int b_sh = (unsigned int)__cvta_generic_to_shared(sB);
    // ldmatrix row addresses of this lane (bytes): A rows lane % 16 at k (lane / 16) * 8;
    // B n rows (lane % 8) + 8 (lane / 16) at k 8 ((lane / 8) % 2), two n8 tiles per x4.
    const unsigned int a_off =
        ((wm * (BM / 2) + (lane & 15)) * QM_LD + (lane >> 4) * 8) * 2;
    const unsigned int b_off =
        ((wn * 32 + (lane & 7) + ((lane >> 4) << 3)) * QM_LD + ((lane >> 3) & 1) * 8) * 2;

    // Software pipeline: a thread's w bytes are loaded two tiles ahead (registers `ra`,
    // `rb`, whose roles alternate so no register holding a pending load is ever moved),
    // tile t + 1's x copies issued before tile t's mma and its w decoded into shared memory
    // after it, so two tiles of work hide a load's latency; one barrier per tile.
    const int groups = k >> 5, gsel = threadIdx.x & 1;
    typename F::Raw ra, rb;
    auto load_w = [&](int kt, typename F::Raw& raw) {
        const int gi = 2 * kt + gsel;
        if (kt < kt1 && gi < groups) F::load32(wrow, nb, gi, raw);
    };
    if (kt0 < kt1) {
        load_x(0, kt0);
        load_w(kt0, ra);
        load_w(kt0 + 1, rb);
        qmma_store_w<F, T>(sB, 0, ra, 2 * kt0 + gsel, groups);
        load_w(kt0 + 2, ra);
    }
    cp_async_wait<0>();
    __syncthreads();
    // Tile kt from stage (kt - kt0) % 2; `cur` holds tile kt + 1's w bytes and is then
    // reloaded with tile kt + 3's.
    auto step = [&](int kt, typename F::Raw& cur) {
        const int s = (kt - kt0) & 1;
        const bool next = kt + 1 < kt1;
        if (next) load_x(s ^ 1, kt + 1);
        const unsigned int ab = a_sh + s * BM * QM_LD * 2 + a_off;
        const unsigned int bb = b_sh + s * QM_BN * QM_LD * 2 + b_off;
#pragma unroll
        for (int kk = 0; kk < QM_BK / 16; ++kk) {
            unsigned int af[MT][4], bf[4][2];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                ldmatrix_x4(ab + (mt * 16 * QM_LD + kk * 16) * 2, af[mt][0], af[mt][1],
                            af[mt][2], af[mt][3]);
#pragma unroll
            for (int np = 0; np < 2; ++np)
                ldmatrix_x4(bb + (np * 16 * QM_LD + kk * 16) * 2, bf[2 * np][0], bf[2 * np][1],
                            bf[2 * np + 1][0], bf[2 * np + 1][1]);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < 4; ++nt)
                    Mma16816<T>::mma(acc[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
        }
        if (next) {
            qmma_store_w<F, T>(sB, s ^ 1, cur, 2 * (kt + 1) + gsel, groups);
            load_w(kt + 3, cur);
        }
        cp_async_wait<0>();
        __syncthreads();
    };
    for (int kt = kt0; kt < kt1; kt += 2) {
        step(kt, rb);
        if (kt + 1 < kt1) step(kt + 1, ra);
    }
}

template <class F, typename T, typename OutT, int BM>
__device__ __forceinline__ void qmma_impl(const T* __restrict__ x,
                                          const unsigned char* __restrict__ w,
                                          const T* __restrict__ bias, OutT* __restrict__ out,
                                          float* __restrict__ ws, int m_rows, int n_rows,
                                          int k) {
    extern __shared__ __align__(16) unsigned char qm_smem[];
    T* sA = reinterpret_cast<T*>(qm_smem);  // [2][BM][QM_LD]
    T* sB = sA + 2 * BM * QM_LD;            // [2][QM_BN][QM_LD]
    constexpr int MT = BM / 32;             // m16 tiles per warp
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = warp >> 2, wn = warp & 3;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * QM_BN;
    const int ktiles = (k + QM_BK - 1) / QM_BK;
    const int kt0 = (int)((long long)ktiles * blockIdx.z / gridDim.z);
    const int kt1 = (int)((long long)ktiles * (blockIdx.z + 1) / gridDim.z);
    // Rows past the end decode the last row (never written out).
    const unsigned char* wrow =
        w + (long long)min(n0 + (int)(threadIdx.x >> 1), n_rows - 1) * q_row_bytes<F>(k);
    float acc[MT][4][4];
    auto load_x = [&](int stage, int kt) {
        qmma_load_x<T, BM>(sA, stage, kt, x, m0, m_rows, k);
    };
    qmma_core<F, T, BM>(sA, sB, load_x, wrow, k, kt0, kt1, acc);

    const int g = lane >> 2, t4 = lane & 3;
    const bool split = gridDim.z > 1;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int m = m0 + wm * (BM / 2) + mt * 16 + g + 8 * h;
            if (m >= m_rows) continue;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int n = n0 + wn * 32 + nt * 8 + 2 * t4 + e;
                    if (n >= n_rows) continue;
                    const float v = acc[mt][nt][2 * h + e];
                    if (split) {
                        ws[((long long)blockIdx.z * m_rows + m) * n_rows + n] = v;
                    } else {
                        const float b = bias != nullptr ? to_f32(bias[n]) : 0.0f;
                        out[(long long)m * n_rows + n] = from_f32<OutT>(v + b);
                    }
                }
        }
}

// The grouped GEMM of a mixture of experts' layer (prefill and large batches): moe_align
// (moe.cu) has sorted the (token, expert) pairs by expert into `sorted`, each expert's run
// padded to a multiple of BM with -1, and written each BM-row tile's expert to
// `tile_expert` (-1: an unused tile). CTA (x, tile) multiplies the tile's rows of x by 128
// rows of its expert, as qmma does (decode in shared memory, mma.sync), so an expert's
// weights are read once per tile of its pairs rather than once per pair.
//   SILU (gate/up): x rows are tokens (pair / top_k), the CTA's 128 rows are 64 gate rows
//     j0.. and the 64 matching up rows of expert e (MoeExperts), laid out so
//     that each thread holds a gate column and its up column (n8 tiles alternate gate, up),
//     and act[pair, j] = silu(round_T(g)) * round_T(u), rounded to T.
//   else (down): x rows are pairs (act), the down rows h0.. of expert e, and
//     y[pair, h] = round_T(dot); moe_combine sums the slots.
template <class F, typename T, int BM, bool SILU>
__device__ __forceinline__ void gmoe_impl(const T* __restrict__ x, const MoeExperts& w,
                                          const int* __restrict__ sorted,
                                          const int* __restrict__ tile_expert,
                                          T* __restrict__ out, int k, int n_out, int experts,
                                          int top_k) {
    extern __shared__ __align__(16) unsigned char qm_smem[];
    const int tile = blockIdx.y;
    const int e = tile_expert[tile];
    if (e < 0 || e >= experts) return;
    T* sA = reinterpret_cast<T*>(qm_smem);
    T* sB = sA + 2 * BM * QM_LD;
    constexpr int MT = BM / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = warp >> 2, wn = warp & 3;
    const int* rows = sorted + (long long)tile * BM;
    // This thread's x rows (tile rows threadIdx.x / 8 + 32 i), null for padding.
    const T* xr[MT];
#pragma unroll
    for (int i = 0; i < MT; ++i) {
        const int p = rows[(threadIdx.x >> 3) + 32 * i];
        const long long xrow = SILU ? p / top_k : p;
        xr[i] = p >= 0 ? x + xrow * k : nullptr;
    }
    const long long row_bytes = q_row_bytes<F>(k);
    const int nl = threadIdx.x >> 1;
    const unsigned char* wr;
    int n0;
    if (SILU) {
        // Tile row nl: warp column wn = nl / 32, its n8 tile q = (nl % 32) / 8 (even: gate).
        n0 = blockIdx.x * (QM_BN / 2);
        const int q = (nl & 31) >> 3;
        const int j = min(n0 + (nl >> 5) * 16 + (q >> 1) * 8 + (nl & 7), n_out - 1);
        wr = moe_gate(w, e) + ((q & 1) ? w.up_off : 0) + j * row_bytes;
    } else {
        n0 = blockIdx.x * QM_BN;
        wr = moe_down(w, e) + min(n0 + nl, n_out - 1) * row_bytes;
    }
    float acc[MT][4][4];
    auto load_x = [&](int stage, int kt) {
        T* a = sA + stage * BM * QM_LD;
#pragma unroll
        for (int i = 0; i < MT; ++i) {
            const int c = threadIdx.x + i * QM_THREADS;
            const int r = c >> 3, part = c & 7;
            const int kk = kt * QM_BK + part * 8;
            const bool ok = xr[i] != nullptr && kk < k;
            cp_async16(a + r * QM_LD + part * 8, ok ? xr[i] + kk : x, ok);
        }
        cp_async_commit();
    };
    const int ktiles = (k + QM_BK - 1) / QM_BK;
    qmma_core<F, T, BM>(sA, sB, load_x, wr, k, 0, ktiles, acc);

    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int p = rows[wm * (BM / 2) + mt * 16 + g + 8 * h];
            if (p < 0) continue;
            if (SILU) {
#pragma unroll
                for (int np = 0; np < 2; ++np)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const int j = n0 + wn * 16 + np * 8 + 2 * t4 + c;
                        if (j >= n_out) continue;
                        const float gv = to_f32(from_f32<T>(acc[mt][2 * np][2 * h + c]));
                        const float uv = to_f32(from_f32<T>(acc[mt][2 * np + 1][2 * h + c]));
                        out[(long long)p * n_out + j] = from_f32<T>(silu_mul_f32(gv, uv));
                    }
            } else {
#pragma unroll
                for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const int n = n0 + wn * 32 + nt * 8 + 2 * t4 + c;
                        if (n < n_out)
                            out[(long long)p * n_out + n] = from_f32<T>(acc[mt][nt][2 * h + c]);
                    }
            }
        }
}

// Read-only loads for the dequantize kernels (L1-cached: neighbouring threads share bytes).
__device__ __forceinline__ uint4 q_ldg128(const unsigned char* p) {
    return __ldg(reinterpret_cast<const uint4*>(p));
}
__device__ __forceinline__ unsigned int q_ldg16(const unsigned char* p) {
    return __ldg(reinterpret_cast<const unsigned short*>(p));
}
__device__ __forceinline__ unsigned int q_ldg32(const unsigned char* p) {
    return __ldg(reinterpret_cast<const unsigned int*>(p));
}
// (float)u - c, exactly, for u < 2^23 and a small integer c, without I2F (a quarter-rate
// conversion that bounds the decode in qmma): u in the mantissa of 2^23, one LOP and one
// FADD, both full rate.
__device__ __forceinline__ float q_u2f(unsigned int u, float c) {
    return __uint_as_float(0x4B000000u | u) - (8388608.0f + c);
}
// Byte i (a constant after unrolling) of 16-byte vectors u[0], u[1], ...
__device__ __forceinline__ unsigned int q_byte(const uint4* u, int i) {
    return (q_word(u[i >> 4], (i >> 2) & 3) >> (8 * (i & 3))) & 0xFFu;
}

// Every extern "C" entry point of one format: qgemv_<fmt>_<x>_<out>_m<M> for M in 1, 2, 4, 8
// and (x, out) in (bf16, bf16), (bf16, f32), (f16, f16), (f16, f32), (f32, f32);
// qgemv_act_<fmt>_<x>_m1; dequant_<fmt>_<T>; qmoe_gate_up_<fmt>_<T> and qmoe_down_<fmt>_<T>.
// CTAs per SM the compiler must leave registers for: two (at most 128 registers) for the
// bandwidth-bound 1- and 2-row variants; the 4- and 8-row ones are bound by arithmetic and
// would spill.
#define QG_MIN_CTAS(M) ((M) <= 2 ? 2 : 1)
// Rows per warp of the variant for M rows of x: two for every M (four rows a warp at M = 1
// measured 5% slower on the 8B Q4_K and Q6_K steps, BENCHMARKS.md: twice the registers, so
// half the warps to hide the loads' latency; equal for FP8 and Q8_0).
#ifndef QG_R
#define QG_R(M) 2
#endif
#define QGEMV_ONE(F, FN, T, OUT_T, TN, ON, M)                                                \
    extern "C" __global__ void __launch_bounds__(QG_THREADS, QG_MIN_CTAS(M))                  \
        qgemv_##FN##_##TN##_##ON##_m##M(const T* x, const unsigned char* w, const T* bias,   \
                                        OUT_T* out, int m_rows, int n_rows, int k,            \
                                        int ksplit) {                                         \
        qgemv_impl<F, T, OUT_T, M, QG_R(M), false>(x, w, bias, out, m_rows, n_rows, k, ksplit);     \
    }
#define QGEMV_ALL_M(F, FN, T, OUT_T, TN, ON)                                                 \
    QGEMV_ONE(F, FN, T, OUT_T, TN, ON, 1)                                                     \
    QGEMV_ONE(F, FN, T, OUT_T, TN, ON, 2)                                                     \
    QGEMV_ONE(F, FN, T, OUT_T, TN, ON, 4)                                                     \
    QGEMV_ONE(F, FN, T, OUT_T, TN, ON, 8)
#define QGEMV_ACT(F, FN, T, TN)                                                              \
    extern "C" __global__ void __launch_bounds__(QG_THREADS) qgemv_act_##FN##_##TN##_m1(     \
        const T* x, const unsigned char* w, T* out, int n_rows, int k, int ksplit, int act) { \
        qgemv_impl<F, T, T, 1, 2, true>(x, w, nullptr, out, 1, n_rows, k, ksplit, act);       \
    }
#define QDEQUANT(F, FN, T, TN)                                                               \
    extern "C" __global__ void __launch_bounds__(256)                                         \
        dequant_##FN##_##TN(const unsigned char* w, T* out, int n_rows, int k) {              \
        pdl_enter();                                                                          \
        qdequant_impl<F, T>(w, out, n_rows, k);                                               \
    }
// The tensor-core variant for BM-row tiles (two CTAs per SM for BM <= 64).
#define QMMA_ONE(F, FN, T, OUT_T, TN, ON, BM)                                                \
    extern "C" __global__ void __launch_bounds__(QM_THREADS, (BM) <= 64 ? 2 : 1)              \
        qmma_##FN##_##TN##_##ON##_bm##BM(const T* x, const unsigned char* w, const T* bias,  \
                                         OUT_T* out, float* ws, int m_rows, int n_rows,       \
                                         int k) {                                             \
        pdl_enter();                                                                          \
        qmma_impl<F, T, OUT_T, BM>(x, w, bias, out, ws, m_rows, n_rows, k);                   \
    }
#define QMMA_BMS(F, FN, T, OUT_T, TN, ON)                                                    \
    QMMA_ONE(F, FN, T, OUT_T, TN, ON, 32)                                                     \
    QMMA_ONE(F, FN, T, OUT_T, TN, ON, 64)                                                     \
    QMMA_ONE(F, FN, T, OUT_T, TN, ON, 128)
#define QMMA_ALL(F, FN)                                                                      \
    QMMA_BMS(F, FN, bf16, bf16, bf16, bf16)                                                   \
    QMMA_BMS(F, FN, bf16, float, bf16, f32)                                                   \
    QMMA_BMS(F, FN, f16, f16, f16, f16)                                                       \
    QMMA_BMS(F, FN, f16, float, f16, f32)
#define QMOE(F, FN, T, TN)                                                                   \
    extern "C" __global__ void __launch_bounds__(QG_THREADS) qmoe_gate_up_##FN##_##TN(          \
        const T* x, MoeExperts w, const int* ids, T* act, int hidden, int inter, int experts,  \
        int top_k, int g) {                                                                     \
        pdl_enter();                                                                            \
        qmoe_gate_up_impl<F, T>(x, w, ids, act, hidden, inter, experts, top_k, g);              \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(QG_THREADS) qmoe_down_##FN##_##TN(             \
        const T* act, MoeExperts down, const int* ids, const float* weights, T* out,            \
        int hidden, int inter, int experts, int top_k, int g) {                                 \
        pdl_enter();                                                                            \
        qmoe_down_impl<F, T>(act, down, ids, weights, out, hidden, inter, experts, top_k, g);   \
    }
// The grouped MoE GEMM (gmoe_impl) for x in T and BM-row tiles: gate/up + SiLU, and down.
#define GMOE_ONE(F, FN, T, TN, BM)                                                           \
    extern "C" __global__ void __launch_bounds__(QM_THREADS, (BM) <= 64 ? 2 : 1)              \
        gmoe_gate_up_##FN##_##TN##_bm##BM(const T* x, MoeExperts w,                           \
                                          const int* sorted, const int* tile_expert, T* out,  \
                                          int k, int n_out, int experts, int top_k) {         \
        pdl_enter();                                                                          \
        gmoe_impl<F, T, BM, true>(x, w, sorted, tile_expert, out, k, n_out, experts, top_k);  \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(QM_THREADS, (BM) <= 64 ? 2 : 1)              \
        gmoe_down_##FN##_##TN##_bm##BM(const T* x, MoeExperts w,                              \
                                       const int* sorted, const int* tile_expert, T* out,     \
                                       int k, int n_out, int experts, int top_k) {            \
        pdl_enter();                                                                          \
        gmoe_impl<F, T, BM, false>(x, w, sorted, tile_expert, out, k, n_out, experts, top_k); \
    }
#define GMOE(F, FN, T, TN)                                                                   \
    GMOE_ONE(F, FN, T, TN, 32)                                                                \
    GMOE_ONE(F, FN, T, TN, 64)
#define QUANT_KERNELS(F, FN)                                                                 \
    QMMA_ALL(F, FN)                                                                           \
    QGEMV_ALL_M(F, FN, bf16, bf16, bf16, bf16)                                                \
    QGEMV_ALL_M(F, FN, bf16, float, bf16, f32)                                                \
    QGEMV_ALL_M(F, FN, f16, f16, f16, f16)                                                    \
    QGEMV_ALL_M(F, FN, f16, float, f16, f32)                                                  \
    QGEMV_ALL_M(F, FN, float, float, f32, f32)                                                \
    QGEMV_ACT(F, FN, bf16, bf16)                                                              \
    QGEMV_ACT(F, FN, f16, f16)                                                                \
    QGEMV_ACT(F, FN, float, f32)                                                             \
    QDEQUANT(F, FN, bf16, bf16)                                                               \
    QDEQUANT(F, FN, f16, f16)                                                                 \
    QDEQUANT(F, FN, float, f32)                                                               \
    QMOE(F, FN, bf16, bf16)                                                                   \
    QMOE(F, FN, f16, f16)                                                                     \
    QMOE(F, FN, float, f32)                                                                   \
    GMOE(F, FN, bf16, bf16)                                                                   \
    GMOE(F, FN, f16, f16)

// ---------------------------------------------------------------------------------------
// The FP8 KV cache (`DType::F8E4M3`): one E4M3 byte an element (OCP "fn"), written by
// qkv_rope.cu and read by attention.cu / attention_prefill.cu. A value x is stored as
// e4m3(x * inv) (inv = 1 / the layer's scale, from the host), rounded to nearest (ties to
// even) and saturating at +-448, NaN to NaN: quant.rs's f32_to_e4m3. The hardware
// conversions (sm_89+) are exact on the way back (every E4M3 value is an f16).
typedef unsigned char fp8;

__device__ __forceinline__ fp8 kv_e4m3(float x) {
    unsigned short r;
    // The second source goes to the low byte.
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(0.0f), "f"(x));
    return (fp8)(r & 0xFFu);
}
// Two E4M3 bytes (the low byte first) as floats.
__device__ __forceinline__ float2 kv_e4m3x2(unsigned int b) {
    unsigned int h;
    const unsigned short b16 = (unsigned short)(b & 0xFFFFu);
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h) : "h"(b16));
    return __half22float2(*reinterpret_cast<__half2*>(&h));
}
// Four E4M3 bytes of a word as floats.
__device__ __forceinline__ void kv_e4m3x4(unsigned int w, float* o) {
    const float2 a = kv_e4m3x2(w), b = kv_e4m3x2(w >> 16);
    o[0] = a.x;
    o[1] = a.y;
    o[2] = b.x;
    o[3] = b.y;
}

// How a kernel reads one vector of Ty<T>::V elements of a K or V row: 16 bytes of T
// (KV = T), or Ty<T>::V bytes of E4M3 (KV = fp8) holding the same elements. `U` is the
// tokens per slot per step of attention.cu's split kernel: its ring holds the same bytes
// either way.
template <typename T, typename KV> struct KvVec {
    typedef uint4 type;
    static constexpr int U = sizeof(T) == 4 ? 1 : 2;
    static __device__ __forceinline__ void copy(type* dst, const KV* src, bool on) {
        cp_async16(dst, src, on);
    }
    static __device__ __forceinline__ void unpack(const type& u, float* o) { Ty<T>::unpack(u, o); }
};
template <int V> struct Fp8Vec;
template <> struct Fp8Vec<8> {
    typedef uint2 type;
    static __device__ __forceinline__ void unpack(const uint2& u, float* o) {
        kv_e4m3x4(u.x, o);
        kv_e4m3x4(u.y, o + 4);
    }
};
template <> struct Fp8Vec<4> {
    typedef unsigned int type;
    static __device__ __forceinline__ void unpack(const unsigned int& u, float* o) {
        kv_e4m3x4(u, o);
    }
};
template <typename T> struct KvVec<T, fp8> {
    typedef typename Fp8Vec<Ty<T>::V>::type type;
    static constexpr int U = sizeof(T) == 4 ? 2 : 4;
    static __device__ __forceinline__ void copy(type* dst, const fp8* src, bool on) {
        cp_async_ca<(int)sizeof(type)>(dst, src, on);
    }
    static __device__ __forceinline__ void unpack(const type& u, float* o) {
        Fp8Vec<Ty<T>::V>::unpack(u, o);
    }
};
// Store one element of a K or V row: as T, or in E4M3 times `inv`.
template <typename T> __device__ __forceinline__ void kv_store(T* dst, float x, float) {
    *dst = from_f32<T>(x);
}
__device__ __forceinline__ void kv_store(fp8* dst, float x, float inv) { *dst = kv_e4m3(x * inv); }
