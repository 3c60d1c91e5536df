// attention_decode: tensor-core (mma.sync m16n8k16, f32 accumulation) paged attention for
// decode rows of a GQA model (one query row per sequence, `cu_seqlens_q` absent), head_dim
// 64 or 128, over a cache of T (bf16 / f16) or FP8 (the `_kv8` variants).
//
// Same semantics as attention.cu's split kernel for has_cu == 0 (see `Attention` in
// src/backend/mod.rs): row r attends to the keys [lo, ctx) of sequence r, ctx = seq_lens[r]
// clamped to table_width * block_size, lo = max(0, ctx - window) with a window (computed
// before the clamp); keys of blocks outside 0..num_blocks contribute nothing; a row with an
// empty range writes zeros. The range is cut into num_splits splits exactly as the split
// kernel cuts it (each a whole number of DA_KEYS keys), and a split writes the final output
// (num_splits == 1) or its partial result in the split kernel's scratch layout, which
// attention.cu's combine kernel merges.
//
// Launch: grid (num_kv_heads, rows, num_splits) with heads_fast = 1 (a row's KV heads in
// adjacent CTAs read the same blocks' rows together), else (rows, num_kv_heads,
// num_splits); DA_THREADS threads (4 warps), DA_SMEM_BYTES(HD, F8) of dynamic shared
// memory, shapes only. A CTA owns one row, one KV head and its GQA group of `group` (<= 16)
// query heads as the 16 rows of one m16 tile (rows past the group are zeros and never
// written): it reads each key once for all of its heads, on the tensor cores, so a step
// streams K/V at the memory's rate where the CUDA-core kernel is bound by its arithmetic.
// Keys come in tiles of DA_KEYS = 64; warp w takes keys 16w..16w+15 of every tile (S = Q
// K^T: HD/16 mma pairs; O += P V: HD/8 mma), with its own online softmax (log2 units) and
// O; the four warps' (m, l, O) are merged in shared memory at the end in a fixed order
// (deterministic).
//
// Each warp gathers its own 16 keys of every tile, so the loop has no block-wide barrier.
// With blocks of a power of two >= 16 tokens (16 is the engine's default) the tiles start
// at a multiple of 16 keys (keys before the split's first are masked), so a warp's 16 keys
// lie in one block: one table read, then rows at a fixed stride (any other block size
// takes the general gather, a block lookup per key). The instructions a tile costs are
// what bounds this kernel (two to three warps a scheduler), not the tensor cores.
// A cache of T: K/V rows come by 16-byte cp.async copies into DA_STAGES shared buffers
// (rows padded to HD + 8 elements: conflict-free ldmatrix), the next two tiles in flight
// while one is computed, and reach the mma by ldmatrix. An FP8 cache (half the bytes a
// key, so twice the keys a second to keep up): the E4M3 bytes of the next two tiles come
// by cp.async into DA_STAGES_F8 raw buffers (rows padded to HD + 16 bytes: conflict-free
// 16-byte loads; 60 KiB a CTA at HD 128, so 3 CTAs an SM), and each lane reads the bytes
// of its own mma fragments straight from them and converts them in registers (no f16 copy
// of the tile, no ldmatrix; `da_cvt4`). The mma run in f16 (q is rounded to f16 once, P in
// f16). For that, the head dimension is permuted: Q K^T sums over it, so Q and K may share
// any order, and lane (g, t4) takes the contiguous bytes [t4 HD/4, (t4 + 1) HD/4) of a key
// row for its K fragments of all k-steps (`f8_qdim` gives each byte's place in Q); P V's
// output columns are permuted instead (lane g's V fragments are the bytes [g HD/8,
// (g + 1) HD/8) of four key rows, paired by prmt), and undone when O is merged. The
// layer's key scale is folded into qscale by the host, the value scale (vscale, 1 for a
// cache of T) multiplies the output.
//
// mma.m16n8k16 fragments and ldmatrix: common.cuh (Mma16816).

