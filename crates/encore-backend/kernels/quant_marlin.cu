// quant_marlin.cu: the mixed-input tensor-core GEMM for 4- and 8-bit integer weights
// repacked at load (quant/marlin.rs: Q4_0, Q4_1, Q4_K as 4-bit codes, Q8_0 as 8-bit codes,
// each 32 values along k with one f16 scale s and min m, x = s * q + m), in the order of
// mma.sync m16n8k16's B fragments, so a thread's weight words come straight from shared
// memory into registers, are decoded there (shift, LOP3 with a magic exponent, one
// subtraction, one fma a pair) and feed the tensor cores; no decoded tile is written back.
//
// out[m, n] = x[m, k] . W[n, k]^T (+ bias). A CTA owns 128 weight rows and MB blocks of 16
// rows of x (8 warps: each 16 weight rows and every x row up to 32 rows a CTA, else 2 x 4
// warps of 32 weight rows and half the x rows), and walks its k range (the whole k, or one of gridDim.z
// slices whose f32 partials qmma_reduce sums) in tiles of 64 through a 4-stage cp.async
// pipeline of x, codes and scales. The codes of one (128 x 64) tile are one contiguous
// 4 KiB (8 KiB for 8 bits): a warp reads 16 bytes a lane (32 for 8 bits) per tile. The
// weight's first stages are requested before pdl_enter() (weights never depend on the
// kernel before).
//
// Decode, exactly (each value is rounded once, to x's type):
// - 4 bits, bf16: (q & 0x000F000F) | 0x43004300 is the bf16 pair 128 + q; minus 128 leaves
//   q; fma(q, s, m) with s and m rounded to bf16 (the f16 scales are converted; Q4_0's
//   m = -8 s stays exact) rounds the value once. f16: 0x64006400 (1024 + q), minus 1024,
//   fma in f16 with the f16 s, m themselves.
// - 8 bits, f16: PRMT puts a byte u under 0x64 (1024 + u), minus 1024, fma(u, s, m) with
//   m = -128 s: s * (u - 128) exactly, rounded once. bf16 (a byte does not fit its
//   mantissa): u under 2^23 in f32, one FADD, fma(u, s, m) in f32 (exact), one cvt a pair.

#define MQ_BN 128
#define MQ_BK 64
#define MQ_STAGES 4
#define MQ_THREADS 256
// Row stride of the x tile in shared memory, in 16-bit elements (ldmatrix conflict-free).
#define MQ_LD (MQ_BK + 8)
#define MQ_SCALE_TILE 1024

template <int BITS> struct MqBits {
    static constexpr int TILE = MQ_BN * MQ_BK * BITS / 8;
};
template <int BITS, int MB> struct MqSmem {
    static constexpr int X = MB * 16 * MQ_LD * 2;
    static constexpr int STAGE = X + MqBits<BITS>::TILE + MQ_SCALE_TILE;
    static constexpr int BYTES = MQ_STAGES * STAGE;
};

template <typename T> struct MqT;
template <> struct MqT<bf16> {
    typedef __nv_bfloat162 T2;
    static constexpr unsigned int EXP4 = 0x43004300u;  // bf16 pair (128, 128)
    static __device__ __forceinline__ T2 bias4() { return __float2bfloat162_rn(128.0f); }
    static __device__ __forceinline__ T2 splat(float v) { return __float2bfloat162_rn(v); }
};
template <> struct MqT<f16> {
    typedef __half2 T2;
    static constexpr unsigned int EXP4 = 0x64006400u;  // f16 pair (1024, 1024)
    static __device__ __forceinline__ T2 bias4() { return __float2half2_rn(1024.0f); }
    static __device__ __forceinline__ T2 splat(float v) { return __float2half2_rn(v); }
};

template <typename T2> __device__ __forceinline__ T2 mq_as(unsigned int u) {
    return *reinterpret_cast<T2*>(&u);
}
template <typename T2> __device__ __forceinline__ unsigned int mq_bits(T2 v) {
    return *reinterpret_cast<unsigned int*>(&v);
}

