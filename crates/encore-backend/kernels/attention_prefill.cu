// attention_prefill: tensor-core (mma.sync m16n8k16, f32 accumulation) flash attention for
// prefill / mixed steps (`cu_seqlens_q` given), bf16 and f16, head_dim 64 or 128.
//
// Same semantics as attention.cu's split kernel (see `Attention` in src/backend/mod.rs):
// row r of sequence s (cu[s] <= r < cu[s+1]) is at position p = seq_lens[s] - cu[s+1] + r,
// ctx = p + 1, and attends to keys [lo, ctx') with lo = max(0, ctx - window) (window > 0;
// 0 = full attention) computed before ctx is clamped to ctx' = clamp(ctx, 0,
// table_width * block_size), then lo = min(lo, ctx'). Rows with an empty range and rows
// outside every sequence (padding) write zeros; keys in blocks whose id is outside
// 0..num_blocks contribute nothing (never read; masked out of the softmax).
//
// Launch: grid (num_heads, ceil(rows / 128) + num_seqs), 128 threads (4 warps),
// FA_SMEM_BYTES(HD, F8) of dynamic shared memory, shapes only. Work item y of the grid is found
// by scanning cu_seqlens_q (device memory): the row ranges [a_s, b_s) (cu clamped to be
// non-decreasing and within 0..rows, so ranges never overlap) are cut into tiles of 128
// rows; y indexes those tiles in sequence order (within a sequence the last tile, the one
// with the longest context, comes first; tiles are on y so that the hardware dispatches
// y = 0 of every head first). The remaining y index 128-row tiles of the rows no sequence
// covers, which are written as zeros. Sum over s of ceil(len_s / 128) plus
// ceil(uncovered / 128) never exceeds ceil(rows / 128) + num_seqs, so every tile has a
// CTA; CTAs with nothing to do return.
//
// A CTA owns 128 query rows of one query head h (KV head h / group), staged once into
// shared memory. Warp w owns rows 32w..32w+31 of the tile as two m16 tiles, so every K / V
// fragment read from shared memory feeds two mma. S = Q K^T for FA_BN (32) keys at a time
// (Q's A and K's B fragments by ldmatrix, FA_BN / 8 n-tiles of 8 keys per m16 tile, f32),
// online softmax per row in log2 units (qscale folded into the exponent's FMA without
// soft-capping; running max / sum in f32; O is rescaled only when
// some row max of the warp grew), P rounded to T as the A operand of O += P V (the S
// accumulators are exactly P's A fragments), O in f32 registers. K and V tiles of FA_BN keys
// are gathered from the paged cache with 16-byte cp.async copies (zero-filled for invalid
// keys) into FA_STAGES shared buffers with rows padded to HD + 8 elements (conflict-free
// ldmatrix); V's B fragments come from ldmatrix.trans. Tiles j + 1 .. j + FA_STAGES - 1
// stream in while tile j is computed (one barrier per tile). Only key tiles overlapping the
// CTA's union of ranges [lo(first row), ctx'(last row)) are loaded; a warp skips the tiles
// that none of its rows sees, and masks per key (range and block validity) only on tiles
// that some of its rows see in part or that hold a key of an invalid block.
//
// FP8 cache (the `_kv8` variants, KV = fp8): the stages hold raw E4M3 rows (8-byte cp.async
// copies); at the top of iteration j each thread decodes the parts of tile j that it copied
// itself to T (exact) into one of two T buffers, before the barrier (that buffer held tile
// j - 2, which every warp finished before the previous barrier). The layer's key scale is
// folded into qscale by the host; the value scale (vscale, 1 otherwise) multiplies the
// output.
//
// mma.m16n8k16 fragments: common.cuh (Mma16816).

