#!/usr/bin/env bash
# The FP8 KV cache on the GPU (issue "Serving throughput at the leaders' level"), with
# the `encore` binary carried as .gpu/encore.xz (stripped, made on the build machine):
#   info   every CUDA kernel against the CPU (the FP8-cache cases among them) and the
#          capture/replay check (bf16 over an FP8 cache among them);
#   kernels  decode attention at (1,8k) (64,2k) (256,2k) (1024,1k), bf16 and FP8 caches,
#          against the copy bandwidth;
#   decode   the 8B FP8 decode step at batch 1/64/256, context 2048, bf16 KV then FP8 KV.
#   gemm   the GEMM rows of `bench kernels`: Llama-3-8B's projections at an 8k-token
#          prefill step and a 512-row decode step, bf16 weights against FP8 (what bounds
#          the prefill-heavy 2048/128 row);
#   prefill  the 8B FP8 prefill step at 8k tokens (4 x 2048, 1 x 8192), eager;
#   mixed  the 2048/128 row's steady step: 4 x 2048 prompt tokens beside 480 sequences
#          decoding over 2,048 cached FP8 tokens, against the prompts alone and the decodes
#          alone (is the mixed step the sum of its parts?);
#   ncuprefill  each kernel's share of that step's time (ncu durations, summed by name);
#   ncudecode  the same for a decode step at batch 512, 1,536 cached FP8 tokens;
#   ncu    Nsight Compute on the FP8 and bf16 decode-attention kernels of `bench kernels`
#          (a launch of the (64, 2k) or (256, 2k) rows; the launch section names the grid).
# Logs go to $OUT. BIN=encore-old runs .gpu/encore-old.xz (an A/B's base) instead.
#   usage: [BIN=encore] bash scripts/gpu-kv8.sh [info,kernels,gemm,prefill,mixed,ncuprefill,ncudecode,decode,ab,serve,ncu]
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ENCORE_CACHE_DIR=${ENCORE_CACHE_DIR:-/tmp/encore-cache}
OUT=${OUT:-$(mktemp -d)}
parts=${1:-info,kernels,decode}
BIN=${BIN:-encore}
mkdir -p .bin && xz -dc ".gpu/$BIN.xz" > ".bin/$BIN" && chmod +x ".bin/$BIN"
enc=".bin/$BIN"
echo "== $BIN ${ENCORE_DA_ORDER:+ENCORE_DA_ORDER=$ENCORE_DA_ORDER}"
nvidia-smi -L
has() { [[ ",$parts," == *",$1,"* ]]; }
if has info; then
  "$enc" info --device cuda --seed 1 > "$OUT/info-$BIN.log" 2>&1; echo "info rc=$?"
  grep -E "fp8 cache|kv=fp8|FAIL|passed|failed" "$OUT/info-$BIN.log" | grep -vE " ok$" | tail -20
  grep -cE "fp8 cache.* ok$|kv=fp8.* ok$" "$OUT/info-$BIN.log"
fi
if has kernels; then
  "$enc" bench kernels --device cuda --only copy,attention 2>&1 | tee "$OUT/kernels-$BIN${ENCORE_DA_ORDER:-}.log" | grep -E "copy|attention"
fi
if has gemm; then
  "$enc" bench kernels --device cuda --only gemm 2>&1 | tee "$OUT/gemm-$BIN.log" | grep -E "gemm"
fi
if has prefill; then
  # The 8B FP8 prefill step at 8k tokens (4 x 2048 and 1 x 8192), eager.
  "$enc" bench prefill --device cuda --model dummy:llama-3-8b --quantization fp8 \
    --tokens 2048,8192 --batch 1,4 --prefill-buckets none --repeats 3 --json \
    2>>"$OUT/prefill.err" | tee "$OUT/prefill.jsonl" | cut -c1-200
fi
if has mixed; then
  for d in 0 480; do
    "$enc" bench prefill --device cuda --model dummy:llama-3-8b --quantization fp8 \
      --kv-cache-dtype fp8 --tokens 2048 --batch 4 --prefill-buckets none --repeats 5 \
      --decode-batch $d --decode-context 2048 --json 2>>"$OUT/mixed.err" \
      | tee -a "$OUT/mixed.jsonl" | tail -1 | cut -c1-260
  done
  "$enc" bench decode --device cuda --model dummy:llama-3-8b --quantization fp8 \
    --kv-cache-dtype fp8 --batch 480 --context 2048 --steps 10 2>>"$OUT/mixed.err" \
    | tee -a "$OUT/mixed-decode.log" | tail -3
fi
if has ncuprefill; then
  # Where a prefill step's time goes: every kernel's duration (ncu, one metric, kernels
  # serialised) over an eager 4 x 2048-token step (the load's and the cold run's kernels too).
  timeout 400 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    --print-summary per-kernel "$enc" bench prefill --device cuda --model dummy:llama-3-8b \
    --quantization fp8 --tokens 2048 --batch 4 --prefill-buckets none --repeats 1 \
    > "$OUT/ncu-prefill.csv" 2>"$OUT/ncu-prefill.err"
  echo "ncu prefill rc=$?"
  python3 scripts/ncu_summary.py "$OUT/ncu-prefill.csv" | tee "$OUT/ncu-prefill.txt" | head -40
