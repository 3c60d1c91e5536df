// attention_prefill_wg: flash attention for prefill / mixed steps on Hopper's warpgroup
// MMA (`wgmma.mma_async`, sm_90a only), bf16 and f16, head_dim 64 or 128, over a cache of
// T or of E4M3 (`_kv8`). The same launch and semantics as attention_prefill.cu's kernels
// (read its header: the rows of a sequence, the key range of a row, windows, soft-capping,
// padding rows, invalid blocks, qscale / vscale, gpt-oss's sinks), with 384 threads
// instead of 128: FlashAttention-3's structure.
//
// A CTA owns 128 query rows of one head (grid (num_heads, ceil(rows / 128) + num_seqs),
// work items found in cu_seqlens_q as there). Warpgroup 0 produces, warpgroups 1 and 2
// consume (rows 64 (wg - 1) .. of the CTA's). The producer streams the CTA's tiles of
// WG_BN (128) keys into two K and two V stages of T: each of its threads looks up one
// key's cache row a tile ahead, a producer barrier publishes the tile's rows, and the
// `cp.async` copies (16-byte parts) arrive on the stage's mbarrier (full) when they land
// (`cp.async.mbarrier.arrive.noinc`, beside a plain arrival after the tile's
// key-validity words). Over an FP8 cache the raw E4M3 rows land in four producer-private
// slots, three items ahead, and the thread that copied a part decodes it into the stage
// (exactly), fences it for the async proxy and arrives. The consumers free a K stage after
// the tile's softmax (its validity words are read there) and a V stage after its P V
// (empty). A tile's K and V are separate items, so K of tile j + 2 streams while V of tile
// j is still read.
//
// The consumers take turns on the tensor cores (two named barriers, ping-pong): a step of
// a warpgroup issues O += P V of its previous tile and S = Q K^T of the next as one batch
// (one whole fence / issue / commit / wait block a combination: ptxas serialises wgmmas
// whose issue sits under a branch inside such a block), lets the other warpgroup issue
// its batch, then waits for its own and runs the softmax while the other's wgmmas run.
// Both warpgroups take every step of the CTA's tile list (a warpgroup whose rows see no
// key of a tile issues nothing in it), so their turns stay paired. The producer keeps 40
// registers (setmaxnreg), the consumers 232.
//
// Shared tiles are in wgmma's 128-byte-swizzled layout: a tile of R rows x HD columns is
// HD / 64 column halves of R rows x 128 bytes, the 16-byte chunk c of row r at chunk
// c ^ (r % 8) (1,024-byte aligned). Q and K are K-major operands (S = Q K^T: A = Q, B =
// K, both with the head dimension contiguous); V is the MN-major B of O += P V (the keys
// are its K dimension, the head dimension contiguous), read transposed by the
// instruction. Descriptors: K-major SW128, SBO = 1,024 bytes (eight rows); MN-major
// SW128, LBO = the column half's size, SBO = 1,024 bytes (eight keys).
//
// Per tile a consumer warpgroup has S (64 x 128, f32: 64 registers a thread, the layout of
// mma.sync's C fragments per 8 columns), masks it where some row sees only part of the
// tile, runs the online softmax (log2 units, as attention_prefill.cu) and rounds P to T
// straight into the A registers of its next O += P V.

#define WS_THREADS 384
// Registers a thread (setmaxnreg): 128 x producer + 256 x consumer <= 65,536.
#ifndef WS_PRODUCER_REGS
#define WS_PRODUCER_REGS 40
#endif
#ifndef WS_CONSUMER_REGS
#define WS_CONSUMER_REGS 232
#endif
#define WS_STR2(x) #x
#define WS_STR(x) WS_STR2(x)
#define WS_RAW_SLOTS 4
// Dynamic shared memory: `wg_smem_bytes` in attention.rs mirrors this (the 1,024-byte
// alignment, Q, the K and V stages, the raw slots, the validity words, the mbarriers and
// the producer's key rows).
#define WS_SMEM_BYTES(HD, F8)                                                             \
    (1024 + WG_BM * (HD) * 2 + 4 * WG_BN * (HD) * 2 + ((F8) ? WS_RAW_SLOTS * WG_BN * (HD) : 0) + \
     2 * 4 * 4 + 8 * 8 + 2 * WG_BN * 4)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

