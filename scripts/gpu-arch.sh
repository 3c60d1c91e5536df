#!/usr/bin/env bash
# The new families and variants on the GPU (issue "Architectures as modules"), with
# .gpu/final.tar.xz (encore and the cuda and hf_parity test binaries, made on the build
# machine by scripts/pack-arch.sh): `encore info` (every CUDA kernel against the CPU: act_mul's activations, the
# padded vocabulary's unshard_columns among them), transformers 5.17's reference for the
# given models (scripts/hf_reference.py), hf_parity over them (CUDA f32/bf16, CPU f32),
# then the cuda test binary (every dummy model on CUDA, eager and graphs).
#   usage: MODELS=smollm3,phi3,llama_linear,qwen2_yarn,qwen2_layer_types,gemma3,gemma2,phi3_longrope,phi3_longrope_long bash scripts/gpu-arch.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ENCORE_CACHE_DIR=${ENCORE_CACHE_DIR:-/tmp/encore-cache}
OUT=${OUT:-$(mktemp -d)}
mkdir -p .bin && tar -xJf .gpu/final.tar.xz -C .bin || exit 1
nvidia-smi -L
.bin/encore info --device cuda --seed 1 > "$OUT/info.log" 2>&1; echo "info rc=$?"
grep -E "act_mul|width=301|width=255" "$OUT/info.log" | head -12
grep -E "passed|failed|FAIL" "$OUT/info.log" | tail -5
export ENCORE_HF_REF=$(mktemp -d)
PYTHONUNBUFFERED=1 python3 scripts/hf_reference.py "$ENCORE_HF_REF" --models "${MODELS:-smollm3,phi3,llama_linear,qwen2_yarn,qwen2_layer_types,gemma3,gemma2,phi3_longrope,phi3_longrope_long}" > "$OUT/hf-reference.log" 2>&1
echo "hf_reference rc=$?"; grep -E "^(smollm3|phi3|llama_linear|qwen2_yarn|qwen2_layer_types|gemma3|gemma2|phi3_longrope|phi3_longrope_long|olmo2|stablelm) " "$OUT/hf-reference.log" | cut -c1-200
.bin/tests/hf_parity --include-ignored --test-threads 1 --nocapture > "$OUT/hf_parity.log" 2>&1
echo "hf_parity rc=$?"; grep -E "^[a-z0-9_]+ +(f32|bf16) +(cpu|cuda) |test result|FAILED|panicked" "$OUT/hf_parity.log" | head -40
.bin/tests/cuda --include-ignored --test-threads 4 > "$OUT/cuda.log" 2>&1
echo "cuda rc=$?"; grep -E "test result|FAILED|panicked" "$OUT/cuda.log" | head -8
