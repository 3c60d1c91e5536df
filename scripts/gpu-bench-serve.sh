#!/usr/bin/env bash
# The issue-#11 serving workload on the GPU (after scripts/build-gpu.sh): per model,
# `encore bench serve` with 1,000 requests (prompts 128-1,024 tokens, outputs 64-512) all
# at once (saturation), then 300 requests at 50% and 90% of the saturation request rate
# (TTFT), and `bench decode` at the batch the scheduler reached. By default the engine
# runs in the bench's process (`--in-process`); with `--http` the script starts
# `encore serve` (same engine flags) on loopback and loads it with `bench serve --url`, so
# the figures include HTTP, SSE and detokenization, measured at the client. JSON lines
# go to $OUT (files named with the mode); a summary is printed last.
#   usage: bash scripts/gpu-bench-serve.sh [--http] [models, default llama-3.2-1b,llama-3-8b]
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-$(mktemp -d)}
export ENCORE_CACHE_DIR=$(mktemp -d)
mode=in-process
if [ "${1:-}" = "--http" ]; then mode=http; shift; fi
models=${1:-llama-3.2-1b,llama-3-8b}
port=${ENCORE_BENCH_PORT:-8765}
engine=(--max-num-seqs 256 --max-num-batched-tokens 2048)
server=
stop_server() {
  if [ -n "$server" ]; then kill -INT "$server" 2>/dev/null; wait "$server" 2>/dev/null; server=; fi
}
trap stop_server EXIT
for m in ${models//,/ }; do
  tag="$mode-$m"
  if [ "$mode" = http ]; then
    .bin/encore serve --device cuda --model "dummy:$m" --port "$port" --max-seq-len 1536 \
      "${engine[@]}" 2>"$OUT/server-$m.err" &
    server=$!
    # Up when it prints its address (start-up captures every bucket first).
    for _ in $(seq 600); do
      grep -q "serving" "$OUT/server-$m.err" 2>/dev/null && break
      kill -0 "$server" 2>/dev/null || break
      sleep 1
    done
    if ! grep -q "serving" "$OUT/server-$m.err"; then
      echo "$m: encore serve did not start:"; tail -5 "$OUT/server-$m.err"; stop_server; continue
    fi
    common=(--url "http://127.0.0.1:$port" --input-len 128:1024 --output-len 64:512 --json)
  else
    common=(--in-process --device cuda --model "dummy:$m" --input-len 128:1024 --output-len 64:512
            "${engine[@]}" --json)
  fi
  .bin/encore bench serve "${common[@]}" --num-prompts 1000 2>"$OUT/serve-$tag.err" \
    | tee "$OUT/serve-$tag.jsonl" | cut -c1-300
  sat=$(python3 -c "import json; print(json.load(open('$OUT/serve-$tag.jsonl'))['request_throughput'])")
  # Fresh prompts per run (its own --seed): over HTTP the server's prefix cache still
  # holds the saturation run's prompts, and a repeat would measure cache hits.
  seed=1
  for f in 0.5 0.9; do
    r=$(python3 -c "print($sat * $f)")
    seed=$((seed + 1))
    .bin/encore bench serve "${common[@]}" --num-prompts 300 --request-rate "$r" --seed $seed \
      2>>"$OUT/serve-$tag.err" | tee -a "$OUT/serve-rate-$tag.jsonl" | cut -c1-200
  done
  stop_server
  b=$(python3 -c "import json; print(json.load(open('$OUT/serve-$tag.jsonl'))['max_running'])")
  .bin/encore bench decode --device cuda --model "dummy:$m" --batch "$b" --context 576 --json \
    2>>"$OUT/serve-$tag.err" | tee "$OUT/decode-$tag.jsonl" | cut -c1-200
done
python3 - "$OUT" "$models" "$mode" <<'PY'
import json, sys
out, models, mode = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
for m in models:
    tag = f"{mode}-{m}"
    try:
        s = json.load(open(f"{out}/serve-{tag}.jsonl"))
        d = [json.loads(l) for l in open(f"{out}/decode-{tag}.jsonl") if "graph_step_ms" in l][0]
    except Exception as e:
        print(m, "missing:", e); continue
    dec = d["batch"] * 1e3 / d["graph_step_ms"]
    print(f"{m} ({mode}): {s['failed']} failed, 1000 requests in {s['duration_s']:.1f} s, {s['output_throughput']:.0f} output tok/s "
          f"({s['total_token_throughput']:.0f} total), max running {s['max_running']}, {s['preemptions']} preemptions; "
          f"bench decode at batch {d['batch']} context 576: {dec:.0f} tok/s -> {s['output_throughput']/dec:.2f}; "
          f"TTFT p50/p99 {s['ttft_ms']['p50']:.0f}/{s['ttft_ms']['p99']:.0f} ms, TPOT p50 {s['tpot_ms']['p50']:.2f} ms")
    if s.get("output_chunks", s["output_tokens"]) < 0.9 * s["output_tokens"]:
        print(f"  note: {s['output_chunks']} chunks for {s['output_tokens']} tokens: the server withheld "
              "chunks (empty text), so TTFT and ITL are per chunk, not per token")
    for l in open(f"{out}/serve-rate-{tag}.jsonl"):
        r = json.loads(l)
        print(f"  rate {r['request_rate']:.2f}/s: TTFT p50/p99 {r['ttft_ms']['p50']:.0f}/{r['ttft_ms']['p99']:.0f} ms, "
              f"TPOT p50 {r['tpot_ms']['p50']:.2f} ms, ITL p99 {r['itl_ms']['p99']:.1f} ms, {r['output_throughput']:.0f} tok/s, "
              f"prefix hit ratio {r.get('prefix_cache_hit_ratio') or 0:.2f}")
PY
