//! gpt-oss's variants on the CPU: attention sinks by hand, the clamped SwiGLU
//! (`Activation::SwigluOai`) against transformers' formula across its clamps, and the
//! experts with biases and that activation against an f64 reference of
//! `GptOssTopKRouter` and `GptOssExperts`.

use super::*;
use encore_backend::backend::{Activation, MoeBias, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT};

/// transformers' `GptOssExperts._apply_gate` of one gate/up pair, in f64.
fn apply_gate(g: f64, u: f64) -> f64 {
    let (limit, alpha) = (SWIGLU_OAI_LIMIT as f64, SWIGLU_OAI_ALPHA as f64);
    let g = g.min(limit);
    let u = u.max(-limit).min(limit);
    (u + 1.0) * (g * (1.0 / (1.0 + (-g * alpha).exp())))
}

/// A sink is one more logit in the softmax whose probability is dropped: one key of score
/// `x` and a sink `s` give `v e^x / (e^x + e^s)`; a sink of -inf changes nothing; a row
/// that sees no key stays zero.
#[test]
fn attention_sinks_by_hand() {
    let be = cpu();
    // One block of 2 slots, 2 heads over 1 KV head of dim 2; keys [1, 0] and [0, 1].
    let kc = be.upload(&[1.0f32, 0.0, 0.0, 1.0], &[1, 2, 1, 2]).unwrap();
    let vc = be.upload(&[2.0f32, 4.0, 6.0, 8.0], &[1, 2, 1, 2]).unwrap();
    let run = |q: &[f32], len: i32, sinks: Option<[f32; 2]>| -> Vec<f32> {
        let q = be.upload(q, &[1, 2, 2]).unwrap();
        let tables = be.upload(&[0i32], &[1, 1]).unwrap();
        let lens = be.upload(&[len], &[1]).unwrap();
        let sinks = sinks.map(|s| be.upload(&s, &[2]).unwrap());
        let out = be.upload(&[f32::NAN; 4], &[1, 2, 2]).unwrap();
        let scratch = be.alloc(DType::F32, &[1]).unwrap();
        be.attention(&Attention {
            q: &q,
            k_cache: &kc,
            v_cache: &vc,
            kv_scale: KvScale::ONE,
            block_tables: &tables,
            seq_lens: &lens,
            cu_seqlens_q: None,
            scale: 1.0,
            softcap: None,
            window: None,
            sinks: sinks.as_ref(),
            out: &out,
            scratch: &scratch,
        })
        .unwrap();
        be.download::<f32>(&out).unwrap()
    };
    // One key (score 1 for head 0, 0.5 for head 1), sinks 0 and 3.
    let out = run(&[1.0, 0.0, 0.5, 0.0], 1, Some([0.0, 3.0]));
    let p0 = 1f64.exp() / (1f64.exp() + 1.0);
    let p1 = 0.5f64.exp() / (0.5f64.exp() + 3f64.exp());
    let want = [2.0 * p0, 4.0 * p0, 2.0 * p1, 4.0 * p1];
    for (g, w) in out.iter().zip(want) {
        assert!((*g as f64 - w).abs() < 1e-6, "{out:?} vs {want:?}");
    }
    // Two keys: scores 1 and 0 (head 0), sink 2.
    let out = run(&[1.0, 0.0, 1.0, 0.0], 2, Some([2.0, f32::NEG_INFINITY]));
    let (a, b, s) = (1f64.exp(), 1.0, 2f64.exp());
    let want0 = [
        (2.0 * a + 6.0 * b) / (a + b + s),
        (4.0 * a + 8.0 * b) / (a + b + s),
    ];
    for (g, w) in out[..2].iter().zip(want0) {
        assert!((*g as f64 - w).abs() < 1e-6, "{out:?}");
    }
    // A sink of -inf is no sink at all.
    assert_eq!(out[2..], run(&[1.0, 0.0, 1.0, 0.0], 2, None)[2..]);
    // A large sink takes nearly all the mass (finite, no overflow).
    let out = run(&[1.0, 0.0, 1.0, 0.0], 2, Some([80.0, 80.0]));
    assert!(
        out.iter().all(|v| v.is_finite() && v.abs() < 1e-20),
        "{out:?}"
    );
    // No key: zeros whatever the sink.
    assert_eq!(
        run(&[1.0, 0.0, 1.0, 0.0], 0, Some([1.0, 1.0])),
        vec![0.0; 4]
    );
}