template <typename T, typename KV, int HD>
__device__ __forceinline__ void attention_prefill_ws_impl(
    const T* q, const KV* __restrict__ k_cache, const KV* __restrict__ v_cache,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const int* __restrict__ cu_seqlens, T* out, float qscale, float vscale, float softcap,
    int window, int num_seqs, int rows, int num_heads, int num_kv_heads, int num_blocks,
    int block_size, int table_width, int group, const T* __restrict__ sinks) {
    constexpr int CPR = HD / 8;
    constexpr int NS = WG_BN / 8;
    constexpr int ND = HD / 8;
    constexpr bool F8 = sizeof(KV) == 1;
    constexpr int TILE = WG_BN * HD * 2;
    constexpr int Q_BYTES = WG_BM * HD * 2;
    constexpr int RAW = WG_BN * HD;  // bytes of a raw E4M3 slot
    static_assert(HD == 64 || HD == 128, "head size");

    extern __shared__ __align__(16) unsigned char wg_smem_raw[];
    const unsigned int raw0 = (unsigned int)__cvta_generic_to_shared(wg_smem_raw);
    const unsigned int pad = ((raw0 + 1023u) & ~1023u) - raw0;
    unsigned char* base = wg_smem_raw + pad;
    const unsigned int sbase = raw0 + pad;
    // Q, K stages 0 / 1, V stages 0 / 1, raw slots, validity words [2][4], mbarriers,
    // the producer's key rows [2][WG_BN].
    unsigned char* sQ = base;
    unsigned char* sK = base + Q_BYTES;
    unsigned char* sRaw = base + Q_BYTES + 4 * TILE;
    unsigned int* sOk = reinterpret_cast<unsigned int*>(sRaw + (F8 ? WS_RAW_SLOTS * RAW : 0));
    const unsigned int bars = (unsigned int)__cvta_generic_to_shared(sOk + 8);
    // full K [2], full V [2], empty K [2], empty V [2]: 8 bytes each.
    auto full_bar = [&](int v, int b) { return bars + (v * 2 + b) * 8; };
    auto empty_bar = [&](int v, int b) { return bars + 32 + (v * 2 + b) * 8; };

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int wg = tid >> 7;
    const int h = blockIdx.x;
    const int kvh = h / group;

    int seq, row0, row_end, b_raw;
    if (!wg_locate<T, HD>(cu_seqlens, out, num_seqs, rows, num_heads, h, tid, WS_THREADS,
                          seq, row0, row_end, b_raw))
        return;
    const WgRange rg = wg_range(seq_lens[seq], b_raw, window, table_width, block_size);
    int k_start, k_end, dummy;
    rg.of(row0, k_start, dummy);
    rg.of(row_end - 1, dummy, k_end);
    const int kt0 = k_start / WG_BN * WG_BN;
    const int ntiles = k_end > k_start ? (k_end - kt0 + WG_BN - 1) / WG_BN : 0;

    if (tid == 0) {
        // The producer's threads: a plain arrival each (FP8), or that and their copies'.
        for (int i = 0; i < 4; ++i) ws_mbar_init(bars + i * 8, F8 ? 128 : 256);
        for (int i = 4; i < 8; ++i) ws_mbar_init(bars + i * 8, 256);  // both consumers
    }
    __syncthreads();

    if (wg == 0) {
        // ---------------- Producer ----------------
        asm volatile("setmaxnreg.dec.sync.aligned.u32 " WS_STR(WS_PRODUCER_REGS) ";\n");
        const int* table = block_tables + (long long)seq * table_width;
        const long long tok_stride = (long long)num_kv_heads * HD;
        const long long head_off = (long long)kvh * HD;
        constexpr int PARTS = WG_BN * CPR / 128;
        // The cache row of each key of a tile (-1: past k_end or an invalid block), two
        // tiles' worth: thread tid looks up key tid (its next tile's entry loaded a tile
        // ahead), the producer's barrier publishes them, and every part reads its own.
        int* sRow = reinterpret_cast<int*>(sOk + 24);
        int next_blk = -1;
        auto lookup = [&](int t) {
            const int k = kt0 + t * WG_BN + tid;
            return t < ntiles && k < k_end ? __ldg(table + k / block_size) : -1;
        };
        next_blk = lookup(0);
        unsigned int ok_bits = 0;  // bit t % 32: key tid of tile t is valid
        auto rows_of = [&](int t) {
            const int blk = next_blk;
            next_blk = lookup(t + 1);
            const int k = kt0 + t * WG_BN + tid;
            const bool ok = blk >= 0 && blk < num_blocks;
            sRow[(t & 1) * WG_BN + tid] = ok ? blk * block_size + k % block_size : -1;
            ok_bits = (ok_bits & ~(1u << (t & 31))) | ((ok ? 1u : 0u) << (t & 31));
            asm volatile("bar.sync 5, 128;\n" ::: "memory");
        };
        // Item it: tile it / 2, K (even) or V (odd), stage (it / 2) % 2.
        auto issue = [&](int it) {
            const int t = it >> 1;
            if ((it & 1) == 0) rows_of(t);
            const KV* src = (it & 1) ? v_cache : k_cache;
            unsigned char* dst = F8 ? sRaw + (it % WS_RAW_SLOTS) * RAW
                                    : sK + ((it & 1) * 2 + (t & 1)) * TILE;
            const int* rowv = sRow + (t & 1) * WG_BN;
#pragma unroll 4
            for (int i = 0; i < PARTS; ++i) {
                const int c = tid + i * 128;
                const int key = c / CPR, part = c % CPR;
                const int row = rowv[key];
                const bool ok = row >= 0;
                const long long off = ok ? (long long)row * tok_stride + head_off + part * 8 : 0;
                if (F8)
                    cp_async_ca<8>(dst + key * HD + part * 8, src + off, ok);
                else
                    cp_async16(dst + wg_chunk(key, part, WG_BN), src + off, ok);
            }
        };
        auto wait_empty = [&](int it) {
            const int t = it >> 1;
            if (t >= 2) ws_mbar_wait(empty_bar(it & 1, t & 1), ((t >> 1) - 1) & 1);
        };
        // A K item's validity words (thread tid: key tid), written before the arrival
        // that publishes them.
        auto validity = [&](int t) {
            const unsigned int w = __ballot_sync(FULL_MASK, (ok_bits >> (t & 31)) & 1u);
            if (lane == 0) sOk[(t & 1) * 4 + (tid >> 5)] = w;
        };
        if (!F8) {
            // Straight into the stages: each thread's copies arrive on the stage's full
            // barrier when they land (cp.async.mbarrier.arrive), beside a plain arrival
            // after its validity words.
#pragma unroll 1
            for (int it = 0; it < 2 * ntiles; ++it) {
                wait_empty(it);
                issue(it);
                const unsigned int fb = full_bar(it & 1, (it >> 1) & 1);
                asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(fb)
                             : "memory");
                if ((it & 1) == 0) validity(it >> 1);
                ws_mbar_arrive(fb);
            }
            return;
        }
        // FP8: raw slots three items ahead; an item is decoded into its stage by the
        // threads that copied it, once landed, then fenced for the async proxy.
        constexpr int LAG = WS_RAW_SLOTS - 1;
#pragma unroll 1
        for (int it = 0; it < 2 * ntiles + LAG; ++it) {
            if (it < 2 * ntiles) issue(it);
            cp_async_commit();
            const int i2 = it - LAG;
            if (i2 < 0) continue;
            cp_async_wait<LAG>();
            const int t = i2 >> 1, v = i2 & 1, b = t & 1;
            wait_empty(i2);
            const unsigned char* rk = sRaw + (i2 % WS_RAW_SLOTS) * RAW;
            unsigned char* dst = sK + (v * 2 + b) * TILE;
#pragma unroll 2
            for (int i = 0; i < PARTS; ++i) {
                const int c = tid + i * 128;
                const int key = c / CPR, part = c % CPR;
                float f[8];
                Fp8Vec<8>::unpack(*reinterpret_cast<const uint2*>(rk + key * HD + part * 8), f);
                st16(reinterpret_cast<T*>(dst + wg_chunk(key, part, WG_BN)), Ty<T>::pack(f));
            }
            if (v == 0) validity(t);
            wg_proxy_fence();
            ws_mbar_arrive(full_bar(v, b));
        }
        return;
    }

    // ---------------- Consumers ----------------
    asm volatile("setmaxnreg.inc.sync.aligned.u32 " WS_STR(WS_CONSUMER_REGS) ";\n");
    const int cw = wg - 1;  // consumer 0 / 1
    const int ctid = tid - 128 * wg;
    const int w4 = (ctid >> 5) & 3;
    const int g = lane >> 2, t4 = lane & 3;
    const int wr0 = row0 + cw * 64;
    const bool active = wr0 < row_end;
    int w_lo0, w_hi0, w_lo1, w_hi1;
    rg.of(wr0, w_lo0, w_hi0);
    rg.of(min(wr0 + 64, row_end) - 1, w_lo1, w_hi1);
    const int ra = wr0 + 16 * w4 + g;
    int r_lo[2], r_hi[2];
    rg.of(ra, r_lo[0], r_hi[0]);
    rg.of(ra + 8, r_lo[1], r_hi[1]);

    // This warpgroup's 64 rows of Q (zeros past row_end), fenced for the async proxy.
    for (int i = ctid; i < 64 * CPR; i += 128) {
        const int r = cw * 64 + i / CPR, part = i % CPR;
        const bool ok = row0 + r < row_end;
        const T* src = ok ? q + ((long long)(row0 + r) * num_heads + h) * HD + part * 8 : q;
        cp_async16(sQ + wg_chunk(r, part, WG_BM), src, ok);
    }
    cp_async_commit();
    cp_async_wait<0>();
    wg_proxy_fence();
    asm volatile("bar.sync %0, 128;\n" ::"r"(3 + cw) : "memory");

    float o[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) o[i] = 0.0f;
    float m[2] = {NEG_INF, NEG_INF};
    float l[2] = {0.0f, 0.0f};
    const float sc = softcap > 0.0f ? 1.0f : qscale;
    const unsigned int q_addr = sbase + cw * 64 * 128;
    float s[NS * 4];
    unsigned int pa[WG_BN / 16][4];

    // O += P V with V at v_addr (MN-major B, column halves WG_BN * 128 bytes apart).
    auto pv_issue = [&](unsigned int v_addr) {
#pragma unroll
        for (int kk = 0; kk < WG_BN / 16; ++kk) {
            const unsigned long long db = wg_desc(v_addr + kk * 16 * 128, WG_BN * 128, 1024);
            if (HD == 128)
                Wg<T>::rs128(o, pa[kk], db, 1);
            else
                Wg<T>::rs64(o, pa[kk], db, 1);
        }
    };
    // S = Q K^T with K at k_addr (the first wgmma overwrites S).
    auto s_issue = [&](unsigned int k_addr) {
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) {
            const unsigned int off = (kk & 3) * 32;
            const unsigned long long da =
                wg_desc(q_addr + (kk >> 2) * (WG_BM * 128) + off, 16, 1024);
            const unsigned long long db =
                wg_desc(k_addr + (kk >> 2) * (WG_BN * 128) + off, 16, 1024);
            Wg<T>::ss128(s, da, db, kk > 0);
        }
    };
    // Turns: consumer 0 syncs on barrier 1 and lets consumer 1 go on barrier 2.
    const int my_bar = 1 + cw, other_bar = 2 - cw;
    if (cw == 1) ws_bar_arrive(1);
    bool have_p = false;
