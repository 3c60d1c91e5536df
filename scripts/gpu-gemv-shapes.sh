#!/usr/bin/env bash
# The decode gemv per projection shape under layout knobs, on the GPU machine, with
# .gpu/final.tar.xz from scripts/pack-arch.sh: `encore bench kernels --only gemv` per
# variant (µs a call of every shape of its FULL suite: Llama-3-8B's, Gemma-3-4B's,
# Phi-4-mini's), as one table, then batch-1 `bench decode` of the shaped dummies for
# DECODE variants. A variant is `base` or `+`-joined VAR=VALUE settings:
#   VARIANTS="base ENCORE_GEMV_CTAS_PER_SM=3 ENCORE_GEMV_CTAS_PER_SM=3+ENCORE_KERNEL_DEFINES=GEMV_MIN_BLOCKS=4" \
#   DECODE="base ENCORE_GEMV_CTAS_PER_SM=3" bash scripts/gpu-gemv-shapes.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 ENCORE_CACHE_DIR=/tmp/encore-cache
[ -x .bin/encore ] || { mkdir -p .bin && tar -xJf .gpu/final.tar.xz -C .bin; }
envs() { [ "$1" = base ] && return; tr '+' '\n' <<< "$1"; }
for v in ${VARIANTS:-base}; do
  mapfile -t e < <(envs "$v")
  env "${e[@]}" .bin/encore bench kernels --device cuda --only gemv --json \
    > "$OUT/gemv-$(tr '=+/' '___' <<< "$v").json" 2>"$OUT/gemv-err.log" || tail -3 "$OUT/gemv-err.log"
done
python3 - "$OUT" ${VARIANTS:-base} <<'PY'
import json, sys
out, variants = sys.argv[1], sys.argv[2:]
tab = {}
for v in variants:
    f = f"{out}/gemv-{v.replace('=', '_').replace('+', '_').replace('/', '_')}.json"
    for l in open(f):
        if l.startswith("{"):
            r = json.loads(l)
            tab.setdefault(r["name"].split(",")[0], {})[v] = r["seconds"] * 1e6
for i, v in enumerate(variants):
    print(f"  [{i}] {v}")
print(f"{'shape':28s}" + "".join(f"{'['+str(i)+']':>8s}" for i in range(len(variants))))
for name, row in tab.items():
    print(f"{name:28s}" + "".join(f"{row.get(v, float('nan')):8.2f}" for v in variants))
PY
for v in ${DECODE:-}; do
  mapfile -t e < <(envs "$v")
  for m in ${MODELS:-gemma-3-4b phi-4-mini llama-3-8b}; do
    echo "decode $m $v: $(env "${e[@]}" .bin/encore bench decode --device cuda --model dummy:$m \
      --batch 1 --context 512 2>&1 | grep -E '^\s+1\s')"
  done
done
