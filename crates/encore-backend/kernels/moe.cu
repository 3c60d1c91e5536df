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
// computes act[p, j] = act(gate . x_t) * (up . x_t) of expert ids[p] (args::Activation's
// code: SiLU, or gpt-oss's clamped SwiGLU), each product (plus its bias, gpt-oss) rounded
// to T first (as matmul then act_mul round them). Every expert kernel finds an expert's
// rows through a MoeExperts (quant_gemv.cuh): the stacks, or the expert cache's slots.
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
__device__ __forceinline__ void moe_gate_up_impl(const T* __restrict__ x, const MoeExperts& w,
                                                 const int* __restrict__ ids,
                                                 T* __restrict__ act, int hidden, int inter,
                                                 int experts, int top_k, int vec, int act_kind,
                                                 const T* __restrict__ bias) {
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
    const T* g = reinterpret_cast<const T*>(moe_gate(w, e)) + (long long)j * hidden;
    const T* u = reinterpret_cast<const T*>(moe_gate(w, e) + w.up_off) + (long long)j * hidden;
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
    if (bias != nullptr) {
        // gpt-oss: expert e's gate bias j at e I, its up bias at E I + e I (args::MoeBias).
        sg += to_f32(bias[(long long)e * inter + j]);
        su += to_f32(bias[((long long)experts + e) * inter + j]);
    }
    if (lane == 0)
        act[p * inter + j] =
            from_f32<T>(act_mul_f32(act_kind, moe_round<T>(sg), moe_round<T>(su)));
}

