//! The mixture-of-experts op and the expert cache on the CPU: against an f64 reference of
//! transformers' routing and experts, ties, operand checks, the cache's fills, evictions
//! and prefetch plans.

use super::*;

/// `n` seeded samples (normal, std 0.5: the shared test inputs' generator).
fn uniform(n: usize, seed: u64) -> Vec<f32> {
    encore_backend::testing::inputs::normal(&mut encore_backend::testing::inputs::rng(seed), n, 0.5)
}

/// One MoE case: (dtype, weight format, tokens, hidden, experts, expert width, top_k,
/// renormalise).
type MoeCase = (
    DType,
    Option<encore_backend::quant::QuantFormat>,
    usize,
    usize,
    usize,
    usize,
    usize,
    bool,
);

/// `moe` against an f64 reference of transformers' routing and experts (softmax, top k,
/// renormalised or not; each product rounded to the dtype where the backend stores it),
/// dense and quantized experts; the routing exactly, the output within the matmul
/// tolerance of the dtype.
#[test]
fn moe_matches_the_f64_reference() {
    use encore_backend::quant::{self, QuantFormat};
    use encore_backend::testing::reference::round_to;
    let cases: [MoeCase; 5] = [
        (DType::F32, None, 5, 64, 6, 40, 2, true),
        (DType::BF16, None, 3, 96, 4, 24, 3, false),
        (DType::F32, None, 2, 32, 8, 16, 8, false),
        (DType::F16, None, 4, 64, 5, 32, 1, true),
        (DType::BF16, Some(QuantFormat::Q8_0), 3, 64, 4, 32, 2, true),
    ];
    let be = cpu();
    for (c, &(dt, fmt, n, h, e, i, k, renorm)) in cases.iter().enumerate() {
        let seed = 100 * c as u64;
        let exact = |v: Vec<f32>| -> Vec<f32> {
            v.iter().map(|&x| round_to(dt, x as f64) as f32).collect()
        };
        let x = exact(uniform(n * h, seed));
        // Logits far apart within a row, so the top k are not a near tie.
        let logits: Vec<f32> = (0..n * e)
            .map(|j| ((j * 7 + c) % e) as f32 * 0.37 + 0.01 * uniform(1, seed + j as u64)[0])
            .collect();
        let scale = |v: Vec<f32>, fan_in: usize| -> Vec<f32> {
            v.iter().map(|x| x / (fan_in as f32).sqrt()).collect()
        };
        let gu = scale(uniform(2 * e * i * h, seed + 1), h);
        let dn = scale(uniform(e * h * i, seed + 2), i);
        // The weights as the backend holds them, and their values.
        let (gu_t, gu_v, dn_t, dn_v) = match fmt {
            None => {
                let (g, d) = (exact(gu), exact(dn));
                (
                    be.upload_f32_as(&g, &[2 * e * i, h], dt).unwrap(),
                    g,
                    be.upload_f32_as(&d, &[e * h, i], dt).unwrap(),
                    d,
                )
            }
            Some(f) => {
                let q = |v: &[f32], rows: usize, cols: usize| {
                    let mut bytes = vec![0u8; f.bytes(rows, cols).unwrap()];
                    quant::quantize_rows(f, v, cols, &mut bytes);
                    let t = be.alloc(DType::Q(f), &[rows, cols]).unwrap();
                    be.write_bytes(&t, &bytes).unwrap();
                    let rb = f.row_bytes(cols).unwrap();
                    let mut vals = vec![0f32; rows * cols];
                    for (r, out) in vals.chunks_exact_mut(cols).enumerate() {
                        quant::dequantize_row(f, &bytes[r * rb..(r + 1) * rb], out);
                    }
                    (t, vals)
                };
                let (g, gv) = q(&gu, 2 * e * i, h);
                let (d, dv) = q(&dn, e * h, i);
                (g, gv, d, dv)
            }
        };
        let xt = be.upload_f32_as(&x, &[n, h], dt).unwrap();
        let lt = be.upload(&logits, &[n, e]).unwrap();
        let ids = be.alloc(DType::I32, &[n, k]).unwrap();
        let wts = be.alloc(DType::F32, &[n, k]).unwrap();
        let out = be.alloc(dt, &[n, h]).unwrap();
        let scratch = be.alloc(dt, &[n * k, i]).unwrap();
        // The CPU backend needs no workspace.
        assert_eq!(be.moe_workspace_bytes(n, h, e, k, dt), 0);
        let work = be.alloc(DType::I32, &[1]).unwrap();
        be.moe(&encore_backend::Moe {
            act: encore_backend::backend::Activation::Silu,
            bias: None,
            x: &xt,
            logits: &lt,
            top_k: k,
            renormalize: renorm,
            gate_up: &gu_t,
            down: &dn_t,
            ids: &ids,
            weights: &wts,
            out: &out,
            scratch: &scratch,
            workspace: &work,
            cache: None,
        })
        .unwrap();
        let (got_ids, got_w) = (
            be.download::<i32>(&ids).unwrap(),
            be.download::<f32>(&wts).unwrap(),
        );
        let got = be.download_f32(&out).unwrap();
        let r = |v: f64| round_to(dt, v);
        let mut want = Vec::new();
        for t in 0..n {
            let l: Vec<f64> = logits[t * e..(t + 1) * e]
                .iter()
                .map(|&v| v as f64)
                .collect();
            let mx = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = l.iter().map(|v| (v - mx).exp()).collect();
            let s: f64 = p.iter().sum();
            let mut order: Vec<usize> = (0..e).collect();
            order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
            let top = &order[..k];
            let total: f64 = top.iter().map(|&j| p[j] / s).sum();
            let xr = &x[t * h..(t + 1) * h];
            let mut acc = vec![0f64; h];
            for (slot, &ex) in top.iter().enumerate() {
                let w = p[ex] / s / if renorm { total } else { 1.0 };
                assert_eq!(
                    got_ids[t * k + slot],
                    ex as i32,
                    "case {c} token {t} slot {slot}"
                );
                assert!(
                    (got_w[t * k + slot] as f64 - w).abs() < 1e-6,
                    "case {c}: weight"
                );
                let dot = |row: &[f32], v: &[f64]| -> f64 {
                    row.iter().zip(v).map(|(&a, &b)| a as f64 * b).sum()
                };
                let xv: Vec<f64> = xr.iter().map(|&v| v as f64).collect();
                let act: Vec<f64> = (0..i)
                    .map(|j| {
                        let g = r(dot(&gu_v[(ex * i + j) * h..(ex * i + j + 1) * h], &xv));
                        let u = r(dot(
                            &gu_v[((e + ex) * i + j) * h..((e + ex) * i + j + 1) * h],
                            &xv,
                        ));
                        r(g / (1.0 + (-g).exp()) * u)
                    })
                    .collect();
                for (o, a) in acc.iter_mut().enumerate() {
                    let row = &dn_v[(ex * h + o) * i..(ex * h + o + 1) * i];
                    *a += w * r(dot(row, &act));
                }
            }
            want.extend(acc.into_iter().map(r));
        }
        let got: Vec<f64> = got.iter().map(|&v| v as f64).collect();
        let err = compare::normalized_error(&got, &want);
        let tol = compare::tolerance(compare::OpClass::Reduction, dt);
        assert!(
            err <= tol,
            "case {c} ({dt}, {fmt:?}): normalised error {err:.3e} > {tol:.1e}"
        );
    }
}

