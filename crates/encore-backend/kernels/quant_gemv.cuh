// quant_gemv.cuh (prepended after common.cuh): the quantized gemv, dequantize and expert-pair kernels' machinery.
// ---------------------------------------------------------------------------------------
// Quantized weights: the shared machinery of the q_*.cu files (one per format; each defines
// its format struct and instantiates QUANT_KERNELS). The device layout is src/quant.rs's: a
// row of nb = k / BE blocks is [quant bytes of every block][scale bytes of every block][pad
// to 16], rows at ROW_BYTES; block b's quant bytes are 16-byte aligned (if w is), its scale
// bytes only as aligned as SB.
//
// qgemv: `out[m, n] = sum_k x[m, k] * decode(w)[n, k] (+ bias[n])` for m_rows <= M <= 8, the
// decode-time matmul with a quantized weight (Backend::matmul's semantics: f32 accumulation,
// each output rounded once, the bias added in f32 before that). It is gemv.cu's design with
// the weight decoded in registers: a CTA of QG_WARPS warps; a warp owns R = 2 rows (or, with
// ACT, the gate and up rows of one output); `ksplit` warps share those rows and reduce in
// shared memory in a fixed order. A row is cut into *units*, one lane's share of a block (a
// format's UPB units per block): 32 consecutive units form a chunk, lane l takes unit l of
// each chunk its warp owns (chunks part, part + ksplit, ...), so a warp's loads cover whole
// blocks, and because 32 is a multiple of UPB a lane's position in its block (`sub`) is the
// same in every chunk. Quant bytes are streamed with 16-byte loads that do not allocate in L1
// (the lanes of a block read adjacent 16-byte pieces, a warp load touches whole 32-byte
// sectors); scale bytes with the narrowest aligned loads (lanes of one block read the same
// address, which the load coalesces); x through L1 (every warp of the grid re-reads it).
// UNROLL chunks' loads are in flight before any is used.
//
// The arithmetic: a unit's values come in runs of 16 consecutive k that share a scale.
// Most formats decode a value as `A * F + B` with F = 0.5 + q / 256 built by one byte
// permute (q < 128 placed in bits 16..23 under the exponent of 0.5: exact), so a run adds
// A * sum(F * x) + B * sum(x) to the accumulator: one FMA per value and row, the sum of x
// shared by the warp's rows. Q8_0 and FP8 decode the value itself and add A * sum(v * x).
// The reference (quant.rs) decodes with other roundings; the difference is in the f32
// accumulation's last bits.
//
// dequant: decode every value exactly as quant.rs does (same f32 operations in the same
// order, no contraction) and round it to T once; out is dense [n, k].

#define QG_THREADS 256
#define QG_WARPS (QG_THREADS / 32)

// Streaming loads (ld.global.nc, no L1 allocation) of 16, 8, 4 and 2 bytes. (Plain loads
// where __CUDA_ARCH__ is not defined: a host build of these files for testing.)
__device__ __forceinline__ uint4 q_ld128(const void* p) {
#ifdef __CUDA_ARCH__
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
#else
    return *reinterpret_cast<const uint4*>(p);
#endif
}
__device__ __forceinline__ uint2 q_ld64(const void* p) {
#ifdef __CUDA_ARCH__
    uint2 r;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n"
                 : "=r"(r.x), "=r"(r.y)
                 : "l"(p));
    return r;
#else
    return *reinterpret_cast<const uint2*>(p);
#endif
}
__device__ __forceinline__ unsigned int q_ld32(const void* p) {
#ifdef __CUDA_ARCH__
    unsigned int r;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];\n" : "=r"(r) : "l"(p));
    return r;
#else
    return *reinterpret_cast<const unsigned int*>(p);
#endif
}
__device__ __forceinline__ unsigned int q_ld16(const void* p) {
#ifdef __CUDA_ARCH__
    unsigned short r;
    asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];\n" : "=h"(r) : "l"(p));
    return r;
#else
    return *reinterpret_cast<const unsigned short*>(p);
