// Sampling over f32 logits [batch, vocab]; one CTA of SAMPLE_THREADS per row.
// Semantics: `Sampling` (and `Penalties`, `SampleLogprobs`) in src/backend/mod.rs.
//
// Penalties are applied on the fly: every pass over a row with a penalty slot reads the
// slot's counts beside the logits (load4p) and penalises each value with the same f32
// operations as the CPU (no contraction into fma), so the logits stay untouched. A row
// without a slot pays one branch per load. A row with an allowed-token mask reads one mask
// word per four logits in the same loads and turns the disallowed ones into NaN (never
// kept, outside the log-probabilities), so every pass below sees the masked row.
//
// argmax (block_argmax, the greedy path): each thread scans a strided share of the row
// (float4 loads when `vec`: vocab % 4 == 0 and the bases 16-byte aligned) keeping (value,
// smallest index) and skipping NaN; warp then block reduction. A row with no non-NaN
// value gives 0.
//
// sample_row, per row (every per-row parameter is read from device memory):
//   temperature <= 0 (or NaN) -> exactly argmax.
//   Logits map to order-preserving u32 keys (NaN -> 0, below every number and never kept;
//   -0.0 -> +0.0 so equal logits have equal keys). With mz = max(l) / t, each token's mass
//   e = exp(l / t - mz) is in [0, 1] and is accumulated as an integer in 2^-40 fixed point:
//   sums are exact and order-independent (no rounding drift between passes, so the
//   thresholds and the draw agree exactly).
//   0. min-p (min_p > 0): the smallest key whose e >= min(min_p, 1) (a block min); the
//      survivors are the candidates of the next steps.
//   1. top-k (0 < k < candidates): the k-th largest candidate key by radix select, 4
//      passes of 8 bits with a shared-memory histogram (warp-aggregated native 32-bit
//      atomics). NaN tokens are never kept.
//   2. top-p (0 < p < 1): the same radix descent with masses over the survivors
//      (64-bit histogram, one atomic per distinct digit per warp step);
//      the first pass's histogram total is the kept mass S, and the descent finds the
//      largest kept key t with mass(key >= t) >= ceil(p * S).
//   3. u = uniform(seed) exactly as `crate::ops::uniform_from_seed` (the top 24 bits u24 of
//      splitmix64(seed)). Warp w owns a contiguous segment of the row and sums its kept
//      mass; Z = the sum over warps, target = floor(Z * u24 / 2^24) < Z; only the warp
//      whose segment holds the target rescans it (warp prefix scan, 128 tokens a step) and
//      returns the first index whose running kept mass exceeds the target.
//   A row whose max is not finite (all NaN / -inf, a +inf logit, or l / t overflowing)
//   falls back to argmax.
//
// row_logprobs (rows with num_logprobs >= 0): block max and sum of exp(l - max) of the
// penalised row; the top n (<= MAX_TOP) by a radix select of the n-th largest key, then
// one pass collecting the keys above it (atomics, fewer than n) and the first ties at it
// in index order (a block scan), sorted by thread 0.
//
// Last, a row with a penalty slot counts its token: counts[slot, token] += 1.

#define SAMPLE_THREADS 1024
#define INT_NONE 0x7fffffff
#define MAX_TOP 20               // MAX_TOP_LOGPROBS
#define PROMPT_BIT 0x40000000    // PROMPT_BIT: the token is in the prompt

// Order-preserving map float -> u32 (larger float, larger key).
__device__ __forceinline__ unsigned int order_key(float x) {
    if (x != x) return 0u;
    if (x == 0.0f) x = 0.0f;
    const unsigned int b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Four consecutive logits starting at i0; positions >= vocab read as NaN (never kept).
__device__ __forceinline__ void load4(const float* x, int vocab, int i0, int vec, float* o) {
    if (vec && i0 < vocab) {  // vocab % 4 == 0, so the whole float4 is in range
        const float4 f = *reinterpret_cast<const float4*>(x + i0);
        o[0] = f.x, o[1] = f.y, o[2] = f.z, o[3] = f.w;
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) o[j] = i0 + j < vocab ? x[i0 + j] : __int_as_float(0x7fffffff);
    }
}

