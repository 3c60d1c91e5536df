//! The LayerNorm kind of the norm ops on the CPU backend ([`Norm::Layer`]): by hand, against
//! a straightforward f64 LayerNorm in f32 and bf16 (with and without the residual add),
//! through `norm_add_norm` and the tensor-parallel norms' defaults, and its bias checked.

use encore_backend::backend::cpu::CpuBackend;
use encore_backend::{Backend, DType, Error, Norm, Tensor};

fn cpu() -> Box<dyn Backend> {
    Box::new(CpuBackend::new())
}

fn values(seed: u32, n: usize, offset: f32) -> Vec<f32> {
    // A small deterministic spread (no RNG crate needed): values in [-2, 2] + offset.
    (0..n)
        .map(|i| {
            let h = (i as u32 ^ seed).wrapping_mul(2654435761).rotate_left(13);
            offset + (h % 4001) as f32 / 1000.0 - 2.0
        })
        .collect()
}

/// A row's LayerNorm in f64: `(x - mean) / sqrt(var + eps) * w + b`, var the population
/// variance.
fn layer_norm_ref(x: &[f64], w: &[f64], b: &[f64], eps: f64) -> Vec<f64> {
    let mut out = Vec::new();
    for row in x.chunks(w.len()) {
        let n = row.len() as f64;
        let mean = row.iter().sum::<f64>() / n;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        let inv = 1.0 / (var + eps).sqrt();
        out.extend(
            row.iter()
                .zip(w)
                .zip(b)
                .map(|((v, w), b)| (v - mean) * inv * w + b),
        );
    }
    out
}

fn f64s(be: &dyn Backend, t: &Tensor) -> Vec<f64> {
    let f32s: Vec<f32> = match t.dtype() {
        DType::F32 => be.download::<f32>(t).unwrap(),
        DType::BF16 => be
            .download::<half::bf16>(t)
            .unwrap()
            .iter()
            .map(|v| v.to_f32())
            .collect(),
        d => panic!("{d}"),
    };
    f32s.into_iter().map(f64::from).collect()
}

#[test]
fn layer_norm_by_hand() {
    let be = cpu();
    let be = be.as_ref();
    // Row [1, 2, 3, 6]: mean 3, deviations [-2, -1, 0, 3], var 14 / 4 = 3.5; eps 0.5 makes
    // the scale 1 / 2.
    let x = be.upload(&[1.0f32, 2.0, 3.0, 6.0], &[1, 4]).unwrap();
    let w = be.upload(&[1.0f32, 2.0, 1.0, 2.0], &[4]).unwrap();
    let b = be.upload(&[0.5f32, 0.0, -1.0, 1.0], &[4]).unwrap();
    let out = be.alloc(DType::F32, &[1, 4]).unwrap();
    be.rms_norm(&x, None, Norm::new(&w, Some(&b)), 0.5, &out)
        .unwrap();
    let want = [-1.0 + 0.5, -1.0, -1.0, 3.0 + 1.0];
    assert_eq!(be.download::<f32>(&out).unwrap(), want);
    // A constant row normalises to the bias (no division by zero with eps > 0).
    let c = be.upload(&[7.0f32; 4], &[1, 4]).unwrap();
    be.rms_norm(&c, None, Norm::new(&w, Some(&b)), 1e-5, &out)
        .unwrap();
    assert_eq!(be.download::<f32>(&out).unwrap(), [0.5, 0.0, -1.0, 1.0]);
    // RMSNorm of the same row differs (the mean is not subtracted): the kind is honoured.
    be.rms_norm(&x, None, (&w).into(), 0.5, &out).unwrap();
    assert_ne!(be.download::<f32>(&out).unwrap(), want);
}

