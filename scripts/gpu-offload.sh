#!/usr/bin/env bash
# Weight offload on the GPU machine (issue #12's measurements), with .bin/ from
# scripts/build-gpu.sh carried along: `encore bench offload` on the Llama-3-8B shape at
# 100/75/50/25% budgets, batch 1 and 64, planned (graph and eager) vs LRU (eager), beside
# the PCIe bound from the measured page-locked host-to-device bandwidth; then the
# transformers + accelerate offload peer at 50%. Logs in $OUT; the table is printed last.
#   usage: bash scripts/gpu-offload.sh [--no-peer] [budgets] [batches]
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-$(mktemp -d)}
peer=1
[ "${1:-}" = --no-peer ] && { peer=0; shift; }
budgets=${1:-100,75,50,25}
batches=${2:-1,64}
nvidia-smi -L | tee "$OUT/nvidia-smi.log"
git rev-parse --short HEAD 2>/dev/null | tee "$OUT/commit.log"
.bin/encore bench offload --device cuda --model dummy:llama-3-8b --budgets "$budgets" \
  --batch "$batches" --steps 10 --json >"$OUT/bench-offload-8b.jsonl" 2>"$OUT/bench-offload-8b.err"
echo "bench offload rc=$?"; tail -3 "$OUT/bench-offload-8b.err"
if [ $peer = 1 ]; then
  timeout 300 python3 scripts/hf_offload_bench.py --budgets 50 --batch 1 --steps 5 \
    >"$OUT/hf-offload.jsonl" 2>"$OUT/hf-offload.err"
  echo "peer rc=$?"; tail -3 "$OUT/hf-offload.err"; cat "$OUT/hf-offload.jsonl"
fi
python3 - "$OUT/bench-offload-8b.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print(f"{'policy':>8} {'mode':>5} {'batch':>5} {'budget':>6} {'streamed GB':>11} {'step ms':>9} {'tok/s':>9} {'pcie ms':>8} {'x bound':>7}")
for r in rows:
    xb = r['bound_ratio']
    print(f"{r['policy']:>8} {r['mode']:>5} {r['batch']:>5} {r['budget_fraction']*100:>5.0f}% "
          f"{r['streamed_bytes_per_step']/1e9:>11.3f} {r['step_ms']:>9.2f} {r['tok_s']:>9.1f} "
          f"{r['pcie_bound_ms']:>8.2f} {('-' if xb is None else f'{xb:.3f}'):>7}")
key = lambda r: (r['batch'], r['budget_fraction'])
for b in sorted({r['batch'] for r in rows}):
    for f in sorted({r['budget_fraction'] for r in rows if r['policy'] != 'resident'}):
        g = {(r['policy'], r['mode']): r for r in rows if key(r) == (b, f)}
        if ('planned', 'graph') in g and ('lru', 'eager') in g:
            pg, pe, l = g[('planned', 'graph')], g.get(('planned', 'eager')), g[('lru', 'eager')]
            print(f"batch {b} {f*100:.0f}%: planned graph / LRU tok/s = {pg['tok_s']/l['tok_s']:.2f}x"
                  + (f"; graph / eager step = {pg['step_ms']/pe['step_ms']:.3f}" if pe else ""))
print("h2d GB/s:", rows[0]['h2d_gbs'] if rows else "-")
PY
