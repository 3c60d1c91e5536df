// attention: paged attention for decode and prefill, split-K ("flash-decoding").
//
// Semantics: see `Attention` in src/backend/mod.rs. Row r of q is one query; it attends
// to the tokens [lo, ctx) of its sequence, where (all read from device memory)
//   decode  (has_cu == 0): seq = r, ctx = seq_lens[r]
//   prefill (has_cu != 0): seq = s with cu[s] <= r < cu[s+1] (binary search), and the
//                          query's position is seq_lens[s] - cu[s+1] + r, ctx = position + 1
// and lo = max(0, ctx - window) with a sliding window (window > 0, a model constant per
// layer; 0 = full attention, lo = 0), computed before ctx is clamped to
// table_width * block_size. Rows with an empty range (padding, rows past cu[num_seqs],
// negative positions, a window wholly past the table) write zeros. Cache blocks whose id
// is outside 0..num_blocks contribute nothing (they are never read). Only [lo, ctx) is
// split and streamed: blocks before the window are never read.
//
// FP8 cache (the `_kv8` variants, KV = fp8): each lane's vector of a K/V row is the same
// V elements in V bytes of E4M3 (8- or 4-byte cp.async), decoded in registers; the layer's
// key scale is folded into qscale by the host, its value scale (vscale, 1 otherwise)
// multiplies the output or the partial acc.
//
// Kernel 1, attention_split_g<GMAX>_<dtype>[_kv8]: grid (rows, num_kv_heads * num_sub,
// num_splits), ATT_THREADS threads. One CTA owns one query row, `heads_per_cta` <= GMAX
// query heads of one GQA group (the group is cut into num_sub parts: the whole group when
// it has <= 8 heads and the batch fills the GPU; fewer heads per CTA for small batches,
// chosen by the host) and one split of the row's range: split s of num_splits takes tokens
// [lo + s * per, min(ctx, lo + (s + 1) * per)), per = ceil((ctx - lo) / num_splits) rounded
// up to the CTA's chunk. Each K/V row is read once per CTA and used for all its heads.
//   Thread layout: `lpt` lanes (a power of two, 4..32) share one token; lane l holds
//   16-byte vectors l, l + lpt (< head_dim / V) of q (f32 registers, pre-scaled by
//   scale * log2(e)), of the token's K and V rows, and of the accumulators. A CTA has
//   ATT_THREADS / lpt token slots; each slot takes U consecutive tokens per step, so one
//   step covers chunk = slots * U tokens. K/V vectors stream through a per-thread
//   ATT_STAGES-deep cp.async ring in shared memory (16-byte copies, L2 only, zero-filled for
//   masked tokens): every thread reads back only its own copies, so the ring needs
//   cp.async.wait_group but no barrier, and the loads of the next 3 steps are in flight
//   while a step computes. Scores are reduced with an xor butterfly (every lane gets
//   bit-identical sums), and each slot runs its own online softmax (base-2 exponentials).
//   At the end the slots are merged in shared memory in a fixed order (deterministic), and
//   the CTA writes either the final output (num_splits == 1) or its partial result:
//     acc  [rows, num_heads, num_splits, head_dim]  (unnormalised, relative to m)
//     ml   [rows, num_heads, num_splits, 2]         (m = running max in log2 units, l = sum)
//   located at scratch[0..] and scratch[rows*num_heads*num_splits*head_dim..].
//   Empty splits write m = -inf, l = 0 and no acc.
// Kernel 2, attention_combine_<dtype>: grid (rows, num_heads), ATT_COMBINE_THREADS threads:
// one CTA per (row, head) merges the splits' partials with the usual max rescaling and
// writes out = acc / l (zeros where l == 0). Only launched when num_splits (<= 32) > 1.
// The second launch orders the two kernels: no cross-CTA synchronisation is needed.

#define ATT_THREADS 128
#define ATT_MAX_SLOTS 32   // ATT_THREADS / minimum lpt (4)
#define ATT_MAX_HEAD_DIM 256

