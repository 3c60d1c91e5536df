// qkv_rope: the attention block's work between the merged q/k/v projection and attention.
//
// Semantics: `QkvRope` in src/backend/mod.rs. qkv T [n, (num_heads + 2 * num_kv_heads) *
// head_dim]: per token, q heads then k heads then v heads. q and k heads are RMS-normalised
// over head_dim when `has_norm` (rounded to T), rotated NeoX-style over the first `rot`
// dims by the token's position (rounded to T; positions outside 0..max_positions leave the
// head as is), then q heads go to q_out [n, num_heads, head_dim] and k heads to the k cache
// at the token's slot; v heads are copied to the v cache. Slots < 0 or >= num_slots
// (padding) write nothing. The same arithmetic as rms_norm.cu. The `_kv8` variants write
// an FP8 cache (fp8_kv.cuh's kv_store: each value as T holds it, times k_inv or v_inv, in
// E4M3); the others ignore k_inv and v_inv.
//
// Grid: ceil(n * heads / QKV_WARPS) CTAs of QKV_WARPS warps; one warp per (token, head)
// item. The head passes through a per-warp shared row so a lane can read its rope partner.
// Only warp-level synchronisation: a warp with no item returns at once.

#define QKV_WARPS 4
#define QKV_MAX_HEAD_DIM 256

template <typename T, typename KV>
__device__ __forceinline__ void qkv_rope_impl(
    const T* __restrict__ qkv, const T* __restrict__ q_norm, const T* __restrict__ k_norm,
    int has_norm, float eps, const int* __restrict__ positions,
    const float* __restrict__ cos_sin, const int* __restrict__ slot_mapping, T* q_out,
    KV* k_cache, KV* v_cache, int n, int num_heads, int num_kv_heads, int head_dim, int rot,
    int max_positions, long long num_slots, float k_inv, float v_inv) {
    __shared__ float buf[QKV_WARPS][QKV_MAX_HEAD_DIM];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int heads = num_heads + 2 * num_kv_heads;
    const long long item = (long long)blockIdx.x * QKV_WARPS + warp;
    if (item >= (long long)n * heads) return;
    const long long tok = item / heads;
    const int h = (int)(item - tok * heads);
    const T* src = qkv + (tok * heads + h) * head_dim;

    T* dst = nullptr;   // a q head
    KV* kdst = nullptr;  // a k head
    const T* w = nullptr;
    if (h < num_heads) {
        dst = q_out + (tok * num_heads + h) * head_dim;
        if (has_norm) w = q_norm;
    } else {
        const long long slot = slot_mapping[tok];
        if (slot < 0 || slot >= num_slots) return;
        const bool is_k = h < num_heads + num_kv_heads;
        const int kh = is_k ? h - num_heads : h - num_heads - num_kv_heads;
        KV* at = (is_k ? k_cache : v_cache) + (slot * num_kv_heads + kh) * head_dim;
        if (!is_k) {
            for (int d = lane; d < head_dim; d += 32) kv_store(at + d, to_f32(src[d]), v_inv);
            return;
        }
        kdst = at;
        if (has_norm) w = k_norm;
    }

    float* b = buf[warp];
    float ss = 0.0f;
    for (int d = lane; d < head_dim; d += 32) {
        const float x = to_f32(src[d]);
        b[d] = x;
        ss += x * x;
    }
    if (w != nullptr) {
        ss = warp_sum(ss);
        const float inv = 1.0f / sqrtf(ss / (float)head_dim + eps);
        for (int d = lane; d < head_dim; d += 32)
            b[d] = to_f32(from_f32<T>(b[d] * inv * to_f32(w[d])));
    }
    __syncwarp();
    const int p = positions[tok];
    if (p >= 0 && p < max_positions) {
        const int half = rot / 2;
        const float* cs = cos_sin + (long long)p * rot;
        for (int i = lane; i < half; i += 32) {
            const float x = b[i], y = b[i + half];
            const float c = cs[i], s = cs[half + i];
            b[i] = to_f32(from_f32<T>(x * c - y * s));
            b[i + half] = to_f32(from_f32<T>(y * c + x * s));
        }
        __syncwarp();
    }
    if (dst != nullptr) {
        for (int d = lane; d < head_dim; d += 32) dst[d] = from_f32<T>(b[d]);
    } else {
        for (int d = lane; d < head_dim; d += 32) kv_store(kdst + d, b[d], k_inv);
    }
}

#define QKV_ROPE(NAME, T, KV)                                                               \
    extern "C" __global__ void __launch_bounds__(QKV_WARPS * 32) NAME(                      \
        const T* qkv, const T* q_norm, const T* k_norm, int has_norm, float eps,            \
        const int* positions, const float* cos_sin, const int* slot_mapping, T* q_out,      \
        KV* k_cache, KV* v_cache, int n, int num_heads, int num_kv_heads, int head_dim,     \
        int rot, int max_positions, long long num_slots, float k_inv, float v_inv) {        \
        pdl_enter();                                                                        \
        qkv_rope_impl<T, KV>(qkv, q_norm, k_norm, has_norm, eps, positions, cos_sin,        \
                             slot_mapping, q_out, k_cache, v_cache, n, num_heads,           \
                             num_kv_heads, head_dim, rot, max_positions, num_slots, k_inv,  \
                             v_inv);                                                        \
    }
QKV_ROPE(qkv_rope_bf16, bf16, bf16)
QKV_ROPE(qkv_rope_f16, f16, f16)
QKV_ROPE(qkv_rope_f32, float, float)
QKV_ROPE(qkv_rope_bf16_kv8, bf16, fp8)
QKV_ROPE(qkv_rope_f16_kv8, f16, fp8)
QKV_ROPE(qkv_rope_f32_kv8, float, fp8)
