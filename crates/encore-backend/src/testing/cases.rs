//! The op cases every check runs: one list of (op, inputs, dtype), how to run a case on a
//! backend (poisoned outputs, results read back to the host), how to compute it with the
//! f64 reference, and how two results of a case compare.

use crate::backend::{Attention, Backend, Penalties, QkvRope, SampleLogprobs, Sampling, TokenMask};
use crate::error::Result;
use crate::quant::QuantFormat;
use crate::tensor::DType;

use super::case_builders::{attention_shape, fp8_cache_cases, push_attention, push_qkv_rope};
use super::compare::{
    allowed_sample_mismatches, max_row_error, normalized_error, token_mismatches, tolerance,
    CheckResult, OpClass,
};
use super::host::{download_f64, poison};
use super::inputs::*;
use super::{kv8, reference};

pub(crate) const DTYPES: [DType; 3] = [DType::BF16, DType::F16, DType::F32];

/// An attention case: (num_seqs, heads, KV heads, head_dim, block size, table width, most
/// query rows per sequence in prefill, the windows to run it with).
pub(super) type AttentionCase = (
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    &'static [Option<usize>],
);
pub(super) const FULL: &[Option<usize>] = &[None];
const LONG_WINDOWS: &[Option<usize>] = &[Some(1), Some(3), Some(15), Some(17), Some(100)];

pub(crate) enum Op {
    Embedding(EmbeddingInputs),
    RmsNorm {
        inputs: RmsNormInputs,
        residual: bool,
        in_place: bool,
    },
    SiluMul(SiluMulInputs),
    /// `penalty_count` into a `[rows, vocab]` table (repeated and out-of-table pairs
    /// among them).
    PenaltyCount {
        counts: Vec<i32>,
        vocab: usize,
        slots: Vec<i32>,
        tokens: Vec<i32>,
    },
    /// `unshard_columns` of `[shards, rows, cols]` values (a pure copy).
    UnshardColumns {
        values: Vec<f32>,
        shards: usize,
        rows: usize,
        cols: usize,
    },
    Matmul {
        inputs: MatmulInputs,
        out_f32: bool,
    },
    QkvRope(QkvRopeInputs),
    /// `n` of the inputs is `2 * inter`.
    MatmulSiluMul(MatmulInputs),
    Attention(AttentionInputs),
    Sample(SampleInputs),
}

pub(crate) struct Case {
    pub name: String,
    pub shape: String,
    pub dtype: DType,
    pub op: Op,
}

/// One result of a case, as host data.
pub(crate) enum Output {
    Floats {
        name: &'static str,
        values: Vec<f64>,
        class: OpClass,
        /// Compare per row of this many elements (0: the whole tensor at once).
        row_len: usize,
    },
    /// Token ids; `greedy[r]` says row `r` must match exactly.
    Tokens {
        name: &'static str,
        ids: Vec<i32>,
        greedy: Vec<bool>,
    },
}

