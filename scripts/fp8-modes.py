# FP8 GEMM speed by scaling mode on this GPU (torch._scaled_mm) against bf16, at the
# prefill shapes of the 8B model (2,048 tokens). Prints ms and the ratio to bf16.
import torch
torch.manual_seed(0)
M = 2048
shapes = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
def bench(f, n=50):
    for _ in range(5): f()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(n):
        s.record(); f(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort(); return ts[len(ts)//2]
tot = {}
for N, K in shapes:
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    xf, wf = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    r = {"bf16": bench(lambda: x @ w.t())}
    one = torch.ones((), device="cuda")
    r["tensor"] = bench(lambda: torch._scaled_mm(xf, wf.t(), one, one, out_dtype=torch.bfloat16))
    sa, sb = torch.ones(M, 1, device="cuda"), torch.ones(1, N, device="cuda")
    try:
        r["row"] = bench(lambda: torch._scaled_mm(xf, wf.t(), sa, sb, out_dtype=torch.bfloat16))
    except Exception as ex:
        print("row:", str(ex)[:200])
    try:
        ba = torch.ones(M, K // 128, device="cuda")
        bb = torch.ones(N, K // 128, device="cuda")
        # 1x128 for both operands, scales M-major / N-major as torch expects.
        ba_t = ba.t().contiguous().t(); bb_t = bb.t().contiguous().t()
        r["blk1x128"] = bench(lambda: torch._scaled_mm(xf, wf.t(), ba_t, bb_t.t(), out_dtype=torch.bfloat16))
    except Exception as ex:
        print("blk:", str(ex)[:300])
    print(N, K, {k: round(v, 3) for k, v in r.items()}, {k: round(r["bf16"] / v, 2) for k, v in r.items()})
    for k, v in r.items(): tot[k] = tot.get(k, 0) + v
print("sum", {k: round(v, 3) for k, v in tot.items()}, {k: round(tot["bf16"] / v, 2) for k, v in tot.items()})
