// gather_columns: out[r, j] = x[r, perm[j]] (a GPTQ act-order projection's input in its
// weight's column order); a perm[j] outside 0..k writes 0. A pure copy (bit-exact).
// Grid: (rows, ceil(n / (256 * 4))); block 256: each thread copies up to 4 columns of one
// row, consecutive threads consecutive j (coalesced stores and perm loads; the gathered
// loads hit the row, which stays in L1/L2).

#define GATHER_THREADS 256
#define GATHER_PER_THREAD 4

template <typename T>
__device__ __forceinline__ void gather_columns_impl(const T* __restrict__ x,
                                                    const int* __restrict__ perm,
                                                    T* __restrict__ out, int k, int n) {
    const long long row = blockIdx.x;
    const T* src = x + row * k;
    T* dst = out + row * n;
    const int base = blockIdx.y * (GATHER_THREADS * GATHER_PER_THREAD) + threadIdx.x;
#pragma unroll
    for (int i = 0; i < GATHER_PER_THREAD; i++) {
        const int j = base + i * GATHER_THREADS;
        if (j < n) {
            const int p = perm[j];
            dst[j] = (p >= 0 && p < k) ? src[p] : from_f32<T>(0.0f);
        }
    }
}

#define GATHER_COLUMNS(NAME, T)                                                             \
    extern "C" __global__ void NAME(const T* x, const int* perm, T* out, int k, int n) {   \
        pdl_enter();                                                                        \
        gather_columns_impl<T>(x, perm, out, k, n);                                         \
    }
GATHER_COLUMNS(gather_columns_bf16, bf16)
GATHER_COLUMNS(gather_columns_f16, f16)
GATHER_COLUMNS(gather_columns_f32, float)

// fill_rows_i32: dst[t] = src[rows[t]] where 0 <= rows[t] < s; other entries of dst keep
// their values (asynchronous scheduling: a step's token ids from the samples of the step
// before it, on the device). Grid: ceil(n / 256); block 256, a thread an entry.
extern "C" __global__ void fill_rows_i32(const int* src, const int* rows, int* dst, int s,
                                         int n) {
    pdl_enter();
    const int t = blockIdx.x * GATHER_THREADS + threadIdx.x;
    if (t < n) {
        const int r = rows[t];
        if (r >= 0 && r < s) dst[t] = src[r];
    }
}