/// `act_mul` of the clamped SwiGLU over gates and ups across both clamps (-12..12) is
/// transformers' formula within f32 rounding.
#[test]
fn swiglu_oai_matches_transformers_across_its_clamps() {
    let be = cpu();
    let inter = 97;
    let rows = 5;
    let mut gu = Vec::new();
    for r in 0..rows {
        for j in 0..2 * inter {
            gu.push(-12.0 + 24.0 * ((j * 31 + r * 17) % 193) as f32 / 192.0);
        }
    }
    let x = be.upload(&gu, &[rows, 2 * inter]).unwrap();
    let out = be.alloc(DType::F32, &[rows, inter]).unwrap();
    be.act_mul(Activation::SwigluOai, &x, &out).unwrap();
    let got = be.download::<f32>(&out).unwrap();
    let mut clamped = (0, 0);
    for r in 0..rows {
        for j in 0..inter {
            let (g, u) = (
                gu[r * 2 * inter + j] as f64,
                gu[r * 2 * inter + inter + j] as f64,
            );
            clamped.0 += usize::from(g > 7.0);
            clamped.1 += usize::from(u.abs() > 7.0);
            let want = apply_gate(g, u);
            let err = (got[r * inter + j] as f64 - want).abs();
            assert!(
                err <= 1e-6 * (1.0 + want.abs()),
                "g {g} u {u}: {} vs {want}",
                got[r * inter + j]
            );
            let f64_err = (Activation::SwigluOai.gated_f64(g, u) - want).abs();
            assert!(f64_err <= 1e-12 * (1.0 + want.abs()), "f64: g {g} u {u}");
        }
    }
    assert!(clamped.0 > 20 && clamped.1 > 40, "{clamped:?}");
}

