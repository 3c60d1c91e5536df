"""The peer figure for `encore bench prefill`: Hugging Face transformers eager prefill
(attn_implementation="sdpa") on the same GPU, at the same model shapes as
scripts/hf_decode_bench.py (random bf16 weights; f32 on cpu).

    python3 scripts/hf_prefill_bench.py [--models qwen2.5-0.5b,llama-3.2-1b,llama-3-8b]
                                        [--tokens 16,128,512,2048] [--batch 1,4]
                                        [--repeats 10] [--device cuda|cpu] [--json]

Each model is built once (random init, eval, no grad) and freed before the next. Per
(tokens, batch): one forward of `batch` sequences of `tokens` random token ids with
use_cache=True into a fresh DynamicCache (so the KV is written as in a real prefill) and
logits_to_keep=1 (only the last position's logits are computed). The first forward at
that shape is timed on its own as cold_ms (wall clock with synchronize; the first shape of
each model also pays the one-off library and kernel start-up), then 3 warm-up forwards
are discarded and `--repeats` forwards are timed with CUDA events (perf_counter on cpu);
the median is prefill_ms and tokens_per_s = batch * tokens / prefill_ms.

With --json, one object per line on stdout:
    {"peer": "transformers", "model": ..., "tokens": ..., "batch": ..., "prefill_ms": ...,
     "tokens_per_s": ..., "cold_ms": ..., "dtype": "bfloat16", "device": "cuda"}
`--device cpu --models tiny` checks the script without a GPU.
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_decode_bench  # noqa: E402

WARMUP = 3


def shapes():
    s = hf_decode_bench.shapes()
    # Not a real model: a 2-layer shape for checking the script on cpu.
    s["tiny"] = LlamaConfig(
        vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
        max_position_embeddings=4096,
    )
    return s


def bench(model, cfg, batch, tokens, repeats, device):
    """Returns (median prefill ms, cold ms)."""
    ids = torch.randint(0, cfg.vocab_size, (batch, tokens), device=device)

    def forward():
        cache = DynamicCache(config=cfg)
        return model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    with torch.no_grad():
        sync()
        t = time.perf_counter()
        out = forward()
        sync()
        cold_ms = (time.perf_counter() - t) * 1e3
        assert out.logits.shape[1] == 1, out.logits.shape
        del out
        for _ in range(WARMUP):
            forward()
        sync()
        times = []
        for _ in range(repeats):
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                forward()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t = time.perf_counter()
                forward()
                times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), cold_ms


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="qwen2.5-0.5b,llama-3.2-1b,llama-3-8b")
    p.add_argument("--tokens", default="16,128,512,2048")
    p.add_argument("--batch", default="1,4")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--json", action="store_true", help="one JSON object per line on stdout")
    a = p.parse_args()
    torch.manual_seed(0)
    dev = a.device
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    dtype_name = str(dtype).removeprefix("torch.")
    token_counts = [int(x) for x in a.tokens.split(",")]
    batches = [int(x) for x in a.batch.split(",")]
    all_shapes = shapes()
    unknown = [m for m in a.models.split(",") if m not in all_shapes]
    if unknown:
        p.error(f"unknown model(s) {unknown}; known: {sorted(all_shapes)}")
    if not a.json:
        print(f"transformers {__import__('transformers').__version__} eager prefill (sdpa), "
              f"torch {torch.__version__}, {torch.cuda.get_device_name(0) if dev == 'cuda' else 'cpu'}, "
              f"{dtype_name}, median of {a.repeats} after {WARMUP} warm-up")
    for name in a.models.split(","):
        cfg = all_shapes[name]
        cfg._attn_implementation = "sdpa"
        with torch.device(dev):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
        if not a.json:
            print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e9:.3f} B parameters")
            print(f"{'tokens':>7} {'batch':>6} {'prefill ms':>11} {'tok/s':>12} {'cold ms':>10}")
        for n in token_counts:
            for b in batches:
                ms, cold = bench(model, cfg, b, n, a.repeats, dev)
                tps = b * n / ms * 1e3
                if a.json:
                    print(json.dumps({
                        "peer": "transformers", "model": name, "tokens": n, "batch": b,
                        "prefill_ms": round(ms, 4), "tokens_per_s": round(tps, 1),
                        "cold_ms": round(cold, 3), "dtype": dtype_name, "device": dev,
                    }), flush=True)
                else:
                    print(f"{n:>7} {b:>6} {ms:>11.3f} {tps:>12.1f} {cold:>10.1f}", flush=True)
        del model
        if dev == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
