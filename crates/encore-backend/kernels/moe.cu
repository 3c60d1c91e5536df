// moe.cu: mixture-of-experts layers (Backend::moe, args::Moe; the CPU kernel is the
// reference): route each token row, then run its chosen experts' SiLU MLPs and sum them by
// weight. Every launch reads the chosen experts from device memory, so one captured graph
// serves any routing. Dense experts (x's dtype); one warp per output row, 16-byte loads
// where the rows allow (a first, correct version: no tiles, no tensor cores).
//
// moe_route: one warp per token row (CTAs of MOE_WARPS warps). Softmax of the row's logits
// in f32 (the max, then the sum of exp), then the top k one at a time by a warp argmax
// (ties to the lower index), renormalised when asked. At most 32 * MOE_PER_LANE experts
// and 32 chosen (the launcher checks).
// moe_gate_up: grid (ceil(inter / MOE_WARPS), n * top_k); warp j of pair p = t * top_k + s
// computes act[p, j] = silu(gate . x_t) * (up . x_t) of expert ids[p], each product rounded
// to T first (as matmul then silu_mul round them).
// moe_down: grid (ceil(hidden / MOE_WARPS), n); warp h of token t sums over the slots in
// order w[t, s] * round_T(act[t, s] . down_e[h]) in f32 and rounds once. An expert id out of
// range (never written by moe_route) contributes nothing.

#define MOE_WARPS 8
#define MOE_PER_LANE 16

template <typename T> __device__ __forceinline__ float moe_round(float v) {
    return to_f32(from_f32<T>(v));
}

template <typename T>
__device__ __forceinline__ void moe_route_impl(const T* __restrict__ logits, int n, int experts,
                                               int top_k, int renorm, int* __restrict__ ids,
                                               float* __restrict__ weights) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = blockIdx.x * MOE_WARPS + warp;
    if (row >= n) return;
    const T* l = logits + (long long)row * experts;
    float v[MOE_PER_LANE];
    float mx = NEG_INF;
#pragma unroll
    for (int i = 0; i < MOE_PER_LANE; ++i) {
        const int e = lane + 32 * i;
        v[i] = e < experts ? to_f32(l[e]) : NEG_INF;
        mx = fmaxf(mx, v[i]);
    }
    mx = warp_max(mx);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < MOE_PER_LANE; ++i) {
        v[i] = lane + 32 * i < experts ? expf(v[i] - mx) : -1.0f;
        s += fmaxf(v[i], 0.0f);
    }
    s = warp_sum(s);
    unsigned int taken = 0u;
    float total = 0.0f, mine = 0.0f;
    int my_id = 0;
    for (int k = 0; k < top_k; ++k) {
        float best = -1.0f;
        int bi = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < MOE_PER_LANE; ++i) {
            if (!((taken >> i) & 1u) && v[i] > best) {
                best = v[i];
                bi = lane + 32 * i;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(FULL_MASK, best, o);
            const int oi = __shfl_xor_sync(FULL_MASK, bi, o);
            if (ob > best || (ob == best && oi < bi)) {
                best = ob;
                bi = oi;
            }
        }
        if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
        total += best;
        if (lane == k) {
            my_id = bi;
            mine = best;
        }
    }
    if (lane < top_k) {
        ids[(long long)row * top_k + lane] = my_id;
        weights[(long long)row * top_k + lane] = mine / (renorm ? total : s);
    }
}

template <typename T>
__device__ __forceinline__ void moe_gate_up_impl(const T* __restrict__ x,
                                                 const T* __restrict__ w,
                                                 const int* __restrict__ ids,
                                                 T* __restrict__ act, int hidden, int inter,
                                                 int experts, int top_k, int vec) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int j = blockIdx.x * MOE_WARPS + warp;
    const long long p = blockIdx.y;
    if (j >= inter) return;
    const int e = ids[p];
    if (e < 0 || e >= experts) {
        if (lane == 0) act[p * inter + j] = from_f32<T>(0.0f);
        return;
    }
    const T* xr = x + (p / top_k) * hidden;
    const T* g = w + ((long long)e * inter + j) * hidden;
    const T* u = w + ((long long)(experts + e) * inter + j) * hidden;
    float sg = 0.0f, su = 0.0f;
    if (vec) {
        // 16-byte loads (the host checked rows and bases are 16-byte aligned).
        constexpr int V = Ty<T>::V;
        for (int c = lane * V; c < hidden; c += 32 * V) {
            float xv[V], gv[V], uv[V];
            Ty<T>::unpack(ldg16(xr + c), xv);
            Ty<T>::unpack(ldg16(g + c), gv);
            Ty<T>::unpack(ldg16(u + c), uv);
#pragma unroll
            for (int i = 0; i < V; ++i) {
                sg = fmaf(xv[i], gv[i], sg);
                su = fmaf(xv[i], uv[i], su);
            }
        }
    } else {
        for (int c = lane; c < hidden; c += 32) {
            const float xv = to_f32(xr[c]);
            sg = fmaf(xv, to_f32(g[c]), sg);
            su = fmaf(xv, to_f32(u[c]), su);
        }
    }
    sg = warp_sum(sg);
    su = warp_sum(su);
    if (lane == 0)
        act[p * inter + j] = from_f32<T>(silu_mul_f32(moe_round<T>(sg), moe_round<T>(su)));
}