#[test]
fn moe_breaks_ties_toward_the_lower_expert_and_checks_its_operands() {
    let be = cpu();
    let (n, h, e, i) = (1, 32, 4, 32);
    let x = be.upload(&uniform(n * h, 1), &[n, h]).unwrap();
    let logits = be.upload(&[1.0f32, 3.0, 3.0, 0.0], &[n, e]).unwrap();
    let gu = be
        .upload(&uniform(2 * e * i * h, 2), &[2 * e * i, h])
        .unwrap();
    let dn = be.upload(&uniform(e * h * i, 3), &[e * h, i]).unwrap();
    let ids = be.alloc(DType::I32, &[n, 2]).unwrap();
    let wts = be.alloc(DType::F32, &[n, 2]).unwrap();
    let out = be.alloc(DType::F32, &[n, h]).unwrap();
    let scratch = be.alloc(DType::F32, &[n * 5, i]).unwrap();
    let work = be.alloc(DType::I32, &[1]).unwrap();
    let args = |top_k: usize, out: &Tensor, ids: &Tensor| -> Result<(), Error> {
        be.moe(&encore_backend::Moe {
            act: encore_backend::backend::Activation::Silu,
            bias: None,
            x: &x,
            logits: &logits,
            top_k,
            renormalize: true,
            gate_up: &gu,
            down: &dn,
            ids,
            weights: &wts,
            out,
            scratch: &scratch.prefix(n * top_k.min(5))?,
            workspace: &work,
            cache: None,
        })
    };
    args(2, &out, &ids).unwrap();
    assert_eq!(be.download::<i32>(&ids).unwrap(), [1, 2]);
    assert_eq!(be.download::<f32>(&wts).unwrap(), [0.5, 0.5]);
    // Bad operands name themselves.
    let e1 = args(5, &out, &ids).unwrap_err().to_string();
    assert!(e1.contains("top_k 5"), "{e1}");
    let short = be.alloc(DType::F32, &[n, h - 1]).unwrap();
    let e2 = args(2, &short, &ids).unwrap_err().to_string();
    assert!(e2.contains("out"), "{e2}");
    let f_ids = be.alloc(DType::F32, &[n, 2]).unwrap();
    let e3 = args(2, &out, &f_ids).unwrap_err().to_string();
    assert!(e3.contains("ids"), "{e3}");
}

