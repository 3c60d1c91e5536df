#!/usr/bin/env bash
# The end-of-session quantized-weight check on the GPU (issue #20), from .gpu/gpu.tar.xz:
# the quantized GPU tests, compute-sanitizer memcheck of the small quantized-matmul tests
# (gemv, tensor-core kernel, fused gate/up, capture/replay), and the 8B decode step at the
# batches the routing changes at (Q4_K 1..256, Q8_0 4 and 8).
#   usage: OUT=... bash scripts/gpu-quant-final.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ENCORE_CACHE_DIR=${ENCORE_CACHE_DIR:-/tmp/encore-cache}
OUT=${OUT:-$(mktemp -d)}
logs=$OUT/final-logs
mkdir -p "$logs" .bin
tar -xJf .gpu/gpu.tar.xz -C .bin || exit 1  # always: a warm machine keeps an older .bin
E=.bin/encore
M=dummy:llama-3-8b
for t in cuda_quant quantized; do
  .bin/tests/$t --include-ignored --test-threads=1 >"$logs/test-$t.txt" 2>&1
  echo "== test $t rc=$?"; grep -E '^test result|FAILED|panicked' "$logs/test-$t.txt" | head -8
done
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 150 $SAN --tool memcheck --leak-check no .bin/tests/cuda_quant --include-ignored \
  --test-threads=1 --exact quantized_matmuls_capture_and_replay \
  quantized_matmul_silu_mul_matches_cpu misaligned_x_still_matches_cpu \
  >"$logs/memcheck.txt" 2>&1
echo "== memcheck rc=$?"; grep -E 'ERROR SUMMARY|^test result' "$logs/memcheck.txt" | head -4
$E bench decode --device cuda --model $M --quantization q4_k --batch 1,2,4,8,16,64,128,256 \
  --steps 30 >"$logs/decode-q4_k.txt" 2>&1
echo "== decode q4_k"; tail -9 "$logs/decode-q4_k.txt"
$E bench decode --device cuda --model $M --quantization q8_0 --batch 4,8 --steps 30 \
  >"$logs/decode-q8_0.txt" 2>&1
echo "== decode q8_0"; tail -3 "$logs/decode-q8_0.txt"
tar -czf "$OUT/final-logs.tgz" -C "$logs" . && rm -rf "$logs"
