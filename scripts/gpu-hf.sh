#!/usr/bin/env bash
# transformers 5.17's reference for the given models (scripts/hf_reference.py) and
# hf_parity over them (CUDA f32/bf16, CPU f32), with .gpu/final.tar.xz from
# scripts/pack-arch.sh; the lighter half of scripts/gpu-arch.sh.
#   usage: MODELS=gemma2,phi3_longrope bash scripts/gpu-hf.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ENCORE_CACHE_DIR=${ENCORE_CACHE_DIR:-/tmp/encore-cache}
OUT=${OUT:-$(mktemp -d)}
mkdir -p .bin && tar -xJf .gpu/final.tar.xz -C .bin || exit 1
export ENCORE_HF_REF=$(mktemp -d)
PYTHONUNBUFFERED=1 python3 scripts/hf_reference.py "$ENCORE_HF_REF" --models "$MODELS" > "$OUT/hf-reference.log" 2>&1
echo "hf_reference rc=$?"; grep -vE "config.json|Writing|Loading" "$OUT/hf-reference.log" | cut -c1-330 | tail -12
.bin/tests/hf_parity --include-ignored --test-threads 1 --nocapture > "$OUT/hf_parity.log" 2>&1
echo "hf_parity rc=$?"; grep -E "^[a-z0-9_]+ +(f32|bf16) +(cpu|cuda) |FAILED|panicked|test result" "$OUT/hf_parity.log" | head -40