#pragma unroll 1
    for (int j = 0; j <= ntiles; ++j) {
        const int kt = kt0 + j * WG_BN;
        const int b = j & 1, pb = (j - 1) & 1;
        const bool work = j < ntiles && active && kt < w_hi1 && kt + WG_BN > w_lo0;
        ws_bar_sync(my_bar);
        // Every stage is waited for before it is freed, used or not (the producer may
        // refill a stage only after its own copies into it have landed).
        if (j > 0) ws_mbar_wait(full_bar(1, pb), ((j - 1) >> 1) & 1);
        if (j < ntiles) ws_mbar_wait(full_bar(0, b), (j >> 1) & 1);
        const unsigned int v_addr = sbase + Q_BYTES + (2 + pb) * TILE;
        const unsigned int k_addr = sbase + Q_BYTES + b * TILE;
        // O += P V of the previous tile and S = Q K^T of this one: each combination is
        // one whole fence / issue / commit / wait block (ptxas serialises wgmmas whose
        // issue sits under a branch inside such a block).
        if (have_p && work) {
            wg_fence();
            pv_issue(v_addr);
            s_issue(k_addr);
            wg_commit();
            ws_bar_arrive(other_bar);
            wg_wait0();
        } else if (have_p) {
            wg_fence();
            pv_issue(v_addr);
            wg_commit();
            ws_bar_arrive(other_bar);
            wg_wait0();
        } else if (work) {
            wg_fence();
            s_issue(k_addr);
            wg_commit();
            ws_bar_arrive(other_bar);
            wg_wait0();
        } else {
            ws_bar_arrive(other_bar);
        }
#pragma unroll
        for (int i = 0; i < HD / 2; ++i) wg_touch(o[i]);
        if (j > 0) ws_mbar_arrive(empty_bar(1, pb));
        if (work) {
#pragma unroll
            for (int i = 0; i < NS * 4; ++i) wg_touch(s[i]);
            const unsigned int* okw = sOk + b * 4;
            const bool all_ok = (okw[0] & okw[1] & okw[2] & okw[3]) == FULL_MASK;
            const bool full = all_ok && kt >= w_lo1 && kt + WG_BN <= w_hi0;
            if (!full) {
#pragma unroll
                for (int n = 0; n < NS; ++n) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int key = n * 8 + 2 * t4 + (e & 1);
                        const int k = kt + key;
                        const int ri = e >> 1;
                        const bool ok = ((okw[key >> 5] >> (key & 31)) & 1u) != 0 &&
                                        k >= r_lo[ri] && k < r_hi[ri];
                        s[n * 4 + e] = ok ? s[n * 4 + e] : NEG_INF;
                    }
                }
            }
            if (softcap > 0.0f) {
#pragma unroll
                for (int i = 0; i < NS * 4; ++i)
                    if (s[i] != NEG_INF) s[i] = softcap_l2(s[i] * qscale, softcap);
            }
            float mu[2], corr[2];
