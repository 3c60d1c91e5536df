#!/usr/bin/env bash
# Batch-1 decode of the small shaped dummies on the GPU machine, with .gpu/final.tar.xz
# from scripts/pack-arch.sh (or an unpacked .bin/encore): the graph step (`bench decode`)
# under each VARIANT (`base` or `+`-joined VAR=VALUE settings, e.g. ENCORE_PDL=0 or the
# measurement knob ENCORE_SKIP_OPS=attention), then, with NCU=1, ncu's kernel time of
# eager steps (clocks left alone) to set the step's kernels against its wall time.
#   usage: MODELS="gemma-3-4b phi-4-mini" VARIANTS="base ENCORE_SKIP_OPS=attention" \
#     bash scripts/gpu-small-decode.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export ENCORE_CACHE_DIR=${ENCORE_CACHE_DIR:-/tmp/encore-cache}
[ -x .bin/encore ] || { mkdir -p .bin && tar -xJf .gpu/final.tar.xz -C .bin; }
envs() { [ "$1" = base ] && return; tr '+' '\n' <<< "$1"; }
for m in ${MODELS:-gemma-3-4b phi-4-mini}; do
  for v in ${VARIANTS:-base}; do
    mapfile -t e < <(envs "$v")
    echo "$m $v: $(env "${e[@]}" .bin/encore bench decode --device cuda --model "dummy:$m" \
      --batch 1 --context ${CONTEXT:-512} 2>&1 | grep -E '^\s+1\s')"
  done
  if [ "${NCU:-0}" = 1 ]; then
    ncu --clock-control none --csv --metrics gpu__time_duration.sum --launch-skip 3000 \
      --launch-count ${LAUNCHES:-900} .bin/encore bench decode --device cuda --model "dummy:$m" \
      --batch 1 --context ${CONTEXT:-512} --steps 20 --eager > "$OUT/ncu-$m.csv" 2>/dev/null
    python3 scripts/ncu_time_table.py "$OUT/ncu-$m.csv"
  fi
done