/// An expert cache of `slots` slots for `layers` layers of `e` experts whose gate/up
/// and down stacks are `gu` and `dn` (16-byte slots, every slot empty).
fn test_cache(
    be: &dyn Backend,
    layers: usize,
    e: usize,
    slots: usize,
    gu: &Tensor,
    dn: &Tensor,
) -> encore_backend::ExpertSlots {
    let slot = |t: &Tensor| (t.size_bytes() / e).next_multiple_of(16);
    encore_backend::ExpertSlots::new(be, layers, e, slots, slot(gu), slot(dn)).unwrap()
}

/// The expert cache's decisions, step by step (E = 4, top 1, 2 slots, 2 layers, decay
/// 0.5): empty slots first, then the least score among the slots not needed now, across
/// layers; hits copy nothing; the outputs equal the stacks' whatever the slots hold.
#[test]
fn the_expert_cache_fills_and_evicts_by_decayed_frequency() {
    let be = cpu();
    let (h, e, i) = (32, 4, 16);
    let x = be.upload(&uniform(h, 5), &[1, h]).unwrap();
    let gu = be
        .upload(&uniform(2 * e * i * h, 6), &[2 * e * i, h])
        .unwrap();
    let dn = be.upload(&uniform(e * h * i, 7), &[e * h, i]).unwrap();
    let cache = test_cache(be.as_ref(), 2, e, 2, &gu, &dn);
    let (ids, wts, scratch) = (
        be.alloc(DType::I32, &[1, 1]).unwrap(),
        be.alloc(DType::F32, &[1, 1]).unwrap(),
        be.alloc(DType::F32, &[1, i]).unwrap(),
    );
    let work = be.alloc(DType::I32, &[1]).unwrap();
    let call = |layer: usize, expert: usize, cached: bool| -> Vec<f32> {
        let mut l = vec![0f32; e];
        l[expert] = 10.0;
        let logits = be.upload(&l, &[1, e]).unwrap();
        let out = be.alloc(DType::F32, &[1, h]).unwrap();
        be.moe(&encore_backend::Moe {
            act: encore_backend::backend::Activation::Silu,
            bias: None,
            x: &x,
            logits: &logits,
            top_k: 1,
            renormalize: true,
            gate_up: &gu,
            down: &dn,
            ids: &ids,
            weights: &wts,
            out: &out,
            scratch: &scratch,
            workspace: &work,
            cache: cached.then(|| cache.args(layer, 0.5)),
        })
        .unwrap();
        be.download::<f32>(&out).unwrap()
    };
    let tables = || {
        (
            be.download::<i32>(&cache.slot_of).unwrap(),
            be.download::<i32>(&cache.owner).unwrap(),
            be.download::<i32>(&cache.fills).unwrap()[..3].to_vec(),
        )
    };
    // (layer, expert) -> (slot_of, owner, fills[..3]) after the call.
    type Tables = (Vec<i32>, Vec<i32>, Vec<i32>);
    let steps: [((usize, usize), Tables); 5] = [
        // An empty slot, the lowest.
        (
            (0, 0),
            (
                vec![0, -1, -1, -1, -1, -1, -1, -1],
                vec![0, -1],
                vec![1, 0, 0],
            ),
        ),
        // The other empty slot.
        (
            (0, 1),
            (
                vec![0, 1, -1, -1, -1, -1, -1, -1],
                vec![0, 1],
                vec![1, 1, 1],
            ),
        ),
        // Scores e0 0.25, e1 0.5: e0's slot.
        (
            (0, 2),
            (
                vec![-1, 1, 0, -1, -1, -1, -1, -1],
                vec![2, 1],
                vec![1, 2, 0],
            ),
        ),
        // A hit: nothing filled.
        (
            (0, 1),
            (
                vec![-1, 1, 0, -1, -1, -1, -1, -1],
                vec![2, 1],
                vec![0, 2, 0],
            ),
        ),
        // Layer 1's expert 3: e2 scores 0.25, e1 1.25: e2's slot.
        (
            (1, 3),
            (
                vec![-1, 1, -1, -1, -1, -1, -1, 0],
                vec![7, 1],
                vec![1, 3, 0],
            ),
        ),
    ];
    for ((layer, expert), want) in steps {
        let got = call(layer, expert, true);
        assert_eq!(tables(), want, "layer {layer} expert {expert}");
        assert_eq!(
            got,
            call(layer, expert, false),
            "layer {layer} expert {expert}"
        );
    }
    let stats = be.download::<i64>(&cache.stats).unwrap();
    let expert_bytes = (3 * i * h * 4) as i64;
    assert_eq!(stats, [5, 1, 4, 4 * expert_bytes, 0]);
}