/// Every case, on fresh inputs drawn from `seed`. Shapes are modest (the whole list runs
/// in about a second on the CPU) but include the odd sizes kernels get wrong: m = 1,
/// n = 1, k not a multiple of any tile, head_dim 96, block sizes 8 and 16, GQA and MQA,
/// contexts from 1 to past the block table's capacity.
pub(crate) fn cases(seed: u64) -> Vec<Case> {
    let mut rng = rng(seed);
    let mut extra = self::rng(seed ^ 0x5eed_a77e);
    let mut out = Vec::new();
    let mut push = |name: String, shape: String, dtype: DType, op: Op| {
        out.push(Case {
            name,
            shape,
            dtype,
            op,
        })
    };
    for dtype in DTYPES {
        let rng = &mut rng;
        for (n, vocab, hidden, first) in [(9, 50, 64, 0), (3, 1000, 200, 0), (16, 40, 64, 30)] {
            let inputs = EmbeddingInputs::random(rng, n, vocab, hidden, first);
            push(
                "embedding".into(),
                format!("n={n} vocab={vocab} d={hidden} first={first}"),
                dtype,
                Op::Embedding(inputs),
            );
        }
        for (rows, dim) in [(5, 64), (3, 200), (1, 1000)] {
            for (residual, in_place) in [(false, false), (true, false), (false, true), (true, true)]
            {
                let name = match (residual, in_place) {
                    (false, false) => "rms_norm",
                    (true, false) => "rms_norm(residual)",
                    (false, true) => "rms_norm(out=x)",
                    (true, true) => "rms_norm(residual, out=x)",
                };
                let inputs = RmsNormInputs::random(rng, rows, dim);
                push(
                    name.into(),
                    format!("rows={rows} d={dim}"),
                    dtype,
                    Op::RmsNorm {
                        inputs,
                        residual,
                        in_place,
                    },
                );
            }
        }
        // Speculative decoding's draft counts: pairs repeat, and some fall outside.
        if dtype == DType::F32 {
            use rand::Rng;
            let (rows, vocab) = (6usize, 301usize);
            let counts: Vec<i32> = (0..rows * vocab)
                .map(|_| rng.random_range(0..4) | if rng.random_bool(0.2) { 1 << 30 } else { 0 })
                .collect();
            let n = 40;
            let mut slots: Vec<i32> = (0..n)
                .map(|_| rng.random_range(-1..rows as i32 + 1))
                .collect();
            let mut tokens: Vec<i32> = (0..n)
                .map(|_| rng.random_range(-2..vocab as i32 + 2))
                .collect();
            slots[1] = slots[0].max(0);
            tokens[1] = tokens[0].clamp(0, vocab as i32 - 1);
            slots[0] = slots[1];
            tokens[0] = tokens[1];
            push(
                "penalty_count".into(),
                format!("slots={rows} vocab={vocab} n={n}"),
                DType::I32,
                Op::PenaltyCount {
                    counts,
                    vocab,
                    slots,
                    tokens,
                },
            );
        }
        // EAGLE's side-by-side hidden states (2 or 3 blocks), a vocabulary shard's logits.
        for (shards, rows, cols) in [(2, 5, 64), (3, 7, 33), (4, 1, 250)] {
            push(
                "unshard_columns".into(),
                format!("shards={shards} rows={rows} cols={cols}"),
                dtype,
                Op::UnshardColumns {
                    values: normal(rng, shards * rows * cols, 1.0),
                    shards,
                    rows,
                    cols,
                },
            );
        }
        for (n, inter) in [(5, 100), (1, 257)] {
            let inputs = SiluMulInputs::random(rng, n, inter);
            push(
                "silu_mul".into(),
                format!("n={n} inter={inter}"),
                dtype,
                Op::SiluMul(inputs),
            );
        }
        // Rows 1..=8 with k a multiple of 8 take CUDA's gemv kernels (whole and partial
        // k chunks, more rows than the variant's warps, k split over warps; 4,096 rows of
        // 2,048, 8B's o projection over 2 GPUs, enough CTAs that the split keeps a warp's
        // whole round of loads); k = 70 and m > 8 take cuBLASLt.
        for (m, k, n) in [
            (1, 64, 257),
            (1, 2048, 4096),
            (3, 200, 1),
            (17, 64, 63),
            (127, 200, 257),
            (1, 1032, 300),
            (2, 2056, 40),
            (5, 264, 129),
            (8, 1024, 77),
            (3, 70, 9),
        ] {
            for bias in [false, true] {
                for out_f32 in [false, true] {
                    // f32 output is for logits (no bias); bias needs out dtype == x dtype.
                    if out_f32 && (dtype == DType::F32 || bias) {
                        continue;
                    }
                    let inputs = MatmulInputs::random(rng, m, k, n, bias);
                    let name = format!(
                        "matmul({}, out {})",
                        if bias { "bias" } else { "no bias" },
                        if out_f32 { DType::F32 } else { dtype }
                    );
                    push(
                        name,
                        format!("m={m} k={k} n={n}"),
                        dtype,
                        Op::Matmul { inputs, out_f32 },
                    );
                }
            }
        }
        // One row with k a multiple of 8 takes CUDA's fused gemv; the others matmul +
        // silu_mul.
        for (m, k, inter) in [(1, 264, 70), (1, 1032, 129), (1, 100, 33), (3, 264, 70)] {
            push(
                "matmul_silu_mul".into(),
                format!("m={m} k={k} inter={inter}"),
                dtype,
                Op::MatmulSiluMul(MatmulInputs::random(rng, m, k, 2 * inter, false)),
            );
        }
        quantized_matmul_cases(&mut extra, dtype, &mut push);
        for case in [
            (7, 4, 2, 64, 64, 6, 16, false),
            (5, 3, 1, 96, 64, 3, 8, true),
            (9, 8, 8, 128, 128, 4, 8, true),
            (1, 14, 2, 64, 64, 2, 16, false),
        ] {
            push_qkv_rope(rng, case, None, dtype, &mut push);
        }
        // The first five draw from the main generator, the others from their own (so the
        // inputs of every other case stay what they were before those were added).
        let attention_shapes: [AttentionCase; 8] = [
            (6, 4, 2, 64, 16, 4, 6, FULL),
            (5, 4, 1, 128, 8, 5, 6, FULL),
            (4, 6, 2, 96, 16, 3, 6, FULL),
            (3, 2, 2, 64, 8, 2, 6, FULL),
            // Long contexts (up to 1024 + 3, clamped): split-K paths on a GPU.
            (5, 4, 1, 64, 16, 64, 6, FULL),
            // Prefill rows cross the CPU kernel's query tiles (32 rows) and key chunks (64).
            (5, 4, 1, 64, 16, 64, 40, FULL),
            // Sliding windows: 1, 3, block_size -/+ 1, within and beyond the context.
            (
                4,
                6,
                2,
                96,
                8,
                5,
                6,
                &[Some(1), Some(3), Some(7), Some(9), Some(100)],
            ),
            (5, 4, 1, 64, 16, 64, 40, LONG_WINDOWS),
        ];
        for prefill in [false, true] {
            for (k, case) in attention_shapes.iter().enumerate() {
                for &window in case.7 {
                    let r = if k < 5 { &mut *rng } else { &mut extra };
                    let shape = attention_shape(case, prefill, window);
                    push_attention(r, shape, None, dtype, &mut push);
                }
            }
        }
        fp8_cache_cases(&mut extra, dtype, &mut push);
    }
    for (batch, vocab) in [(12, 1000), (4, 32_000)] {
        let inputs = SampleInputs::greedy(&mut rng, batch, vocab);
        push(
            "sample(greedy)".into(),
            format!("b={batch} vocab={vocab}"),
            DType::F32,
            Op::Sample(inputs),
        );
    }
    for (batch, vocab) in [(100, 1000), (8, 32_000)] {
        let inputs = SampleInputs::random(&mut rng, batch, vocab);
        push(
            "sample".into(),
            format!("b={batch} vocab={vocab}"),
            DType::F32,
            Op::Sample(inputs),
        );
    }
    // Min-p, penalties and log-probabilities, alone and together (vocab 1003: not a
    // multiple of 4, so the CUDA kernel's scalar loads run too).
    for (batch, vocab) in [(100, 1000), (8, 32_000), (30, 1003)] {
        for knobs in [
            "min_p",
            "penalties",
            "logprobs",
            "min_p, penalties, logprobs",
            "mask",
            "mask, penalties, logprobs",
        ] {
            let mut inputs = SampleInputs::random(&mut rng, batch, vocab);
            if knobs.contains("min_p") {
                inputs = inputs.with_min_p(&mut rng);
            }
            if knobs.contains("penalties") {
                inputs = inputs.with_penalties(&mut rng);
            }
            if knobs.contains("logprobs") {
                inputs = inputs.with_logprobs(&mut rng, crate::backend::MAX_TOP_LOGPROBS);
            }
            if knobs.contains("mask") {
                inputs = inputs.with_mask(&mut rng);
            }
            push(
                format!("sample({knobs})"),
                format!("b={batch} vocab={vocab}"),
                DType::F32,
                Op::Sample(inputs),
            );
        }
    }
    // Log-probability targets (a scored prompt token per row), drawn from `extra` so the
    // cases above keep their inputs for a given seed.
    for (batch, vocab) in [(100, 1000), (8, 32_000), (30, 1003)] {
        for knobs in ["logprobs, targets", "min_p, penalties, logprobs, targets"] {
            let mut inputs = SampleInputs::random(&mut extra, batch, vocab);
            if knobs.contains("min_p") {
                inputs = inputs.with_min_p(&mut extra);
            }
            if knobs.contains("penalties") {
                inputs = inputs.with_penalties(&mut extra);
            }
            inputs = inputs
                .with_logprobs(&mut extra, crate::backend::MAX_TOP_LOGPROBS)
                .with_targets(&mut extra);
            push(
                format!("sample({knobs})"),
                format!("b={batch} vocab={vocab}"),
                DType::F32,
                Op::Sample(inputs),
            );
        }
    }
    out
}

