// quant_q5_k.cu: the Q5_K kernels (the quantized-weight machinery of quant_gemv.cuh and
// quant_mma.cuh; src/quant.rs's layout). A block is Q4_K with a fifth bit per value: quant
// bytes qh[32] (bit g of byte l is the fifth bit of value l of sub-block g) then qs[128] as
// Q4_K's; scale bytes as Q4_K's.
//
// qgemv unit: half a block (UPB = 2), lane `sub` = h: the 16 high-bit bytes at 16h, the 16
// bytes of qs at 32p + 16h for p = 0..3 (128 values) and the block's 16 scale bytes.

struct QFormatQ5K {
    static constexpr int BE = 256, QB = 160, SB = 16, UPB = 2, UNROLL = 1;
    struct Unit {
        uint4 h;
        uint4 q[4];
        uint4 s;
    };
    static __device__ __forceinline__ void load(Unit& u, const unsigned char* row, int nb, int b,
                                                int sub) {
        const unsigned char* base = row + b * QB;
        u.h = q_ld128(base + 16 * sub);
#pragma unroll
        for (int p = 0; p < 4; ++p) u.q[p] = q_ld128(base + 32 + 32 * p + 16 * sub);
        u.s = q_ld128(row + nb * QB + b * SB);
    }

    template <typename T, int M, int R>
    static __device__ __forceinline__ void dot(const Unit (&u)[R], int sub, const T* __restrict__ x,
                                               int k, int m_rows, float (&acc)[R][M]) {
        float d[R], dmin[R];
        unsigned int sc[R][2], mn[R][2];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float2 dd = q_f16x2(u[r].s.x);
            d[r] = dd.x;
            dmin[r] = dd.y;
            q_k4_scales(u[r].s, sc[r], mn[r]);
        }
#pragma unroll
        for (int p = 0; p < 4; ++p) {
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
                const int j = 2 * p + hi;
                float f[R][16], alpha[R], beta[R];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    alpha[r] = fmaf(256.0f * d[r], q_mag(sc[r][j >> 2], j & 3), -128.0f * d[r]);
                    beta[r] = fmaf(-256.0f * dmin[r], q_mag(mn[r][j >> 2], j & 3), 128.0f * dmin[r]);
#pragma unroll
                    for (int wd = 0; wd < 4; ++wd) {
                        const unsigned int v = q_word(u[r].q[p], wd);
                        // q << 2 in each byte (F = 0.5 + q / 64): the nibble, and bit j of the
                        // high-bit byte as bit 6.
                        const unsigned int nib = hi ? (v >> 2) & 0x3C3C3C3Cu : (v << 2) & 0x3C3C3C3Cu;
                        const unsigned int h5 = q_shift(q_word(u[r].h, wd), 6 - j) & 0x40404040u;
                        q_mag4(nib | h5, &f[r][4 * wd]);
                    }
                }
                q_run16<T, M, R, 6>(x + 64 * p + 32 * hi + 16 * sub, k, m_rows, f, alpha, beta,
                                       acc);
            }
        }
    }

    // Sub-block gi % 8 of block gi / 8, as quant.rs's q5_k.
    struct Raw {
        uint4 q[2], h[2];
        uint4 s;
    };
    static __device__ __forceinline__ void load32(const unsigned char* row, int nb, int gi,
                                                  Raw& r) {
        const int b = gi >> 3, j = gi & 7;
        const unsigned char* base = row + b * QB;
        r.h[0] = q_ldg128(base);
        r.h[1] = q_ldg128(base + 16);
        r.q[0] = q_ldg128(base + 32 + 32 * (j >> 1));
        r.q[1] = q_ldg128(base + 32 + 32 * (j >> 1) + 16);
        r.s = q_ldg128(row + nb * QB + b * SB);
    }
    static __device__ __forceinline__ void decode_raw(const Raw& r, int gi, float* v) {
        const int j = gi & 7;
        const uint4 *q = r.q, *h = r.h;
        const float2 sm = q_k4_sub(r.s, j);
        const float d0 = sm.x, dm0 = sm.y;
#pragma unroll
        for (int l = 0; l < 32; ++l) {
            const unsigned int byte = q_byte(q, l);
            const unsigned int nib = (j & 1) ? byte >> 4 : byte & 0xFu;
            const unsigned int q5 = nib | ((q_byte(h, l) >> j) & 1u) << 4;
            v[l] = __fsub_rn(__fmul_rn(d0, q_u2f(q5, 0.0f)), dm0);
        }
    }
    // The same 32 values as 16 bf16 pairs in k order, for a bf16 qmma (q_bf2_bytes; d sc
    // and -dmin m rounded to bf16 first).
    static __device__ __forceinline__ void decode_bf16(const Raw& r, int gi, unsigned int (&o)[16]) {
        const int j = gi & 7;
        const float2 sm = q_k4_sub(r.s, j);
        const unsigned int a = q_bf2(sm.x), b = q_bf2(-sm.y);
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            const unsigned int qw = q_word(r.q[w >> 2], w & 3), hw = q_word(r.h[w >> 2], w & 3);
            const unsigned int q =
                (((j & 1) ? qw >> 4 : qw) & 0x0F0F0F0Fu) | (((hw >> j) & 0x01010101u) << 4);
            q_bf2_bytes(q, Q_BF2_M128, a, b, o[2 * w], o[2 * w + 1]);
        }
    }
};
template <> struct QDecodeBf16<QFormatQ5K> {
    static constexpr bool value = true;
};

QUANT_KERNELS(QFormatQ5K, q5_k)
QMOE_MMA(QFormatQ5K, q5_k, 2)
