#!/usr/bin/env bash
# EAGLE-3 speculative decoding on the GPU machine (issue #24), from .gpu/spec.tar.xz (the
# encore binary, the eagle and scheduler test binaries as eagle-test and scheduler-test):
#   1. scripts/eagle_reference.py: a random Llama target and EAGLE-3 head, and the head's
#      drafts computed in PyTorch (written to $OUT/eagle-ref: copy it to
#      crates/encore-core/tests/data/eagle when the generator changes);
#   2. the eagle tests (CPU and CUDA, eager and graphs) against it, and the CUDA scheduler
#      test (greedy and sampled tokens equal to speculation off);
#   3. `encore generate --capture-all` on Llama-3-8B's shape alone and with a random
#      EAGLE-3 head of its shape (k = 4, 2): the head agrees on nothing, so this is the cost
#      of its catch-up and rounds (the "drafting" line) beside the verify steps.
# Logs under $OUT.   usage: OUT=... bash scripts/gpu-eagle.sh
set -uo pipefail
source "$(dirname "$0")/gpu-spec-env.sh"
python3 scripts/eagle_reference.py "$OUT/eagle-ref" >"$OUT/eagle-ref.txt" 2>&1
echo "== eagle_reference rc=$?"; tail -4 "$OUT/eagle-ref.txt"
tar -cf "$OUT/eagle-ref.tar" -C "$OUT" eagle-ref
ENCORE_EAGLE_REF="$OUT/eagle-ref" .spec/eagle-test --include-ignored --test-threads 1 --nocapture >"$OUT/eagle-test.txt" 2>&1
echo "== eagle-test rc=$?"; grep -E "^test |test result|drafts of|panicked|left|right" "$OUT/eagle-test.txt" | head -20
.spec/scheduler-test --include-ignored eagle >"$OUT/scheduler-test.txt" 2>&1
echo "== scheduler eagle rc=$?"; grep -E "^test |test result|panicked" "$OUT/scheduler-test.txt"
spec_gen 8b-plain llama-3-8b
spec_gen 8b-eagle-k4 llama-3-8b --speculative-method eagle3 --draft-model dummy:eagle3 --num-speculative-tokens 4
spec_gen 8b-eagle-k2 llama-3-8b --speculative-method eagle3 --draft-model dummy:eagle3 --num-speculative-tokens 2
spec_gen 8b-draft-1b-k4 llama-3-8b --speculative-method draft --draft-model dummy:llama-3.2-1b --num-speculative-tokens 4
