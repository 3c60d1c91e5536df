#!/usr/bin/env bash
# A/B of two encore binaries on the GPU machine, for a change that must not move
# performance (issue #19's restructure): .bin/encore-base (the commit before) and
# .bin/encore (this one) run the same benches alternately in one lease, base first, so
# run-to-run noise shows as the spread between the two base runs. Benches: `bench decode`
# on the 0.5B / 1B / 8B shapes at batch 1, 64, 256 (two rounds), `bench prefill` on the 1B
# and 8B shapes, `bench serve --in-process` (1B shape, 500 requests). JSON lines go to $OUT;
# a table of medians is printed last.
#   usage: bash scripts/gpu-ab.sh [rounds, default 2] [parts, default decode,prefill,serve]
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-$(mktemp -d)}; mkdir -p "$OUT"
rounds=${1:-2}
parts=${2:-decode,prefill,serve}
has() { [[ ",$parts," == *",$1,"* ]]; }
export ENCORE_CACHE_DIR=$(mktemp -d)
for bin in .bin/encore-base .bin/encore; do
  [ -x "$bin" ] || { echo "missing $bin (scripts/build-gpu.sh, then copy the base binary)"; exit 1; }
done
ab() { # tag, args...: one run of each binary, JSON lines appended to $OUT/<tag>-<which>.jsonl
  local tag=$1; shift
  for which in base new; do
    local bin=.bin/encore; [ $which = base ] && bin=.bin/encore-base
    "$bin" "$@" --json 2>>"$OUT/$tag-$which.err" >>"$OUT/$tag-$which.jsonl" \
      || { echo "FAIL: $which $tag"; tail -5 "$OUT/$tag-$which.err"; }
  done
}
for r in $(seq "$rounds"); do
  has decode || break
  for m in qwen2.5-0.5b llama-3.2-1b llama-3-8b; do
    echo "== round $r decode $m"
    ab "decode-$m" bench decode --device cuda --model "dummy:$m" --batch 1,64,256
  done
done
for m in llama-3.2-1b llama-3-8b; do
  has prefill || break
  echo "== prefill $m"
  ab "prefill-$m" bench prefill --device cuda --model "dummy:$m" --tokens 512,2048 --batch 1
done
has serve && echo "== serve in-process llama-3.2-1b" &&
ab "serve-llama-3.2-1b" bench serve --in-process --device cuda --model dummy:llama-3.2-1b \
  --input-len 128:1024 --output-len 64:512 --max-num-seqs 256 --max-num-batched-tokens 2048 \
  --num-prompts 500
python3 - "$OUT" <<'PY'
import glob, json, os, statistics, sys
out = sys.argv[1]
def rows(path):
    try:
        return [json.loads(l) for l in open(path) if l.startswith("{")]
    except FileNotFoundError:
        return []
print(f"{'bench':<34} {'key':<16} {'base runs':<22} {'new runs':<22} new/base")
for f in sorted(glob.glob(f"{out}/*-base.jsonl")):
    tag = os.path.basename(f)[:-len("-base.jsonl")]
    base, new = rows(f), rows(f"{out}/{tag}-new.jsonl")
    def series(rs):
        acc = {}
        for r in rs:
            if "graph_step_ms" in r:
                acc.setdefault(f"b{r['batch']} graph ms", []).append(r["graph_step_ms"])
            elif "prefill_ms" in r or "ms" in r and "tokens" in r:
                k = f"{r.get('tokens')}x{r.get('batch', 1)} ms"
                acc.setdefault(k, []).append(r.get("prefill_ms", r.get("ms")))
            elif "output_throughput" in r:
                acc.setdefault("output tok/s", []).append(r["output_throughput"])
        return acc
    sb, sn = series(base), series(new)
    for k in sb:
        b, n = sb[k], sn.get(k, [])
        ratio = statistics.median(n) / statistics.median(b) if n and b else float("nan")
        fmt = lambda xs: ", ".join(f"{x:.3f}" if x < 100 else f"{x:.0f}" for x in xs)
        print(f"{tag:<34} {k:<16} {fmt(b):<22} {fmt(n):<22} {ratio:.3f}")
PY
