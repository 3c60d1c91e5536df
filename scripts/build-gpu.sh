#!/usr/bin/env bash
# Build, on the build machine (no GPU needed), everything the GPU machine runs: the release
# `encore` binary and the release test binaries. They land in .bin/ (git-ignored), which
# the device call carries. Then on the GPU machine: `bash scripts/gpu-check.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .bin && mkdir -p .bin/tests
cargo build --release -p encore
cp target/release/encore .bin/
# Test executables, by name (cargo prints one JSON line per built artifact).
cargo test --release --workspace --no-run --message-format=json 2>/dev/null \
  | python3 scripts/copy_test_bins.py .bin/tests
strip .bin/encore .bin/tests/* 2>/dev/null || true
du -sh .bin
