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
// Launch: grid (ceil(rows / 64) + num_seqs, num_heads), 128 threads (4 warps), shapes only.
// Work item x of the grid is found by scanning cu_seqlens_q (device memory): the row ranges
// [a_s, b_s) (cu clamped to be non-decreasing and within 0..rows, so ranges never overlap)
// are cut into tiles of 64 rows; x indexes those tiles in sequence order (within a sequence
// the last tile, the one with the longest context, comes first). The remaining x index
// 64-row tiles of the rows no sequence covers, which are written as zeros. Sum over s of
// ceil(len_s / 64) plus ceil(uncovered / 64) never exceeds ceil(rows / 64) + num_seqs, so
// every tile has a CTA; CTAs with nothing to do return.
//
// A CTA owns 64 query rows of one query head h (KV head h / group). Warp w owns rows
// 16w..16w+15 of the tile: Q as mma A fragments in registers (loaded once), S = Q K^T for 64
// keys at a time (8 n-tiles of 8 keys, f32), masked and scaled into log2 units, online
// softmax per row (running max / sum in f32), P rounded to T as the A operand of O += P V
// (the S accumulators are exactly P's A fragments), O in f32 registers. K and V tiles of 64
// keys are gathered from the paged cache with 16-byte cp.async copies (zero-filled for
// invalid keys) into shared memory rows padded to HD + 8 elements (conflict-free fragment
// loads); V's B fragments come from ldmatrix.trans. K(j+1) streams in during softmax and
// P V of tile j, V(j+1) during Q K^T of tile j+1. Only key tiles overlapping the tile's
// union of ranges [lo(first row), ctx'(last row)) are visited.
//
// mma.m16n8k16 fragments (g = lane / 4, t = lane % 4; two 16-bit elements per 32-bit
// register, the lower column in the low half):
//   A (16x16, row-major): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B (16x8, "col"):      b0 (k = 2t..2t+1, n = g), b1 (k = 2t+8..2t+9, n = g)
//   C (16x8, f32):        c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1)

#define FA_THREADS 128
#define FA_BM 64   // query rows per CTA
#define FA_BN 64   // keys per tile