// One row's penalties: its counts row (nullptr: none) and the three factors; and its
// allowed-token mask row (nullptr: none; see `TokenMask`: a disallowed token reads as NaN).
struct Pen {
    const int* c;
    float rep, freq, pres;
    const unsigned int* m;
};

// Whether the mask m (nullptr: none) allows token i (< vocab).
__device__ __forceinline__ bool allowed(const unsigned int* m, int i) {
    return m == nullptr || ((m[i >> 5] >> (i & 31)) & 1u);
}

// A logit after the penalties of a token whose count entry is c (see `Penalties`).
__device__ __forceinline__ float penalise(float l, int c, const Pen& p) {
    if (c == 0) return l;
    float v = l > 0.0f ? __fdiv_rn(l, p.rep) : __fmul_rn(l, p.rep);
    const int n = c & (PROMPT_BIT - 1);
    if (n > 0) {
        v = __fsub_rn(v, __fmul_rn(p.freq, (float)n));
        v = __fsub_rn(v, p.pres);
    }
    return v;
}

// load4, then the penalties of a row that has them.
__device__ __forceinline__ void load4p(const float* x, const Pen& p, int vocab, int i0, int vec,
                                       float* o) {
    load4(x, vocab, i0, vec, o);
    if (p.m != nullptr && i0 < vocab) {
        // i0 % 4 == 0: the four tokens share a mask word.
        const unsigned int bits = p.m[i0 >> 5] >> (i0 & 31);
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (!((bits >> j) & 1u)) o[j] = __int_as_float(0x7fffffff);
    }
    if (p.c == nullptr) return;
    int c[4];
    if (vec && i0 < vocab) {
        const int4 v = *reinterpret_cast<const int4*>(p.c + i0);
        c[0] = v.x, c[1] = v.y, c[2] = v.z, c[3] = v.w;
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) c[j] = i0 + j < vocab ? p.c[i0 + j] : 0;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) o[j] = penalise(o[j], c[j], p);
}

// exp(l / t - mz) as a 2^-40 fixed-point integer (<= 2^40 since l / t <= mz).
__device__ __forceinline__ unsigned long long mass_fx(float l, float t, float mz) {
    const float e = expf(l / t - mz);
    return __float2ull_rz(e * 1099511627776.0f);
}

__device__ __forceinline__ void argmax_take(float& bv, int& bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

// Index of the largest non-NaN (penalised) value of x[0..vocab) (smallest index among
// equal maxima), 0 if there is none. Every thread of the block must call it; all get the
// result.
__device__ int block_argmax(const float* x, const Pen& pen, int vocab, int vec, float* shv,
                            int* shi) {
    float bv = NEG_INF;
    int bi = INT_NONE;
    for (int base = 0; base < vocab; base += blockDim.x * 4) {
        const int i0 = base + threadIdx.x * 4;
        float xs[4];
        load4p(x, pen, vocab, i0, vec, xs);
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (xs[j] == xs[j]) argmax_take(bv, bi, xs[j], i0 + j);  // NaN past vocab
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, bv, o);
        const int oi = __shfl_xor_sync(FULL_MASK, bi, o);
        argmax_take(bv, bi, ov, oi);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (lane == 0) {
        shv[warp] = bv;
        shi[warp] = bi;
    }
    __syncthreads();
    bv = lane < nwarps ? shv[lane] : NEG_INF;
    bi = lane < nwarps ? shi[lane] : INT_NONE;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, bv, o);
        const int oi = __shfl_xor_sync(FULL_MASK, bi, o);
        argmax_take(bv, bi, ov, oi);
    }
    __syncthreads();
    return bi == INT_NONE ? 0 : bi;
}

// Exclusive block-wide prefix sum; `total` gets the block's sum. All threads must call.
__device__ __forceinline__ unsigned long long block_excl_scan_u64(unsigned long long v,
                                                                  unsigned long long* sh,
                                                                  unsigned long long* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    unsigned long long incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long t = __shfl_up_sync(FULL_MASK, incl, o);
        if (lane >= o) incl += t;
    }
    if (lane == 31) sh[warp] = incl;
    __syncthreads();
    const unsigned long long w = lane < nwarps ? sh[lane] : 0ull;
    unsigned long long wincl = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long t = __shfl_up_sync(FULL_MASK, wincl, o);
        if (lane >= o) wincl += t;
    }
    const unsigned long long warp_excl = __shfl_sync(FULL_MASK, wincl - w, warp);
    *total = __shfl_sync(FULL_MASK, wincl, 31);
    __syncthreads();
    return warp_excl + incl - v;
}

