#!/usr/bin/env bash
# The MLP's activation fused into the down projection's FP8 operand (Backend::mlp) on the
# GPU, with `encore` carried as .gpu/encore.xz, the build before it as .gpu/encore-old.xz
# and test binaries as .gpu/exp/<name>.xz (stripped, made on the build machine):
#   tests    every carried test binary with --include-ignored (TESTS: names, each
#            with an optional :FILTER, e.g. "cuda_mlp loader:packed");
#   info     `encore info` (every CUDA kernel against the CPU, graph replay against eager);
#   prefill  the 8B FP8 prefill step (4 x 2048 tokens, FP8 KV, eager), each of RUNS (a binary,
#            optionally :VAR=VALUE for its environment; default the old and the new binary)
#            in turn, ROUNDS times;
#   decode   the 8B FP8 decode step at batch 1024 over 1,536 cached FP8 tokens (graphs), the
#            same alternation.
# Logs go to $OUT.
#   usage: [TESTS="cuda_mlp loader:packed"] [ROUNDS=2] [RUNS="encore-old encore:ENCORE_GEMM_TUNE=0 encore"] bash scripts/gpu-fused-mlp.sh tests,info,prefill,decode
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ENCORE_CACHE_DIR=${ENCORE_CACHE_DIR:-/tmp/encore-cache}
OUT=${OUT:-$(mktemp -d)}
parts=${1:-tests,info,prefill}
ROUNDS=${ROUNDS:-2}
RUNS=${RUNS:-encore-old encore}
# run BIN[:VAR=VALUE] ARGS...: the binary with that environment.
run_bin() {
  local spec=$1; shift
  local b=${spec%%:*} e=${spec#*:}
  [ "$e" = "$spec" ] && e=
  env ${e:+$e} ".bin/$b" "$@"
}
has() { [[ ",$parts," == *",$1,"* ]]; }
mkdir -p .bin
for b in encore encore-old; do
  [ -f ".gpu/$b.xz" ] && xz -dc ".gpu/$b.xz" > ".bin/$b" && chmod +x ".bin/$b"
done
nvidia-smi -L
if has tests; then
  for tf in ${TESTS:-$(ls .gpu/exp/ | sed 's/\.xz$//')}; do
    t=${tf%%:*}; f=${tf#*:}; [ "$f" = "$tf" ] && f=
    xz -dc ".gpu/exp/$t.xz" > ".bin/$t" && chmod +x ".bin/$t"
    # The encore-core tests read their fixtures relative to the crate.
    dir=crates/encore-backend
    [ -d "crates/encore-core/tests/$t" ] || [ -f "crates/encore-core/tests/$t.rs" ] && dir=crates/encore-core
    (cd $dir && "$OLDPWD/.bin/$t" --include-ignored $f --test-threads=1) > "$OUT/test-$t.log" 2>&1
    echo "test $t rc=$? $(grep -E '^test result' "$OUT/test-$t.log" | tail -1)"
    grep -E "FAILED|panicked" "$OUT/test-$t.log" | head -6
  done
fi
if has info; then
  .bin/encore info --device cuda --seed 1 > "$OUT/info.log" 2>&1
  echo "info rc=$? $(grep -E 'passed|failed' "$OUT/info.log" | tail -2 | tr '\n' ' ')"
  grep -E "FAIL" "$OUT/info.log" | head -8
fi
if has prefill; then
  for r in $(seq "$ROUNDS"); do
    for b in $RUNS; do
      run_bin "$b" bench prefill --device cuda --model dummy:llama-3-8b --quantization fp8 \
        --kv-cache-dtype fp8 --tokens 2048 --batch 4 --prefill-buckets none --repeats 5 \
        --json 2>>"$OUT/prefill.err" | sed "s/^{/{\"bin\":\"$b\",/" | tee -a "$OUT/prefill.jsonl" \
        | tail -1 | grep -oE '"bin":"[^"]*"|"eager_ms":[0-9.]*' | tr '\n' ' '; echo
    done
  done
fi
if has decode; then
  for r in $(seq "$ROUNDS"); do
    for b in $RUNS; do
      run_bin "$b" bench decode --device cuda --model dummy:llama-3-8b --quantization fp8 \
        --kv-cache-dtype fp8 --batch 1024 --context 1536 --steps 10 --json \
        2>>"$OUT/decode.err" | sed "s/^{/{\"bin\":\"$b\",/" | tee -a "$OUT/decode.jsonl" \
        | tail -1 | grep -oE '"bin":"[^"]*"|"[a-z_]*step_ms":[0-9.]*' | tr '\n' ' '; echo
    done
  done
fi
