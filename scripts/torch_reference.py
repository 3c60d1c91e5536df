"""PyTorch figures on the same GPU, the reference `encore bench kernels` is compared with:
bf16/f16 GEMM at 4096^3 (cuBLAS through torch.matmul) and device-to-device copy bandwidth.
Timed with CUDA events, warm-up excluded, median of several repeats (as METHOD.md says)."""
import statistics

import torch


def time_ms(fn, iters, repeats=5):
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / iters)
    return statistics.median(samples)


def main():
    torch.manual_seed(0)
    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    for dtype in (torch.bfloat16, torch.float16):
        n = 4096
        a = torch.randn(n, n, device=dev, dtype=dtype)
        w = torch.randn(n, n, device=dev, dtype=dtype)
        ms = time_ms(lambda: torch.matmul(a, w.t()), 50)
        print(f"torch gemm {n}x{n}x{n} {dtype}: {2 * n**3 / ms / 1e9:.1f} TFLOP/s ({ms:.3f} ms)")
    for (m, n, k) in ((1, 4096, 4096), (64, 14336, 4096)):
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        ms = time_ms(lambda: torch.matmul(a, w.t()), 200)
        print(f"torch gemm {m}x{n}x{k} bf16: {2 * m * n * k / ms / 1e9:.2f} TFLOP/s ({ms * 1e3:.1f} us)")
    nbytes = 1 << 30
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), 20)
    print(f"torch device copy 1024 MiB: {2 * nbytes / ms / 1e6:.0f} GB/s (read + write)")


if __name__ == "__main__":
    main()