struct RadixShared {
    unsigned int hist32[256];         // counts (top-k)
    unsigned long long hist64[256];   // fixed-point masses (top-p)
    unsigned long long above;
    unsigned int sel;
};

// Histogram updates of one warp step (all 32 lanes call them; lanes with `c` contribute).
// Counts: the lanes sharing the first candidate lane's digit (logit keys are clustered, so
// usually most of them) add with one native 32-bit atomic, the rest one each.
__device__ __forceinline__ void hist_add_count(unsigned int* hist, bool c, unsigned int digit,
                                               int lane) {
    const unsigned int cm = __ballot_sync(FULL_MASK, c);
    if (cm == 0u) return;  // warp-uniform
    const int src = __ffs(cm) - 1;
    const unsigned int dd = __shfl_sync(FULL_MASK, digit, src);
    const unsigned int mm = __ballot_sync(FULL_MASK, c && digit == dd);
    if (lane == src) atomicAdd(&hist[dd], (unsigned int)__popc(mm));
    else if (c && digit != dd) atomicAdd(&hist[digit], 1u);
}
// Masses: one 64-bit atomic per distinct digit in the warp (lanes of one digit are summed
// with redux first), so no two lanes of an instruction hit the same address.
__device__ __forceinline__ void hist_add_mass(unsigned long long* hist, bool c,
                                              unsigned int digit, unsigned long long w,
                                              int lane) {
    unsigned int pending = __ballot_sync(FULL_MASK, c);
    while (pending != 0u) {  // warp-uniform
        const int src = __ffs(pending) - 1;
        const unsigned int dd = __shfl_sync(FULL_MASK, digit, src);
        const bool mine = ((pending >> lane) & 1u) && digit == dd;
        const unsigned int mm = __ballot_sync(FULL_MASK, mine);
        if (mine) {
            // w <= 2^40: 20- and 21-bit halves whose 32-lane sums fit in 32 bits.
            const unsigned int lo = __reduce_add_sync(mm, (unsigned int)(w & 0xfffffull));
            const unsigned int hi = __reduce_add_sync(mm, (unsigned int)(w >> 20));
            if (lane == src) atomicAdd(&hist[dd], ((unsigned long long)hi << 20) + lo);
        }
        pending &= ~mm;
    }
}

// Radix descent over the keys of the candidates (key >= cand_thr): returns the largest key
// t such that weight(candidates with key >= t) >= need, where a token weighs 1
// (MASS = false, need = k: t is the k-th largest key) or its fixed-point mass (MASS = true:
// need = ceil(p * total candidate mass), computed from the first pass's histogram). The
// caller guarantees 1 <= need <= total weight (k < number of candidates; 0 < p < 1).
template <bool MASS>
__device__ unsigned int radix_select(const float* x, const Pen& pen, int vocab, int vec,
                                     unsigned int cand_thr, float t, float mz,
                                     unsigned long long k, float p, RadixShared* rs) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    unsigned int prefix = 0u, pmask = 0u;
    unsigned long long need = k;  // used by warp 0 only
