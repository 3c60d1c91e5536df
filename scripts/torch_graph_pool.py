"""The peer figure for "a VMM arena so graph memory is max(shape), not sum": how much memory
PyTorch CUDA graphs need when every decode batch size gets its own graph and all graphs share
ONE graph memory pool (`torch.cuda.graph_pool_handle()` passed as `pool=` to every
`torch.cuda.graph`, as vLLM and SGLang do), against the largest bucket alone and against one
private pool per graph (the sum).

    python3 scripts/hf_decode_bench.py ...           # the decode-speed peer; this script reuses its shapes
    python3 scripts/torch_graph_pool.py [--model llama-3.2-1b|llama-3-8b|qwen2.5-0.5b]
                                        [--max-batch 256 | --buckets 1,2,4,8,...] [--context 512]
                                        [--orders largest,smallest,shuffled,private] [--seed 0]
                                        [--json] [--verbose]

Model: transformers' Llama/Qwen2 at encore's dummy shapes (random bf16 weights, sdpa). One KV
cache of max(buckets) x `context` tokens is allocated once per strategy; bucket `b` decodes into
a StaticCache whose layers are views of its first `b` rows. The decode step is a single-token
forward at position `context - 1` (position_ids / cache_position set as in hf_decode_bench.py;
the StaticLayer write offset is reset to that position before every run) followed by the
greedy argmax inside the graph; the graph keeps only small outputs alive (per row: max logit,
fp32 sum of logits, argmax token), so pool memory is the step's transient working set.

Strategies, each from a fresh state (graphs and pools freed, `torch.cuda.empty_cache()`, KV cache
re-created): shared pool with buckets captured largest first (vLLM's order), smallest first,
shuffled (fixed seed), and `private` (each graph its own pool, captured largest first). Per
bucket: one eager warm-up forward on the capture stream (as vLLM does; timed apart), then the
capture (wall time, synchronize around it). Memory = increase of `torch.cuda.memory_reserved()`
over the capture phase (after empty_cache, weights and KV cache excluded: allocated before), and
cross-checked with the bytes of the allocator segments that belong to the graph pool(s)
(`torch.cuda.memory_snapshot()`, `segment_pool_id`). `largest` = the largest bucket captured
alone into a fresh private pool, measured the same way. After all captures of a strategy every
graph is replayed once and its outputs compared with an eager forward on the same inputs.
"""

import argparse
import gc
import json
import os
import random
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, StaticCache  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_decode_bench import shapes  # noqa: E402

MIB = float(1 << 20)
ORDERS = {
    "largest": "torch-shared-pool-largest-first",
    "smallest": "torch-shared-pool-smallest-first",
    "shuffled": "torch-shared-pool-shuffled",
    "private": "torch-private-pools",
}


def vllm_buckets(max_batch):
    """vLLM's default cudagraph batch sizes: [1, 2, 4] + range(8, 256, 8) + range(256, max+1, 16)."""
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_batch + 1, 16))
    return [b for b in sizes if b <= max_batch]


def settle():
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def pool_segments(pool_ids):
    """(total bytes, allocated bytes, segment count) of the allocator segments owned by `pool_ids`."""
    ids = {tuple(p) for p in pool_ids}
    total = live = count = 0
    for seg in torch.cuda.memory_snapshot():
        if tuple(seg.get("segment_pool_id", (0, 0))) in ids:
            total += seg["total_size"]
            live += seg["allocated_size"]
            count += 1
    return total, live, count


class Slot:
    """Static state of one bucket: its KV-cache view, inputs, and (once captured) graph and outputs."""

    def __init__(self, b):
        self.b = b
        self.cache = None
        self.tok = self.pos_ids = self.cache_pos = None
        self.graph = None
        self.out = None