#endif
}

// Word i (0..3, a constant after unrolling) of a 16-byte vector.
__device__ __forceinline__ unsigned int q_word(const uint4& u, int i) {
    return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w;
}
// The f16 in the low 16 bits of `bits`.
__device__ __forceinline__ float q_f16(unsigned int bits) {
    return __half2float(__ushort_as_half((unsigned short)(bits & 0xffffu)));
}
// The two f16 of a word (low half first).
__device__ __forceinline__ float2 q_f16x2(unsigned int bits) {
    __half2 h = *reinterpret_cast<__half2*>(&bits);
    return __half22float2(h);
}
// 0.5 + b / 256 for byte i of v (b < 128; i a constant after unrolling): one PRMT. A q of
// n bits stored as b = q << (7 - n) gives F = 0.5 + q / 2^(n + 1).
__device__ __forceinline__ float q_mag(unsigned int v, int i) {
    return __uint_as_float(__byte_perm(0x3F000000u, v, 0x3010u | ((4 + i) << 8)));
}
// q_mag of the four bytes of v, in byte order.
__device__ __forceinline__ void q_mag4(unsigned int v, float* f) {
#pragma unroll
    for (int e = 0; e < 4; ++e) f[e] = q_mag(v, e);
}
// v << s for s >= 0, v >> -s otherwise (s a constant after unrolling).
__device__ __forceinline__ unsigned int q_shift(unsigned int v, int s) {
    return s >= 0 ? v << s : v >> -s;
}
// Bits 0..3 of t moved to bit 6 of bytes 0..3 (the fifth bits of four 5-bit values stored
// as q << 2).
__device__ __forceinline__ unsigned int q_spread4(unsigned int t) {
    return ((t & 0xFu) * 0x08102040u) & 0x40404040u;
}

// One run of 16 consecutive k (x + m * k + 0..15, 16-byte aligned) for the warp's R rows.
// SH > 0: f holds F = 0.5 + q / 2^SH (q_mag of the byte q << (8 - SH)) and
// the values are alpha * q + beta, so
//   acc[r][m] += alpha[r] * (2^SH sum(F x) - 2^(SH-1) sum(x)) + beta[r] * sum(x)
// (sum(x) shared by the rows). The q sit in the top bits of F's mantissa, so the 0.5 that
// cancels costs about one bit of the f32 sums. SH == 0: f holds the values themselves and
// acc += alpha * sum(f x).
template <typename T, int M, int R, int SH>
__device__ __forceinline__ void q_run16(const T* __restrict__ x, int k, int m_rows,
                                        const float (&f)[R][16], const float (&alpha)[R],
                                        const float (&beta)[R], float (&acc)[R][M]) {
    constexpr int V = Ty<T>::V;
    constexpr float SCALE = (float)(1 << SH);
#pragma unroll
    for (int m = 0; m < M; ++m) {
        if (M == 1 || m < m_rows) {
            float xv[16];
#pragma unroll
            for (int v = 0; v < 16 / V; ++v)
                Ty<T>::unpack(ldg16(x + (long long)m * k + v * V), xv + v * V);
            float sx = 0.0f, sxh = 0.0f;
            if (SH > 0) {
                float s0 = xv[0], s1 = xv[1];
#pragma unroll
                for (int i = 2; i < 16; i += 2) {
                    s0 += xv[i];
                    s1 += xv[i + 1];
                }
                sx = s0 + s1;
                sxh = -0.5f * SCALE * sx;
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                float s = f[r][0] * xv[0];
#pragma unroll
                for (int i = 1; i < 16; ++i) s = fmaf(f[r][i], xv[i], s);
                if (SH > 0) {
                    acc[r][m] = fmaf(alpha[r], fmaf(SCALE, s, sxh), acc[r][m]);
                    acc[r][m] = fmaf(beta[r], sx, acc[r][m]);
                } else {
                    acc[r][m] = fmaf(alpha[r], s, acc[r][m]);
                }
            }
        }
    }
}

