// allreduce: the one-shot sum of a tensor over the ranks of a tensor-parallel group,
// through peer memory (the group's devices map each other's memory: NVLink or PCIe P2P),
// for the small messages of decode, where NCCL's latency dominates.
//
// Every rank runs the same grid over the same tensor shape; block b of every rank owns
// the same chunk of the tensor. A call:
//   1. block b copies its chunk of x into its rank's staging buffer (two buffers, used by
//      alternate calls of the block: `c & 1`, c its call count);
//   2. tells every rank "chunk b of call c is written" (a release store of c into that
//      rank's flag slot [b][me]) and waits until every rank has said the same to it
//      (acquire loads of its own slots [b][r] until >= c, in serial-number order so
//      the u32 counts may wrap: a fast peer may already have written c + 1);
//   3. sums chunk b over the ranks' staging buffers in rank order (f32, rounded once), so
//      every rank computes bit-identical values, into x.
// No second barrier: block b stages into its own slot of the staging buffer (bytes
// [b * slot, (b + 1) * slot), slot = cap / AR_MAX_BLOCKS, whatever the call's shape), so
// only block b of any rank reads it, and block b writes buffer `c & 1` again only at its
// call c + 2, which it starts after block b of every peer has arrived at call c + 1
// (step 2 of c + 1), i.e. after they have finished reading call c's slot. Call counts
// live in device memory (per block, per rank), so a captured graph replays correctly;
// flags compare with >= in serial-number order (wrapping u32).
// x: T [n], n * sizeof(T) a multiple of 16, each block's chunk at most a slot (checked on
// the host).

#define AR_MAX_BLOCKS 64

struct ArPeers {
    char* bufs[AR_MAX_RANKS];          // each rank's staging: 2 * cap bytes
    unsigned int* flags[AR_MAX_RANKS]; // each rank's slots [AR_MAX_BLOCKS][AR_MAX_RANKS]
    const unsigned int* abort;         // the group's abort word (common.cuh's ar_aborted)
};

template <typename T>
__device__ __forceinline__ void allreduce_impl(T* x, long long nv, const ArPeers* peers,
                                               unsigned int* count, int rank, int ranks,
                                               long long cap) {
    __shared__ unsigned int sh_c;
    const int b = blockIdx.x;
    if (threadIdx.x == 0) sh_c = count[b] + 1;
    __syncthreads();
    const unsigned int c = sh_c;
    const long long per = (nv + gridDim.x - 1) / gridDim.x;
    const long long lo = (long long)b * per;
    const long long hi = min(nv, lo + per);
    const long long half = (long long)(c & 1u) * cap + (long long)b * (cap / AR_MAX_BLOCKS);
    uint4* mine = reinterpret_cast<uint4*>(peers->bufs[rank] + half);
    uint4* xs = reinterpret_cast<uint4*>(x);
    for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) mine[i - lo] = xs[i];
    __syncthreads();
    if (threadIdx.x < ranks) {
        st_release_sys(peers->flags[threadIdx.x] + b * AR_MAX_RANKS + rank, c);
        const unsigned int* f = peers->flags[rank] + b * AR_MAX_RANKS + threadIdx.x;
        for (unsigned int n = 1; (int)(ld_acquire_sys(f) - c) < 0; ++n)
            if ((n & AR_ABORT_POLL) == 0u && ar_aborted(peers->abort)) break;
    }
    __syncthreads();
    for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float acc[Ty<T>::V];
#pragma unroll
        for (int k = 0; k < Ty<T>::V; k++) acc[k] = 0.0f;
        for (int r = 0; r < ranks; r++) {
            float v[Ty<T>::V];
            Ty<T>::unpack(ld_cg16(peers->bufs[r] + half + (i - lo) * 16), v);
#pragma unroll
            for (int k = 0; k < Ty<T>::V; k++) acc[k] += v[k];
        }
        xs[i] = Ty<T>::pack(acc);
    }
    if (threadIdx.x == 0) count[b] = c;
}

