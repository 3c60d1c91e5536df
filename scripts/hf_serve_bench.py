"""The peer for `encore bench serve`: transformers' own continuous batching (the
`ContinuousBatchingManager` behind `generate_batch`: paged attention, chunked prefill, its
CUDA graphs) on the same random-weight shapes (scripts/hf_decode_bench.py) and the same
request distribution as scripts/gpu-bench-serve.sh: prompts of uniform random length and
random token ids, outputs of uniform random length with end-of-sequence ignored.

    python3 scripts/hf_serve_bench.py [--models llama-3.2-1b,llama-3-8b] [--num-prompts 1000]
        [--input-len 128:1024] [--output-len 64:512] [--seed 0] [--trace-out FILE.jsonl]
        [--device cuda|cpu] [--json]

Every request is submitted at once (saturation, as `bench serve --request-rate inf`), each
with its own `max_new_tokens`; the clock runs from the first submission to the last result.
A warm-up of a few requests runs first (the manager's graph capture and kernel start-up
are not timed). Reports request and output-token throughput and the output tokens
actually produced (checked against the requested counts).

The exact request set (prompt lengths and output lengths) can be written with
--trace-out as JSONL ({"prompt_len", "output_len"} per line) for `encore bench serve
--trace`. Version-sensitive API details (attention implementation name, config fields) are
probed at run time and printed to stderr.
"""

import argparse
import inspect
import json
import os
import random
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, GenerationConfig  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_prefill_bench  # noqa: E402


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def span(s):
    lo, _, hi = s.partition(":")
    lo = int(lo)
    hi = int(hi) if hi else lo
    assert 1 <= lo <= hi, s
    return lo, hi


def requests(n, inp, out, seed, vocab):
    rng = random.Random(seed)
    reqs = []
    for _ in range(n):
        p = rng.randint(*inp)
        o = rng.randint(*out)
        reqs.append(([rng.randrange(vocab) for _ in range(p)], o))
    return reqs


def attn_candidates():
    """Paged attention implementations, fastest first: flash-attention when the package is
    installed (transformers then turns on its CUDA graphs and async batching), else sdpa
    (which needs an attention mask: no graphs by default)."""
    names = []
    try:
        import flash_attn  # noqa: F401
        names.append("paged|flash_attention_2")
    except ImportError:
        log("flash_attn is not installed: paged sdpa")
    return names + ["paged|sdpa", "sdpa_paged"]


def build(cfg, device, attn):
    last = None
    for impl in [attn] if attn else attn_candidates():
        try:
            torch.manual_seed(0)
            # Built on the device: an 8B random init on the host takes minutes.
            with torch.device(device):
                m = AutoModelForCausalLM.from_config(
                    cfg, attn_implementation=impl,
                    dtype=torch.bfloat16 if device == "cuda" else torch.float32,
                ).eval()
            log(f"attn_implementation={impl}")
            return m
        except Exception as e:  # noqa: BLE001 - try the next name
            last = e
    raise SystemExit(f"no paged attention implementation in transformers "
                     f"{transformers.__version__}: {last}")


def manager_cm(model, reqs, max_out, cuda_graph):
    """The context manager `generate_batch` itself uses (its warm-up capture included), with
    the workload hints it would compute for these requests."""
    gc = GenerationConfig(max_new_tokens=max_out, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    kwargs = {"generation_config": gc, "block": True, "timeout": 5}
    params = inspect.signature(model.continuous_batching_context_manager).parameters
    from transformers.generation import ContinuousBatchingConfig
    cb = ContinuousBatchingConfig()
    if cuda_graph != "auto":
        cb.use_cuda_graph = cuda_graph == "on"
    kwargs["continuous_batching_config"] = cb
    if "workload_hints" in params:
        from transformers.generation.continuous_batching.utils import WorkloadHints
        kwargs["workload_hints"] = WorkloadHints(
            max_prompt_length=max(len(ids) for ids, _ in reqs),
            max_generated_length=max_out, num_requests=len(reqs))
    if "warmup" in params:
        kwargs["warmup"] = True
    log("continuous_batching_context_manager", sorted(kwargs))
    return model.continuous_batching_context_manager(**kwargs)


def run(mgr, reqs, tag):
    """Submit every request to the running manager and collect every result; (seconds,
    output tokens produced per request)."""
    t0 = time.perf_counter()
    for i, (ids, n) in enumerate(reqs):
        mgr.add_request(ids, request_id=f"{tag}{i}", max_new_tokens=n)
    produced = {}
    while len(produced) < len(reqs):
        r = mgr.get_result(timeout=60)
        if r is None:
            if not mgr.is_running():
                raise SystemExit("the transformers manager stopped early")
            continue
        if r.is_finished():
            produced[r.request_id] = len(r.generated_tokens)
    return time.perf_counter() - t0, produced


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="llama-3.2-1b,llama-3-8b")
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--input-len", type=span, default=(128, 1024))
    ap.add_argument("--output-len", type=span, default=(64, 512))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--trace-out")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--attn", help="attn_implementation (default: the fastest available)")
    ap.add_argument("--cuda-graph", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    log(f"transformers {transformers.__version__}, torch {torch.__version__}")
    shapes = hf_prefill_bench.shapes()
    for name in a.models.split(","):
        cfg = shapes[name]
        reqs = requests(a.num_prompts, a.input_len, a.output_len, a.seed, cfg.vocab_size)
        if a.trace_out:
            with open(a.trace_out, "w") as f:
                for ids, n in reqs:
                    f.write(json.dumps({"prompt_len": len(ids), "output_len": n}) + "\n")
        model = build(cfg, a.device, a.attn)
        max_out = a.output_len[1]
        with torch.no_grad(), manager_cm(model, reqs, max_out, a.cuda_graph) as mgr:
            # The warm-up requests pay what the manager's own warm-up left (kernel start-up).
            warm = requests(a.warmup, a.input_len, a.output_len, a.seed + 1, cfg.vocab_size)
            wdt, _ = run(mgr, warm, "w")
            log(f"{name}: warm-up of {a.warmup} requests took {wdt:.1f} s")
            dt, produced = run(mgr, reqs, "r")
        want = sum(n for _, n in reqs)
        got = sum(produced.values())
        prompt = sum(len(ids) for ids, _ in reqs)
        row = {
            "peer": "transformers-continuous-batching",
            "transformers": transformers.__version__,
            "model": name,
            "attn_implementation": model.config._attn_implementation,
            "cuda_graph": a.cuda_graph,
            "num_prompts": len(reqs),
            "prompt_tokens": prompt,
            "output_tokens": got,
            "output_tokens_requested": want,
            "duration_s": dt,
            "request_throughput": len(reqs) / dt,
            "output_throughput": got / dt,
            "total_token_throughput": (got + prompt) / dt,
        }
        print(json.dumps(row) if a.json else
              f"{name}: {len(reqs)} requests in {dt:.1f} s, {got / dt:.0f} output tok/s "
              f"({got} of {want} requested tokens)", flush=True)
        del model
        if a.device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
