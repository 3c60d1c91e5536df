// embedding: out[i, :] = table[ids[i] - first, :]; an id outside first..first + vocab writes
// a zero row (`first` > 0: the table is one rank's shard of a vocabulary-parallel table).
// Grid: (n); one block per token row, threads stride over the hidden dimension. A pure
// copy (bit-exact), 16 bytes at a time when `vec` (hidden * sizeof(T) % 16 == 0 and
// both base pointers 16-byte aligned).

template <typename T>
__device__ __forceinline__ void embedding_impl(const int* __restrict__ ids,
                                               const T* __restrict__ table, T* __restrict__ out,
                                               int vocab, int hidden, int vec, int first) {
    const long long row = blockIdx.x;
    const long long id = (long long)ids[row] - first;
    const bool ok = id >= 0 && id < vocab;
    const T* src = table + (long long)(ok ? id : 0) * hidden;
    T* dst = out + row * hidden;
    if (vec) {
        const int nv = hidden / Ty<T>::V;
        for (int i = threadIdx.x; i < nv; i += blockDim.x) {
            const uint4 u = ok ? ld16(src + (long long)i * Ty<T>::V) : make_uint4(0, 0, 0, 0);
            st16(dst + (long long)i * Ty<T>::V, u);
        }
    } else {
        for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
            dst[i] = ok ? src[i] : from_f32<T>(0.0f);
        }
    }
}

#define EMBEDDING(NAME, T)                                                                 \
    extern "C" __global__ void NAME(const int* ids, const T* table, T* out, int vocab,     \
                                    int hidden, int vec, int first) {                       \
        pdl_enter();                                                                        \
        embedding_impl<T>(ids, table, out, vocab, hidden, vec, first);                     \
    }
EMBEDDING(embedding_bf16, bf16)
EMBEDDING(embedding_f16, f16)
EMBEDDING(embedding_f32, float)
