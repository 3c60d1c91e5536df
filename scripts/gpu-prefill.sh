#!/usr/bin/env bash
# Piecewise prefill graphs on the GPU (run after scripts/build-gpu.sh, like gpu-check.sh):
# the graph tests (piecewise and decode replay against eager, graph memory over decode and
# token buckets), the CUDA prefill-attention tests, then `encore bench prefill` (eager and
# piecewise in one process, all token buckets captured at start-up) against transformers
# eager prefill (scripts/hf_prefill_bench.py) on the 0.5B, 1B and 8B shapes, and the
# start-up capture of every decode bucket (bench decode --capture-all). Logs go to $OUT;
# a short table is printed last.
#   usage: bash scripts/gpu-prefill.sh [--no-tests] [--models a,b] [--no-hf]
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-$(mktemp -d)}
ENCORE_CACHE_DIR=$(mktemp -d)
export ENCORE_CACHE_DIR
tests=1; hf=1; models=qwen2.5-0.5b,llama-3.2-1b,llama-3-8b
while [ $# -gt 0 ]; do
  case $1 in
    --no-tests) tests=0 ;; --no-hf) hf=0 ;; --models) models=$2; shift ;;
  esac
  shift
done
TOKENS=16,128,512,2048
if [ $tests = 1 ]; then
  for t in piecewise graph graph_memory; do
    .bin/tests/$t --include-ignored --test-threads=2 2>&1 | tee "$OUT/test-$t.log" \
      | grep -E "^test .*(FAILED|ignored)|test result|panicked"
  done
  .bin/tests/cuda --include-ignored --test-threads=1 prefill_attention capture_replay 2>&1 \
    | tee "$OUT/test-cuda.log" | grep -E "test result|panicked"
  .bin/tests/model --include-ignored 2>&1 | tee "$OUT/test-model.log" | grep -E "test result|panicked"
fi
: >"$OUT/encore-prefill.jsonl"
for m in ${models//,/ }; do
  echo "== encore $m"
  .bin/encore bench prefill --device cuda --model "dummy:$m" --tokens $TOKENS --batch 1,4 \
    --repeats 7 --json 2>"$OUT/encore-$m.err" | tee -a "$OUT/encore-prefill.jsonl"
  echo "== encore $m decode capture-all"
  .bin/encore bench decode --device cuda --model "dummy:$m" --batch 1,256 --capture-all --json \
    2>>"$OUT/encore-$m.err" | tee -a "$OUT/encore-decode.jsonl" | head -3
done
if [[ ",$models," == *",llama-3.2-1b,"* ]]; then
  # Graph memory of every decode bucket (vLLM's sizes to 256) and token bucket (SGLang's
  # to 2048) in one arena, and the device memory the captures took.
  .bin/encore bench capture --device cuda --model dummy:llama-3.2-1b --strategies arena,private \
    --order shuffled --json 2>>"$OUT/capture.err" | tee "$OUT/capture.jsonl" | cut -c1-400
  # A mixed batch in generate (prompts of 2100, 3 and 12 tokens) against bench decode at
  # the same batch and the longest context.
  long=$(python3 -c "print('a' * 2100)")
  .bin/encore generate --device cuda --model dummy:llama-3.2-1b --prompt "$long" --prompt abc \
    --prompt "twelve chars" --max-tokens 200 --ignore-eos --capture-all --json \
    2>"$OUT/mixed.err" >"$OUT/mixed-generate.jsonl"
  .bin/encore bench decode --device cuda --model dummy:llama-3.2-1b --batch 3 --context 2048 \
    --json 2>>"$OUT/mixed.err" >"$OUT/mixed-decode.jsonl"
  .bin/encore bench decode --device cuda --model dummy:llama-3.2-1b --batch 3 --context 128 \
    --json 2>>"$OUT/mixed.err" >>"$OUT/mixed-decode.jsonl"
fi
if [ $hf = 1 ]; then
  echo "== transformers"
  python3 scripts/hf_prefill_bench.py --models "$models" --tokens $TOKENS --batch 1,4 \
    --repeats 10 --json 2>"$OUT/hf.err" | tee "$OUT/hf-prefill.jsonl"
fi
python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
def lines(p):
    if not os.path.exists(p): return []
    r = []
    for l in open(p):
        try: r.append(json.loads(l))
        except ValueError: pass
    return r
enc = [r for r in lines(f"{out}/encore-prefill.jsonl") if "tokens" in r]
hdr = [r for r in lines(f"{out}/encore-prefill.jsonl") if "capture_s" in r]
hf = {(r["model"], r["tokens"], r["batch"]): r for r in lines(f"{out}/hf-prefill.jsonl")}
for h in hdr:
    print(f"{h['model']}: {h['captured']} token buckets ({h['pieces']} pieces) captured in {h['capture_s']:.2f} s, graph memory {h['graph_memory_physical_bytes']/2**20:.0f} MiB")
print(f"{'model':<22}{'tok':>5}{'b':>3}{'bucket':>7}{'eager':>8}{'piece':>8}{'cold':>8}{'hf':>8}{'hf/pc':>7}{'match':>6}")
for r in enc:
    m = r["model"].removeprefix("dummy:")
    h = hf.get((m, r["tokens"], r["batch"]))
    hfm = h["prefill_ms"] if h else float("nan")
    pc = r["piecewise_ms"] if r["piecewise_ms"] is not None else r["eager_ms"]
    print(f"{m:<22}{r['tokens']:>5}{r['batch']:>3}{str(r['bucket']):>7}{r['eager_ms']:>8.2f}{pc:>8.2f}{r['cold_ms']:>8.2f}{hfm:>8.2f}{hfm/pc:>7.2f}{str(r['matches_eager']):>6}")
for c in lines(f"{out}/capture.jsonl"):
    print(f"capture 1B {c['strategy']}: {len(c['buckets'])} decode + {len(c['token_buckets'])} token buckets, {c['pieces']} graphs, physical {c['physical_bytes']/2**20:.0f} MiB (largest need {c['largest_bucket_bytes']/2**20:.0f} MiB, sum {c['sum_bucket_bytes']/2**20:.0f} MiB), device {(c['device_bytes'] or 0)/2**20:.0f} MiB, {c['total_seconds']:.2f} s")
gen = lines(f"{out}/mixed-generate.jsonl")
dec = [r for r in lines(f"{out}/mixed-decode.jsonl") if "graph_step_ms" in r]
if gen:
    g = gen[0]
    step = g["decode_ms"] / max(1, len(g["output_ids"]) - 1)
    print(f"generate 1B, prompts of {[len(x['prompt_ids']) for x in gen]} tokens: prefill {g['prefill_ms']:.1f} ms, decode {step:.3f} ms/step")
    for d in dec:
        print(f"bench decode 1B batch {d['batch']} context {d['context']}: graph {d['graph_step_ms']:.3f} ms/step (generate / bench = {step / d['graph_step_ms']:.2f})")
PY