/// The log-probability outputs of a sample case, from per-row token log-probabilities
/// and `[batch, N]` top ids and log-probabilities: the top entries each row asked for
/// (ids exactly, values as floats) and the token log-probabilities of the greedy rows
/// that asked (a random row may legitimately draw another token on another backend).
fn logprob_outputs(i: &SampleInputs, token: &[f64], ids: &[i32], top: &[f64]) -> Vec<Output> {
    let Some((num, width)) = &i.logprobs else {
        return Vec::new();
    };
    let greedy = greedy_rows(&i.temperature);
    let (mut top_ids, mut top_values, mut token_values) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..i.batch {
        let Ok(n) = usize::try_from(num[r]) else {
            continue;
        };
        let n = n.min(*width);
        top_ids.extend_from_slice(&ids[r * width..r * width + n]);
        top_values.extend_from_slice(&top[r * width..r * width + n]);
        if greedy[r] {
            token_values.push(token[r]);
        }
    }
    vec![
        exact_ids("top_logprobs ids", top_ids),
        Output::Floats {
            name: "top_logprobs",
            values: top_values,
            class: OpClass::Reduction,
            row_len: 0,
        },
        Output::Floats {
            name: "token logprob (greedy rows)",
            values: token_values,
            class: OpClass::Reduction,
            row_len: 0,
        },
    ]
}

/// Rows that sample greedily (temperature `<= 0`, or NaN).
fn greedy_rows(temperature: &[f32]) -> Vec<bool> {
    temperature
        .iter()
        .map(|&t| t.is_nan() || t <= 0.0)
        .collect()
}

