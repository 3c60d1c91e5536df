#!/usr/bin/env bash
# Structured outputs on the GPU (issue #21), from a build carried as .gpu/gpu.tar.xz
# (scripts/pack-gpu.sh): the CUDA sampling kernel with allowed-token masks against the CPU
# (`encore info` self-check and the cuda test binary), constrained generation replayed
# from graphs against eager (same tokens), and the decode cost of constraining every
# request (a regex and a JSON schema that do not end within the run, `--ignore-eos`), 1B
# and 8B shapes, 1, 64 and 256 prompts (MODELS, PROMPTS override), alternating with
# .bin/encore-base when the pack has one (ENCORE_BASE_BIN of scripts/pack-gpu.sh).
#   usage: OUT=... bash scripts/gpu-structured.sh [check,time]
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ENCORE_CACHE_DIR=${ENCORE_CACHE_DIR:-/tmp/encore-cache}
OUT=${OUT:-$(mktemp -d)}
logs=$OUT/structured-logs
mkdir -p "$logs" .bin
tar -xJf .gpu/gpu.tar.xz -C .bin || exit 1  # always: a warm machine keeps an older .bin
E=.bin/encore
parts=${1:-check,time}
has() { [[ ",$parts," == *",$1,"* ]]; }
if has check; then
  $E info --device cuda --seed 7 >"$logs/info.txt" 2>&1
  echo "== info rc=$?"; grep -iE "sample|fail|mismatch" "$logs/info.txt" | head -12
  .bin/tests/cuda --include-ignored --test-threads=1 >"$logs/test-cuda.txt" 2>&1
  echo "== test cuda rc=$?"; grep -E '^test result|FAILED|panicked' "$logs/test-cuda.txt" | head -8
  printf '%s' '{"type":"object","properties":{"id":{"type":"integer","minimum":0,"maximum":999},"tags":{"type":"array","items":{"enum":["a","b","c"]},"maxItems":4},"name":{"type":"string","maxLength":12}},"required":["id","tags","name"],"additionalProperties":false}' >/tmp/schema.json
  for mode in graph eager; do
    flag=""; [ $mode = eager ] && flag=--eager
    $E generate --device cuda --model dummy:llama-3.2-1b --json-schema /tmp/schema.json \
      --max-tokens 80 --temperature 1 --seed 5 --json $flag \
      --prompt one --prompt two --prompt three --prompt four >"$logs/gen-$mode.json" 2>"$logs/gen-$mode.err"
    echo "== generate $mode rc=$?"
  done
  python3 - "$logs" <<'PY'
import json, sys
d = sys.argv[1]
def rows(mode):
    return [json.loads(l) for l in open(f"{d}/gen-{mode}.json") if l.strip().startswith("{")]
g, e = rows("graph"), rows("eager")
same = [a.get("output_ids") == b.get("output_ids") for a, b in zip(g, e)]
ok = []
for r in g:
    t = r.get("text", "")
    try:
        v = json.loads(t); ok.append(isinstance(v, dict) and set(v) == {"id", "tags", "name"})
    except Exception:
        ok.append(False)
print(f"graph == eager tokens: {same}; graph outputs valid JSON of the schema: {ok}")
for r in g[:2]: print("  ", r.get("text", "")[:120])
PY
fi
if has time; then
  # Alternates .bin/encore-base (when packed) with .bin/encore on each case.
  bins=(.bin/encore); [ -x .bin/encore-base ] && bins=(.bin/encore-base .bin/encore)
  # A string of at least 600 characters: the schema cannot close within the run.
  printf '%s' '{"type":"object","properties":{"text":{"type":"string","minLength":600}},"required":["text"],"additionalProperties":false}' >/tmp/long.json
  for m in ${MODELS:-llama-3.2-1b llama-3-8b}; do
    for n in ${PROMPTS:-1 64 256}; do
      prompts=(); for i in $(seq $n); do prompts+=(--prompt "p$i"); done
      for c in none regex schema; do
        extra=()
        [ $c = regex ] && extra=(--regex '[a-z ]+')
        [ $c = schema ] && extra=(--json-schema /tmp/long.json)
        for B in "${bins[@]}"; do
          $B generate --device cuda --model dummy:$m --max-tokens 128 --ignore-eos \
            "${extra[@]}" "${prompts[@]}" >/dev/null 2>"$logs/time-$m-$n-$c.err"
          rate=$(grep -oE 'decode [0-9.]+ tok/s \(all sequences\)|decode [0-9.]+ tok/s' "$logs/time-$m-$n-$c.err" | tail -1)
          echo "== $(basename $B) $m prompts=$n constraint=$c: $rate"
          [ -z "$rate" ] && tail -3 "$logs/time-$m-$n-$c.err"
        done
      done
    done
  done
fi
