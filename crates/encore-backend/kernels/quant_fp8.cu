// quant_fp8.cu: the FP8 E4M3 kernels (the quantized-weight machinery of quant_gemv.cuh and
// quant_mma.cuh; src/quant.rs's layout). A block is 128 values: quant bytes, 128 E4M3 bytes
// (OCP "fn": no infinities, 0x7F / 0xFF NaN), scale bytes one f32 scale; value = scale * e4m3.
//
// qgemv unit: an eighth of a block (UPB = 8): 16 bytes, 16 values, and the scale. A byte
// becomes an f16 with its sign, exponent and mantissa shifted into place (bits 7..14, the
// value times 2^-8, exact, subnormals included; NaN bytes decode as 480), two per 32-bit
// word. The dequantize kernel decodes NaN as NaN, like quant.rs.

struct QFormatF8 {
    static constexpr int BE = 128, QB = 128, SB = 4, UPB = 8, UNROLL = 4;
    struct Unit {
        uint4 q;
        unsigned int s;
    };
    static __device__ __forceinline__ void load(Unit& u, const unsigned char* row, int nb, int b,
                                                int sub) {
        u.q = q_ld128(row + b * QB + 16 * sub);
        u.s = q_ld32(row + nb * QB + b * SB);
    }

    template <typename T, int M, int R>
    static __device__ __forceinline__ void dot(const Unit (&u)[R], int sub, const T* __restrict__ x,
                                               int k, int m_rows, float (&acc)[R][M]) {
        float f[R][16], alpha[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            alpha[r] = 256.0f * __uint_as_float(u[r].s);
#pragma unroll
            for (int wd = 0; wd < 4; ++wd) {
                const unsigned int v = q_word(u[r].q, wd);
                // Bytes 0 and 2, then 1 and 3, as f16 pairs: sign to bit 15, the rest to 7..14.
                const unsigned int h02 = ((v << 8) & 0x80008000u) | ((v << 7) & 0x3F803F80u);
                const unsigned int h13 = (v & 0x80008000u) | ((v >> 1) & 0x3F803F80u);
                const float2 f02 = q_f16x2(h02), f13 = q_f16x2(h13);
                f[r][4 * wd + 0] = f02.x;
                f[r][4 * wd + 1] = f13.x;
                f[r][4 * wd + 2] = f02.y;
                f[r][4 * wd + 3] = f13.y;
            }
        }
        q_run16<T, M, R, 0>(x + 16 * sub, k, m_rows, f, alpha, alpha, acc);
    }

    // quant.rs's e4m3_to_f32.
    static __device__ __forceinline__ float e4m3(unsigned int q) {
        const unsigned int e = (q >> 3) & 15u, m = q & 7u;
        float mag;
        if (e == 15u && m == 7u)
            mag = __int_as_float(0x7fffffff);
        else if (e == 0u)
            mag = (float)m * 0.001953125f;  // m / 8 * 2^-6
        else
            mag = __uint_as_float((e + 120u) << 23 | m << 20);
        return (q & 0x80u) ? -mag : mag;
    }

    // Values 32t .. 32t + 31 of block gi / 4 (t = gi % 4).
    struct Raw {
        uint4 q[2];
        unsigned int s;
    };
    static __device__ __forceinline__ void load32(const unsigned char* row, int nb, int gi,
                                                  Raw& r) {
        const int b = gi >> 2, t = gi & 3;
        r.q[0] = q_ldg128(row + b * QB + 32 * t);
        r.q[1] = q_ldg128(row + b * QB + 32 * t + 16);
        r.s = q_ldg32(row + nb * QB + b * SB);
    }
    static __device__ __forceinline__ void decode_raw(const Raw& r, int gi, float* v) {
        const float s = __uint_as_float(r.s);
#pragma unroll
        for (int l = 0; l < 32; ++l) v[l] = __fmul_rn(s, e4m3(q_byte(r.q, l)));
    }
};

QUANT_KERNELS(QFormatF8, fp8)
QMOE_MMA(QFormatF8, fp8, 2)

// ---- The FP8 tensor-core GEMM's operands (cuBLASLt, 128-value block scales) ----
// quant.rs's layout keeps a row's E4M3 bytes contiguous, so the weight is cuBLASLt's A as
// it is (leading dimension: the row's bytes); these kernels make the rest.

