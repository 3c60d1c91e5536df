#!/usr/bin/env bash
# Quantized weights on the GPU (issue #20), from a build carried as .gpu/gpu.tar.xz:
# the decode-step matrix (8B shape, bf16 / fp8 / q8_0 / q4_k in situ, each beside its own
# weight floor), prefill at 512 and 2,048 tokens, device memory, and, with
# .gpu/llama.cpp-src.tar.xz carried, the llama.cpp peer (llama-bench -fa 1) on a Q4_K_M and
# a Q8_0 8B-shaped GGUF written by the dummy_gguf example, with encore on the same files.
# `tests` runs the quantized GPU tests (cuda_quant, quantized) first; `gemm` times the
# quantized GEMM paths other than the default (`decode`/`prefill` run ENCORE_QUANT_GEMM=auto)
# on the 8B shape: prefill 512 / 2,048 tokens and decode batches 16 / 64 / 256, for
# GEMM_FORMATS (default q4_k) in GEMM_MODES (default dequant; also mma). DECODE_FORMATS,
# BATCHES and PREFILL_FORMATS narrow `decode` and `prefill`.
# `peerbuild` builds the peer while the GGUF files are written (a call of its own).
#   usage: OUT=... bash scripts/gpu-quant.sh [tests,gemm,decode,prefill,gguf,peerbuild,peer]
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ENCORE_CACHE_DIR=${ENCORE_CACHE_DIR:-/tmp/encore-cache}
OUT=${OUT:-$(mktemp -d)}
parts=${1:-decode,prefill,gguf,peer}
logs=$OUT/quant-logs
mkdir -p "$logs" .bin
tar -xJf .gpu/gpu.tar.xz -C .bin || exit 1  # always: a warm machine keeps an older .bin
E=.bin/encore
M=dummy:llama-3-8b
has() { [[ ",$parts," == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
if has tests; then
  for t in cuda_quant quantized; do
    [ -x .bin/tests/$t ] || continue
    .bin/tests/$t --include-ignored --test-threads=1 >"$logs/test-$t.txt" 2>&1
    echo "== test $t rc=$?"; grep -E '^test result|FAILED|panicked' "$logs/test-$t.txt" | head -8
  done
fi
if has gemm; then
  q=${GEMM_FORMATS:-q4_k}
  for q in ${q//,/ }; do
    for g in ${GEMM_MODES:-dequant}; do
      ENCORE_QUANT_GEMM=$g $E bench prefill --device cuda --model $M --quantization $q \
        --tokens 512,2048 >"$logs/gemm-prefill-$q-$g.txt" 2>&1
      echo "== prefill $q $g"; tail -2 "$logs/gemm-prefill-$q-$g.txt"
      ENCORE_QUANT_GEMM=$g $E bench decode --device cuda --model $M --quantization $q \
        --batch 16,64,256 --steps 30 >"$logs/gemm-decode-$q-$g.txt" 2>&1
      echo "== decode $q $g"; tail -3 "$logs/gemm-decode-$q-$g.txt"
    done
  done
fi
if has decode; then
  for q in ${DECODE_FORMATS:-none fp8 q8_0 q4_k}; do
    $E bench decode --device cuda --model $M --quantization $q --batch ${BATCHES:-1,8,16,64,256} \
      --steps 30 >"$logs/decode-$q.txt" 2>&1
    echo "== decode $q"; grep -vE '^\s*$' "$logs/decode-$q.txt" | tail -6
  done
fi
if has prefill; then
  for q in ${PREFILL_FORMATS:-none fp8 q8_0 q4_k}; do
    $E bench prefill --device cuda --model $M --quantization $q --tokens 512,2048 \
      >"$logs/prefill-$q.txt" 2>&1
    echo "== prefill $q"; tail -4 "$logs/prefill-$q.txt"
  done
fi
G=/tmp/gguf
# The peer's build alone (`peerbuild`, about 5 minutes on 16 cores), so that a lease can
# build it while the GGUF files are written, then bench both in the next call.
source scripts/llama-peer.sh
if has peerbuild; then
  build_peer "$logs" & bp=$!
fi
if has gguf || has peer || has peerbuild; then
  mkdir -p $G
  for t in q4_k_m q8_0; do
    [ -f $G/8b-$t.gguf ] || .bin/dummy_gguf llama-3-8b $t $G/8b-$t.gguf >"$logs/gguf-$t.txt" 2>&1
  done
fi
if has gguf; then
  for t in q4_k_m q8_0; do
    $E info --device cuda --no-self-check --model $G/8b-$t.gguf | grep -E '^(model|  weights)'
    $E bench decode --device cuda --model $G/8b-$t.gguf --batch 1,64 --steps 30 \
      >"$logs/decode-gguf-$t.txt" 2>&1
    echo "== decode gguf $t"; tail -4 "$logs/decode-gguf-$t.txt"
    $E bench prefill --device cuda --model $G/8b-$t.gguf --tokens 512,2048 \
      >"$logs/prefill-gguf-$t.txt" 2>&1
    echo "== prefill gguf $t"; tail -3 "$logs/prefill-gguf-$t.txt"
  done
fi
if has peerbuild; then
  wait $bp && echo "== llama-bench built: $($L/build/bin/llama-bench --help >/dev/null 2>&1 && echo ok)"
fi
if has peer && build_peer "$logs"; then
  for t in q4_k_m q8_0; do
    $L/build/bin/llama-bench -m $G/8b-$t.gguf -fa 1 -ngl 99 -p 512,2048 -n 128 -r 3 \
      >"$logs/llama-bench-$t.txt" 2>&1
    echo "== llama-bench $t"; tail -6 "$logs/llama-bench-$t.txt"
  done
fi
tar -czf "$OUT/quant-logs.tgz" -C "$logs" . && rm -rf "$logs"