/// Integer outputs that must match exactly (every entry compared as a greedy token).
fn exact_ids(name: &'static str, ids: Vec<i32>) -> Output {
    Output::Tokens {
        name,
        greedy: vec![true; ids.len()],
        ids,
    }
}

fn floats(name: &'static str, values: Vec<f64>, class: OpClass) -> Output {
    Output::Floats {
        name,
        values,
        class,
        row_len: 0,
    }
}

/// Attention output, compared per (row, head): rows over long and short contexts differ
/// in scale.
fn attention_out(values: Vec<f64>, head_dim: usize) -> Output {
    Output::Floats {
        name: "out",
        values,
        class: OpClass::Reduction,
        row_len: head_dim,
    }
}

/// Matmuls with a quantized weight, every format: rows 1..=8 (CUDA's quantized gemv:
/// whole and partial k chunks, k split over warps) and more (the decode-then-GEMM path),
/// odd n, and the fused gate/up + SiLU for one row.
///
/// Every case has 5 or more outputs: the normalised error of fewer is too noisy. With
/// m=3 n=1, 1 run in about 10 failed on a fresh seed (bf16, Q4_K, outputs all under 0.5:
/// 2.6e-2 through CUDA's tensor-core path, which rounds a K format's sub-block scale and
/// offset to bf16 before it decodes, against 5.1e-3 through decode-then-GEMM and 0
/// through the gemv); with m=1 n=1, one output near 0 fails f32's bound on seed 1.
fn quantized_matmul_cases(
    rng: &mut rand::rngs::StdRng,
    dtype: DType,
    push: &mut impl FnMut(String, String, DType, Op),
) {
    for fmt in QuantFormat::ALL {
        let b = fmt.block_elems();
        for (m, blocks, n, bias, out_f32) in [
            (1, 8, 129, false, true),
            (1, 1, 7, true, false),
            (2, 3, 65, false, false),
            (3, 16, 5, true, false),
            (5, 2, 33, false, false),
            (8, 4, 77, false, true),
            (17, 3, 40, true, false),
            (64, 2, 9, false, false),
        ] {
            if out_f32 && dtype == DType::F32 {
                continue;
            }
            let k = blocks * b;
            let inputs = MatmulInputs::quantized(rng, m, k, n, bias, fmt);
            let name = format!(
                "matmul({fmt}, {}, out {})",
                if bias { "bias" } else { "no bias" },
                if out_f32 { DType::F32 } else { dtype }
            );
            push(
                name,
                format!("m={m} k={k} n={n}"),
                dtype,
                Op::Matmul { inputs, out_f32 },
            );
        }
        for (m, blocks, inter) in [(1, 4, 70), (2, 1, 33)] {
            let k = blocks * b;
            push(
                format!("matmul_silu_mul({fmt})"),
                format!("m={m} k={k} inter={inter}"),
                dtype,
                Op::MatmulSiluMul(MatmulInputs::quantized(rng, m, k, 2 * inter, false, fmt)),
            );
        }
    }
}

/// Upload the weight of matmul inputs: quantized when they say so, else in `dt`.
fn upload_w(b: &dyn Backend, i: &MatmulInputs, dt: DType) -> Result<crate::tensor::Tensor> {
    match i.w_format {
        Some(fmt) => {
            let w = b.alloc(DType::Q(fmt), &[i.n, i.k])?;
            b.write_bytes(&w, &i.w_bytes(fmt))?;
            Ok(w)
        }
        None => b.upload_f32_as(&i.w, &[i.n, i.k], dt),
    }
}