#pragma unroll
            for (int ri = 0; ri < 2; ++ri) {
                float mx = NEG_INF;
#pragma unroll
                for (int n = 0; n < NS; ++n)
                    mx = fmaxf(mx, fmaxf(s[n * 4 + ri * 2], s[n * 4 + ri * 2 + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
                const float mn = fmaxf(m[ri], mx);
                mu[ri] = mn == NEG_INF ? 0.0f : mn * sc;
                corr[ri] = wg_exp2(m[ri] * sc - mu[ri]);
                m[ri] = mn;
                l[ri] *= corr[ri];
            }
#pragma unroll
            for (int i = 0; i < NS * 4; ++i) {
                s[i] = wg_exp2(fmaf(s[i], sc, -mu[(i >> 1) & 1]));
                l[(i >> 1) & 1] += s[i];
            }
#pragma unroll
            for (int n = 0; n < ND; ++n) {
                o[n * 4 + 0] *= corr[0];
                o[n * 4 + 1] *= corr[0];
                o[n * 4 + 2] *= corr[1];
                o[n * 4 + 3] *= corr[1];
            }
#pragma unroll
            for (int n = 0; n < NS; ++n) {
                pa[n >> 1][(n & 1) * 2 + 0] = Ty<T>::pack2(s[n * 4 + 0], s[n * 4 + 1]);
                pa[n >> 1][(n & 1) * 2 + 1] = Ty<T>::pack2(s[n * 4 + 2], s[n * 4 + 3]);
            }
        }
        if (j < ntiles) ws_mbar_arrive(empty_bar(0, b));
        have_p = work;
    }
    // Consumer 1's last turn handed to consumer 0 (so every arrival on barrier 1 is met).
    if (cw == 0) ws_bar_sync(1);

    wg_store_rows<T, HD>(o, m, l, sc, vscale, sinks, h, ra, row_end, num_heads, t4, out);
}

