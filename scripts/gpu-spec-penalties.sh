#!/usr/bin/env bash
# Speculative decoding with penalties on a real model (issue #24): SmolLM2-135M-Instruct's
# Q4_1 GGUF asked to repeat a paragraph (scripts/gpu-spec-real.sh's prompt and its two-part
# carry), with a repetition penalty (greedy) and a frequency penalty (sampled, seeded),
# plain against `--speculative-method ngram --num-speculative-tokens 4`, 1 and 8 prompts.
# Logs under $OUT.   usage: OUT=... bash scripts/gpu-spec-penalties.sh
set -uo pipefail
source "$(dirname "$0")/gpu-spec-env.sh"
source "$(dirname "$0")/gpu-spec-smol.sh"
for pen in rep freq; do
  case $pen in
    rep) sampling=(--repetition-penalty 1.1) ;;
    freq) sampling=(--frequency-penalty 0.2 --temperature 0.7 --seed 7) ;;
  esac
  for n in 1 8; do
    prompts=(); for i in $(seq $n); do prompts+=(--prompt "$P"); done
    for k in off 4; do
      spec=(); [ $k != off ] && spec=(--speculative-method ngram --num-speculative-tokens $k)
      .spec/encore generate --device cuda --model $M --chat --max-tokens 160 --capture-all \
        "${sampling[@]}" "${spec[@]}" "${prompts[@]}" >"$OUT/$pen-$n-$k.txt" 2>"$OUT/$pen-$n-$k.err"
      echo "== $pen prompts=$n k=$k rc=$? text md5 $(md5sum <"$OUT/$pen-$n-$k.txt" | cut -c1-8)"
      grep -E "^summary:|speculative decoding|rror" "$OUT/$pen-$n-$k.err" | tail -2
    done
  done
  head -c 300 "$OUT/$pen-1-off.txt"; echo
done
# In f32 a verify step's logits round like a decode step's: the greedy ids must be equal
# (in bf16 a repetition penalty on a copying prompt makes near-ties rounding decides).
for k in off 4; do
  spec=(); [ $k != off ] && spec=(--speculative-method ngram --num-speculative-tokens $k)
  .spec/encore generate --device cuda --model $M --chat --max-tokens 160 --dtype f32 --json \
    --repetition-penalty 1.1 "${spec[@]}" --prompt "$P" >"$OUT/f32-rep-$k.json" 2>"$OUT/f32-rep-$k.err"
  grep -E "speculative decoding" "$OUT/f32-rep-$k.err"
done
python3 - "$OUT" <<'PY'
import json, sys
ids = [json.loads(open(f"{sys.argv[1]}/f32-rep-{k}.json").readline())["output_ids"] for k in ("off", "4")]
print(f"== f32 repetition penalty, greedy: {len(ids[0])} and {len(ids[1])} ids,", "equal" if ids[0] == ids[1] else "DIFFERENT")
PY
