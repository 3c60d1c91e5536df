#!/usr/bin/env bash
# Prefill (flash) attention variants on the GPU, with the `encore` binary carried as
# .gpu/encore.xz: `bench kernels --only prefill-attention` (Llama-3-8B heads, 4 x 2048 and
# 1 x 8192 causal, bf16 and FP8 caches; TFLOP/s) under each kernel-define variant of
# VARIANTS (`+`-joined NAME=VALUE pairs, `-` for none), then `encore info` (every kernel
# against the CPU) under each variant of CHECK (default the last one).
# MODES picks the kernel by ENCORE_PREFILL_ATTENTION for each run (`-`: the default, the
# warpgroup-MMA kernel on sm_90; `mma`: attention_prefill.cu's mma.sync kernel); `encore
# info` runs under each mode too.
#   usage: VARIANTS="- FA_BN=64" [MODES="- mma"] [CHECK=FA_BN=64] [PREFILL=1] bash scripts/gpu-prefill-attn.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ENCORE_CACHE_DIR=${ENCORE_CACHE_DIR:-/tmp/encore-cache}
OUT=${OUT:-$(mktemp -d)}
mkdir -p .bin && xz -dc .gpu/encore.xz > .bin/encore && chmod +x .bin/encore
enc=.bin/encore
nvidia-smi -L
VARIANTS=${VARIANTS:--}
defs() { [[ "$1" == "-" ]] && echo "" || echo "${1//+/ }"; }
MODES=${MODES:--}
mode() { [[ "$1" == "-" ]] && echo "" || echo "$1"; }
for m in $MODES; do
for v in $VARIANTS; do
  echo "== $v mode $m"
  ENCORE_PREFILL_ATTENTION="$(mode "$m")" ENCORE_KERNEL_DEFINES="$(defs "$v")" "$enc" bench kernels \
    --device cuda --only prefill-attention 2>&1 | tee "$OUT/pa-$v-$m.log" | grep -E "prefill attention|rror"
done
done
if [[ -n "${PREFILL:-}" ]]; then
  for m in $MODES; do
  for v in $VARIANTS; do
    echo "== prefill step $v mode $m"
    ENCORE_PREFILL_ATTENTION="$(mode "$m")" ENCORE_KERNEL_DEFINES="$(defs "$v")" "$enc" bench prefill --device cuda --model dummy:llama-3-8b \
      --quantization fp8 --kv-cache-dtype fp8 --tokens 2048 --batch 4 --prefill-buckets none \
      --repeats 5 --json 2>>"$OUT/prefill.err" | tee -a "$OUT/prefill.jsonl" | tail -1 | cut -c1-220
  done
  done
fi
for m in $MODES; do
for check in ${CHECK:-${VARIANTS##* }}; do
  echo "== info $check mode $m"
  ENCORE_PREFILL_ATTENTION="$(mode "$m")" ENCORE_KERNEL_DEFINES="$(defs "$check")" "$enc" info \
    --device cuda --seed 7 > "$OUT/info-$m.log" 2>&1
  echo "info rc=$?"
  grep -E "FAIL|passed|failed|checks" "$OUT/info-$m.log" | tail -8
done
done
