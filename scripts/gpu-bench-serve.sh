#!/usr/bin/env bash
# The issue-#11 serving workload on the GPU (after scripts/build-gpu.sh): per model,
# `encore bench serve --in-process` with 1,000 requests (prompts 128-1,024 tokens, outputs
# 64-512) all at once (saturation), then 300 requests at 50% and 90% of the saturation
# request rate (TTFT), and `bench decode` at the batch the scheduler reached. JSON lines
# go to $OUT; a summary is printed last.
#   usage: bash scripts/gpu-bench-serve.sh [models, default llama-3.2-1b,llama-3-8b]
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-$(mktemp -d)}
export ENCORE_CACHE_DIR=$(mktemp -d)
models=${1:-llama-3.2-1b,llama-3-8b}
for m in ${models//,/ }; do
  common=(--in-process --device cuda --model "dummy:$m" --input-len 128:1024 --output-len 64:512
          --max-num-seqs 256 --max-num-batched-tokens 2048 --json)
  .bin/encore bench serve "${common[@]}" --num-prompts 1000 2>"$OUT/serve-$m.err" \
    | tee "$OUT/serve-$m.jsonl" | cut -c1-300
  sat=$(python3 -c "import json; print(json.load(open('$OUT/serve-$m.jsonl'))['request_throughput'])")
  for f in 0.5 0.9; do
    r=$(python3 -c "print($sat * $f)")
    .bin/encore bench serve "${common[@]}" --num-prompts 300 --request-rate "$r" \
      2>>"$OUT/serve-$m.err" | tee -a "$OUT/serve-rate-$m.jsonl" | cut -c1-200
  done
  b=$(python3 -c "import json; print(json.load(open('$OUT/serve-$m.jsonl'))['max_running'])")
  .bin/encore bench decode --device cuda --model "dummy:$m" --batch "$b" --context 576 --json \
    2>>"$OUT/serve-$m.err" | tee "$OUT/decode-$m.jsonl" | cut -c1-200
done
python3 - "$OUT" "$models" <<'PY'
import json, sys
out, models = sys.argv[1], sys.argv[2].split(",")
for m in models:
    try:
        s = json.load(open(f"{out}/serve-{m}.jsonl"))
        d = [json.loads(l) for l in open(f"{out}/decode-{m}.jsonl") if "graph_step_ms" in l][0]
    except Exception as e:
        print(m, "missing:", e); continue
    dec = d["batch"] * 1e3 / d["graph_step_ms"]
    print(f"{m}: 1000 requests in {s['duration_s']:.1f} s, {s['output_throughput']:.0f} output tok/s "
          f"({s['total_token_throughput']:.0f} total), max running {s['max_running']}, {s['preemptions']} preemptions; "
          f"bench decode at batch {d['batch']} context 576: {dec:.0f} tok/s -> {s['output_throughput']/dec:.2f}; "
          f"TTFT p50/p99 {s['ttft_ms']['p50']:.0f}/{s['ttft_ms']['p99']:.0f} ms, TPOT p50 {s['tpot_ms']['p50']:.2f} ms")
    for l in open(f"{out}/serve-rate-{m}.jsonl"):
        r = json.loads(l)
        print(f"  rate {r['request_rate']:.2f}/s: TTFT p50/p99 {r['ttft_ms']['p50']:.0f}/{r['ttft_ms']['p99']:.0f} ms, "
              f"TPOT p50 {r['tpot_ms']['p50']:.2f} ms, ITL p99 {r['itl_ms']['p99']:.1f} ms, {r['output_throughput']:.0f} tok/s")
PY