// A row's (s, m) for one 32-value group in x's type (pairs) and in f32.
template <typename T> struct MqScale {
    typename MqT<T>::T2 s, m;
    float sf, mf;
};
template <typename T>
__device__ __forceinline__ MqScale<T> mq_scale(const unsigned char* ss, int gi, int row) {
    const __half2 h = *reinterpret_cast<const __half2*>(ss + (gi * MQ_BN + row) * 4);
    const float2 f = __half22float2(h);
    MqScale<T> r;
    r.sf = f.x;
    r.mf = f.y;
    r.s = MqT<T>::splat(f.x);
    r.m = MqT<T>::splat(f.y);
    return r;
}

// 4 bits: the fragment pair i (nibbles i and i + 4 of word q) decoded.
template <typename T>
__device__ __forceinline__ unsigned int mq_dec4(unsigned int q, int i, const MqScale<T>& sc) {
    typedef typename MqT<T>::T2 T2;
    const unsigned int p = ((q >> (4 * i)) & 0x000F000Fu) | MqT<T>::EXP4;
    const T2 v = __hsub2(mq_as<T2>(p), MqT<T>::bias4());
    return mq_bits<T2>(__hfma2(v, sc.s, sc.m));
}

// 8 bits: bytes (2 r, 2 r + 1) of word q (values k, k + 1) decoded.
template <typename T> struct MqDec8;
template <> struct MqDec8<f16> {
    static __device__ __forceinline__ unsigned int dec(unsigned int q, int r, const MqScale<f16>& sc) {
        const unsigned int p = __byte_perm(q, 0x64646464u, r == 0 ? 0x4140u : 0x4342u);
        const __half2 v = __hsub2(mq_as<__half2>(p), __float2half2_rn(1024.0f));
        return mq_bits<__half2>(__hfma2(v, sc.s, sc.m));
    }
};
template <> struct MqDec8<bf16> {
    static __device__ __forceinline__ unsigned int dec(unsigned int q, int r, const MqScale<bf16>& sc) {
        const float u0 = __uint_as_float(__byte_perm(q, 0x4B000000u, 0x7440u | (2 * r))) - 8388608.0f;
        const float u1 = __uint_as_float(__byte_perm(q, 0x4B000000u, 0x7440u | (2 * r + 1))) - 8388608.0f;
        return mq_bits<__nv_bfloat162>(
            __floats2bfloat162_rn(fmaf(u0, sc.sf, sc.mf), fmaf(u1, sc.sf, sc.mf)));
    }
};

__device__ __forceinline__ unsigned int mq_word(const uint4& u, int i) {
    return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w;
}

