#!/usr/bin/env bash
# Prefix caching on the GPU (after scripts/build-gpu.sh): per model, `encore bench serve
# --in-process` with every prompt starting with the same 512 tokens (a shared system
# prompt; prompts 640-1,152 tokens, outputs 64-512), all at once (N requests) and 300 at
# a Poisson rate (40/s on 1B, 10/s on 8B), with the prefix cache on and off (`--no-prefix-cache`). JSON lines go to $OUT; a
# summary table is printed last.
#   usage: bash scripts/gpu-prefix.sh [models, default llama-3.2-1b,llama-3-8b] [num prompts, default 1000]
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-$(mktemp -d)}
export ENCORE_CACHE_DIR=$(mktemp -d)
models=${1:-llama-3.2-1b,llama-3-8b}
n=${2:-1000}
for m in ${models//,/ }; do
  rate=40; [ "$m" = llama-3-8b ] && rate=10
  for cache in on off; do
    flag=(); [ $cache = off ] && flag=(--no-prefix-cache)
    for r in inf $rate; do
      k=$n; [ $r != inf ] && k=300
      .bin/encore bench serve --in-process --device cuda --model "dummy:$m" --max-num-seqs 256 \
        --max-num-batched-tokens 2048 --input-len 640:1152 --shared-prefix-len 512 \
        --output-len 64:512 --num-prompts "$k" --request-rate "$r" "${flag[@]}" --json \
        2>>"$OUT/prefix-$m.err" | sed "s/^{/{\"cache\":\"$cache\",/" | tee -a "$OUT/prefix-$m.jsonl" | cut -c1-160
    done
  done
done
python3 - "$OUT" "$models" <<'PY'
import json, sys
out, models = sys.argv[1], sys.argv[2].split(",")
print("| model | prefix cache | rate | duration s | output tok/s | hit ratio | TTFT p50 / p99 ms | TPOT p50 ms |")
print("|---|---|---|---|---|---|---|---|")
for m in models:
    try:
        rows = [json.loads(l) for l in open(f"{out}/prefix-{m}.jsonl")]
    except OSError:
        print(m, "missing"); continue
    for r in rows:
        print(f"| {m} | {r['cache']} | {r['request_rate']} | {r['duration_s']:.2f} | {r['output_throughput']:.0f} | "
              f"{r.get('prefix_cache_hit_ratio') or 0:.3f} | {r['ttft_ms']['p50']:.1f} / {r['ttft_ms']['p99']:.1f} | "
              f"{r['tpot_ms']['p50']:.2f} |")
PY
