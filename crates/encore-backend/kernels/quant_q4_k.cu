// quant_q4_k.cu: the Q4_K kernels (the quantized-weight machinery of quant_gemv.cuh and
// quant_mma.cuh; src/quant.rs's layout). A block is 256 values in 8 sub-blocks of 32: quant
// bytes qs[128] (bytes 32p..32p+32 hold sub-block 2p in their low nibbles and 2p + 1 in their
// high ones), scale bytes d, dmin (f16) and 12 bytes of 6-bit scales and mins; value = d * sc *
// q - dmin * m.
//
// qgemv unit: half a block (UPB = 2), lane `sub` = h: the 16 bytes at 32p + 16h for p = 0..3
// (four 16-byte loads, 128 values: 16 of each sub-block) and the block's 16 scale bytes
// (one load shared by the block's two lanes). Every sub-block index is a constant.

struct QFormatQ4K {
    static constexpr int BE = 256, QB = 128, SB = 16, UPB = 2, UNROLL = 1;
    struct Unit {
        uint4 q[4];
        uint4 s;
    };
    static __device__ __forceinline__ void load(Unit& u, const unsigned char* row, int nb, int b,
                                                int sub) {
        const unsigned char* qs = row + b * QB + 16 * sub;
#pragma unroll
        for (int p = 0; p < 4; ++p) u.q[p] = q_ld128(qs + 32 * p);
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
                    // d * sc and -dmin * m, exactly: 256 d (0.5 + sc / 256) - 128 d.
                    alpha[r] = fmaf(256.0f * d[r], q_mag(sc[r][j >> 2], j & 3), -128.0f * d[r]);
                    beta[r] = fmaf(-256.0f * dmin[r], q_mag(mn[r][j >> 2], j & 3), 128.0f * dmin[r]);
#pragma unroll
                    for (int wd = 0; wd < 4; ++wd) {
                        const unsigned int v = q_word(u[r].q[p], wd);
                        // q << 3 in each byte: F = 0.5 + q / 32.
                        q_mag4(hi ? (v >> 1) & 0x78787878u : (v << 3) & 0x78787878u, &f[r][4 * wd]);
                    }
                }
                q_run16<T, M, R, 5>(x + 64 * p + 32 * hi + 16 * sub, k, m_rows, f, alpha, beta, acc);
            }
        }
    }

    // Sub-block gi % 8 of block gi / 8, as quant.rs's q4_k.
    struct Raw {
        uint4 q[2];
        uint4 s;
    };
    static __device__ __forceinline__ void load32(const unsigned char* row, int nb, int gi,
                                                  Raw& r) {
        const int b = gi >> 3, j = gi & 7;
        r.q[0] = q_ldg128(row + b * QB + 32 * (j >> 1));
        r.q[1] = q_ldg128(row + b * QB + 32 * (j >> 1) + 16);
        r.s = q_ldg128(row + nb * QB + b * SB);
    }
    static __device__ __forceinline__ void decode_raw(const Raw& r, int gi, float* v) {
        const int j = gi & 7;
        const uint4* q = r.q;
        const float2 sm = q_k4_sub(r.s, j);
        const float d0 = sm.x, dm0 = sm.y;
#pragma unroll
        for (int l = 0; l < 32; ++l) {
            const unsigned int byte = q_byte(q, l);
            const unsigned int nib = (j & 1) ? byte >> 4 : byte & 0xFu;
            v[l] = __fsub_rn(__fmul_rn(d0, q_u2f(nib, 0.0f)), dm0);
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
            const unsigned int word = q_word(r.q[w >> 2], w & 3);
            const unsigned int nib = ((j & 1) ? word >> 4 : word) & 0x0F0F0F0Fu;
            q_bf2_bytes(nib, Q_BF2_M128, a, b, o[2 * w], o[2 * w + 1]);
        }
    }
};
template <> struct QDecodeBf16<QFormatQ4K> {
    static constexpr bool value = true;
};

QUANT_KERNELS(QFormatQ4K, q4_k)
QMOE_MMA(QFormatQ4K, q4_k, 2)