#define DA_THREADS 128
#define DA_KEYS 64  // keys per tile (16 per warp)
#define DA_M 16     // query heads of a CTA: one m16 tile
#define DA_STAGES 3     // tiles of a cache of T in shared memory (two in flight)
#define DA_STAGES_F8 3  // raw FP8 tiles in shared memory (two in flight; 3 CTAs an SM)
// Dynamic shared memory: Q (DA_M rows of HD + 8 16-bit elements), then a cache of T's
// DA_STAGES K and V tiles of the same rows, or FP8's DA_STAGES_F8 raw K and V tiles of
// HD + 16 bytes a row, then a key-validity array per stage. `da_smem_bytes` in
// attention.rs mirrors this.
#define DA_SMEM_BYTES(HD, F8)                                                              \
    (DA_M * ((HD) + 8) * 2 +                                                               \
     ((F8) ? DA_STAGES_F8 * 2 * DA_KEYS * ((HD) + 16)                                      \
           : DA_STAGES * 2 * DA_KEYS * ((HD) + 8) * 2) +                                   \
     ((F8) ? DA_STAGES_F8 : DA_STAGES) * DA_KEYS * 4)

// An FP8 cache's four E4M3 bytes b0..b3 of a word as f16 pairs {b0, b1} (lo) and {b2, b3}
// (hi), exactly (every E4M3 value is an f16): one conversion a pair. (An integer decode,
// the byte's bits moved into an f16's with the 2^-8 folded into the scales, takes three
// operations a pair and measured slower.)
__device__ __forceinline__ void da_cvt4(unsigned int w, unsigned int& lo, unsigned int& hi) {
    asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\n"
        "cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
        : "=r"(lo), "=r"(hi)
        : "r"(w));
}

