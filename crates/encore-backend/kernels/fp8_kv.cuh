// fp8_kv.cuh (prepended before wgmma.cuh): the FP8 KV cache's conversions.
// ---------------------------------------------------------------------------------------
// The FP8 KV cache (`DType::F8E4M3`): one E4M3 byte an element (OCP "fn"), written by
// qkv_rope.cu and read by attention.cu / attention_prefill.cu. A value x is stored as
// e4m3(x * inv) (inv = 1 / the layer's scale, from the host), rounded to nearest (ties to
// even) and saturating at +-448, NaN to NaN: quant.rs's f32_to_e4m3. The hardware
// conversions (sm_89+) are exact on the way back (every E4M3 value is an f16).
typedef unsigned char fp8;

__device__ __forceinline__ fp8 kv_e4m3(float x) {
    unsigned short r;
    // The second source goes to the low byte.
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(0.0f), "f"(x));
    return (fp8)(r & 0xFFu);
}
// Two E4M3 bytes (the low byte first) as floats.
__device__ __forceinline__ float2 kv_e4m3x2(unsigned int b) {
    unsigned int h;
    const unsigned short b16 = (unsigned short)(b & 0xFFFFu);
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h) : "h"(b16));
    return __half22float2(*reinterpret_cast<__half2*>(&h));
}
// Four E4M3 bytes of a word as floats.
__device__ __forceinline__ void kv_e4m3x4(unsigned int w, float* o) {
    const float2 a = kv_e4m3x2(w), b = kv_e4m3x2(w >> 16);
    o[0] = a.x;
    o[1] = a.y;
    o[2] = b.x;
    o[3] = b.y;
}

// How a kernel reads one vector of Ty<T>::V elements of a K or V row: 16 bytes of T
// (KV = T), or Ty<T>::V bytes of E4M3 (KV = fp8) holding the same elements. `U` is the
// tokens per slot per step of attention.cu's split kernel: its ring holds the same bytes
// either way.
template <typename T, typename KV> struct KvVec {
    typedef uint4 type;
    static constexpr int U = sizeof(T) == 4 ? 1 : 2;
    static __device__ __forceinline__ void copy(type* dst, const KV* src, bool on) {
        cp_async16(dst, src, on);
    }
    static __device__ __forceinline__ void unpack(const type& u, float* o) { Ty<T>::unpack(u, o); }
};
template <int V> struct Fp8Vec;
template <> struct Fp8Vec<8> {
    typedef uint2 type;
    static __device__ __forceinline__ void unpack(const uint2& u, float* o) {
        kv_e4m3x4(u.x, o);
        kv_e4m3x4(u.y, o + 4);
    }
};
template <> struct Fp8Vec<4> {
    typedef unsigned int type;
    static __device__ __forceinline__ void unpack(const unsigned int& u, float* o) {
        kv_e4m3x4(u, o);
    }
};
template <typename T> struct KvVec<T, fp8> {
    typedef typename Fp8Vec<Ty<T>::V>::type type;
    static constexpr int U = sizeof(T) == 4 ? 2 : 4;
    static __device__ __forceinline__ void copy(type* dst, const fp8* src, bool on) {
        cp_async_ca<(int)sizeof(type)>(dst, src, on);
    }
    static __device__ __forceinline__ void unpack(const type& u, float* o) {
        Fp8Vec<Ty<T>::V>::unpack(u, o);
    }
};
// Store one element of a K or V row: as T, or in E4M3 times `inv`.
template <typename T> __device__ __forceinline__ void kv_store(T* dst, float x, float) {
    *dst = from_f32<T>(x);
}
__device__ __forceinline__ void kv_store(fp8* dst, float x, float inv) { *dst = kv_e4m3(x * inv); }
