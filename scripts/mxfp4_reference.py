#!/usr/bin/env python3
"""The MXFP4 fixture of encore-backend's `tests/cpu_mxfp4.rs`: random `*_blocks` / `*_scales`
bytes (every E8M0 edge included) and the values transformers' own dequantizer,
`transformers.integrations.mxfp4.convert_moe_packed_tensors` (5.17), gives them in float32.

Run: /work/hfvenv/bin/python scripts/mxfp4_reference.py > crates/encore-backend/tests/data/mxfp4_hf.json
"""
import json

import torch
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

g = torch.Generator().manual_seed(47)
# [experts, rows, groups, 16] blocks and [experts, rows, groups] scales, as gate_up_proj_blocks.
E, R, G = 2, 3, 4
blocks = torch.randint(0, 256, (E, R, G, 16), generator=g, dtype=torch.int64).to(torch.uint8)
scales = torch.randint(110, 140, (E, R, G), generator=g, dtype=torch.int64).to(torch.uint8)
# The E8M0 edges: the smallest scales (subnormal results) and the largest (2^127, 2^128).
flat = scales.view(-1)
for i, e in enumerate([0, 1, 2, 126, 127, 128, 253, 254, 255]):
    flat[i * 2] = e
out = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, G * 32, R]


def f32(v):
    v = float(v)
    if v != v:
        return "nan"
    if v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
    return v


print(json.dumps({
    "source": "transformers.integrations.mxfp4.convert_moe_packed_tensors, dtype float32",
    "shape": [E, R, G],
    "blocks": blocks.reshape(-1).tolist(),
    "scales": scales.reshape(-1).tolist(),
    # Transposed back to [E, R, G * 32]: row r of expert e, its values in k order.
    "values": [f32(v) for v in out.transpose(1, 2).reshape(-1).tolist()],
}))
