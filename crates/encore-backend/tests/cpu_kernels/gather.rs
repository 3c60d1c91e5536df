//! `gather_columns` (GPTQ act order's input gather) against a direct loop, in a captured
//! graph (the permutation read at replay), and its argument checks.

use super::*;

/// `out[r][j] = x[r][perm[j]]`, 0 outside `0..k`, written out plainly.
fn direct(x: &[f32], k: usize, perm: &[i32]) -> Vec<f32> {
    let mut out = Vec::new();
    for row in x.chunks(k) {
        for &p in perm {
            out.push(if p >= 0 && (p as usize) < k {
                row[p as usize]
            } else {
                0.0
            });
        }
    }
    out
}

#[test]
fn gather_columns_matches_a_direct_loop_in_every_dtype() {
    let be = cpu();
    let (rows, k) = (3, 70);
    // Exact in bf16: small integers and halves.
    let x: Vec<f32> = (0..rows * k)
        .map(|i| ((i * 37) % 101) as f32 * 0.5 - 25.0)
        .collect();
    let mut perm: Vec<i32> = (0..k as i32).map(|j| (j * 29 + 11) % k as i32).collect();
    perm.extend([-1, k as i32, 0]);
    for dt in [DType::BF16, DType::F16, DType::F32] {
        let xt = be.upload_f32_as(&x, &[rows, k], dt).unwrap();
        let p = be.upload(&perm, &[perm.len()]).unwrap();
        let out = be.alloc(dt, &[rows, perm.len()]).unwrap();
        be.gather_columns(&xt, &p, &out).unwrap();
        assert_eq!(f32s(be.as_ref(), &out), direct(&x, k, &perm), "{dt}");
    }
}

#[test]
fn a_captured_gather_reads_its_permutation_at_replay() {
    let be = cpu();
    let x: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let xt = be.upload(&x, &[2, 4]).unwrap();
    let p = be.upload(&[3i32, 2, 1, 0], &[4]).unwrap();
    let out = be.alloc(DType::F32, &[2, 4]).unwrap();
    be.begin_capture().unwrap();
    be.gather_columns(&xt, &p, &out).unwrap();
    let g = be.end_capture().unwrap();
    be.write(&p, &[1i32, 1, 0, 2]).unwrap();
    g.replay().unwrap();
    assert_eq!(
        f32s(be.as_ref(), &out),
        vec![1., 1., 0., 2., 5., 5., 4., 6.]
    );
}

#[test]
fn gather_columns_checks_its_arguments_by_name() {
    let be = cpu();
    let x = be.alloc(DType::F32, &[2, 4]).unwrap();
    let p = be.upload(&[0i32, 1, 2], &[3]).unwrap();
    let bad = |r: encore_backend::Result<()>| format!("{}", r.unwrap_err());
    let msg = bad(be.gather_columns(&x, &p, &be.alloc(DType::F32, &[2, 4]).unwrap()));
    assert!(
        msg.contains("gather_columns") && msg.contains("out"),
        "{msg}"
    );
    let msg = bad(be.gather_columns(&x, &p, &be.alloc(DType::BF16, &[2, 3]).unwrap()));
    assert!(msg.contains("out"), "{msg}");
    let pf = be.alloc(DType::F32, &[3]).unwrap();
    let msg = bad(be.gather_columns(&x, &pf, &be.alloc(DType::F32, &[2, 3]).unwrap()));
    assert!(msg.contains("perm"), "{msg}");
}
