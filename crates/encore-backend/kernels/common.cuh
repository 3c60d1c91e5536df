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
// SILU, the gate and up rows of one output); `ksplit` warps share those rows and reduce in
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
// 0.5 + b / 256 for byte i of v (b < 128; i a constant after unrolling): one PRMT.
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
// Bits 0..3 of t moved to bit 4 of bytes 0..3 (the fifth bits of four 5-bit values).
__device__ __forceinline__ unsigned int q_spread4(unsigned int t) {
    return ((t & 0xFu) * 0x02040810u) & 0x10101010u;
}

// One run of 16 consecutive k (x + m * k + 0..15, 16-byte aligned) for the warp's R rows.
// OFF: f holds F = 0.5 + q / 256 and the values are alpha * q + beta, so
//   acc[r][m] += alpha[r] * (256 sum(F x) - 128 sum(x)) + beta[r] * sum(x)
// (sum(x) is shared by the rows); otherwise f holds values v and acc += alpha * sum(v x).
template <typename T, int M, int R, bool OFF>
__device__ __forceinline__ void q_run16(const T* __restrict__ x, int k, int m_rows,
                                        const float (&f)[R][16], const float (&alpha)[R],
                                        const float (&beta)[R], float (&acc)[R][M]) {
    constexpr int V = Ty<T>::V;
#pragma unroll
    for (int m = 0; m < M; ++m) {
        if (M == 1 || m < m_rows) {
            float xv[16];
#pragma unroll
            for (int v = 0; v < 16 / V; ++v)
                Ty<T>::unpack(ldg16(x + (long long)m * k + v * V), xv + v * V);
            float sx = 0.0f, sx128 = 0.0f;
            if (OFF) {
                float s0 = xv[0], s1 = xv[1];
#pragma unroll
                for (int i = 2; i < 16; i += 2) {
                    s0 += xv[i];
                    s1 += xv[i + 1];
                }
                sx = s0 + s1;
                sx128 = -128.0f * sx;
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                float s = f[r][0] * xv[0];
#pragma unroll
                for (int i = 1; i < 16; ++i) s = fmaf(f[r][i], xv[i], s);
                if (OFF) {
                    acc[r][m] = fmaf(alpha[r], fmaf(256.0f, s, sx128), acc[r][m]);
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

// SILU: M = 1, R = 2: the warp of output j reads gate row j and up row n_rows + j, rounds
// both sums to T as a matmul would and writes out[j] = silu(gate) * up rounded to T, exactly
// what matmul + silu_mul.cu produce (gemv.cu's gemv_silu).
template <class F, typename T, typename OutT, int M, int R, bool SILU>
__device__ __forceinline__ void qgemv_impl(const T* __restrict__ x,
                                           const unsigned char* __restrict__ w,
                                           const T* __restrict__ bias, OutT* __restrict__ out,
                                           int m_rows, int n_rows, int k, int ksplit) {
    constexpr int UN = F::UNROLL;
    static_assert(32 % F::UPB == 0, "a chunk holds whole blocks");
    static_assert(!SILU || (M == 1 && R == 2), "SILU pairs one gate row with one up row");
    __shared__ float red[QG_WARPS][R * M];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int OUTS = SILU ? 1 : R;
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

    if (n0 < n_rows) {
        // Rows past the end re-read the last row (never written): no per-load branches.
        const unsigned char* wr[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int row = SILU ? n0 + r * n_rows : min(n0 + r, n_rows - 1);
            wr[r] = w + (long long)row * row_bytes;
        }
        int c = part;
        for (; c + (UN - 1) * ksplit < nfull; c += UN * ksplit) {
            typename F::Unit un[UN][R];
#pragma unroll
            for (int u = 0; u < UN; ++u) {
                const int b = (((c + u * ksplit) << 5) + lane) / F::UPB;
#pragma unroll
                for (int r = 0; r < R; ++r) F::load(un[u][r], wr[r], nb, b, sub);
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
    if (SILU) {
        if (part == 0 && n0 < n_rows && lane == 0) {
            const float g = to_f32(from_f32<T>(acc[0][0]));
            const float u = to_f32(from_f32<T>(acc[R - 1][0]));
            out[n0] = from_f32<OutT>(silu_mul_f32(g, u));
        }
    } else if (part == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int n = n0 + r;
            if (n < n_rows) {
                const float b = bias != nullptr ? to_f32(bias[n]) : 0.0f;
#pragma unroll
                for (int m = 0; m < M; ++m) {
                    if (lane == r * M + m && m < m_rows)
                        out[(long long)m * n_rows + n] = from_f32<OutT>(acc[r][m] + b);
                }
            }
        }
    }
}

// Dense T [n_rows, k] from a quantized [n_rows, k]: one thread per 32 consecutive values
// (F::decode32), written as 16-byte vectors (out 16-byte aligned; k a multiple of 32).
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
        F::decode32(w + row * row_bytes, nb, gi, v);
        T* o = out + row * k + gi * 32;
#pragma unroll
        for (int i = 0; i < 32; i += V) store_vec(o + i, v + i);
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
// Byte i (a constant after unrolling) of 16-byte vectors u[0], u[1], ...
__device__ __forceinline__ unsigned int q_byte(const uint4* u, int i) {
    return (q_word(u[i >> 4], (i >> 2) & 3) >> (8 * (i & 3))) & 0xFFu;
}

// Every extern "C" entry point of one format: qgemv_<fmt>_<x>_<out>_m<M> for M in 1, 2, 4, 8
// and (x, out) in (bf16, bf16), (bf16, f32), (f16, f16), (f16, f32), (f32, f32);
// qgemv_silu_<fmt>_<x>_m1; dequant_<fmt>_<T>.
// Rows per warp of the variant for M rows of x.
#ifndef QG_R
#define QG_R(M) ((M) == 1 ? 4 : 2)
#endif
#define QGEMV_ONE(F, FN, T, OUT_T, TN, ON, M)                                                \
    extern "C" __global__ void __launch_bounds__(QG_THREADS)                                  \
        qgemv_##FN##_##TN##_##ON##_m##M(const T* x, const unsigned char* w, const T* bias,   \
                                        OUT_T* out, int m_rows, int n_rows, int k,            \
                                        int ksplit) {                                         \
        pdl_enter();                                                                          \
        qgemv_impl<F, T, OUT_T, M, QG_R(M), false>(x, w, bias, out, m_rows, n_rows, k, ksplit);     \
    }
#define QGEMV_ALL_M(F, FN, T, OUT_T, TN, ON)                                                 \
    QGEMV_ONE(F, FN, T, OUT_T, TN, ON, 1)                                                     \
    QGEMV_ONE(F, FN, T, OUT_T, TN, ON, 2)                                                     \
    QGEMV_ONE(F, FN, T, OUT_T, TN, ON, 4)                                                     \
    QGEMV_ONE(F, FN, T, OUT_T, TN, ON, 8)
#define QGEMV_SILU(F, FN, T, TN)                                                             \
    extern "C" __global__ void __launch_bounds__(QG_THREADS) qgemv_silu_##FN##_##TN##_m1(    \
        const T* x, const unsigned char* w, T* out, int n_rows, int k, int ksplit) {          \
        pdl_enter();                                                                          \
        qgemv_impl<F, T, T, 1, 2, true>(x, w, nullptr, out, 1, n_rows, k, ksplit);            \
    }
#define QDEQUANT(F, FN, T, TN)                                                               \
    extern "C" __global__ void __launch_bounds__(256)                                         \
        dequant_##FN##_##TN(const unsigned char* w, T* out, int n_rows, int k) {              \
        pdl_enter();                                                                          \
        qdequant_impl<F, T>(w, out, n_rows, k);                                               \
    }
#define QUANT_KERNELS(F, FN)                                                                 \
    QGEMV_ALL_M(F, FN, bf16, bf16, bf16, bf16)                                                \
    QGEMV_ALL_M(F, FN, bf16, float, bf16, f32)                                                \
    QGEMV_ALL_M(F, FN, f16, f16, f16, f16)                                                    \
    QGEMV_ALL_M(F, FN, f16, float, f16, f32)                                                  \
    QGEMV_ALL_M(F, FN, float, float, f32, f32)                                                \
    QGEMV_SILU(F, FN, bf16, bf16)                                                             \
    QGEMV_SILU(F, FN, f16, f16)                                                               \
    QGEMV_SILU(F, FN, float, f32)                                                             \
    QDEQUANT(F, FN, bf16, bf16)                                                               \
    QDEQUANT(F, FN, f16, f16)                                                                 \
    QDEQUANT(F, FN, float, f32)