#pragma unroll 1
    for (int pass = 0; pass < 4; ++pass) {
        const int shift = 24 - 8 * pass;
        for (int i = tid; i < 256; i += blockDim.x) {
            rs->hist32[i] = 0u;
            rs->hist64[i] = 0ull;
        }
        __syncthreads();
        for (int base = 0; base < vocab; base += blockDim.x * 4) {  // block-uniform trip count
            float xs[4];
            load4p(x, pen, vocab, base + tid * 4, vec, xs);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const unsigned int key = order_key(xs[j]);
                const bool c = key >= cand_thr && (key & pmask) == prefix;
                const unsigned int digit = (key >> shift) & 255u;
                if (MASS) {
                    const unsigned long long w = c ? mass_fx(xs[j], t, mz) : 0ull;
                    hist_add_mass(rs->hist64, c && w != 0ull, digit, w, lane);  // 0 adds nothing
                } else {
                    hist_add_count(rs->hist32, c, digit, lane);
                }
            }
        }
        __syncthreads();
        if (warp == 0) {
            // Lane L owns digits 8L..8L+7; walk digits from the top accumulating weight.
            unsigned long long h[8], s = 0ull;
#pragma unroll
            for (int b = 0; b < 8; ++b) {
                h[b] = MASS ? rs->hist64[lane * 8 + b] : rs->hist32[lane * 8 + b];
                s += h[b];
            }
            if (MASS && pass == 0) {
                const unsigned long long total = warp_sum_u64(s);
                need = (unsigned long long)ceil((double)p * (double)total);
                if (need < 1ull) need = 1ull;
                if (need > total) need = total;
            }
            unsigned long long incl = s;  // weight of the digits of lanes >= lane
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned long long v = __shfl_down_sync(FULL_MASK, incl, o);
                if (lane + o < 32) incl += v;
            }
            const unsigned long long above = pass == 0 ? 0ull : rs->above;
            unsigned long long run = above + (incl - s);
            int cand = -1;
            unsigned long long before = 0ull;
