//! The builders of the op cases that several groups share (`qkv_rope_write` and
//! `attention` cases, over a cache of the dtype or FP8), and the FP8 KV cache's cases.

use super::cases::{AttentionCase, Op, FULL};
use super::inputs::{AttentionInputs, AttentionShape, QkvRopeInputs};
use super::kv8;
use crate::tensor::DType;

/// The FP8 KV cache's cases ([`kv8::CASE_SCALE`]): writes of two shapes, then decode
/// and prefill reads: a short context, a long one (split-K), prefill rows past the CPU
/// kernel's tiles at head_dim 64 and 128 (the GPU's tensor-core kernel), a window.
pub(super) fn fp8_cache_cases(
    rng: &mut rand::rngs::StdRng,
    dtype: DType,
    push: &mut impl FnMut(String, String, DType, Op),
) {
    for case in [
        (7, 4, 2, 64, 64, 6, 16, false),
        (9, 8, 8, 128, 128, 4, 8, true),
    ] {
        push_qkv_rope(rng, case, Some(kv8::CASE_SCALE), dtype, push);
    }
    let shapes: [AttentionCase; 5] = [
        (6, 4, 2, 64, 16, 4, 6, FULL),
        (5, 8, 2, 128, 16, 64, 6, FULL),
        (5, 4, 1, 64, 16, 64, 40, FULL),
        (4, 8, 2, 128, 16, 16, 40, FULL),
        (5, 4, 1, 64, 16, 64, 40, &[Some(100)]),
    ];
    for prefill in [false, true] {
        for case in &shapes {
            let shape = attention_shape(case, prefill, case.7[0]);
            push_attention(rng, shape, Some(kv8::CASE_SCALE), dtype, push);
        }
    }
}

/// The launch shape of an [`AttentionCase`] with one of its windows.
pub(super) fn attention_shape(
    case: &AttentionCase,
    prefill: bool,
    window: Option<usize>,
) -> AttentionShape {
    let &(num_seqs, num_heads, num_kv_heads, head_dim, block_size, table_width, max_q_len, _) =
        case;
    AttentionShape {
        num_seqs,
        num_heads,
        num_kv_heads,
        head_dim,
        block_size,
        table_width,
        prefill,
        max_q_len,
        window,
        softcap: None,
        sinks: false,
    }
}

/// A `qkv_rope_write` case: (tokens, heads, KV heads, head_dim, rotary dims, blocks,
/// block size, head norm).
pub(super) type QkvRopeCase = (usize, usize, usize, usize, usize, usize, usize, bool);

/// One `qkv_rope_write` case with fresh inputs from `rng`, into an FP8 cache of `kv8`'s
/// scales or one of the case's dtype.
pub(super) fn push_qkv_rope(
    rng: &mut rand::rngs::StdRng,
    (n, nh, kvh, hd, rot, nb, bs, norm): QkvRopeCase,
    kv8: Option<crate::args::KvScale>,
    dtype: DType,
    push: &mut impl FnMut(String, String, DType, Op),
) {
    let mut inputs = QkvRopeInputs::random(rng, n, nh, kvh, hd, rot, nb, bs, norm);
    inputs.kv.kv8 = kv8;
    let name = if kv8.is_some() {
        "qkv_rope_write(fp8 cache)"
    } else {
        "qkv_rope_write"
    };
    push(
        name.into(),
        format!("n={n} h={nh}/{kvh} hd={hd} rot={rot} blocks={nb}x{bs} head_norm={norm}"),
        dtype,
        Op::QkvRope(inputs),
    );
}

/// One attention case of `shape` with fresh inputs from `rng`, over an FP8 cache of
/// `kv8`'s scales or one of the case's dtype.
pub(super) fn push_attention(
    rng: &mut rand::rngs::StdRng,
    shape: AttentionShape,
    kv8: Option<crate::args::KvScale>,
    dtype: DType,
    push: &mut impl FnMut(String, String, DType, Op),
) {
    let mut inputs = AttentionInputs::random(rng, shape);
    inputs.kv8 = kv8;
    let phase = if shape.prefill { "prefill" } else { "decode" };
    let mut name = format!("attention({phase}");
    if shape.window.is_some() && kv8.is_none() {
        name += ", window";
    }
    if shape.softcap.is_some() {
        name += ", softcap";
    }
    if shape.sinks {
        name += ", sinks";
    }
    if kv8.is_some() {
        name += ", fp8 cache";
    }
    name += ")";
    let (nh, nkv, hd, bs) = (
        shape.num_heads,
        shape.num_kv_heads,
        shape.head_dim,
        shape.block_size,
    );
    let mut desc = format!("rows={} h={nh}/{nkv} hd={hd} bs={bs}", inputs.rows);
    if let Some(w) = shape.window {
        desc += &format!(" window={w}");
    }
    if let Some(c) = shape.softcap {
        desc += &format!(" softcap={c}");
    }
    push(name, desc, dtype, Op::Attention(inputs));
}

/// Matmuls for the mixed-input GEMM on repacked weights (CUDA's `marlin`, the formats
/// `quant::marlin` takes): every row count from the gemv's (1, 3: the GEMM runs them under
/// `ENCORE_QUANT_GEMM=marlin`) through one, two, four and eight 16-row blocks a CTA and
/// several m blocks (100, 256, 512), n not a multiple of the 128-row tile, k not a multiple
/// of the 64-value tile where the format allows (32-value blocks), long enough for a k
/// split; with and without a bias, out in x's type or f32. bf16 and f16 x only (the
/// kernel's); the CPU runs them as any quantized matmul.
pub(super) fn marlin_matmul_cases(
    rng: &mut rand::rngs::StdRng,
    dtype: DType,
    push: &mut impl FnMut(String, String, DType, Op),
) {
    use crate::quant::QuantFormat;
    if dtype == DType::F32 {
        return;
    }
    let formats = [
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q4K,
        QuantFormat::Q8_0,
    ];
    for (i, m) in [1usize, 3, 16, 17, 64, 100, 256, 512]
        .into_iter()
        .enumerate()
    {
        for (f, fmt) in formats.into_iter().enumerate() {
            // k: 33 blocks of 32 (padded to 1088) or 3 Q4_K blocks (768); n: 136 or 40.
            let k = if fmt.block_elems() == 32 {
                33 * 32
            } else {
                3 * 256
            };
            let n = if (i + f) % 2 == 0 { 136 } else { 40 };
            // A bias only with out in x's type (matmul's contract).
            let (bias, out_f32) = ((i + f) % 3 == 0, (i + f) % 4 == 1 && (i + f) % 3 != 0);
            let inputs = super::inputs::MatmulInputs::quantized(rng, m, k, n, bias, fmt);
            push(
                format!(
                    "matmul marlin({fmt}, {}, out {})",
                    if bias { "bias" } else { "no bias" },
                    if out_f32 { DType::F32 } else { dtype }
                ),
                format!("m={m} k={k} n={n}"),
                dtype,
                Op::Matmul { inputs, out_f32 },
            );
        }
    }
}