// Bytes of one device row of k values of format F.
template <class F> __device__ __forceinline__ long long q_row_bytes(int k) {
    return ((long long)(k / F::BE) * (F::QB + F::SB) + 15) & ~15ll;
}

// The end of a gemv (gemv.cu's gemv_impl, qgemv_impl below): each warp's R x M partial
// sums are reduced over its lanes (every lane gets the sums), then over the ksplit warps
// of the same rows through `red` [warps][R * M] in a fixed order; part 0 then holds them.
template <int M, int R>
__device__ __forceinline__ void gemv_reduce(float (&acc)[R][M], float (*red)[R * M], int lane,
                                            int warp, int part, int ksplit) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] = warp_sum(acc[r][m]);
    if (ksplit > 1) {
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int m = 0; m < M; ++m) red[warp][r * M + m] = acc[r][m];
        }
        __syncthreads();
        if (part == 0) {
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int m = 0; m < M; ++m) {
                    float s = 0.0f;
                    for (int p = 0; p < ksplit; ++p) s += red[warp + p][r * M + m];
                    acc[r][m] = s;
                }
        }
    }
}
// A gemv's outputs, on part 0 after gemv_reduce: lane r * M + m calls store(m, n, value)
// for row n = n0 + r < n_rows and m < m_rows, value = the sum plus bias[n] in f32 (not yet
// rounded).
template <typename T, int M, int R, typename Store>
__device__ __forceinline__ void gemv_each_output(const float (&acc)[R][M],
                                                 const T* __restrict__ bias, int n0,
                                                 int n_rows, int m_rows, int lane,
                                                 Store store) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int n = n0 + r;
        if (n < n_rows) {
            const float b = bias != nullptr ? to_f32(bias[n]) : 0.0f;
#pragma unroll
            for (int m = 0; m < M; ++m)
                if (lane == r * M + m && m < m_rows) store(m, n, acc[r][m] + b);
        }
    }
}
// The gate/up gemv's output: gate and up rounded to T as a matmul would, then
// act(gate) * up rounded to the output type.
template <typename T, typename OutT>
__device__ __forceinline__ void gemv_store_act(int act, float gate, float up, OutT* out) {
    const float g = to_f32(from_f32<T>(gate));
    const float u = to_f32(from_f32<T>(up));
    *out = from_f32<OutT>(act_mul_f32(act, g, u));
}

// ACT: M = 1, R = 2: the warp of output j reads gate row j and up row n_rows + j, rounds
// both sums to T as a matmul would and writes out[j] = act(gate) * up rounded to T, exactly
// what matmul + silu_mul.cu's act_mul produce (gemv.cu's gemv_act).
template <class F, typename T, typename OutT, int M, int R, bool ACT>
__device__ __forceinline__ void qgemv_impl(const T* __restrict__ x,
                                           const unsigned char* __restrict__ w,
                                           const T* __restrict__ bias, OutT* __restrict__ out,
                                           int m_rows, int n_rows, int k, int ksplit,
                                           int act = 0) {
    constexpr int UN = F::UNROLL;
    static_assert(32 % F::UPB == 0, "a chunk holds whole blocks");
    static_assert(!ACT || (M == 1 && R == 2), "ACT pairs one gate row with one up row");
    __shared__ float red[QG_WARPS][R * M];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int OUTS = ACT ? 1 : R;
    const int rows_per_cta = QG_WARPS / ksplit * OUTS;
    const int n0 = blockIdx.x * rows_per_cta + (warp / ksplit) * OUTS;
    const int part = warp - (warp / ksplit) * ksplit;
    const int nb = k / F::BE;
    const long long row_bytes = q_row_bytes<F>(k);
    const int units = nb * F::UPB;
    const int nfull = units >> 5, nchunks = (units + 31) >> 5;
    const int sub = lane & (F::UPB - 1);

    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;

    // Rows past the end re-read the last row (never written): no per-load branches.
    const unsigned char* wr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int row = ACT ? n0 + r * n_rows : min(n0 + r, n_rows - 1);
        wr[r] = w + (long long)row * row_bytes;
    }
    // The first round of weight loads goes out before the PDL wait, as in gemv.cu.
    typename F::Unit un[UN][R];
