#!/usr/bin/env bash
# The decode step with the logit-bias pass in the graphs against the commit before it
# (issue #21): `encore bench decode` of the new binary and of ENCORE_BASE (encore-base in
# the pack), alternated twice on one machine, 1B at batch 1 and 64, 8B at batch 1 and 64.
# Carry `.gpu` (scripts/pack-gpu.sh with ENCORE_BASE_BIN). Prints the median step per run.
set -euo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
d=/tmp/lb; rm -rf $d; mkdir -p $d; tar -xJf .gpu/gpu.tar.xz -C $d
nvidia-smi --query-gpu=name --format=csv,noheader
for model in llama-3.2-1b llama-3-8b; do
  for round in 1 2; do
    for bin in encore-base encore; do
      $d/$bin bench decode --device cuda --model dummy:$model --batch 1,64 --steps 40 --json \
        2>/dev/null | python3 -c "
import json, sys
for l in sys.stdin:
    l = l.strip()
    if not l.startswith('{'): continue
    v = json.loads(l)
    if 'batch' in v: print('$model', '$bin', 'round $round', 'batch', v['batch'], 'graph_ms', round(v['graph_step_ms'], 4), 'eager_ms', round(v['eager_step_ms'], 4))
"
    done
  done
done
