// rms_norm: out = x / sqrt(mean(x^2) + eps) * w, optionally fused with the residual add
// (residual = T(residual + x) is stored back first and the norm is computed from the
// stored, rounded value).
// With `plain`, no norm: out = the (summed) input, for a layer without a norm before its
// next block (OLMo 2). x's and out's rows are `ld` apart (`ld` >= dim: a norm of some
// columns of a wider row, in place: OLMo 2's q and k norms on the fused q/k/v rows).
// With `pre_w` (and a residual): x is first normed by pre_w and rounded to T, the normed
// value added to the residual (a block's output norm, the residual add and the next norm
// in one kernel: Gemma's and OLMo 2's post norms).
// LN (the `layer_norm_*` entry points): LayerNorm with a bias instead, out = (x - mean) /
// sqrt(var + eps) * w + b, var the population variance; pass 1 sums the values, a second
// pass over the stored input sums the squared deviations from the mean (no pre_w, no
// plain). The RMSNorm instantiation compiles none of it.
// Grid: (rows); one block per row. Pass 1 reads x (and residual), writes residual and
// accumulates the sum of squares; a block reduction; pass 2 re-reads the (now stored)
// input and writes out. Every element is handled by the same thread in both passes and
// the reduction synchronises the block, so `out` may alias `x`.

template <typename T, bool LN>
__device__ __forceinline__ void norm_impl(const T* x, T* residual, const T* __restrict__ w,
                                          const T* __restrict__ b, T* out, int dim, float eps,
                                          int has_res, int vec, long long ld, int plain,
                                          const T* __restrict__ pre_w) {
    __shared__ float sh[32];
    constexpr int V = Ty<T>::V;
    const long long base = (long long)blockIdx.x * ld;
    const T* xr = x + base;
    T* rr = has_res ? residual + (long long)blockIdx.x * dim : nullptr;
    T* orow = out + base;
    // The row the norm is computed from (the stored residual when fused).
    const T* src = has_res ? (const T*)rr : xr;

    // The pre-norm's scale of x.
    float inv_x = 1.0f;
    if (pre_w) {
        float sx = 0.0f;
        if (vec) {
            for (int i = threadIdx.x; i < dim / V; i += blockDim.x) {
                float a[V];
                load_vec(xr + i * V, a);
#pragma unroll
                for (int e = 0; e < V; ++e) sx += a[e] * a[e];
            }
        } else {
            for (int i = threadIdx.x; i < dim; i += blockDim.x) {
                const float a = to_f32(xr[i]);
                sx += a * a;
            }
        }
        sx = block_sum(sx, sh);
        inv_x = 1.0f / sqrtf(sx / (float)dim + eps);
    }

    float ss = 0.0f;
    if (vec) {
        const int nv = dim / V;
        for (int i = threadIdx.x; i < nv; i += blockDim.x) {
            float a[V];
            load_vec(xr + i * V, a);
            if (pre_w) {
                float g[V];
                load_vec(pre_w + i * V, g);
#pragma unroll
                for (int e = 0; e < V; ++e) a[e] = to_f32(from_f32<T>(a[e] * inv_x * g[e]));
            }
            if (has_res) {
                float r[V];
                load_vec(rr + i * V, r);
#pragma unroll
                for (int e = 0; e < V; ++e) a[e] = to_f32(from_f32<T>(r[e] + a[e]));
                store_vec(rr + i * V, a);
            }
#pragma unroll
            for (int e = 0; e < V; ++e) ss += LN ? a[e] : a[e] * a[e];
        }
    } else {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) {
            float a = to_f32(xr[i]);
            if (pre_w) a = to_f32(from_f32<T>(a * inv_x * to_f32(pre_w[i])));
            if (has_res) {
                const T s = from_f32<T>(to_f32(rr[i]) + a);
                rr[i] = s;
                a = to_f32(s);
            }
            ss += LN ? a : a * a;
        }
    }
    ss = block_sum(ss, sh);
    // LayerNorm: ss is the sum; the squared deviations from the mean in a second pass.
    float mean = 0.0f;
    if constexpr (LN) {
        mean = ss / (float)dim;
        ss = 0.0f;
        if (vec) {
            for (int i = threadIdx.x; i < dim / V; i += blockDim.x) {
                float a[V];
                load_vec(src + i * V, a);
#pragma unroll
                for (int e = 0; e < V; ++e) ss += (a[e] - mean) * (a[e] - mean);
            }
        } else {
            for (int i = threadIdx.x; i < dim; i += blockDim.x) {
                const float a = to_f32(src[i]) - mean;
                ss += a * a;
            }
        }
        ss = block_sum(ss, sh);
    }
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    if (plain) {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) orow[i] = src[i];
        return;
    }

    if (vec) {
        const int nv = dim / V;
        for (int i = threadIdx.x; i < nv; i += blockDim.x) {
            float a[V], g[V];
            load_vec(src + i * V, a);
            load_vec(w + i * V, g);
            if constexpr (LN) {
                float c[V];
                load_vec(b + i * V, c);
#pragma unroll
                for (int e = 0; e < V; ++e) a[e] = (a[e] - mean) * inv * g[e] + c[e];
            } else {
#pragma unroll
                for (int e = 0; e < V; ++e) a[e] = a[e] * inv * g[e];
            }
            store_vec(orow + i * V, a);
        }
    } else {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) {
            if constexpr (LN) {
                const float a = (to_f32(src[i]) - mean) * inv * to_f32(w[i]) + to_f32(b[i]);
                orow[i] = from_f32<T>(a);
            } else {
                orow[i] = from_f32<T>(to_f32(src[i]) * inv * to_f32(w[i]));
            }
        }
    }
}

#define RMS_NORM(NAME, T)                                                                  \
    extern "C" __global__ void NAME(const T* x, T* residual, const T* w, T* out, int dim,  \
                                    float eps, int has_res, int vec, long long ld,          \
                                    int plain, const T* pre_w) {                            \
        pdl_enter();                                                                        \
        norm_impl<T, false>(x, residual, w, nullptr, out, dim, eps, has_res, vec, ld, plain,  \
                            pre_w);                                                         \
    }
RMS_NORM(rms_norm_bf16, bf16)
RMS_NORM(rms_norm_f16, f16)
RMS_NORM(rms_norm_f32, float)

#define LAYER_NORM(NAME, T)                                                                \
    extern "C" __global__ void NAME(const T* x, T* residual, const T* w, const T* b, T* out, \
                                    int dim, float eps, int has_res, int vec, long long ld) { \
        pdl_enter();                                                                        \
        norm_impl<T, true>(x, residual, w, b, out, dim, eps, has_res, vec, ld, 0, nullptr); \
    }
LAYER_NORM(layer_norm_bf16, bf16)
LAYER_NORM(layer_norm_f16, f16)
LAYER_NORM(layer_norm_f32, float)