#ifdef GEMV_LATE_LOADS
    const bool early = false;
#else
    const bool early = n0 < n_rows && part + (UN - 1) * ksplit < nfull;
#endif
    if (early) {
#pragma unroll
        for (int u = 0; u < UN; ++u) {
            const int b = (((part + u * ksplit) << 5) + lane) / F::UPB;
#pragma unroll
            for (int r = 0; r < R; ++r) F::load(un[u][r], wr[r], nb, b, sub);
        }
    }
    pdl_enter();

    if (n0 < n_rows) {
        int c = part;
        for (; c + (UN - 1) * ksplit < nfull; c += UN * ksplit) {
            if (!early || c != part) {
#pragma unroll
                for (int u = 0; u < UN; ++u) {
                    const int b = (((c + u * ksplit) << 5) + lane) / F::UPB;
#pragma unroll
                    for (int r = 0; r < R; ++r) F::load(un[u][r], wr[r], nb, b, sub);
                }
            }
#pragma unroll
            for (int u = 0; u < UN; ++u) {
                const int b = (((c + u * ksplit) << 5) + lane) / F::UPB;
                F::template dot<T, M, R>(un[u], sub, x + (long long)b * F::BE, k, m_rows, acc);
            }
        }
        // The rest, one chunk at a time (the last one may be partial).
        for (; c < nchunks; c += ksplit) {
            const int unit = (c << 5) + lane;
            if (unit < units) {
                const int b = unit / F::UPB;
                typename F::Unit un[R];
#pragma unroll
                for (int r = 0; r < R; ++r) F::load(un[r], wr[r], nb, b, sub);
                F::template dot<T, M, R>(un, sub, x + (long long)b * F::BE, k, m_rows, acc);
            }
        }
    }
    gemv_reduce<M, R>(acc, red, lane, warp, part, ksplit);
    if (ACT) {
        if (part == 0 && n0 < n_rows && lane == 0)
            gemv_store_act<T>(act, acc[0][0], acc[R - 1][0], out + n0);
    } else if (part == 0) {
        gemv_each_output<T, M, R>(acc, bias, n0, n_rows, m_rows, lane,
                                  [&](int m, int n, float v) {
                                      out[(long long)m * n_rows + n] = from_f32<OutT>(v);
                                  });
    }
}

// Where a mixture-of-experts layer's experts lie (every expert kernel takes one): expert e
// is slot s = slot_of[e] (the expert cache's slots under a weight budget), or s = e when
// slot_of is null (the stacks: gate/up [2 E I, H], down [E H, I]). Slot s's gate rows start
// at gu + s * gu_stride, its up rows up_off bytes further, its down rows at dn + s *
// dn_stride. The stacks: gu_stride = I row bytes, up_off = E I row bytes, dn_stride = H row
// bytes.
struct MoeExperts {
    const unsigned char* gu;
    const unsigned char* dn;
    const int* slot_of;
    long long gu_stride, up_off, dn_stride;
};
__device__ __forceinline__ long long moe_slot(const MoeExperts& m, int e) {
    return m.slot_of != nullptr ? (long long)m.slot_of[e] : (long long)e;
}
__device__ __forceinline__ const unsigned char* moe_gate(const MoeExperts& m, int e) {
    return m.gu + moe_slot(m, e) * m.gu_stride;
}
__device__ __forceinline__ const unsigned char* moe_down(const MoeExperts& m, int e) {
    return m.dn + moe_slot(m, e) * m.dn_stride;
}

