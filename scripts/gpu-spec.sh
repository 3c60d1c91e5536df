#!/usr/bin/env bash
# n-gram speculative decoding on the GPU machine, from .gpu/spec.tar.xz (the encore
# binary): generate on dummy shapes (random weights: their acceptance says nothing about
# real models; the point is a verify step's cost against graph decode), plain
# against --speculative-method ngram. Logs under $OUT.
#   bench decode --speculative 1,2,4,8 first (the verify step against the decode step);
#   SPEC_BENCH_ONLY=1 skips the generate runs, SPEC_GEN_ONLY=1 the benches and tests.
#   generate captures every graph at start-up (--capture-all): decode rates are steady.
#   usage: OUT=... bash scripts/gpu-spec.sh
set -uo pipefail
source "$(dirname "$0")/gpu-spec-env.sh"
# The CUDA verify-graph test, when the bundle carries the graph test binary.
if [ -x .spec/graph-test ] && [ -z "${SPEC_GEN_ONLY:-}" ]; then
  .spec/graph-test --include-ignored cuda_ >"$OUT/graph-test.txt" 2>&1
  echo "== graph tests (CUDA) rc=$?"; grep -E "^test |test result" "$OUT/graph-test.txt"
fi
for m in ${SPEC_MODELS:-llama-3.2-1b llama-3-8b}; do
  if [ -z "${SPEC_GEN_ONLY:-}" ]; then
    .spec/encore bench decode --device cuda --model dummy:$m --batch 1,2,4,8,64 --steps 20 \
      --speculative 1,2,4,8 >"$OUT/verify-$m.txt" 2>&1
    echo "== bench decode $m --speculative rc=$?"; grep -E "^ +(1|2|4|8|64) |verify step" "$OUT/verify-$m.txt"
  fi
  [ -n "${SPEC_BENCH_ONLY:-}" ] && continue
  spec_gen "gen-$m-plain" $m
  spec_gen "gen-$m-spec" $m --speculative-method ngram --num-speculative-tokens 4
done
