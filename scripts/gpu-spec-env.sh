# Sourced by the speculative-decoding GPU scripts (gpu-spec*.sh): the repository root, the
# CUDA libraries and kernel cache, $OUT, the bundle .gpu/spec.tar.xz unpacked into .spec,
# and the device's name printed.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ENCORE_CACHE_DIR=/tmp/encore-cache
OUT=${OUT:-$(mktemp -d)}; mkdir -p "$OUT" .spec
tar -xJf .gpu/spec.tar.xz -C .spec || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