// Where the FP8 GEMM's x comes from: a matrix x [m, k] in T (XDense), or the gated MLP's
// activation act_mul(act, gate_up) of gate_up [m, 2k] in T, each value rounded to T exactly
// as silu_mul.cu's act_mul rounds it (XActMul): quantizing it here saves the activation's
// write and read. load8 gives eight values (16-byte aligned i), load4 four (8-byte aligned),
// as T's raw bits.
template <typename T> struct XDense {
    const T* x;
    int k;
    __device__ __forceinline__ uint4 load8(int row, int i) const {
        return *reinterpret_cast<const uint4*>(x + (long long)row * k + i);
    }
    __device__ __forceinline__ uint2 load4(int row, int i) const {
        return *reinterpret_cast<const uint2*>(x + (long long)row * k + i);
    }
};
template <typename T> struct XActMul {
    const T* gu;
    int k, act;
    __device__ __forceinline__ uint4 load8(int row, int i) const {
        const T* g = gu + (long long)row * 2 * k + i;
        float a[8], b[8];
        Ty<T>::unpack(*reinterpret_cast<const uint4*>(g), a);
        Ty<T>::unpack(*reinterpret_cast<const uint4*>(g + k), b);
#pragma unroll
        for (int e = 0; e < 8; ++e) a[e] = act_mul_f32(act, a[e], b[e]);
        return Ty<T>::pack(a);
    }
    __device__ __forceinline__ uint2 load4(int row, int i) const {
        const T* g = gu + (long long)row * 2 * k + i;
        const uint2 ga = *reinterpret_cast<const uint2*>(g);
        const uint2 ua = *reinterpret_cast<const uint2*>(g + k);
        float a[4], b[4];
        Ty<T>::unpack2(ga.x, a);
        Ty<T>::unpack2(ga.y, a + 2);
        Ty<T>::unpack2(ua.x, b);
        Ty<T>::unpack2(ua.y, b + 2);
#pragma unroll
        for (int e = 0; e < 4; ++e) a[e] = act_mul_f32(act, a[e], b[e]);
        return make_uint2(Ty<T>::pack2(a[0], a[1]), Ty<T>::pack2(a[2], a[3]));
    }
};

// x [m_rows, k] in T to E4M3 xq [m_pad, k] with one f32 scale per row per 128 values,
// stored transposed as xs [k / 128][m_pad] (cuBLASLt's VEC128_32F layout: rows contiguous):
// scale = amax / 448 (E4M3's largest finite value), q = round-to-nearest(x / scale),
// saturated. Rows m_rows .. m_pad and all-zero groups get zeros and scale 1. One warp per
// (row, group): four values a lane. fp8_act_quant_rows_* quantize the MLP's activation
// (XActMul, k = inter) the same way.
template <typename T, class X>
__device__ __forceinline__ void fp8_quant_rows_impl(const X src, unsigned char* __restrict__ xq,
                                                    float* __restrict__ xs, int m_rows,
                                                    int m_pad, int k) {
    const int lane = threadIdx.x & 31;
    const int groups = k >> 7;
    const long long total = (long long)m_pad * groups;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long wi = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); wi < total;
         wi += warps) {
        const int row = (int)(wi / groups), g = (int)(wi - (long long)row * groups);
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (row < m_rows) {
            // Four values in one 8-byte load (x rows are 16-byte aligned, k % 128 == 0).
            const uint2 raw = src.load4(row, g * 128 + lane * 4);
            Ty<T>::unpack2(raw.x, v);
            Ty<T>::unpack2(raw.y, v + 2);
        }
        float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, o));
        const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
        const float inv = 1.0f / scale;
        unsigned short lo, hi;
        // cvt packs its first source into the upper byte.
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(v[1] * inv), "f"(v[0] * inv));
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(v[3] * inv), "f"(v[2] * inv));
        *reinterpret_cast<unsigned int*>(xq + (long long)row * k + g * 128 + lane * 4) =
            (unsigned int)lo | ((unsigned int)hi << 16);
        if (lane == 0) xs[(long long)g * m_pad + row] = scale;
    }
}
#define FP8_QUANT_ROWS(T, TN)                                                                \
    extern "C" __global__ void __launch_bounds__(256) fp8_quant_rows_##TN(                   \
        const T* x, unsigned char* xq, float* xs, int m_rows, int m_pad, int k) {            \
        pdl_enter();                                                                          \
        fp8_quant_rows_impl<T>(XDense<T>{x, k}, xq, xs, m_rows, m_pad, k);                   \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(256) fp8_act_quant_rows_##TN(               \
        const T* gu, unsigned char* xq, float* xs, int m_rows, int m_pad, int k, int act) {  \
        pdl_enter();                                                                          \
        fp8_quant_rows_impl<T>(XActMul<T>{gu, k, act}, xq, xs, m_rows, m_pad, k);            \
    }
