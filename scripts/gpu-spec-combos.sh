#!/usr/bin/env bash
# Speculation beside the engine's other parts on the GPU (issue #24), from
# .gpu/spec.tar.xz: ngram drafts over a weight budget (the layer ring and the expert
# cache), quantized weights and a mixture of experts, f32 activations (so a verify step's
# logits round like a decode step's but for GEMM shapes), greedy: plain against
# `--speculative-method ngram` and against a random EAGLE-3 head (`eagle3`, dummy:eagle3),
# the output ids compared and the rates printed.
#   usage: OUT=... bash scripts/gpu-spec-combos.sh
set -uo pipefail
source "$(dirname "$0")/gpu-spec-env.sh"
case_() { # name, flags...
  local name=$1; shift
  for s in plain ngram eagle3; do
    spec=(); [ $s = ngram ] && spec=(--speculative-method ngram --num-speculative-tokens 4)
    [ $s = eagle3 ] && spec=(--speculative-method eagle3 --draft-model dummy:eagle3 --num-speculative-tokens 4)
    .spec/encore generate --device cuda --dtype f32 --prompt "$P" --prompt "$P two" \
      --max-tokens 64 --ignore-eos --capture-all --json "$@" "${spec[@]}" \
      >"$OUT/$name-$s.json" 2>"$OUT/$name-$s.err"
    echo "== $name $s rc=$? $(grep -oE '"decode_tokens_per_s":[0-9.]+' "$OUT/$name-$s.json" | head -1)"
    grep -iE "error" "$OUT/$name-$s.err" | head -2
  done
  for s in ngram eagle3; do
  python3 - "$OUT/$name-plain.json" "$OUT/$name-$s.json" $s <<'PY'
import json, sys
a = [json.loads(l)["output_ids"] for l in open(sys.argv[1]) if l.strip()]
b = [json.loads(l)["output_ids"] for l in open(sys.argv[2]) if l.strip()]
same = sum(x == y for p, q in zip(a, b) for x, y in zip(p, q))
first = [next((i for i, (x, y) in enumerate(zip(p, q)) if x != y), None) for p, q in zip(a, b)]
print(f"   {sys.argv[3]}: tokens equal: {same} of {sum(map(len, a))}; first difference per prompt: {first}")
PY
  done
}
case_ offload-ring --model dummy:llama-3.2-1b --weight-budget 50%
case_ q4k-8b --model dummy:llama-3-8b --quantization q4_k
case_ moe-q4k --model dummy:qwen3-30b-a3b --quantization q4_k
case_ moe-experts-budget --model dummy:qwen3-30b-a3b --quantization q4_k --weight-budget 60%
