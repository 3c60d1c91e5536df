// quant_mxfp4.cu: the MXFP4 kernels (the quantized-weight machinery of quant_gemv.cuh and
// quant_mma.cuh; src/quant.rs's layout, src/quant/mxfp4.rs's values). A block is 32 values:
// quant bytes qs[16] (FP4 E2M1 codes: value j in the low nibble of byte j, value j + 16 in
// the high one, llama.cpp's block_mxfp4), scale byte e (E8M0); value = kvalues[q] *
// 2^(e - 128) with kvalues the doubled E2M1 values {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, ...,
// -12} (llama.cpp's kvalues_mxfp4): every value exact in f32.
//
// A word of four codes (one a byte, in its low nibble) decodes by table: one PRMT picks
// each code's magnitude byte from the eight doubled magnitudes (two words), the sign
// (bit 3) negates the byte (two's complement per byte), and Q8_0's exact byte-to-float
// (2^23 + (s ^ 0x80)) - (2^23 + 128) gives the float; no -0 arises (code 8 decodes to +0,
// as quant.rs does).
//
// qgemv unit: a block (UPB = 1): one 16-byte load, two runs of 16 values (low nibbles,
// high nibbles) against the scale 2^(e - 128).

// Streaming load of one byte (the scale), as quant_gemv.cuh's q_ld16.
__device__ __forceinline__ unsigned int q_ld8(const void* p) {
#ifdef __CUDA_ARCH__
    unsigned short r;
    asm volatile("ld.global.nc.L1::no_allocate.u8 %0, [%1];\n" : "=h"(r) : "l"(p));
    return r & 0xFFu;
#else
    return *reinterpret_cast<const unsigned char*>(p);
#endif
}

// 2^(e - 128) (quant/mxfp4.rs's e8m0_half: e = 0, 1 the subnormals 2^-128, 2^-127).
__device__ __forceinline__ float mx_half_scale(unsigned int e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// The doubled E2M1 magnitudes of codes 0..7 as bytes: {0, 1, 2, 3} and {4, 6, 8, 12}.
#define MX_MAG_LO 0x03020100u
#define MX_MAG_HI 0x0C080604u

// The four codes of `c` (one a byte, in bits 0..3 of each byte) as signed bytes kvalues[q].
__device__ __forceinline__ unsigned int mx_kvalues4(unsigned int c) {
    const unsigned int x = c | (c >> 4);  // byte 0: c0 | c1 << 4, byte 2: c2 | c3 << 4
    const unsigned int sel = ((x & 0xFFu) | ((x >> 8) & 0xFF00u)) & 0x7777u;
    const unsigned int mag = __byte_perm(MX_MAG_LO, MX_MAG_HI, sel);
    const unsigned int neg = ((c >> 3) & 0x01010101u) * 0xFFu;  // 0xFF where the sign is set
    return __vsub4(mag ^ neg, neg);                               // -mag there, mag elsewhere
}

// The four signed bytes of `s` as floats, in byte order (exact).
__device__ __forceinline__ void mx_floats4(unsigned int s, float* f) {
    const unsigned int v = s ^ 0x80808080u;
#pragma unroll
    for (int e = 0; e < 4; ++e)
        f[e] = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7650u | e)) - 8388736.0f;
}

// The E2M1 codes in the top nibbles of t's halves (bits 15..12, 31..28) as a bf16 pair of
// their values times 2^-126, times the bf16 pair m (rounded once; exact for powers of two).
__device__ __forceinline__ unsigned int mx_bf2(unsigned int t, unsigned int m) {
    return q_bf2_fma((t & 0x80008000u) | ((t >> 6) & 0x01C001C0u), m, 0x80008000u);
}

struct QFormatMxfp4 {
    static constexpr int BE = 32, QB = 16, SB = 1, UPB = 1, UNROLL = 4;
    struct Unit {
        uint4 q;
        unsigned int e;
    };
    static __device__ __forceinline__ void load(Unit& u, const unsigned char* row, int nb, int b,
                                                int) {
        u.q = q_ld128(row + b * QB);
        u.e = q_ld8(row + nb * QB + b * SB);
    }