/// The expert prefetch's decisions, step by step (E = 4, top 1, 3 slots, 2 layers, decay
/// 0.5): after a call's own plan, the predicted experts of a later layer take the least
/// slots not holding the call's experts, the scores stay as they were, a right prediction
/// is a hit at its layer's call and a wrong one is planned again; the outputs equal the
/// stacks'.
#[test]
fn the_expert_prefetch_plans_beside_the_call() {
    let be = cpu();
    let (h, e, i) = (32, 4, 16);
    let x = be.upload(&uniform(h, 15), &[1, h]).unwrap();
    let gu = be
        .upload(&uniform(2 * e * i * h, 16), &[2 * e * i, h])
        .unwrap();
    let dn = be.upload(&uniform(e * h * i, 17), &[e * h, i]).unwrap();
    let cache = test_cache(be.as_ref(), 2, e, 3, &gu, &dn);
    let alloc = |dt, shape: &[usize]| be.alloc(dt, shape).unwrap();
    let (ids, wts, scratch, work) = (
        alloc(DType::I32, &[1, 1]),
        alloc(DType::F32, &[1, 1]),
        alloc(DType::F32, &[1, i]),
        alloc(DType::I32, &[1]),
    );
    let (pf_ids, pf_wts) = (alloc(DType::I32, &[1, 1]), alloc(DType::F32, &[1, 1]));
    // One row of fills serves every prefetch here (the CPU runs each call to its end).
    let pf_fills = cache.prefetch_fills(0).unwrap();
    let one_hot = |expert: usize| {
        let mut l = vec![0f32; e];
        l[expert] = 10.0;
        be.upload(&l, &[1, e]).unwrap()
    };
    let call = |layer: usize, expert: usize, pf: Option<(usize, usize)>| -> Vec<f32> {
        let (logits, pf_logits) = (one_hot(expert), one_hot(pf.map_or(0, |p| p.1)));
        let out = alloc(DType::F32, &[1, h]);
        let mut c = cache.args(layer, 0.5);
        c.prefetch = pf.map(|(l, _)| encore_backend::ExpertPrefetch {
            layer: l,
            logits: &pf_logits,
            ids: &pf_ids,
            weights: &pf_wts,
            gate_up: &gu,
            down: &dn,
            fills: &pf_fills,
        });
        let moe = |cache| encore_backend::Moe {
            act: encore_backend::backend::Activation::Silu,
            bias: None,
            x: &x,
            logits: &logits,
            top_k: 1,
            renormalize: true,
            gate_up: &gu,
            down: &dn,
            ids: &ids,
            weights: &wts,
            out: &out,
            scratch: &scratch,
            workspace: &work,
            cache,
        };
        be.moe(&moe(None)).unwrap();
        let plain = be.download::<f32>(&out).unwrap();
        be.moe(&moe(Some(c))).unwrap();
        let got = be.download::<f32>(&out).unwrap();
        assert_eq!(got, plain, "layer {layer} expert {expert}");
        got
    };
    let tables = || {
        let d = |t: &Tensor| be.download::<i32>(t).unwrap();
        (
            d(&cache.slot_of),
            d(&cache.owner),
            d(&cache.fills)[..3].to_vec(),
            d(&pf_fills)[..3].to_vec(),
        )
    };
    // (layer, expert, prefetch) -> (slot_of, owner, fills[..3], prefetch fills[..3]).
    type Tables = (Vec<i32>, Vec<i32>, Vec<i32>, Vec<i32>);
    type Call = (usize, usize, Option<(usize, usize)>);
    let steps: [(Call, Tables); 3] = [
        // Layer 0's e0 into slot 0; layer 1's e2 predicted, into slot 1.
        (
            (0, 0, Some((1, 2))),
            (
                vec![0, -1, -1, -1, -1, -1, 1, -1],
                vec![0, 6, -1],
                vec![1, 0, 0],
                vec![1, 2, 1],
            ),
        ),
        // Layer 1's e2 hits; layer 0's e3 predicted: the empty slot 2 (slot 1 pinned).
        (
            (1, 2, Some((0, 3))),
            (
                vec![0, -1, -1, 2, -1, -1, 1, -1],
                vec![0, 6, 3],
                vec![0, 0, 0],
                vec![1, 3, 2],
            ),
        ),
        // Layer 0's e1, not e3: scores e0 0.5, e3 0 (a prefetch set none), l1 e2 1: e3's
        // slot. Then layer 1's e0 predicted: slot 2 is pinned, e0 (0.5) goes.
        (
            (0, 1, Some((1, 0))),
            (
                vec![-1, 2, -1, -1, 0, -1, 1, -1],
                vec![4, 6, 1],
                vec![1, 1, 2],
                vec![1, 0, 0],
            ),
        ),
    ];
    for ((layer, expert, pf), want) in steps {
        call(layer, expert, pf);
        assert_eq!(tables(), want, "layer {layer} expert {expert}");
    }
    let score = be.download::<f32>(&cache.score).unwrap();
    assert_eq!(score, [0.5, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]);
    let stats = be.download::<i64>(&cache.stats).unwrap();
    let expert_bytes = (3 * i * h * 4) as i64;
    assert_eq!(stats, [3, 1, 2, 5 * expert_bytes, 3]);
    // A prefetch of the call's own layer, or of a layer past the tables: refused.
    for bad in [0, 2] {
        let (logits, out) = (one_hot(0), alloc(DType::F32, &[1, h]));
        let mut c = cache.args(0, 0.5);
        c.prefetch = Some(encore_backend::ExpertPrefetch {
            layer: bad,
            logits: &logits,
            ids: &pf_ids,
            weights: &pf_wts,
            gate_up: &gu,
            down: &dn,
            fills: &pf_fills,
        });
        let err = be
            .moe(&encore_backend::Moe {
                act: encore_backend::backend::Activation::Silu,
                bias: None,
                x: &x,
                logits: &logits,
                top_k: 1,
                renormalize: true,
                gate_up: &gu,
                down: &dn,
                ids: &ids,
                weights: &wts,
                out: &out,
                scratch: &scratch,
                workspace: &work,
                cache: Some(c),
            })
            .unwrap_err()
            .to_string();
        assert!(err.contains("a prefetch of layer"), "{err}");
    }
}

