#!/usr/bin/env bash
# One development round on the GPU machine (after scripts/build-gpu.sh): the CUDA tests
# that touch what changed, decode benchmarks, and a profile. Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export ENCORE_CACHE_DIR=${ENCORE_CACHE_DIR:-/tmp/encore-cache}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for t in cuda graph model capture kv; do
  .bin/tests/$t --include-ignored --test-threads=4 >"$OUT/test-$t.log" 2>&1
  echo "test $t: $(grep -E 'test result' "$OUT/test-$t.log" | tail -1)"
  grep -E "FAILED|panicked" "$OUT/test-$t.log" | head -5
done
for m in "$@"; do
  .bin/encore bench decode --model "$m" --batch 1,8,32,128 --steps 30 2>&1 | tail -6
done
