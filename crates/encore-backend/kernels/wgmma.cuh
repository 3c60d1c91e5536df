// wgmma.cuh (prepended): Hopper's warpgroup MMA for attention_prefill_wg.cu: the wgmma
// instructions of bf16 / f16 (`Wg<T>`), shared-memory descriptors and the 128-byte
// swizzle, mbarriers and named barriers, and the tile kernels' shared parts (a CTA's
// sequence and tile, a row's key range, the output rows). sm_90a only: elsewhere the
// header defines only the tile shape.
#define WG_BM 128  // query rows per CTA (two warpgroups of 64)
#define WG_BN 128  // keys per tile

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <typename T> struct Wg;
// The accumulator operands of an m64nNk16 wgmma (N / 2 f32 registers a thread, d[0..])
// and their asm names (%0..).
#define WG_D32 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define WG_D64 \
    WG_D32, \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define WG_R32 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_R64 \
    WG_R32 ", " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"

// The wgmma of element type T (PTX name TY): S += A B with both from shared memory
// (K-major), O += A B with A from registers and B transposed (MN-major), N = 128 or 64;
// scale_d = 0 overwrites the accumulators.
#define WG_OPS(T, TY)                                                                      \
    template <> struct Wg<T> {                                                             \
        static __device__ __forceinline__ void ss128(float* d, unsigned long long a,      \
                                                     unsigned long long b, int scale_d) {  \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                      \
                         "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {"   \
                         WG_R64 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"                        \
                         : WG_D64                                                           \
                         : "l"(a), "l"(b), "r"(scale_d));                                   \
        }                                                                                   \
        static __device__ __forceinline__ void rs128(float* d, const unsigned int* a,     \
                                                     unsigned long long b, int scale_d) {  \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                      \
                         "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {"   \
                         WG_R64 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"          \
                         : WG_D64                                                           \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b),           \
                           "r"(scale_d));                                                   \
        }                                                                                   \
        static __device__ __forceinline__ void rs64(float* d, const unsigned int* a,      \
                                                    unsigned long long b, int scale_d) {   \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                      \
                         "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {"    \
                         WG_R32 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"          \
                         : WG_D32                                                           \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b),           \
                           "r"(scale_d));                                                   \
        }                                                                                   \
    };
WG_OPS(bf16, "bf16")
WG_OPS(f16, "f16")

// 2^x (MUFU.EX2, flushing denormals; 2^-inf = 0).
__device__ __forceinline__ float wg_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_wait0() {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Keeps the compiler from moving reads or writes of an accumulator across the wgmma that
// writes it asynchronously (the asm above only ties the registers at issue).
__device__ __forceinline__ void wg_touch(float& x) { asm volatile("" : "+f"(x)::"memory"); }
// Generic-proxy writes to shared memory (cp.async, st.shared) made visible to wgmma.
__device__ __forceinline__ void wg_proxy_fence() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// A shared-memory matrix descriptor, 128-byte swizzle.
__device__ __forceinline__ unsigned long long wg_desc(unsigned int addr, unsigned int lbo,
                                                      unsigned int sbo) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) |
           ((unsigned long long)((lbo >> 4) & 0x3FFF) << 16) |
           ((unsigned long long)((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}
// Byte offset of 16-byte chunk c (of HD / 8) of row r in a swizzled tile of `rows` rows.
__device__ __forceinline__ unsigned int wg_chunk(int r, int c, int rows) {
    return (unsigned int)((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// The CTA's (sequence, 128-row tile), found in cu_seqlens as attention_prefill.cu does
// (tiles of the longest context first); a CTA past the sequences' tiles zeroes its share
// of the padding rows (nthreads threads) and returns false.
template <typename T, int HD>
__device__ __forceinline__ bool wg_locate(const int* __restrict__ cu_seqlens, T* out,
                                          int num_seqs, int rows, int num_heads, int h,
                                          int tid, int nthreads, int& seq, int& row0,
                                          int& row_end, int& b_raw) {
    constexpr int CPR = HD / 8;
    int x = blockIdx.y;
    seq = -1;
    row0 = row_end = b_raw = 0;
    int prev = 0, first = 0;
    for (int s = 0; s < num_seqs; ++s) {
        const int cs = cu_seqlens[s], cn = cu_seqlens[s + 1];
        const int a = min(max(cs, prev), rows);
        const int b = min(max(cn, a), rows);
        if (s == 0) first = a;
        prev = b;
        const int nt = (b - a + WG_BM - 1) / WG_BM;
        if (seq < 0) {
            if (x < nt) {
                seq = s;
                const int tile = nt - 1 - x;
                row0 = a + tile * WG_BM;
                row_end = min(row0 + WG_BM, b);
                b_raw = cn;
            } else {
                x -= nt;
            }
        }
    }
    if (seq >= 0) return true;
    const int covered = prev - first;
    const int padr = rows - covered;
    const int p0 = x * WG_BM;
    if (p0 >= padr) return false;
    const int p1 = min(p0 + WG_BM, padr);
    for (int i = tid; i < (p1 - p0) * CPR; i += nthreads) {
        const int pi = p0 + i / CPR;
        const int r = pi < first ? pi : pi + covered;
        st16(out + ((long long)r * num_heads + h) * HD + (i % CPR) * 8,
             make_uint4(0u, 0u, 0u, 0u));
    }
    return false;
}

// The keys a query row of the CTA's sequence sees: [lo, hi) (its causal end, its window).
struct WgRange {
    long long pos0, max_ctx;
    int window;
    __device__ __forceinline__ void of(int r, int& lo, int& hi) const {
        const long long ctx = pos0 + r + 1;
        long long l0 = window > 0 ? ctx - window : 0;
        if (l0 < 0) l0 = 0;
        long long c = ctx < 0 ? 0 : ctx;
        if (c > max_ctx) c = max_ctx;
        if (l0 > c) l0 = c;
        lo = (int)l0;
        hi = (int)c;
    }
};
__device__ __forceinline__ WgRange wg_range(int seq_len, int b_raw, int window,
                                            int table_width, int block_size) {
    return WgRange{(long long)seq_len - b_raw, (long long)table_width * block_size, window};
}

// Normalise a thread's two rows (ra, ra + 8) of O and write them.
template <typename T, int HD>
__device__ __forceinline__ void wg_store_rows(const float* o, const float* m, const float* l,
                                              float sc, float vscale, const T* sinks, int h,
                                              int ra, int row_end, int num_heads, int t4,
                                              T* out) {
    constexpr int ND = HD / 8;
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
        float sum = l[ri];
        sum += __shfl_xor_sync(FULL_MASK, sum, 1);
        sum += __shfl_xor_sync(FULL_MASK, sum, 2);
        // What o and l are relative to (the row's max in log2 units; 0 when none seen).
        const float mu = m[ri] == NEG_INF ? 0.0f : m[ri] * sc;
        const float inv = vscale * softmax_inv(mu, sum, sinks, h);
        const int r = ra + ri * 8;
        if (r < row_end) {
            T* dst = out + ((long long)r * num_heads + h) * HD + 2 * t4;
#pragma unroll
            for (int n = 0; n < ND; ++n)
                *reinterpret_cast<unsigned int*>(dst + n * 8) =
                    Ty<T>::pack2(o[n * 4 + ri * 2] * inv, o[n * 4 + ri * 2 + 1] * inv);
        }
    }
}

// mbarriers (shared::cta, 8 bytes each) and named barriers of 256 threads.
__device__ __forceinline__ void ws_mbar_init(unsigned int bar, unsigned int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void ws_mbar_arrive(unsigned int bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar)
                 : "memory");
}
__device__ __forceinline__ void ws_mbar_wait(unsigned int bar, unsigned int parity) {
    asm volatile("{\n.reg .pred p;\nWS_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@p bra WS_DONE;\nbra WS_WAIT;\nWS_DONE:\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
__device__ __forceinline__ void ws_bar_sync(int id) {
    asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void ws_bar_arrive(int id) {
    asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}

#endif
