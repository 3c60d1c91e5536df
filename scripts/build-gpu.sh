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
  | python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    exe = m.get("executable")
    if m.get("reason") == "compiler-artifact" and exe and m.get("profile", {}).get("test"):
        name = m["target"]["name"] + ("-lib" if m["target"]["kind"] == ["lib"] else "")
        shutil.copy(exe, os.path.join(".bin/tests", name))
        print("test binary:", name)
'
strip .bin/encore .bin/tests/* 2>/dev/null || true
du -sh .bin