#define ATT_STAGES 4        // cp.async ring depth: loads of 3 steps in flight during compute

template <typename T, typename KV, int GMAX> struct AttCfg {
    static constexpr int V = Ty<T>::V;
    // Vectors per lane: head_dim <= 256 is at most 32 vectors of 16-bit types (one per lane
    // of a 32-lane token group) and 64 of f32.
    static constexpr int NV = sizeof(T) == 4 ? 2 : 1;
    // Tokens per slot per step. The ring holds ATT_STAGES * U * NV * 2 vectors per thread
    // (16 bytes of T, or V bytes of E4M3 and twice the tokens): 32 KiB per CTA (16 KiB for
    // f32 q over an FP8 cache).
    static constexpr int U = KvVec<T, KV>::U;
};

// cp.async copies (common.cuh): each thread only ever reads back its own copies, after
// cp_async_wait, so no barrier is needed between the copy and the read.

template <typename T, typename KV, int GMAX>
__device__ __forceinline__ void attention_split_impl(
    const T* q, const KV* __restrict__ k_cache, const KV* __restrict__ v_cache,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const int* __restrict__ cu_seqlens, int has_cu, T* out, float* __restrict__ scratch,
    float qscale, float vscale, float softcap, int window, int num_seqs, int rows, int num_heads,
    int num_kv_heads, int head_dim, int num_blocks, int block_size, int table_width, int group,
    int heads_per_cta, int num_sub, int num_splits, int lpt, const T* __restrict__ sinks) {
    constexpr int V = AttCfg<T, KV, GMAX>::V;
    constexpr int NV = AttCfg<T, KV, GMAX>::NV;
    constexpr int U = AttCfg<T, KV, GMAX>::U;
    typedef KvVec<T, KV> Kv;
    typedef typename Kv::type kvec;

    __shared__ float sm_m[ATT_MAX_SLOTS][GMAX];
    __shared__ float sm_l[ATT_MAX_SLOTS][GMAX];
    __shared__ __align__(16) float red[GMAX * ATT_MAX_HEAD_DIM];

    const int row = blockIdx.x;
    const int g = blockIdx.y / num_sub;
    const int sub = blockIdx.y - g * num_sub;
    const int split = blockIdx.z;
    const int h0 = g * group + sub * heads_per_cta;
    const int gh = min(heads_per_cta, group - sub * heads_per_cta);  // heads of this CTA
    const int tid = threadIdx.x;
    const int nvec = head_dim / V;

    // --- Which sequence, and how many keys this row attends to (device data only). ---
    int seq = 0;
    long long ctx = 0;
    if (!has_cu) {
        seq = row;
        ctx = seq_lens[row];
    } else if (num_seqs > 0) {
        int lo = 0, hi = num_seqs - 1;  // largest s with cu[s] <= row
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (cu_seqlens[mid] <= row) lo = mid; else hi = mid - 1;
        }
        const int a = cu_seqlens[lo], b = cu_seqlens[lo + 1];
        if (a <= row && row < b) {
            seq = lo;
            ctx = (long long)seq_lens[lo] - b + row + 1;
        }
    }
    const long long max_ctx = (long long)table_width * block_size;  // < 2^31 (host check)
    // The window counts back from the query's position, before the table clamp.
    long long k_lo = window > 0 ? ctx - window : 0;
    if (k_lo < 0) k_lo = 0;
    if (ctx < 0) ctx = 0;
    if (ctx > max_ctx) ctx = max_ctx;
    if (k_lo > ctx) k_lo = ctx;

    const int nslots = ATT_THREADS / lpt;
    const int chunk = nslots * U;
    const int c = (int)ctx;
    const int span = c - (int)k_lo;
    int per = (span + num_splits - 1) / num_splits;
    per = (per + chunk - 1) / chunk * chunk;
    const long long start_ll = k_lo + (long long)split * per;
    const int start = (int)min(start_ll, (long long)c);
    const int end = (int)min(start_ll + per, (long long)c);

    if (start >= end) {
        // Nothing to attend to in this split (block-uniform branch: no barrier skipped).
        if (num_splits == 1) {
            for (int i = 0; i < gh; ++i) {
                T* o = out + ((long long)row * num_heads + h0 + i) * head_dim;
                for (int d = tid; d < head_dim; d += ATT_THREADS) o[d] = from_f32<T>(0.0f);
            }
        } else if (tid < gh) {
            const long long pidx = ((long long)row * num_heads + h0 + tid) * num_splits + split;
            float* ml = scratch + (long long)rows * num_heads * num_splits * head_dim;
            ml[2 * pidx] = NEG_INF;
            ml[2 * pidx + 1] = 0.0f;
        }
        return;
    }

    const int lane = tid & (lpt - 1);
    const int slot = tid / lpt;

    // --- q for this CTA's heads, in registers, pre-scaled into log2 units. ---
    float qf[GMAX][NV][V];
