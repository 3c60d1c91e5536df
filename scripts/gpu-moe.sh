#!/usr/bin/env bash
# Mixtures of experts on the GPU machine, from .gpu/moe.tar.xz (encore, the dummy_gguf
# example and the cuda, cuda_quant and hf_parity test binaries). Parts (comma-separated):
#   tests     the MoE op against the CPU and in a graph (tests/cuda, tests/cuda_quant: dense
#             and quantized experts), the HF reference with the MoE models and the parity
#             test on CPU and CUDA, the tiny MoE dummies generating in graph mode;
#   bench     decode steps at Qwen3-30B-A3B's shapes: bf16, and q8_0 / q4_k in situ;
#   write     Qwen3-30B-A3B-shaped Q4_K_M and Q8_0 GGUFs (dummy_gguf) in /tmp/gguf;
#   gguf      (writing them first if missing) encore's decode and prefill on them;
#   peerbuild llama.cpp's llama-bench from .gpu/llama.cpp-src.tar.xz (about 5 minutes),
#             beside the GGUF writing;
#   peer      llama-bench -fa 1 on the same GGUF files;
#   skew      decode and prefill at Qwen3-30B-A3B's (q4_k in situ, bf16) and Mixtral-8x7B's
#             (q4_k) shapes, routed by --router-skew 0 (and 1.2);
#   offload   the tiny MoE dummies under --weight-budget 50% and at the floor on CUDA,
#             their greedy tokens against the resident run (the expert cache, the default
#             policy for experts, and the planned ring);
#   cache     the expert cache: its CUDA tests (decisions against the CPU's, replays), the
#             offload executor's CUDA tests, then decode at Qwen3-30B-A3B's shapes (q4_k
#             in situ) under 50% and 25% budgets, batch 1 and 16, router skew 0 and
#             CACHE_SKEWS (default "0.8 1.2"), against the resident run;
#   prefetch  the expert prefetch: its CUDA tests, then decode (q4_k in situ, batch 1 and 16)
#             with it off and on, at PREFETCH_CASES ("skew:budget:accuracy ..."; default
#             0.8 at 50% with accuracy 1, 0.8 and 0.5).
# GGUF_TYPES narrows the files (default "q4_k_m q8_0"). Logs under $OUT.
#   usage: OUT=... bash scripts/gpu-moe.sh tests,peerbuild,write  then  gguf,peer  (one warm lease)
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ENCORE_CACHE_DIR=/tmp/encore-cache
OUT=${OUT:-$(mktemp -d)}; mkdir -p "$OUT" .moe
parts=${1:-tests}
has() { [[ ",$parts," == *",$1,"* ]]; }
tar -xJf .gpu/moe.tar.xz -C .moe || exit 1
E=.moe/encore
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
G=/tmp/gguf
source scripts/llama-peer.sh
if has peerbuild; then
  build_peer "$OUT" & bp=$!
fi
if has tests; then
  .moe/tests/cuda --include-ignored --test-threads=1 moe >"$OUT/cuda-moe.txt" 2>&1
  echo "== cuda moe rc=$?"; grep -E '^test |test result|panicked|assert' "$OUT/cuda-moe.txt" | head -8
  .moe/tests/cuda_quant --include-ignored --test-threads=1 moe >"$OUT/cuda-quant-moe.txt" 2>&1
  echo "== cuda_quant moe rc=$?"; grep -E '^test |test result|panicked|assert' "$OUT/cuda-quant-moe.txt" | head -8
  [ -d /tmp/ref/qwen3_moe ] || python3 scripts/hf_reference.py /tmp/ref >"$OUT/ref.log" 2>&1
  ENCORE_HF_REF=/tmp/ref .moe/tests/hf_parity --include-ignored --test-threads=1 --nocapture \
    >"$OUT/hf-parity.txt" 2>&1
  echo "== hf_parity rc=$?"; grep -E "^(qwen3_moe|qwen2_moe|mixtral) |test result|skipped" "$OUT/hf-parity.txt"
  for m in tiny-qwen3-moe tiny-qwen2-moe tiny-mixtral; do
    for q in none q8_0; do
      $E generate --device cuda --model dummy:$m --quantization $q --prompt hello \
        --max-tokens 16 --verify-graphs >"$OUT/gen-$m-$q.txt" 2>&1
      echo "== generate $m $q rc=$?"; tail -1 "$OUT/gen-$m-$q.txt"
    done
  done