#[test]
fn layer_norm_matches_the_reference_with_and_without_the_residual() {
    let be = cpu();
    let be = be.as_ref();
    let eps = 1e-5;
    for dtype in [DType::F32, DType::BF16] {
        // Widths not powers of two, rows offset from zero so the mean matters.
        for (rows, dim) in [(3, 37), (2, 200), (1, 1000)] {
            let (xv, rv) = (values(1, rows * dim, 3.0), values(2, rows * dim, -1.0));
            let (wv, bv) = (values(3, dim, 1.0), values(4, dim, 0.0));
            let up = |v: &[f32], shape: &[usize]| be.upload_f32_as(v, shape, dtype).unwrap();
            let (x, w, b) = (up(&xv, &[rows, dim]), up(&wv, &[dim]), up(&bv, &[dim]));
            let (xq, wq, bq) = (f64s(be, &x), f64s(be, &w), f64s(be, &b));
            let tol = match dtype {
                DType::F32 => 1e-5,
                _ => 2e-2,
            };
            let close = |got: &[f64], want: &[f64], what: &str| {
                assert_eq!(got.len(), want.len());
                for (i, (g, w)) in got.iter().zip(want).enumerate() {
                    let e = (g - w).abs() / w.abs().max(1.0);
                    assert!(e <= tol, "{dtype} {rows}x{dim} {what}[{i}]: {g} vs {w}");
                }
            };
            // Without the residual, into a fresh tensor.
            let out = be.alloc(dtype, &[rows, dim]).unwrap();
            be.rms_norm(&x, None, Norm::new(&w, Some(&b)), eps, &out)
                .unwrap();
            let want = layer_norm_ref(&xq, &wq, &bq, eps as f64);
            close(&f64s(be, &out), &want, "out");
            // With the residual, in place: the sum rounded to T and stored, then normed.
            let res = up(&rv, &[rows, dim]);
            let rq = f64s(be, &res);
            be.rms_norm(&x, Some(&res), Norm::new(&w, Some(&b)), eps, &x)
                .unwrap();
            let summed = f64s(be, &res);
            for (i, s) in summed.iter().enumerate() {
                let want = f64s(be, &up(&[(rq[i] + xq[i]) as f32], &[1]))[0];
                assert_eq!(*s, want, "{dtype} {rows}x{dim} residual[{i}]");
            }
            close(
                &f64s(be, &x),
                &layer_norm_ref(&summed, &wq, &bq, eps as f64),
                "out=x",
            );
        }
    }
}

#[test]
fn norm_add_norm_and_the_group_norms_take_layer_norms() {
    let be = cpu();
    let be = be.as_ref();
    let (rows, dim, eps) = (2, 24, 1e-5f32);
    let up = |v: Vec<f32>, shape: &[usize]| be.upload(&v, shape).unwrap();
    let (xw, xb) = (
        up(values(5, dim, 1.0), &[dim]),
        up(values(6, dim, 0.0), &[dim]),
    );
    let (w, b) = (
        up(values(7, dim, 1.0), &[dim]),
        up(values(8, dim, 0.0), &[dim]),
    );
    let (x0, r0) = (values(9, rows * dim, 2.0), values(10, rows * dim, 0.0));
    // norm_add_norm, both norms LayerNorms, against the ops one at a time.
    let (x, res, out) = (
        up(x0.clone(), &[rows, dim]),
        up(r0.clone(), &[rows, dim]),
        be.alloc(DType::F32, &[rows, dim]).unwrap(),
    );
    let (xn, n) = (Norm::new(&xw, Some(&xb)), Norm::new(&w, Some(&b)));
    be.norm_add_norm(&x, xn, &res, Some(n), eps, &out).unwrap();
    let (x2, res2, out2) = (
        up(x0.clone(), &[rows, dim]),
        up(r0.clone(), &[rows, dim]),
        be.alloc(DType::F32, &[rows, dim]).unwrap(),
    );
    be.rms_norm(&x2, None, xn, eps, &x2).unwrap();
    be.rms_norm(&x2, Some(&res2), n, eps, &out2).unwrap();
    let dl = |t: &Tensor| be.download::<f32>(t).unwrap();
    assert_eq!(dl(&out), dl(&out2));
    assert_eq!(dl(&res), dl(&res2));
    // all_reduce_rms_norm alone (the sum is x itself) is the residual LayerNorm.
    let (x3, res3, out3) = (
        up(x0.clone(), &[rows, dim]),
        up(r0.clone(), &[rows, dim]),
        be.alloc(DType::F32, &[rows, dim]).unwrap(),
    );
    be.all_reduce_rms_norm(&x3, &res3, n, eps, &out3).unwrap();
    let (x4, res4, out4) = (
        up(x0, &[rows, dim]),
        up(r0, &[rows, dim]),
        be.alloc(DType::F32, &[rows, dim]).unwrap(),
    );
    be.rms_norm(&x4, Some(&res4), n, eps, &out4).unwrap();
    assert_eq!(dl(&out3), dl(&out4));
    assert_eq!(dl(&res3), dl(&res4));
}

#[test]
fn a_bad_bias_is_named() {
    let be = cpu();
    let be = be.as_ref();
    let x = be.upload(&[1.0f32; 8], &[2, 4]).unwrap();
    let w = be.upload(&[1.0f32; 4], &[4]).unwrap();
    let short = be.upload(&[0.0f32; 3], &[3]).unwrap();
    let err = be
        .rms_norm(&x, None, Norm::new(&w, Some(&short)), 1e-5, &x)
        .unwrap_err();
    assert!(matches!(err, Error::Shape { name: "bias", .. }), "{err:?}");
    let b16 = be.alloc(DType::F16, &[4]).unwrap();
    let err = be
        .rms_norm(&x, None, Norm::new(&w, Some(&b16)), 1e-5, &x)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::DType {
                name: "bias",
                found: DType::F16,
                ..
            }
        ),
        "{err:?}"
    );
}
