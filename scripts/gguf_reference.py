#!/usr/bin/env python3
"""Reference data for encore's GGUF dequantizers, made with gguf-py (llama.cpp's Python
package), which the Rust tests compare against bit for bit.

    pip install gguf numpy
    # The fixture `crates/encore-core/tests/data/gguf_blocks.gguf` (committed): for each
    # supported GGML type T, tensor `q.T` holds random blocks of T and `f.T` their f32
    # dequantization by gguf-py.
    python3 scripts/gguf_reference.py fixture
    # Dequantize some tensors of a real model into an f32 GGUF for the ignored
    # `real_gguf_smoke` test (ENCORE_GGUF_MODEL / ENCORE_GGUF_REFERENCE).
    python3 scripts/gguf_reference.py model MODEL.gguf OUT.gguf [TENSOR ...]

Random blocks: uniformly random bytes, except that every f16 scale field (d, and m/dmin
where the type has one) is overwritten with a finite f16 drawn from [-2, 2], and MXFP4's
E8M0 scale byte with one of 100..150, so no block decodes to inf or NaN. The float types (F32, F16, BF16) hold random finite values.
"""

import sys

import numpy as np
from gguf import GGMLQuantizationType as T, GGUFReader, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

FIXTURE = "crates/encore-core/tests/data/gguf_blocks.gguf"

# Byte offsets of the f16 scale fields inside one block.
SCALES = {
    T.Q8_0: [0],
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}
# Byte offsets of the E8M0 scale byte inside one block: drawn from 100..150, so every
# value is finite.
E8M0 = {T.MXFP4: 0}
FLOATS = {T.F32: np.float32, T.F16: np.float16}
ROWS = 2
BLOCKS_PER_ROW = 3


def random_blocks(rng, qtype):
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    cols = BLOCKS_PER_ROW * block_elems
    if qtype in FLOATS:
        values = rng.uniform(-4, 4, size=(ROWS, cols)).astype(FLOATS[qtype])
        return values.view(np.uint8)
    if qtype == T.BF16:
        values = rng.uniform(-4, 4, size=(ROWS, cols)).astype(np.float32)
        return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    raw = rng.integers(0, 256, size=(ROWS * BLOCKS_PER_ROW, block_bytes), dtype=np.uint8)
    if qtype in E8M0:
        raw[:, E8M0[qtype]] = rng.integers(100, 151, size=ROWS * BLOCKS_PER_ROW, dtype=np.uint8)
    for at in SCALES.get(qtype, []):
        scales = rng.uniform(-2, 2, size=ROWS * BLOCKS_PER_ROW).astype(np.float16)
        raw[:, at : at + 2] = scales.view(np.uint8).reshape(-1, 2)
    return raw.reshape(ROWS, BLOCKS_PER_ROW * block_bytes)


def fixture():
    rng = np.random.default_rng(20240611)
    w = GGUFWriter(FIXTURE, "encore-test")
    for qtype in [T.F32, T.F16, T.BF16, *SCALES, *E8M0]:
        raw = random_blocks(rng, qtype)
        expected = dequantize(raw, qtype).astype(np.float32)
        assert np.isfinite(expected).all(), qtype.name
        w.add_tensor(f"q.{qtype.name}", raw, raw_dtype=qtype)
        w.add_tensor(f"f.{qtype.name}", expected)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {FIXTURE}")


def model(path, out, names):
    r = GGUFReader(path)
    tensors = {t.name: t for t in r.tensors}
    names = names or [
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "blk.0.attn_k.weight",
        "blk.0.ffn_down.weight",
        "blk.0.attn_norm.weight",
        "blk.29.ffn_up.weight",
    ]
    w = GGUFWriter(out, "encore-reference")
    for name in names:
        t = tensors[name]
        values = dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = [int(d) for d in reversed(t.shape)]
        w.add_tensor(name, values.reshape(shape))
        print(f"{name}: {t.tensor_type.name} {shape}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "fixture"
    if mode == "fixture":
        fixture()
    elif mode == "model":
        model(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        sys.exit(__doc__)
