// quant_q4_1.cu: the Q4_1 kernels (the quantized-weight machinery of quant_gemv.cuh and
// quant_mma.cuh; src/quant.rs's layout). A block is 32 values: quant bytes qs[16] as Q4_0,
// scale bytes d, m (f16); value = d * q + m.
//
// qgemv unit: a block (UPB = 1): one 16-byte load, two runs of 16 values (low nibbles,
// high nibbles), and the scale bytes.

struct QFormatQ4_1 {
    static constexpr int BE = 32, QB = 16, SB = 4, UPB = 1, UNROLL = 4;
    struct Unit {
        uint4 q;
        unsigned int dm;
    };
    static __device__ __forceinline__ void load(Unit& u, const unsigned char* row, int nb, int b,
                                                int) {
        u.q = q_ld128(row + b * QB);
        u.dm = q_ld32(row + nb * QB + b * SB);
    }

    template <typename T, int M, int R>
    static __device__ __forceinline__ void dot(const Unit (&u)[R], int, const T* __restrict__ x,
                                               int k, int m_rows, float (&acc)[R][M]) {
        float alpha[R], beta[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float2 dm = q_f16x2(u[r].dm);
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
                    // q << 3 in each byte: F = 0.5 + q / 32.
                    q_mag4(hi ? (v >> 1) & 0x78787878u : (v << 3) & 0x78787878u, &f[r][4 * wd]);
                }
            }
            q_run16<T, M, R, 5>(x + 16 * hi, k, m_rows, f, alpha, beta, acc);
        }
    }

    struct Raw {
        uint4 q[1];
        unsigned int s;
    };
    static __device__ __forceinline__ void load32(const unsigned char* row, int nb, int gi,
                                                  Raw& r) {
        r.q[0] = q_ldg128(row + gi * QB);
        r.s = q_ldg32(row + nb * QB + gi * SB);
    }
    static __device__ __forceinline__ void decode_raw(const Raw& r, int gi, float* v) {
        const float2 dm = q_f16x2(r.s);
        const float d = dm.x, m = dm.y;
#pragma unroll
        for (int l = 0; l < 16; ++l) {
            const unsigned int byte = q_byte(r.q, l);
            v[l] = __fadd_rn(__fmul_rn(d, q_u2f(byte & 0xFu, 0.0f)), m);
            v[l + 16] = __fadd_rn(__fmul_rn(d, q_u2f(byte >> 4, 0.0f)), m);
        }
    }
    // The same 32 values as 16 bf16 pairs in k order, for a bf16 qmma (q_bf2_bytes; d and
    // m rounded to bf16 first).
    static __device__ __forceinline__ void decode_bf16(const Raw& r, int gi, unsigned int (&o)[16]) {
        const float2 dm = q_f16x2(r.s);
        const unsigned int d = q_bf2(dm.x), m = q_bf2(dm.y);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const unsigned int word = q_word(r.q[0], w);
            q_bf2_bytes(word & 0x0F0F0F0Fu, Q_BF2_M128, d, m, o[2 * w], o[2 * w + 1]);
            q_bf2_bytes((word >> 4) & 0x0F0F0F0Fu, Q_BF2_M128, d, m, o[8 + 2 * w], o[9 + 2 * w]);
        }
    }
};
template <> struct QDecodeBf16<QFormatQ4_1> {
    static constexpr bool value = true;
};

QUANT_KERNELS(QFormatQ4_1, q4_1)
QMOE_MMA(QFormatQ4_1, q4_1, 3)
