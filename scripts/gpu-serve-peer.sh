#!/usr/bin/env bash
# Issue #11's serving comparison in one lease (after scripts/build-gpu.sh), per model:
#  1. encore, the 1,000-request workload at saturation (`bench serve --in-process`, all at
#     once; prompts 128-1,024 tokens, outputs 64-512, --max-num-seqs 256);
#  2. the floor parts: `bench decode` at batch 256 (context 576) and `bench prefill` of
#     2,048-token chunks: floor = output tokens / decode rate + prompt tokens / prefill rate;
#  3. the peer: transformers' continuous batching on the same shape and request distribution
#     (scripts/hf_serve_bench.py);
#  4. one stream: 20 requests one at a time (128 prompt + 256 output tokens), ITL p50,
#     against `bench decode` at batch 1 (context 256).
# JSON lines and logs go to $OUT; a summary table is printed last.
#   usage: bash scripts/gpu-serve-peer.sh [models, default llama-3.2-1b,llama-3-8b] [--no-peer]
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-$(mktemp -d)}
export ENCORE_CACHE_DIR=$(mktemp -d)
models=${1:-llama-3.2-1b,llama-3-8b}
peer=1
[ "${2:-}" = "--no-peer" ] && peer=0
for m in ${models//,/ }; do
  common=(--in-process --device cuda --model "dummy:$m" --max-num-seqs 256
          --max-num-batched-tokens 2048 --json)
  .bin/encore bench serve "${common[@]}" --input-len 128:1024 --output-len 64:512 \
    --num-prompts 1000 2>"$OUT/serve-$m.err" | tee "$OUT/serve-$m.jsonl" | cut -c1-200
  .bin/encore bench decode --device cuda --model "dummy:$m" --batch 256 --context 576 --json \
    2>>"$OUT/serve-$m.err" | tee "$OUT/decode256-$m.jsonl" | cut -c1-200
  .bin/encore bench prefill --device cuda --model "dummy:$m" --tokens 2048 --batch 1 \
    --repeats 5 --json 2>>"$OUT/serve-$m.err" | tee "$OUT/prefill-$m.jsonl" | cut -c1-200
  .bin/encore bench serve "${common[@]}" --input-len 128 --output-len 256 --num-prompts 20 \
    --max-concurrency 1 2>>"$OUT/serve-$m.err" | tee "$OUT/stream1-$m.jsonl" | cut -c1-200
  .bin/encore bench decode --device cuda --model "dummy:$m" --batch 1 --context 256 --json \
    2>>"$OUT/serve-$m.err" | tee "$OUT/decode1-$m.jsonl" | cut -c1-200
  if [ $peer = 1 ]; then
    python3 scripts/hf_serve_bench.py --models "$m" --num-prompts 1000 --json \
      2>"$OUT/peer-$m.err" | tee "$OUT/peer-$m.jsonl"
    tail -3 "$OUT/peer-$m.err"
  fi
done
python3 - "$OUT" "$models" <<'PY'
import json, sys
out, models = sys.argv[1], sys.argv[2].split(",")
def rows(f, key):
    try:
        return [json.loads(l) for l in open(f"{out}/{f}") if key in l]
    except OSError:
        return []
print("| model | encore out tok/s | duration s | floor s | floor/duration | out/decode256 | peer out tok/s | encore/peer | 1-stream ITL p50 ms | decode b1 ms | ratio |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for m in models:
    s = rows(f"serve-{m}.jsonl", "output_throughput")
    d = rows(f"decode256-{m}.jsonl", "graph_step_ms")
    p = rows(f"prefill-{m}.jsonl", "piecewise_ms")
    o = rows(f"stream1-{m}.jsonl", "itl_ms")
    d1 = rows(f"decode1-{m}.jsonl", "graph_step_ms")
    h = rows(f"peer-{m}.jsonl", "output_throughput")
    if not (s and d and p and o and d1):
        print(m, "missing rows"); continue
    s, d, p, o, d1 = s[0], d[0], p[0], o[0], d1[0]
    dec = d["batch"] * 1e3 / d["graph_step_ms"]
    pre = p["tokens"] * p["batch"] * 1e3 / p["piecewise_ms"]
    floor = s["output_tokens"] / dec + s["input_tokens"] / pre
    ht = h[0]["output_throughput"] if h else float("nan")
    print(f"| {m} | {s['output_throughput']:.0f} | {s['duration_s']:.1f} | {floor:.1f} | "
          f"{floor / s['duration_s']:.2f} | {s['output_throughput'] / dec:.2f} | {ht:.0f} | "
          f"{s['output_throughput'] / ht:.1f} | {o['itl_ms']['p50']:.3f} | {d1['graph_step_ms']:.3f} | "
          f"{o['itl_ms']['p50'] / d1['graph_step_ms']:.3f} |")
PY
