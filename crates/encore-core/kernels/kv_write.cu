// kv_write: token i's keys and values go to cache slot slot_mapping[i]
// (= block * block_size + row); slots < 0 (padding) or >= num_blocks * block_size are
// skipped. Cache layout [num_blocks, block_size, num_kv_heads, head_dim], so one slot is
// one contiguous row of `row_elems` = num_kv_heads * head_dim elements.
// Grid: (n); one block per token, threads copy the row (16 bytes at a time when `vec`:
// row_elems * sizeof(T) % 16 == 0 and all four base pointers aligned). Bit-exact copy.

template <typename T>
__device__ __forceinline__ void kv_write_impl(const T* __restrict__ k, const T* __restrict__ v,
                                              T* __restrict__ k_cache, T* __restrict__ v_cache,
                                              const int* __restrict__ slot_mapping,
                                              int row_elems, long long num_slots, int vec) {
    const long long tok = blockIdx.x;
    const long long slot = slot_mapping[tok];
    if (slot < 0 || slot >= num_slots) return;
    const T* ks = k + tok * row_elems;
    const T* vs = v + tok * row_elems;
    T* kd = k_cache + slot * row_elems;
    T* vd = v_cache + slot * row_elems;
    if (vec) {
        constexpr int V = Ty<T>::V;
        const int nv = row_elems / V;
        for (int i = threadIdx.x; i < nv; i += blockDim.x) {
            st16(kd + (long long)i * V, ld16(ks + (long long)i * V));
            st16(vd + (long long)i * V, ld16(vs + (long long)i * V));
        }
    } else {
        for (int i = threadIdx.x; i < row_elems; i += blockDim.x) {
            kd[i] = ks[i];
            vd[i] = vs[i];
        }
    }
}

#define KV_WRITE(NAME, T)                                                                  \
    extern "C" __global__ void NAME(const T* k, const T* v, T* k_cache, T* v_cache,        \
                                    const int* slot_mapping, int row_elems,                \
                                    long long num_slots, int vec) {                         \
        pdl_enter();                                                                        \
        kv_write_impl<T>(k, v, k_cache, v_cache, slot_mapping, row_elems, num_slots, vec); \
    }
KV_WRITE(kv_write_bf16, bf16)
KV_WRITE(kv_write_f16, f16)
KV_WRITE(kv_write_f32, float)
