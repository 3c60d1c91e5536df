#!/usr/bin/env bash
# Mixtures of experts on the GPU machine, from .gpu/moe.tar.xz (encore and the cuda and
# hf_parity test binaries): the MoE op against the CPU and in a graph (tests/cuda), the
# HF reference with the MoE models and the parity test on CPU and CUDA, and the tiny MoE
# dummies generating in graph mode. Logs under $OUT.
#   usage: OUT=... bash scripts/gpu-moe.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ENCORE_CACHE_DIR=/tmp/encore-cache
OUT=${OUT:-$(mktemp -d)}; mkdir -p "$OUT" .moe
tar -xJf .gpu/moe.tar.xz -C .moe || exit 1
.moe/tests/cuda --include-ignored --test-threads=1 moe >"$OUT/cuda-moe.txt" 2>&1
echo "== cuda moe rc=$?"; grep -E '^test |test result|panicked|assert' "$OUT/cuda-moe.txt" | head -8
[ -d /tmp/ref/qwen3_moe ] || python3 scripts/hf_reference.py /tmp/ref >"$OUT/ref.log" 2>&1
ENCORE_HF_REF=/tmp/ref .moe/tests/hf_parity --include-ignored --test-threads=1 --nocapture \
  >"$OUT/hf-parity.txt" 2>&1
echo "== hf_parity rc=$?"; grep -E "^(qwen3_moe|qwen2_moe|mixtral) |test result|skipped|note \(bf16 experts" "$OUT/hf-parity.txt"
for m in tiny-qwen3-moe tiny-qwen2-moe tiny-mixtral; do
  .moe/encore generate --device cuda --model dummy:$m --prompt hello --max-tokens 16 --verify-graphs \
    >"$OUT/gen-$m.txt" 2>&1
  echo "== generate $m rc=$?"; tail -2 "$OUT/gen-$m.txt"
  .moe/encore bench decode --device cuda --model dummy:$m --batch 1,8,64 --steps 20 \
    >"$OUT/decode-$m.txt" 2>&1
  echo "== bench decode $m rc=$?"; tail -4 "$OUT/decode-$m.txt"
done