#define FA_THREADS 128
#define FA_BM 128  // query rows per CTA
#define FA_WM 32   // query rows per warp (two m16 tiles)
#ifndef FA_BN
#define FA_BN 32   // keys per tile (a multiple of 16 up to 64; a kernel define for measurements)
#endif
// Key tiles in flight: tile j + FA_STAGES - 1 is requested while tile j is computed (a kernel
// define for measurements).
#ifndef FA_STAGES
#define FA_STAGES 2
#endif
// K and V buffers of T: one a stage over a cache of T; two over an FP8 cache, whose stages
// are raw E4M3 rows decoded into them.
#define FA_TBUF(F8) ((F8) ? 2 : FA_STAGES)
// Dynamic shared memory per CTA: Q (FA_BM rows), FA_TBUF K and as many V buffers (FA_BN rows
// each), rows padded to HD + 8 elements; over an FP8 cache FA_STAGES raw K and V tiles
// (HD bytes a row); then sOk[FA_STAGES][FA_BN]. `fa_smem_bytes` in attention.rs mirrors this.
#define FA_SMEM_BYTES(HD, F8)                                                              \
    ((FA_BM + 2 * FA_TBUF(F8) * FA_BN) * ((HD) + 8) * 2 +                                 \
     ((F8) ? FA_STAGES * 2 * FA_BN * (HD) : 0) + FA_STAGES * FA_BN * 4)