#pragma unroll
    for (int i = 0; i < GMAX; ++i) {
#pragma unroll
        for (int v = 0; v < NV; ++v) {
            const int vi = lane + v * lpt;
            if (i < gh && vi < nvec) {
                load_vec(q + ((long long)row * num_heads + h0 + i) * head_dim + vi * V, qf[i][v]);
#pragma unroll
                for (int e = 0; e < V; ++e) qf[i][v][e] *= qscale;
            } else {
#pragma unroll
                for (int e = 0; e < V; ++e) qf[i][v][e] = 0.0f;
            }
        }
    }

    float m[GMAX], l[GMAX], acc[GMAX][NV][V];
#pragma unroll
    for (int i = 0; i < GMAX; ++i) {
        m[i] = NEG_INF;
        l[i] = 0.0f;
#pragma unroll
        for (int v = 0; v < NV; ++v)
#pragma unroll
            for (int e = 0; e < V; ++e) acc[i][v][e] = 0.0f;
    }

    const int* table = block_tables + (long long)seq * table_width;
    const long long tok_stride = (long long)num_kv_heads * head_dim;  // elements per slot
    const long long head_off = (long long)g * head_dim;

    // Per-thread ring of K/V vectors: ring[stage][u][v][0 = K, 1 = V][tid] (consecutive
    // threads, consecutive 16 bytes: conflict-free). okbits bit (stage * U + u) says whether
    // token u of that stage is a real token of a valid block.
    __shared__ kvec ring[ATT_STAGES][U][NV][2][ATT_THREADS];
    unsigned int okbits = 0u;
    const int niter = (end - start + chunk - 1) / chunk;

    // Issue the copies of step `it` (an empty group past the end keeps the counting uniform).
    auto issue = [&](int it) {
        const int stage = it % ATT_STAGES;
        unsigned int bits = 0u;
        if (it < niter) {
            const int t0 = start + it * chunk + slot * U;
            int bi = t0 / block_size;
            int r = t0 - bi * block_size;
            int blk = t0 < end ? table[bi] : -1;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int t = t0 + u;
                if (u > 0 && r == 0) blk = t < end ? table[bi] : -1;  // crossed into block bi
                const bool ok = t < end && blk >= 0 && blk < num_blocks;
                bits |= (unsigned int)ok << u;
                const long long off =
                    ok ? ((long long)blk * block_size + r) * tok_stride + head_off : 0;
#pragma unroll
                for (int v = 0; v < NV; ++v) {
                    const int vi = lane + v * lpt;
                    const bool on = ok && vi < nvec;
                    const long long o = on ? off + vi * V : 0;
                    Kv::copy(&ring[stage][u][v][0][tid], k_cache + o, on);
                    Kv::copy(&ring[stage][u][v][1][tid], v_cache + o, on);
                }
                if (++r == block_size) {
                    r = 0;
                    ++bi;
                }
            }
        }
        okbits = (okbits & ~(((1u << U) - 1u) << (stage * U))) | (bits << (stage * U));
        cp_async_commit();
    };