#define ALLREDUCE(NAME, T)                                                                 \
    extern "C" __global__ void NAME(T* x, long long nv, const ArPeers* peers,               \
                                    unsigned int* count, int rank, int ranks,              \
                                    long long cap) {                                       \
        pdl_enter();                                                                       \
        allreduce_impl<T>(x, nv, peers, count, rank, ranks, cap);                          \
    }
ALLREDUCE(allreduce_bf16, bf16)
ALLREDUCE(allreduce_f16, f16)
ALLREDUCE(allreduce_f32, float)

// allreduce_rms_norm: the one-shot all-reduce of x [rows, dim] fused with the RMSNorm that
// follows it in the forward (rms_norm.cu's residual form): x = T(sum over ranks), then
// residual = T(residual + x) stored back, out = residual / sqrt(mean(residual^2) + eps) * w.
// Block b owns rows b, b + grid, ...: it stages them, meets the ranks once (as
// allreduce), then reduces, adds and normalises each row (a block reduction per row).
// Every element is handled by the same thread in both passes. 16-byte vectors only
// (dim * sizeof(T) a multiple of 16; a block's rows fit its slot, cap / AR_MAX_BLOCKS).
template <typename T>
__device__ __forceinline__ void allreduce_rms_norm_impl(T* x, T* residual,
                                                        const T* __restrict__ w, T* out,
                                                        int rows, int dim, float eps,
                                                        const ArPeers* peers,
                                                        unsigned int* count, int rank,
                                                        int ranks, long long cap) {
    __shared__ unsigned int sh_c;
    __shared__ float sh[32];
    constexpr int V = Ty<T>::V;
    const int b = blockIdx.x;
    if (threadIdx.x == 0) sh_c = count[b] + 1;
    __syncthreads();
    const unsigned int c = sh_c;
    const int nv = dim / V;
    // Block b's slot holds its rows one after another (row j of the block at j * nv).
    const long long half = (long long)(c & 1u) * cap + (long long)b * (cap / AR_MAX_BLOCKS);
    uint4* mine = reinterpret_cast<uint4*>(peers->bufs[rank] + half);
    for (int r = b, j = 0; r < rows; r += gridDim.x, j++) {
        const uint4* xr = reinterpret_cast<const uint4*>(x + (long long)r * dim);
        for (int i = threadIdx.x; i < nv; i += blockDim.x) mine[(long long)j * nv + i] = xr[i];
    }
    __syncthreads();
    if (threadIdx.x < ranks) {
        st_release_sys(peers->flags[threadIdx.x] + b * AR_MAX_RANKS + rank, c);
        const unsigned int* f = peers->flags[rank] + b * AR_MAX_RANKS + threadIdx.x;
        for (unsigned int n = 1; (int)(ld_acquire_sys(f) - c) < 0; ++n)
            if ((n & AR_ABORT_POLL) == 0u && ar_aborted(peers->abort)) break;
    }
    __syncthreads();
    for (int r = b, j = 0; r < rows; r += gridDim.x, j++) {
        const long long base = (long long)r * dim;
        float ss = 0.0f;
        for (int i = threadIdx.x; i < nv; i += blockDim.x) {
            float acc[V];
#pragma unroll
            for (int e = 0; e < V; e++) acc[e] = 0.0f;
            for (int k = 0; k < ranks; k++) {
                float v[V];
                Ty<T>::unpack(ld_cg16(peers->bufs[k] + half + ((long long)j * nv + i) * 16), v);
#pragma unroll
                for (int e = 0; e < V; e++) acc[e] += v[e];
            }
            store_vec(x + base + i * V, acc);
            float res[V];
            load_vec(residual + base + i * V, res);
#pragma unroll
            for (int e = 0; e < V; e++) {
                const float s = to_f32(from_f32<T>(acc[e]));
                res[e] = to_f32(from_f32<T>(res[e] + s));
                ss += res[e] * res[e];
            }
            store_vec(residual + base + i * V, res);
        }
        ss = block_sum(ss, sh);
        const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int i = threadIdx.x; i < nv; i += blockDim.x) {
            float a[V], g[V];
            load_vec(residual + base + i * V, a);
            load_vec(w + i * V, g);
#pragma unroll
            for (int e = 0; e < V; ++e) a[e] = a[e] * inv * g[e];
            store_vec(out + base + i * V, a);
        }
    }
    if (threadIdx.x == 0) count[b] = c;
}

