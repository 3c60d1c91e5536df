// quant_fp8.cu: the FP8 E4M3 kernels (common.cuh's quantized-weight machinery; src/quant.rs's
// layout). A block is 128 values: quant bytes, 128 E4M3 bytes (OCP "fn": no infinities,
// 0x7F / 0xFF NaN), scale bytes one f32 scale; value = scale * e4m3.
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
        q_run16<T, M, R, false>(x + 16 * sub, k, m_rows, f, alpha, alpha, acc);
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
    static __device__ __forceinline__ void decode32(const unsigned char* row, int nb, int gi,
                                                    float* v) {
        const int b = gi >> 2, t = gi & 3;
        uint4 q[2];
        q[0] = q_ldg128(row + b * QB + 32 * t);
        q[1] = q_ldg128(row + b * QB + 32 * t + 16);
        const float s = __uint_as_float(q_ldg32(row + nb * QB + b * SB));
#pragma unroll
        for (int l = 0; l < 32; ++l) v[l] = __fmul_rn(s, e4m3(q_byte(q, l)));
    }
};

QUANT_KERNELS(QFormatF8, fp8)
