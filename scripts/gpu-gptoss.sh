#!/usr/bin/env bash
# gpt-oss at batch 1 on the GPU (issue "gpt-oss": batch 1 within 1.5x its floor), with the
# `encore` binaries carried as .gpu/encore.xz and, for an A/B, .gpu/encore-old.xz (or as
# .gpu/gpu.tar.xz from scripts/pack-gpu.sh, with test binaries):
#   test     the test binaries of gpu.tar.xz named by TESTS (default "cuda_quant loader"),
#            --include-ignored (TEST_FILTER: test-name filters);
#   info     every CUDA kernel against the CPU (the expert kernels of every format among them);
#   ab       `bench decode` of dummy:gpt-oss-20b in MXFP4 at batch 1 and 64, context 512,
#            old and new binaries alternated ROUNDS times (graph step, median of 20);
#   pairs    the few-token experts' kernels: ENCORE_MOE_PAIRS=gemv (f32 pair kernels) and
#            mma (tensor cores) alternated ROUNDS times, `bench decode --batch 1,8` of each of
#            PAIR_MODELS ("model:quantization", default gpt-oss-20b in MXFP4 and
#            Qwen3-30B-A3B's shapes in Q4_K);
#   serve    `bench serve --dataset-shape trtllm-gpt-oss-20b` (MODEL's size) at ROWS;
#   ncu      (BIN=encore|encore-old) each kernel of an eager batch-1 step: time, DRAM bytes read, grid (one step's
#            launches, the load and the first steps skipped), summed by name.
# Logs go to $OUT.   usage: bash scripts/gpu-gptoss.sh [test,info,ab,pairs,serve,ncu]
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ENCORE_CACHE_DIR=${ENCORE_CACHE_DIR:-/tmp/encore-cache}
OUT=${OUT:-$(mktemp -d)}
parts=${1:-info,ab}
MODEL=${MODEL:-dummy:gpt-oss-20b}
mkdir -p .bin
[ -f .gpu/gpu.tar.xz ] && tar -xJf .gpu/gpu.tar.xz -C .bin
for b in encore encore-old; do
  [ -f ".gpu/$b.xz" ] && xz -dc ".gpu/$b.xz" > ".bin/$b" && chmod +x ".bin/$b"
done
has() { [[ ",$parts," == *",$1,"* ]]; }
if has test; then
  for t in ${TESTS:-cuda_quant loader}; do
    ".bin/tests/$t" --include-ignored --test-threads=4 ${TEST_FILTER:-} > "$OUT/test-$t.log" 2>&1
    echo "test $t rc=$?: $(grep -E '^test result' "$OUT/test-$t.log" | tail -1)"
    grep -E 'FAILED|panicked' "$OUT/test-$t.log" | head -8
  done
fi
if has info; then
  .bin/encore info --device cuda --seed 3 > "$OUT/info.log" 2>&1; echo "info rc=$?"
  grep -E "FAIL|passed|failed" "$OUT/info.log" | tail -8
fi
if has ab; then
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for b in encore-old encore; do
      [ -x ".bin/$b" ] || continue
      ".bin/$b" bench decode --device cuda --model "$MODEL" --quantization mxfp4 \
        --batch ${BATCH:-1,64} --context 512 --steps 20 --json 2>>"$OUT/ab.err" \
        | sed "s/^{/{\"bin\":\"$b\",/" | tee -a "$OUT/ab.jsonl" | cut -c1-220
    done
  done
fi
if has pairs; then
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for mq in ${PAIR_MODELS:-gpt-oss-20b:mxfp4 qwen3-30b-a3b:q4_k}; do
      for p in gemv mma; do
        ENCORE_MOE_PAIRS=$p .bin/encore bench decode --device cuda --model "dummy:${mq%%:*}" \
          --quantization "${mq##*:}" --batch ${BATCH:-1,8} --context 512 --steps 20 --json \
          2>>"$OUT/pairs.err" | sed "s/^{/{\"pairs\":\"$p\",/" | tee -a "$OUT/pairs.jsonl" \
          | cut -c1-240
      done
    done
  done
fi
if has serve; then
  # TensorRT-LLM's gpt-oss table (bench serve --dataset-shape trtllm-gpt-oss-20b|-120b):
  # ROWS (default 1000/1000), PROMPTS a row (default the peer's counts), KV in KVDT (default
  # auto = bf16: the peer's Hopper setting) at 95% of the free memory.
  size=${MODEL#dummy:gpt-oss-}
  .bin/encore bench serve --in-process --device cuda --model "$MODEL" --quantization mxfp4 \
    --kv-cache-dtype ${KVDT:-auto} --max-num-batched-tokens 8192 --max-num-seqs ${SEQS:-1024} \
    --kv-fraction ${KVF:-0.95} --dataset-shape "trtllm-gpt-oss-$size" --rows ${ROWS:-1000/1000} \
    ${PROMPTS:+--num-prompts $PROMPTS} --json 2>"$OUT/serve.err" | tee "$OUT/serve.json" \
    | python3 -c 'import json,sys
for r in json.load(sys.stdin):
    print({k: r.get(k) for k in ("isl","osl","num_prompts","output_throughput","peer_output_throughput","output_throughput_ratio","step_ms","host_ms","max_running","preemptions")})'
  tail -3 "$OUT/serve.err"
fi
if has ncu; then
  timeout 300 ncu --clock-control none --csv \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size \
    --launch-skip ${SKIP:-3000} --launch-count ${LAUNCHES:-300} \
    ".bin/${BIN:-encore}" bench decode --device cuda --model "$MODEL" --quantization mxfp4 \
    --batch 1 --context 512 --steps 20 --eager > "$OUT/ncu.csv" 2>"$OUT/ncu.err"
  echo "ncu rc=$?"
  python3 - "$OUT/ncu.csv" <<'PY' | tee "$OUT/ncu.txt"
import csv, sys, collections
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))]
per = collections.defaultdict(dict)
for r in rows:
    v = float(r["Metric Value"].replace(",", ""))
    u = r.get("Metric Unit", "")
    if r["Metric Name"] == "gpu__time_duration.sum":
        v *= {"usecond": 1e3, "msecond": 1e6}.get(u, 1)
    if r["Metric Name"] == "dram__bytes_read.sum":
        v *= {"Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(u, 1)
    per[r["ID"]][r["Metric Name"]] = v
    per[r["ID"]]["name"] = r["Kernel Name"][:48]
agg = collections.defaultdict(lambda: [0, 0.0, 0.0, set()])
for d in per.values():
    a = agg[d["name"]]
    a[0] += 1; a[1] += d.get("gpu__time_duration.sum", 0); a[2] += d.get("dram__bytes_read.sum", 0)
    a[3].add(int(d.get("launch__grid_size", 0)))
tot = sum(a[1] for a in agg.values())
print(f"{'kernel':48} {'n':>4} {'mean us':>8} {'MB/call':>8} {'GB/s':>7} {'share':>6} grids")
for k, a in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"{k:48} {a[0]:4} {a[1]/a[0]/1e3:8.2f} {a[2]/a[0]/1e6:8.2f} {a[2]/max(a[1],1):7.0f} "
          f"{100*a[1]/tot:5.1f}% {sorted(a[3])[:4]}")
PY
fi
