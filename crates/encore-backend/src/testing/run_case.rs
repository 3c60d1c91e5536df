//! Running a case on a backend: inputs uploaded in their dtypes, outputs poisoned before
//! the op and read back to the host as f64.

use crate::backend::{
    Attention, Backend, Norm, Penalties, QkvRope, SampleLogprobs, Sampling, TokenMask,
};
use crate::error::Result;
use crate::tensor::DType;

use super::cases::{Case, Op, Output};
use super::compare::OpClass;
use super::expect::{attention_out, exact_ids, floats, greedy_rows, logprob_outputs, matmul_class};
use super::host::{download_f64, poison};
use super::inputs::*;
use super::kv8;

/// Upload the weight of matmul inputs: quantized when they say so (marked one scale a row
/// when its rows are, and given what `prepare_weight` adds, as the model loader does), else
/// in `dt`.
fn upload_w(b: &dyn Backend, i: &MatmulInputs, dt: DType) -> Result<crate::tensor::Tensor> {
    match i.w_format {
        Some(fmt) => {
            let w = b.alloc(DType::Q(fmt), &[i.n, i.k])?;
            let bytes = i.w_bytes(fmt);
            b.write_bytes(&w, &bytes)?;
            let w = if crate::quant::rows_share_one_scale(fmt, i.k, &bytes) {
                w.with_row_scale()
            } else {
                w
            };
            b.prepare_weight(w)
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
            bias,
            residual,
            in_place,
        } => {
            let shape = [i.rows, i.dim];
            let x = f(&i.x, &shape)?;
            let w = f(&i.weight, &[i.dim])?;
            let bias = bias.as_ref().map(|b| f(b, &[i.dim])).transpose()?;
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
            b.rms_norm(&x, res.as_ref(), Norm::new(&w, bias.as_ref()), i.eps, &out)?;
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
        Op::ResidualAdd(i) => {
            let shape = [i.rows, i.dim];
            let (x, res, out) = (
                f(&i.x, &shape)?,
                f(&i.residual, &shape)?,
                fresh(dt, &shape)?,
            );
            b.residual_add(&x, &res, &out)?;
            vec![
                floats("out", download_f64(b, &out)?, OpClass::Copy),
                floats("residual", download_f64(b, &res)?, OpClass::Copy),
            ]
        }
        Op::NormAddNorm {
            inputs: i,
            x_weight,
            biases,
            plain,
        } => {
            let shape = [i.rows, i.dim];
            let (x, res, out) = (
                f(&i.x, &shape)?,
                f(&i.residual, &shape)?,
                fresh(dt, &shape)?,
            );
            let (xw, w) = (f(x_weight, &[i.dim])?, f(&i.weight, &[i.dim])?);
            let (xb, wb) = match biases {
                Some((xb, wb)) => (Some(f(xb, &[i.dim])?), Some(f(wb, &[i.dim])?)),
                None => (None, None),
            };
            let x_norm = Norm::new(&xw, xb.as_ref());
            let norm = (!*plain).then(|| Norm::new(&w, wb.as_ref()));
            b.norm_add_norm(&x, x_norm, &res, norm, i.eps, &out)?;
            vec![
                floats("out", download_f64(b, &out)?, OpClass::Pointwise),
                floats("residual", download_f64(b, &res)?, OpClass::Pointwise),
            ]
        }
        Op::NormColumns {
            inputs: i,
            col0,
            dim,
        } => {
            let x = f(&i.x, &[i.rows, i.dim])?;
            let w = f(&i.weight[..*dim], &[*dim])?;
            b.rms_norm_columns(&x, *col0, &w, i.eps)?;
            vec![floats("x", download_f64(b, &x)?, OpClass::Pointwise)]
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
        Op::FillRows { src, rows, dst } => {
            let s = b.upload(src, &[src.len()])?;
            let r = b.upload(rows, &[rows.len()])?;
            let d = b.upload(dst, &[dst.len()])?;
            b.fill_rows(&s, &r, &d)?;
            vec![exact_ids("dst", b.download::<i32>(&d)?)]
        }
        Op::UnshardColumns {
            values,
            shards,
            rows,
            cols,
            width,
        } => {
            let src = f(values, &[*shards, *rows, *cols])?;
            let out = fresh(dt, &[*rows, *width])?;
            b.unshard_columns(&src, &out)?;
            vec![floats("out", download_f64(b, &out)?, OpClass::Copy)]
        }
        Op::GatherColumns {
            values,
            rows,
            k,
            perm,
        } => {
            let x = f(values, &[*rows, *k])?;
            let p = b.upload(perm, &[perm.len()])?;
            let out = fresh(dt, &[*rows, perm.len()])?;
            b.gather_columns(&x, &p, &out)?;
            vec![floats("out", download_f64(b, &out)?, OpClass::Copy)]
        }
        Op::Scale { values, s, cap } => {
            let x = f(values, &[values.len()])?;
            match cap {
                Some(c) => b.softcap(&x, *c)?,
                None => b.scale(&x, *s)?,
            }
            vec![floats("x", download_f64(b, &x)?, OpClass::Pointwise)]
        }
        Op::SiluMul(i) => {
            let gu = f(&i.gate_up, &[i.n, 2 * i.inter])?;
            let out = fresh(dt, &[i.n, i.inter])?;
            b.act_mul(i.act, &gu, &out)?;
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
        Op::MatmulActMul(act, i) => {
            let x = f(&i.x, &[i.m, i.k])?;
            let w = upload_w(b, i, dt)?;
            let gate_up = fresh(dt, &[i.m, i.n])?;
            let out = fresh(dt, &[i.m, i.n / 2])?;
            b.matmul_act_mul(*act, &x, &w, &gate_up, &out)?;
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
            let sinks = i.sinks.as_ref().map(|v| f(v, &[s.num_heads])).transpose()?;
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
                softcap: s.softcap,
                window: s.window,
                sinks: sinks.as_ref(),
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
