#!/usr/bin/env bash
# n-gram speculative decoding on the GPU machine, from .gpu/spec.tar.xz (the encore
# binary): generate on dummy shapes (random weights: their acceptance says nothing about
# real models; the point is a verify step's cost, eager, against graph decode), plain
# against --speculative-method ngram. Logs under $OUT.
#   usage: OUT=... bash scripts/gpu-spec.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ENCORE_CACHE_DIR=/tmp/encore-cache
OUT=${OUT:-$(mktemp -d)}; mkdir -p "$OUT" .spec
tar -xJf .gpu/spec.tar.xz -C .spec || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
P=$(printf 'one two three four five six seven eight %.0s' $(seq 1 12))
for m in ${SPEC_MODELS:-llama-3.2-1b llama-3-8b}; do
  for s in "" "--speculative-method ngram --num-speculative-tokens 4"; do
    .spec/encore generate --device cuda --model dummy:$m --prompt "$P" --max-tokens 128 \
      --ignore-eos $s >"$OUT/gen-$m-${s:+spec}.txt" 2>&1
    echo "== $m ${s:-plain} rc=$?"; grep -E "summary|speculative decoding" "$OUT/gen-$m-${s:+spec}.txt"
  done
done
