// quant_moe_mma.cuh (prepended after quant_mma.cuh): a few-token mixture-of-experts step's quantized experts on the tensor cores.
// ---------------------------------------------------------------------------------------
// qmoe_mma: the pair kernels of quant_gemv.cuh's qmoe (the same grids' work, the same
// outputs) with the weights decoded in registers to bf16 pairs and multiplied by mma.sync
// m16n8k16, for x in bf16. qmoe decodes every value to f32 and spends one FMA per value and
// row: at batch 1 it runs at about a quarter of the copy bandwidth, bound by instructions
// (gpt-oss-20b's MXFP4 experts: 1.2 TB/s). Here a value costs about two integer or bf16x2
// instructions and 1/256 of an mma.
//
// A warp multiplies 16 expert rows (the mma's A: lane (g, t4) holds rows g and g + 8) by one
// x row (the mma's B, column 0: lanes g == 0 read x from shared memory, where the CTA staged
// it, the other columns are zero). A row is
// cut into 32-value groups; lane t4 of each quad takes groups 4 c + t4 (c = the warp's
// chunks, c0, c0 + cs, ...), decodes its group of both its rows to 16 bf16 pairs in k order
// (o[i] = values 2 i, 2 i + 1), and feeds them to 8 mmas: step s gives the mma's k pairs
// (2 t4, 2 t4 + 1) and (2 t4 + 8, 2 t4 + 9) the group's values (4 s, 4 s + 1) and (4 s + 2,
// 4 s + 3), and B the x values at the same k (a sum over k may take any order of its terms,
// the same on both sides). Column 0 of the result, in lanes t4 == 0, is rows g and g + 8.
//
// Values: a format with F::decode_bf16 (QDecodeBf16) gives its bf16 pairs (MXFP4's are
// exact: E2M1 codes times a power of two); the others decode to f32 (F::decode_raw) and
// round each value to bf16 once, as the bf16 qmma does. Products and sums are f32 in the
// mma; the k parts of a row and the slots of a token are summed in a fixed order.
#define QMM_WARPS 8
// Output tiles of 8 gate/up pairs per gate/up CTA; its warps split k in QMM_WARPS / tiles.
#define QMM_GU_TILES 4

// Chunks a lane loads before it decodes any (loads in flight). (A format's Raw holds a
// uint4, so it is 32 bytes or more and more chunks would cost registers; QMOE_MMA's CTAS,
// the CTAs an SM must hold, is 3 for the 4-bit formats whose Raw is 32 bytes, 2 for the
// others.)
#define QMM_UNROLL 2

// A 32-value group of a row as 16 bf16 pairs in k order.
template <class F>
__device__ __forceinline__ void qmm_decode(const typename F::Raw& raw, int gi,
                                           unsigned int (&o)[16]) {
    if constexpr (QDecodeBf16<F>::value) {
        F::decode_bf16(raw, gi, o);
    } else {
        float v[32];
        F::decode_raw(raw, gi, v);
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const __nv_bfloat162 p = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
            o[i] = *reinterpret_cast<const unsigned int*>(&p);
        }
    }
}

// x (k values, bf16) staged into shared memory `xs` by the whole CTA (16-byte pieces;
// k is a multiple of 32), then a barrier. A thread's loads of a round are all issued before
// its first store: one round trip to L2 for up to 8 pieces a thread (32 KiB a CTA).
__device__ __forceinline__ void qmm_stage(bf16* xs, const bf16* __restrict__ x, int k) {
    constexpr int SU = 8;
    const int n = k / 8;
    const uint4* src = reinterpret_cast<const uint4*>(x);
    uint4* dst = reinterpret_cast<uint4*>(xs);
    for (int base = threadIdx.x; base < n; base += SU * blockDim.x) {
        uint4 v[SU];
#pragma unroll
        for (int u = 0; u < SU; ++u) {
            const int i = base + u * blockDim.x;
            if (i < n) v[u] = __ldg(src + i);
        }
#pragma unroll
        for (int u = 0; u < SU; ++u) {
            const int i = base + u * blockDim.x;
            if (i < n) dst[i] = v[u];
        }
    }
    __syncthreads();
}