FP8_QUANT_ROWS(bf16, bf16)
FP8_QUANT_ROWS(f16, f16)

// The weight's scales (row r's k / 128 f32 after its E4M3 bytes) transposed to
// ws [k / 128][n_rows] (VEC128_32F: rows contiguous), through a 32 x 32 shared tile so that
// both the reads (a row's scales) and the writes (a block's rows) are whole 128-byte runs.
// A CTA of 256 threads takes 32 rows.
extern "C" __global__ void __launch_bounds__(256)
    fp8_weight_scales(const unsigned char* w, float* ws, int n_rows, int k) {
    pdl_enter();
    __shared__ float tile[32][33];
    const int nb = k >> 7;
    const long long row_bytes = q_row_bytes<QFormatF8>(k);
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    const int r0 = blockIdx.x * 32;
    for (int b0 = 0; b0 < nb; b0 += 32) {
        for (int rr = ty; rr < 32; rr += 8) {
            const int r = r0 + rr, b = b0 + tx;
            tile[rr][tx] = (r < n_rows && b < nb)
                               ? __uint_as_float(q_ldg32(w + (long long)r * row_bytes +
                                                         (long long)nb * QFormatF8::QB + b * 4))
                               : 0.0f;
        }
        __syncthreads();
        for (int bb = ty; bb < 32; bb += 8) {
            const int r = r0 + tx, b = b0 + bb;
            if (r < n_rows && b < nb) ws[(long long)b * n_rows + r] = tile[tx][bb];
        }
        __syncthreads();
    }
}

// ---- The row-wise FP8 GEMM's operands (cuBLASLt OUTER_VEC_32F: one scale a row) ----
// For a weight whose rows each hold one scale (quant.rs's quantize_rows, a per-tensor or
// per-channel checkpoint): x per token, w per output channel.

// x [m_rows, k] in T to E4M3 xq [m_pad, k] with one f32 scale a row, xs [m_pad]: scale =
// the row's amax / 448, q = round-to-nearest(x / scale), saturated; rows m_rows .. m_pad and
// all-zero rows get zeros and scale 1. One CTA (256 threads) a row, eight values a thread per
// 16-byte load (k % 128 == 0, rows 16-byte aligned): a row of up to FQT_HELD * 2048 values
// is read once and held in registers for its amax, a longer one is read twice. x is any
// source above (fp8_quant_tokens_*: a matrix; fp8_act_quant_tokens_*: the MLP's activation,
// k = inter).
#define FQT_HELD 8

// The E4M3 bytes of eight values times inv.
__device__ __forceinline__ uint2 fqt_pack8(const float* v, float inv) {
    unsigned short p[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
        // cvt packs its first source into the upper byte.
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;"
            : "=h"(p[j])
            : "f"(v[2 * j + 1] * inv), "f"(v[2 * j] * inv));
    return make_uint2((unsigned int)p[0] | ((unsigned int)p[1] << 16),
                      (unsigned int)p[2] | ((unsigned int)p[3] << 16));
}

template <typename T>
__device__ __forceinline__ float fqt_amax8(const uint4& raw) {
    float v[8];
    Ty<T>::unpack(raw, v);
    float a = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) a = fmaxf(a, fabsf(v[j]));
    return a;
}

