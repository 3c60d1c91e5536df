#!/usr/bin/env bash
# Issue "Architectures as modules" on the GPU, with .gpu/final.tar.xz from
# scripts/pack-arch.sh: scripts/gpu-arch.sh's checks (every CUDA kernel against the CPU,
# transformers 5.17's reference and hf_parity for MODELS, the cuda test binary), then
# `bench decode` (bf16, graph step) of the Gemma-3-4B- and Phi-4-mini-shaped dummies
# beside their weight floors, and the 8B's as the no-regression reference.
#   usage: MODELS=olmo2,gemma3,gemma2,phi3,stablelm bash scripts/gpu-families.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
export OUT
MODELS=${MODELS:-olmo2,gemma3,gemma2,phi3,stablelm} bash scripts/gpu-arch.sh
if [ -x .bin/tests/cuda_quant ]; then
  .bin/tests/cuda_quant --include-ignored --test-threads 1 > "$OUT/cuda_quant.log" 2>&1
  echo "cuda_quant rc=$?"; grep -E "test result|FAILED|panicked" "$OUT/cuda_quant.log" | head -8
fi
for m in ${BENCH_MODELS:-gemma-3-4b phi-4-mini llama-3-8b}; do
  .bin/encore bench decode --device cuda --model "dummy:$m" --batch ${BATCH:-1,64} \
    --context ${CONTEXT:-512} > "$OUT/decode-$m.log" 2>&1
  echo "decode $m rc=$?"; grep -vE "^\s*$" "$OUT/decode-$m.log" | grep -vi "warm\|capturing\|loading" | tail -8
done