template <typename T> struct FaMma;
template <> struct FaMma<bf16> {
    static __device__ __forceinline__ void mma(float* c, const unsigned int* a,
                                               unsigned int b0, unsigned int b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct FaMma<f16> {
    static __device__ __forceinline__ void mma(float* c, const unsigned int* a,
                                               unsigned int b0, unsigned int b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// Four 8x8 16-bit matrices, transposed: lanes 8i..8i+7 give the row addresses (16 bytes
// each) of matrix i; register i of lane L receives elements [2 (L % 4)][L / 4] and
// [2 (L % 4) + 1][L / 4] of matrix i (low half first).
__device__ __forceinline__ void fa_ldmatrix_x4_trans(const void* smem, unsigned int& r0,
                                                     unsigned int& r1, unsigned int& r2,
                                                     unsigned int& r3) {
    const unsigned int addr = (unsigned int)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

template <typename T, int HD>
__device__ __forceinline__ void attention_prefill_impl(
    const T* q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const int* __restrict__ cu_seqlens, T* out, float qscale, int window, int num_seqs,
    int rows, int num_heads, int num_kv_heads, int num_blocks, int block_size,
    int table_width, int group) {
    constexpr int LD = HD + 8;         // padded shared row (elements)
    constexpr int CPR = HD / 8;        // 16-byte chunks per row
    constexpr int KT = HD / 16;        // k-steps of Q K^T
    constexpr int ND = HD / 8;         // n-tiles of O

    __shared__ __align__(16) T sK[FA_BN * LD];
    __shared__ __align__(16) T sV[FA_BN * LD];
    __shared__ int sOk[2][FA_BN];

    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int h = blockIdx.y;
    const int kvh = h / group;

    // --- Find this CTA's (sequence, tile) from cu_seqlens (block-uniform). ---
    int x = blockIdx.x;
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

    // --- Key ranges of this thread's two rows, and of the whole tile. ---
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
    int lo_r[2], hi_r[2];
    range(row0 + warp * 16 + g, lo_r[0], hi_r[0]);
    range(row0 + warp * 16 + g + 8, lo_r[1], hi_r[1]);
    int k_start, k_end, dummy;
    range(row0, k_start, dummy);
    range(row_end - 1, dummy, k_end);
    // Warps whose 16 rows all lie past the tile's last row (a short sequence) only help
    // with the copies and barriers.
    const bool active = row0 + warp * 16 < row_end;
    const int kt0 = k_start / FA_BN * FA_BN;
    const int ntiles = k_end > k_start ? (k_end - kt0 + FA_BN - 1) / FA_BN : 0;

    const int* table = block_tables + (long long)seq * table_width;
    const long long tok_stride = (long long)num_kv_heads * HD;
    const long long head_off = (long long)kvh * HD;

    // Gather the K (or V) rows of keys kt..kt+63 into `dst` (zeros for invalid keys); the
    // K pass also records each key's validity in sOk[buf].
    auto issue = [&](const T* cache, T* dst, int kt, int buf) {
#pragma unroll
        for (int i = 0; i < FA_BN * CPR / FA_THREADS; ++i) {
            const int c = tid + i * FA_THREADS;
            const int key = c / CPR, part = c % CPR;
            const int k = kt + key;
            int blk = -1;
            if (k < k_end) blk = table[k / block_size];
            const bool ok = blk >= 0 && blk < num_blocks;
            const long long off =
                ok ? ((long long)blk * block_size + (k % block_size)) * tok_stride + head_off +
                         part * 8
                   : 0;
            cp_async16(dst + key * LD + part * 8, cache + off, ok);
            if (buf >= 0 && part == 0) sOk[buf][key] = ok ? 1 : 0;
        }
    };

    // Prologue: K(0) in flight while Q is staged through sV into registers.
    if (ntiles > 0) issue(k_cache, sK, kt0, 0);
    cp_async_commit();
    for (int i = tid; i < FA_BM * CPR; i += FA_THREADS) {
        const int r = i / CPR, part = i % CPR;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (row0 + r < row_end) v = ld16(q + ((long long)(row0 + r) * num_heads + h) * HD + part * 8);
        st16(sV + r * LD + part * 8, v);
    }
    __syncthreads();
    unsigned int qa[KT][4];
    {
        const T* qw = sV + (warp * 16) * LD;
#pragma unroll
        for (int kk = 0; kk < KT; ++kk) {
            const int c = kk * 16 + 2 * t4;
            qa[kk][0] = *reinterpret_cast<const unsigned int*>(qw + g * LD + c);
            qa[kk][1] = *reinterpret_cast<const unsigned int*>(qw + (g + 8) * LD + c);
            qa[kk][2] = *reinterpret_cast<const unsigned int*>(qw + g * LD + c + 8);
            qa[kk][3] = *reinterpret_cast<const unsigned int*>(qw + (g + 8) * LD + c + 8);
        }
    }
    __syncthreads();  // sV is free again
    if (ntiles > 0) issue(v_cache, sV, kt0, -1);
    cp_async_commit();

    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {NEG_INF, NEG_INF};
    float l[2] = {0.0f, 0.0f};  // this thread's partial row sums (reduced at the end)

    for (int j = 0; j < ntiles; ++j) {
        const int kt = kt0 + j * FA_BN;
        // Committed so far: ..., K(j), V(j). Wait for K(j).
        cp_async_wait<1>();
        __syncthreads();

        float s[FA_BN / 8][4];
#pragma unroll
        for (int n = 0; n < FA_BN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        if (active) {
#pragma unroll
        for (int kk = 0; kk < KT; ++kk) {
#pragma unroll
            for (int n = 0; n < FA_BN / 8; ++n) {
                const T* kr = sK + (n * 8 + g) * LD + kk * 16 + 2 * t4;
                const unsigned int b0 = *reinterpret_cast<const unsigned int*>(kr);
                const unsigned int b1 = *reinterpret_cast<const unsigned int*>(kr + 8);
                FaMma<T>::mma(s[n], qa[kk], b0, b1);
            }
        }
        }
        __syncthreads();  // every warp is done with sK
        if (j + 1 < ntiles) issue(k_cache, sK, kt + FA_BN, (j + 1) & 1);
        cp_async_commit();

        // Mask, scale into log2 units, online softmax (rows g and g + 8 of the warp).
        const int* okb = sOk[j & 1];
        float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int n = 0; n < FA_BN / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = n * 8 + 2 * t4 + (e & 1);
                const int k = kt + key;
                const int ri = e >> 1;
                const bool ok = okb[key] != 0 && k >= lo_r[ri] && k < hi_r[ri];
                s[n][e] = ok ? s[n][e] * qscale : NEG_INF;
                mx[ri] = fmaxf(mx[ri], s[n][e]);
            }
        }
        float mu[2], corr[2];
#pragma unroll
        for (int ri = 0; ri < 2; ++ri) {
            mx[ri] = fmaxf(mx[ri], __shfl_xor_sync(FULL_MASK, mx[ri], 1));
            mx[ri] = fmaxf(mx[ri], __shfl_xor_sync(FULL_MASK, mx[ri], 2));
            const float mn = fmaxf(m[ri], mx[ri]);
            mu[ri] = mn == NEG_INF ? 0.0f : mn;  // nothing seen yet: keep zeros
            corr[ri] = exp2f(m[ri] - mu[ri]);
            m[ri] = mn;
            l[ri] *= corr[ri];
        }
#pragma unroll
        for (int n = 0; n < ND; ++n) {
            o[n][0] *= corr[0];
            o[n][1] *= corr[0];
            o[n][2] *= corr[1];
            o[n][3] *= corr[1];
        }
        unsigned int pa[FA_BN / 16][4];
#pragma unroll
        for (int n = 0; n < FA_BN / 8; ++n) {
            const float p0 = exp2f(s[n][0] - mu[0]);
            const float p1 = exp2f(s[n][1] - mu[0]);
            const float p2 = exp2f(s[n][2] - mu[1]);
            const float p3 = exp2f(s[n][3] - mu[1]);
            l[0] += p0 + p1;
            l[1] += p2 + p3;
            // n-tile 2i gives a0 (row g) / a1 (row g + 8), n-tile 2i + 1 gives a2 / a3.
            pa[n >> 1][(n & 1) * 2 + 0] = Ty<T>::pack2(p0, p1);
            pa[n >> 1][(n & 1) * 2 + 1] = Ty<T>::pack2(p2, p3);
        }

        // Committed so far: ..., K(j), V(j), K(j+1). Wait for V(j).
        cp_async_wait<1>();
        __syncthreads();
        if (active) {
#pragma unroll
        for (int kk = 0; kk < FA_BN / 16; ++kk) {
#pragma unroll
            for (int n = 0; n < ND; n += 2) {
                // Matrices: keys kk*16 + {0..7, 8..15} x dims n*8.., then the same x (n+1)*8..
                const int key = kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
                const int dim = (n + (lane >> 4)) * 8;
                unsigned int b0, b1, b2, b3;
                fa_ldmatrix_x4_trans(sV + key * LD + dim, b0, b1, b2, b3);
                FaMma<T>::mma(o[n], pa[kk], b0, b1);
                FaMma<T>::mma(o[n + 1], pa[kk], b2, b3);
            }
        }
        }
        __syncthreads();  // every warp is done with sV
        if (j + 1 < ntiles) issue(v_cache, sV, kt + FA_BN, -1);
        cp_async_commit();
    }
    cp_async_wait<0>();

    // --- Normalise and write rows g and g + 8 of this warp (zeros where nothing was seen).
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
        float sum = l[ri];
        sum += __shfl_xor_sync(FULL_MASK, sum, 1);
        sum += __shfl_xor_sync(FULL_MASK, sum, 2);
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        const int r = row0 + warp * 16 + g + ri * 8;
        if (r < row_end) {
            T* dst = out + ((long long)r * num_heads + h) * HD + 2 * t4;
#pragma unroll
            for (int n = 0; n < ND; ++n) {
                *reinterpret_cast<unsigned int*>(dst + n * 8) =
                    Ty<T>::pack2(o[n][ri * 2] * inv, o[n][ri * 2 + 1] * inv);
            }
        }
    }
}

#define ATTENTION_PREFILL(NAME, T, HD)                                                     \
    extern "C" __global__ void __launch_bounds__(FA_THREADS) NAME(                         \
        const T* q, const T* k_cache, const T* v_cache, const int* block_tables,           \
        const int* seq_lens, const int* cu_seqlens, T* out, float qscale, int window,      \
        int num_seqs, int rows, int num_heads, int num_kv_heads, int num_blocks,           \
        int block_size, int table_width, int group) {                                      \
        pdl_enter();                                                                        \
        attention_prefill_impl<T, HD>(q, k_cache, v_cache, block_tables, seq_lens,        \
                                      cu_seqlens, out, qscale, window, num_seqs, rows,     \
                                      num_heads, num_kv_heads, num_blocks, block_size,     \
                                      table_width, group);                                 \
    }

ATTENTION_PREFILL(attention_prefill_hd64_bf16, bf16, 64)
ATTENTION_PREFILL(attention_prefill_hd128_bf16, bf16, 128)
ATTENTION_PREFILL(attention_prefill_hd64_f16, f16, 64)
ATTENTION_PREFILL(attention_prefill_hd128_f16, f16, 128)
