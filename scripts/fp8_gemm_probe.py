#!/usr/bin/env python3
"""What Hopper's FP8 GEMM gives at Llama-3-8B's prefill shapes by scaling recipe, through
PyTorch's torch._scaled_mm (cuBLASLt or CUTLASS, as PyTorch picks): per-tensor scales,
row-wise (per token x per channel) and 1x128 blocks; bf16 torch.mm as the reference.
CUDA events, medians of 20 after 5 warm-ups. Usage: fp8_gemm_probe.py"""
import torch

def bench(f, iters=20):
    for _ in range(5):
        f()
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); f(); e.record(); e.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]

print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())
for m, n, k in [(8192, 6144, 4096), (8192, 4096, 4096), (8192, 28672, 4096), (8192, 4096, 14336),
                (512, 6144, 4096), (512, 28672, 4096), (512, 4096, 14336), (2048, 6144, 4096)]:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    fl = 2 * m * n * k
    row = [f"{m}x{n}x{k}"]
    ms = bench(lambda: torch.mm(a, b.t()))
    row.append(f"bf16 {fl / ms / 1e9:7.1f}")
    a8 = a.to(torch.float8_e4m3fn); b8 = b.to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    try:
        ms = bench(lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
        row.append(f"tensor {fl / ms / 1e9:7.1f}")
    except Exception as ex:
        row.append(f"tensor ERR {str(ex)[:60]}")
    try:
        sa = torch.rand(m, 1, device="cuda") + 0.5; sb = torch.rand(1, n, device="cuda") + 0.5
        ms = bench(lambda: torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16))
        row.append(f"rowwise {fl / ms / 1e9:7.1f}")
    except Exception as ex:
        row.append(f"rowwise ERR {str(ex)[:80]}")
    try:
        sa = torch.rand(m, k // 128, device="cuda") + 0.5
        sb = torch.rand(n, k // 128, device="cuda") + 0.5
        sa_t = sa.t().contiguous().t()  # outer dim contiguous, as cuBLASLt wants
        sb_t = sb.t().contiguous().t()
        ms = bench(lambda: torch._scaled_mm(a8, b8.t(), scale_a=sa_t, scale_b=sb_t.t(), out_dtype=torch.bfloat16))
        row.append(f"1x128 {fl / ms / 1e9:7.1f}")
    except Exception as ex:
        row.append(f"1x128 ERR {str(ex)[:80]}")
    print("  ".join(row), "TFLOP/s", flush=True)