__device__ __forceinline__ unsigned int da_prmt(unsigned int a, unsigned int b, unsigned int sel) {
    unsigned int d;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

// W words read (and kept) as one vector.
template <int W> struct __align__(4 * W) DaWords {
    unsigned int w[W];
};

// The place in Q's (permuted) head dimension of byte `pd` of an FP8 key row: lane t4 reads
// bytes [t4 HD/4, (t4 + 1) HD/4), word kk for k-step kk, whose bytes 0 and 1 are its b0
// fragment's two elements (dims 2 t4, 2 t4 + 1 of the k-step) and bytes 2 and 3 its b1's
// (dims 8 + 2 t4, 8 + 2 t4 + 1), as `da_cvt4` pairs them.
template <int HD> __device__ __forceinline__ int f8_qdim(int pd) {
    const int t4 = pd / (HD / 4), rem = pd % (HD / 4);
    const int kk = rem / 4, byte = rem % 4;
    return kk * 16 + (byte >> 1) * 8 + 2 * t4 + (byte & 1);
}

// The element type the mma run in: T over a cache of T, f16 over an FP8 cache.
template <typename T, typename KV> struct DaMma {
    typedef T type;
};
template <typename T> struct DaMma<T, fp8> {
    typedef f16 type;
};

template <typename T, typename KV, int HD>
__device__ __forceinline__ void attention_decode_impl(
    const T* q, const KV* __restrict__ k_cache, const KV* __restrict__ v_cache,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens, T* out,
    float* __restrict__ scratch, float qscale, float vscale, float softcap, int window, int rows,
    int num_heads, int num_kv_heads, int num_blocks, int block_size, int table_width, int group,
    int num_splits, int heads_fast, const T* __restrict__ sinks) {
    typedef typename DaMma<T, KV>::type M;
    constexpr bool F8 = sizeof(KV) == 1;
    constexpr int LD = HD + 8;    // padded shared row (elements)
    constexpr int CPR = HD / 8;   // 16-byte chunks of a 16-bit row
    constexpr int KT = HD / 16;   // k-steps of Q K^T
    constexpr int ND = HD / 8;    // n-tiles of O
    constexpr int ST = F8 ? DA_STAGES_F8 : DA_STAGES;  // pipeline stages
    constexpr int NB = F8 ? 0 : ST;                     // 16-bit tile buffers
    constexpr int RAW_CPR = HD / 16;  // 16-byte chunks of an FP8 row
    constexpr int RS = HD + 16;       // padded raw FP8 row (bytes)

    extern __shared__ __align__(16) unsigned char da_smem[];
    M* sQ = reinterpret_cast<M*>(da_smem);
    M* sK = sQ + DA_M * LD;            // [NB][DA_KEYS * LD]
    M* sV = sK + NB * DA_KEYS * LD;    // [NB][DA_KEYS * LD]
    unsigned char* raw = reinterpret_cast<unsigned char*>(sV + NB * DA_KEYS * LD);
    // FP8: raw[stage][0 = K, 1 = V][DA_KEYS * RS] bytes.
    int* sOk = reinterpret_cast<int*>(raw + (F8 ? ST * 2 * DA_KEYS * RS : 0));  // [ST][DA_KEYS]

    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int row = heads_fast ? blockIdx.y : blockIdx.x;
    const int kvh = heads_fast ? blockIdx.x : blockIdx.y;
    const int split = blockIdx.z;
    const int h0 = kvh * group;

    // --- The row's keys and this split's part of them (as attention.cu). ---
    long long ctx = seq_lens[row];
    const long long max_ctx = (long long)table_width * block_size;  // <= 2^30 (host check)
    long long k_lo = window > 0 ? ctx - window : 0;
    if (k_lo < 0) k_lo = 0;
    if (ctx < 0) ctx = 0;
    if (ctx > max_ctx) ctx = max_ctx;
    if (k_lo > ctx) k_lo = ctx;
    const int c = (int)ctx;
    const int span = c - (int)k_lo;
    int per = (span + num_splits - 1) / num_splits;
    per = (per + DA_KEYS - 1) / DA_KEYS * DA_KEYS;
    const long long start_ll = k_lo + (long long)split * per;
    const int start = (int)min(start_ll, (long long)c);
    const int end = (int)min(start_ll + per, (long long)c);
    // Blocks of a power of two >= 16 tokens: tiles start at a multiple of 16 keys (the
    // keys before `start` masked), so a warp's 16 keys lie in one block.
    const bool whole = block_size >= 16 && (block_size & (block_size - 1)) == 0;
    const int shift = __ffs(block_size) - 1;
    const int base = whole ? start & ~15 : start;
    float* ml = scratch + (long long)rows * num_heads * num_splits * HD;

    if (start >= end) {
        // Nothing in this split (block-uniform: no barrier skipped).
        if (num_splits == 1) {
            for (int i = tid; i < group * CPR; i += DA_THREADS)
                st16(out + ((long long)row * num_heads + h0 + i / CPR) * HD + (i % CPR) * 8,
                     make_uint4(0u, 0u, 0u, 0u));
        } else if (tid < group) {
            const long long pidx = ((long long)row * num_heads + h0 + tid) * num_splits + split;
            ml[2 * pidx] = NEG_INF;
            ml[2 * pidx + 1] = 0.0f;
        }
        return;
    }

    const int* table = block_tables + (long long)row * table_width;
    const long long tok_stride = (long long)num_kv_heads * HD;
    const long long head_off = (long long)kvh * HD;

    // Every warp gathers, decodes and computes its own 16 keys of each tile (rows 16w..16w+15
    // of every buffer), so the loop has no block-wide barrier: a warp only waits for its own
    // copies (cp.async.wait_group, then __syncwarp).
    //
    // Gather this warp's keys of tile kt (keys past `end` or in invalid blocks: zeros, and
    // sOk 0) into stage b: the 16-bit tiles, or FP8's raw bytes. Lane L copies chunk
    // L % CP of keys L / CP, L / CP + 32 / CP, ...: one division per tile, then the block
    // and row advance by 32 / CP keys at a time.
    auto issue = [&](int kt, int b) {
        constexpr int CP = F8 ? RAW_CPR : CPR;  // 16-byte chunks of a row
        constexpr int KSTEP = 32 / CP;
        constexpr int N = 16 / KSTEP;
        const int key0 = warp * 16 + lane / CP, part = lane % CP;
        if (whole) {
            // One block holds the warp's keys: a table read, then rows at a fixed stride.
            const int kw = kt + warp * 16;
            if (kw >= end) return;  // none of them (nor computed)
            const int blk = table[kw >> shift];
            const bool bok = blk >= 0 && blk < num_blocks;
            const long long off0 =
                ((long long)(bok ? blk : 0) * block_size + (kw & (block_size - 1)) +
                 lane / CP) * tok_stride + head_off + part * (16 / (int)sizeof(KV));
            const KV* kp = k_cache + off0;
            const KV* vp = v_cache + off0;
#pragma unroll
            for (int i = 0; i < N; ++i) {
                const int key = key0 + i * KSTEP;
                const int k = kt + key;
                const bool ok = bok && k >= start && k < end;
                const long long o = (long long)i * KSTEP * tok_stride;
                if (F8) {
                    unsigned char* dst = raw + (b * 2) * DA_KEYS * RS + key * RS + part * 16;
                    cp_async16(dst, ok ? kp + o : k_cache, ok);
                    cp_async16(dst + DA_KEYS * RS, ok ? vp + o : v_cache, ok);
                } else {
                    cp_async16(sK + b * DA_KEYS * LD + key * LD + part * 8, ok ? kp + o : k_cache, ok);
                    cp_async16(sV + b * DA_KEYS * LD + key * LD + part * 8, ok ? vp + o : v_cache, ok);
                }
            }
            if (lane < 16) {
                const int k = kw + lane;
                sOk[b * DA_KEYS + warp * 16 + lane] = bok && k >= start && k < end ? 1 : 0;
            }
            return;
        }
        int k = kt + key0;
        int bi = k / block_size;
        int r = k - bi * block_size;
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const int key = key0 + i * KSTEP;
            const int blk = k < end ? table[bi] : -1;
            const bool ok = blk >= 0 && blk < num_blocks;
            const long long base =
                ok ? ((long long)blk * block_size + r) * tok_stride + head_off : 0;
            if (F8) {
                const long long off = ok ? base + part * 16 : 0;
                unsigned char* dst = raw + (b * 2) * DA_KEYS * RS + key * RS + part * 16;
                cp_async16(dst, k_cache + off, ok);
                cp_async16(dst + DA_KEYS * RS, v_cache + off, ok);
            } else {
                const long long off = ok ? base + part * 8 : 0;
                cp_async16(sK + b * DA_KEYS * LD + key * LD + part * 8, k_cache + off, ok);
                cp_async16(sV + b * DA_KEYS * LD + key * LD + part * 8, v_cache + off, ok);
            }
            if (part == 0) sOk[b * DA_KEYS + key] = ok ? 1 : 0;
            k += KSTEP;
            r += KSTEP;
            while (r >= block_size) {
                r -= block_size;
                ++bi;
            }
        }
    };
    // Prologue: Q (the group's heads, in M; zeros for rows past it; over an FP8 cache in
    // the keys' permuted order), then the first tiles.
    for (int i = tid; i < DA_M * CPR; i += DA_THREADS) {
        const int r = i / CPR, part = i % CPR;
        float f[8];
        if (r < group) {
            load_vec(q + ((long long)row * num_heads + h0 + r) * HD + part * 8, f);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) f[e] = 0.0f;
        }
        if (F8) {
#pragma unroll
            for (int e = 0; e < 8; ++e) sQ[r * LD + f8_qdim<HD>(part * 8 + e)] = Ty<M>::from_f32(f[e]);
        } else {
            st16(sQ + r * LD + part * 8, Ty<M>::pack(f));
        }
    }
    const int ntiles = (end - base + DA_KEYS - 1) / DA_KEYS;
    // Tiles 0..ST-2, a group each; empty groups past the end keep the counting uniform.
