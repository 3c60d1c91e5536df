#!/usr/bin/env bash
# Per-kernel GPU time of decode steps, on the GPU machine (after scripts/build-gpu.sh):
#   bash scripts/profile-decode.sh dummy:qwen2.5-0.5b 1 [extra bench-decode flags]
# Uses nsys (graph nodes traced one by one) when present, else ncu on eager steps.
# Prints a table: kernel, instances, mean µs, share of GPU time.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-dummy:qwen2.5-0.5b}; batch=${2:-1}; shift 2 || true
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export ENCORE_CACHE_DIR=${ENCORE_CACHE_DIR:-/tmp/encore-cache}
out=${OUT:-/tmp}/prof-$(echo "$model" | tr ':/.' '___')-b$batch
bin=.bin/encore
$bin bench decode --model "$model" --batch "$batch" --steps 3 "$@" >/dev/null 2>&1 || true
if command -v nsys >/dev/null; then
  nsys profile -q -f true -o "$out" --cuda-graph-trace=node \
    $bin bench decode --model "$model" --batch "$batch" --steps 20 "$@" >/dev/null
  nsys stats -q -f csv --report cuda_gpu_kern_sum "$out.nsys-rep" 2>/dev/null | python3 -c '
import csv, sys
rows = list(csv.DictReader(l for l in sys.stdin if l.strip() and not l.startswith("Processing")))
tot = sum(float(r["Total Time (ns)"]) for r in rows)
print(f"{\"kernel\":60s} {\"n\":>7s} {\"mean us\":>9s} {\"share\":>6s}")
for r in rows[:30]:
    print(f"{r[\"Name\"][:60]:60s} {r[\"Instances\"]:>7s} {float(r[\"Avg (ns)\"])/1e3:9.2f} {100*float(r[\"Total Time (ns)\"])/tot:5.1f}%")
'
else
  echo "nsys not found; ncu over eager steps"
  ncu --csv --metrics gpu__time_duration.sum --launch-skip 3000 --launch-count 600 \
    $bin bench decode --model "$model" --batch "$batch" --steps 20 --eager "$@" 2>/dev/null \
    | python3 -c '
import csv, sys, collections
rows = list(csv.DictReader(l for l in sys.stdin if l.startswith("\"")))
agg = collections.defaultdict(list)
for r in rows:
    if r.get("Metric Name") == "gpu__time_duration.sum":
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "nsecond")
        agg[r["Kernel Name"][:60]].append(v * (1000 if unit.startswith("us") else 1))
tot = sum(sum(v) for v in agg.values())
for k, v in sorted(agg.items(), key=lambda kv: -sum(kv[1])):
    print(f"{k:60s} {len(v):7d} {sum(v)/len(v)/1e3:9.2f} {100*sum(v)/tot:5.1f}%")
'
fi
