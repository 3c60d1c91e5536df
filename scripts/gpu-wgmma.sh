#!/usr/bin/env bash
# The warpgroup-MMA prefill attention (attention_prefill_wg.cu, warp-specialized) against
# the mma.sync kernel and a base build's, on the GPU, with the `encore` binary carried as
# .gpu/encore.xz, in one lease:
#   info     every CUDA kernel against the CPU under each kernel of MODES;
#   kernels  `bench kernels --only prefill-attention` under each (Llama-3-8B heads, 4 x 2048
#            and 1 x 8192, bf16 and FP8 caches; TFLOP/s);
#   prefill  the 8B FP8 prefill step, 4 x 2048 tokens, FP8 KV, eager, under each, twice;
#   serve    the 2048/128 row of TensorRT-LLM's table (PROMPTS requests, default 1000) under
#            each kernel of SERVE_MODES (default wg).
# Logs go to $OUT.
#   usage: [PARTS=info,kernels,prefill,serve] [MODES=...] [INFO_MODES=...] [ROUNDS=2] bash scripts/gpu-wgmma.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ENCORE_CACHE_DIR=${ENCORE_CACHE_DIR:-/tmp/encore-cache}
OUT=${OUT:-$(mktemp -d)}
PARTS=${PARTS:-info,kernels,prefill}
# The kernels compared: wg (the default on sm_90: the warp-specialized warpgroup-MMA
# kernel), mma (attention_prefill.cu's); base (wg of the binary carried as
# .gpu/encore-base.xz, for an A/B across builds).
MODES=${MODES:-wg mma}
run() {  # run MODE COMMAND...
  local m=$1; shift
  case $m in
    base) shift; ENCORE_PREFILL_ATTENTION=wg timeout ${LIMIT:-300} .bin/encore-base "$@" ;;  # in place of the named binary
    *) ENCORE_PREFILL_ATTENTION=$m timeout ${LIMIT:-300} "$@" ;;
  esac
}
has() { [[ ",$PARTS," == *",$1,"* ]]; }
mkdir -p .bin && xz -dc ${GPU_DIR:-.gpu}/encore.xz > .bin/encore && chmod +x .bin/encore
[ -f ${GPU_DIR:-.gpu}/encore-base.xz ] && xz -dc ${GPU_DIR:-.gpu}/encore-base.xz > .bin/encore-base && chmod +x .bin/encore-base
enc=.bin/encore
nvidia-smi -L
if has info; then
  for m in ${INFO_MODES:-$MODES}; do
    run $m "$enc" info --device cuda --seed 7 > "$OUT/info-$m.log" 2>&1
    echo "info $m rc=$?"
    grep -E "FAIL|passed|failed|checks" "$OUT/info-$m.log" | tail -6
    grep -iE "attention" "$OUT/info-$m.log" | grep -vE " ok$" | head -12
  done
fi
if has kernels; then
  for m in $MODES; do
    echo "== kernels $m"
    run $m "$enc" bench kernels --device cuda --only prefill-attention 2>&1 \
      | tee "$OUT/pa-$m.log" | grep -E "prefill attention|rror"
  done
fi
if has prefill; then
  for round in $(seq ${ROUNDS:-2}); do
    for m in $MODES; do
      echo "== prefill $m round $round"
      run $m "$enc" bench prefill --device cuda --model dummy:llama-3-8b \
        --quantization fp8 --kv-cache-dtype fp8 --tokens 2048 --batch 4 --prefill-buckets none \
        --repeats 5 --json 2>>"$OUT/prefill.err" | tee -a "$OUT/prefill-$m.jsonl" | tail -1 | cut -c1-240
    done
  done
fi
if has serve; then
  for m in ${SERVE_MODES:-wg}; do
    echo "== serve $m"
    run $m "$enc" bench serve --in-process --device cuda --model dummy:llama-3-8b --quantization fp8 \
      --kv-cache-dtype fp8 --max-num-batched-tokens 8192 --max-num-seqs 1024 --kv-fraction 0.95 \
      --dataset-shape trtllm --rows 2048/128 --num-prompts ${PROMPTS:-1000} --json \
      2>"$OUT/serve-$m.err" > "$OUT/serve-$m.json"
    tail -2 "$OUT/serve-$m.err"
    python3 -c "import json,sys; [print(r['isl'],r['osl'],round(r['output_throughput'],1),round(r.get('output_throughput_ratio') or 0,3),round(r['step_ms'],2),round(r['host_ms'],2)) for r in json.load(open(sys.argv[1]))]" "$OUT/serve-$m.json"
  done
fi
