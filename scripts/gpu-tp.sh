#!/usr/bin/env bash
# Tensor parallelism on a machine of 2+ GPUs (run with the device tool's nvidia-h100-x2 or
# nvidia-h200-x2, carrying .gpu from scripts/pack-gpu.sh):
#   1. the kernel check (embedding over a vocabulary shard among the cases);
#   2. greedy tokens over 2 GPUs == 1 GPU (NCCL inside the decode graphs and the pieces);
#   3. `encore generate` over 1 and 2 GPUs: the same tokens in f32, bf16, q8_0 and q4_k;
#   4. (bench) `bench allreduce` (one-shot vs NCCL) and `bench decode` 8B and 1B batch
#      1/16/64 over 1 and 2 GPUs (8B over 2 also with NCCL only);
#   5. (serve) `bench serve --in-process` 8B: one engine over 2 GPUs against two one-GPU
#      engines at once, half the requests each;
# then a short table. NCCL comes from the PyTorch wheel (linked as libnccl.so, the name
# cudarc loads); NVLink multicast off.
#   usage: bash scripts/gpu-tp.sh [check] [bench] [serve]   (check and bench by default)
set -uo pipefail
cd "$(dirname "$0")/.."
what=${*:-check bench}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" .bin
tar -xJf .gpu/gpu.tar.xz -C .bin
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
nccl=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
mkdir -p /tmp/nccl && ln -sf "$nccl/libnccl.so.2" /tmp/nccl/libnccl.so
export LD_LIBRARY_PATH=/tmp/nccl:$LD_LIBRARY_PATH
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpus.txt"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
E=.bin/encore
cmp_gen() {
  python3 - "$1" "$2" <<'PY'
import json, sys
def ids(p):
    return [json.loads(l)["output_ids"] for l in open(p) if l.startswith("{")]
a, b = ids(sys.argv[1]), ids(sys.argv[2])
print("   same tokens:", a == b, "(", len(a), "outputs )")
PY
}
run() { local name=$1; shift; echo "== $name: $*"; "$@" > "$OUT/$name.log" 2>&1; echo "   rc=$?"; tail -3 "$OUT/$name.log"; }
$E info > "$OUT/info.txt" 2>&1; grep -i nccl "$OUT/info.txt"
if [[ $what == *check* ]]; then
  run kernels .bin/tests/cuda --include-ignored --test-threads=1 kernels_match_cpu
  run tp-tests .bin/tests/tensor_parallel --include-ignored --test-threads=1
  for dt in f32 bf16; do
    for tp in 1 2; do
      run "gen-$dt-tp$tp" $E generate --device cuda --model dummy:llama-3.2-1b --dtype $dt \
        -t $tp --max-tokens 24 --json --prompt "The quick brown fox" --prompt "Tensor parallel"
    done
    cmp_gen "$OUT/gen-$dt-tp1.log" "$OUT/gen-$dt-tp2.log"
  done
  # Quantized weights split over the ranks (q4_k: column cuts on whole 256-value blocks).
  for q in q8_0 q4_k; do
    for tp in 1 2; do
      run "gen-$q-tp$tp" $E generate --device cuda --model dummy:llama-3.2-1b --dtype f32 \
        --quantization $q -t $tp --max-tokens 24 --json --prompt "The quick brown fox" --prompt "Tensor parallel"
    done
    cmp_gen "$OUT/gen-$q-tp1.log" "$OUT/gen-$q-tp2.log"
  done
fi
if [[ $what == *bench* ]]; then
  run allreduce $E bench allreduce --device cuda -t 2 --bytes 8192,65536,524288,2097152,16777216
  cat "$OUT/allreduce.log"
  ENCORE_ALLREDUCE=nccl run decode-llama-3-8b-tp2-nccl $E bench decode --device cuda --model dummy:llama-3-8b --batch 1,16,64 -t 2
  for m in llama-3-8b llama-3.2-1b; do
    for tp in 1 2; do
      run "decode-$m-tp$tp" $E bench decode --device cuda --model "dummy:$m" --batch 1,16,64 -t $tp
    done
  done
  echo "== table (graph ms/step)"
  for f in "$OUT"/decode-*.log; do echo "-- $(basename "$f" .log)"; grep -E "^ *[0-9]+ " "$f" | head -5; done
fi
if [[ $what == *serve* ]]; then
  # Serving throughput: one engine over 2 GPUs against two one-GPU engines (half the
  # requests each, at once).
  common=(--in-process --model dummy:llama-3-8b --input-len 128:1024 --output-len 64:512
          --max-num-seqs 256 --max-num-batched-tokens 2048)
  run serve-tp2 $E bench serve "${common[@]}" --device cuda -t 2 --num-prompts 1000
  $E bench serve "${common[@]}" --device cuda:0 --num-prompts 500 --seed 1 > "$OUT/serve-tp1-gpu0.log" 2>&1 &
  $E bench serve "${common[@]}" --device cuda:1 --num-prompts 500 --seed 2 > "$OUT/serve-tp1-gpu1.log" 2>&1 &
  wait
  for f in serve-tp2 serve-tp1-gpu0 serve-tp1-gpu1; do echo "-- $f"; grep -iE "throughput|tok/s|duration|wall" "$OUT/$f.log" | head -6; done
fi
