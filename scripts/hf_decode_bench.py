"""The peer figure for `encore bench decode`: Hugging Face transformers with a static KV
cache and one CUDA graph per batch size, on the same GPU, at the same model shapes
(random bf16 weights), the same context (128 tokens) and batch sizes.

    python3 scripts/hf_decode_bench.py [--models qwen2.5-0.5b,llama-3.2-1b,llama-3-8b,smollm2-135m]
                                       [--batch 1,8,32,128,256] [--context 128] [--steps 20]

Per batch size: prefill `context` random tokens eagerly into a StaticCache, capture one
decode step (forward + greedy argmax) in a CUDA graph after warm-up on a side stream,
then time replays with CUDA events (the next token and position are updated in place on
the device between replays); the median step time is printed. `--device cpu` runs the
same steps eagerly (to check the script without a GPU).
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, StaticCache  # noqa: E402


def shapes():
    return {
        "qwen2.5-0.5b": Qwen2Config(
            vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
            num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True,
            max_position_embeddings=32768, rms_norm_eps=1e-6,
        ),
        "llama-3.2-1b": LlamaConfig(
            vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
            num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True,
            max_position_embeddings=131072,
        ),
        "smollm2-135m": LlamaConfig(
            vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
            num_attention_heads=9, num_key_value_heads=3, head_dim=64, tie_word_embeddings=True,
            max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
        ),
        "llama-3-8b": LlamaConfig(
            vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
        ),
    }


def bench(model, cfg, batch, context, steps, device):
    vocab = cfg.vocab_size
    cache = StaticCache(config=cfg, max_cache_len=context + steps + 8)
    ids = torch.randint(0, vocab, (batch, context), device=device)
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, cache_position=torch.arange(context, device=device),
              use_cache=True)
        tok = torch.zeros(batch, 1, dtype=torch.long, device=device)
        pos = torch.tensor([context], dtype=torch.long, device=device)

        def step():
            logits = model(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True).logits
            return logits[:, -1].argmax(-1, keepdim=True)

        if device == "cpu":
            times = []
            for _ in range(steps):
                t = time.perf_counter()
                nxt = step()
                tok.copy_(nxt)
                pos.add_(1)
                times.append((time.perf_counter() - t) * 1e3)
            return statistics.median(times), 0.0
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        t0 = time.perf_counter()
        with torch.cuda.graph(graph):
            nxt = step()
        torch.cuda.synchronize()
        capture_ms = (time.perf_counter() - t0) * 1e3
        times = []
        for _ in range(steps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            tok.copy_(nxt)
            pos.add_(1)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times[3:]), capture_ms


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="qwen2.5-0.5b,llama-3.2-1b,llama-3-8b")
    p.add_argument("--batch", default="1,8,32,128,256")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    torch.manual_seed(0)
    dev = a.device
    print(f"transformers static cache + CUDA graph, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(0) if dev == 'cuda' else 'cpu'}")
    for name in a.models.split(","):
        cfg = shapes()[name]
        cfg._attn_implementation = "sdpa"
        dtype = torch.bfloat16 if dev == "cuda" else torch.float32
        with torch.device(dev):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
        print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e9:.3f} B parameters")
        print(f"{'batch':>6} {'step ms':>10} {'tok/s':>12} {'capture ms':>11}")
        for b in [int(x) for x in a.batch.split(",")]:
            ms, cap = bench(model, cfg, b, a.context, a.steps, dev)
            print(f"{b:>6} {ms:>10.3f} {b / ms * 1e3:>12.1f} {cap:>11.1f}", flush=True)
        del model
        if dev == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
