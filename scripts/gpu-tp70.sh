#!/usr/bin/env bash
# Tensor parallelism's 70B figure (issue #25) on a machine of 4 GPUs (nvidia-h100-x4 or
# nvidia-h200-x4), carrying .gpu with the release `encore`: `bench decode` of the
# llama-3-70b-shaped dummy over 4 GPUs at batch 1 and 16 (each rank draws only its own
# share of the weights), beside rank 0's weight floor. NCCL from the PyTorch wheel.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p .bin && tar -xJf .gpu/gpu.tar.xz -C .bin
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
nccl=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
mkdir -p /tmp/nccl && ln -sf "$nccl/libnccl.so.2" /tmp/nccl/libnccl.so
export LD_LIBRARY_PATH=/tmp/nccl:$LD_LIBRARY_PATH
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
start=$SECONDS
.bin/encore bench decode --device cuda --model dummy:llama-3-70b -t 4 --batch 1,16 \
  --steps 20 --json 2>/tmp/tp70.err | python3 -c "
import json, sys
for l in sys.stdin:
    l = l.strip()
    if not l.startswith('{'): continue
    v = json.loads(l)
    print('batch', v['batch'], 'graph_ms %.3f' % v['graph_step_ms'], 'eager_ms %.3f' % v['eager_step_ms'],
          'floor_ms %.3f' % v['floor_ms'], 'ratio %.2f' % (v['graph_step_ms'] / v['floor_ms']),
          'load_s %.1f' % v['load_s'], 'copy_gbps %.0f' % v['copy_gbps'])
"
echo "rc=${PIPESTATUS[0]} wall=$((SECONDS - start))s"; tail -4 /tmp/tp70.err