#pragma unroll
    for (int it = 0; it < ATT_STAGES - 1; ++it) issue(it);

    for (int it = 0; it < niter; ++it) {
        // Groups committed so far: it + STAGES - 1; step `it` is the oldest pending one.
        cp_async_wait<ATT_STAGES - 2>();
        const int stage = it % ATT_STAGES;
        kvec kr[U][NV], vr[U][NV];
        bool ok[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            ok[u] = (okbits >> (stage * U + u)) & 1u;
#pragma unroll
            for (int v = 0; v < NV; ++v) {
                kr[u][v] = ring[stage][u][v][0][tid];
                vr[u][v] = ring[stage][u][v][1][tid];
            }
        }
        // Refill the stage consumed in the previous step (read into registers back then).
        issue(it + ATT_STAGES - 1);

        // Scores (log2 units): partial dot products, then a butterfly over the lpt lanes.
        float s[U][GMAX];
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
            for (int i = 0; i < GMAX; ++i) s[u][i] = 0.0f;
#pragma unroll
            for (int v = 0; v < NV; ++v) {
                float kf[V];
                Kv::unpack(kr[u][v], kf);
#pragma unroll
                for (int i = 0; i < GMAX; ++i)
#pragma unroll
                    for (int e = 0; e < V; ++e) s[u][i] = fmaf(qf[i][v][e], kf[e], s[u][i]);
            }
        }
        for (int o = lpt >> 1; o > 0; o >>= 1) {
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int i = 0; i < GMAX; ++i) s[u][i] += __shfl_xor_sync(FULL_MASK, s[u][i], o);
        }

        // Soft-capping (Gemma 2), before the mask.
        if (softcap > 0.0f) {
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int i = 0; i < GMAX; ++i) s[u][i] = softcap_l2(s[u][i], softcap);
        }
        // Online softmax over the U tokens, per head.
#pragma unroll
        for (int i = 0; i < GMAX; ++i) {
            float mx = m[i];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (!ok[u]) s[u][i] = NEG_INF;
                mx = fmaxf(mx, s[u][i]);
            }
            const float mu = mx == NEG_INF ? 0.0f : mx;  // all masked so far: keep zeros
            const float corr = exp2f(m[i] - mu);
            float psum = 0.0f;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                s[u][i] = exp2f(s[u][i] - mu);  // from here on s holds the probabilities
                psum += s[u][i];
            }
            l[i] = l[i] * corr + psum;
            m[i] = mx;
#pragma unroll
            for (int v = 0; v < NV; ++v)
#pragma unroll
                for (int e = 0; e < V; ++e) acc[i][v][e] *= corr;
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
            for (int v = 0; v < NV; ++v) {
                float vf[V];
                Kv::unpack(vr[u][v], vf);
#pragma unroll
                for (int i = 0; i < GMAX; ++i)
#pragma unroll
                    for (int e = 0; e < V; ++e) acc[i][v][e] = fmaf(s[u][i], vf[e], acc[i][v][e]);
            }
        }
    }

    cp_async_wait<0>();  // only empty groups can still be pending; drain them anyway

    // --- Merge the slots of this CTA (fixed order). ---
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < GMAX; ++i) {
            sm_m[slot][i] = m[i];
            sm_l[slot][i] = l[i];
        }
    }
    __syncthreads();
    float M[GMAX], L[GMAX];