/// Run `case` on `b` with poisoned outputs and read every result back.
pub(crate) fn run(b: &dyn Backend, case: &Case) -> Result<Vec<Output>> {
    let dt = case.dtype;
    let f = |data: &[f32], shape: &[usize]| b.upload_f32_as(data, shape, dt);
    let fresh = |dtype: DType, shape: &[usize]| {
        let t = b.alloc(dtype, shape)?;
        poison(b, &t)?;
        Ok::<_, crate::Error>(t)
    };
    Ok(match &case.op {
        Op::Embedding(i) => {
            let ids = b.upload(&i.ids, &[i.ids.len()])?;
            let table = f(&i.table, &[i.vocab, i.hidden])?;
            let out = fresh(dt, &[i.ids.len(), i.hidden])?;
            b.embedding_rows(&ids, &table, i.first, &out)?;
            vec![floats("out", download_f64(b, &out)?, OpClass::Copy)]
        }
        Op::RmsNorm {
            inputs: i,
            residual,
            in_place,
        } => {
            let shape = [i.rows, i.dim];
            let x = f(&i.x, &shape)?;
            let w = f(&i.weight, &[i.dim])?;
            let res = if *residual {
                Some(f(&i.residual, &shape)?)
            } else {
                None
            };
            let out = if *in_place {
                x.clone()
            } else {
                fresh(dt, &shape)?
            };
            b.rms_norm(&x, res.as_ref(), &w, i.eps, &out)?;
            let mut r = vec![floats("out", download_f64(b, &out)?, OpClass::Pointwise)];
            if let Some(res) = res {
                r.push(floats(
                    "residual",
                    download_f64(b, &res)?,
                    OpClass::Pointwise,
                ));
            }
            r
        }
        Op::PenaltyCount {
            counts,
            vocab,
            slots,
            tokens,
        } => {
            let table = b.upload(counts, &[counts.len() / vocab, *vocab])?;
            let s = b.upload(slots, &[slots.len()])?;
            let t = b.upload(tokens, &[tokens.len()])?;
            b.penalty_count(&table, &s, &t)?;
            vec![exact_ids("counts", b.download::<i32>(&table)?)]
        }
        Op::UnshardColumns {
            values,
            shards,
            rows,
            cols,
        } => {
            let src = f(values, &[*shards, *rows, *cols])?;
            let out = fresh(dt, &[*rows, shards * cols])?;
            b.unshard_columns(&src, &out)?;
            vec![floats("out", download_f64(b, &out)?, OpClass::Copy)]
        }
        Op::SiluMul(i) => {
            let gu = f(&i.gate_up, &[i.n, 2 * i.inter])?;
            let out = fresh(dt, &[i.n, i.inter])?;
            b.silu_mul(&gu, &out)?;
            vec![floats("out", download_f64(b, &out)?, OpClass::Pointwise)]
        }
        Op::Matmul { inputs: i, out_f32 } => {
            let x = f(&i.x, &[i.m, i.k])?;
            let w = upload_w(b, i, dt)?;
            let bias = i.bias.as_ref().map(|v| f(v, &[i.n])).transpose()?;
            let out = fresh(if *out_f32 { DType::F32 } else { dt }, &[i.m, i.n])?;
            b.matmul(&x, &w, bias.as_ref(), &out)?;
            vec![floats("out", download_f64(b, &out)?, matmul_class(i))]
        }
        Op::MatmulSiluMul(i) => {
            let x = f(&i.x, &[i.m, i.k])?;
            let w = upload_w(b, i, dt)?;
            let gate_up = fresh(dt, &[i.m, i.n])?;
            let out = fresh(dt, &[i.m, i.n / 2])?;
            b.matmul_silu_mul(&x, &w, &gate_up, &out)?;
            vec![floats("out", download_f64(b, &out)?, OpClass::Reduction)]
        }
        Op::QkvRope(i) => {
            let (r, kv) = (&i.rope, &i.kv);
            let (n, nh, kvh, hd) = (r.n, r.num_heads, r.num_kv_heads, r.head_dim);
            let qkv = f(&i.qkv, &[n, (nh + 2 * kvh) * hd])?;
            let norms = match &i.norms {
                Some((qn, kn)) => Some((f(qn, &[hd])?, f(kn, &[hd])?)),
                None => None,
            };
            let pos = b.upload(&r.positions, &[n])?;
            let cs = b.upload(&r.cos_sin, &[r.max_positions, r.rot])?;
            let sm = b.upload(&kv.slot_mapping, &[n])?;
            let cache = [kv.num_blocks, kv.block_size, kvh, hd];
            let (kc, vc) = match kv.kv8 {
                Some(s) => (
                    kv8::upload(b, &kv.k_cache, &cache, s.k)?,
                    kv8::upload(b, &kv.v_cache, &cache, s.v)?,
                ),
                None => (f(&kv.k_cache, &cache)?, f(&kv.v_cache, &cache)?),
            };
            let q_out = fresh(dt, &[n, nh, hd])?;
            b.qkv_rope_write(&QkvRope {
                qkv: &qkv,
                head_norm: norms.as_ref().map(|(q, k)| (q, k)),
                eps: i.eps,
                positions: &pos,
                cos_sin: &cs,
                slot_mapping: &sm,
                q_out: &q_out,
                k_cache: &kc,
                v_cache: &vc,
                kv_scale: kv.kv8.unwrap_or_default(),
            })?;
            let q = floats("q", download_f64(b, &q_out)?, OpClass::Pointwise);
            match kv.kv8 {
                Some(s) => vec![
                    q,
                    floats("k_cache", kv8::download(b, &kc, s.k)?, OpClass::Fp8Cache),
                    floats("v_cache", kv8::download(b, &vc, s.v)?, OpClass::Fp8Cache),
                ],
                None => vec![
                    q,
                    floats("k_cache", download_f64(b, &kc)?, OpClass::Pointwise),
                    floats("v_cache", download_f64(b, &vc)?, OpClass::Copy),
                ],
            }
        }
        Op::Attention(i) => {
            let s = i.shape;
            let qs = [i.rows, s.num_heads, s.head_dim];
            let cache = [i.num_blocks, s.block_size, s.num_kv_heads, s.head_dim];
            let q = f(&i.q, &qs)?;
            let (kc, vc) = match i.kv8 {
                Some(s) => (
                    kv8::upload(b, &i.k_cache, &cache, s.k)?,
                    kv8::upload(b, &i.v_cache, &cache, s.v)?,
                ),
                None => (f(&i.k_cache, &cache)?, f(&i.v_cache, &cache)?),
            };
            let tables = b.upload(&i.block_tables, &[s.num_seqs, s.table_width])?;
            let lens = b.upload(&i.seq_lens, &[s.num_seqs])?;
            let cu = i
                .cu_seqlens_q
                .as_ref()
                .map(|cu| b.upload(cu, &[cu.len()]))
                .transpose()?;
            let out = fresh(dt, &qs)?;
            let len = b.attention_scratch_len(
                i.rows,
                s.num_heads,
                s.head_dim,
                s.table_width,
                s.block_size,
            );
            let scratch = fresh(DType::F32, &[len.max(1)])?;
            b.attention(&Attention {
                q: &q,
                k_cache: &kc,
                v_cache: &vc,
                kv_scale: i.kv8.unwrap_or_default(),
                block_tables: &tables,
                seq_lens: &lens,
                cu_seqlens_q: cu.as_ref(),
                scale: i.scale,
                window: s.window,
                out: &out,
                scratch: &scratch,
            })?;
            vec![attention_out(download_f64(b, &out)?, s.head_dim)]
        }
        Op::Sample(i) => {
            let logits = b.upload(&i.logits, &[i.batch, i.vocab])?;
            let bs = [i.batch];
            let (temperature, top_k) = (b.upload(&i.temperature, &bs)?, b.upload(&i.top_k, &bs)?);
            let (top_p, seeds) = (b.upload(&i.top_p, &bs)?, b.upload(&i.seeds, &bs)?);
            let min_p = b.upload(&i.min_p, &bs)?;
            let out = fresh(DType::I32, &bs)?;
            let pen = match &i.penalties {
                Some(p) => Some((
                    b.upload(&p.counts, &[p.slots, i.vocab])?,
                    b.upload(&p.slot, &bs)?,
                    b.upload(&p.repetition, &bs)?,
                    b.upload(&p.frequency, &bs)?,
                    b.upload(&p.presence, &bs)?,
                )),
                None => None,
            };
            let lp = match &i.logprobs {
                Some((num, n)) => Some((
                    b.upload(num, &bs)?,
                    fresh(DType::F32, &bs)?,
                    fresh(DType::I32, &[i.batch, *n])?,
                    fresh(DType::F32, &[i.batch, *n])?,
                )),
                None => None,
            };
            let target = match &i.target {
                Some(t) => Some(b.upload(t, &bs)?),
                None => None,
            };
            let mask = match &i.mask {
                Some((bits, on, words)) => {
                    Some((b.upload(bits, &[i.batch, *words])?, b.upload(on, &bs)?))
                }
                None => None,
            };
            let params =
                Sampling {
                    temperature: &temperature,
                    top_k: &top_k,
                    top_p: &top_p,
                    min_p: &min_p,
                    seeds: &seeds,
                    penalties: pen.as_ref().map(
                        |(counts, slot, repetition, frequency, presence)| Penalties {
                            counts,
                            slot,
                            repetition,
                            frequency,
                            presence,
                        },
                    ),
                    logprobs: lp
                        .as_ref()
                        .map(|(num, token, top_ids, top)| SampleLogprobs {
                            num,
                            token,
                            top_ids,
                            top,
                            target: target.as_ref(),
                        }),
                    mask: mask.as_ref().map(|(bits, on)| TokenMask { bits, on }),
                };
            b.sample(&logits, &params, &out)?;
            let greedy = greedy_rows(&i.temperature);
            let mut outs = vec![Output::Tokens {
                name: "tokens",
                ids: b.download(&out)?,
                greedy,
            }];
            if let Some((_, token, top_ids, top)) = &lp {
                let token = download_f64(b, token)?;
                let top = download_f64(b, top)?;
                outs.extend(logprob_outputs(i, &token, &b.download(top_ids)?, &top));
            }
            outs
        }
    })
}

