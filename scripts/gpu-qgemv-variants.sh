#!/usr/bin/env bash
# Variants of the quantized gemv (decode batch 1-2) on the GPU machine, from
# .gpu/gpu.tar.xz: `bench decode` of the 8B shape quantized in situ for each format in
# FORMATS (default q4_k) at BATCHES (default 1), once per variant and round (ROUNDS,
# default 2), alternated in one lease. A variant is `name|ENCORE_KERNEL_DEFINES|ENCORE_QG_CTAS`
# (VARIANTS, newline-separated); `base` runs .bin/encore-base. Prints step medians last.
#   usage: OUT=... VARIANTS=$'r4||2\nr1|QG_R1=1|4' bash scripts/gpu-qgemv-variants.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-$(mktemp -d)}; mkdir -p "$OUT"
mkdir -p .bin && tar -xJf .gpu/gpu.tar.xz -C .bin || exit 1
export ENCORE_CACHE_DIR=/tmp/encore-cache
M=dummy:llama-3-8b
B=${BATCHES:-1}
nvidia-smi --query-gpu=name --format=csv,noheader
mapfile -t vs <<<"${VARIANTS:-base||2}"
for r in $(seq "${ROUNDS:-2}"); do
  for q in ${FORMATS:-q4_k}; do
    for v in "${vs[@]}"; do
      IFS='|' read -r name defs ctas <<<"$v"
      bin=.bin/encore; [ "$name" = base ] && bin=.bin/encore-base
      ENCORE_KERNEL_DEFINES="$defs" ENCORE_QG_CTAS="${ctas:-2}" $bin bench decode --device cuda \
        --model $M --quantization $q --batch $B --steps 30 --json \
        >>"$OUT/decode-$q-$name.jsonl" 2>>"$OUT/decode-$q-$name.err" \
        || { echo "FAIL $q $name"; tail -3 "$OUT/decode-$q-$name.err"; }
    done
  done
done
python3 - "$OUT" <<'PY'
import json, sys, glob, os, statistics
rows = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "decode-*.jsonl"))):
    tag = os.path.basename(f)[len("decode-"):-len(".jsonl")]
    for line in open(f):
        try:
            v = json.loads(line)
        except ValueError:
            continue
        if v.get("batch") is None or v.get("graph_step_ms") is None:
            continue
        rows.setdefault(tag, {}).setdefault(v["batch"], []).append(v["graph_step_ms"])
bs = sorted({b for t in rows.values() for b in t})
print("step ms (median of rounds)".ljust(34) + "".join(f"b{b:>7}" for b in bs))
for tag in sorted(rows):
    print(tag.ljust(34) + "".join(f"{statistics.median(rows[tag][b]):8.2f}" if b in rows[tag] else "       -" for b in bs))
PY