#pragma unroll
            for (int b = 7; b >= 0; --b) {
                const unsigned long long next = run + h[b];
                if (cand < 0 && next >= need) {
                    cand = lane * 8 + b;
                    before = run;
                }
                run = next;
            }
            const int best = __reduce_max_sync(FULL_MASK, cand);
            __syncwarp();  // every lane has read rs->above before it is overwritten
            if (best < 0) {
                // Unreachable while 1 <= need <= total weight; keep a defined result.
                if (lane == 0) {
                    rs->sel = 0u;
                    rs->above = above;
                }
            } else if (cand == best) {
                rs->sel = (unsigned int)best;
                rs->above = before;
            }
        }
        __syncthreads();
        prefix |= rs->sel << shift;
        pmask |= 255u << shift;
    }
    return prefix;
}

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Block-wide minimum of u32 values; `sh` a 32-entry shared array. All threads must call.
__device__ __forceinline__ unsigned int block_min_u32(unsigned int v, unsigned int* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = __reduce_min_sync(FULL_MASK, v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < nwarps ? sh[lane] : 0xffffffffu;
    v = __reduce_min_sync(FULL_MASK, v);
    __syncthreads();
    return v;
}

struct SampleShared {
    RadixShared rs;
    unsigned long long sh64[32];
    float shf[32];
    int shi[32];
    unsigned int shu[32];
    int found;
    // row_logprobs: keys above the threshold at [0, MAX_TOP), ties at [MAX_TOP, 2 MAX_TOP).
    int gt_n, eq_n;
    int ids[2 * MAX_TOP];
    float vals[2 * MAX_TOP];
};

// The sampled index of one row (see the file comment); every thread gets it.
__device__ int sample_row(const float* x, const Pen& pen, int vocab, int vec, float t, int k,
                          float p, float mp, long long seed, SampleShared* sh) {
    const int tid = threadIdx.x;
    const int stride = blockDim.x * 4;

    float mz = 0.0f;
    int cnt = 0;
    bool greedy = !(t > 0.0f);
    if (!greedy) {
        float mx = NEG_INF;
        for (int base = 0; base < vocab; base += stride) {
            float xs[4];
            load4p(x, pen, vocab, base + tid * 4, vec, xs);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (xs[j] == xs[j]) {
                    mx = fmaxf(mx, xs[j]);
                    ++cnt;
                }
            }
        }
        mx = block_max(mx, sh->shf);
        cnt = (int)block_sum_u64((unsigned long long)cnt, sh->sh64);
        mz = mx / t;
        greedy = !(mz > NEG_INF && mz < POS_INF);
    }
    if (greedy) return block_argmax(x, pen, vocab, vec, sh->shf, sh->shi);  // block-uniform

    // 0. min-p: candidates are keys >= thr (1 keeps every non-NaN token); cnt counts them.
    unsigned int thr = 1u;
    if (mp > 0.0f) {
        const float m1 = fminf(mp, 1.0f);
        unsigned int lo = 0xffffffffu;
        int kept = 0;
        for (int base = 0; base < vocab; base += stride) {
            float xs[4];
            load4p(x, pen, vocab, base + tid * 4, vec, xs);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (xs[j] == xs[j] && expf(xs[j] / t - mz) >= m1) {
                    lo = min(lo, order_key(xs[j]));
                    ++kept;
                }
            }
        }
        thr = block_min_u32(lo, sh->shu);  // the max token always passes (e = 1)
        cnt = (int)block_sum_u64((unsigned long long)kept, sh->sh64);
    }

    // 1. top-k threshold among the candidates.
    if (k > 0 && k < vocab && k < cnt)
        thr = radix_select<false>(x, pen, vocab, vec, thr, t, mz, (unsigned long long)k, 0.0f,
                                  &sh->rs);

    // 2. top-p threshold among the kept tokens.
    if (p > 0.0f && p < 1.0f)
        thr = radix_select<true>(x, pen, vocab, vec, thr, t, mz, 0ull, p, &sh->rs);

    // 3. Inverse-CDF draw in index order. Warp w owns the contiguous segment
    // [w * seg, (w + 1) * seg): each warp sums its kept mass, then only the warp whose
    // segment holds the target rescans it with a warp-wide prefix scan.
    const int lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
    const int seg = ((vocab + nwarps - 1) / nwarps + 3) & ~3;
    const int ws = min(vocab, warp * seg), we = min(vocab, ws + seg);
    unsigned long long part = 0ull;
    int last_kept = -1;
    for (int i0 = ws + lane * 4; i0 < we; i0 += 128) {
        float xs[4];
        load4p(x, pen, vocab, i0, vec, xs);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (order_key(xs[j]) >= thr) {
                part += mass_fx(xs[j], t, mz);
                last_kept = i0 + j;
            }
        }
    }
    part = warp_sum_u64(part);
    if (lane == 0) sh->sh64[warp] = part;
    if (tid == 0) sh->found = -1;
    __syncthreads();
    // Every thread computes Z, the target and the owning warp from the same values.
    unsigned long long z_mass = 0ull;
    for (int w = 0; w < nwarps; ++w) z_mass += sh->sh64[w];  // >= 2^40: the max is kept
    const unsigned long long u24 = splitmix64((unsigned long long)seed) >> 40;
    const unsigned long long target = __umul64hi(z_mass, u24 << 40);  // floor(Z * u24 / 2^24)
    int owner = -1;
    unsigned long long run = 0ull;
    for (int w = 0; w < nwarps; ++w) {
        if (owner < 0 && run + sh->sh64[w] > target) owner = w;
        if (owner < 0) run += sh->sh64[w];
    }
    if (warp == owner) {  // warp-uniform; `run` = kept mass before this segment
        for (int ts = ws; ts < we; ts += 128) {  // warp-uniform trip count
            const int i0 = ts + lane * 4;
            float xs[4];
            load4p(x, pen, we, i0, vec, xs);  // bound by the segment end
            unsigned long long w[4], tsum = 0ull;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                w[j] = order_key(xs[j]) >= thr ? mass_fx(xs[j], t, mz) : 0ull;
                tsum += w[j];
            }
            unsigned long long incl = tsum;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned long long v = __shfl_up_sync(FULL_MASK, incl, o);
                if (lane >= o) incl += v;
            }
            unsigned long long r = run + incl - tsum;
            const bool here = r <= target && target < r + tsum;
            if (here) {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    r += w[j];
                    if (r > target) {
                        sh->found = i0 + j;
                        break;
                    }
                }
            }
            if (__any_sync(FULL_MASK, here)) break;
            run += __shfl_sync(FULL_MASK, incl, 31);
        }
    }
    __syncthreads();
    int res = sh->found;
    if (res < 0) res = block_max_int(last_kept, sh->shi);  // unreachable (target < Z)
    return res < 0 ? 0 : res;
}