/// The f64 reference results of `case` (same order as [`run`]).
pub(crate) fn reference(case: &Case) -> Vec<Output> {
    let dt = case.dtype;
    let q = |v: &[f32]| -> Vec<f64> { quantize(dt, v).into_iter().map(f64::from).collect() };
    match &case.op {
        Op::Embedding(i) => vec![floats(
            "out",
            reference::embedding(&i.ids, &q(&i.table), i.hidden, i.first),
            OpClass::Copy,
        )],
        Op::RmsNorm {
            inputs: i,
            residual,
            ..
        } => {
            let res = residual.then(|| q(&i.residual));
            let (out, res) =
                reference::rms_norm(&q(&i.x), res.as_deref(), &q(&i.weight), i.eps as f64, dt);
            let mut r = vec![floats("out", out, OpClass::Pointwise)];
            if let Some(res) = res {
                r.push(floats("residual", res, OpClass::Pointwise));
            }
            r
        }
        Op::SiluMul(i) => vec![floats(
            "out",
            reference::silu_mul(&q(&i.gate_up), i.inter),
            OpClass::Pointwise,
        )],
        Op::PenaltyCount {
            counts,
            vocab,
            slots,
            tokens,
        } => {
            let mut ids = counts.clone();
            crate::ops::penalty_count_ref(&mut ids, *vocab, slots, tokens);
            vec![exact_ids("counts", ids)]
        }
        Op::UnshardColumns {
            values,
            shards,
            rows,
            cols,
        } => {
            let v = q(values);
            let mut out = Vec::with_capacity(v.len());
            for r in 0..*rows {
                for k in 0..*shards {
                    let at = (k * rows + r) * cols;
                    out.extend_from_slice(&v[at..at + cols]);
                }
            }
            vec![floats("out", out, OpClass::Copy)]
        }
        Op::Matmul { inputs: i, .. } => {
            let bias = i.bias.as_ref().map(|b| q(b));
            let out = reference::matmul(&q(&i.x), &i.w_values(dt), bias.as_deref(), i.m, i.n, i.k);
            vec![floats("out", out, matmul_class(i))]
        }
        Op::MatmulSiluMul(i) => {
            let gate_up = reference::matmul(&q(&i.x), &i.w_values(dt), None, i.m, i.n, i.k);
            // The backends round the product to the dtype before the activation.
            let gate_up: Vec<f64> = gate_up
                .iter()
                .map(|&v| reference::round_to(dt, v))
                .collect();
            let out = reference::silu_mul(&gate_up, i.n / 2);
            vec![floats("out", out, OpClass::Reduction)]
        }
        Op::QkvRope(i) => {
            let (r, kv) = (&i.rope, &i.kv);
            let (hd, rot) = (r.head_dim, r.rot);
            let cs: Vec<f64> = r.cos_sin.iter().map(|&v| v as f64).collect();
            // The q and k inputs are the quantized qkv's own q and k parts.
            let (mut qv, mut kv_) = (q(&r.q), q(&r.k));
            if let Some((qn, kn)) = &i.norms {
                let eps = i.eps as f64;
                qv = reference::rms_norm(&qv, None, &q(qn), eps, dt).0;
                kv_ = reference::rms_norm(&kv_, None, &q(kn), eps, dt).0;
            }
            reference::rope(&mut qv, &r.positions, &cs, hd, rot);
            reference::rope(&mut kv_, &r.positions, &cs, hd, rot);
            let row = r.num_kv_heads * hd;
            if let Some(s) = kv.kv8 {
                // The caches hold E4M3 values; a write stores the dtype's rounding of each
                // value in E4M3 (the scales are powers of two: exact in every dtype).
                let (mut kc, mut vc) = (
                    kv8::through(&kv.k_cache, s.k),
                    kv8::through(&kv.v_cache, s.v),
                );
                let through = |v: &[f64], scale: f32| -> Vec<f64> {
                    let v: Vec<f32> = v
                        .iter()
                        .map(|&x| reference::round_to(dt, x) as f32)
                        .collect();
                    kv8::through(&v, scale)
                };
                let (kw, vw) = (through(&kv_, s.k), through(&q(&kv.v), s.v));
                reference::kv_write(&kw, &vw, &mut kc, &mut vc, &kv.slot_mapping, row);
                return vec![
                    floats("q", qv, OpClass::Pointwise),
                    floats("k_cache", kc, OpClass::Fp8Cache),
                    floats("v_cache", vc, OpClass::Fp8Cache),
                ];
            }
            let (mut kc, mut vc) = (q(&kv.k_cache), q(&kv.v_cache));
            reference::kv_write(&kv_, &q(&kv.v), &mut kc, &mut vc, &kv.slot_mapping, row);
            vec![
                floats("q", qv, OpClass::Pointwise),
                floats("k_cache", kc, OpClass::Pointwise),
                floats("v_cache", vc, OpClass::Copy),
            ]
        }
        Op::Attention(i) => {
            let s = i.shape;
            let (qv, kc, vc) = match i.kv8 {
                Some(sc) => (
                    q(&i.q),
                    kv8::through(&i.k_cache, sc.k),
                    kv8::through(&i.v_cache, sc.v),
                ),
                None => (q(&i.q), q(&i.k_cache), q(&i.v_cache)),
            };
            let out = reference::attention(&reference::AttentionRef {
                q: &qv,
                k_cache: &kc,
                v_cache: &vc,
                block_tables: &i.block_tables,
                seq_lens: &i.seq_lens,
                cu_seqlens_q: i.cu_seqlens_q.as_deref(),
                scale: i.scale as f64,
                window: s.window,
                num_heads: s.num_heads,
                num_kv_heads: s.num_kv_heads,
                head_dim: s.head_dim,
                block_size: s.block_size,
            });
            vec![attention_out(out, s.head_dim)]
        }
        Op::Sample(i) => {
            let r = reference::sample(i);
            let greedy = greedy_rows(&i.temperature);
            let mut outs = vec![Output::Tokens {
                name: "tokens",
                ids: r.ids,
                greedy,
            }];
            if let Some((_, width)) = &i.logprobs {
                let (mut token, mut ids, mut top) = (Vec::new(), Vec::new(), Vec::new());
                for row in &r.logprobs {
                    let (t, entries) = row.clone().unwrap_or((0.0, Vec::new()));
                    token.push(t);
                    let mut entries = entries;
                    entries.resize(*width, (-1, 0.0));
                    ids.extend(entries.iter().map(|e| e.0));
                    top.extend(entries.iter().map(|e| e.1));
                }
                outs.extend(logprob_outputs(i, &token, &ids, &top));
            }
            outs
        }
    }
}