#pragma unroll
    for (int i = 0; i < GMAX; ++i) {
        float mx = NEG_INF;
        for (int sl = 0; sl < nslots; ++sl) mx = fmaxf(mx, sm_m[sl][i]);
        const float mu = mx == NEG_INF ? 0.0f : mx;
        float sum = 0.0f;
        for (int sl = 0; sl < nslots; ++sl) sum += sm_l[sl][i] * exp2f(sm_m[sl][i] - mu);
        M[i] = mx;
        L[i] = sum;
        const float f = exp2f(m[i] - mu);  // this slot's rescale factor (0 if it saw nothing)
#pragma unroll
        for (int v = 0; v < NV; ++v)
#pragma unroll
            for (int e = 0; e < V; ++e) acc[i][v][e] *= f;
    }
    for (int sl = 0; sl < nslots; ++sl) {
        if (slot == sl) {
#pragma unroll
            for (int i = 0; i < GMAX; ++i) {
#pragma unroll
                for (int v = 0; v < NV; ++v) {
                    const int vi = lane + v * lpt;
                    if (i < gh && vi < nvec) {
                        float* dst = red + i * head_dim + vi * V;
#pragma unroll
                        for (int e = 0; e < V; e += 4) {
                            float4 a = make_float4(acc[i][v][e], acc[i][v][e + 1],
                                                   acc[i][v][e + 2], acc[i][v][e + 3]);
                            if (sl > 0) {
                                const float4 b = *reinterpret_cast<const float4*>(dst + e);
                                a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
                            }
                            *reinterpret_cast<float4*>(dst + e) = a;
                        }
                    }
                }
            }
        }
        __syncthreads();
    }

    // --- Write the final output or this split's partial. ---
    if (num_splits == 1) {
#pragma unroll
        for (int i = 0; i < GMAX; ++i) {
            if (i < gh) {
                T* o = out + ((long long)row * num_heads + h0 + i) * head_dim;
                const float mu = M[i] == NEG_INF ? 0.0f : M[i];
                const float inv = vscale * softmax_inv(mu, L[i], sinks, h0 + i);
                for (int d = tid; d < head_dim; d += ATT_THREADS)
                    o[d] = from_f32<T>(red[i * head_dim + d] * inv);
            }
        }
    } else {
        float* ml = scratch + (long long)rows * num_heads * num_splits * head_dim;
#pragma unroll
        for (int i = 0; i < GMAX; ++i) {
            if (i < gh) {
                const long long pidx =
                    ((long long)row * num_heads + h0 + i) * num_splits + split;
                float* dst = scratch + pidx * head_dim;
                for (int d = tid; d < head_dim; d += ATT_THREADS)
                    dst[d] = red[i * head_dim + d] * vscale;
                if (tid == 0) {
                    ml[2 * pidx] = M[i];
                    ml[2 * pidx + 1] = L[i];
                }
            }
        }
    }
}

#define ATT_COMBINE_THREADS 256

template <typename T>
__device__ __forceinline__ void attention_combine_impl(const float* __restrict__ scratch, T* out,
                                                       int rows, int num_heads, int head_dim,
                                                       int num_splits, const T* sinks) {
    // One CTA per (row, head). Every warp derives the split weights (lane s reads split s's
    // (m, l); num_splits <= 32); warp w accumulates splits w, w + 8, ... over the whole
    // head (lanes stride over head_dim 4 floats at a time), then the warps' partial sums
    // are added in a fixed order. All loops have warp-uniform trip counts.
    __shared__ __align__(16) float part[ATT_COMBINE_THREADS / 32][ATT_MAX_HEAD_DIM];
    const int row = blockIdx.x, h = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int NW = ATT_COMBINE_THREADS / 32;
    const long long p0 = ((long long)row * num_heads + h) * num_splits;
    const float2* ml = reinterpret_cast<const float2*>(
                           scratch + (long long)rows * num_heads * num_splits * head_dim) + p0;
    const float2 mine = lane < num_splits ? ml[lane] : make_float2(NEG_INF, 0.0f);
    const float mx = warp_max(mine.x);
    const float mu = mx == NEG_INF ? 0.0f : mx;
    // Weight 0 marks an empty split (its acc was never written and is not read).
    const float w = mine.x == NEG_INF ? 0.0f : exp2f(mine.x - mu);
    const float L = warp_sum(mine.y * w);
    const float inv = softmax_inv(mu, L, sinks, h);
    for (int d0 = 0; d0 < head_dim; d0 += 128) {
        const int d = d0 + lane * 4;
        const bool on = d < head_dim;
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
        for (int s = warp; s < num_splits; s += NW) {
            const float ws = __shfl_sync(FULL_MASK, w, s);
            if (on && ws != 0.0f) {
                const float4 b =
                    *reinterpret_cast<const float4*>(scratch + (p0 + s) * head_dim + d);
                a.x = fmaf(ws, b.x, a.x);
                a.y = fmaf(ws, b.y, a.y);
                a.z = fmaf(ws, b.z, a.z);
                a.w = fmaf(ws, b.w, a.w);
            }
        }
        if (on) *reinterpret_cast<float4*>(&part[warp][d]) = a;
    }
    __syncthreads();
    T* o = out + ((long long)row * num_heads + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += ATT_COMBINE_THREADS) {
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < NW; ++i) sum += part[i][d];
        o[d] = from_f32<T>(sum * inv);
    }
}