template <typename T>
__device__ __forceinline__ void moe_down_impl(const T* __restrict__ act,
                                              const T* __restrict__ down,
                                              const int* __restrict__ ids,
                                              const float* __restrict__ weights,
                                              T* __restrict__ out, int hidden, int inter,
                                              int experts, int top_k, int vec) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = blockIdx.x * MOE_WARPS + warp;
    const long long t = blockIdx.y;
    if (h >= hidden) return;
    float acc = 0.0f;
    for (int s = 0; s < top_k; ++s) {
        const long long p = t * top_k + s;
        const int e = ids[p];
        if (e < 0 || e >= experts) continue;
        const T* a = act + p * inter;
        const T* d = down + ((long long)e * hidden + h) * inter;
        float y = 0.0f;
        if (vec) {
            constexpr int V = Ty<T>::V;
            for (int c = lane * V; c < inter; c += 32 * V) {
                float av[V], dv[V];
                Ty<T>::unpack(ld16(a + c), av);
                Ty<T>::unpack(ldg16(d + c), dv);
#pragma unroll
                for (int i = 0; i < V; ++i) y = fmaf(av[i], dv[i], y);
            }
        } else {
            for (int c = lane; c < inter; c += 32) y = fmaf(to_f32(a[c]), to_f32(d[c]), y);
        }
        acc = fmaf(weights[p], moe_round<T>(warp_sum(y)), acc);
    }
    if (lane == 0) out[t * hidden + h] = from_f32<T>(acc);
}

// Qwen2-MoE's shared expert joining the routed ones: x[i, j] += sigmoid(gate[i]) * y[i, j],
// the sigmoid, the product and the sum each rounded to T. One thread per element.
template <typename T>
__device__ __forceinline__ void moe_shared_add_impl(T* __restrict__ x, const T* __restrict__ gate,
                                                    const T* __restrict__ y, long long total,
                                                    int dim) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const float s = moe_round<T>(1.0f / (1.0f + expf(-to_f32(gate[i / dim]))));
    x[i] = from_f32<T>(to_f32(x[i]) + moe_round<T>(s * to_f32(y[i])));
}

#define MOE_KERNELS(TN, T)                                                                 \
    extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32)                            \
        moe_route_##TN(const T* logits, int n, int experts, int top_k, int renorm, int* ids, \
                       float* weights) {                                                    \
        pdl_enter();                                                                        \
        moe_route_impl<T>(logits, n, experts, top_k, renorm, ids, weights);                 \
    }                                                                                       \
    extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32)                            \
        moe_gate_up_##TN(const T* x, const T* w, const int* ids, T* act, int hidden,        \
                         int inter, int experts, int top_k, int vec) {                      \
        pdl_enter();                                                                        \
        moe_gate_up_impl<T>(x, w, ids, act, hidden, inter, experts, top_k, vec);            \
    }                                                                                       \
    extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32)                            \
        moe_down_##TN(const T* act, const T* down, const int* ids, const float* weights,    \
                      T* out, int hidden, int inter, int experts, int top_k, int vec) {     \
        pdl_enter();                                                                        \
        moe_down_impl<T>(act, down, ids, weights, out, hidden, inter, experts, top_k, vec); \
    }                                                                                       \
    extern "C" __global__ void moe_shared_add_##TN(T* x, const T* gate, const T* y,          \
                                                   long long total, int dim) {              \
        pdl_enter();                                                                        \
        moe_shared_add_impl<T>(x, gate, y, total, dim);                                     \
    }
MOE_KERNELS(bf16, bf16)
MOE_KERNELS(f16, f16)
MOE_KERNELS(f32, float)

