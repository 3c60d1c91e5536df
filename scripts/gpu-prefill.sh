#!/usr/bin/env bash
# Prefill attention on the GPU (run after scripts/build-gpu.sh, like gpu-check.sh): the
# tensor-core kernel's tests and the CUDA attention tests around it, HF parity,
# compute-sanitizer memcheck on the new kernel, then eager prefill with the tensor-core
# path against the split-K path (ENCORE_PREFILL_ATTENTION=split) on the 0.5B, 1B and 8B
# shapes. Logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-$(mktemp -d)}
ENCORE_CACHE_DIR=$(mktemp -d)
export ENCORE_CACHE_DIR
.bin/encore info --device cuda --seed 7 >"$OUT/info.log" 2>&1
echo "info self-check: $(tail -1 "$OUT/info.log")"
.bin/tests/cuda --include-ignored --test-threads=1 prefill_attention kernels_match_cpu \
  windowed capture_replay 2>&1 | tee "$OUT/cuda-tests.log" | grep -E "^test |test result|panicked"
ENCORE_HF_REF=$(mktemp -d)
export ENCORE_HF_REF
python3 scripts/hf_reference.py "$ENCORE_HF_REF" >"$OUT/hf-reference.log" 2>&1
.bin/tests/hf_parity --include-ignored 2>&1 | tee "$OUT/hf-parity.log" | grep -E "^test |test result"
.bin/tests/model --include-ignored 2>&1 | grep -E "test result"
compute-sanitizer --tool memcheck --error-exitcode 9 .bin/tests/cuda --include-ignored \
  --test-threads=1 prefill_attention_tensor_core_matches_cpu >"$OUT/memcheck.log" 2>&1
echo "memcheck rc=$? $(grep 'ERROR SUMMARY' "$OUT/memcheck.log")"
for m in qwen2.5-0.5b llama-3.2-1b llama-3-8b; do
  for path in tensor-core split; do
    if [ $path = split ]; then export ENCORE_PREFILL_ATTENTION=split; else unset ENCORE_PREFILL_ATTENTION; fi
    echo "== $m $path"
    .bin/encore bench prefill --device cuda --model "dummy:$m" --tokens 17,129,513,2049 \
      --batch 1,4 --repeats 5 2>&1 | tail -9
  done
done | tee "$OUT/prefill.log"
