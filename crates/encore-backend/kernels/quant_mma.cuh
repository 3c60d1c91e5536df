// quant_mma.cuh (prepended after quant_gemv.cuh): the quantized tensor-core GEMM, the grouped MoE GEMM, QUANT_KERNELS.
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
//     and act[pair, j] = act(round_T(g + bg)) * round_T(u + bu), rounded to T
//     (args::Activation's code `act_kind`: SiLU, gpt-oss's clamped SwiGLU; the biases bg =
//     bias[e I + j], bu = bias[(E + e) I + j] where bias is not null, as moe.cu's).
//   else (down): x rows are pairs (act), the down rows h0.. of expert e, and
//     y[pair, h] = round_T(dot + bias[e H + h]); moe_combine sums the slots.
template <class F, typename T, int BM, bool SILU>
__device__ __forceinline__ void gmoe_impl(const T* __restrict__ x, const MoeExperts& w,
                                          const int* __restrict__ sorted,
                                          const int* __restrict__ tile_expert,
                                          T* __restrict__ out, int k, int n_out, int experts,
                                          int top_k, int act_kind,
                                          const T* __restrict__ bias) {
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
                        float ga = acc[mt][2 * np][2 * h + c], ua = acc[mt][2 * np + 1][2 * h + c];
                        if (bias != nullptr) {
                            ga += to_f32(bias[(long long)e * n_out + j]);
                            ua += to_f32(bias[((long long)experts + e) * n_out + j]);
                        }
                        const float gv = to_f32(from_f32<T>(ga));
                        const float uv = to_f32(from_f32<T>(ua));
                        out[(long long)p * n_out + j] = from_f32<T>(act_mul_f32(act_kind, gv, uv));
                    }
            } else {
#pragma unroll
                for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const int n = n0 + wn * 32 + nt * 8 + 2 * t4 + c;
                        if (n < n_out) {
                            const float b =
                                bias != nullptr ? to_f32(bias[(long long)e * n_out + n]) : 0.0f;
                            out[(long long)p * n_out + n] = from_f32<T>(acc[mt][nt][2 * h + c] + b);
                        }
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
// qgemv_act_<fmt>_<x>_m1; dequant_<fmt>_<T>; qmoe_gate_up_<fmt>_<T> and qmoe_down_<fmt>_<T>;
// the format's file adds qmoe_mma_gate_up_<fmt>_bf16 and qmoe_mma_down_<fmt>_bf16 (QMOE_MMA).
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
        int top_k, int g, int act_kind, const T* bias) {                                        \
        pdl_enter();                                                                            \
        qmoe_gate_up_impl<F, T>(x, w, ids, act, hidden, inter, experts, top_k, g, act_kind,     \
                                bias);                                                          \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(QG_THREADS) qmoe_down_##FN##_##TN(             \
        const T* act, MoeExperts down, const int* ids, const float* weights, T* out,            \
        int hidden, int inter, int experts, int top_k, int g, const T* bias) {                  \
        pdl_enter();                                                                            \
        qmoe_down_impl<F, T>(act, down, ids, weights, out, hidden, inter, experts, top_k, g,    \
                             bias);                                                             \
    }
// The grouped MoE GEMM (gmoe_impl) for x in T and BM-row tiles: gate/up + the activation
// (act_kind), and down; `bias` the experts' gate/up or down biases (null: none).
#define GMOE_ONE(F, FN, T, TN, BM)                                                           \
    extern "C" __global__ void __launch_bounds__(QM_THREADS, (BM) <= 64 ? 2 : 1)              \
        gmoe_gate_up_##FN##_##TN##_bm##BM(const T* x, MoeExperts w,                           \
                                          const int* sorted, const int* tile_expert, T* out,  \
                                          int k, int n_out, int experts, int top_k,           \
                                          int act_kind, const T* bias) {                      \
        pdl_enter();                                                                          \
        gmoe_impl<F, T, BM, true>(x, w, sorted, tile_expert, out, k, n_out, experts, top_k,   \
                                  act_kind, bias);                                            \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(QM_THREADS, (BM) <= 64 ? 2 : 1)              \
        gmoe_down_##FN##_##TN##_bm##BM(const T* x, MoeExperts w,                              \
                                       const int* sorted, const int* tile_expert, T* out,     \
                                       int k, int n_out, int experts, int top_k,              \
                                       int act_kind, const T* bias) {                         \
        pdl_enter();                                                                          \
        gmoe_impl<F, T, BM, false>(x, w, sorted, tile_expert, out, k, n_out, experts, top_k,  \
                                   act_kind, bias);                                           \
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

