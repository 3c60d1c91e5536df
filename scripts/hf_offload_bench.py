"""The peer for `encore bench offload`: transformers + accelerate's big-model offload
(`device_map` with `max_memory`, the rest of the weights in CPU memory, copied to the GPU
by accelerate's hooks at every forward), on the Llama-3-8B shape with random weights.

Prints one JSON line per (budget, batch): the median decode step in ms over --steps steps
(greedy, KV cache, after warm-up). Run on the GPU machine:
    python3 scripts/hf_offload_bench.py --budgets 50 --batch 1
"""
import argparse
import json
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budgets", default="50")
    ap.add_argument("--batch", default="1")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--context", type=int, default=128)
    a = ap.parse_args()
    try:
        import accelerate
        from accelerate import dispatch_model, infer_auto_device_map, init_empty_weights
    except ImportError:
        print(json.dumps({"peer": "transformers+accelerate", "error": "accelerate is not installed"}))
        return
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
        rope_theta=500000.0, tie_word_embeddings=False, torch_dtype=torch.bfloat16,
    )
    total = None
    for budget in [float(x) for x in a.budgets.split(",")]:
        with init_empty_weights():
            model = LlamaForCausalLM(cfg)
        model = model.to(torch.bfloat16)
        model.to_empty(device="cpu")
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0, 0.02)
        total = sum(p.numel() * p.element_size() for p in model.parameters())
        gib = total * budget / 100 / 2**30
        dmap = infer_auto_device_map(
            model, max_memory={0: f"{gib:.2f}GiB", "cpu": "200GiB"},
            no_split_module_classes=["LlamaDecoderLayer"], dtype=torch.bfloat16,
        )
        model = dispatch_model(model, dmap)
        on_gpu = sum(1 for v in dmap.values() if v == 0)
        for batch in [int(x) for x in a.batch.split(",")]:
            ids = torch.randint(0, 128256, (batch, a.context), device="cuda:0")
            times = []
            with torch.no_grad():
                out = model(input_ids=ids, use_cache=True)
                past = out.past_key_values
                nxt = out.logits[:, -1:].argmax(-1)
                for i in range(3 + a.steps):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    out = model(input_ids=nxt, past_key_values=past, use_cache=True)
                    past = out.past_key_values
                    nxt = out.logits[:, -1:].argmax(-1)
                    torch.cuda.synchronize()
                    if i >= 3:
                        times.append((time.perf_counter() - t0) * 1e3)
            ms = statistics.median(times)
            print(json.dumps({
                "peer": f"transformers {__import__('transformers').__version__} + accelerate {accelerate.__version__}",
                "budget_fraction": budget / 100, "batch": batch, "step_ms": round(ms, 2),
                "tok_s": round(batch / ms * 1e3, 2), "modules_on_gpu": on_gpu,
                "modules": len(dmap),
            }), flush=True)
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
