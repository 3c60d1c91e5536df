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
