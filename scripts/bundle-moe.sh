#!/usr/bin/env bash
# Build the release binaries the MoE GPU scripts run (scripts/gpu-moe.sh) and pack them
# into .gpu/moe.tar.xz: encore, the dummy_gguf example and the cuda, cuda_quant, hf_parity
# and offload_exec test binaries, stripped.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
cargo build --release --example dummy_gguf
d=$(mktemp -d); mkdir -p "$d/tests" .gpu
cp target/release/encore target/release/examples/dummy_gguf "$d/"
cargo test --release --no-run 2>&1 | grep -oE 'target/release/deps/(cuda|cuda_quant|hf_parity|offload_exec)-[0-9a-f]+' |
  while read -r t; do b=${t##*/}; cp "$t" "$d/tests/${b%-*}"; done
strip "$d/encore" "$d/dummy_gguf" "$d"/tests/*
tar -cJf .gpu/moe.tar.xz -C "$d" .
rm -rf "$d"
ls -la .gpu/moe.tar.xz