#define WG_ARGS                                                                            \
    q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens, out, qscale, vscale, softcap,   \
        window, num_seqs, rows, num_heads, num_kv_heads, num_blocks, block_size, table_width, \
        group, sinks
#define WG_BODY(T, KV, HD) attention_prefill_ws_impl<T, KV, HD>(WG_ARGS)
#else
// Not sm_90a: the kernels exist (the entry points are the same on every architecture) but
// are never launched (attention.rs picks attention_prefill.cu's).
#define WG_BODY(T, KV, HD) __trap()
#endif

#define ATTENTION_PREFILL_WG(NAME, T, KV, HD)                                              \
    extern "C" __global__ void __launch_bounds__(WS_THREADS, 1) NAME(                      \
        const T* q, const KV* k_cache, const KV* v_cache, const int* block_tables,         \
        const int* seq_lens, const int* cu_seqlens, T* out, float qscale, float vscale,    \
        float softcap, int window, int num_seqs, int rows, int num_heads, int num_kv_heads, \
        int num_blocks, int block_size, int table_width, int group, const T* sinks) {      \
        pdl_enter();                                                                        \
        WG_BODY(T, KV, HD);                                                                 \
    }

ATTENTION_PREFILL_WG(attention_prefill_wg_hd64_bf16, bf16, bf16, 64)
ATTENTION_PREFILL_WG(attention_prefill_wg_hd128_bf16, bf16, bf16, 128)
ATTENTION_PREFILL_WG(attention_prefill_wg_hd64_f16, f16, f16, 64)
ATTENTION_PREFILL_WG(attention_prefill_wg_hd128_f16, f16, f16, 128)
ATTENTION_PREFILL_WG(attention_prefill_wg_hd64_bf16_kv8, bf16, fp8, 64)
ATTENTION_PREFILL_WG(attention_prefill_wg_hd128_bf16_kv8, bf16, fp8, 128)
ATTENTION_PREFILL_WG(attention_prefill_wg_hd64_f16_kv8, f16, fp8, 64)
ATTENTION_PREFILL_WG(attention_prefill_wg_hd128_f16_kv8, f16, fp8, 128)
