# Sourced by the speculative-decoding GPU scripts (gpu-spec*.sh, gpu-eagle.sh): the
# repository root, the CUDA libraries and kernel cache, $OUT, the bundle .gpu/spec.tar.xz
# unpacked into .spec, and the device's name printed; then the prompt they generate from
# ($P) and `spec_gen`.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ENCORE_CACHE_DIR=/tmp/encore-cache
OUT=${OUT:-$(mktemp -d)}; mkdir -p "$OUT" .spec
tar -xJf .gpu/spec.tar.xz -C .spec || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
P=$(printf 'one two three four five six seven eight %.0s' $(seq 1 12))
# spec_gen NAME MODEL FLAGS...: 128 tokens of dummy:MODEL from $P into $OUT/NAME.txt, and
# its summary lines.
spec_gen() {
  local name=$1 m=$2; shift 2
  .spec/encore generate --device cuda --model dummy:$m --prompt "$P" --max-tokens 128 \
    --ignore-eos --capture-all "$@" >"$OUT/$name.txt" 2>&1
  echo "== $name rc=$?"; grep -E "summary|speculative decoding|drafting|rror" "$OUT/$name.txt"
}