/// Compare `got` with `expected` for `case`; `exact` demands identical results.
pub(crate) fn compare(
    case: &Case,
    got: &[Output],
    expected: &[Output],
    exact: bool,
) -> Vec<CheckResult> {
    let mut results = Vec::new();
    let label = |name: &str| {
        if got.len() > 1 {
            format!("{}: {name}", case.name)
        } else {
            case.name.clone()
        }
    };
    for (g, e) in got.iter().zip(expected) {
        match (g, e) {
            (
                Output::Floats {
                    name,
                    values,
                    class,
                    row_len,
                },
                Output::Floats { values: want, .. },
            ) => {
                let tol = if exact {
                    0.0
                } else {
                    tolerance(*class, case.dtype)
                };
                let err = match row_len {
                    0 => normalized_error(values, want),
                    &len => max_row_error(values, want, len),
                };
                results.push(CheckResult::new(
                    label(name),
                    case.shape.clone(),
                    case.dtype,
                    err,
                    tol,
                ));
            }
            (
                Output::Tokens {
                    name: tokens_name,
                    ids,
                    greedy,
                },
                Output::Tokens { ids: want, .. },
            ) => {
                let (random, exact_rows) = token_mismatches(ids, want, greedy);
                let n_greedy = greedy.iter().filter(|g| **g).count();
                let n_random = greedy.len() - n_greedy;
                let base = if *tokens_name == "tokens" {
                    case.name.clone()
                } else {
                    label(tokens_name)
                };
                if n_greedy > 0 {
                    let name = if n_random > 0 {
                        format!("{base} (greedy rows)")
                    } else {
                        base.clone()
                    };
                    results.push(CheckResult::new(
                        name,
                        case.shape.clone(),
                        case.dtype,
                        exact_rows as f64,
                        0.0,
                    ));
                }
                if n_random > 0 {
                    let tol = if exact {
                        0
                    } else {
                        allowed_sample_mismatches(greedy.len())
                    };
                    let name = format!("{base} (random rows)");
                    let mut r = CheckResult::new(
                        name,
                        case.shape.clone(),
                        case.dtype,
                        random as f64,
                        tol as f64,
                    );
                    if !r.pass {
                        r.note = Some(sample_mismatches(case, ids, want));
                    }
                    results.push(r);
                }
            }
            _ => unreachable!("run and reference produce outputs of the same kinds"),
        }
    }
    results
}

