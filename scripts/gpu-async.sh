#!/usr/bin/env bash
# Asynchronous scheduling on the GPU (issue "Serving throughput at the leaders' level":
# the host's work overlapped with the device), with .gpu/gpu.tar.xz (`encore` and test
# binaries, see scripts/gpu-gptoss.sh's notes):
#   test   the scheduler tests (TESTS, default "scheduler"), --include-ignored, filtered by
#          TEST_FILTER (default "cuda"): the overlapped loop's tokens against the synchronous
#          loop's on CUDA graphs among them;
#   serve  `bench serve --dataset-shape trtllm` on dummy:llama-3-8b in FP8 with an FP8 KV
#          cache at ROWS (default 128/128), PROMPTS requests a row (default the peer's),
#          synchronous and with --async-scheduling alternated ROUNDS times (default 1;
#          MODES="async" runs one of them);
#   gptoss the same A/B on dummy:gpt-oss-20b (MXFP4 experts, bf16 KV) at 1000/1000.
# Logs go to $OUT.   usage: bash scripts/gpu-async.sh [test,serve,gptoss]
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ENCORE_CACHE_DIR=${ENCORE_CACHE_DIR:-/tmp/encore-cache}
OUT=${OUT:-$(mktemp -d)}
parts=${1:-test,serve}
mkdir -p .bin
[ -f .gpu/gpu.tar.xz ] && tar -xJf .gpu/gpu.tar.xz -C .bin
has() { [[ ",$parts," == *",$1,"* ]]; }
table() {
  python3 - "$@" <<'EOF2'
import json, sys
nan = float("nan")
for path in sys.argv[1:]:
    for r in json.load(open(path)):
        g = lambda k: r.get(k) if r.get(k) is not None else nan
        print(f"{path.rsplit('/', 1)[-1]:28} {str(r['isl']) + '/' + str(r['osl']):10} "
              f"{g('output_throughput'):10.1f} peer {g('peer_output_throughput'):6.0f} "
              f"ratio {g('output_throughput_ratio'):6.3f} step {g('step_ms'):7.2f} "
              f"wait {g('device_wait_ms'):7.2f} host {g('host_ms'):6.2f} "
              f"batch {g('max_running')} preempt {g('preemptions')} steps {g('steps')} "
              f"overlapped {g('overlapped_steps')}")
EOF2
}
if has test; then
  for t in ${TESTS:-scheduler}; do
    ".bin/tests/$t" --include-ignored --test-threads=1 ${TEST_FILTER:-cuda} > "$OUT/test-$t.log" 2>&1
    echo "test $t rc=$?: $(grep -E '^test result' "$OUT/test-$t.log" | tail -1)"
    grep -E 'FAILED|panicked' "$OUT/test-$t.log" | head -8
  done
fi
ab() {
  local name=$1; shift
  for r in $(seq 1 "${ROUNDS:-1}"); do
    for mode in ${MODES:-sync async}; do
      flag="--no-async-scheduling"; [ "$mode" = async ] && flag="--async-scheduling"
      .bin/encore bench serve --in-process --device cuda "$@" $flag --json \
        2>"$OUT/$name-$mode-$r.err" > "$OUT/$name-$mode-$r.json"
      echo "$name $mode round $r rc=$?"; tail -2 "$OUT/$name-$mode-$r.err"
      table "$OUT/$name-$mode-$r.json" | tee -a "$OUT/$name.log"
    done
  done
}
if has serve; then
  ab serve --model dummy:llama-3-8b --quantization fp8 --kv-cache-dtype fp8 \
    --max-num-batched-tokens 8192 --max-num-seqs ${SEQS:-1024} --kv-fraction ${KVF:-0.95} \
    --dataset-shape trtllm ${PROMPTS:+--num-prompts $PROMPTS} --rows ${ROWS:-128/128}
fi
if has gptoss; then
  ab gptoss --model dummy:gpt-oss-20b --quantization mxfp4 --kv-cache-dtype auto \
    --max-num-batched-tokens 8192 --max-num-seqs 1024 --kv-fraction 0.95 \
    --dataset-shape trtllm-gpt-oss-20b --rows ${GROWS:-1000/1000} --num-prompts ${GPROMPTS:-1000}
fi