class PoolBench:
    def __init__(self, model, cfg, buckets, context, device, stream=None, seed=0):
        self.model, self.cfg, self.context, self.device = model, cfg, context, device
        self.buckets = sorted(set(buckets))
        self.max_b = self.buckets[-1]
        self.pos = context - 1  # decode the last position: attention spans the whole context
        self.stream = stream
        self.seed = seed
        self.kv = None
        self.slots = {}

    # ---- state -------------------------------------------------------------------------------
    def alloc_state(self):
        """Allocate the shared KV cache (max batch x context) and every bucket's views and inputs."""
        cfg = self.cfg
        dtype = next(self.model.parameters()).dtype
        heads = cfg.num_key_value_heads
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        gen = torch.Generator(device=self.device).manual_seed(self.seed)
        shape = (self.max_b, heads, self.context, hd)
        self.kv = []
        for _ in range(cfg.num_hidden_layers):
            k = torch.empty(shape, dtype=dtype, device=self.device).normal_(generator=gen)
            v = torch.empty(shape, dtype=dtype, device=self.device).normal_(generator=gen)
            self.kv.append((k, v))
        self.slots = {}
        for b in self.buckets:
            s = Slot(b)
            s.cache = self.view_cache(b)
            s.tok = torch.randint(0, cfg.vocab_size, (b, 1), device=self.device, generator=gen)
            s.pos_ids = torch.full((b, 1), self.pos, dtype=torch.long, device=self.device)
            s.cache_pos = torch.tensor([self.pos], dtype=torch.long, device=self.device)
            self.slots[b] = s

    def free_state(self):
        for s in self.slots.values():
            s.graph = s.out = s.cache = None
        self.slots = {}
        self.kv = None
        settle()

    def view_cache(self, b):
        """A StaticCache for batch `b` whose layers are views of rows [0, b) of the shared KV cache."""
        cache = StaticCache(config=self.cfg, max_cache_len=self.context)
        if len(cache.layers) != len(self.kv):
            raise SystemExit(f"StaticCache has {len(cache.layers)} layers, model {len(self.kv)}")
        for layer, (k, v) in zip(cache.layers, self.kv):
            if getattr(layer, "is_sliding", False) or not hasattr(layer, "cumulative_length"):
                raise SystemExit(f"unexpected cache layer {type(layer).__name__} (transformers "
                                 f"{transformers.__version__}); this script expects StaticLayer")
            # Let the layer set whatever attributes it keeps, on a meta tensor (allocates nothing),
            # then point it at the shared buffers.
            fake = torch.empty((b, k.shape[1], 0, k.shape[3]), dtype=k.dtype, device="meta")
            layer.lazy_initialization(fake, fake)
            layer.device = k.device
            layer.keys, layer.values = k[:b], v[:b]
            layer.cumulative_length = torch.zeros((), dtype=torch.long, device=k.device)
            layer.is_initialized = True
        return cache

    def reset(self, s):
        """Put the cache write offset back to `pos` (each forward/replay advances it by one)."""
        for layer in s.cache.layers:
            layer.cumulative_length.fill_(self.pos)

    # ---- the decode step ---------------------------------------------------------------------
    def step(self, s):
        out = self.model(input_ids=s.tok, position_ids=s.pos_ids, cache_position=s.cache_pos,
                         past_key_values=s.cache, use_cache=True)
        logits = out.logits[:, -1]
        vals, tok = logits.max(-1)
        summary = torch.stack([vals.float(), logits.sum(-1, dtype=torch.float32)], 1)
        return summary, tok

    def warmup(self, s):
        torch.cuda.synchronize()
        t = time.perf_counter()
        self.reset(s)
        self.step(s)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    def capture(self, s, pool):
        g = torch.cuda.CUDAGraph()
        self.reset(s)
        torch.cuda.synchronize()
        t = time.perf_counter()
        oom = None
        with torch.cuda.graph(g, pool=pool, stream=self.stream):
            try:
                s.out = self.step(s)
            except torch.cuda.OutOfMemoryError as e:  # end the capture cleanly, then report
                oom = e
        torch.cuda.synchronize()
        if oom is not None:
            s.out = None
            raise oom
        s.graph = g
        return time.perf_counter() - t

    def check(self, s):
        """Replay the graph once (outputs poisoned first) and compare with an eager forward."""
        summary, tok = s.out
        summary.fill_(float("nan"))
        tok.fill_(-1)
        self.reset(s)
        s.graph.replay()
        g_sum, g_tok = summary.clone(), tok.clone()
        self.reset(s)
        e_sum, e_tok = self.step(s)
        torch.cuda.synchronize()
        diff = (g_sum - e_sum).abs()
        d_max = diff[:, 0].max().item()
        d_sum = diff[:, 1].max().item()
        if d_max != d_max or d_sum != d_sum:  # NaN: the replay did not write its outputs
            d_max = d_sum = float("inf")
        return d_max, d_sum, int((g_tok != e_tok).sum().item()), e_sum[:, 0].abs().max().item()

    # ---- one strategy ------------------------------------------------------------------------
    def run(self, order, shared=True, verbose=False, label=""):
        """Capture `order` (list of batch sizes) from a fresh state; return the measurements."""
        self.free_state()
        self.alloc_state()
        settle()
        base = torch.cuda.memory_reserved()
        if verbose:
            print(f"  {label:<10} fresh state: reserved {base / MIB:.1f} MiB before capture", flush=True)
        pool = torch.cuda.graph_pool_handle() if shared else None
        pool_ids = [pool] if shared else []
        res = {"buckets": list(order), "capture_seconds": 0.0, "warmup_seconds": 0.0,
               "graphs": 0, "oom": False, "growth": []}
        try:
            for b in order:
                s = self.slots[b]
                res["warmup_seconds"] += self.warmup(s)
                cap = self.capture(s, pool)
                res["capture_seconds"] += cap
                res["graphs"] += 1
                if not shared:
                    pool_ids.append(s.graph.pool())
                grown = torch.cuda.memory_reserved() - base
                res["growth"].append([b, grown])
                if verbose:
                    print(f"  {label:<10} b={b:<4} capture {cap * 1e3:8.1f} ms  "
                          f"reserved +{grown / MIB:9.1f} MiB", flush=True)
        except torch.cuda.OutOfMemoryError as e:
            res["oom"] = True
            print(f"  {label}: out of memory after {res['graphs']} graphs "
                  f"({str(e).splitlines()[0][:120]})", flush=True)
        settle()
        res["physical_bytes"] = torch.cuda.memory_reserved() - base
        res["pool_segment_bytes"], res["pool_live_bytes"], res["pool_segments"] = pool_segments(pool_ids)
        # Replay every graph once against eager; the worst difference is reported.
        worst = {"max_logit": 0.0, "logit_sum": 0.0, "token_mismatches": 0, "checked": 0, "scale": 0.0}
        if not res["oom"]:
            for b in order:
                d_max, d_sum, mism, scale = self.check(self.slots[b])
                if verbose:
                    print(f"  {label:<10} b={b:<4} replay vs eager: max|d max-logit| {d_max:.3g}  "
                          f"max|d logit-sum| {d_sum:.3g}  token mismatches {mism}/{b}", flush=True)
                worst["max_logit"] = max(worst["max_logit"], d_max)
                worst["logit_sum"] = max(worst["logit_sum"], d_sum)
                worst["token_mismatches"] += mism
                worst["checked"] += 1
                worst["scale"] = max(worst["scale"], scale)
        res["check"] = worst
        self.free_state()
        return res


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.2-1b", choices=sorted(shapes()))
    p.add_argument("--max-batch", type=int, default=256,
                   help="cap of vLLM's bucket list [1,2,4]+range(8,256,8)+range(256,max+1,16)")
    p.add_argument("--buckets", default=None, help="explicit comma list of batch sizes (overrides --max-batch)")
    p.add_argument("--context", type=int, default=512, help="KV cache length; the step decodes position context-1")
    p.add_argument("--orders", default="largest,smallest,shuffled,private",
                   help="subset of " + ",".join(ORDERS))
    p.add_argument("--seed", type=int, default=0, help="weights, KV contents, inputs and the shuffled order")
    p.add_argument("--json", action="store_true", help="also print one JSON object per strategy")
    p.add_argument("--verbose", action="store_true", help="per-graph capture times, growth and replay checks")
    a = p.parse_args()

    buckets = (sorted({int(x) for x in a.buckets.split(",") if x.strip()}) if a.buckets
               else vllm_buckets(a.max_batch))
    if not buckets or buckets[0] < 1:
        p.error("need at least one batch size >= 1")
    if a.context < 2:
        p.error("--context must be >= 2")
    orders = [o.strip() for o in a.orders.split(",") if o.strip()]
    bad = [o for o in orders if o not in ORDERS]
    if bad:
        p.error(f"unknown order(s) {bad}; choose from {list(ORDERS)}")
    if not torch.cuda.is_available():
        sys.exit("torch_graph_pool.py needs a CUDA GPU (torch.cuda.is_available() is False); "
                 "CUDA graphs and their memory pools cannot be measured on the CPU.")

    torch.manual_seed(a.seed)
    dev = "cuda"
    cfg = shapes()[a.model]
    cfg._attn_implementation = "sdpa"
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    n_params = sum(t.numel() for t in model.parameters())
    alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_ALLOC_CONF", ""))
    print(f"transformers {transformers.__version__} static cache + CUDA graphs, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(0)}, PYTORCH_CUDA_ALLOC_CONF={alloc_conf or '(unset)'}")
    print(f"{a.model}: {n_params / 1e9:.3f} B parameters, context {a.context}, "
          f"{len(buckets)} buckets {buckets[0]}..{buckets[-1]}")

    stream = torch.cuda.Stream()
    bench = PoolBench(model, cfg, buckets, a.context, dev, stream=stream, seed=a.seed)
    with torch.no_grad(), torch.cuda.stream(stream):
        # Prime lazy per-stream state (cuBLAS/cuBLASLt workspaces, kernels) on the capture stream,
        # including one throw-away capture, so that no strategy pays for it in its figures.
        bench.alloc_state()
        for b in sorted({buckets[0], buckets[-1]}):
            bench.warmup(bench.slots[b])
        bench.capture(bench.slots[buckets[0]], None)
        bench.free_state()
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv_bytes = 2 * cfg.num_hidden_layers * buckets[-1] * a.context * cfg.num_key_value_heads * hd * 2
        print(f"weights {torch.cuda.memory_allocated() / MIB:.0f} MiB, KV cache {kv_bytes / MIB:.0f} MiB "
              f"(both allocated before each capture phase, so excluded)", flush=True)

        largest = bench.run([buckets[-1]], shared=False, verbose=a.verbose, label="largest")
        if largest["oom"]:
            sys.exit(f"the largest bucket ({buckets[-1]}) alone does not fit; lower --max-batch or --context")
        lg_bytes = largest["physical_bytes"]

        results = []
        for o in orders:
            if o == "largest":
                order = sorted(buckets, reverse=True)
            elif o == "smallest":
                order = sorted(buckets)
            elif o == "shuffled":
                order = list(buckets)
                random.Random(a.seed).shuffle(order)
            else:
                order = sorted(buckets, reverse=True)
            results.append((o, bench.run(order, shared=(o != "private"), verbose=a.verbose, label=o)))

    print()
    print(f"{'order':<22} {'graphs':>6} {'pool MiB':>9} {'segs MiB':>9} {'live MiB':>9} "
          f"{'largest MiB':>11} {'pool/lg':>8} {'capture s':>9} {'warm-up s':>9} "
          f"{'max|diff|':>9} {'tok!=':>5}")
    rows = [("largest-alone", largest)] + results
    for o, r in rows:
        ratio = r["physical_bytes"] / lg_bytes if lg_bytes else float("nan")
        name = o + (" (OOM)" if r["oom"] else "")
        c = r["check"]
        print(f"{name:<22} {r['graphs']:>6} {r['physical_bytes'] / MIB:>9.1f} "
              f"{r['pool_segment_bytes'] / MIB:>9.1f} {r['pool_live_bytes'] / MIB:>9.2f} "
              f"{lg_bytes / MIB:>11.1f} {ratio:>8.2f} {r['capture_seconds']:>9.2f} "
              f"{r['warmup_seconds']:>9.2f} {max(c['max_logit'], c['logit_sum']):>9.3g} "
              f"{c['token_mismatches']:>5}")
    print(f"pool MiB: memory_reserved() growth over the capture phase; segs MiB: allocator segments of "
          f"the graph pool(s); live MiB: still-allocated bytes in them (graph outputs); max|diff|: worst "
          f"replay-vs-eager difference of per-row max logit / fp32 logit sum (|max logit| up to "
          f"{max(r['check']['scale'] for _, r in rows):.3g}).")

    if a.json:
        for o, r in results:
            print(json.dumps({
                "strategy": ORDERS[o],
                "physical_bytes": r["physical_bytes"],
                "virtual_bytes": r["physical_bytes"],
                "capture_seconds": round(r["capture_seconds"], 4),
                "largest_bucket_bytes": lg_bytes,
                "buckets": r["buckets"],
                "graphs": r["graphs"],
                "oom": r["oom"],
                "pool_segment_bytes": r["pool_segment_bytes"],
                "pool_live_bytes": r["pool_live_bytes"],
                "pool_segments": r["pool_segments"],
                "largest_bucket_segment_bytes": largest["pool_segment_bytes"],
                "warmup_seconds": round(r["warmup_seconds"], 4),
                "growth_bytes": r["growth"],
                "check_max_abs_diff": max(r["check"]["max_logit"], r["check"]["logit_sum"]),
                "check_token_mismatches": r["check"]["token_mismatches"],
                "graphs_checked": r["check"]["checked"],
                "model": a.model,
                "context": a.context,
                "device": torch.cuda.get_device_name(0),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "alloc_conf": alloc_conf,
            }), flush=True)


if __name__ == "__main__":
    main()