// ---------------------------------------------------------------------------------------
// The grouped path (prefill and large batches; common.cuh's gmoe_impl): moe_align sorts the
// (token, expert) pairs by expert into BM-row tiles, the grouped GEMMs run each tile on the
// tensor cores, moe_combine sums each token's slots.
//
// moe_align: one CTA of 1024 threads. Counts the pairs of each expert, lays the experts'
// runs out in expert order, each padded to a multiple of bm (tile t's expert in
// tile_expert[t], -1 past the last), and scatters each pair's index into its expert's run
// (sorted[], -1 in the padding). The order within a run depends on the atomics, but no
// result does: each output row of the GEMMs depends on its own row alone.
#define MOE_ALIGN_THREADS 1024
extern "C" __global__ void __launch_bounds__(MOE_ALIGN_THREADS)
    moe_align(const int* __restrict__ ids, int pairs, int experts, int bm, int* __restrict__ sorted,
              int sorted_len, int* __restrict__ tile_expert, int max_tiles) {
    pdl_enter();
    __shared__ int count[32 * MOE_PER_LANE];
    __shared__ int cursor[32 * MOE_PER_LANE];
    const int tid = threadIdx.x;
    for (int e = tid; e < experts; e += MOE_ALIGN_THREADS) count[e] = 0;
    for (int i = tid; i < sorted_len; i += MOE_ALIGN_THREADS) sorted[i] = -1;
    __syncthreads();
    for (int p = tid; p < pairs; p += MOE_ALIGN_THREADS) {
        const int e = ids[p];
        if (e >= 0 && e < experts) atomicAdd(&count[e], 1);
    }
    __syncthreads();
    if (tid == 0) {
        int off = 0;
        for (int e = 0; e < experts; ++e) {
            cursor[e] = off;
            const int tiles = (count[e] + bm - 1) / bm;
            for (int t = 0; t < tiles; ++t) tile_expert[off / bm + t] = e;
            off += tiles * bm;
        }
        for (int t = off / bm; t < max_tiles; ++t) tile_expert[t] = -1;
    }
    __syncthreads();
    for (int p = tid; p < pairs; p += MOE_ALIGN_THREADS) {
        const int e = ids[p];
        if (e >= 0 && e < experts) sorted[atomicAdd(&cursor[e], 1)] = p;
    }
}

// moe_combine: out[t, h] = sum over the slots s in order of w[t, s] * y[t top_k + s, h] in
// f32 (y holds each pair's down product, rounded to T), rounded once; an expert id out of
// range contributes nothing. One thread per output element.
template <typename T>
__device__ __forceinline__ void moe_combine_impl(const T* __restrict__ y,
                                                 const int* __restrict__ ids,
                                                 const float* __restrict__ weights,
                                                 T* __restrict__ out, long long total, int hidden,
                                                 int experts, int top_k) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const long long t = i / hidden, h = i - t * hidden;
    float acc = 0.0f;
    for (int s = 0; s < top_k; ++s) {
        const long long p = t * top_k + s;
        const int e = ids[p];
        if (e >= 0 && e < experts) acc = fmaf(weights[p], to_f32(y[p * hidden + h]), acc);
    }
    out[i] = from_f32<T>(acc);
}

// Dense experts through the grouped GEMM: a pseudo-format whose "blocks" are 32 values of T
// (no scale bytes), so a row is its 32 k / 32 values and gmoe_impl decodes nothing.
template <typename T> struct QFormatDense {
    static constexpr int BE = 32, QB = 32 * (int)sizeof(T), SB = 0;
    struct Raw {
        uint4 q[QB / 16];
    };
    static __device__ __forceinline__ void load32(const unsigned char* row, int nb, int gi,
                                                  Raw& r) {
#pragma unroll
        for (int i = 0; i < QB / 16; ++i)
            r.q[i] = __ldg(reinterpret_cast<const uint4*>(row + gi * QB + 16 * i));
    }
    static __device__ __forceinline__ void decode_raw(const Raw& r, int gi, float* v) {
        constexpr int V = 16 / (int)sizeof(T);
#pragma unroll
        for (int i = 0; i < QB / 16; ++i) Ty<T>::unpack(r.q[i], v + V * i);
    }
    // bf16 values are their own bf16 pairs.
    static __device__ __forceinline__ void decode_bf16(const Raw& r, int gi, unsigned int (&o)[16]) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) o[4 * i + j] = q_word(r.q[i], j);
    }
};
template <> struct QDecodeBf16<QFormatDense<bf16>> {
    static constexpr bool value = true;
};

#define MOE_GROUPED(TN, T)                                                                   \
    extern "C" __global__ void moe_combine_##TN(const T* y, const int* ids, const float* weights, \
                                                T* out, long long total, int hidden,          \
                                                int experts, int top_k) {                     \
        pdl_enter();                                                                          \
        moe_combine_impl<T>(y, ids, weights, out, total, hidden, experts, top_k);             \
    }
MOE_GROUPED(bf16, bf16)
MOE_GROUPED(f16, f16)
MOE_GROUPED(f32, float)
GMOE(QFormatDense<bf16>, dense, bf16, bf16)
GMOE(QFormatDense<f16>, dense, f16, f16)