template <typename T>
__device__ __forceinline__ void moe_down_impl(const T* __restrict__ act, const MoeExperts& down,
                                              const int* __restrict__ ids,
                                              const float* __restrict__ weights,
                                              T* __restrict__ out, int hidden, int inter,
                                              int experts, int top_k, int vec,
                                              const T* __restrict__ bias) {
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
        const T* d = reinterpret_cast<const T*>(moe_down(down, e)) + (long long)h * inter;
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
        y = warp_sum(y);
        if (bias != nullptr) y += to_f32(bias[(long long)e * hidden + h]);  // gpt-oss
        acc = fmaf(weights[p], moe_round<T>(y), acc);
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
        moe_gate_up_##TN(const T* x, MoeExperts w, const int* ids, T* act, int hidden,      \
                         int inter, int experts, int top_k, int vec, int act_kind,          \
                         const T* bias) {                                                   \
        pdl_enter();                                                                        \
        moe_gate_up_impl<T>(x, w, ids, act, hidden, inter, experts, top_k, vec, act_kind,   \
                            bias);                                                          \
    }                                                                                       \
    extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32)                            \
        moe_down_##TN(const T* act, MoeExperts down, const int* ids, const float* weights,  \
                      T* out, int hidden, int inter, int experts, int top_k, int vec,       \
                      const T* bias) {                                                      \
        pdl_enter();                                                                        \
        moe_down_impl<T>(act, down, ids, weights, out, hidden, inter, experts, top_k, vec,  \
                         bias);                                                             \
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
// The grouped path (prefill and large batches; quant_mma.cuh's gmoe_impl): moe_align sorts the
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

// ---------------------------------------------------------------------------------------
// The expert cache (args::ExpertCache; the CPU's expert_cache_plan is the reference and
// makes the same decisions).
//
// moe_cache_plan: one CTA of 1024 threads, after moe_route. Counts each expert's pairs,
// updates the layer's scores (score * decay + count, one fma), looks each needed expert up
// and lists the misses in ascending expert order (warp ballots), then gives the misses, in
// that order, the unpinned slots of least key in ascending key order: the key of a slot is
// its expert's score (-1 when empty) then its index, the pinned slots those holding an
// expert this call needs. Taking the m least keys in order is what picking the least slot
// miss after miss does (a filled slot becomes pinned; no other key changes). Each thread
// keeps the least key of its own slots (s = tid, tid + 1024, ...); per miss a block argmin
// over the threads, and the winner's thread looks its slots over again. Then the totals.
//
// A prefetch (args::ExpertPrefetch; prefetch = 1): the same plan for a later layer's
// predicted experts, right after this layer's plan, with three differences: the slots
// holding an expert the current call needs (pin_ids of pin_layer) are pinned too, the
// scores are left alone (they count use, not predictions), and the misses stop when no
// unpinned slot is left. Its fills count into stats[3] and stats[4].
#define MOE_PLAN_THREADS 1024
__device__ __forceinline__ unsigned int moe_order_bits(float f) {
    const unsigned int b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
// The least key among slots tid, tid + 1024, .. that are neither pinned nor taken (taken:
// filled by this call, so owned by this layer and needed, hence pinned as well).
__device__ __forceinline__ unsigned long long moe_plan_least(const int* owner, const float* score,
                                                              const int* need, const int* pin,
                                                              int experts, int layer,
                                                              int pin_layer, int slots, int tid) {
    unsigned long long best = ~0ull;
    for (int s = tid; s < slots; s += MOE_PLAN_THREADS) {
        const int o = owner[s];
        if (o >= 0 && o / experts == layer && need[o % experts] > 0) continue;
        if (o >= 0 && o / experts == pin_layer && pin[o % experts] > 0) continue;
        const float key = o < 0 ? -1.0f : score[o];
        const unsigned long long k = ((unsigned long long)moe_order_bits(key) << 32) | (unsigned int)s;
        best = k < best ? k : best;
    }
    return best;
}
extern "C" __global__ void __launch_bounds__(MOE_PLAN_THREADS)
    moe_cache_plan(const int* __restrict__ ids, int pairs, int experts, int layer, int slots,
                   int* __restrict__ slot_of, int* __restrict__ owner, float* __restrict__ score,
                   int* __restrict__ fills, long long* __restrict__ stats, float decay,
                   long long expert_bytes, const int* __restrict__ pin_ids, int pin_pairs,
                   int pin_layer, int prefetch) {
    pdl_enter();
    __shared__ int need[32 * MOE_PER_LANE];
    __shared__ int pin[32 * MOE_PER_LANE];
    __shared__ int miss[32 * MOE_PER_LANE];
    __shared__ int warp_miss[MOE_PLAN_THREADS / 32], warp_hit[MOE_PLAN_THREADS / 32],
        warp_need[MOE_PLAN_THREADS / 32];
    __shared__ unsigned long long red[MOE_PLAN_THREADS / 32];
    __shared__ int nmiss;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int e = tid; e < experts; e += MOE_PLAN_THREADS) need[e] = pin[e] = 0;
    __syncthreads();
    for (int p = tid; p < pairs; p += MOE_PLAN_THREADS) {
        const int e = ids[p];
        if (e >= 0 && e < experts) atomicAdd(&need[e], 1);
    }
    for (int p = tid; p < pin_pairs; p += MOE_PLAN_THREADS) {
        const int e = pin_ids[p];
        if (e >= 0 && e < experts) atomicAdd(&pin[e], 1);
    }
    __syncthreads();
    int* map = slot_of + (long long)layer * experts;
    float* sc = score + (long long)layer * experts;
    // experts <= 512 < MOE_PLAN_THREADS: thread e owns expert e.
    const bool needed = tid < experts && need[tid] > 0;
    const bool is_miss = needed && map[tid] < 0;
    if (tid < experts && !prefetch) sc[tid] = fmaf(sc[tid], decay, (float)need[tid]);
    const unsigned int mb = __ballot_sync(FULL_MASK, is_miss);
    const unsigned int nb = __ballot_sync(FULL_MASK, needed);
    if (lane == 0) {
        warp_miss[warp] = __popc(mb);
        warp_need[warp] = __popc(nb);
        warp_hit[warp] = __popc(nb & ~mb);
    }
    __syncthreads();
    if (is_miss) {
        int before = __popc(mb & ((1u << lane) - 1u));
        for (int w = 0; w < warp; ++w) before += warp_miss[w];
        miss[before] = tid;
    }
    if (tid == 0) {
        int m = 0;
        for (int w = 0; w < MOE_PLAN_THREADS / 32; ++w) m += warp_miss[w];
        nmiss = m;
    }
    __syncthreads();
    int m = nmiss;
    unsigned long long mine =
        m > 0 ? moe_plan_least(owner, score, need, pin, experts, layer, pin_layer, slots, tid)
              : ~0ull;
    for (int i = 0; i < m; ++i) {
        unsigned long long best = mine;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const unsigned long long v = __shfl_xor_sync(FULL_MASK, best, o);
            best = v < best ? v : best;
        }
        if (lane == 0) red[warp] = best;
        __syncthreads();
        best = red[lane];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const unsigned long long v = __shfl_xor_sync(FULL_MASK, best, o);
            best = v < best ? v : best;
        }
        // No unpinned slot left (a prefetch only: a plan has its floor): stop.
        if (best == ~0ull) {
            m = i;
            break;
        }
        const int s = (int)(best & 0xffffffffull);
        if ((s % MOE_PLAN_THREADS) == tid) {
            // This thread's slot: evict its expert, fill it, look its slots over again.
            const int e = miss[i];
            const int old = owner[s];
            if (old >= 0) slot_of[old] = -1;
            owner[s] = layer * experts + e;
            map[e] = s;
            fills[1 + 2 * i] = e;
            fills[2 + 2 * i] = s;
            mine = moe_plan_least(owner, score, need, pin, experts, layer, pin_layer, slots,
                                  tid);
        }
        __syncthreads();
    }
    if (tid == 0) {
        int d = 0, h = 0;
        for (int w = 0; w < MOE_PLAN_THREADS / 32; ++w) {
            d += warp_need[w];
            h += warp_hit[w];
        }
        fills[0] = m;
        if (prefetch) {
            stats[4] += m;
        } else {
            stats[0] += d;
            stats[1] += h;
            stats[2] += m;
        }
        stats[3] += (long long)m * expert_bytes;
    }
}

