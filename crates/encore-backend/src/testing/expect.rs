//! What a case should give: the f64 reference's outputs, and how a backend's compare
//! with them (per-dtype tolerances, token mismatches for sampling).

use crate::quant::QuantFormat;

use super::cases::{Case, Op, Output};
use super::compare::{
    allowed_sample_mismatches, max_row_error, normalized_error, token_mismatches, tolerance,
    CheckResult, OpClass,
};
use super::inputs::*;
use super::{kv8, reference};

/// The log-probability outputs of a sample case, from per-row token log-probabilities
/// and `[batch, N]` top ids and log-probabilities: the top entries each row asked for
/// (ids exactly, values as floats) and the token log-probabilities of the greedy rows
/// that asked (a random row may legitimately draw another token on another backend).
pub(super) fn logprob_outputs(
    i: &SampleInputs,
    token: &[f64],
    ids: &[i32],
    top: &[f64],
) -> Vec<Output> {
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
pub(super) fn greedy_rows(temperature: &[f32]) -> Vec<bool> {
    temperature
        .iter()
        .map(|&t| t.is_nan() || t <= 0.0)
        .collect()
}

/// Integer outputs that must match exactly (every entry compared as a greedy token).
pub(super) fn exact_ids(name: &'static str, ids: Vec<i32>) -> Output {
    Output::Tokens {
        name,
        greedy: vec![true; ids.len()],
        ids,
    }
}

pub(super) fn floats(name: &'static str, values: Vec<f64>, class: OpClass) -> Output {
    Output::Floats {
        name,
        values,
        class,
        row_len: 0,
    }
}

/// Attention output, compared per (row, head): rows over long and short contexts differ
/// in scale.
pub(super) fn attention_out(values: Vec<f64>, head_dim: usize) -> Output {
    Output::Floats {
        name: "out",
        values,
        class: OpClass::Reduction,
        row_len: head_dim,
    }
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
            bias,
            residual,
            ..
        } => {
            let res = residual.then(|| q(&i.residual));
            let (x, w, b) = (q(&i.x), q(&i.weight), bias.as_deref().map(q));
            let eps = i.eps as f64;
            let (out, res) = reference::norm(&x, res.as_deref(), &w, b.as_deref(), eps, dt);
            let mut r = vec![floats("out", out, OpClass::Pointwise)];
            if let Some(res) = res {
                r.push(floats("residual", res, OpClass::Pointwise));
            }
            r
        }
        Op::ResidualAdd(i) => {
            let (_, res) = reference::rms_norm(
                &q(&i.x),
                Some(&q(&i.residual)),
                &q(&i.weight),
                i.eps as f64,
                dt,
            );
            let res = res.expect("a residual was given");
            vec![
                floats("out", res.clone(), OpClass::Copy),
                floats("residual", res, OpClass::Copy),
            ]
        }
        Op::NormAddNorm {
            inputs: i,
            x_weight,
            biases,
            plain,
        } => {
            let eps = i.eps as f64;
            let (xb, b) = match biases {
                Some((xb, b)) => (Some(q(xb)), Some(q(b))),
                None => (None, None),
            };
            let (normed, _) = reference::norm(&q(&i.x), None, &q(x_weight), xb.as_deref(), eps, dt);
            let normed: Vec<f64> = normed.iter().map(|&v| reference::round_to(dt, v)).collect();
            let (w, res) = (q(&i.weight), q(&i.residual));
            let (out, res) = reference::norm(&normed, Some(&res), &w, b.as_deref(), eps, dt);
            let res = res.expect("a residual was given");
            let out = if *plain { res.clone() } else { out };
            vec![
                floats("out", out, OpClass::Pointwise),
                floats("residual", res, OpClass::Pointwise),
            ]
        }
        Op::NormColumns {
            inputs: i,
            col0,
            dim,
        } => {
            let mut x = q(&i.x);
            let w = &q(&i.weight)[..*dim];
            for row in x.chunks_mut(i.dim) {
                let cols = &mut row[*col0..*col0 + *dim];
                let (normed, _) = reference::rms_norm(cols, None, w, i.eps as f64, dt);
                cols.copy_from_slice(&normed);
            }
            vec![floats("x", x, OpClass::Pointwise)]
        }
        Op::Scale { values, s, cap } => vec![floats(
            "x",
            q(values)
                .iter()
                .map(|v| {
                    let v = v * *s as f64;
                    cap.map_or(v, |c| c as f64 * (v / c as f64).tanh())
                })
                .collect(),
            OpClass::Pointwise,
        )],
        Op::SiluMul(i) => vec![floats(
            "out",
            reference::act_mul(i.act, &q(&i.gate_up), i.inter),
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
        Op::FillRows { src, rows, dst } => {
            let mut out = dst.clone();
            crate::ops::gather::fill_rows_ref(src, rows, &mut out);
            vec![exact_ids("dst", out)]
        }
        Op::UnshardColumns {
            values,
            shards,
            rows,
            cols,
            width,
        } => {
            let v = q(values);
            let mut out = Vec::with_capacity(rows * width);
            for r in 0..*rows {
                let row = out.len();
                for k in 0..*shards {
                    let at = (k * rows + r) * cols;
                    out.extend_from_slice(&v[at..at + cols]);
                }
                out.truncate(row + width);
            }
            vec![floats("out", out, OpClass::Copy)]
        }
        Op::GatherColumns {
            values,
            rows,
            k,
            perm,
        } => {
            let mut out = vec![0f64; rows * perm.len()];
            crate::ops::gather_columns_ref(&q(values), *k, perm, &mut out);
            vec![floats("out", out, OpClass::Copy)]
        }
        Op::Matmul { inputs: i, .. } => {
            let bias = i.bias.as_ref().map(|b| q(b));
            let out = reference::matmul(&q(&i.x), &i.w_values(dt), bias.as_deref(), i.m, i.n, i.k);
            vec![floats("out", out, matmul_class(i))]
        }
        Op::MatmulActMul(act, i) => {
            let gate_up = reference::matmul(&q(&i.x), &i.w_values(dt), None, i.m, i.n, i.k);
            // The backends round the product to the dtype before the activation.
            let gate_up: Vec<f64> = gate_up
                .iter()
                .map(|&v| reference::round_to(dt, v))
                .collect();
            let out = reference::act_mul(*act, &gate_up, i.n / 2);
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
            let sinks = i.sinks.as_ref().map(|s| q(s));
            let out = reference::attention(&reference::AttentionRef {
                q: &qv,
                k_cache: &kc,
                v_cache: &vc,
                block_tables: &i.block_tables,
                seq_lens: &i.seq_lens,
                cu_seqlens_q: i.cu_seqlens_q.as_deref(),
                scale: i.scale as f64,
                softcap: s.softcap.map(f64::from),
                window: s.window,
                sinks: sinks.as_deref(),
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
pub(super) fn sample_mismatches(case: &Case, got: &[i32], want: &[i32]) -> String {
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
pub(super) fn matmul_class(i: &MatmulInputs) -> OpClass {
    match i.w_format {
        Some(QuantFormat::F8E4M3) if i.m > 4 => OpClass::Fp8Activations,
        _ => OpClass::Reduction,
    }
}
