#!/usr/bin/env bash
# `encore serve` on the GPU (after scripts/build-gpu.sh): per model, start the server,
# wait for /health, run scripts/serve_load.py at a few concurrencies, read /metrics, stop
# it with SIGTERM (it must exit 0), then `bench decode` at the same batch for comparison.
#   usage: bash scripts/gpu-serve.sh [models, default llama-3.2-1b,llama-3-8b]
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-$(mktemp -d)}
export ENCORE_CACHE_DIR=$(mktemp -d)
models=${1:-llama-3.2-1b,llama-3-8b}
port=8123
for m in ${models//,/ }; do
  .bin/encore serve --device cuda --model "dummy:$m" --port $port --max-num-seqs 64 \
    --max-seq-len 1024 >"$OUT/serve-$m.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    sleep 0.5
  done
  echo "== $m: $(grep serving "$OUT/serve-$m.log")"
  for n in 1 16 64; do
    for mode in --no-stream ""; do
      python3 scripts/serve_load.py --url "http://127.0.0.1:$port" --model "dummy:$m" \
        --requests $n --prompt-len 128 --max-tokens 256 --json $mode | tee -a "$OUT/load-$m.jsonl"
    done
  done
  curl -s "http://127.0.0.1:$port/metrics" | grep -v '^#' >"$OUT/metrics-$m.txt"
  kill -TERM $pid
  wait $pid
  echo "== $m: serve exited with $?"
  .bin/encore bench decode --device cuda --model "dummy:$m" --batch 1,16,64 --context 256 --json \
    2>/dev/null | tee "$OUT/decode-$m.jsonl" | cut -c1-200
done
