#!/usr/bin/env bash
# Runs on the GPU machine over a copy of the tree, with .bin/ (from scripts/build-gpu.sh)
# carried along. Runs: kernel compile cold vs cached (`encore info`, which also self-checks
# every CUDA kernel against the CPU), every test binary with --include-ignored,
# compute-sanitizer memcheck + racecheck on the CUDA kernel tests, `encore bench kernels`,
# and the PyTorch reference figures. Logs go to $OUT; a short table is printed last.
# --real-models adds the real-model figures (needs ENCORE_SMOLLM2_GGUF, and .bin/dummy_gguf
# for the 1B-shape GGUF load time); --no-tests skips the test binaries and the sanitizer.
#   usage: bash scripts/gpu-check.sh [--no-tests] [--no-sanitizer] [--no-bench] [--nvrtc-cold]
#                                    [--real-models]
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-$(mktemp -d)}
sanitizer=1; bench=1; nvrtc_cold=0; tests=1; real=0
for a in "$@"; do
  case $a in
    --no-sanitizer) sanitizer=0 ;; --no-bench) bench=0 ;; --nvrtc-cold) nvrtc_cold=1 ;;
    --no-tests) tests=0; sanitizer=0 ;; --real-models) real=1 ;;
  esac
done
export ENCORE_CACHE_DIR=$(mktemp -d)
rows=()
run() { # name, command... : runs it, logs to $OUT/name.log, records ok/FAIL and wall time
  local name=$1; shift
  local t0=$EPOCHREALTIME
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  local dt; dt=$(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $t0}")
  local status=ok; [ $rc -eq 0 ] || status="FAIL($rc)"
  rows+=("$(printf '%-34s %-9s %7ss' "$name" "$status" "$dt")")
  echo "== $name: $status in ${dt}s"
  [ $rc -eq 0 ] || tail -n 30 "$OUT/$name.log"
  return $rc
}
nvidia-smi -L 2>&1 | tee "$OUT/nvidia-smi.log"

run info-cold-cache   .bin/encore info --device cuda --seed 1
run info-warm-cache   .bin/encore info --device cuda --seed 2 --no-self-check
# Cold compiles again, each with an empty encore cache (and, last, an empty HOME and the
# driver's JIT cache off), to see what besides encore's cache makes later cold starts fast.
touch "$OUT/nvrtc-cold.log"
if [ $nvrtc_cold = 1 ]; then
  for i in 1 2; do
    ENCORE_CACHE_DIR=$(mktemp -d) .bin/encore info --device cuda --no-self-check | grep '^kernels' >>"$OUT/nvrtc-cold.log"
  done
  HOME=$(mktemp -d) CUDA_CACHE_DISABLE=1 ENCORE_CACHE_DIR=$(mktemp -d) \
    .bin/encore info --device cuda --no-self-check | grep '^kernels' >>"$OUT/nvrtc-cold.log"
fi
# Random-weight HF models and transformers' logits, for the parity test (tests/hf_parity.rs).
export ENCORE_HF_REF=$(mktemp -d)