/// Random routing through a cache of the fewest slots a call may need: dense and
/// quantized experts give the stacks' outputs bit for bit, and the tables stay a
/// bijection between slots and cached experts.
#[test]
fn moe_through_the_expert_cache_equals_the_stacks() {
    let be = cpu();
    use encore_backend::quant;
    for (c, fmt) in [None, Some(quant::QuantFormat::Q4K)]
        .into_iter()
        .enumerate()
    {
        let (n, h, e, i, k, layers) = (3, 256, 8, 256, 2, 2);
        let seed = 100 + c as u64;
        let (gu, dn) = match fmt {
            None => (
                be.upload(&uniform(2 * e * i * h, seed), &[2 * e * i, h])
                    .unwrap(),
                be.upload(&uniform(e * h * i, seed + 1), &[e * h, i])
                    .unwrap(),
            ),
            Some(f) => {
                let q = |v: &[f32], rows: usize, cols: usize| {
                    let mut bytes = vec![0u8; f.bytes(rows, cols).unwrap()];
                    quant::quantize_rows(f, v, cols, &mut bytes);
                    let t = be.alloc(DType::Q(f), &[rows, cols]).unwrap();
                    be.write_bytes(&t, &bytes).unwrap();
                    t
                };
                (
                    q(&uniform(2 * e * i * h, seed), 2 * e * i, h),
                    q(&uniform(e * h * i, seed + 1), e * h, i),
                )
            }
        };
        let slots = e.min(n * k);
        let cache = test_cache(be.as_ref(), layers, e, slots, &gu, &dn);
        let x = be.upload(&uniform(n * h, seed + 2), &[n, h]).unwrap();
        let (ids, wts, scratch, work) = (
            be.alloc(DType::I32, &[n, k]).unwrap(),
            be.alloc(DType::F32, &[n, k]).unwrap(),
            be.alloc(DType::F32, &[n * k, i]).unwrap(),
            be.alloc(DType::I32, &[1]).unwrap(),
        );
        let (pf_ids, pf_wts) = (
            be.alloc(DType::I32, &[n, k]).unwrap(),
            be.alloc(DType::F32, &[n, k]).unwrap(),
        );
        // Steps 12.. also prefetch the other layer's experts, predicted by other random
        // logits: with the fewest slots, the call's pinned slots often leave too few.
        for step in 0..24 {
            let logits = be
                .upload(&uniform(n * e, seed + 10 + step as u64), &[n, e])
                .unwrap();
            let pf_logits = be
                .upload(&uniform(n * e, seed + 50 + step as u64), &[n, e])
                .unwrap();
            let pf_row = cache.prefetch_fills(step).unwrap();
            let run = |cached: bool| {
                let out = be.alloc(DType::F32, &[n, h]).unwrap();
                be.moe(&encore_backend::Moe {
                    act: encore_backend::backend::Activation::Silu,
                    bias: None,
                    x: &x,
                    logits: &logits,
                    top_k: k,
                    renormalize: false,
                    gate_up: &gu,
                    down: &dn,
                    ids: &ids,
                    weights: &wts,
                    out: &out,
                    scratch: &scratch,
                    workspace: &work,
                    cache: cached.then(|| {
                        let mut c = cache.args(step % layers, 0.9);
                        c.prefetch = (step >= 12).then(|| encore_backend::ExpertPrefetch {
                            layer: (step + 1) % layers,
                            logits: &pf_logits,
                            ids: &pf_ids,
                            weights: &pf_wts,
                            gate_up: &gu,
                            down: &dn,
                            fills: &pf_row,
                        });
                        c
                    }),
                })
                .unwrap();
                be.download::<f32>(&out).unwrap()
            };
            assert_eq!(run(true), run(false), "{fmt:?} step {step}");
            let (slot_of, owner) = (
                be.download::<i32>(&cache.slot_of).unwrap(),
                be.download::<i32>(&cache.owner).unwrap(),
            );
            for (s, &o) in owner.iter().enumerate() {
                if o >= 0 {
                    assert_eq!(slot_of[o as usize], s as i32, "{fmt:?} step {step}");
                }
            }
            for (le, &s) in slot_of.iter().enumerate() {
                if s >= 0 {
                    assert_eq!(owner[s as usize], le as i32, "{fmt:?} step {step}");
                }
            }
        }
        let stats = be.download::<i64>(&cache.stats).unwrap();
        assert!(stats[4] > 0, "{fmt:?}: something was prefetched: {stats:?}");
        // Too few slots for a call's pairs: refused naming the need.
        let small = test_cache(be.as_ref(), layers, e, slots - 1, &gu, &dn);
        let logits = be.upload(&uniform(n * e, seed), &[n, e]).unwrap();
        let out = be.alloc(DType::F32, &[n, h]).unwrap();
        let err = be
            .moe(&encore_backend::Moe {
                act: encore_backend::backend::Activation::Silu,
                bias: None,
                x: &x,
                logits: &logits,
                top_k: k,
                renormalize: false,
                gate_up: &gu,
                down: &dn,
                ids: &ids,
                weights: &wts,
                out: &out,
                scratch: &scratch,
                workspace: &work,
                cache: Some(small.args(0, 0.9)),
            })
            .unwrap_err()
            .to_string();
        assert!(err.contains("a step may need 6"), "{err}");
    }
}