// Log-probabilities of one row (see `SampleLogprobs`): the token's into *tok, the top n
// (0 <= n <= MAX_TOP) into ids / top. Every thread must call it.
__device__ void row_logprobs(const float* x, const Pen& pen, int vocab, int vec, int n, int token,
                             float* tok, int* ids, float* top, SampleShared* sh) {
    const int tid = threadIdx.x;
    const int stride = blockDim.x * 4;
    float mx = NEG_INF;
    int cnt = 0;
    for (int base = 0; base < vocab; base += stride) {
        float xs[4];
        load4p(x, pen, vocab, base + tid * 4, vec, xs);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (xs[j] == xs[j]) {
                mx = fmaxf(mx, xs[j]);
                ++cnt;
            }
        }
    }
    mx = block_max(mx, sh->shf);
    cnt = (int)block_sum_u64((unsigned long long)cnt, sh->sh64);
    float s = 0.0f;
    for (int base = 0; base < vocab; base += stride) {
        float xs[4];
        load4p(x, pen, vocab, base + tid * 4, vec, xs);
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (xs[j] == xs[j]) s += expf(xs[j] - mx);
    }
    s = block_sum(s, sh->shf);
    const float ln_sum = logf(s);
    if (tid == 0) {
        float l = pen.c != nullptr ? penalise(x[token], pen.c[token], pen) : x[token];
        if (!allowed(pen.m, token)) l = __int_as_float(0x7fffffff);
        *tok = (l - mx) - ln_sum;
    }
    if (n <= 0) return;  // block-uniform

    // The n-th largest key (1: fewer than n non-NaN tokens, take them all).
    const unsigned int thr =
        n < cnt ? radix_select<false>(x, pen, vocab, vec, 1u, 1.0f, 0.0f,
                                      (unsigned long long)n, 0.0f, &sh->rs)
                : 1u;
    if (tid == 0) sh->gt_n = 0, sh->eq_n = 0;
    __syncthreads();
    for (int base = 0; base < vocab; base += stride) {  // block-uniform trip count
        const int i0 = base + tid * 4;
        float xs[4];
        load4p(x, pen, vocab, i0, vec, xs);
        unsigned int keys[4];
        int e = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            keys[j] = order_key(xs[j]);  // NaN (and past vocab): 0 < thr
            if (keys[j] > thr) {  // fewer than n such keys in all
                const int at = atomicAdd(&sh->gt_n, 1);
                if (at < MAX_TOP) {
                    sh->ids[at] = i0 + j;
                    sh->vals[at] = xs[j];
                }
            } else if (keys[j] == thr) {
                ++e;
            }
        }
        if (__syncthreads_or(e > 0)) {  // ties at the threshold: the first ones by index
            const int e0 = sh->eq_n;
            unsigned long long total;
            unsigned long long pos = e0 + block_excl_scan_u64((unsigned long long)e, sh->sh64,
                                                              &total);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (keys[j] == thr) {
                    if (pos < (unsigned long long)n) {
                        sh->ids[MAX_TOP + pos] = i0 + j;
                        sh->vals[MAX_TOP + pos] = xs[j];
                    }
                    ++pos;
                }
            }
            __syncthreads();
            if (tid == 0) sh->eq_n = (int)min((unsigned long long)n, e0 + total);
            __syncthreads();
        }
    }
    __syncthreads();
    if (tid == 0) {
        const int g = min(sh->gt_n, n);
        const int q = min(sh->eq_n, n - g);
        for (int i = 0; i < q; ++i) {  // ties after the keys above (g + i < MAX_TOP + i)
            sh->ids[g + i] = sh->ids[MAX_TOP + i];
            sh->vals[g + i] = sh->vals[MAX_TOP + i];
        }
        const int m = g + q;
        for (int i = 1; i < m; ++i) {  // insertion sort: value descending, index ascending
            const int id = sh->ids[i];
            const float v = sh->vals[i];
            int j = i - 1;
            while (j >= 0 && (sh->vals[j] < v || (sh->vals[j] == v && sh->ids[j] > id))) {
                sh->ids[j + 1] = sh->ids[j];
                sh->vals[j + 1] = sh->vals[j];
                --j;
            }
            sh->ids[j + 1] = id;
            sh->vals[j + 1] = v;
        }
        for (int i = 0; i < n; ++i) {
            ids[i] = i < m ? sh->ids[i] : -1;
            top[i] = i < m ? (sh->vals[i] - mx) - ln_sum : NEG_INF;
        }
    }
}

