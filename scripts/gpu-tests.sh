#!/usr/bin/env bash
# The GPU tests of a build carried as .gpu/gpu.tar.xz (encore, encore-base and test
# binaries, made on the build machine): `encore info` (every CUDA kernel against the CPU,
# graph replay against eager), the HF reference logits for hf_parity, then every carried
# test binary with --include-ignored. Logs go to one tarball in $OUT; a table is printed.
# ONLY="cuda hf_parity ..." runs only those test binaries (and `encore info` and the HF
# reference only when ONLY names `info` / `hf_parity`), for a suite split over calls (the
# whole suite runs past one call's 600 s). Each command runs under `timeout` (LIMIT
# seconds, default 240) and its log is written straight under $OUT/gpu-tests, so a call
# cut short still brings back what ran. SKIP="name ..." passes `--skip name` to every
# test binary (e.g. SKIP="gpt_oss windowed_attention_over_long": the CPU references that
# take minutes).
#   usage: [ONLY="..."] [SKIP="..."] [LIMIT=240] bash scripts/gpu-tests.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ENCORE_CACHE_DIR=${ENCORE_CACHE_DIR:-/tmp/encore-cache}
OUT=${OUT:-$(mktemp -d)}
logs=$OUT/gpu-tests
mkdir -p "$logs"
mkdir -p .bin && tar -xJf .gpu/gpu.tar.xz -C .bin || exit 1
nvidia-smi -L
rows=()
run() { # name, command...
  local name=$1; shift
  local t0=$EPOCHREALTIME
  timeout "${LIMIT:-240}" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  local dt; dt=$(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $t0}")
  local res; res=$(grep -E '^test result' "$logs/$name.log" | tail -1 | cut -c1-60)
  # Cut short by the limit: how many tests had passed, and the ones still running.
  [ $rc -eq 124 ] && res="timed out after ${LIMIT:-240} s, $(grep -c ' ok$' "$logs/$name.log") passed; running: $(grep -oE '^test [^ ]+ has been running' "$logs/$name.log" | cut -d' ' -f2 | tr '\n' ' ')"
  rows+=("$(printf '%-24s rc=%-3s %7ss %s' "$name" "$rc" "$dt" "$res")")
  echo "${rows[-1]}"  # as it goes, for a run cut short by its time limit
  [ $rc -eq 0 ] || grep -E 'FAILED|panicked|error' "$logs/$name.log" | head -8
}
want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
want info && run info .bin/encore info --device cuda --seed 1
export ENCORE_HF_REF=$(mktemp -d)
want hf_parity && run hf-reference env PYTHONUNBUFFERED=1 python3 scripts/hf_reference.py "$ENCORE_HF_REF"
# The tests that need two GPUs (named `..._two_gpus...`) are skipped on one.
skip=()
[ "$(nvidia-smi -L | wc -l)" -ge 2 ] || skip=(--skip two_gpus)
for name in ${SKIP:-}; do skip+=(--skip "$name"); done
for t in .bin/tests/*; do
  want "$(basename "$t")" || continue
  run "test-$(basename "$t")" "$t" --include-ignored --test-threads=4 "${skip[@]}"
done
[ -f "$logs/info.log" ] && grep -E "^(kernels|self-check|check)" "$logs/info.log" | head -5
printf '%s\n' "${rows[@]}"