#define MOE_FILL_UNROLL 4
// moe_cache_fill: copies each fill's expert from host memory (mapped, read over the bus)
// into its slot: its gate rows (half bytes from gu_host + e half), its up rows (from
// gu_host + (E + e) half) behind them, its down rows (down bytes from dn_host + e down).
// A grid-stride loop of 16-byte pieces over all fills, so one fill uses the whole grid.
extern "C" __global__ void moe_cache_fill(const int* __restrict__ fills,
                                          const unsigned char* gu_host,
                                          const unsigned char* dn_host,
                                          unsigned char* __restrict__ gu_slots,
                                          unsigned char* __restrict__ dn_slots, int experts,
                                          long long half, long long down, long long gu_slot,
                                          long long dn_slot) {
    pdl_enter();
    const long long m = fills[0];
    if (m == 0) return;
    const long long per = (2 * half + down) / 16;
    const long long total = m * per;
    const long long stride = (long long)gridDim.x * blockDim.x;
    // MOE_FILL_UNROLL independent 16-byte reads in flight per thread before their writes.
    for (long long u0 = (long long)blockIdx.x * blockDim.x + threadIdx.x; u0 < total;
         u0 += MOE_FILL_UNROLL * stride) {
        uint4 v[MOE_FILL_UNROLL];
        unsigned char* dst[MOE_FILL_UNROLL];
#pragma unroll
        for (int r = 0; r < MOE_FILL_UNROLL; ++r) {
            const long long u = u0 + r * stride;
            dst[r] = nullptr;
            if (u >= total) continue;
            const long long f = u / per, off = (u - f * per) * 16;
            const long long e = fills[1 + 2 * f], s = fills[2 + 2 * f];
            const unsigned char* src;
            if (off < half) {
                src = gu_host + e * half + off;
                dst[r] = gu_slots + s * gu_slot + off;
            } else if (off < 2 * half) {
                src = gu_host + (experts + e) * half + (off - half);
                dst[r] = gu_slots + s * gu_slot + off;
            } else {
                src = dn_host + e * down + (off - 2 * half);
                dst[r] = dn_slots + s * dn_slot + (off - 2 * half);
            }
            v[r] = *reinterpret_cast<const uint4*>(src);
        }
#pragma unroll
        for (int r = 0; r < MOE_FILL_UNROLL; ++r)
            if (dst[r] != nullptr) *reinterpret_cast<uint4*>(dst[r]) = v[r];
    }
}

