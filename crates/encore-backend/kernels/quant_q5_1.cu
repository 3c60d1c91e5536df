// quant_q5_1.cu: the Q5_1 kernels (the quantized-weight machinery of quant_gemv.cuh and
// quant_mma.cuh; src/quant.rs's layout). A block is 32 values: quant bytes qs[16] as Q4_0,
// scale bytes d, m (f16) and qh as Q5_0; value = d * q + m.
//
// qgemv unit: a block (UPB = 1): one 16-byte load, two runs of 16 values (low nibbles,
// high nibbles), and the scale bytes.

struct QFormatQ5_1 {
    static constexpr int BE = 32, QB = 16, SB = 8, UPB = 1, UNROLL = 4;
    struct Unit {
        uint4 q;
        uint2 s;
    };
    static __device__ __forceinline__ void load(Unit& u, const unsigned char* row, int nb, int b,
                                                int) {
        u.q = q_ld128(row + b * QB);
        u.s = q_ld64(row + nb * QB + b * SB);
    }

    template <typename T, int M, int R>
    static __device__ __forceinline__ void dot(const Unit (&u)[R], int, const T* __restrict__ x,
                                               int k, int m_rows, float (&acc)[R][M]) {
        float alpha[R], beta[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float2 dm = q_f16x2(u[r].s.x);
            alpha[r] = dm.x;
            beta[r] = dm.y;
        }
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            float f[R][16];
#pragma unroll
            for (int r = 0; r < R; ++r) {
#pragma unroll
                for (int wd = 0; wd < 4; ++wd) {
                    const unsigned int v = q_word(u[r].q, wd);
                    // q << 2 in each byte (F = 0.5 + q / 64): the nibble, and the fifth bits of
                    // values 16hi + 4wd .. + 3 as bit 6.
                    const unsigned int nib = hi ? (v >> 2) & 0x3C3C3C3Cu : (v << 2) & 0x3C3C3C3Cu;
                    q_mag4(nib | q_spread4(u[r].s.y >> (16 * hi + 4 * wd)), &f[r][4 * wd]);
                }
            }
            q_run16<T, M, R, 6>(x + 16 * hi, k, m_rows, f, alpha, beta, acc);
        }
    }

    struct Raw {
        uint4 q[1];
        unsigned int s, qh;
    };
    static __device__ __forceinline__ void load32(const unsigned char* row, int nb, int gi,
                                                  Raw& r) {
        r.q[0] = q_ldg128(row + gi * QB);
        const unsigned char* s = row + nb * QB + gi * SB;
        r.s = q_ldg32(s);
        r.qh = q_ldg32(s + 4);
    }
    static __device__ __forceinline__ void decode_raw(const Raw& r, int gi, float* v) {
        const float2 dm = q_f16x2(r.s);
        const float d = dm.x, m = dm.y;
        const unsigned int qh = r.qh;
#pragma unroll
        for (int l = 0; l < 16; ++l) {
            const unsigned int byte = q_byte(r.q, l);
            v[l] = __fadd_rn(__fmul_rn(d, q_u2f((byte & 0xFu) | ((qh >> l) & 1u) << 4, 0.0f)), m);
            v[l + 16] = __fadd_rn(__fmul_rn(d, q_u2f((byte >> 4) | ((qh >> (l + 16)) & 1u) << 4, 0.0f)), m);
        }
    }
};

QUANT_KERNELS(QFormatQ5_1, q5_1)
QMOE_MMA(QFormatQ5_1, q5_1, 2)