fi
if has bench; then
  for q in none q8_0 q4_k; do
    $E bench decode --device cuda --model dummy:qwen3-30b-a3b --quantization $q \
      --batch 1,8,64 --steps 30 >"$OUT/decode-30b-$q.txt" 2>&1
    echo "== decode qwen3-30b-a3b $q rc=$?"; tail -5 "$OUT/decode-30b-$q.txt"
  done
fi
# Routed by --router-skew tables (uniform, and Zipf 1.2), not by the random routers.
if has skew; then
  M=dummy:qwen3-30b-a3b
  for sk in 0 1.2; do
    $E bench decode --device cuda --model $M --quantization q4_k --batch 1,8,16,64,256 \
      --steps 30 --router-skew $sk >"$OUT/skew-decode-q4_k-$sk.txt" 2>&1
    echo "== decode $M q4_k skew $sk rc=$?"; tail -6 "$OUT/skew-decode-q4_k-$sk.txt"
  done
  $E bench prefill --device cuda --model $M --quantization q4_k --tokens 512,2048 \
    --router-skew 0 >"$OUT/skew-prefill-q4_k.txt" 2>&1
  echo "== prefill $M q4_k skew 0 rc=$?"; tail -3 "$OUT/skew-prefill-q4_k.txt"
  $E bench decode --device cuda --model $M --batch 1,8,64 --steps 30 --router-skew 0 \
    >"$OUT/skew-decode-bf16.txt" 2>&1
  echo "== decode $M bf16 skew 0 rc=$?"; tail -4 "$OUT/skew-decode-bf16.txt"
  $E bench prefill --device cuda --model $M --tokens 512,2048 --router-skew 0 \
    >"$OUT/skew-prefill-bf16.txt" 2>&1
  echo "== prefill $M bf16 skew 0 rc=$?"; tail -3 "$OUT/skew-prefill-bf16.txt"
  M=dummy:mixtral-8x7b
  $E bench decode --device cuda --model $M --quantization q4_k --batch 1,8,64 --steps 30 \
    --router-skew 0 >"$OUT/skew-decode-mixtral.txt" 2>&1
  echo "== decode $M q4_k skew 0 rc=$?"; tail -4 "$OUT/skew-decode-mixtral.txt"
  $E bench prefill --device cuda --model $M --quantization q4_k --tokens 512,2048 \
    --router-skew 0 >"$OUT/skew-prefill-mixtral.txt" 2>&1
  echo "== prefill $M q4_k skew 0 rc=$?"; tail -3 "$OUT/skew-prefill-mixtral.txt"
fi
# The MoE dummies under weight budgets on CUDA: the same greedy tokens as resident.
if has offload; then
  for m in tiny-qwen3-moe tiny-qwen2-moe tiny-mixtral; do
    ref=$($E generate --device cuda --model dummy:$m --prompt hello --prompt "a longer prompt" \
      --max-tokens 16 --ignore-eos --json 2>/dev/null | grep -o '"output_ids":\[[0-9,]*\]' | tr '\n' ' ')
    for pol in auto planned; do
      floor=$($E generate --device cuda --model dummy:$m --prompt hello --max-tokens 1 \
        --weight-budget 1 --offload-policy $pol 2>&1 | grep -o 'minimum of [0-9]* bytes' | grep -o '[0-9]*')
      for b in 50% $floor; do
        got=$($E generate --device cuda --model dummy:$m --prompt hello --prompt "a longer prompt" \
          --max-tokens 16 --ignore-eos --json --weight-budget $b --offload-policy $pol \
          2>"$OUT/offload-$m-$pol-$b.txt" | grep -o '"output_ids":\[[0-9,]*\]' | tr '\n' ' ')
        [ -n "$ref" ] && [ "$got" = "$ref" ] && r=same || r="DIFFERENT ($got vs $ref)"
        echo "== offload $m $pol budget $b (floor $floor): $r"
      done
    done
  done
fi
# The expert cache: CUDA tests, then decode under budgets with set routing.
if has cache; then
  .moe/tests/cuda_quant --include-ignored --test-threads=1 expert_cache >"$OUT/cuda-cache.txt" 2>&1
  echo "== cuda_quant expert_cache rc=$?"; grep -E 'test result|panicked|assert' "$OUT/cuda-cache.txt" | head -6
  .moe/tests/offload_exec --include-ignored --test-threads=1 >"$OUT/offload-exec.txt" 2>&1
  echo "== offload_exec rc=$?"; grep -E 'test result|panicked|FAILED' "$OUT/offload-exec.txt" | head -6
  M=dummy:qwen3-30b-a3b
  for sk in 0 ${CACHE_SKEWS:-0.8 1.2}; do
    for b in none 50% 25%; do
      [ $b = none ] && flag="" || flag="--weight-budget $b"
      $E bench decode --device cuda --model $M --quantization q4_k --batch 1,16 --steps 30 \
        --router-skew $sk $flag >"$OUT/cache-$sk-${b%\%}.txt" 2>&1
      echo "== decode $M q4_k skew $sk budget $b rc=$?"; grep -E '^ +(1|16) ' "$OUT/cache-$sk-${b%\%}.txt"
      grep -E 'weight budget' "$OUT/cache-$sk-${b%\%}.txt"
    done
  done