#pragma unroll
    for (int i = 0; i < ST - 1; ++i) {
        if (i < ntiles) issue(base + i * DA_KEYS, i);
        cp_async_commit();
    }

    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {NEG_INF, NEG_INF};
    float l[2] = {0.0f, 0.0f};  // this thread's partial row sums (rows g, g + 8)

    const unsigned int smem0 = (unsigned int)__cvta_generic_to_shared(da_smem);
    const unsigned int qw =
        smem0 + (((lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8) * 2;
    const unsigned int kw0 = smem0 + (DA_M * LD + (warp * 16 + (lane >> 4) * 8 + (lane & 7)) * LD +
                                      ((lane >> 3) & 1) * 8) * 2;
    const unsigned int vw0 =
        smem0 + ((DA_M + NB * DA_KEYS) * LD +
                 (warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + (lane >> 4) * 8) * 2;
    __syncthreads();  // Q
    unsigned int qa[KT][4];
#pragma unroll
    for (int kk = 0; kk < KT; ++kk)
        ldmatrix_x4(qw + kk * 32, qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3]);

    for (int j = 0; j < ntiles; ++j) {
        const int kt = base + j * DA_KEYS;
        const int buf = j % ST;
        cp_async_wait<ST - 2>();
        __syncwarp();  // this warp's keys of tile j landed; it is done with tile j - 1
        // Tile j + ST - 1 into the stage of tile j - 1.
        if (j + ST - 1 < ntiles) issue(kt + (ST - 1) * DA_KEYS, (j + ST - 1) % ST);
        cp_async_commit();
        const unsigned int kw = kw0 + buf * (DA_KEYS * LD * 2);
        const unsigned int vw = vw0 + buf * (DA_KEYS * LD * 2);
        // FP8: this warp's 16 raw K rows, then its V rows.
        const unsigned char* rk = raw + (buf * 2) * DA_KEYS * RS + warp * 16 * RS;
        const unsigned char* rv = rk + DA_KEYS * RS;
        const int* okb = sOk + buf * DA_KEYS + warp * 16;
        if (kt + warp * 16 >= end) continue;  // none of this warp's keys

        // S = Q K^T for this warp's 16 keys (n-tiles 0 and 1).
        float s[2][4];
#pragma unroll
        for (int n = 0; n < 2; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        if (F8) {
            // Lane (g, t4): key n * 8 + g's bytes [t4 HD/4, (t4 + 1) HD/4), a word a k-step.
#pragma unroll
            for (int n = 0; n < 2; ++n) {
                const uint4* kp = reinterpret_cast<const uint4*>(rk + (n * 8 + g) * RS + t4 * (HD / 4));
                uint4 kv[KT / 4];
#pragma unroll
                for (int c = 0; c < KT / 4; ++c) kv[c] = kp[c];
#pragma unroll
                for (int kk = 0; kk < KT; ++kk) {
                    const uint4& c4 = kv[kk / 4];
                    const unsigned int w = (kk & 3) == 0 ? c4.x : (kk & 3) == 1 ? c4.y
                                           : (kk & 3) == 2 ? c4.z : c4.w;
                    unsigned int b0, b1;
                    da_cvt4(w, b0, b1);
                    Mma16816<M>::mma(s[n], qa[kk], b0, b1);
                }
            }
        } else {
#pragma unroll
            for (int kk = 0; kk < KT; ++kk) {
                unsigned int b0, b1, b2, b3;
                ldmatrix_x4(kw + kk * 32, b0, b1, b2, b3);
                Mma16816<M>::mma(s[0], qa[kk], b0, b1);
                Mma16816<M>::mma(s[1], qa[kk], b2, b3);
            }
        }
        // Mask (keys past the end or in invalid blocks), scale into log2 units.
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = n * 8 + 2 * t4 + (e & 1);
                s[n][e] = okb[key] != 0 ? s[n][e] * qscale : NEG_INF;
            }
        if (softcap > 0.0f) {
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (s[n][e] != NEG_INF) s[n][e] = softcap_l2(s[n][e], softcap);
        }
        // Online softmax for rows g (e = 0, 1) and g + 8 (e = 2, 3).
        float mu[2], corr[2];
        bool grew = false;
#pragma unroll
        for (int ri = 0; ri < 2; ++ri) {
            float mx = fmaxf(fmaxf(s[0][2 * ri], s[0][2 * ri + 1]),
                             fmaxf(s[1][2 * ri], s[1][2 * ri + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
            const float mn = fmaxf(m[ri], mx);
            grew |= mn != m[ri];
            mu[ri] = mn == NEG_INF ? 0.0f : mn;
            corr[ri] = exp2f(m[ri] - mu[ri]);
            m[ri] = mn;
            l[ri] *= corr[ri];
        }
        // corr is exactly 1 for rows whose max did not grow (or O is still zero).
        if (__any_sync(FULL_MASK, grew)) {
#pragma unroll
            for (int n = 0; n < ND; ++n) {
                o[n][0] *= corr[0];
                o[n][1] *= corr[0];
                o[n][2] *= corr[1];
                o[n][3] *= corr[1];
            }
        }
        unsigned int pa[4];
#pragma unroll
        for (int n = 0; n < 2; ++n) {
            const float p0 = exp2f(s[n][0] - mu[0]), p1 = exp2f(s[n][1] - mu[0]);
            const float p2 = exp2f(s[n][2] - mu[1]), p3 = exp2f(s[n][3] - mu[1]);
            l[0] += p0 + p1;
            l[1] += p2 + p3;
            pa[n * 2 + 0] = Ty<M>::pack2(p0, p1);
            pa[n * 2 + 1] = Ty<M>::pack2(p2, p3);
        }
        // O += P V over the 16 keys.
        if (F8) {
            // Lane (g, t4): bytes [g HD/8, (g + 1) HD/8) of key rows 2 t4, 2 t4 + 1 (its b0
            // fragments) and 2 t4 + 8, 2 t4 + 9 (b1); n-tile nd is byte nd of them, so
            // O's column c of n-tile nd is the head dimension's c HD/8 + nd.
            constexpr int VW = HD / 32;  // words of a lane's part of a row
            typedef DaWords<VW> VV;
            const unsigned char* vp = rv + (2 * t4) * RS + g * (HD / 8);
            const VV r0 = *reinterpret_cast<const VV*>(vp);
            const VV r1 = *reinterpret_cast<const VV*>(vp + RS);
            const VV r8 = *reinterpret_cast<const VV*>(vp + 8 * RS);
            const VV r9 = *reinterpret_cast<const VV*>(vp + 9 * RS);
            const unsigned int *w0 = r0.w, *w1 = r1.w, *w8 = r8.w, *w9 = r9.w;
#pragma unroll
            for (int wi = 0; wi < VW; ++wi) {
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    // Bytes 2 half, 2 half + 1 of both rows: {r0, r0', r1, r1'} -> the pairs
                    // {r0, r1} (lo) and {r0', r1'} (hi).
                    const unsigned int sel = half ? 0x7362u : 0x5140u;
                    unsigned int lo01, hi01, lo89, hi89;
                    da_cvt4(da_prmt(w0[wi], w1[wi], sel), lo01, hi01);
                    da_cvt4(da_prmt(w8[wi], w9[wi], sel), lo89, hi89);
                    const int nd = wi * 4 + half * 2;
                    Mma16816<M>::mma(o[nd], pa, lo01, lo89);
                    Mma16816<M>::mma(o[nd + 1], pa, hi01, hi89);
                }
            }
        } else {
#pragma unroll
            for (int n = 0; n < ND; n += 2) {
                unsigned int b0, b1, b2, b3;
                ldmatrix_x4_trans(vw + n * 8 * 2, b0, b1, b2, b3);
                Mma16816<M>::mma(o[n], pa, b0, b1);
                Mma16816<M>::mma(o[n + 1], pa, b2, b3);
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the tiles: their memory holds the merge

    // --- Merge the warps (fixed order) and write. ---
    float* sO = reinterpret_cast<float*>(sK);         // [4 warps][DA_M][HD] (FP8: raw)
    float* sM = sO + 4 * DA_M * HD;                   // [4][DA_M]
    float* sL = sM + 4 * DA_M;                        // [4][DA_M]
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
        float sum = l[ri];
        sum += __shfl_xor_sync(FULL_MASK, sum, 1);
        sum += __shfl_xor_sync(FULL_MASK, sum, 2);
        if (t4 == 0) {
            sM[warp * DA_M + g + 8 * ri] = m[ri];
            sL[warp * DA_M + g + 8 * ri] = sum;
        }
    }
#pragma unroll
    for (int n = 0; n < ND; ++n) {
        // Columns 2 t4, 2 t4 + 1 of n-tile n, in fragment order (conflict-free; over an FP8
        // cache column c of n-tile n is the head dimension's c HD/8 + n, undone below).
        float* d0 = sO + (warp * DA_M + g) * HD + n * 8 + 2 * t4;
        d0[0] = o[n][0];
        d0[1] = o[n][1];
        d0[8 * HD] = o[n][2];
        d0[8 * HD + 1] = o[n][3];
    }
    __syncthreads();
    for (int i = tid; i < group * HD; i += DA_THREADS) {
        const int r = i / HD, d = i % HD;
        const int fd = F8 ? (d % ND) * 8 + d / ND : d;  // d's place in sO
        float mx = NEG_INF;
#pragma unroll
        for (int w = 0; w < 4; ++w) mx = fmaxf(mx, sM[w * DA_M + r]);
        const float mu = mx == NEG_INF ? 0.0f : mx;
        float L = 0.0f, acc = 0.0f;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const float f = exp2f(sM[w * DA_M + r] - mu);
            L += sL[w * DA_M + r] * f;
            acc += sO[(w * DA_M + r) * HD + fd] * f;
        }
        const long long head = (long long)row * num_heads + h0 + r;
        if (num_splits == 1) {
            out[head * HD + d] = from_f32<T>(acc * (vscale * softmax_inv(mu, L, sinks, h0 + r)));
        } else {
            const long long pidx = head * num_splits + split;
            scratch[pidx * HD + d] = acc * vscale;
            if (d == 0) {
                ml[2 * pidx] = mx;
                ml[2 * pidx + 1] = L;
            }
        }
    }
}

#define ATTENTION_DECODE(NAME, T, KV, HD)                                                   \
    extern "C" __global__ void __launch_bounds__(DA_THREADS) NAME(                         \
        const T* q, const KV* k_cache, const KV* v_cache, const int* block_tables,         \
        const int* seq_lens, T* out, float* scratch, float qscale, float vscale, float softcap,           \
        int window, int rows, int num_heads, int num_kv_heads, int num_blocks,             \
        int block_size, int table_width, int group, int num_splits, int heads_fast,        \
        const T* sinks) {                                                                   \
        pdl_enter();                                                                        \
        attention_decode_impl<T, KV, HD>(q, k_cache, v_cache, block_tables, seq_lens, out, \
                                         scratch, qscale, vscale, softcap, window, rows, num_heads, \
                                         num_kv_heads, num_blocks, block_size, table_width,\
                                         group, num_splits, heads_fast, sinks);            \
    }

ATTENTION_DECODE(attention_decode_hd64_bf16, bf16, bf16, 64)
ATTENTION_DECODE(attention_decode_hd128_bf16, bf16, bf16, 128)
ATTENTION_DECODE(attention_decode_hd64_f16, f16, f16, 64)
ATTENTION_DECODE(attention_decode_hd128_f16, f16, f16, 128)
ATTENTION_DECODE(attention_decode_hd64_bf16_kv8, bf16, fp8, 64)
ATTENTION_DECODE(attention_decode_hd128_bf16_kv8, bf16, fp8, 128)
ATTENTION_DECODE(attention_decode_hd64_f16_kv8, f16, fp8, 64)
ATTENTION_DECODE(attention_decode_hd128_f16_kv8, f16, fp8, 128)