template <typename T, class X>
__device__ __forceinline__ void fp8_quant_tokens_impl(const X src, unsigned char* __restrict__ xq,
                                                      float* __restrict__ xs, int m_rows,
                                                      int m_pad, int k) {
    __shared__ float warp_max[8];
    const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    const bool held = k <= FQT_HELD * 2048;
    for (int row = blockIdx.x; row < m_pad; row += gridDim.x) {
        unsigned char* qr = xq + (long long)row * k;
        if (row >= m_rows) {
            for (int i = tid * 8; i < k; i += 2048) *reinterpret_cast<uint2*>(qr + i) = make_uint2(0u, 0u);
            if (tid == 0) xs[row] = 1.0f;
            continue;
        }
        uint4 r[FQT_HELD];
        float amax = 0.0f;
        if (held) {
#pragma unroll
            for (int j = 0; j < FQT_HELD; ++j) {
                const int i = tid * 8 + j * 2048;
                r[j] = i < k ? src.load8(row, i) : make_uint4(0u, 0u, 0u, 0u);
                amax = fmaxf(amax, fqt_amax8<T>(r[j]));
            }
        } else {
            for (int i = tid * 8; i < k; i += 2048)
                amax = fmaxf(amax, fqt_amax8<T>(src.load8(row, i)));
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, o));
        if (lane == 0) warp_max[wid] = amax;
        __syncthreads();
        amax = warp_max[0];
#pragma unroll
        for (int w = 1; w < 8; ++w) amax = fmaxf(amax, warp_max[w]);
        __syncthreads();  // warp_max is rewritten by the next row
        const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
        const float inv = 1.0f / scale;
        float v[8];
        if (held) {
#pragma unroll
            for (int j = 0; j < FQT_HELD; ++j) {
                const int i = tid * 8 + j * 2048;
                if (i < k) {
                    Ty<T>::unpack(r[j], v);
                    *reinterpret_cast<uint2*>(qr + i) = fqt_pack8(v, inv);
                }
            }
        } else {
            for (int i = tid * 8; i < k; i += 2048) {
                Ty<T>::unpack(src.load8(row, i), v);
                *reinterpret_cast<uint2*>(qr + i) = fqt_pack8(v, inv);
            }
        }
        if (tid == 0) xs[row] = scale;
    }
}
#define FP8_QUANT_TOKENS(T, TN)                                                              \
    extern "C" __global__ void __launch_bounds__(256) fp8_quant_tokens_##TN(                 \
        const T* x, unsigned char* xq, float* xs, int m_rows, int m_pad, int k) {            \
        pdl_enter();                                                                          \
        fp8_quant_tokens_impl<T>(XDense<T>{x, k}, xq, xs, m_rows, m_pad, k);                 \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(256) fp8_act_quant_tokens_##TN(             \
        const T* gu, unsigned char* xq, float* xs, int m_rows, int m_pad, int k, int act) {  \
        pdl_enter();                                                                          \
        fp8_quant_tokens_impl<T>(XActMul<T>{gu, k, act}, xq, xs, m_rows, m_pad, k);          \
    }
FP8_QUANT_TOKENS(bf16, bf16)
FP8_QUANT_TOKENS(f16, f16)

