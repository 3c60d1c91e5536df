// gemv: `out[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n])` for a few rows m < M <= 8: the
// decode-time matmul, where every weight byte is read once and the step is bound by
// weight bandwidth, not by tensor-core throughput.
//
// Semantics: `Backend::matmul` (src/backend/mod.rs). x, w, bias T; out OutT (T or f32);
// f32 accumulation; each output rounded once (bias added in f32 before the rounding).
//
// Layout: grid (ceil(N / rows_per_cta)), GEMV_THREADS threads = 8 warps. A warp owns R
// consecutive output rows, R = min(M, 4): each x vector it loads serves all R rows, so the
// x traffic through L1 is M / R times the weight traffic rather than M times. `ksplit` (1,
// 2, 4 or 8) warps share the same rows, so a CTA holds 8 / ksplit * R rows. k is cut into
// chunks of 32 lanes x one 16-byte vector (256 elements of a 16-bit T, 128 of f32); part p
// of a row takes chunks p, p + ksplit, ... Each lane streams its 16-byte vectors of w
// through the non-allocating read-only path (w is read once per step; keeping it out of L1
// leaves room for x, which every warp re-reads) with 4 (R = 4: 2) chunks of loads in
// flight, and keeps R x M f32 partial sums. They are reduced with a butterfly, then across
// the ksplit warps in shared memory in a fixed order (deterministic), and part 0's lane
// r * M + m writes (m, row r). The kernel's PDL wait (`pdl_enter`) comes after its first
// round of weight loads. Host guarantees: k % V == 0, 16-byte aligned x and w (so
// every row of both is 16-byte aligned), m_rows <= M.

#define GEMV_THREADS 256
#define GEMV_WARPS (GEMV_THREADS / 32)
#ifndef GEMV_UNROLL
#define GEMV_UNROLL 4  // chunks of loads in flight per warp (half for R = 4)
#endif
// GEMV_MIN_BLOCKS (`ENCORE_KERNEL_DEFINES`, for experiments): CTAs an SM the compiler
// keeps registers for (`__launch_bounds__`' second argument) in the one-row variants and
// the fused gate/up. Unset, the compiler chooses (an explicit 1 is not the same).
#ifdef GEMV_MIN_BLOCKS
#define GEMV_BOUNDS(ONE_ROW) __launch_bounds__(GEMV_THREADS, (ONE_ROW) ? GEMV_MIN_BLOCKS : 1)
#else
#define GEMV_BOUNDS(ONE_ROW) __launch_bounds__(GEMV_THREADS)
#endif

// 16-byte load that does not allocate in L1 (weights are streamed once per step).
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

// One chunk: acc[r][m] += x[m, k0 + lane's V elements] · (weight vector wv[r]). Each x
// vector is loaded once and serves the warp's R rows.
template <typename T, int M, int R>
__device__ __forceinline__ void gemv_fma(const T* xr, int k, int k0, int m_rows,
                                         const uint4 (&wv)[R], float (&acc)[R][M]) {
    constexpr int V = Ty<T>::V;
#pragma unroll
    for (int m = 0; m < M; ++m) {
        if (m < m_rows) {
            float xf[V];
            Ty<T>::unpack(ldg16(xr + (long long)m * k + k0), xf);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                float wf[V];
                Ty<T>::unpack(wv[r], wf);
#pragma unroll
                for (int e = 0; e < V; ++e) acc[r][m] = fmaf(wf[e], xf[e], acc[r][m]);
            }
        }
    }
}

// ACT: the MLP's gate/up projection with the gated activation in the epilogue (M = 1,
// R = 2; `act` as args.rs's `Activation::code`: SiLU, GELU-tanh, GELU-erf, ReLU^2): w is
// [2 * n_rows, k] (gate rows, then up rows); the warp of output j computes gate row j and
// up row n_rows + j, rounds both to T as a matmul would, and writes
// out[j] = act(gate) * up rounded to T, exactly what matmul + silu_mul.cu's act_mul produce.
//
// PUSH (gemv_push_*, OutT = T): tensor parallelism's row-parallel projection, whose output
// is summed over the ranks. Instead of writing `out`, the CTA gathers its outputs
// [m_rows, its rows] in shared memory and stores them straight into every rank's staging
// slot for this rank (peer memory: NVLink or PCIe P2P) in buffer c = (*count + 1) % 3.
// No flag follows: a slot holds all-ones bits (a NaN no output takes: one that would is
// stored as the canonical NaN) until written, so allreduce.cu's pushed_rms_norm_* waits on
// the data itself, sums the slots in rank order, puts the all-ones bits back and sets
// *count = c (so the count only cycles through 0, 1, 2). Reuse: rank R writes buffer c
// again three calls later, after its norm of call c + 2, which needed every peer P's pushes
// of call c + 2; P made them after its own norms of calls c + 1 and c, and its norm of
// call c had read and reset P's buffer c. So no rank writes a buffer a peer still reads.
struct PushTo {
    const ArPush* peers;
    const unsigned int* count;
    int rank, ranks;
    long long cap; // bytes of one (buffer, source rank) slot
};