// The dot products of this warp's 16 rows `ra` (row g) and `rb` (row g + 8) of k values with
// x (k values, bf16, in shared memory, 16-byte aligned) over chunks c0, c0 + cs, ...: c[0]
// and c[2] of lanes t4 == 0 hold rows g and g + 8 (column 0). Every lane of the warp must
// call it.
template <class F>
__device__ __forceinline__ void qmm_rows(const unsigned char* __restrict__ ra,
                                         const unsigned char* __restrict__ rb,
                                         const bf16* xs, int k, int c0, int cs,
                                         float (&c)[4]) {
    constexpr int U = QMM_UNROLL;
    const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int nb = k / F::BE, groups = k >> 5;
    const int chunks = (groups + 3) >> 2;
#pragma unroll
    for (int i = 0; i < 4; ++i) c[i] = 0.0f;
    for (int cc = c0; cc < chunks; cc += U * cs) {
        typename F::Raw wa[U], wb[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int gi = 4 * (cc + u * cs) + t4;
            if (cc + u * cs < chunks && gi < groups) {
                F::load32(ra, nb, gi, wa[u]);
                F::load32(rb, nb, gi, wb[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int gi = 4 * (cc + u * cs) + t4;
            const bool ok = cc + u * cs < chunks && gi < groups;
            unsigned int oa[16], ob[16];
            if (ok) {
                qmm_decode<F>(wa[u], gi, oa);
                qmm_decode<F>(wb[u], gi, ob);
            } else {
#pragma unroll
                for (int i = 0; i < 16; ++i) oa[i] = ob[i] = 0u;
            }
            const uint2* xg = reinterpret_cast<const uint2*>(xs + 32 * gi);
#pragma unroll
            for (int s = 0; s < 8; ++s) {
                const unsigned int a[4] = {oa[2 * s], ob[2 * s], oa[2 * s + 1], ob[2 * s + 1]};
                const uint2 xw = g == 0 && ok ? xg[s] : make_uint2(0u, 0u);
                Mma16816<bf16>::mma(c, a, xw.x, xw.y);
            }
        }
    }
}

// Gate/up: grid (ceil(inter / (8 QMM_GU_TILES)), pairs), x[p / top_k] staged in dynamic
// shared memory (hidden bf16 values). Warp w takes tile w % QMM_GU_TILES
// (outputs j0 .. j0 + 7: its rows g are the gate rows j0 + g, its rows g + 8 the up rows) and
// k part w / QMM_GU_TILES; one thread an output sums the parts in order and writes act[p, j]
// = act(round(g + bg)) * round(u + bu) as qmoe_gate_up does.
template <class F>
__device__ __forceinline__ void qmm_gate_up_impl(const bf16* __restrict__ x, const MoeExperts& w,
                                                 const int* __restrict__ ids,
                                                 bf16* __restrict__ act, int hidden, int inter,
                                                 int experts, int top_k, int act_kind,
                                                 const bf16* __restrict__ bias) {
    constexpr int KS = QMM_WARPS / QMM_GU_TILES;
    __shared__ float red[KS][QMM_GU_TILES][8][2];
    extern __shared__ __align__(16) unsigned char qmm_smem[];
    bf16* xs = reinterpret_cast<bf16*>(qmm_smem);  // x[p / top_k]: hidden values
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int tile = warp % QMM_GU_TILES, kp = warp / QMM_GU_TILES;
    const long long p = blockIdx.y;
    const int e = ids[p];
    const bool live = e >= 0 && e < experts;  // the same in every warp
    if (live) qmm_stage(xs, x + (p / top_k) * hidden, hidden);
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (live) {
        const long long row_bytes = q_row_bytes<F>(hidden);
        // Rows past the end read the last row (never written).
        const int j = min((int)(blockIdx.x * QMM_GU_TILES + tile) * 8 + g, inter - 1);
        const unsigned char* gate = moe_gate(w, e) + j * row_bytes;
        qmm_rows<F>(gate, gate + w.up_off, xs, hidden, kp, KS, c);
    }
    if (t4 == 0) {
        red[kp][tile][g][0] = c[0];
        red[kp][tile][g][1] = c[2];
    }
    __syncthreads();
    const int o = threadIdx.x;
    const int j = blockIdx.x * QMM_GU_TILES * 8 + o;
    if (o < QMM_GU_TILES * 8 && j < inter) {
        float sg = 0.0f, su = 0.0f;
#pragma unroll
        for (int s = 0; s < KS; ++s) {
            sg += red[s][o >> 3][o & 7][0];
            su += red[s][o >> 3][o & 7][1];
        }
        if (live && bias != nullptr) {
            sg += to_f32(bias[(long long)e * inter + j]);
            su += to_f32(bias[((long long)experts + e) * inter + j]);
        }
        act[p * inter + j] = from_f32<bf16>(
            live ? act_mul_f32(act_kind, to_f32(from_f32<bf16>(sg)), to_f32(from_f32<bf16>(su)))
                 : 0.0f);
    }
}

// Down: grid (ceil(hidden / 16), tokens), the token's top_k rows of act staged in dynamic
// shared memory (top_k inter bf16 values). CTA (x, t) owns outputs h0 .. h0 + 15 of token t;
// its work items are (slot s, k part) for KS = max(1, QMM_WARPS / top_k) parts, warp w
// taking items w, w + QMM_WARPS, ...; one thread an output sums each slot's parts in order,
// adds the bias, rounds to bf16 and sums w[p] times that over the slots in slot order (f32,
// rounded once), as qmoe_down does.
template <class F>
__device__ __forceinline__ void qmm_down_impl(const bf16* __restrict__ act, const MoeExperts& down,
                                              const int* __restrict__ ids,
                                              const float* __restrict__ weights,
                                              bf16* __restrict__ out, int hidden, int inter,
                                              int experts, int top_k,
                                              const bf16* __restrict__ bias) {
    __shared__ float red[QMOE_MAX_TOP_K][16];
    extern __shared__ __align__(16) unsigned char qmm_smem[];
    bf16* xs = reinterpret_cast<bf16*>(qmm_smem);  // act[t top_k ..]: top_k rows of inter
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int ks = max(1, QMM_WARPS / top_k);
    const int h0 = blockIdx.x * 16;
    const long long t = blockIdx.y;
    const long long row_bytes = q_row_bytes<F>(inter);
    qmm_stage(xs, act + t * top_k * inter, top_k * inter);
    for (int i = warp; i < top_k * ks; i += QMM_WARPS) {
        const int s = i / ks, kp = i % ks;
        const long long p = t * top_k + s;
        const int e = ids[p];
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (e >= 0 && e < experts) {  // the same in every lane of the warp
            const unsigned char* d = moe_down(down, e);
            const unsigned char* ra = d + (long long)min(h0 + g, hidden - 1) * row_bytes;
            const unsigned char* rb = d + (long long)min(h0 + g + 8, hidden - 1) * row_bytes;
            qmm_rows<F>(ra, rb, xs + (long long)s * inter, inter, kp, ks, c);
        }
        if (t4 == 0) {
            red[i][g] = c[0];
            red[i][g + 8] = c[2];
        }
    }
    __syncthreads();
    const int o = threadIdx.x, h = h0 + o;
    if (o < 16 && h < hidden) {
        float total = 0.0f;
        for (int s = 0; s < top_k; ++s) {
            const long long p = t * top_k + s;
            const int e = ids[p];
            if (e < 0 || e >= experts) continue;
            float y = 0.0f;
            for (int kp = 0; kp < ks; ++kp) y += red[s * ks + kp][o];
            if (bias != nullptr) y += to_f32(bias[(long long)e * hidden + h]);
            total = fmaf(weights[p], to_f32(from_f32<bf16>(y)), total);
        }
        out[t * hidden + h] = from_f32<bf16>(total);
    }
}

// qmoe_mma_gate_up_<fmt>_bf16 and qmoe_mma_down_<fmt>_bf16 (each format's file, after
// QUANT_KERNELS): the arguments of qmoe_*'s without the lane groups; CTAS the CTAs an SM
// must hold (see QMM_UNROLL; a literal: NVRTC takes no template constant in __launch_bounds__).
#define QMOE_MMA(F, FN, CTAS)                                                                      \
    extern "C" __global__ void __launch_bounds__(QMM_WARPS * 32, CTAS) qmoe_mma_gate_up_##FN##_bf16( \
        const bf16* x, MoeExperts w, const int* ids, bf16* act, int hidden, int inter,         \
        int experts, int top_k, int act_kind, const bf16* bias) {                              \
        pdl_enter();                                                                           \
        qmm_gate_up_impl<F>(x, w, ids, act, hidden, inter, experts, top_k, act_kind, bias);    \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(QMM_WARPS * 32, CTAS) qmoe_mma_down_##FN##_bf16(    \
        const bf16* act, MoeExperts down, const int* ids, const float* weights, bf16* out,     \
        int hidden, int inter, int experts, int top_k, const bf16* bias) {                     \
        pdl_enter();                                                                           \
        qmm_down_impl<F>(act, down, ids, weights, out, hidden, inter, experts, top_k, bias);   \
    }