    template <typename T, int M, int R>
    static __device__ __forceinline__ void dot(const Unit (&u)[R], int, const T* __restrict__ x,
                                               int k, int m_rows, float (&acc)[R][M]) {
        float alpha[R];
#pragma unroll
        for (int r = 0; r < R; ++r) alpha[r] = mx_half_scale(u[r].e);
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            float f[R][16];
#pragma unroll
            for (int r = 0; r < R; ++r) {
#pragma unroll
                for (int wd = 0; wd < 4; ++wd) {
                    const unsigned int v = q_word(u[r].q, wd);
                    mx_floats4(mx_kvalues4(hi ? (v >> 4) & 0x0F0F0F0Fu : v & 0x0F0F0F0Fu),
                               &f[r][4 * wd]);
                }
            }
            q_run16<T, M, R, 0>(x + 16 * hi, k, m_rows, f, alpha, alpha, acc);
        }
    }

    struct Raw {
        uint4 q[1];
        unsigned int s;
    };
    static __device__ __forceinline__ void load32(const unsigned char* row, int nb, int gi,
                                                  Raw& r) {
        r.q[0] = q_ldg128(row + gi * QB);
        r.s = __ldg(row + nb * QB + gi * SB);
    }
    // The same 32 values as 16 bf16 pairs in k order, exactly: a code's bits s e1 e0 m put at
    // a bf16's sign and bits 8..6 (mx_bf2) make its E2M1 value times 2^-126 (a subnormal
    // for e1 e0 = 0), and one bf16x2 product by 2^(e - 1) = 2^126 times the scale 2^(e - 127)
    // gives the value (products of powers of two by 3-bit values: exact wherever f32's
    // decode is finite and not below 2^-133). A scale above 2^1 (e > 128) takes a second
    // product, 2^127 then 2^(e - 128), since 2^(e - 1) would not fit a bf16.
    static __device__ __forceinline__ void decode_bf16(const Raw& r, int, unsigned int (&o)[16]) {
        const unsigned int e = r.s & 0xFFu;
        const unsigned int m1 = ((min(e, 128u) + 126u) << 7) * 0x10001u;
        const unsigned int m2 = ((max(e, 129u) - 1u) << 7) * 0x10001u;
        const bool big = e > 128u;
        // Each pair on its own (a predicated second product, no array-wide branch), so its
        // registers live only until its mma.
        auto one = [&](unsigned int t) {
            const unsigned int v = mx_bf2(t, m1);
            return big ? q_bf2_fma(v, m2, 0x80008000u) : v;
        };
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const unsigned int word = q_word(r.q[0], w);
            // Bytes 4w, 4w + 1 (then 4w + 2, 4w + 3) at bytes 1 and 3, so each half's top
            // nibble is a high nibble (values 16 + ...) and, shifted by 4, a low one.
            const unsigned int ta = __byte_perm(word, 0u, 0x1404u);
            const unsigned int tb = __byte_perm(word, 0u, 0x3424u);
            o[2 * w] = one(ta << 4);
            o[2 * w + 1] = one(tb << 4);
            o[8 + 2 * w] = one(ta);
            o[9 + 2 * w] = one(tb);
        }
    }
    static __device__ __forceinline__ void decode_raw(const Raw& r, int gi, float* v) {
        const float d = mx_half_scale(r.s & 0xFFu);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const unsigned int word = q_word(r.q[0], w);
            float lo[4], hi[4];
            mx_floats4(mx_kvalues4(word & 0x0F0F0F0Fu), lo);
            mx_floats4(mx_kvalues4((word >> 4) & 0x0F0F0F0Fu), hi);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                v[4 * w + e] = __fmul_rn(lo[e], d);
                v[16 + 4 * w + e] = __fmul_rn(hi[e], d);
            }
        }
    }
};

template <> struct QDecodeBf16<QFormatMxfp4> {
    static constexpr bool value = true;
};

QUANT_KERNELS(QFormatMxfp4, mxfp4)
QMOE_MMA(QFormatMxfp4, mxfp4, 3)