template <typename T, typename OutT, int M, int R, bool ACT = false, bool PUSH = false>
__device__ __forceinline__ void gemv_impl(const T* __restrict__ x, const T* __restrict__ w,
                                          const T* __restrict__ bias, OutT* __restrict__ out,
                                          int m_rows, int n_rows, int k, int ksplit,
                                          PushTo push = PushTo{}, int act = 0) {
    constexpr int V = Ty<T>::V;
    constexpr int CHUNK = 32 * V;
    static_assert(GEMV_UNROLL >= 1, "GEMV_UNROLL: at least one chunk of loads in flight");
    constexpr int UNROLL = R >= 4 ? (GEMV_UNROLL + 1) / 2 : GEMV_UNROLL;
    static_assert(!ACT || (M == 1 && R == 2), "ACT pairs one gate row with one up row");
    __shared__ float red[GEMV_WARPS][R * M];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // Output rows of a warp: R consecutive rows, or (ACT) one output from two weight rows.
    constexpr int OUTS = ACT ? 1 : R;
    const int rows_per_cta = GEMV_WARPS / ksplit * OUTS;
    const int n0 = blockIdx.x * rows_per_cta + (warp / ksplit) * OUTS;
    const int part = warp - (warp / ksplit) * ksplit;
    const int nchunks = (k + CHUNK - 1) / CHUNK;

    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;

    // Rows past the end re-read the last row (never written): no per-load branches.
    const T* wr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int row = ACT ? n0 + r * n_rows : min(n0 + r, n_rows - 1);
        wr[r] = w + (long long)row * k + lane * V;
    }
    const int nfull = k / CHUNK;
    // The first round of weight loads goes out before the PDL wait (`pdl_enter`): the
    // weights never depend on the kernel before, so they stream while it finishes (an
    // all-reduce, attention, a norm) instead of after. Only x waits.
    uint4 wv[UNROLL][R];
#ifdef GEMV_LATE_LOADS
    const bool early = false;
#else
    const bool early = n0 < n_rows && part + (UNROLL - 1) * ksplit < nfull;
#endif
    if (early) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) wv[u][r] = ld_stream16(wr[r] + (part + u * ksplit) * CHUNK);
    }
    pdl_enter();
    __shared__ unsigned int sh_c;
    if (PUSH && threadIdx.x == 0) sh_c = (*push.count + 1) % 3u;

    if (n0 < n_rows) {
        const T* xr = x + lane * V;
        int c = part;
        // Main loop over whole chunks: UNROLL of them, all weight loads issued before use;
        // each x vector is loaded once and used for the warp's R rows.
        for (; c + (UNROLL - 1) * ksplit < nfull; c += UNROLL * ksplit) {
            if (!early || c != part) {
#pragma unroll
                for (int u = 0; u < UNROLL; ++u)
#pragma unroll
                    for (int r = 0; r < R; ++r)
                        wv[u][r] = ld_stream16(wr[r] + (c + u * ksplit) * CHUNK);
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
                gemv_fma<T, M, R>(xr, k, (c + u * ksplit) * CHUNK, m_rows, wv[u], acc);
        }
        // The rest, one chunk at a time (the last one may be partial).
        for (; c < nchunks; c += ksplit) {
            const int k0 = c * CHUNK;
            if (k0 + lane * V < k) {
                uint4 wv[R];
#pragma unroll
                for (int r = 0; r < R; ++r) wv[r] = ld_stream16(wr[r] + k0);
                gemv_fma<T, M, R>(xr, k, k0, m_rows, wv, acc);
            }
        }
    }
    gemv_reduce<M, R>(acc, red, lane, warp, part, ksplit);
    if (ACT) {
        if (part == 0 && n0 < n_rows && lane == 0)
            gemv_store_act<T>(act, acc[0][0], acc[R - 1][0], out + n0);
    } else if (PUSH) {
        // This CTA's outputs [m, its rows], then every rank's slot for this rank.
        __shared__ T pst[GEMV_WARPS * 4 * M];
        const int cta_n0 = blockIdx.x * rows_per_cta;
        const int rows_here = min(rows_per_cta, n_rows - cta_n0);
        if (part == 0)
            gemv_each_output<T, M, R>(acc, bias, n0, n_rows, m_rows, lane,
                                      [&](int m, int n, float v) {
                                          pst[m * rows_per_cta + (n - cta_n0)] =
                                              push_value(from_f32<T>(v));
                                      });
        __syncthreads();
        const unsigned int c = sh_c;
        const int cnt = rows_here * m_rows;
        const long long slot = ((long long)c * AR_MAX_RANKS + push.rank) * push.cap;
        for (int t = threadIdx.x; t < cnt * push.ranks; t += blockDim.x) {
            const int dst = t / cnt, e = t - dst * cnt;
            const int m = e / rows_here, r = e - m * rows_here;
            T* buf = reinterpret_cast<T*>(push.peers->bufs[dst] + slot);
            buf[(long long)m * n_rows + cta_n0 + r] = pst[m * rows_per_cta + r];
        }
    } else if (part == 0) {
        gemv_each_output<T, M, R>(acc, bias, n0, n_rows, m_rows, lane,
                                  [&](int m, int n, float v) {
                                      out[(long long)m * n_rows + n] = from_f32<OutT>(v);
                                  });
    }
}