[ $tests = 1 ] && run hf-reference env PYTHONUNBUFFERED=1 python3 scripts/hf_reference.py "$ENCORE_HF_REF"
for t in .bin/tests/*; do
  [ $tests = 1 ] || break
  # The CLI tests (cli, serve_cli, bench_serve) run the binary at its build-machine path;
  # they are CPU tests (CI).
  case "$(basename "$t")" in cli|serve_cli|bench_serve) continue ;; esac
  run "test-$(basename "$t")" "$t" --include-ignored --test-threads=4
done
if [ $sanitizer = 1 ] && command -v compute-sanitizer >/dev/null && [ -x .bin/tests/cuda ]; then
  run sanitizer-memcheck  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 \
      .bin/tests/cuda --include-ignored --test-threads=1 kernels_match_cpu windowed_attention prefill_attention sampling_
  # Weight offload: copies on the copy stream, graphs with memcpy nodes, the embedding read
  # in place from host memory.
  [ -x .bin/tests/offload_exec ] && run sanitizer-memcheck-offload timeout 300 compute-sanitizer \
      --tool memcheck --error-exitcode 9 .bin/tests/offload_exec --include-ignored \
      --test-threads=1 cuda::cuda_budgets cuda::cuda_copy_queue
  # cuBLASLt's own nvjet kernels report shared-memory hazards racecheck cannot follow
  # (their warp-specialised mbarrier pipelines); only encore's kernels are checked.
  run sanitizer-racecheck timeout 400 compute-sanitizer --tool racecheck --error-exitcode 9 \
      --kernel-name-exclude kns=nvjet \
      .bin/tests/cuda --include-ignored --test-threads=1 kernels_match_cpu windowed_attention prefill_attention sampling_
fi
if [ $bench = 1 ]; then
  run bench-kernels   .bin/encore bench kernels --device cuda
  run torch-reference python3 scripts/torch_reference.py
  for m in qwen2.5-0.5b llama-3.2-1b llama-3-8b; do
    run "bench-decode-$m" .bin/encore bench decode --device cuda --model "dummy:$m" --batch 1,8,32,128,256
  done
  for m in llama-3.2-1b llama-3-8b; do
    for o in ascending descending shuffled; do
      run "bench-capture-$m-$o" .bin/encore bench capture --device cuda --model "dummy:$m" --order $o
    done
  done
  # Weight offload (issue #12): planned vs LRU, graph vs eager, beside the PCIe bound.
  run bench-offload-llama-3.2-1b .bin/encore bench offload --device cuda --model dummy:llama-3.2-1b --budgets 100,75,50
  # The peers' mechanism: PyTorch CUDA graphs sharing one pool (what vLLM and SGLang do).
  run torch-graph-pool-llama-3.2-1b python3 scripts/torch_graph_pool.py --model llama-3.2-1b
  run torch-graph-pool-llama-3-8b python3 scripts/torch_graph_pool.py --model llama-3-8b \
      --orders largest,smallest,shuffled
fi

if [ $real = 1 ]; then
  # Real model (SmolLM2-135M-Instruct Q4_1 GGUF) on the GPU: the answer, decode and prefill
  # beside its dummy twin of the same shape; then GGUF load time of a 1B-shape Q8_0 file.
  g=${ENCORE_SMOLLM2_GGUF:-}
  if [ -n "$g" ] && [ -f "$g" ]; then
    run smollm2-generate .bin/encore generate --device cuda --model "$g" --chat \
        --prompt "What is the capital of France?" --max-tokens 40
    run smollm2-generate-json .bin/encore generate --device cuda --model "$g" --chat --json \
        --prompt "What is the capital of France?" --max-tokens 64 --ignore-eos
    run smollm2-bench-decode .bin/encore bench decode --device cuda --model "$g" --batch 1,8,32,128
    run smollm2-dummy-bench-decode .bin/encore bench decode --device cuda \
        --model dummy:smollm2-135m --batch 1,8,32,128
    run smollm2-bench-prefill .bin/encore bench prefill --device cuda --model "$g" \
        --tokens 128,512,2000
  else
    echo "== real models: ENCORE_SMOLLM2_GGUF not set or missing; SmolLM2 skipped"
  fi
  if [ -x .bin/dummy_gguf ]; then
    run gguf-write-1b .bin/dummy_gguf llama-3.2-1b q8_0 /tmp/llama-1b.q8_0.gguf
    for i in 1 2 3; do
      run "gguf-load-1b-$i" .bin/encore bench decode --device cuda --model /tmp/llama-1b.q8_0.gguf \
          --batch 1 --steps 5 --context 16
    done
  fi
fi

echo
echo "---- kernels: cold vs cached compile (first cold, cached, then 3 more cold)"
grep -h '^kernels' "$OUT/info-cold-cache.log" "$OUT/info-warm-cache.log" "$OUT/nvrtc-cold.log"
if [ $bench = 1 ]; then
  echo "---- encore bench kernels"; cat "$OUT/bench-kernels.log"
  echo "---- PyTorch reference";    cat "$OUT/torch-reference.log"
  echo "---- encore bench decode (eager)"
  for m in qwen2.5-0.5b llama-3.2-1b llama-3-8b; do cat "$OUT/bench-decode-$m.log"; done
  echo "---- encore bench capture (graph memory per strategy)"
  cat "$OUT"/bench-capture-*.log
  echo "---- encore bench offload (llama-3.2-1b shape)"; cat "$OUT/bench-offload-llama-3.2-1b.log"
  echo "---- PyTorch CUDA graphs in one shared pool"
  cat "$OUT"/torch-graph-pool-*.log
fi
if [ $real = 1 ]; then
  echo "---- real models"
  for f in smollm2-generate smollm2-generate-json smollm2-bench-decode smollm2-dummy-bench-decode \
           smollm2-bench-prefill gguf-load-1b-1 gguf-load-1b-2 gguf-load-1b-3; do
    [ -f "$OUT/$f.log" ] && { echo "-- $f"; grep -v '^\s*$' "$OUT/$f.log" | tail -n 12; }
  done
fi
echo "---- summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
printf '%s\n' "${rows[@]}"