// moe_cache_fill_bulk: moe_cache_fill's copies by the Hopper bulk-copy (TMA) engine: one
// thread per CTA streams chunks of at most MOE_BULK_CHUNK bytes from mapped host memory
// into shared memory (cp.async.bulk, completing on an mbarrier) and from there into the
// slot (cp.async.bulk, a bulk group), MOE_BULK_BUFS chunks in flight. It holds few SM
// resources, so it can run beside the compute stream's kernels (the expert prefetch).
// Each fill is three segments (its gate rows, its up rows, its down rows) cut into chunks;
// the chunks of all fills are dealt to the CTAs round robin.
#define MOE_BULK_CHUNK 11264
#define MOE_BULK_BUFS 4
struct MoeBulkChunk {
    const unsigned char* src;
    unsigned char* dst;
    unsigned int bytes;
};
__device__ __forceinline__ MoeBulkChunk moe_bulk_chunk(long long c, const int* fills,
                                                       long long cg, long long cd,
                                                       const unsigned char* gu_host,
                                                       const unsigned char* dn_host,
                                                       unsigned char* gu_slots,
                                                       unsigned char* dn_slots, int experts,
                                                       long long half, long long down,
                                                       long long gu_slot, long long dn_slot) {
    const long long per = 2 * cg + cd;
    const long long f = c / per;
    long long r = c - f * per;
    const long long e = fills[1 + 2 * f], s = fills[2 + 2 * f];
    MoeBulkChunk k;
    long long off, len;
    if (r < cg) {
        off = r * MOE_BULK_CHUNK;
        k.src = gu_host + e * half + off;
        k.dst = gu_slots + s * gu_slot + off;
        len = half - off;
    } else if (r < 2 * cg) {
        off = (r - cg) * MOE_BULK_CHUNK;
        k.src = gu_host + (experts + e) * half + off;
        k.dst = gu_slots + s * gu_slot + half + off;
        len = half - off;
    } else {
        off = (r - 2 * cg) * MOE_BULK_CHUNK;
        k.src = dn_host + e * down + off;
        k.dst = dn_slots + s * dn_slot + off;
        len = down - off;
    }
    k.bytes = (unsigned int)(len < MOE_BULK_CHUNK ? len : MOE_BULK_CHUNK);
    return k;
}
extern "C" __global__ void __launch_bounds__(32)
    moe_cache_fill_bulk(const int* __restrict__ fills, const unsigned char* gu_host,
                        const unsigned char* dn_host, unsigned char* gu_slots,
                        unsigned char* dn_slots, int experts, long long half, long long down,
                        long long gu_slot, long long dn_slot) {
    pdl_enter();
    __shared__ __align__(128) unsigned char buf[MOE_BULK_BUFS][MOE_BULK_CHUNK];
    __shared__ __align__(8) unsigned long long bar[MOE_BULK_BUFS];
    if (threadIdx.x != 0) return;
    const long long m = fills[0];
    if (m == 0) return;
    const long long cg = (half + MOE_BULK_CHUNK - 1) / MOE_BULK_CHUNK;
    const long long cd = (down + MOE_BULK_CHUNK - 1) / MOE_BULK_CHUNK;
    const long long total = m * (2 * cg + cd);
    // This CTA's chunks: c = blockIdx.x + j * gridDim.x, j = 0 .. n - 1.
    const long long first = blockIdx.x;
    if (first >= total) return;
    const long long n = (total - first + gridDim.x - 1) / gridDim.x;
    for (int b = 0; b < MOE_BULK_BUFS; ++b) {
        const unsigned int a = (unsigned int)__cvta_generic_to_shared(&bar[b]);
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(a));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    auto load = [&](long long j) {
        const MoeBulkChunk k = moe_bulk_chunk(first + j * gridDim.x, fills, cg, cd, gu_host,
                                              dn_host, gu_slots, dn_slots, experts, half, down,
                                              gu_slot, dn_slot);
        const int b = (int)(j % MOE_BULK_BUFS);
        const unsigned int a = (unsigned int)__cvta_generic_to_shared(&bar[b]);
        const unsigned int d = (unsigned int)__cvta_generic_to_shared(&buf[b][0]);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a),
                     "r"(k.bytes)
                     : "memory");
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
            "[%3];" ::"r"(d),
            "l"(k.src), "r"(k.bytes), "r"(a)
            : "memory");
    };
    long long issued = 0;
    for (; issued < n && issued < MOE_BULK_BUFS; ++issued) load(issued);
    for (long long j = 0; j < n; ++j) {
        const int b = (int)(j % MOE_BULK_BUFS);
        const unsigned int parity = (unsigned int)((j / MOE_BULK_BUFS) & 1);
        const unsigned int a = (unsigned int)__cvta_generic_to_shared(&bar[b]);
        unsigned int ready = 0;
        while (!ready) {
            asm volatile(
                "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                " selp.u32 %0, 1, 0, p;\n}" : "=r"(ready) : "r"(a), "r"(parity) : "memory");
        }
        const MoeBulkChunk k = moe_bulk_chunk(first + j * gridDim.x, fills, cg, cd, gu_host,
                                              dn_host, gu_slots, dn_slots, experts, half, down,
                                              gu_slot, dn_slot);
        const unsigned int d = (unsigned int)__cvta_generic_to_shared(&buf[b][0]);
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(k.dst),
                     "r"(d), "r"(k.bytes)
                     : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        if (issued < n) {
            // The buffer is reused once the store just queued has read it.
            asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
            load(issued++);
        }
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