// counts, pen_slot, ... : nullptr without penalties; num_lp, ... : nullptr without
// log-probabilities (lp_target: nullptr when every row scores its sampled token);
// mask_bits, mask_on: nullptr without masks.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_f32(const float* __restrict__ logits, const float* __restrict__ temperature,
               const int* __restrict__ top_k, const float* __restrict__ top_p,
               const float* __restrict__ min_p, const long long* __restrict__ seeds,
               int* __restrict__ out, int* counts, const int* __restrict__ pen_slot,
               const float* __restrict__ repetition, const float* __restrict__ frequency,
               const float* __restrict__ presence, int slots, const int* __restrict__ num_lp,
               float* __restrict__ tok_lp, int* __restrict__ top_ids,
               float* __restrict__ top_lp, int top_n, const int* __restrict__ lp_target,
               const unsigned int* __restrict__ mask_bits,
               const int* __restrict__ mask_on, int mask_words, int vocab, int vec) {
    pdl_enter();
    __shared__ SampleShared sh;
    const long long row = blockIdx.x;
    const float* x = logits + row * vocab;
    Pen pen = {nullptr, 1.0f, 0.0f, 0.0f, nullptr};
    if (mask_bits != nullptr && mask_on[row] != 0) pen.m = mask_bits + row * mask_words;
    int slot = -1;
    if (counts != nullptr) {
        const int s = pen_slot[row];
        if (s >= 0 && s < slots) {
            slot = s;
            pen.c = counts + (long long)s * vocab;
            pen.rep = repetition[row];
            pen.freq = frequency[row];
            pen.pres = presence[row];
        }
    }
    const int res = sample_row(x, pen, vocab, vec, temperature[row], top_k[row], top_p[row],
                               min_p[row], seeds[row], &sh);
    if (threadIdx.x == 0) out[row] = res;
    if (num_lp != nullptr) {
        const int n = num_lp[row];
        // The scored token: the row's target where one is given (a prompt token).
        int scored = res;
        if (lp_target != nullptr && lp_target[row] >= 0 && lp_target[row] < vocab)
            scored = lp_target[row];
        if (n >= 0)  // block-uniform
            row_logprobs(x, pen, vocab, vec, min(n, top_n), scored, tok_lp + row,
                         top_ids + row * top_n, top_lp + row * top_n, &sh);
    }
    if (slot >= 0) {
        __syncthreads();  // every thread is done reading the row's counts
        if (threadIdx.x == 0) atomicAdd(counts + (long long)slot * vocab + res, 1);
    }
}

// Backend::penalty_count: counts[slots[i], tokens[i]] += 1 for i in order (one thread, so
// repeated pairs add up; n is a step's drafts, a few dozen), pairs outside the table skipped.
extern "C" __global__ void penalty_count_i32(int* __restrict__ counts, const int* __restrict__ slots,
                                             const int* __restrict__ tokens, int n, int rows,
                                             int vocab) {
    pdl_enter();
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    for (int i = 0; i < n; ++i) {
        const int s = slots[i], t = tokens[i];
        if (s >= 0 && s < rows && t >= 0 && t < vocab) {
            counts[(long long)s * vocab + t] += 1;
        }
    }
}

// Per-row additive logit biases (see LogitBias in args.rs), in place on f32 logits
// [batch, vocab]: logits[r, ids[r, j]] += vals[r, j] for j < count[r]; ids outside
// [0, vocab) are skipped. One block per row; ids are distinct within a row.
extern "C" __global__ void logit_bias_f32(float* __restrict__ logits,
                                          const int* __restrict__ ids,
                                          const float* __restrict__ vals,
                                          const int* __restrict__ count, int vocab, int k) {
    pdl_enter();
    const long long r = blockIdx.x;
    const int n = min(count[r], k);
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const int id = ids[r * k + j];
        if (id >= 0 && id < vocab) {
            logits[r * vocab + id] += vals[r * k + j];
        }
    }
}
