// silu_mul: out[i, j] = act(gate_up[i, j]) * gate_up[i, inter + j], act SiLU (x/(1+e^-x))
// or another gated activation by `act` (common.cuh's act_mul_f32).
// Grid: (ceil(cols / blockDim), min(rows, 65535)); blocks stride over rows by gridDim.y.
// `cols` counts 16-byte vectors when `vec` (inter * sizeof(T) % 16 == 0 and both base
// pointers aligned), elements otherwise.

template <typename T>
__device__ __forceinline__ void silu_mul_impl(const T* __restrict__ gu, T* __restrict__ out,
                                              int rows, int inter, int vec, int act) {
    constexpr int V = Ty<T>::V;
    const int cols = vec ? inter / V : inter;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
        const T* g = gu + r * 2 * inter;
        const T* u = g + inter;
        T* o = out + r * inter;
        if (vec) {
            float a[V], b[V];
            load_vec(g + (long long)c * V, a);
            load_vec(u + (long long)c * V, b);
#pragma unroll
            for (int e = 0; e < V; ++e) a[e] = act_mul_f32(act, a[e], b[e]);
            store_vec(o + (long long)c * V, a);
        } else {
            o[c] = from_f32<T>(act_mul_f32(act, to_f32(g[c]), to_f32(u[c])));
        }
    }
}

#define SILU_MUL(NAME, T)                                                                  \
    extern "C" __global__ void NAME(const T* gate_up, T* out, int rows, int inter,         \
                                    int vec, int act) {                                     \
        pdl_enter();                                                                        \
        silu_mul_impl<T>(gate_up, out, rows, inter, vec, act);                             \
    }
SILU_MUL(silu_mul_bf16, bf16)
SILU_MUL(silu_mul_f16, f16)
SILU_MUL(silu_mul_f32, float)

// scale: x[i] = x[i] * s in place, then cap * tanh(x[i] / cap) when cap > 0, rounded to
// T (Gemma's embedding times sqrt(hidden); Gemma 2's final logit soft-capping).
// Grid: ceil(total / blockDim), one element a thread.
template <typename T>
__device__ __forceinline__ void scale_impl(T* __restrict__ x, float s, float cap,
                                           long long total) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    float v = to_f32(x[i]) * s;
    if (cap > 0.0f) v = cap * tanhf(v / cap);
    x[i] = from_f32<T>(v);
}

#define SCALE(NAME, T)                                                                     \
    extern "C" __global__ void NAME(T* x, float s, float cap, long long total) {           \
        pdl_enter();                                                                        \
        scale_impl<T>(x, s, cap, total);                                                   \
    }
SCALE(scale_bf16, bf16)
SCALE(scale_f16, f16)
SCALE(scale_f32, float)