// ---- The residual add and RMSNorm into the FP8 GEMM's x (Backend::add_norm_matmul, the
// MLP's pre-norm) ----
// residual = T(residual + x) stored back, then the row normed exactly as rms_norm.cu's
// vectorised path computes it (the same threads, so the same sum order: bit for bit),
// each normed value rounded to T, then quantized to E4M3 as fp8_quant_tokens_* (one scale
// a row, `per_row`) or fp8_quant_rows_* (a scale per 128 values, xs [k / 128][m_pad])
// quantize a matrix of T: the normed rows are never written in T. A CTA a row of blockDim
// threads (rms_norm's count for the row: threads_for(k / 8, 1024)); thread t holds the
// 8-value vectors t, t + blockDim, ... (at most FNQ_HELD). A 128-value group is 16
// adjacent threads' vectors. k % 128 == 0; rows 16-byte aligned. Rows m_rows .. m_pad get
// zeros and scale 1.
#define FNQ_HELD 4  // vectors a thread holds: k <= FNQ_HELD * 8 * 1024
template <typename T>
__device__ __forceinline__ void fp8_norm_quant_impl(const T* __restrict__ x, T* residual,
                                                    const T* __restrict__ w,
                                                    unsigned char* __restrict__ xq,
                                                    float* __restrict__ xs, int m_rows,
                                                    int m_pad, int k, float eps, int per_row) {
    __shared__ float sh[32];
    const int tid = threadIdx.x, bd = blockDim.x, nv = k >> 3, groups = k >> 7;
    for (int row = blockIdx.x; row < m_pad; row += gridDim.x) {
        unsigned char* qr = xq + (long long)row * k;
        if (row >= m_rows) {
            for (int i = tid; i < nv; i += bd) *reinterpret_cast<uint2*>(qr + i * 8) = make_uint2(0u, 0u);
            if (per_row) {
                if (tid == 0) xs[row] = 1.0f;
            } else {
                for (int g = tid; g < groups; g += bd) xs[(long long)g * m_pad + row] = 1.0f;
            }
            continue;
        }
        const T* xr = x + (long long)row * k;
        T* rr = residual + (long long)row * k;
        uint4 r[FNQ_HELD];
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < FNQ_HELD; ++j) {
            const int i = tid + j * bd;
            if (i < nv) {
                float a[8], b[8];
                load_vec(xr + i * 8, a);
                load_vec(rr + i * 8, b);
#pragma unroll
                for (int e = 0; e < 8; ++e) a[e] = to_f32(from_f32<T>(b[e] + a[e]));
                r[j] = Ty<T>::pack(a);
                st16(rr + i * 8, r[j]);
#pragma unroll
                for (int e = 0; e < 8; ++e) ss += a[e] * a[e];
            }
        }
        ss = block_sum(ss, sh);
        const float inv = 1.0f / sqrtf(ss / (float)k + eps);
        float amax = 0.0f;
#pragma unroll
        for (int j = 0; j < FNQ_HELD; ++j) {
            const int i = tid + j * bd;
            if (i < nv) {
                float a[8], g[8];
                Ty<T>::unpack(r[j], a);
                load_vec(w + i * 8, g);
#pragma unroll
                for (int e = 0; e < 8; ++e) a[e] = a[e] * inv * g[e];
                r[j] = Ty<T>::pack(a);
                amax = fmaxf(amax, fqt_amax8<T>(r[j]));
            }
        }
        float v[8];
        if (per_row) {
            amax = block_max(amax, sh);
            const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
            const float inv_s = 1.0f / scale;
#pragma unroll
            for (int j = 0; j < FNQ_HELD; ++j) {
                const int i = tid + j * bd;
                if (i < nv) {
                    Ty<T>::unpack(r[j], v);
                    *reinterpret_cast<uint2*>(qr + i * 8) = fqt_pack8(v, inv_s);
                }
            }
            if (tid == 0) xs[row] = scale;
        } else {
            // A group's 16 threads are lanes 16h .. 16h + 15 of a warp (bd % 32 == 0).
#pragma unroll
            for (int j = 0; j < FNQ_HELD; ++j) {
                const int i = tid + j * bd;
                if (j * bd < nv) {  // warp-uniform: whole groups or none
                    float ga = i < nv ? fqt_amax8<T>(r[j]) : 0.0f;
#pragma unroll
                    for (int o = 8; o > 0; o >>= 1) ga = fmaxf(ga, __shfl_xor_sync(FULL_MASK, ga, o));
                    const float scale = ga > 0.0f ? ga / 448.0f : 1.0f;
                    if (i < nv) {
                        Ty<T>::unpack(r[j], v);
                        *reinterpret_cast<uint2*>(qr + i * 8) = fqt_pack8(v, 1.0f / scale);
                        if ((i & 15) == 0) xs[(long long)(i >> 4) * m_pad + row] = scale;
                    }
                }
            }
        }
        __syncthreads();  // sh is reused by the next row
    }
}
#define FP8_NORM_QUANT(T, TN)                                                                \
    extern "C" __global__ void __launch_bounds__(1024) fp8_norm_quant_##TN(                  \
        const T* x, T* residual, const T* w, unsigned char* xq, float* xs, int m_rows,        \
        int m_pad, int k, float eps, int per_row) {                                          \
        pdl_enter();                                                                          \
        fp8_norm_quant_impl<T>(x, residual, w, xq, xs, m_rows, m_pad, k, eps, per_row);      \
    }
FP8_NORM_QUANT(bf16, bf16)
FP8_NORM_QUANT(f16, f16)

// The weight's one scale a row (its first block's) as ws [n_rows]. A thread a row.
extern "C" __global__ void __launch_bounds__(256)
    fp8_row_scales(const unsigned char* w, float* ws, int n_rows, int k) {
    pdl_enter();
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < n_rows)
        ws[r] = __uint_as_float(
            q_ldg32(w + (long long)r * q_row_bytes<QFormatF8>(k) + (long long)(k >> 7) * QFormatF8::QB));
}
