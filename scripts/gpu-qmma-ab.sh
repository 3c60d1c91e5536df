#!/usr/bin/env bash
# A/B of the quantized tensor-core GEMM (`qmma`, decode batches past the gemv) on the GPU
# machine, from .gpu/gpu.tar.xz (scripts/pack-gpu.sh with ENCORE_BASE_BIN): the quantized
# GPU tests on the new build first, then `bench decode` of the 8B shape quantized in situ
# (FORMATS, default q4_k q8_0) at BATCHES (default 8,16,64,256), base and new alternated
# for ROUNDS rounds (default 2) in one lease, and bf16 once for reference. Prints a table of
# step medians last; logs under $OUT.
#   usage: OUT=... bash scripts/gpu-qmma-ab.sh [tests,ab]
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-$(mktemp -d)}; mkdir -p "$OUT"
parts=${1:-tests,ab}
has() { [[ ",$parts," == *",$1,"* ]]; }
mkdir -p .bin && tar -xJf .gpu/gpu.tar.xz -C .bin || exit 1
# More variants, optional: .gpu/b.tar.xz holding encore-b, encore-c, ...
[ -f .gpu/b.tar.xz ] && tar -xJf .gpu/b.tar.xz -C .bin
variants=(base new)
for v in b c d; do [ -x .bin/encore-$v ] && variants+=($v); done
export ENCORE_CACHE_DIR=/tmp/encore-cache
M=dummy:llama-3-8b
B=${BATCHES:-8,16,64,256}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if has tests; then
  for t in cuda_quant quantized; do
    .bin/tests/$t --include-ignored --test-threads=1 >"$OUT/test-$t.txt" 2>&1
    echo "== test $t rc=$?"; grep -E '^test result|FAILED|panicked' "$OUT/test-$t.txt" | head -8
  done
fi
if has ab; then
  .bin/encore bench decode --device cuda --model $M --batch $B --steps 30 --json \
    >"$OUT/decode-none-new.jsonl" 2>"$OUT/decode-none-new.err"
  for r in $(seq "${ROUNDS:-2}"); do
    for q in ${FORMATS:-q4_k q8_0}; do
      for which in "${variants[@]}"; do
        bin=.bin/encore; [ $which = base ] && bin=.bin/encore-base
        case $which in base|new) ;; *) bin=.bin/encore-$which ;; esac
        $bin bench decode --device cuda --model $M --quantization $q --batch $B --steps 30 \
          --json >>"$OUT/decode-$q-$which.jsonl" 2>>"$OUT/decode-$q-$which.err" \
          || { echo "FAIL $q $which"; tail -3 "$OUT/decode-$q-$which.err"; }
      done
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
print("step ms (median of rounds)   " + "  ".join(f"b{b:>5}" for b in batches))
for tag, t in rows.items():
    cells = "  ".join(f"{statistics.median(t[b]):6.2f}" if b in t else "     -" for b in batches)
    print(f"{tag:28s} {cells}")
EOF
fi
