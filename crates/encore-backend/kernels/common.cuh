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
// launching its CTAs, which hides launch latency between dependent kernels.
__device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
#define NEG_INF (__int_as_float(0xff800000))
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
// Close this thread's current group of cp.async copies.
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Wait until at most N of this thread's committed groups are still pending.
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