// qmoe: a mixture-of-experts layer's quantized experts for a few token rows (Backend::moe's
// decode path; moe.cu routes first and holds the dense version). Expert rows are short (a
// Qwen3-30B-A3B expert's down rows are 768 values: 6 Q4_K units), so a warp is cut into
// lane groups of G lanes (a power of two, at least a row's units or 32), each owning one
// output: its lanes take units gl, gl + G, ... of the output's rows (the loads of a group
// cover whole blocks, as qgemv's chunks do) and reduce by shuffles inside the group.
// qmoe_gate_up: grid (ceil(inter / outputs per CTA), pairs); the group of output j of pair
//   p = t * top_k + s reads expert e = ids[p]'s gate row j and up row j (MoeExperts: in the
//   stacks, rows e I + j and (E + e) I + j) against x[t] and writes act[p, j] =
//   act(round_T(g + bg)) * round_T(u + bu), rounded to T (args::Activation's code `act_kind`;
//   the biases bg = bias[e I + j], bu = bias[(E + e) I + j] when bias is not null, gpt-oss).
// qmoe_down: grid (ceil(hidden / (2 * 32 / G)), n); a lane group owns outputs h, h + 1 of
//   token t and reads down rows h, h + 1 of a chosen expert against act[p]; the sum
//   of w[p] * round_T(dot + bias[e H + h]) over the slots is f32, in slot order, rounded
//   once (moe.cu's).
// An expert id out of range (never written by moe_route) contributes nothing.
template <class F, typename T, int R>
__device__ __forceinline__ void qmoe_dot(const unsigned char* const (&wr)[R],
                                         const T* __restrict__ x, int k, int gl, int g,
                                         float (&acc)[R][1]) {
    const int nb = k / F::BE;
    const int units = nb * F::UPB;
    const int sub = gl & (F::UPB - 1);
    for (int unit = gl; unit < units; unit += g) {
        const int b = unit / F::UPB;
        typename F::Unit un[R];
#pragma unroll
        for (int r = 0; r < R; ++r) F::load(un[r], wr[r], nb, b, sub);
        F::template dot<T, 1, R>(un, sub, x + (long long)b * F::BE, k, 1, acc);
    }
}

