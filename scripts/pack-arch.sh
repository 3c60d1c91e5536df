#!/usr/bin/env bash
# Build, on the build machine, what scripts/gpu-arch.sh runs on the GPU machine: the
# release `encore` and the `cuda`, `hf_parity` and `cuda_quant` test binaries, stripped, in
# .gpu/final.tar.xz (git-ignored; carry `.gpu`).
#   usage: bash scripts/pack-arch.sh
set -euo pipefail
cd "$(dirname "$0")/.."
stage=$(mktemp -d)
mkdir -p "$stage/tests"
cargo build --release -p encore
cp target/release/encore "$stage/encore"
cargo test --release -p encore-core --no-run --message-format=json --test cuda --test hf_parity 2>/dev/null \
  | python3 scripts/copy_test_bins.py "$stage/tests"
cargo test --release -p encore-backend --no-run --message-format=json --test cuda_quant 2>/dev/null \
  | python3 scripts/copy_test_bins.py "$stage/tests"
strip "$stage/encore" "$stage"/tests/*
mkdir -p .gpu && rm -f .gpu/final.tar.xz
tar -cJf .gpu/final.tar.xz -C "$stage" .
rm -rf "$stage"
ls -la .gpu/final.tar.xz
