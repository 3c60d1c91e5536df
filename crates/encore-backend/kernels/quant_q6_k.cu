// quant_q6_k.cu: the Q6_K kernels (the quantized-weight machinery of quant_gemv.cuh and
// quant_mma.cuh; src/quant.rs's layout). A block is 256 values in 16 sub-blocks of 16: quant
// bytes ql[128] (low nibbles) then qh[64] (high 2-bit pairs), scale bytes 16 signed 8-bit
// scales then d (f16, so only 2-byte aligned); value = d * sc * (q - 32). Half hh of the block
// (128 values) uses ql[64hh..], qh[32hh..]: values l, l + 32, l + 64, l + 96 (l < 32) are the
// low nibbles of ql[l], ql[l + 32], then their high nibbles, over bits 0-1, 2-3, 4-5, 6-7 of
// qh[l].
//
// qgemv unit: a quarter block (UPB = 4), lane `sub` = 2hh + s: l = 16s + 0..15 of half hh,
// three 16-byte loads (ql at l, ql at l + 32, qh at l: 64 values in four runs of 16, each of
// one sub-block) and the four scales it uses (2-byte loads; the byte is chosen by s) and d.

struct QFormatQ6K {
    static constexpr int BE = 256, QB = 192, SB = 18, UPB = 4, UNROLL = 1;
    struct Unit {
        uint4 a, b, h;
        unsigned int sc[4];
        unsigned int d;
    };
    static __device__ __forceinline__ void load(Unit& u, const unsigned char* row, int nb, int b,
                                                int sub) {
        const int hh = sub >> 1, s = sub & 1;
        const unsigned char* base = row + b * QB;
        u.a = q_ld128(base + 64 * hh + 16 * s);
        u.b = q_ld128(base + 64 * hh + 32 + 16 * s);
        u.h = q_ld128(base + 128 + 32 * hh + 16 * s);
        const unsigned char* sb = row + nb * QB + b * SB;
#pragma unroll
        for (int t = 0; t < 4; ++t) u.sc[t] = q_ld16(sb + 8 * hh + 2 * t);
        u.d = q_ld16(sb + 16);
    }

    template <typename T, int M, int R>
    static __device__ __forceinline__ void dot(const Unit (&u)[R], int sub, const T* __restrict__ x,
                                               int k, int m_rows, float (&acc)[R][M]) {
        const int hh = sub >> 1, s = sub & 1;
        // Byte s of a 2-byte scale word, sign-extended: (int)(word << shl) >> 24.
        const int shl = 24 - 8 * s;
        float d[R];
#pragma unroll
        for (int r = 0; r < R; ++r) d[r] = q_f16(u[r].d);
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            float f[R][16], alpha[R], beta[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                alpha[r] = d[r] * (float)((int)(u[r].sc[t] << shl) >> 24);
                beta[r] = -32.0f * alpha[r];
#pragma unroll
                for (int wd = 0; wd < 4; ++wd) {
                    const unsigned int a = q_word(t & 1 ? u[r].b : u[r].a, wd);
                    const unsigned int h = q_word(u[r].h, wd);
                    // q << 1 in each byte (F = 0.5 + q / 128): the nibble at bits 1..4, bits
                    // 2t, 2t + 1 of the high byte at 5, 6.
                    const unsigned int lo = (t >> 1 ? a >> 3 : a << 1) & 0x1E1E1E1Eu;
                    q_mag4(lo | (q_shift(h, 5 - 2 * t) & 0x60606060u), &f[r][4 * wd]);
                }
            }
            q_run16<T, M, R, 7>(x + 128 * hh + 32 * t + 16 * s, k, m_rows, f, alpha, beta, acc);
        }
    }

    // Values 32t .. 32t + 31 of half hh of block b (gi = 8b + 4hh + t), as quant.rs's q6_k.
    struct Raw {
        uint4 ql[2], qh[2];
        unsigned int scw, d;
    };
    static __device__ __forceinline__ void load32(const unsigned char* row, int nb, int gi,
                                                  Raw& r) {
        const int b = gi >> 3, hh = (gi >> 2) & 1, t = gi & 3;
        const unsigned char* base = row + b * QB;
        r.ql[0] = q_ldg128(base + 64 * hh + 32 * (t & 1));
        r.ql[1] = q_ldg128(base + 64 * hh + 32 * (t & 1) + 16);
        r.qh[0] = q_ldg128(base + 128 + 32 * hh);
        r.qh[1] = q_ldg128(base + 128 + 32 * hh + 16);
        const unsigned char* sb = row + nb * QB + b * SB;
        r.scw = q_ldg16(sb + 8 * hh + 2 * t);
        r.d = q_ldg16(sb + 16);
    }
    static __device__ __forceinline__ void decode_raw(const Raw& r, int gi, float* v) {
        const int t = gi & 3;
        const uint4 *ql = r.ql, *qh = r.qh;
        const unsigned int scw = r.scw;
        const float d = q_f16(r.d);
        const float s0 = __fmul_rn(d, (float)(signed char)(scw & 0xFFu));
        const float s1 = __fmul_rn(d, (float)(signed char)(scw >> 8));
#pragma unroll
        for (int l = 0; l < 32; ++l) {
            const unsigned int byte = q_byte(ql, l);
            const unsigned int lo = (t >> 1) ? byte >> 4 : byte & 0xFu;
            const unsigned int q = lo | ((q_byte(qh, l) >> (2 * t)) & 3u) << 4;
            v[l] = __fmul_rn(l < 16 ? s0 : s1, q_u2f(q, 32.0f));
        }
    }
    // The same 32 values as 16 bf16 pairs in k order, for a bf16 qmma (q_bf2_bytes_split:
    // d * sc, exact in f32, split into two bf16 parts, so each value is rounded once, as
    // decode_raw's f32 values are when stored; rounding the scale to bf16 first gave twice
    // the error, 2.2e-2 against the CPU on `encore info` seed 1795760105579638199).
    static __device__ __forceinline__ void decode_bf16(const Raw& r, int gi, unsigned int (&o)[16]) {
        const int t = gi & 3;
        const float d = q_f16(r.d);
        unsigned int h0, l0, h1, l1;
        q_bf2_split(__fmul_rn(d, (float)(signed char)(r.scw & 0xFFu)), h0, l0);
        q_bf2_split(__fmul_rn(d, (float)(signed char)(r.scw >> 8)), h1, l1);
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            const unsigned int lw = q_word(r.ql[w >> 2], w & 3), hw = q_word(r.qh[w >> 2], w & 3);
            const unsigned int lo = ((t >> 1) ? lw >> 4 : lw) & 0x0F0F0F0Fu;
            const unsigned int q = lo | (((hw >> (2 * t)) & 0x03030303u) << 4);
            q_bf2_bytes_split(q, 0xC320C320u, w < 4 ? h0 : h1, w < 4 ? l0 : l1, o[2 * w],
                              o[2 * w + 1]);
        }
    }
};
template <> struct QDecodeBf16<QFormatQ6K> {
    static constexpr bool value = true;
};

QUANT_KERNELS(QFormatQ6K, q6_k)
QMOE_MMA(QFormatQ6K, q6_k, 2)