// The sum over a lane group of g lanes (a power of two <= 32, groups aligned to g): every
// lane of the warp must call it.
__device__ __forceinline__ float qmoe_group_sum(float v, int g) {
    for (int o = g >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

template <class F, typename T>
__device__ __forceinline__ void qmoe_gate_up_impl(const T* __restrict__ x, const MoeExperts& w,
                                                  const int* __restrict__ ids, T* __restrict__ act,
                                                  int hidden, int inter, int experts, int top_k,
                                                  int g, int act_kind, const T* __restrict__ bias) {
    const int gl = threadIdx.x & (g - 1);
    const int j = blockIdx.x * (QG_THREADS / g) + threadIdx.x / g;
    const long long p = blockIdx.y;
    const int e = ids[p];
    const bool live = j < inter && e >= 0 && e < experts;
    float acc[2][1] = {{0.0f}, {0.0f}};
    if (live) {
        const long long row_bytes = q_row_bytes<F>(hidden);
        const unsigned char* gate = moe_gate(w, e) + j * row_bytes;
        const unsigned char* const wr[2] = {gate, gate + w.up_off};
        qmoe_dot<F, T, 2>(wr, x + (p / top_k) * hidden, hidden, gl, g, acc);
    }
    float sg = qmoe_group_sum(acc[0][0], g), su = qmoe_group_sum(acc[1][0], g);
    if (j < inter && gl == 0) {
        if (live && bias != nullptr) {
            sg += to_f32(bias[(long long)e * inter + j]);
            su += to_f32(bias[((long long)experts + e) * inter + j]);
        }
        act[p * inter + j] = from_f32<T>(
            live ? act_mul_f32(act_kind, to_f32(from_f32<T>(sg)), to_f32(from_f32<T>(su)))
                 : 0.0f);
    }
}

// The down projection: CTA (x, t) owns outputs h0 .. h0 + 2 G' (G' = 32 / g lane groups of
// a warp, two outputs each) of token t; warp w takes slots w, w + QG_WARPS, .. (the slots'
// expert rows in parallel: at batch 1 the CTAs alone would not fill the GPU), rounds each
// product to T into shared memory, and one thread per output sums them in slot order.
#define QMOE_MAX_TOP_K 32
template <class F, typename T>
__device__ __forceinline__ void qmoe_down_impl(const T* __restrict__ act, const MoeExperts& down,
                                               const int* __restrict__ ids,
                                               const float* __restrict__ weights,
                                               T* __restrict__ out, int hidden, int inter,
                                               int experts, int top_k, int g,
                                               const T* __restrict__ bias) {
    __shared__ float red[QMOE_MAX_TOP_K][64];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gl = lane & (g - 1), grp = lane / g;
    const int outs = 2 * (32 / g);
    const int h0 = blockIdx.x * outs;
    const int h = h0 + 2 * grp;
    const long long t = blockIdx.y;
    const long long row_bytes = q_row_bytes<F>(inter);
    for (int s = warp; s < top_k; s += QG_WARPS) {
        const long long p = t * top_k + s;
        const int e = ids[p];
        const bool live = h < hidden && e >= 0 && e < experts;
        float acc[2][1] = {{0.0f}, {0.0f}};
        if (live) {
            // A second row past the end re-reads the first (never written).
            const unsigned char* d = moe_down(down, e) + (long long)h * row_bytes;
            const unsigned char* const wr[2] = {d, h + 1 < hidden ? d + row_bytes : d};
            qmoe_dot<F, T, 2>(wr, act + p * inter, inter, gl, g, acc);
        }
        float y0 = qmoe_group_sum(acc[0][0], g), y1 = qmoe_group_sum(acc[1][0], g);
        if (live && bias != nullptr) {  // gpt-oss
            y0 += to_f32(bias[(long long)e * hidden + h]);
            if (h + 1 < hidden) y1 += to_f32(bias[(long long)e * hidden + h + 1]);
        }
        if (gl == 0) {
            red[s][2 * grp] = live ? to_f32(from_f32<T>(y0)) : 0.0f;
            red[s][2 * grp + 1] = live ? to_f32(from_f32<T>(y1)) : 0.0f;
        }
    }
    __syncthreads();
    const int o = threadIdx.x;
    if (o < outs && h0 + o < hidden) {
        float total = 0.0f;
        for (int s = 0; s < top_k; ++s) {
            const int e = ids[t * top_k + s];
            if (e >= 0 && e < experts) total = fmaf(weights[t * top_k + s], red[s][o], total);
        }
        out[t * hidden + h0 + o] = from_f32<T>(total);
    }
}

// Values 32 gi .. 32 gi + 31 of a row of format F: its bytes (F::load32, into F::Raw), then
// the values (F::decode_raw, bit-identical to quant.rs's decode_block).
template <class F>
__device__ __forceinline__ void q_decode32(const unsigned char* row, int nb, int gi, float* v) {
    typename F::Raw r;
    F::load32(row, nb, gi, r);
    F::decode_raw(r, gi, v);
}

// Dense T [n_rows, k] from a quantized [n_rows, k]: one thread per 32 consecutive values
// (q_decode32), written as 16-byte vectors (out 16-byte aligned; k a multiple of 32).
template <class F, typename T>
__device__ __forceinline__ void qdequant_impl(const unsigned char* __restrict__ w,
                                              T* __restrict__ out, int n_rows, int k) {
    constexpr int V = Ty<T>::V;
    const int nb = k / F::BE;
    const long long row_bytes = q_row_bytes<F>(k);
    const int groups = k >> 5;
    const long long total = (long long)n_rows * groups;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x; g < total; g += stride) {
        const long long row = g / groups;
        const int gi = (int)(g - row * groups);
        float v[32];
        q_decode32<F>(w + row * row_bytes, nb, gi, v);
        T* o = out + row * k + gi * 32;
#pragma unroll
        for (int i = 0; i < 32; i += V) store_vec(o + i, v + i);
    }
}

