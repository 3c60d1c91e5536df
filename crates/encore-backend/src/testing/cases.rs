//! The op cases every check runs: one list of (op, inputs, dtype) and the builders of its
//! parts (`run_case.rs` runs a case on a backend, `expect.rs` computes it with the f64
//! reference and compares two results of a case).

use crate::quant::QuantFormat;
use crate::tensor::DType;

use super::case_builders::{
    attention_shape, fp8_cache_cases, marlin_matmul_cases, push_attention, push_qkv_rope,
};
use super::compare::OpClass;
use super::inputs::*;

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
    /// `rms_norm`: RMSNorm, or LayerNorm with `bias`.
    RmsNorm {
        inputs: RmsNormInputs,
        bias: Option<Vec<f32>>,
        residual: bool,
        in_place: bool,
    },
    /// `residual_add` (no norm; the inputs' weight unused).
    ResidualAdd(RmsNormInputs),
    /// `norm_add_norm`: x normed by `x_weight`, added to the residual, then normed by the
    /// inputs' weight (or not, `plain`); with `biases` (x's, the inputs') both norms are
    /// LayerNorms.
    NormAddNorm {
        inputs: RmsNormInputs,
        x_weight: Vec<f32>,
        biases: Option<(Vec<f32>, Vec<f32>)>,
        plain: bool,
    },
    /// `rms_norm_columns`: the inputs' `dim` is the row (`ld`); columns `col0 .. col0 +
    /// dim` are normed by the first `dim` weights.
    NormColumns {
        inputs: RmsNormInputs,
        col0: usize,
        dim: usize,
    },
    SiluMul(SiluMulInputs),
    /// `scale` of `values` by `s` in place, or `softcap` at `cap` (then `s` is 1).
    Scale {
        values: Vec<f32>,
        s: f32,
        cap: Option<f32>,
    },
    /// `penalty_count` into a `[rows, vocab]` table (repeated and out-of-table pairs
    /// among them).
    PenaltyCount {
        counts: Vec<i32>,
        vocab: usize,
        slots: Vec<i32>,
        tokens: Vec<i32>,
    },
    /// `unshard_columns` of `[shards, rows, cols]` values (a pure copy) into `width`
    /// columns (`shards * cols`, or fewer: a padded vocabulary's last columns dropped).
    UnshardColumns {
        values: Vec<f32>,
        shards: usize,
        rows: usize,
        cols: usize,
        width: usize,
    },
    /// `fill_rows`: `dst[t] = src[rows[t]]` where `rows[t]` is in range, else `dst[t]`
    /// kept (asynchronous scheduling's decode ids taken from the step before).
    FillRows {
        src: Vec<i32>,
        rows: Vec<i32>,
        dst: Vec<i32>,
    },
    /// `gather_columns` of `[rows, k]` values by `perm` (a GPTQ act-order permutation, with
    /// out-of-range entries that write 0).
    GatherColumns {
        values: Vec<f32>,
        rows: usize,
        k: usize,
        perm: Vec<i32>,
    },
    Matmul {
        inputs: MatmulInputs,
        out_f32: bool,
    },
    QkvRope(QkvRopeInputs),
    /// `n` of the inputs is `2 * inter`.
    /// `matmul_act_mul` with the activation.
    MatmulActMul(crate::args::Activation, MatmulInputs),
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
    // The soft-capping cases' own inputs (the others keep theirs).
    let mut extra_scale = self::rng(seed ^ 0x50f7_ca95);
    // The mixed-input GEMM's matmuls' own inputs.
    let mut marlin = self::rng(seed ^ 0x3a21_1e48);
    // The column gathers' own inputs (the others keep theirs).
    let mut extra_gather = self::rng(seed ^ 0x9a7e_0c01);
    // The row fills' own inputs.
    let mut extra_fill = self::rng(seed ^ 0xf111_4075);
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
        // RMSNorm, then LayerNorm with a bias (StableLM; also at an odd width, its inputs
        // offset from zero so that the mean matters): aligned (vectorised) and not.
        let norm_shapes: [&[(usize, usize)]; 2] = [
            &[(5, 64), (3, 200), (1, 1000)],
            &[(5, 64), (3, 200), (2, 201), (1, 1000)],
        ];
        for (layer, shapes) in [false, true].into_iter().zip(norm_shapes) {
            let kind = if layer { "layer_norm" } else { "rms_norm" };
            for &(rows, dim) in shapes {
                for (residual, in_place) in
                    [(false, false), (true, false), (false, true), (true, true)]
                {
                    let name = match (residual, in_place) {
                        (false, false) => kind.to_string(),
                        (true, false) => format!("{kind}(residual)"),
                        (false, true) => format!("{kind}(out=x)"),
                        (true, true) => format!("{kind}(residual, out=x)"),
                    };
                    let mut inputs = RmsNormInputs::random(rng, rows, dim);
                    let bias = layer.then(|| {
                        inputs.x.iter_mut().for_each(|v| *v += 2.0);
                        normal(rng, dim, 0.5)
                    });
                    push(
                        name,
                        format!("rows={rows} d={dim}"),
                        dtype,
                        Op::RmsNorm {
                            inputs,
                            bias,
                            residual,
                            in_place,
                        },
                    );
                }
            }
        }
        for (rows, dim) in [(5, 64), (3, 201)] {
            let inputs = RmsNormInputs::random(rng, rows, dim);
            let shape = format!("rows={rows} d={dim}");
            push("residual_add".into(), shape, dtype, Op::ResidualAdd(inputs));
        }
        for (rows, dim) in [(5, 64), (3, 200), (2, 201)] {
            for plain in [false, true] {
                let inputs = RmsNormInputs::random(rng, rows, dim);
                let x_weight = RmsNormInputs::random(rng, 1, dim).weight;
                push(
                    format!("norm_add_norm{}", if plain { "(plain)" } else { "" }),
                    format!("rows={rows} d={dim}"),
                    dtype,
                    Op::NormAddNorm {
                        inputs,
                        x_weight,
                        biases: None,
                        plain,
                    },
                );
            }
            // Both norms LayerNorms (the backends' unfused path).
            let inputs = RmsNormInputs::random(rng, rows, dim);
            let x_weight = RmsNormInputs::random(rng, 1, dim).weight;
            let biases = Some((normal(rng, dim, 0.5), normal(rng, dim, 0.5)));
            push(
                "norm_add_norm(layer_norm)".into(),
                format!("rows={rows} d={dim}"),
                dtype,
                Op::NormAddNorm {
                    inputs,
                    x_weight,
                    biases,
                    plain: false,
                },
            );
        }
        // OLMo 2's q and k norms on fused q/k/v rows: aligned (vectorised) and not.
        for (rows, ld, col0, dim) in [
            (4, 200, 0, 120),
            (3, 200, 120, 40),
            (2, 1024, 512, 256),
            (3, 201, 7, 130),
        ] {
            let inputs = RmsNormInputs::random(rng, rows, ld);
            push(
                "rms_norm_columns".into(),
                format!("rows={rows} ld={ld} cols={col0}+{dim}"),
                dtype,
                Op::NormColumns { inputs, col0, dim },
            );
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
        // Asynchronous scheduling's decode ids: rows of the step before (some -1, some
        // past its samples), over a step of 1 and one of 300 rows.
        if dtype == DType::F32 {
            use rand::Rng;
            let rng = &mut extra_fill;
            for (s, n) in [(1usize, 1usize), (257, 300)] {
                let src: Vec<i32> = (0..s).map(|_| rng.random_range(0..200_000)).collect();
                let rows: Vec<i32> = (0..n).map(|_| rng.random_range(-2..s as i32 + 2)).collect();
                let dst: Vec<i32> = (0..n).map(|_| rng.random_range(0..200_000)).collect();
                push(
                    "fill_rows".into(),
                    format!("s={s} n={n}"),
                    DType::I32,
                    Op::FillRows { src, rows, dst },
                );
            }
        }
        // EAGLE's side-by-side hidden states (2 or 3 blocks), a vocabulary shard's logits,
        // a padded vocabulary's (301 over 4 shards of 76, 255 over 2 of 128).
        for (shards, rows, cols, width) in [
            (2, 5, 64, 128),
            (3, 7, 33, 99),
            (4, 1, 250, 1000),
            (4, 3, 76, 301),
            (2, 1, 128, 255),
        ] {
            push(
                "unshard_columns".into(),
                format!("shards={shards} rows={rows} cols={cols} width={width}"),
                dtype,
                Op::UnshardColumns {
                    values: normal(rng, shards * rows * cols, 1.0),
                    shards,
                    rows,
                    cols,
                    width,
                },
            );
        }
        // A GPTQ act-order projection's input in its weight's column order: whole
        // permutations (one row, decode; 37 rows, odd k), and one with out-of-range entries.
        for (rows, k, n, junk) in [
            (1, 4096, 4096, false),
            (37, 1000, 1000, false),
            (5, 96, 130, true),
        ] {
            use rand::Rng;
            let rng = &mut extra_gather;
            let mut perm: Vec<i32> = (0..n as i32).map(|j| j % k as i32).collect();
            for j in (1..n).rev() {
                perm.swap(j, rng.random_range(0..=j));
            }
            if junk {
                perm[3] = -1;
                perm[n - 1] = k as i32;
            }
            push(
                "gather_columns".into(),
                format!("rows={rows} k={k} n={n}"),
                dtype,
                Op::GatherColumns {
                    values: normal(rng, rows * k, 1.0),
                    rows,
                    k,
                    perm,
                },
            );
        }
        // Gemma's embedding scale, sqrt(hidden), as the run dtype rounds it.
        for (n, s) in [(7 * 96, 9.797_959), (1000, 45.25)] {
            push(
                "scale".into(),
                format!("n={n} s={s}"),
                dtype,
                Op::Scale {
                    values: normal(rng, n, 1.0),
                    s,
                    cap: None,
                },
            );
        }
        // Gemma 2's final logit soft-capping (30), on logits around it.
        for n in [1000, 7 * 96] {
            push(
                "softcap".into(),
                format!("n={n} cap=30"),
                dtype,
                Op::Scale {
                    values: normal(&mut extra_scale, n, 40.0),
                    s: 1.0,
                    cap: Some(30.0),
                },
            );
        }
        for (n, inter) in [(5, 100), (1, 257)] {
            for act in crate::args::Activation::ALL {
                let inputs = SiluMulInputs {
                    act,
                    ..SiluMulInputs::random(rng, n, inter)
                };
                let name = match act {
                    crate::args::Activation::Silu => "silu_mul".to_string(),
                    other => format!("act_mul {}", other.hf_name()),
                };
                push(
                    name,
                    format!("n={n} inter={inter}"),
                    dtype,
                    Op::SiluMul(inputs),
                );
            }
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
        // One row with k a multiple of 8 takes CUDA's fused gemv (the activation in its
        // epilogue); the others matmul + act_mul.
        use crate::args::Activation;
        for (m, k, inter) in [(1, 264, 70), (1, 1032, 129), (1, 100, 33), (3, 264, 70)] {
            for act in [Activation::Silu, Activation::GeluTanh] {
                push(
                    format!("matmul_act_mul {}", act.hf_name()),
                    format!("m={m} k={k} inter={inter}"),
                    dtype,
                    Op::MatmulActMul(act, MatmulInputs::random(rng, m, k, 2 * inter, false)),
                );
            }
        }
        // The other activations through the fused gemv.
        for act in [Activation::Gelu, Activation::Relu2] {
            let (m, k, inter) = (1, 264, 70);
            push(
                format!("matmul_act_mul {}", act.hf_name()),
                format!("m={m} k={k} inter={inter}"),
                dtype,
                Op::MatmulActMul(act, MatmulInputs::random(rng, m, k, 2 * inter, false)),
            );
        }
        quantized_matmul_cases(&mut extra, dtype, &mut push);
        marlin_matmul_cases(&mut marlin, dtype, &mut push);
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
        // Logit soft-capping (Gemma 2), at a cap low enough to bend every score: the
        // tensor-core decode and prefill kernels (head_dim 64, 128), the split kernel
        // (head_dim 96) and a long context (split-K), over a cache of the dtype and FP8.
        let softcap_shapes: [AttentionCase; 3] = [
            (6, 4, 2, 64, 16, 4, 6, FULL),
            (4, 6, 2, 96, 16, 3, 6, &[Some(9)]),
            (5, 8, 2, 128, 16, 64, 40, FULL),
        ];
        for prefill in [false, true] {
            for case in &softcap_shapes {
                for kv8 in [None, Some(super::kv8::CASE_SCALE)] {
                    let shape = AttentionShape {
                        softcap: Some(2.0),
                        ..attention_shape(case, prefill, case.7[0])
                    };
                    push_attention(&mut extra_scale, shape, kv8, dtype, &mut push);
                }
            }
        }
        // Attention sinks (gpt-oss): the same kernels' shapes and a window, over a cache of
        // the dtype and FP8, from their own generator.
        let mut sink_rng = self::rng(seed ^ 0x5157_0a11);
        let sink_shapes: [AttentionCase; 4] = [
            (6, 4, 2, 64, 16, 4, 6, FULL),
            (4, 6, 2, 96, 16, 3, 6, &[Some(9)]),
            (5, 8, 2, 128, 16, 64, 40, FULL),
            (5, 4, 1, 64, 16, 64, 40, &[Some(7)]),
        ];
        for prefill in [false, true] {
            for case in &sink_shapes {
                for kv8 in [None, Some(super::kv8::CASE_SCALE)] {
                    let shape = AttentionShape {
                        sinks: true,
                        ..attention_shape(case, prefill, case.7[0])
                    };
                    push_attention(&mut sink_rng, shape, kv8, dtype, &mut push);
                }
            }
        }
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
        for (m, blocks, inter, act) in [
            (1, 4, 70, crate::args::Activation::Silu),
            (2, 1, 33, crate::args::Activation::Silu),
            (1, 4, 70, crate::args::Activation::GeluTanh),
        ] {
            let k = blocks * b;
            push(
                format!("matmul_act_mul {}({fmt})", act.hf_name()),
                format!("m={m} k={k} inter={inter}"),
                dtype,
                Op::MatmulActMul(
                    act,
                    MatmulInputs::quantized(rng, m, k, 2 * inter, false, fmt),
                ),
            );
        }
    }
}