/// `moe` with the experts' biases and the clamped SwiGLU against an f64 reference of
/// gpt-oss's router (the softmax of the top k logits) and experts (`x W + b`, each
/// product rounded to the dtype), with gate/up large enough that the clamps bite.
#[test]
fn moe_with_biases_and_the_clamped_swiglu_matches_the_f64_reference() {
    use encore_backend::testing::inputs::{normal, rng};
    use encore_backend::testing::reference::round_to;
    for (c, dt) in [DType::F32, DType::BF16].into_iter().enumerate() {
        let (n, h, e, i, k) = (4, 24, 5, 10, 3);
        let mut g = rng(77 + c as u64);
        let exact = |v: Vec<f32>| -> Vec<f32> {
            v.iter().map(|&x| round_to(dt, x as f64) as f32).collect()
        };
        let x = exact(normal(&mut g, n * h, 1.0));
        let logits: Vec<f32> = (0..n * e)
            .map(|j| ((j * 3) % e) as f32 * 0.5 + 0.1)
            .collect();
        let gu = exact(normal(&mut g, 2 * e * i * h, 4.0 / (h as f32).sqrt()));
        let dn = exact(normal(&mut g, e * h * i, 1.0 / (i as f32).sqrt()));
        let gub = exact(normal(&mut g, 2 * e * i, 1.0));
        let dnb = exact(normal(&mut g, e * h, 1.0));
        let up = |v: &[f32], s: &[usize]| be_upload(v, s, dt);
        let be = cpu();
        let be_ref = be.as_ref();
        let (xt, gut, dnt) = (
            up(&x, &[n, h]),
            up(&gu, &[2 * e * i, h]),
            up(&dn, &[e * h, i]),
        );
        let (gubt, dnbt) = (up(&gub, &[2 * e * i]), up(&dnb, &[e * h]));
        let lt = be_ref.upload(&logits, &[n, e]).unwrap();
        let ids = be_ref.alloc(DType::I32, &[n, k]).unwrap();
        let wts = be_ref.alloc(DType::F32, &[n, k]).unwrap();
        let out = be_ref.alloc(dt, &[n, h]).unwrap();
        let scratch = be_ref.alloc(dt, &[n * k, i]).unwrap();
        let work = be_ref.alloc(DType::I32, &[1]).unwrap();
        be_ref
            .moe(&encore_backend::Moe {
                act: Activation::SwigluOai,
                bias: Some(MoeBias {
                    gate_up: &gubt,
                    down: &dnbt,
                }),
                x: &xt,
                logits: &lt,
                top_k: k,
                renormalize: true,
                gate_up: &gut,
                down: &dnt,
                ids: &ids,
                weights: &wts,
                out: &out,
                scratch: &scratch,
                workspace: &work,
                cache: None,
            })
            .unwrap();
        let got = be_ref.download_f32(&out).unwrap();
        let r = |v: f64| round_to(dt, v);
        let (mut want, mut clamps) = (Vec::new(), 0);
        for t in 0..n {
            // GptOssTopKRouter: top k of the logits, then their softmax.
            let l = &logits[t * e..(t + 1) * e];
            let mut order: Vec<usize> = (0..e).collect();
            order.sort_by(|&a, &b| l[b].total_cmp(&l[a]).then(a.cmp(&b)));
            let top = &order[..k];
            let mx = l[top[0]] as f64;
            let z: f64 = top.iter().map(|&j| (l[j] as f64 - mx).exp()).sum();
            let xv = &x[t * h..(t + 1) * h];
            let dot = |w: &[f32], v: &[f64]| -> f64 {
                w.iter().zip(v).map(|(&a, &b)| a as f64 * b).sum()
            };
            let xf: Vec<f64> = xv.iter().map(|&v| v as f64).collect();
            let mut acc = vec![0f64; h];
            for &ex in top {
                let wgt = (l[ex] as f64 - mx).exp() / z;
                let act: Vec<f64> = (0..i)
                    .map(|j| {
                        let gr = (ex * i + j) * h;
                        let ur = ((e + ex) * i + j) * h;
                        let gv = r(dot(&gu[gr..gr + h], &xf) + gub[ex * i + j] as f64);
                        let uv = r(dot(&gu[ur..ur + h], &xf) + gub[(e + ex) * i + j] as f64);
                        clamps += usize::from(gv > 7.0 || uv.abs() > 7.0);
                        r(apply_gate(gv, uv))
                    })
                    .collect();
                for (o, a) in acc.iter_mut().enumerate() {
                    let row = &dn[(ex * h + o) * i..(ex * h + o + 1) * i];
                    *a += wgt * r(dot(row, &act) + dnb[ex * h + o] as f64);
                }
            }
            want.extend(acc.into_iter().map(r));
        }
        assert!(clamps > 0, "no value reached a clamp");
        let got: Vec<f64> = got.iter().map(|&v| v as f64).collect();
        let err = compare::normalized_error(&got, &want);
        let tol = compare::tolerance(compare::OpClass::Reduction, dt);
        assert!(err <= tol, "{dt}: normalised error {err:.3e} > {tol:.1e}");
    }
}

/// `v` uploaded in `dt` on a fresh CPU backend's memory (CPU tensors are host memory, so
/// any CPU backend reads them).
fn be_upload(v: &[f32], shape: &[usize], dt: DType) -> Tensor {
    cpu().upload_f32_as(v, shape, dt).unwrap()
}
