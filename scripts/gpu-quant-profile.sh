#!/usr/bin/env bash
# Where the time of a quantized step goes, on the GPU machine (after scripts/pack-gpu.sh,
# carry .gpu): per-kernel GPU time (ncu, one metric, clocks left alone) of batch-1 decode
# (eager) and of a 2,048-token prefill (eager), for each --quantization in $FORMATS.
#   usage: FORMATS="none fp8 q4_k" bash scripts/gpu-quant-profile.sh [decode,prefill]
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ENCORE_CACHE_DIR=${ENCORE_CACHE_DIR:-/tmp/encore-cache}
OUT=${OUT:-$(mktemp -d)}
mkdir -p .bin; tar -xJf .gpu/gpu.tar.xz -C .bin || exit 1
what=${1:-decode,prefill}
model=${MODEL:-dummy:llama-3-8b}
agg() { tee "$1" | python3 scripts/ncu_time_table.py; }  # ncu csv on stdin -> table, csv to $1
for q in ${FORMATS:-none fp8 q4_k}; do
  if [[ $what == *decode* ]]; then
    echo "== decode batch 1, eager, --quantization $q ($model): 2 steps after the first ~5"
    # A decode step of the 8B shape is ~290 kernels (32 layers x 9 + head): skip the
    # prefill and 4 steps.
    ncu --csv --clock-control none --metrics gpu__time_duration.sum --launch-skip 1500 \
      --launch-count 580 .bin/encore bench decode --device cuda --model "$model" --batch 1 \
      --steps 10 --eager --quantization "$q" 2>"$OUT/ncu-decode-$q.err" | agg "$OUT/ncu-decode-$q.csv"
  fi
  if [[ $what == *prefill* ]]; then
    echo "== prefill 2048 tokens, eager, --quantization $q ($model): all kernels of 2 steps"
    ncu --csv --clock-control none --metrics gpu__time_duration.sum .bin/encore bench prefill \
      --device cuda --model "$model" --tokens 2048 --repeats 1 --prefill-buckets none \
      --quantization "$q" 2>"$OUT/ncu-prefill-$q.err" | agg "$OUT/ncu-prefill-$q.csv"
  fi
done