// Rows per warp of the variant for M rows of x (the host passes the same to `gemv_layout`).
#define GEMV_R(M) ((M) >= 4 ? 4 : (M))

#define GEMV(T, OUT_T, TN, ON, M)                                                           \
    extern "C" __global__ void GEMV_BOUNDS((M) == 1) gemv_##TN##_##ON##_m##M(              \
        const T* x, const T* w, const T* bias, OUT_T* out, int m_rows, int n_rows, int k,   \
        int ksplit) {                                                                       \
        gemv_impl<T, OUT_T, M, GEMV_R(M)>(x, w, bias, out, m_rows, n_rows, k, ksplit);      \
    }
#define GEMV_ALL_M(T, OUT_T, TN, ON)                                                        \
    GEMV(T, OUT_T, TN, ON, 1)                                                               \
    GEMV(T, OUT_T, TN, ON, 2)                                                               \
    GEMV(T, OUT_T, TN, ON, 4)                                                               \
    GEMV(T, OUT_T, TN, ON, 8)

GEMV_ALL_M(bf16, bf16, bf16, bf16)
GEMV_ALL_M(bf16, float, bf16, f32)
GEMV_ALL_M(f16, f16, f16, f16)
GEMV_ALL_M(f16, float, f16, f32)
GEMV_ALL_M(float, float, f32, f32)

// The row-parallel projection of tensor parallelism, pushing its outputs to every rank
// (PUSH above) for allreduce.cu's pushed_rms_norm_*.
#define GEMV_PUSH(T, TN, M)                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_push_##TN##_m##M(       \
        const T* x, const T* w, const T* bias, int m_rows, int n_rows, int k, int ksplit,   \
        const ArPush* peers, const unsigned int* count, int rank, int ranks,               \
        long long cap) {                                                                    \
        gemv_impl<T, T, M, GEMV_R(M), false, true>(x, w, bias, nullptr, m_rows, n_rows, k, \
                                                   ksplit,                                  \
                                                   PushTo{peers, count, rank, ranks, cap}); \
    }
#define GEMV_PUSH_ALL_M(T, TN)                                                              \
    GEMV_PUSH(T, TN, 1)                                                                     \
    GEMV_PUSH(T, TN, 2)                                                                     \
    GEMV_PUSH(T, TN, 4)                                                                     \
    GEMV_PUSH(T, TN, 8)
GEMV_PUSH_ALL_M(bf16, bf16)
GEMV_PUSH_ALL_M(f16, f16)
GEMV_PUSH_ALL_M(float, f32)

// out[0, j] = act(x · w[j]) * (x · w[n_rows + j]) for one row of x: the MLP's gate/up
// projection and activation in one pass over the merged gate_up weight.
#define GEMV_ACT(T, TN)                                                                     \
    extern "C" __global__ void GEMV_BOUNDS(1) gemv_act_##TN##_m1(                          \
        const T* x, const T* w, T* out, int n_rows, int k, int ksplit, int act) {          \
        gemv_impl<T, T, 1, 2, true>(x, w, nullptr, out, 1, n_rows, k, ksplit, PushTo{}, act); \
    }
GEMV_ACT(bf16, bf16)
GEMV_ACT(f16, f16)
GEMV_ACT(float, f32)

// The split-K sum of the quantized tensor-core matmul (quant_mma.cuh's qmma_impl):
// out[i] = sum over z of ws[z][i] (z in order), + bias[i % n_rows], rounded once.
template <typename T, typename OutT>
__device__ __forceinline__ void qmma_reduce_impl(const float* __restrict__ ws,
                                                 const T* __restrict__ bias,
                                                 OutT* __restrict__ out, int m_rows, int n_rows,
                                                 int splits) {
    const long long total = (long long)m_rows * n_rows;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        float s = 0.0f;
        for (int z = 0; z < splits; ++z) s += ws[z * total + i];
        if (bias != nullptr) s += to_f32(bias[i % n_rows]);
        out[i] = from_f32<OutT>(s);
    }
}
#define QMMA_REDUCE(T, OUT_T, TN, ON)                                                       \
    extern "C" __global__ void __launch_bounds__(256) qmma_reduce_##TN##_##ON(              \
        const float* ws, const T* bias, OUT_T* out, int m_rows, int n_rows, int splits) {   \
        pdl_enter();                                                                        \
        qmma_reduce_impl<T, OUT_T>(ws, bias, out, m_rows, n_rows, splits);                  \
    }
QMMA_REDUCE(bf16, bf16, bf16, bf16)
QMMA_REDUCE(bf16, float, bf16, f32)
QMMA_REDUCE(f16, f16, f16, f16)
QMMA_REDUCE(f16, float, f16, f32)