#define ALLREDUCE_RMS_NORM(NAME, T)                                                        \
    extern "C" __global__ void NAME(T* x, T* residual, const T* w, T* out, int rows,        \
                                    int dim, float eps, const ArPeers* peers,              \
                                    unsigned int* count, int rank, int ranks,              \
                                    long long cap) {                                       \
        pdl_enter();                                                                       \
        allreduce_rms_norm_impl<T>(x, residual, w, out, rows, dim, eps, peers, count, rank, \
                                   ranks, cap);                                            \
    }
ALLREDUCE_RMS_NORM(allreduce_rms_norm_bf16, bf16)
ALLREDUCE_RMS_NORM(allreduce_rms_norm_f16, f16)
ALLREDUCE_RMS_NORM(allreduce_rms_norm_f32, float)

// pushed_rms_norm: the second half of the pushed all-reduce (gemv.cu's gemv_push_*, whose
// comment gives the protocol), buffer c = (*count + 1) % 3: for each of the rows, each
// thread waits until its 16-byte vectors of every source rank's slot in buffer c hold no
// unwritten element (volatile loads of the data itself), puts the all-ones bits back,
// then x = T(sum over the source ranks in rank order, f32), residual = T(residual + x)
// stored back, out = residual / sqrt(mean(residual^2) + eps) * w (allreduce_rms_norm's
// arithmetic, so every rank computes bit-identical values). One CTA; it sets *count to c
// at the end. x: T [rows, dim], dim * sizeof(T) a multiple of 16, rows <= PUSH_MAX_ROWS.
// The one kernel that does not start with the PDL wait: it waits on its data instead, so
// it starts polling while the gemv before it still runs, and lets the next kernel launch
// once every element has arrived. It reads nothing that gemv writes except the polled
// staging; what it reads from earlier kernels (count, residual) was complete before that
// gemv passed its own wait (the norm before the gemv's predecessor, at least two kernels
// back), and it reads those past L1. `PUSHED_NORM_WAITS` (ENCORE_KERNEL_DEFINES) restores
// the wait, for comparisons.
#define PUSH_MAX_ROWS 8   // rows of one call (the gemv's most)
#define PUSH_POLL_RANKS 4 // source ranks whose vectors one polling round loads together
template <typename T>
__device__ __forceinline__ void pushed_rms_norm_impl(T* x, T* residual, const T* __restrict__ w,
                                                     T* out, int rows, int dim, float eps,
                                                     const ArPush* push, unsigned int* count,
                                                     int rank, int ranks, long long cap) {
    __shared__ unsigned int sh_c;
    __shared__ float sh[32];
    __shared__ float sh_inv[PUSH_MAX_ROWS];
    constexpr int V = Ty<T>::V;
    const int nv = dim / V;
#ifdef PUSHED_NORM_WAITS
    pdl_enter();
#endif
    // First the loads that do not wait for the gemv, all in flight together: the count,
    // the norm weight and row 0's residual of this thread's first vector (the residual was
    // complete two kernels back; read past L1).
    const bool first = threadIdx.x < nv;
    uint4 w0 = make_uint4(0u, 0u, 0u, 0u), r0 = w0;
    if (first) {
        w0 = ldg16(w + threadIdx.x * V);
        r0 = ld_cg16(residual + threadIdx.x * V);
    }
    if (threadIdx.x == 0) sh_c = (ld_volatile_u32(count) + 1) % 3u;
    __syncthreads();
    const unsigned int c = sh_c;
    char* bufs = push->bufs[rank] + (long long)c * AR_MAX_RANKS * cap;
    // Rounds this thread has waited, and whether the group's abort ended its waits (then
    // the later ones end at once too).
    unsigned int spins = 0;
    bool gave_up = false;
    const uint4 unwritten = make_uint4(~0u, ~0u, ~0u, ~0u);
    // Pass 1, per row: for each vector, wait until every source rank's has arrived
    // (volatile loads of PUSH_POLL_RANKS ranks in flight together per round), put the
    // all-ones bits back, x = the sum in rank order, residual += x; then the row's scale.
    for (int r = 0; r < rows; r++) {
        const long long base = (long long)r * dim;
        float ss = 0.0f;
        for (int i = threadIdx.x; i < nv; i += blockDim.x) {
            const long long at = (base + i * V) * (long long)sizeof(T);
            float acc[V];
#pragma unroll
            for (int e = 0; e < V; e++) acc[e] = 0.0f;
            for (int k0 = 0; k0 < ranks; k0 += PUSH_POLL_RANKS) {
                uint4 u[PUSH_POLL_RANKS];
                for (bool pending = true; pending;) {
#pragma unroll
                    for (int k = 0; k < PUSH_POLL_RANKS; k++)
                        if (k0 + k < ranks) u[k] = ld_volatile16(bufs + (k0 + k) * cap + at);
                    pending = false;
#pragma unroll
                    for (int k = 0; k < PUSH_POLL_RANKS; k++)
                        if (k0 + k < ranks) pending |= push_unwritten(u[k], sizeof(T));
                    if (pending &&
                        (gave_up || ((++spins & AR_ABORT_POLL) == 0u && ar_aborted(push->abort)))) {
                        gave_up = true;
                        pending = false;
                    }
                }
#pragma unroll
                for (int k = 0; k < PUSH_POLL_RANKS; k++) {
                    if (k0 + k < ranks) {
                        *reinterpret_cast<uint4*>(bufs + (k0 + k) * cap + at) = unwritten;
                        float v[V];
                        Ty<T>::unpack(u[k], v);
#pragma unroll
                        for (int e = 0; e < V; e++) acc[e] += v[e];
                    }
                }
            }
            store_vec(x + base + i * V, acc);
            float res[V];
            const bool kept = r == 0 && i == threadIdx.x;  // r0 holds it
            Ty<T>::unpack(kept ? r0 : ld_cg16(residual + base + i * V), res);
#pragma unroll
            for (int e = 0; e < V; e++) {
                const float s = to_f32(from_f32<T>(acc[e]));
                res[e] = to_f32(from_f32<T>(res[e] + s));
                ss += res[e] * res[e];
            }
            const uint4 packed = Ty<T>::pack(res);
            st16(residual + base + i * V, packed);
            if (kept) r0 = packed;  // from here on r0 is the new residual
        }
        ss = block_sum(ss, sh);
        if (threadIdx.x == 0) sh_inv[r] = 1.0f / sqrtf(ss / (float)dim + eps);
    }
    // Every element has arrived: let the next kernel launch.
    __syncthreads();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
    // Pass 2: out = residual * inv * w.
    for (int r = 0; r < rows; r++) {
        const long long base = (long long)r * dim;
        const float inv = sh_inv[r];
        for (int i = threadIdx.x; i < nv; i += blockDim.x) {
            float a[V], g[V];
            if (r == 0 && i == threadIdx.x) {
                Ty<T>::unpack(r0, a);
                Ty<T>::unpack(w0, g);
            } else {
                Ty<T>::unpack(ld_cg16(residual + base + i * V), a);
                load_vec(w + i * V, g);
            }
#pragma unroll
            for (int e = 0; e < V; ++e) a[e] = a[e] * inv * g[e];
            store_vec(out + base + i * V, a);
        }
    }
    if (threadIdx.x == 0) *count = c;
}

#define PUSHED_RMS_NORM(NAME, T)                                                           \
    extern "C" __global__ void __launch_bounds__(1024)                                     \
        NAME(T* x, T* residual, const T* w, T* out, int rows, int dim, float eps,          \
             const ArPush* push, unsigned int* count, int rank, int ranks, long long cap) { \
        pushed_rms_norm_impl<T>(x, residual, w, out, rows, dim, eps, push, count, rank,    \
                                ranks, cap);                                               \
    }
PUSHED_RMS_NORM(pushed_rms_norm_bf16, bf16)
PUSHED_RMS_NORM(pushed_rms_norm_f16, f16)
PUSHED_RMS_NORM(pushed_rms_norm_f32, float)
