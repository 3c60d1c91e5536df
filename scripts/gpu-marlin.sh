#!/usr/bin/env bash
# The mixed-input GEMM on repacked weights (`marlin`, issue #48 item 2) on the GPU machine,
# from .gpu/gpu.tar.xz (scripts/pack-gpu.sh: encore and the test binaries). One binary: the
# old path is `ENCORE_QUANT_GEMM=mma` (no repack, qmma / decode-then-GEMM as before), the
# new one `auto` (marlin past the gemv's rows up to 512), `marlin` forces it at every row.
# Parts (comma-separated, default check,kernels,decode):
#   check   `encore info --device cuda` under auto and under marlin (every CUDA kernel against
#           the CPU; the `matmul marlin(...)` cases at m 1..512), the cuda_quant tests
#           (`marlin_matches_cpu`, `marlin_captures_and_views_drop_the_copy` among them)
#   kernels `bench kernels --only quant-gemm` (8B projections at m 16..512: bf16, repacked,
#           block layout), under auto, then under mma (both quantized rows qmma)
#   decode  `bench decode` of the 8B shape quantized in situ (FORMATS, default q4_k q8_0
#           q4_0) at BATCHES (default 1,16,64,128,256,512), auto and mma alternated, and
#           bf16 once; a table of graph step medians last
#   usage: OUT=... [FORMATS=...] [BATCHES=...] bash scripts/gpu-marlin.sh [parts]
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ENCORE_CACHE_DIR=${ENCORE_CACHE_DIR:-/tmp/encore-cache}
OUT=${OUT:-$(mktemp -d)}; mkdir -p "$OUT"
parts=${1:-check,kernels,decode}
has() { [[ ",$parts," == *",$1,"* ]]; }
mkdir -p .bin && tar -xJf .gpu/gpu.tar.xz -C .bin || exit 1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
M=dummy:llama-3-8b
if has check; then
  for mode in auto marlin; do
    ENCORE_QUANT_GEMM=$mode .bin/encore info --device cuda --seed 1 >"$OUT/info-$mode.txt" 2>&1
    echo "== info ($mode) rc=$?"; grep -E 'marlin|FAIL|passed|failed' "$OUT/info-$mode.txt" | grep -vE ' ok|PASS' | head -12
  done
  if [ -x .bin/tests/cuda_quant ]; then
    .bin/tests/cuda_quant --include-ignored --test-threads=1 >"$OUT/test-cuda_quant.txt" 2>&1
    echo "== test cuda_quant rc=$?"; grep -E '^test result|FAILED|panicked' "$OUT/test-cuda_quant.txt" | head -8
  fi
fi
if has kernels; then
  for mode in auto mma; do
    ENCORE_QUANT_GEMM=$mode .bin/encore bench kernels --device cuda --only quant-gemm \
      >"$OUT/kernels-$mode.txt" 2>"$OUT/kernels-$mode.err"
    echo "== bench kernels --only quant-gemm ($mode) rc=$?"; cat "$OUT/kernels-$mode.txt"
  done
fi
if has decode; then
  B=${BATCHES:-1,16,64,128,256,512}
  .bin/encore bench decode --device cuda --model $M --batch $B --steps 30 --json \
    >"$OUT/decode-bf16-auto.jsonl" 2>"$OUT/decode-bf16-auto.err"
  for q in ${FORMATS:-q4_k q8_0 q4_0}; do
    for mode in mma auto; do
      ENCORE_QUANT_GEMM=$mode .bin/encore bench decode --device cuda --model $M --quantization $q \
        --batch $B --steps 30 --json >>"$OUT/decode-$q-$mode.jsonl" 2>>"$OUT/decode-$q-$mode.err" \
        || { echo "FAIL $q $mode"; tail -3 "$OUT/decode-$q-$mode.err"; }
    done
  done
  python3 - "$OUT" <<'EOF'
import json, sys, glob, os, statistics
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "decode-*.jsonl"))):
    tag = os.path.basename(f)[len("decode-"):-len(".jsonl")]
    for line in open(f):
        try:
            v = json.loads(line)
        except ValueError:
            continue
        b = v.get("batch")
        ms = v.get("graph_step_ms") or v.get("eager_step_ms")
        if b is None or ms is None:
            continue
        rows.setdefault(tag, {}).setdefault(b, []).append(ms)
batches = sorted({b for t in rows.values() for b in t})
print("graph step ms (median)".ljust(18) + "".join(f"{b:>9}" for b in batches))
for tag, by in rows.items():
    print(tag.ljust(18) + "".join(
        f"{statistics.median(by[b]):9.2f}" if b in by else " " * 9 for b in batches))
EOF
fi
