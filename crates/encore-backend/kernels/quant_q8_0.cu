// quant_q8_0.cu: the Q8_0 kernels (the quantized-weight machinery of quant_gemv.cuh and
// quant_mma.cuh; src/quant.rs's layout). A block is 32 values: quant bytes qs[32] (signed),
// scale bytes d (f16); value = d * q.
//
// qgemv unit: half a block (UPB = 2): 16 bytes, 16 values, and d. A value is decoded exactly
// as (2^23 + (q ^ 0x80)) - (2^23 + 128), the first term one byte permute.

struct QFormatQ8_0 {
    static constexpr int BE = 32, QB = 32, SB = 2, UPB = 2, UNROLL = 4;
    struct Unit {
        uint4 q;
        unsigned int d;
    };
    static __device__ __forceinline__ void load(Unit& u, const unsigned char* row, int nb, int b,
                                                int sub) {
        u.q = q_ld128(row + b * QB + 16 * sub);
        u.d = q_ld16(row + nb * QB + b * SB);
    }

    template <typename T, int M, int R>
    static __device__ __forceinline__ void dot(const Unit (&u)[R], int sub, const T* __restrict__ x,
                                               int k, int m_rows, float (&acc)[R][M]) {
        float f[R][16], alpha[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            alpha[r] = q_f16(u[r].d);
#pragma unroll
            for (int wd = 0; wd < 4; ++wd) {
                const unsigned int v = q_word(u[r].q, wd) ^ 0x80808080u;
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    f[r][4 * wd + e] =
                        __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7650u | e)) - 8388736.0f;
            }
        }
        q_run16<T, M, R, 0>(x + 16 * sub, k, m_rows, f, alpha, alpha, acc);
    }

    // The bytes of group gi (load32), then its values (decode_raw): qmma_impl issues the
    // loads of the next tile before the current tile's mma and decodes after it.
    struct Raw {
        uint4 q[2];
        unsigned int s;
    };
    static __device__ __forceinline__ void load32(const unsigned char* row, int nb, int gi,
                                                  Raw& r) {
        r.q[0] = q_ldg128(row + gi * QB);
        r.q[1] = q_ldg128(row + gi * QB + 16);
        r.s = q_ldg16(row + nb * QB + gi * SB);
    }
    static __device__ __forceinline__ void decode_raw(const Raw& r, int gi, float* v) {
        const float d = q_f16(r.s);
#pragma unroll
        for (int l = 0; l < 32; ++l) v[l] = __fmul_rn(d, q_u2f(q_byte(r.q, l) ^ 0x80u, 128.0f));
    }
};

QUANT_KERNELS(QFormatQ8_0, q8_0)
QMOE_MMA(QFormatQ8_0, q8_0, 2)