/// The sampled rows where `got` and `want` differ, with their parameters (to tell a
/// draw at a float boundary from a wrong kernel).
fn sample_mismatches(case: &Case, got: &[i32], want: &[i32]) -> String {
    let Op::Sample(i) = &case.op else {
        return String::new();
    };
    let rows: Vec<String> = (0..got.len().min(want.len()))
        .filter(|&r| got[r] != want[r])
        .take(8)
        .map(|r| {
            // Where the draw lands against each pick, as fractions of the kept mass: a
            // pick is right when its interval holds the target.
            let at = |t: i32| {
                usize::try_from(t)
                    .ok()
                    .and_then(|t| reference::draw_interval(i, r, t))
                    .map_or("-".to_string(), |(lo, hi, _)| format!("[{lo:.9}, {hi:.9})"))
            };
            let target = reference::draw_interval(i, r, 0).map_or(f64::NAN, |x| x.2);
            format!(
                "row {r}: got {} {} want {} {}, target {target:.9} (temperature {}, top_k {}, top_p {}, min_p {})",
                got[r],
                at(got[r]),
                want[r],
                at(want[r]),
                i.temperature[r],
                i.top_k[r],
                i.top_p[r],
                i.min_p[r]
            )
        })
        .collect();
    rows.join("; ")
}

/// The tolerance class of a matmul case: FP8 weights with more rows than the quantized
/// gemv takes may run with FP8 activations (the CUDA FP8 GEMM).
fn matmul_class(i: &MatmulInputs) -> OpClass {
    match i.w_format {
        Some(QuantFormat::F8E4M3) if i.m > 4 => OpClass::Fp8Activations,
        _ => OpClass::Reduction,
    }
}