fi
# The expert prefetch: off against on, per "skew:budget:accuracy" case.
if has prefetch; then
  if [ -z "${PREFETCH_NO_TESTS:-}" ]; then
    .moe/tests/cuda_quant --include-ignored --test-threads=1 expert_cache >"$OUT/cuda-cache.txt" 2>&1
    echo "== cuda_quant expert_cache rc=$?"; grep -E 'test result|panicked|assert' "$OUT/cuda-cache.txt" | head -6
    .moe/tests/offload_exec --include-ignored --test-threads=1 >"$OUT/offload-exec.txt" 2>&1
    echo "== offload_exec rc=$?"; grep -E 'test result|panicked|FAILED' "$OUT/offload-exec.txt" | head -6
  fi
  M=dummy:qwen3-30b-a3b
  prev=""
  for c in ${PREFETCH_CASES:-0.8:50%:1 0.8:50%:0.8 0.8:50%:0.5}; do
    IFS=: read -r sk b acc <<<"$c"
    if [ "$sk:$b" != "$prev" ]; then
      $E bench decode --device cuda --model $M --quantization q4_k \
        --batch 1,16 --steps 30 --router-skew $sk --weight-budget $b \
        >"$OUT/prefetch-$sk-${b%\%}-off.txt" 2>&1
      echo "== decode $M q4_k skew $sk budget $b prefetch off rc=$?"
      grep -E '^ +(1|16) |expert cache' "$OUT/prefetch-$sk-${b%\%}-off.txt"
      prev="$sk:$b"
    fi
    $E bench decode --device cuda --model $M --quantization q4_k --batch 1,16 --steps 30 \
      --router-skew $sk --weight-budget $b --expert-prefetch --prefetch-accuracy $acc \
      >"$OUT/prefetch-$sk-${b%\%}-$acc.txt" 2>&1
    echo "== decode $M q4_k skew $sk budget $b prefetch accuracy $acc rc=$?"
    grep -E '^ +(1|16) |expert cache' "$OUT/prefetch-$sk-${b%\%}-$acc.txt"
  done
fi
if has write || has gguf || has peer; then
  mkdir -p $G
  for t in ${GGUF_TYPES:-q4_k_m q8_0}; do
    [ -f $G/30b-$t.gguf ] || .moe/dummy_gguf qwen3-30b-a3b $t $G/30b-$t.gguf >"$OUT/gguf-$t.txt" 2>&1
    echo "== gguf $t: $(tail -1 "$OUT/gguf-$t.txt")"
  done
fi
if has gguf; then
  for t in ${GGUF_TYPES:-q4_k_m q8_0}; do
    $E info --device cuda --no-self-check --model $G/30b-$t.gguf | grep -E '^(model|  )'
    $E bench decode --device cuda --model $G/30b-$t.gguf --batch 1,8,64 --steps 30 \
      >"$OUT/decode-gguf-$t.txt" 2>&1
    echo "== decode gguf $t rc=$?"; tail -5 "$OUT/decode-gguf-$t.txt"
    $E bench prefill --device cuda --model $G/30b-$t.gguf --tokens 512,2048 \
      >"$OUT/prefill-gguf-$t.txt" 2>&1
    echo "== prefill gguf $t rc=$?"; tail -3 "$OUT/prefill-gguf-$t.txt"
  done
fi
if has peerbuild; then
  wait $bp && echo "== llama-bench built: $($L/build/bin/llama-bench --help >/dev/null 2>&1 && echo ok)"
fi
if has peer && build_peer "$OUT"; then
  for t in ${GGUF_TYPES:-q4_k_m q8_0}; do
    $L/build/bin/llama-bench -m $G/30b-$t.gguf -fa 1 -ngl 99 -p 512,2048 -n 128 -r 3 \
      >"$OUT/llama-bench-$t.txt" 2>&1
    echo "== llama-bench $t"; tail -6 "$OUT/llama-bench-$t.txt"
  done
fi
