// Sampling over f32 logits [batch, vocab]; one CTA of SAMPLE_THREADS per row.
// Semantics: `Sampling` in src/backend/mod.rs.
//
// argmax (block_argmax, the greedy path): each thread scans a strided share of the row
// (float4 loads when `vec`: vocab % 4 == 0 and the base 16-byte aligned) keeping (value,
// smallest index) and skipping NaN; warp then block reduction. A row with no non-NaN
// value gives 0.
//
// sample_f32, per row (every per-row parameter is read from device memory):
//   temperature <= 0 (or NaN) -> exactly argmax.
//   Logits map to order-preserving u32 keys (NaN -> 0, below every number and never kept;
//   -0.0 -> +0.0 so equal logits have equal keys). With mz = max(l) / t, each token's mass
//   e = exp(l / t - mz) is in [0, 1] and is accumulated as an integer in 2^-40 fixed point:
//   sums are exact and order-independent (no rounding drift between passes, so the
//   thresholds and the draw agree exactly).
//   1. top-k (0 < k < vocab): the k-th largest key by radix select, 4 passes of 8 bits
//      with a shared-memory histogram (warp-aggregated native 32-bit atomics). NaN tokens
//      are never kept; k >= the number of non-NaN tokens keeps all of them.
//   2. top-p (0 < p < 1): the same radix descent with masses over the top-k survivors
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

#define SAMPLE_THREADS 1024
#define INT_NONE 0x7fffffff

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

// Index of the largest non-NaN value of x[0..vocab) (smallest index among equal maxima),
// 0 if there is none. Every thread of the block must call it; all get the result.
__device__ int block_argmax(const float* x, int vocab, int vec, float* shv, int* shi) {
    float bv = NEG_INF;
    int bi = INT_NONE;
    if (vec) {
        const int n4 = vocab / 4;
        for (int i4 = threadIdx.x; i4 < n4; i4 += blockDim.x) {
            const float4 f = *reinterpret_cast<const float4*>(x + 4 * i4);
            if (f.x == f.x) argmax_take(bv, bi, f.x, 4 * i4);
            if (f.y == f.y) argmax_take(bv, bi, f.y, 4 * i4 + 1);
            if (f.z == f.z) argmax_take(bv, bi, f.z, 4 * i4 + 2);
            if (f.w == f.w) argmax_take(bv, bi, f.w, 4 * i4 + 3);
        }
    } else {
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            const float v = x[i];
            if (v == v) argmax_take(bv, bi, v, i);
        }
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
__device__ unsigned int radix_select(const float* x, int vocab, int vec, unsigned int cand_thr,
                                     float t, float mz, unsigned long long k, float p,
                                     RadixShared* rs) {
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
            load4(x, vocab, base + tid * 4, vec, xs);
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

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_f32(const float* __restrict__ logits, const float* __restrict__ temperature,
               const int* __restrict__ top_k, const float* __restrict__ top_p,
               const long long* __restrict__ seeds, int* __restrict__ out, int vocab, int vec) {
    pdl_enter();
    __shared__ RadixShared rs;
    __shared__ unsigned long long sh64[32];
    __shared__ float shf[32];
    __shared__ int shi[32];
    __shared__ int found;

    const int tid = threadIdx.x;
    const long long row = blockIdx.x;
    const float* x = logits + row * vocab;
    const float t = temperature[row];
    const int stride = blockDim.x * 4;

    float mz = 0.0f;
    int cnt = 0;
    bool greedy = !(t > 0.0f);
    if (!greedy) {
        float mx = NEG_INF;
        for (int base = 0; base < vocab; base += stride) {
            float xs[4];
            load4(x, vocab, base + tid * 4, vec, xs);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (xs[j] == xs[j]) {
                    mx = fmaxf(mx, xs[j]);
                    ++cnt;
                }
            }
        }
        mx = block_max(mx, shf);
        cnt = (int)block_sum_u64((unsigned long long)cnt, sh64);
        mz = mx / t;
        greedy = !(mz > NEG_INF && mz < POS_INF);
    }
    if (greedy) {  // block-uniform
        const int idx = block_argmax(x, vocab, vec, shf, shi);
        if (tid == 0) out[row] = idx;
        return;
    }

    // 1. top-k threshold (keys >= thr are kept; 1 keeps every non-NaN token).
    unsigned int thr = 1u;
    const int k = top_k[row];
    if (k > 0 && k < vocab && k < cnt)
        thr = radix_select<false>(x, vocab, vec, 1u, t, mz, (unsigned long long)k, 0.0f, &rs);

    // 2. top-p threshold among the kept tokens.
    const float p = top_p[row];
    if (p > 0.0f && p < 1.0f) thr = radix_select<true>(x, vocab, vec, thr, t, mz, 0ull, p, &rs);

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
        load4(x, vocab, i0, vec, xs);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (order_key(xs[j]) >= thr) {
                part += mass_fx(xs[j], t, mz);
                last_kept = i0 + j;
            }
        }
    }
    part = warp_sum_u64(part);
    if (lane == 0) sh64[warp] = part;
    if (tid == 0) found = -1;
    __syncthreads();
    // Every thread computes Z, the target and the owning warp from the same values.
    unsigned long long z_mass = 0ull;
    for (int w = 0; w < nwarps; ++w) z_mass += sh64[w];  // >= 2^40: the max token is kept
    const unsigned long long u24 = splitmix64((unsigned long long)seeds[row]) >> 40;
    const unsigned long long target = __umul64hi(z_mass, u24 << 40);  // floor(Z * u24 / 2^24)
    int owner = -1;
    unsigned long long run = 0ull;
    for (int w = 0; w < nwarps; ++w) {
        if (owner < 0 && run + sh64[w] > target) owner = w;
        if (owner < 0) run += sh64[w];
    }
    if (warp == owner) {  // warp-uniform; `run` = kept mass before this segment
        for (int ts = ws; ts < we; ts += 128) {  // warp-uniform trip count
            const int i0 = ts + lane * 4;
            float xs[4];
            load4(x, we, i0, vec, xs);  // bound by the segment end
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
                        found = i0 + j;
                        break;
                    }
                }
            }
            if (__any_sync(FULL_MASK, here)) break;
            run += __shfl_sync(FULL_MASK, incl, 31);
        }
    }
    __syncthreads();
    int res = found;
    if (res < 0) res = block_max_int(last_kept, shi);  // unreachable (target < Z)
    if (tid == 0) out[row] = res < 0 ? 0 : res;
}