// The GEMM for BITS-bit codes, x in T, MB blocks of 16 rows of x per CTA. Grid (n / 128
// tiles, ceil(m / 16 MB), splits); out in T or f32 (out_f32), or with splits > 1 f32
// partials at ws[z][m][n] for qmma_reduce (bias added there).
template <int BITS, typename T, int MB>
__device__ __forceinline__ void marlin_impl(const T* __restrict__ x,
                                            const unsigned char* __restrict__ w,
                                            const T* __restrict__ bias, void* __restrict__ out,
                                            float* __restrict__ ws, int m, int n, int k,
                                            int out_f32) {
    extern __shared__ __align__(16) unsigned char mq_smem[];
    typedef MqSmem<BITS, MB> S;
    constexpr int TILE = MqBits<BITS>::TILE;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nt = blockIdx.x;
    const int m0 = blockIdx.y * MB * 16;
    const int kp = (k + MQ_BK - 1) / MQ_BK * MQ_BK;
    const int np = (n + MQ_BN - 1) / MQ_BN * MQ_BN;
    const int ktiles = kp / MQ_BK;
    const int splits = gridDim.z, z = blockIdx.z;
    const int kt0 = (int)((long long)z * ktiles / splits);
    const int kt1 = (int)((long long)(z + 1) * ktiles / splits);
    const int nkt = kt1 - kt0;
    const unsigned char* wt = w + ((long long)nt * ktiles + kt0) * TILE;
    const unsigned char* st =
        w + (long long)np * kp * BITS / 8 + ((long long)nt * ktiles + kt0) * MQ_SCALE_TILE;

    auto load_w = [&](int stage, int i) {
        unsigned char* sw = mq_smem + stage * S::STAGE + S::X;
        const unsigned char* g = wt + (long long)i * TILE;
#pragma unroll
        for (int it = 0; it < TILE / 16 / MQ_THREADS; ++it) {
            const int c = threadIdx.x + it * MQ_THREADS;
            cp_async16(sw + c * 16, g + c * 16, true);
        }
        if (threadIdx.x < MQ_SCALE_TILE / 16)
            cp_async16(sw + TILE + threadIdx.x * 16,
                       st + (long long)i * MQ_SCALE_TILE + threadIdx.x * 16, true);
    };
    auto load_x = [&](int stage, int i) {
        T* sx = reinterpret_cast<T*>(mq_smem + stage * S::STAGE);
        const int kk = (kt0 + i) * MQ_BK;
#pragma unroll
        for (int it = 0; it < (MB * 16 * 8 + MQ_THREADS - 1) / MQ_THREADS; ++it) {
            const int c = threadIdx.x + it * MQ_THREADS;
            if (MB * 16 * 8 < MQ_THREADS && c >= MB * 16 * 8) break;
            const int r = c >> 3, col = kk + (c & 7) * 8;
            const bool ok = m0 + r < m && col < k;
            cp_async16(sx + r * MQ_LD + (c & 7) * 8, ok ? x + (long long)(m0 + r) * k + col : x,
                       ok);
        }
    };

    // The weight's first stages before waiting on the kernel before; x's after.
#pragma unroll
    for (int s = 0; s < MQ_STAGES - 1; ++s)
        if (s < nkt) load_w(s, s);
    pdl_enter();
#pragma unroll
    for (int s = 0; s < MQ_STAGES - 1; ++s) {
        if (s < nkt) load_x(s, s);
        cp_async_commit();
    }

    // Warps: WM along the rows of x (2 from 64 rows a CTA: half the x fragments a warp
    // loads from shared memory, each weight word decoded by two warps), WN = 8 / WM along
    // the weight rows, each over WM of the layout's 16-row warp slices.
    constexpr int WM = MB >= 4 ? 2 : 1;
    constexpr int WN = 8 / WM;
    constexpr int MBW = MB / WM;
    const int wm = warp / WN, wn = warp % WN;
    float acc[MBW][2 * WM][4];
#pragma unroll
    for (int b = 0; b < MBW; ++b)
#pragma unroll
        for (int j = 0; j < 2 * WM; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[b][j][e] = 0.0f;

    const int g = lane >> 2;
    for (int i = 0; i < nkt; ++i) {
        cp_async_wait<MQ_STAGES - 2>();
        __syncthreads();
        {
            const int nx = i + MQ_STAGES - 1;
            if (nx < nkt) {
                load_w(nx % MQ_STAGES, nx);
                load_x(nx % MQ_STAGES, nx);
            }
            cp_async_commit();
        }
        const unsigned char* base = mq_smem + (i % MQ_STAGES) * S::STAGE;
        const unsigned int sx = (unsigned int)__cvta_generic_to_shared(base);
        const unsigned char* sw = base + S::X;
        const unsigned char* ss = sw + TILE;
        // This lane's words of its layout slices lw = wn * WM + u.
        uint4 wv[WM][BITS / 4];
#pragma unroll
        for (int u = 0; u < WM; ++u) {
            const int lw = wn * WM + u;
#pragma unroll
            for (int h = 0; h < BITS / 4; ++h)
                wv[u][h] = *reinterpret_cast<const uint4*>(
                    sw + ((lw * (BITS / 4) + h) * 32 + lane) * 16);
        }
#pragma unroll
        for (int gi = 0; gi < 2; ++gi) {
            MqScale<T> sc[WM][2];
#pragma unroll
            for (int u = 0; u < WM; ++u)
#pragma unroll
                for (int j = 0; j < 2; ++j)
                    sc[u][j] = mq_scale<T>(ss, gi, (wn * WM + u) * 16 + j * 8 + g);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int s = 2 * gi + h;
                unsigned int b[WM][2][2];
#pragma unroll
                for (int u = 0; u < WM; ++u) {
                    if (BITS == 4) {
                        const unsigned int q = mq_word(wv[u][0], s);
                        b[u][0][0] = mq_dec4<T>(q, 0, sc[u][0]);
                        b[u][0][1] = mq_dec4<T>(q, 1, sc[u][0]);
                        b[u][1][0] = mq_dec4<T>(q, 2, sc[u][1]);
                        b[u][1][1] = mq_dec4<T>(q, 3, sc[u][1]);
                    } else {
                        const uint4& v = wv[u][(BITS / 4 - 1) * gi];
                        const unsigned int q0 = mq_word(v, 2 * h);
                        const unsigned int q1 = mq_word(v, 2 * h + 1);
                        b[u][0][0] = MqDec8<T>::dec(q0, 0, sc[u][0]);
                        b[u][0][1] = MqDec8<T>::dec(q0, 1, sc[u][0]);
                        b[u][1][0] = MqDec8<T>::dec(q1, 0, sc[u][1]);
                        b[u][1][1] = MqDec8<T>::dec(q1, 1, sc[u][1]);
                    }
                }
#pragma unroll
                for (int mb = 0; mb < MBW; ++mb) {
                    unsigned int a[4];
                    const int r = (wm * MBW + mb) * 16 + (lane & 15);
                    const unsigned int addr =
                        sx + (r * MQ_LD + s * 16 + (lane >> 4) * 8) * 2;
                    ldmatrix_x4(addr, a[0], a[1], a[2], a[3]);
#pragma unroll
                    for (int u = 0; u < WM; ++u)
#pragma unroll
                        for (int j = 0; j < 2; ++j)
                            Mma16816<T>::mma(acc[mb][2 * u + j], a, b[u][j][0], b[u][j][1]);
                }
            }
        }
    }
    cp_async_wait<0>();

    const int t4 = lane & 3;
    const long long total = (long long)m * n;
#pragma unroll
    for (int mb = 0; mb < MBW; ++mb)
#pragma unroll
        for (int j = 0; j < 2 * WM; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = m0 + (wm * MBW + mb) * 16 + g + 8 * (e >> 1);
                const int col = nt * MQ_BN + wn * WM * 16 + j * 8 + 2 * t4 + (e & 1);
                if (row >= m || col >= n) continue;
                const long long o = (long long)row * n + col;
                float v = acc[mb][j][e];
                if (splits > 1) {
                    ws[z * total + o] = v;
                } else {
                    if (bias != nullptr) v += to_f32(bias[col]);
                    if (out_f32)
                        reinterpret_cast<float*>(out)[o] = v;
                    else
                        reinterpret_cast<T*>(out)[o] = from_f32<T>(v);
                }
            }
}

// marlin_q<BITS>_<x>_mb<MB>: two CTAs an SM up to 64 rows a CTA, one for 128.
#define MARLIN_ONE(BITS, T, TN, MB)                                                          \
    extern "C" __global__ void __launch_bounds__(MQ_THREADS, (MB) <= 4 ? 2 : 1)               \
        marlin_q##BITS##_##TN##_mb##MB(const T* x, const unsigned char* w, const T* bias,    \
                                       void* out, float* ws, int m, int n, int k,             \
                                       int out_f32) {                                         \
        marlin_impl<BITS, T, MB>(x, w, bias, out, ws, m, n, k, out_f32);                      \
    }
#define MARLIN_MBS(BITS, T, TN)                                                              \
    MARLIN_ONE(BITS, T, TN, 1)                                                                \
    MARLIN_ONE(BITS, T, TN, 2)                                                                \
    MARLIN_ONE(BITS, T, TN, 4)                                                                \
    MARLIN_ONE(BITS, T, TN, 8)
MARLIN_MBS(4, bf16, bf16)
MARLIN_MBS(4, f16, f16)
MARLIN_MBS(8, bf16, bf16)
MARLIN_MBS(8, f16, f16)
