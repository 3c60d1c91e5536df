#!/usr/bin/env bash
# The decode gemv's weight streaming under tuning knobs, on the GPU machine (device tool,
# carrying .gpu/k.tar.xz: a stripped release `encore`, or TARBALL): `encore bench kernels
# --only copy,gemv` per variant (GB/s of each Llama-3-8B and 70B-rank projection beside the
# copy rate), then a decode A/B of the variants at 8B on one GPU (scripts/gpu-tp-ab.sh).
#   VARIANTS="base ENCORE_GEMV_CTAS_PER_SM=2 ENCORE_KERNEL_DEFINES=GEMV_UNROLL=8" \
#   bash scripts/gpu-gemv-exp.sh
set -u
cd "$(dirname "$0")/.."
tarball=${TARBALL:-.gpu/k.tar.xz}
variants=${VARIANTS:-base ENCORE_GEMV_CTAS_PER_SM=2 ENCORE_GEMV_CTAS_PER_SM=4}
mkdir -p .bin && tar -xJf "$tarball" -C .bin
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 ENCORE_CACHE_DIR=/tmp/encore-cache
nvidia-smi -L | head -1
for v in $variants; do
  echo "== $v"
  if [ "$v" = base ]; then e=(); else e=("$v"); fi
  env "${e[@]}" .bin/encore bench kernels --device cuda --only copy,gemv | tail -9 | cut -c1-110
done
TARBALL=$tarball VARIANTS="$variants" TPS=1 ROUNDS=${ROUNDS:-2} BATCHES=1 \
  bash scripts/gpu-tp-ab.sh 2>&1 | grep decode-
