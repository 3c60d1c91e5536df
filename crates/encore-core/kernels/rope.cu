// rope: rotary embedding in place on q [n, num_heads, head_dim] and k
// [n, num_kv_heads, head_dim], NeoX / HF "rotate half" layout over the first `rot` dims.
// cos_sin is f32 [max_positions, rot]: cos(p f_0 .. f_{rot/2-1}) then sin(..).
// For i < half = rot/2: x_i' = x_i c_i - x_{i+half} s_i, x_{i+half}' = x_{i+half} c_i + x_i s_i.
// Tokens whose position (read from device memory) is outside 0..max_positions are left
// untouched. Dims >= rot are never touched.
// Grid: (n); one block per token; threads stride over (head, pair-group) items, a pair
// group being V consecutive i (16-byte loads of both halves) when `vec`
// (half % V == 0, head_dim * sizeof(T) % 16 == 0, q/k/cos_sin 16-byte aligned), else one i.

template <typename T>
__device__ __forceinline__ void rope_impl(T* q, T* k, const int* __restrict__ positions,
                                          const float* __restrict__ cos_sin, int num_heads,
                                          int num_kv_heads, int head_dim, int rot,
                                          int max_positions, int vec) {
    constexpr int V = Ty<T>::V;
    const long long tok = blockIdx.x;
    const int p = positions[tok];
    if (p < 0 || p >= max_positions) return;
    const int half = rot / 2;
    const float* cs = cos_sin + (long long)p * rot;
    const int groups = vec ? half / V : half;
    const int items = (num_heads + num_kv_heads) * groups;
    for (int it = threadIdx.x; it < items; it += blockDim.x) {
        const int h = it / groups;
        const int j = it - h * groups;
        T* x = h < num_heads ? q + (tok * num_heads + h) * head_dim
                             : k + (tok * num_kv_heads + (h - num_heads)) * head_dim;
        if (vec) {
            const int i0 = j * V;
            float a[V], b[V], c[V], s[V];
            load_vec(x + i0, a);
            load_vec(x + half + i0, b);
#pragma unroll
            for (int e = 0; e < V; e += 4) {
                const float4 c4 = *reinterpret_cast<const float4*>(cs + i0 + e);
                const float4 s4 = *reinterpret_cast<const float4*>(cs + half + i0 + e);
                c[e] = c4.x, c[e + 1] = c4.y, c[e + 2] = c4.z, c[e + 3] = c4.w;
                s[e] = s4.x, s[e + 1] = s4.y, s[e + 2] = s4.z, s[e + 3] = s4.w;
            }
            float o1[V], o2[V];
#pragma unroll
            for (int e = 0; e < V; ++e) {
                o1[e] = a[e] * c[e] - b[e] * s[e];
                o2[e] = b[e] * c[e] + a[e] * s[e];
            }
            store_vec(x + i0, o1);
            store_vec(x + half + i0, o2);
        } else {
            const float a = to_f32(x[j]), b = to_f32(x[j + half]);
            const float c = cs[j], s = cs[half + j];
            x[j] = from_f32<T>(a * c - b * s);
            x[j + half] = from_f32<T>(b * c + a * s);
        }
    }
}

#define ROPE(NAME, T)                                                                      \
    extern "C" __global__ void NAME(T* q, T* k, const int* positions, const float* cos_sin, \
                                    int num_heads, int num_kv_heads, int head_dim, int rot,  \
                                    int max_positions, int vec) {                           \
        pdl_enter();                                                                        \
        rope_impl<T>(q, k, positions, cos_sin, num_heads, num_kv_heads, head_dim, rot,     \
                     max_positions, vec);                                                  \
    }
ROPE(rope_bf16, bf16)
ROPE(rope_f16, f16)
ROPE(rope_f32, float)