#define ATTENTION_SPLIT(NAME, T, KV, GMAX)                                                 \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) NAME(                        \
        const T* q, const KV* k_cache, const KV* v_cache, const int* block_tables,         \
        const int* seq_lens, const int* cu_seqlens, int has_cu, T* out, float* scratch,    \
        float qscale, float vscale, float softcap, int window, int num_seqs, int rows, int num_heads,     \
        int num_kv_heads, int head_dim, int num_blocks, int block_size, int table_width,   \
        int group, int heads_per_cta, int num_sub, int num_splits, int lpt, const T* sinks) { \
        pdl_enter();                                                                        \
        attention_split_impl<T, KV, GMAX>(q, k_cache, v_cache, block_tables, seq_lens,     \
                                          cu_seqlens, has_cu, out, scratch, qscale, vscale, softcap, \
                                          window, num_seqs, rows, num_heads, num_kv_heads,  \
                                          head_dim, num_blocks, block_size, table_width,    \
                                          group, heads_per_cta, num_sub, num_splits, lpt,   \
                                          sinks);                                           \
    }
#define ATTENTION_COMBINE(NAME, T)                                                         \
    extern "C" __global__ void __launch_bounds__(ATT_COMBINE_THREADS)                      \
        NAME(const float* scratch, T* out, int rows, int num_heads, int head_dim,          \
             int num_splits, const T* sinks) {                                              \
        pdl_enter();                                                                        \
        attention_combine_impl<T>(scratch, out, rows, num_heads, head_dim, num_splits,     \
                                  sinks);                                                   \
    }

// The variants by heads per CTA and q's type; `_kv8`: over an FP8 cache.
#define ATTENTION_SPLITS(T, TN)                                                            \
    ATTENTION_SPLIT(attention_split_g1_##TN, T, T, 1)                                      \
    ATTENTION_SPLIT(attention_split_g2_##TN, T, T, 2)                                      \
    ATTENTION_SPLIT(attention_split_g4_##TN, T, T, 4)                                      \
    ATTENTION_SPLIT(attention_split_g8_##TN, T, T, 8)                                      \
    ATTENTION_SPLIT(attention_split_g1_##TN##_kv8, T, fp8, 1)                              \
    ATTENTION_SPLIT(attention_split_g2_##TN##_kv8, T, fp8, 2)                              \
    ATTENTION_SPLIT(attention_split_g4_##TN##_kv8, T, fp8, 4)                              \
    ATTENTION_SPLIT(attention_split_g8_##TN##_kv8, T, fp8, 8)
ATTENTION_SPLITS(bf16, bf16)
ATTENTION_SPLITS(f16, f16)
ATTENTION_SPLITS(float, f32)
ATTENTION_COMBINE(attention_combine_bf16, bf16)
ATTENTION_COMBINE(attention_combine_f16, f16)
ATTENTION_COMBINE(attention_combine_f32, float)
