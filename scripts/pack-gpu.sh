#!/usr/bin/env bash
# Build, on the build machine, what scripts/gpu-tests.sh and scripts/gpu-ab.sh run on the
# GPU machine, packed small enough to carry (64 MiB a call): the release `encore`, the
# release test binaries that hold GPU tests, and a base binary for the A/B
# (ENCORE_BASE_BIN, optional), stripped, in .gpu/gpu.tar.xz (git-ignored). Carry `.gpu`.
# The dummy_gguf example goes too (scripts/gpu-quant.sh writes GGUF files with it); other
# files in .gpu (the llama.cpp sources gpu-quant.sh builds the peer from) stay.
#   usage: ENCORE_BASE_BIN=path/to/old/encore bash scripts/pack-gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
stage=$(mktemp -d)
mkdir -p "$stage/tests"
cargo build --release -p encore
cargo build --release -p encore-core --example dummy_gguf
cp target/release/encore "$stage/encore"
cp target/release/examples/dummy_gguf "$stage/dummy_gguf"
[ -n "${ENCORE_BASE_BIN:-}" ] && cp "$ENCORE_BASE_BIN" "$stage/encore-base"
cargo test --release -p encore-core -p encore-backend --no-run --message-format=json \
  --test cuda --test graph --test graph_memory --test hf_parity --test offload_exec \
  --test piecewise --test scheduler --test eagle --test capture --test engine --test model --test quantized --test cuda_quant --test cuda_mlp --test tensor_parallel --test loader --lib 2>/dev/null \
  | python3 scripts/copy_test_bins.py "$stage/tests"
strip "$stage"/encore* "$stage"/dummy_gguf "$stage"/tests/*
mkdir -p .gpu && rm -f .gpu/gpu.tar.xz
tar -cJf .gpu/gpu.tar.xz -C "$stage" .
rm -rf "$stage"
ls -la .gpu/gpu.tar.xz