// 2^x (MUFU.EX2, flushing denormals; 2^-inf = 0).
__device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Decode 8 E4M3 bytes of raw shared memory (this thread's own cp.async parts) into 8
// elements of T (exact) in their T buffer.
template <typename T>
__device__ __forceinline__ void fa_land8(const unsigned char* raw, T* dst) {
    float f[8];
    Fp8Vec<8>::unpack(*reinterpret_cast<const uint2*>(raw), f);
    st16(dst, Ty<T>::pack(f));
}

template <typename T, typename KV, int HD>
__device__ __forceinline__ void attention_prefill_impl(
    const T* q, const KV* __restrict__ k_cache, const KV* __restrict__ v_cache,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const int* __restrict__ cu_seqlens, T* out, float qscale, float vscale, float softcap, int window,
    int num_seqs,
    int rows, int num_heads, int num_kv_heads, int num_blocks, int block_size,
    int table_width, int group, const T* __restrict__ sinks) {
    constexpr int LD = HD + 8;         // padded shared row (elements)
    constexpr int CPR = HD / 8;        // 16-byte chunks per row
    constexpr int KT = HD / 16;        // k-steps of Q K^T
    constexpr int ND = HD / 8;         // n-tiles of O
    constexpr int NS = FA_BN / 8;      // n-tiles of S
    static_assert(FA_BM == 4 * FA_WM && FA_WM == 32 && FA_BN % 16 == 0 && FA_BN <= 64,
                  "tile shape");

    constexpr bool F8 = sizeof(KV) == 1;
    constexpr int TB = FA_TBUF(F8);    // K / V buffers of T
    constexpr int S = FA_STAGES;
    static_assert(S >= 2 && S <= 4, "stages");

    extern __shared__ __align__(16) unsigned char fa_smem[];
    T* sQ = reinterpret_cast<T*>(fa_smem);
    T* sK = sQ + FA_BM * LD;                             // [TB][FA_BN * LD]
    T* sV = sK + TB * FA_BN * LD;                        // [TB][FA_BN * LD]
    // FP8: raw K then V rows of each stage, [S][2][FA_BN * HD] bytes (none otherwise).
    unsigned char* sRaw = reinterpret_cast<unsigned char*>(sV + TB * FA_BN * LD);
    int* sOk = reinterpret_cast<int*>(sRaw + (F8 ? S * 2 * FA_BN * HD : 0));  // [S][FA_BN]

    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int h = blockIdx.x;
    const int kvh = h / group;

    // --- Find this CTA's (sequence, tile) from cu_seqlens (block-uniform). ---
    int x = blockIdx.y;
    int seq = -1, row0 = 0, row_end = 0, b_raw = 0;
    int prev = 0, first = 0;
    for (int s = 0; s < num_seqs; ++s) {
        const int cs = cu_seqlens[s], cn = cu_seqlens[s + 1];
        const int a = min(max(cs, prev), rows);
        const int b = min(max(cn, a), rows);
        if (s == 0) first = a;
        prev = b;
        const int nt = (b - a + FA_BM - 1) / FA_BM;
        if (seq < 0) {
            if (x < nt) {
                seq = s;
                const int tile = nt - 1 - x;  // longest contexts first
                row0 = a + tile * FA_BM;
                row_end = min(row0 + FA_BM, b);
                b_raw = cn;
            } else {
                x -= nt;
            }
        }
    }
    if (seq < 0) {
        // Padding: rows [0, first) and [prev, rows) (prev = end of the last range).
        const int covered = prev - first;
        const int pad = rows - covered;
        const int p0 = x * FA_BM;
        if (p0 >= pad) return;
        const int p1 = min(p0 + FA_BM, pad);
        for (int i = tid; i < (p1 - p0) * CPR; i += FA_THREADS) {
            const int pi = p0 + i / CPR;
            const int r = pi < first ? pi : pi + covered;
            st16(out + ((long long)r * num_heads + h) * HD + (i % CPR) * 8,
                 make_uint4(0u, 0u, 0u, 0u));
        }
        return;
    }

    // --- Key ranges: of a row, of this warp's rows, of the whole tile. ---
    const long long max_ctx = (long long)table_width * block_size;  // <= 2^30 (host check)
    const long long base = (long long)seq_lens[seq] - b_raw;  // position of row r: base + r
    auto range = [&](int r, int& lo, int& hi) {
        const long long ctx = base + r + 1;
        long long l0 = window > 0 ? ctx - window : 0;
        if (l0 < 0) l0 = 0;
        long long c = ctx < 0 ? 0 : ctx;
        if (c > max_ctx) c = max_ctx;
        if (l0 > c) l0 = c;
        lo = (int)l0;
        hi = (int)c;
    };
    int k_start, k_end, dummy;
    range(row0, k_start, dummy);
    range(row_end - 1, dummy, k_end);
    // lo and hi never decrease with the row, so this warp's rows see keys in
    // [w_lo0, w_hi1) and every one of them sees all of [w_lo1, w_hi0). Warps whose rows
    // all lie past the tile's last row (a short sequence) only help with copies and
    // barriers.
    const int wr0 = row0 + warp * FA_WM;
    const bool active = wr0 < row_end;
    int w_lo0, w_hi0, w_lo1, w_hi1;
    range(wr0, w_lo0, w_hi0);
    range(min(wr0 + FA_WM, row_end) - 1, w_lo1, w_hi1);
    // The key ranges of this thread's four rows ((mt, ri) -> warp row mt * 16 + ri * 8 + g),
    // for the masked tiles.
    int r_lo[4], r_hi[4];
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) range(wr0 + (rr >> 1) * 16 + (rr & 1) * 8 + g, r_lo[rr], r_hi[rr]);
    const int kt0 = k_start / FA_BN * FA_BN;
    const int ntiles = k_end > k_start ? (k_end - kt0 + FA_BN - 1) / FA_BN : 0;

    const int* table = block_tables + (long long)seq * table_width;
    const long long tok_stride = (long long)num_kv_heads * HD;
    const long long head_off = (long long)kvh * HD + (tid % CPR) * 8;  // + this thread's part

    constexpr int PARTS = FA_BN * CPR / FA_THREADS;  // 8-element parts of a tile per thread
    // An FP8 tile's parts of this thread, from raw stage r into T buffer b.
    auto land = [&](int r, int b) {
        const unsigned char* rk = sRaw + r * 2 * FA_BN * HD;
        const unsigned char* rv = rk + FA_BN * HD;
#pragma unroll
        for (int i = 0; i < PARTS; ++i) {
            const int c = tid + i * FA_THREADS;
            const int key = c / CPR, part = c % CPR;
            fa_land8<T>(rk + key * HD + part * 8, sK + b * FA_BN * LD + key * LD + part * 8);
            fa_land8<T>(rv + key * HD + part * 8, sV + b * FA_BN * LD + key * LD + part * 8);
        }
    };

    // Gather the K and V rows of keys kt..kt + FA_BN - 1 into stage b (zeros for invalid keys;
    // from an FP8 cache into raw stage b, landed by `land`) and record each key's validity in
    // sOk[b].
    auto issue = [&](int kt, int b) {
        T* dk = sK + b * FA_BN * LD;
        T* dv = sV + b * FA_BN * LD;
        unsigned char* rk = sRaw + b * 2 * FA_BN * HD;
        unsigned char* rv = rk + FA_BN * HD;
#pragma unroll 1
        for (int i = 0; i < PARTS; ++i) {
            const int c = tid + i * FA_THREADS;
            const int key = c / CPR, part = c % CPR;  // part == tid % CPR
            const int k = kt + key;
            int blk = -1;
            if (k < k_end) blk = table[k / block_size];
            const bool ok = blk >= 0 && blk < num_blocks;
            const long long off =
                ok ? ((long long)blk * block_size + (k % block_size)) * tok_stride + head_off
                   : 0;
            if (F8) {
                cp_async_ca<8>(rk + key * HD + part * 8, k_cache + off, ok);
                cp_async_ca<8>(rv + key * HD + part * 8, v_cache + off, ok);
            } else {
                cp_async16(dk + key * LD + part * 8, k_cache + off, ok);
                cp_async16(dv + key * LD + part * 8, v_cache + off, ok);
            }
            if (part == 0) sOk[b * FA_BN + key] = ok ? 1 : 0;
        }
    };

    // Prologue: Q (zeros past row_end), K(0) and V(0) into buffer 0.
    for (int i = tid; i < FA_BM * CPR; i += FA_THREADS) {
        const int r = i / CPR, part = i % CPR;
        const bool ok = row0 + r < row_end;
        const T* src = ok ? q + ((long long)(row0 + r) * num_heads + h) * HD + part * 8 : q;
        cp_async16(sQ + r * LD + part * 8, src, ok);
    }
    // Tiles 0 .. S - 2, a group each (Q in the first).
#pragma unroll
    for (int st = 0; st < S - 1; ++st) {
        if (st < ntiles) issue(kt0 + st * FA_BN, st);
        cp_async_commit();
    }

    // Rows of this thread: (mt, ri) -> warp row mt * 16 + ri * 8 + g, index mt * 2 + ri.
    float o[2][ND][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int n = 0; n < ND; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
    float m[4] = {NEG_INF, NEG_INF, NEG_INF, NEG_INF};  // running maxima, the scores' units
    const float sc = softcap > 0.0f ? 1.0f : qscale;    // scores to log2 units
    float l[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // this thread's partial row sums

    // This lane's ldmatrix row addresses (bytes, shared window) in Q, K(buf 0), V(buf 0).
    const unsigned int smem0 = (unsigned int)__cvta_generic_to_shared(fa_smem);
    const unsigned int qw =
        smem0 + ((warp * FA_WM + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8) * 2;
    const unsigned int kw0 = smem0 + (FA_BM * LD + ((lane >> 4) * 8 + (lane & 7)) * LD +
                                      ((lane >> 3) & 1) * 8) * 2;
    const unsigned int vw0 = smem0 + ((FA_BM + TB * FA_BN) * LD +
                                      (((lane >> 3) & 1) * 8 + (lane & 7)) * LD + (lane >> 4) * 8) * 2;

    for (int j = 0; j < ntiles; ++j) {
        const int kt = kt0 + j * FA_BN;
        const int stg = j % S;               // tile j's stage
        const int buf = F8 ? (j & 1) : stg;  // and its T buffer
        // This thread's copies of tile j (and Q) have landed (groups 0 .. j of the S - 1 + j
        // committed); over an FP8 cache it decodes its parts into T buffer j % 2, which held
        // tile j - 2, done by every warp before the previous barrier.
        cp_async_wait<S - 2>();
        if (F8) land(stg, buf);
        // Every thread's parts are in, and every warp is done with tile j - 1, whose stage
        // now receives tile j + S - 1 while this one is computed.
        __syncthreads();
        if (j + S - 1 < ntiles) issue(kt + (S - 1) * FA_BN, (j + S - 1) % S);
        cp_async_commit();
        const unsigned int kw = kw0 + buf * (FA_BN * LD * 2);
        const unsigned int vw = vw0 + buf * (FA_BN * LD * 2);

        // This warp's work on the tile: none when no row of it sees a key of the tile; no
        // per-key masking when every row sees every key and every key's block is valid.
        const int* okb = sOk + stg * FA_BN;
        const bool all_ok =
            __all_sync(FULL_MASK, okb[lane % FA_BN] != 0 && okb[(lane + 32) % FA_BN] != 0);
        const bool work = active && kt < w_hi1 && kt + FA_BN > w_lo0;
        const bool full = all_ok && kt >= w_lo1 && kt + FA_BN <= w_hi0;

        if (!work) continue;  // no barrier follows in this iteration

        float s[2][NS][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int n = 0; n < NS; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KT; ++kk) {
            unsigned int qa[2][4];
            ldmatrix_x4(qw + kk * 32, qa[0][0], qa[0][1], qa[0][2], qa[0][3]);
            ldmatrix_x4(qw + (16 * LD + kk * 16) * 2, qa[1][0], qa[1][1], qa[1][2], qa[1][3]);
#pragma unroll
            for (int n = 0; n < NS; n += 2) {
                // Matrices: keys n*8.. x dims kk*16 + {0, 8}.., then keys (n+1)*8.. the same.
                unsigned int b0, b1, b2, b3;
                ldmatrix_x4(kw + (n * 8 * LD + kk * 16) * 2, b0, b1, b2, b3);
                Mma16816<T>::mma(s[0][n], qa[0], b0, b1);
                Mma16816<T>::mma(s[1][n], qa[1], b0, b1);
                Mma16816<T>::mma(s[0][n + 1], qa[0], b2, b3);
                Mma16816<T>::mma(s[1][n + 1], qa[1], b2, b3);
            }
        }

        // Mask; online softmax in log2 units. Without soft-capping the scores stay unscaled
        // (qscale > 0 keeps their order) and qscale is folded into each exponent's FFMA;
        // with it they are scaled and capped first (sc = 1).
        unsigned int pa[2][FA_BN / 16][4];
        if (!full) {
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
                for (int ri = 0; ri < 2; ++ri) {
                    const int lo = r_lo[mt * 2 + ri], hi = r_hi[mt * 2 + ri];
#pragma unroll
                    for (int n = 0; n < NS; ++n) {
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const int key = n * 8 + 2 * t4 + e;
                            const int k = kt + key;
                            const bool ok = okb[key] != 0 && k >= lo && k < hi;
                            float& v = s[mt][n][ri * 2 + e];
                            v = ok ? v : NEG_INF;
                        }
                    }
                }
            }
        }
        if (softcap > 0.0f) {
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int n = 0; n < NS; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (s[mt][n][e] != NEG_INF)
                            s[mt][n][e] = softcap_l2(s[mt][n][e] * qscale, softcap);
        }
        float mu[4], corr[4];
        bool grew = false;
#pragma unroll
        for (int rr = 0; rr < 4; ++rr) {
            const int mt = rr >> 1, ri = rr & 1;
            float mx = NEG_INF;
#pragma unroll
            for (int n = 0; n < NS; ++n)
                mx = fmaxf(mx, fmaxf(s[mt][n][ri * 2], s[mt][n][ri * 2 + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
            const float mn = fmaxf(m[rr], mx);  // in the scores' units
            grew |= mn != m[rr];
            mu[rr] = mn == NEG_INF ? 0.0f : mn * sc;  // nothing seen yet: keep zeros
            corr[rr] = fa_exp2(m[rr] * sc - mu[rr]);
            m[rr] = mn;
            l[rr] *= corr[rr];
        }
        // corr is exactly 1 for rows whose max did not grow (or O is still zero).
        if (__any_sync(FULL_MASK, grew)) {
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int n = 0; n < ND; ++n) {
                    o[mt][n][0] *= corr[mt * 2];
                    o[mt][n][1] *= corr[mt * 2];
                    o[mt][n][2] *= corr[mt * 2 + 1];
                    o[mt][n][3] *= corr[mt * 2 + 1];
                }
        }
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
            for (int n = 0; n < NS; ++n) {
                const float p0 = fa_exp2(fmaf(s[mt][n][0], sc, -mu[mt * 2]));
                const float p1 = fa_exp2(fmaf(s[mt][n][1], sc, -mu[mt * 2]));
                const float p2 = fa_exp2(fmaf(s[mt][n][2], sc, -mu[mt * 2 + 1]));
                const float p3 = fa_exp2(fmaf(s[mt][n][3], sc, -mu[mt * 2 + 1]));
                l[mt * 2] += p0 + p1;
                l[mt * 2 + 1] += p2 + p3;
                // n-tile 2i gives a0 (row g) / a1 (row g + 8), n-tile 2i + 1 a2 / a3.
                pa[mt][n >> 1][(n & 1) * 2 + 0] = Ty<T>::pack2(p0, p1);
                pa[mt][n >> 1][(n & 1) * 2 + 1] = Ty<T>::pack2(p2, p3);
            }
        }

#pragma unroll
        for (int kk = 0; kk < FA_BN / 16; ++kk) {
#pragma unroll
            for (int n = 0; n < ND; n += 2) {
                // Matrices: keys kk*16 + {0..7, 8..15} x dims n*8.., then the same x
                // (n+1)*8..
                unsigned int b0, b1, b2, b3;
                ldmatrix_x4_trans(vw + (kk * 16 * LD + n * 8) * 2, b0, b1, b2, b3);
                Mma16816<T>::mma(o[0][n], pa[0][kk], b0, b1);
                Mma16816<T>::mma(o[1][n], pa[1][kk], b0, b1);
                Mma16816<T>::mma(o[0][n + 1], pa[0][kk], b2, b3);
                Mma16816<T>::mma(o[1][n + 1], pa[1][kk], b2, b3);
            }
        }
    }
    cp_async_wait<0>();

    // --- Normalise and write this thread's rows (zeros where nothing was seen).
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
        const int mt = rr >> 1, ri = rr & 1;
        float sum = l[rr];
        sum += __shfl_xor_sync(FULL_MASK, sum, 1);
        sum += __shfl_xor_sync(FULL_MASK, sum, 2);
        // What o and l are relative to (the row's max in log2 units; 0 when none seen).
        const float mu = m[rr] == NEG_INF ? 0.0f : m[rr] * sc;
        const float inv = vscale * softmax_inv(mu, sum, sinks, h);
        const int r = wr0 + mt * 16 + ri * 8 + g;
        if (r < row_end) {
            T* dst = out + ((long long)r * num_heads + h) * HD + 2 * t4;
#pragma unroll
            for (int n = 0; n < ND; ++n) {
                *reinterpret_cast<unsigned int*>(dst + n * 8) =
                    Ty<T>::pack2(o[mt][n][ri * 2] * inv, o[mt][n][ri * 2 + 1] * inv);
            }
        }
    }
}

// CTAs an SM the registers must allow (a kernel define for measurements; 1: no bound).
#ifndef FA_MIN_BLOCKS
#define FA_MIN_BLOCKS 1
#endif
#define ATTENTION_PREFILL(NAME, T, KV, HD)                                                 \
    extern "C" __global__ void __launch_bounds__(FA_THREADS, FA_MIN_BLOCKS) NAME(          \
        const T* q, const KV* k_cache, const KV* v_cache, const int* block_tables,         \
        const int* seq_lens, const int* cu_seqlens, T* out, float qscale, float vscale, float softcap,    \
        int window, int num_seqs, int rows, int num_heads, int num_kv_heads,               \
        int num_blocks, int block_size, int table_width, int group, const T* sinks) {     \
        pdl_enter();                                                                        \
        attention_prefill_impl<T, KV, HD>(q, k_cache, v_cache, block_tables, seq_lens,    \
                                          cu_seqlens, out, qscale, vscale, softcap, window,         \
                                          num_seqs, rows, num_heads, num_kv_heads,         \
                                          num_blocks, block_size, table_width, group, sinks); \
    }

ATTENTION_PREFILL(attention_prefill_hd64_bf16, bf16, bf16, 64)
ATTENTION_PREFILL(attention_prefill_hd128_bf16, bf16, bf16, 128)
ATTENTION_PREFILL(attention_prefill_hd64_f16, f16, f16, 64)
ATTENTION_PREFILL(attention_prefill_hd128_f16, f16, f16, 128)
ATTENTION_PREFILL(attention_prefill_hd64_bf16_kv8, bf16, fp8, 64)
ATTENTION_PREFILL(attention_prefill_hd128_bf16_kv8, bf16, fp8, 128)
ATTENTION_PREFILL(attention_prefill_hd64_f16_kv8, f16, fp8, 64)
ATTENTION_PREFILL(attention_prefill_hd128_f16_kv8, f16, fp8, 128)
