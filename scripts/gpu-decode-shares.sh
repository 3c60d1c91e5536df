#!/usr/bin/env bash
# Where the 8B FP8 decode step goes at a serving batch (issue "Serving throughput at the
# leaders' level"): `bench decode` (graph step, FP8 weights and KV) under each VARIANT
# (`base` or `+`-joined VAR=VALUE settings, e.g. the measurement knob
# ENCORE_SKIP_OPS=attention, whose ops launch nothing: results wrong), with the
# `encore` binary carried as .gpu/encore.xz.
#   usage: BATCH=1024 CONTEXT=1536 VARIANTS="base ENCORE_SKIP_OPS=attention" bash scripts/gpu-decode-shares.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export ENCORE_CACHE_DIR=${ENCORE_CACHE_DIR:-/tmp/encore-cache}
mkdir -p .bin && xz -dc .gpu/encore.xz > .bin/encore && chmod +x .bin/encore
envs() { [ "$1" = base ] && return; tr '+' '\n' <<< "$1"; }
for v in ${VARIANTS:-base}; do
  mapfile -t e < <(envs "$v")
  echo "$v: $(env "${e[@]}" .bin/encore bench decode --device cuda --model dummy:llama-3-8b \
    --quantization fp8 --kv-cache-dtype fp8 --batch ${BATCH:-1024} --context ${CONTEXT:-1536} \
    --steps 10 2>&1 | grep -E "^\s+${BATCH:-1024}\s|rror")"
done