fi
if has ncudecode; then
  # The same for a decode step at batch 512 over 1,536 cached FP8 tokens (1000/1000's
  # steady state): eager steps (profiling graph replays node by node, with every bucket's
  # capture before them, ran past 400 s), the first LAUNCHES kernels after SKIP (the load's
  # quantization and the cold step come first: set SKIP past them to see steps only).
  timeout 400 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    --launch-skip ${SKIP:-0} --launch-count ${LAUNCHES:-3000} \
    --print-summary per-kernel "$enc" bench decode --device cuda --model dummy:llama-3-8b \
    --quantization fp8 --batch 512 --context 1536 --steps 2 --eager --kv-cache-dtype fp8 \
    > "$OUT/ncu-decode.csv" 2>"$OUT/ncu-decode.err"
  echo "ncu decode rc=$?"
  python3 scripts/ncu_summary.py "$OUT/ncu-decode.csv" | tee "$OUT/ncu-decode.txt" | head -30
fi
if has decode; then
  for kv in auto fp8; do
    "$enc" bench decode --device cuda --model dummy:llama-3-8b --quantization fp8 \
      --batch 1,64,256 --context 2048 --steps 20 --kv-cache-dtype $kv --json \
      2>>"$OUT/decode.err" | tee -a "$OUT/decode.jsonl" | cut -c1-160
  done
fi
if has ab; then
  # The decode step with the CUDA-core split kernel against the tensor-core decode kernel.
  for att in split tc; do
    for kv in auto fp8; do
      ENCORE_DECODE_ATTENTION=$att "$enc" bench decode --device cuda --model dummy:llama-3-8b \
        --quantization fp8 --batch 1,64,256 --context 2048 --steps 20 --kv-cache-dtype $kv --json \
        2>>"$OUT/decode.err" | sed "s/^{/{\"attention\":\"$att\",/" | tee -a "$OUT/decode-ab.jsonl" | cut -c1-150
    done
  done
fi
if has serve; then
  # TensorRT-LLM's table (bench serve --dataset-shape trtllm), FP8 weights and KV: its
  # request counts, or PROMPTS a row; ROWS picks rows (e.g. ROWS=2048/128,1000/1000); KV
  # at KVF of the free memory (95%, as TensorRT-LLM's table).
  "$enc" bench serve --in-process --device cuda --model dummy:llama-3-8b --quantization fp8 \
    --kv-cache-dtype fp8 --max-num-batched-tokens 8192 --max-num-seqs ${SEQS:-1024} \
    --kv-fraction ${KVF:-0.95} --dataset-shape trtllm ${PROMPTS:+--num-prompts $PROMPTS} \
    ${ROWS:+--rows $ROWS} --json \
    2>"$OUT/serve.err" > "$OUT/serve.json"
  tail -3 "$OUT/serve.err"
  # The table, and where a step's time goes (in process: the step, the wait on the
  # device, the host's share), the largest batch and the preemptions.
  python3 - "$OUT/serve.json" <<'EOF2' | tee "$OUT/serve.log"
import json, sys
nan = float("nan")
print(f"{'ISL/OSL':10} {'out tok/s':>10} {'peer':>6} {'ratio':>6} {'TPOT ms':>8} {'step ms':>8} "
      f"{'wait ms':>8} {'host ms':>8} {'batch':>6} {'preempt':>7} {'steps':>6}")
for r in json.load(open(sys.argv[1])):
    g = lambda k: r.get(k) if r.get(k) is not None else nan
    print(f"{str(r['isl']) + '/' + str(r['osl']):10} {g('output_throughput'):10.1f} "
          f"{g('peer_output_throughput'):6.0f} {g('output_throughput_ratio'):6.3f} "
          f"{(r.get('tpot_ms') or {}).get('mean') or nan:8.2f} {g('step_ms'):8.2f} "
          f"{g('device_wait_ms'):8.2f} {g('host_ms'):8.2f} {g('max_running'):6} "
          f"{g('preemptions'):7} {g('steps'):6}")
EOF2
fi
if has ncu; then
  for k in attention_decode_hd128_bf16_kv8 attention_decode_hd128_bf16; do
    timeout 150 ncu --clock-control none -k "regex:^$k\$" --launch-skip 1250 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
      --section Occupancy --section LaunchStats --section SchedulerStats --section InstructionStats \
      "$enc" bench kernels --device cuda --only attention > "$OUT/ncu-$k.txt" 2>&1
    echo "ncu $k rc=$?"
    grep -E "Grid Size|DRAM Throughput|Memory Throughput|Duration|Achieved Occupancy|Issued Ipc|No Eligible|Stall|Registers Per|Block Limit|Warp Cycles Per Issued" "$OUT/ncu-$k.txt" | head -30
  done
fi
