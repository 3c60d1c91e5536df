#!/usr/bin/env bash
# Decode-step A/B of kernel settings over 1 and N GPUs, on the GPU machine (device tool,
# nvidia-h100-x2 or larger, carrying .gpu/tp.tar.xz, or TARBALL, e.g. .gpu/gpu.tar.xz from
# scripts/pack-gpu.sh: `encore` and the test binaries
# tests/{cuda,cuda_quant,tensor_parallel}):
#   VARIANTS="base ENCORE_ALLREDUCE=oneshot ENCORE_ALLREDUCE=skip" MODELS="llama-3-8b" \
#   TPS="1 2" ROUNDS=2 TESTS=1 bash scripts/gpu-tp-ab.sh
# Each variant is one environment assignment, `base` for none, or `BIN=name`: the binary
# .bin/name instead of .bin/encore (e.g. `BIN=encore-base`, pack-gpu.sh's ENCORE_BASE_BIN); every (model, tp) runs
# each variant ROUNDS times, alternating, batch 1 (BATCHES), context 128 (CONTEXT), graph
# mode (EXTRA: more `bench decode` flags, e.g. EXTRA="--router-skew 0" routes a mixture of
# experts uniformly); then a table of the graph ms per step. TESTS=1 runs the GPU tests first (or TESTS="binary[:filter] ...",
# some of them). Logs in $OUT (the decode logs in decode-logs.tgz).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" .bin
tar -xJf "${TARBALL:-.gpu/tp.tar.xz}" -C .bin
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
nccl=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
mkdir -p /tmp/nccl && ln -sf "$nccl/libnccl.so.2" /tmp/nccl/libnccl.so
export LD_LIBRARY_PATH=/tmp/nccl:$LD_LIBRARY_PATH
export NCCL_NVLS_ENABLE=0
export ENCORE_CACHE_DIR=/tmp/encore-cache
E=.bin/encore
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
tests=${TESTS:-0}
[ "$tests" = 1 ] && tests="cuda_quant cuda:kernels_match_cpu tensor_parallel"
if [ "$tests" != 0 ]; then
  for t in $tests; do
    t=${t/:/ }
    set -- $t
    echo "== tests $t"
    .bin/tests/$1 --include-ignored --test-threads=1 ${2:-} > "$OUT/test-$1.log" 2>&1
    echo "   rc=$? $(grep -E '^test result' "$OUT/test-$1.log" | tail -1)"
    grep -E -A8 "panicked" "$OUT/test-$1.log" | cut -c1-300 | head -24
  done
fi
ngpu=$(nvidia-smi -L | wc -l)
for m in ${MODELS:-llama-3-8b}; do
  for tp in ${TPS:-1 2}; do
    [ "$tp" -le "$ngpu" ] || continue
    for r in $(seq 1 "${ROUNDS:-2}"); do
      for v in ${VARIANTS:-base}; do
        log="$OUT/decode-$m-tp$tp-${v//[^A-Za-z0-9._-]/_}-r$r.log"  # names the device tool returns
        bin=$E envs=()
        case $v in base) ;; BIN=*) bin=.bin/${v#BIN=} ;; *) envs=("$v") ;; esac
        env "${envs[@]}" "$bin" bench decode --device cuda --model "dummy:$m" -t "$tp" \
          --batch "${BATCHES:-1}" --steps "${STEPS:-50}" --context "${CONTEXT:-128}" \
          ${EXTRA:-} > "$log" 2>&1 || echo "   failed: $log"
      done
    done
  done
done
echo "== graph ms per step (model tp variant round: lines of bench decode)"
for f in "$OUT"/decode-*.log; do
  printf '%-60s %s\n' "$(basename "$f" .log)" "$(grep -E '^ *[0-9]+ ' "$f" | head -3 | tr -s ' ' | tr '\n' '|')"
done
echo "== medians over rounds, batch ${BATCHES:-1}'s first row: graph ms, x rank 0's floor, / the 1-GPU step of the same variant"
python3 - "$OUT" <<'PY'
import glob, os, re, statistics, sys
runs = {}
for f in glob.glob(os.path.join(sys.argv[1], "decode-*.log")):
    m = re.match(r"decode-(.+)-tp(\d+)-(.+)-r\d+\.log$", os.path.basename(f))
    rows = [l.split() for l in open(f) if re.match(r"^ *\d+ ", l)]
    if m and rows:
        runs.setdefault((m[1], int(m[2]), m[3]), []).append((float(rows[0][2]), float(rows[0][5])))
for (model, tp, v), xs in sorted(runs.items()):
    g = statistics.median(x[0] for x in xs)
    fl = statistics.median(x[1] for x in xs)
    one = runs.get((model, 1, v))
    rel = " %.3f of 1 GPU" % (g / statistics.median(x[0] for x in one)) if one and tp > 1 else ""
    print("%-12s tp%d %-40s %8.3f ms  %.3fx floor%s  (%d runs)" % (model, tp, v, g, g / fl, rel, len(xs)))
PY
# The device tool returns at most 8 files: the decode logs go back as one tarball, so the
# test logs and gpus.txt come back too.
tar -czf "$OUT/decode-logs.tgz" -C "$OUT" $(cd "$OUT" && ls decode-*.log 2>/dev/null) 2>/dev/null \
  && rm -f "$OUT"/decode-*.log
