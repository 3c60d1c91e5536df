#!/usr/bin/env bash
# Draft-model speculative decoding on the GPU machine (issue #24), from .gpu/spec.tar.xz
# (the encore binary, and the scheduler test binary as scheduler-test):
#   1. the CUDA draft-model test (greedy tokens equal to speculation off);
#   2. `encore generate --capture-all` on random-weight shapes: a target alone, with
#      ngram drafts, and with a draft model (Llama-3-8B with a Llama-3.2-1B-shaped draft;
#      Llama-3.2-1B with itself, every greedy draft kept). Random weights: the 8B/1B pair
#      agrees on nothing, so its rate is the cost of a round that emits one token.
# Logs under $OUT.   usage: OUT=... bash scripts/gpu-spec-draft.sh
set -uo pipefail
source "$(dirname "$0")/gpu-spec-env.sh"
if [ -x .spec/scheduler-test ]; then
  .spec/scheduler-test --include-ignored cuda_draft >"$OUT/scheduler-test.txt" 2>&1
  echo "== scheduler cuda_draft rc=$?"; grep -E "^test |test result" "$OUT/scheduler-test.txt"
fi
spec_gen 8b-plain llama-3-8b
spec_gen 8b-draft-1b-k4 llama-3-8b --speculative-method draft --draft-model dummy:llama-3.2-1b --num-speculative-tokens 4
spec_gen 8b-draft-1b-k2 llama-3-8b --speculative-method draft --draft-model dummy:llama-3.2-1b --num-speculative-tokens 2
spec_gen 1b-plain llama-3.2-1b
spec_gen 1b-draft-self-k4 llama-3.2-1b --speculative-method draft --draft-model dummy:llama-3.2-1b --num-speculative-tokens 4
