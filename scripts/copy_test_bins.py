"""Copy the test executables named in `cargo test --no-run --message-format=json` output
(standard input) into DEST, one file per test target (`<name>`, `<crate>-lib` for unit
tests). Used by scripts/build-gpu.sh and scripts/pack-gpu.sh.

    usage: cargo test --no-run --message-format=json ... | python3 scripts/copy_test_bins.py DEST
"""
import json
import os
import shutil
import sys

dest = sys.argv[1]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    exe = m.get("executable")
    if m.get("reason") == "compiler-artifact" and exe and m.get("profile", {}).get("test"):
        name = m["target"]["name"] + ("-lib" if m["target"]["kind"] == ["lib"] else "")
        shutil.copy(exe, os.path.join(dest, name))
        print("test binary:", name)
