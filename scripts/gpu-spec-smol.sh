# Sourced after scripts/gpu-spec-env.sh by the SmolLM2 speculation scripts
# (gpu-spec-real.sh, gpu-spec-penalties.sh): $M, SmolLM2-135M-Instruct's Q4_1 GGUF, put
# together from its first part (left in /tmp/sm/model.part1 by an earlier call) and
# .gpu/sm.part2 (a call carries at most 64 MiB); $P, the paragraph-copying prompt.
mkdir -p /tmp/sm
M=/tmp/sm/model.gguf
if [ ! -f $M ]; then
  cat /tmp/sm/model.part1 .gpu/sm.part2 >$M || exit 1
fi
DOC="A paged KV cache stores the keys and values of every sequence in fixed-size blocks, \
so that memory is allocated on demand and shared between requests with a common prefix. \
The scheduler admits a request only when its blocks fit, and preempts the newest request \
when the cache runs out, recomputing its tokens later. Graph replay keeps the step's \
launches on the device, so the host only packs the inputs and reads the sampled tokens."
P="Repeat the following text exactly, word for word: $DOC"
