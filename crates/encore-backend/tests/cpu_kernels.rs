//! The CPU kernels against the naive f64 reference on random inputs, targeted edge cases
//! of the op semantics with hand-computed answers, and argument validation.

use encore_backend::backend::cpu::CpuBackend;
use encore_backend::testing::{self, compare};
use encore_backend::{Attention, Backend, DType, Error, KvScale, QkvRope, Sampling, Tensor};

fn cpu() -> Box<dyn Backend> {
    Box::new(CpuBackend::new())
}

fn assert_pass(results: &[testing::CheckResult]) {
    assert!(!results.is_empty());
    if let Err(report) = testing::all_passed(results) {
        panic!("{report}");
    }
}

#[test]
fn every_op_matches_the_f64_reference() {
    for seed in [1, 2, 3] {
        let results = testing::check_cpu_against_reference(seed).unwrap();
        if std::env::var_os("ENCORE_SHOW_CHECKS").is_some() {
            results.iter().for_each(|r| eprintln!("{r}"));
        }
        assert_pass(&results);
        for op in [
            "embedding",
            "rms_norm",
            "rms_norm(residual): residual",
            "rms_norm(residual, out=x): out",
            "layer_norm",
            "layer_norm(residual): residual",
            "layer_norm(residual, out=x): out",
            "norm_add_norm(layer_norm): out",
            "qkv_rope_write: q",
            "qkv_rope_write: k_cache",
            "qkv_rope_write: v_cache",
            "silu_mul",
            "matmul(bias, out f32)",
            "matmul(no bias, out bf16)",
            "attention(decode)",
            "attention(prefill)",
            "attention(decode, window)",
            "attention(prefill, window)",
            "qkv_rope_write(fp8 cache): k_cache",
            "qkv_rope_write(fp8 cache): v_cache",
            "attention(decode, fp8 cache)",
            "attention(prefill, fp8 cache)",
            "sample(greedy)",
            "sample (greedy rows)",
            "sample (random rows)",
            "sample(min_p) (random rows)",
            "sample(penalties) (greedy rows)",
            "sample(penalties) (random rows)",
            "sample(logprobs): top_logprobs ids",
            "sample(logprobs): top_logprobs",
            "sample(logprobs): token logprob (greedy rows)",
            "sample(min_p, penalties, logprobs): top_logprobs ids",
        ] {
            assert!(results.iter().any(|r| r.op == op), "no check named `{op}`");
        }
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            assert!(results
                .iter()
                .any(|r| r.dtype == dtype && r.op.starts_with("attention")));
        }
        for fmt in encore_backend::quant::QuantFormat::ALL {
            for op in [
                format!("matmul({fmt}, bias, out bf16)"),
                format!("matmul({fmt}, no bias, out f32)"),
                format!("matmul_act_mul silu({fmt})"),
                format!("matmul_act_mul gelu_pytorch_tanh({fmt})"),
            ] {
                assert!(results.iter().any(|r| r.op == op), "no check named `{op}`");
            }
        }
    }
}

#[test]
fn the_cpu_backend_agrees_with_itself_exactly() {
    let be = cpu();
    let results = testing::check_backend_against_cpu(be.as_ref(), 11).unwrap();
    assert_pass(&results);
    assert!(results.iter().all(|r| r.tolerance == 0.0 && r.error == 0.0));
}

#[test]
fn normalized_error_and_results() {
    use compare::{normalized_error, tolerance, CheckResult, OpClass};
    assert_eq!(normalized_error(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
    let e = normalized_error(&[3.0, 4.0], &[3.0, 4.5]);
    assert!((e - 0.5 / (9.0f64 + 20.25).sqrt()).abs() < 1e-12, "{e}");
    // An all-zero reference falls back to the largest absolute difference.
    assert_eq!(normalized_error(&[0.0, 0.25], &[0.0, 0.0]), 0.25);
    assert!(normalized_error(&[f64::NAN], &[1.0]).is_nan());
    assert!(normalized_error(&[1.0], &[1.0, 2.0]).is_nan());
    assert!(normalized_error(&[f64::INFINITY], &[1.0]).is_nan());
    assert!(!CheckResult::new("x", "", DType::F32, f64::NAN, 1.0).pass);
    assert!(CheckResult::new("x", "", DType::F32, 0.0, 0.0).pass);
    assert!(!CheckResult::new("x", "", DType::F32, 1e-9, 0.0).pass);
    assert_eq!(tolerance(OpClass::Pointwise, DType::BF16), 1e-2);
    assert_eq!(tolerance(OpClass::Copy, DType::F16), 0.0);
    assert!(tolerance(OpClass::Reduction, DType::F32) < 1e-4);
}

fn f32s(be: &dyn Backend, t: &Tensor) -> Vec<f32> {
    be.download_f32(t).unwrap()
}

#[test]
fn greedy_sampling_ties_nan_and_infinities() {
    let be = cpu();
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let rows: [[f32; 4]; 7] = [
        [1.0, 3.0, 3.0, 2.0],
        [nan, 2.0, nan, 2.0],
        [nan, nan, nan, nan],
        [-inf, -inf, -inf, -inf],
        [nan, -inf, nan, -5.0],
        [0.0, -0.0, 0.0, inf],
        [-1.0, -2.0, -0.5, -0.5],
    ];
    let logits = be.upload(&rows.concat(), &[7, 4]).unwrap();
    let out = be.upload(&[-9i32; 7], &[7]).unwrap();
    // Temperature 0, below 0 and NaN are all greedy, whatever top-k and top-p say.
    let temperature = [0.0f32, -1.0, nan, 0.0, -1.0, nan, 0.0];
    let temperature = be.upload(&temperature, &[7]).unwrap();
    let top_k = be.upload(&[0i32, 1, 2, 0, 3, 0, 1], &[7]).unwrap();
    let top_p = be
        .upload(&[1.0f32, 0.5, 1.0, 0.1, 1.0, 0.9, 1.0], &[7])
        .unwrap();
    let seeds = be.upload(&[1i64, 2, 3, 4, 5, 6, 7], &[7]).unwrap();
    let min_p = be.upload(&[0.5f32; 7], &[7]).unwrap();
    let params = Sampling {
        temperature: &temperature,
        top_k: &top_k,
        top_p: &top_p,
        min_p: &min_p,
        seeds: &seeds,
        penalties: None,
        logprobs: None,
        mask: None,
    };
    be.sample(&logits, &params, &out).unwrap();
    assert_eq!(be.download::<i32>(&out).unwrap(), vec![1, 1, 0, 0, 3, 3, 2]);
}

#[test]
fn embedding_writes_zero_rows_for_out_of_range_ids() {
    let be = cpu();
    let table: Vec<f32> = (0..15).map(|i| i as f32 + 1.0).collect();
    for dtype in [DType::BF16, DType::F32] {
        let table = be.upload_f32_as(&table, &[5, 3], dtype).unwrap();
        let ids = be.upload(&[2, -1, 5, 0, i32::MIN], &[5]).unwrap();
        let out = be.upload_f32_as(&[f32::NAN; 15], &[5, 3], dtype).unwrap();
        be.embedding(&ids, &table, &out).unwrap();
        let want = [7., 8., 9., 0., 0., 0., 0., 0., 0., 1., 2., 3., 0., 0., 0.];
        assert_eq!(f32s(be.as_ref(), &out), want);
    }
}

#[test]
fn rms_norm_by_hand_with_residual_in_place() {
    let be = cpu();
    // rows [3, 4] and [0, 0]; residual [1, -1] and [2, 0]; weight [1, 2]; eps 0.
    let x = be.upload(&[2.0f32, 5.0, -2.0, 0.0], &[2, 2]).unwrap();
    let res = be.upload(&[1.0f32, -1.0, 2.0, 0.0], &[2, 2]).unwrap();
    let w = be.upload(&[1.0f32, 2.0], &[2]).unwrap();
    be.rms_norm(&x, Some(&res), (&w).into(), 0.0, &x).unwrap();
    // residual = [3, 4], [0, 0]; rms = sqrt(12.5); the zero row divides 0 by 0.
    assert_eq!(be.download::<f32>(&res).unwrap(), vec![3.0, 4.0, 0.0, 0.0]);
    let out = be.download::<f32>(&x).unwrap();
    let r = 12.5f32.sqrt();
    assert!(
        (out[0] - 3.0 / r).abs() < 1e-6 && (out[1] - 8.0 / r).abs() < 1e-6,
        "{out:?}"
    );
    assert!(out[2].is_nan() && out[3].is_nan());
    // eps keeps the zero row finite.
    let z = be.upload(&[0.0f32, 0.0], &[1, 2]).unwrap();
    let out = be.alloc(DType::F32, &[1, 2]).unwrap();
    be.rms_norm(&z, None, (&w).into(), 1e-6, &out).unwrap();
    assert_eq!(be.download::<f32>(&out).unwrap(), vec![0.0, 0.0]);
}

#[test]
fn qkv_rope_write_rotates_first_rot_dims_and_skips_out_of_range_positions_and_slots() {
    let be = cpu();
    // 1 q head, 1 kv head, head_dim 6, rot 4: pairs (0, 2) and (1, 3) rotate, dims 4 and
    // 5 never change.
    let angle = |p: f32, i: usize| p * [1.0f32, 0.5][i];
    let max_positions = 3;
    let mut table = vec![0f32; max_positions * 4];
    for p in 0..max_positions {
        for i in 0..2 {
            table[p * 4 + i] = angle(p as f32, i).cos();
            table[p * 4 + 2 + i] = angle(p as f32, i).sin();
        }
    }
    let q = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let k = [11.0f32, 12.0, 13.0, 14.0, 15.0, 16.0];
    let v = [-1.0f32, -2.0, -3.0, -4.0, -5.0, -6.0];
    let rotated = |x: [f32; 6], p: f32| {
        let (c0, s0, c1, s1) = (p.cos(), p.sin(), (p / 2.0).cos(), (p / 2.0).sin());
        [
            x[0] * c0 - x[2] * s0,
            x[1] * c1 - x[3] * s1,
            x[2] * c0 + x[0] * s0,
            x[3] * c1 + x[1] * s1,
            x[4],
            x[5],
        ]
    };
    // Four tokens: positions 2, -1 and max_positions (the last two leave q and k as they
    // are), and 1; slots 1, 2, 4 (one past the 4-slot cache: skipped) and -1 (padding).
    let row = [q, k, v].concat();
    let qkv = be.upload(&row.repeat(4), &[4, 18]).unwrap();
    let pos = be.upload(&[2, -1, 3, 1], &[4]).unwrap();
    let slots = be.upload(&[1, 2, 4, -1], &[4]).unwrap();
    let cs = be.upload(&table, &[max_positions, 4]).unwrap();
    // 2 blocks of 2 slots.
    let kc = be.upload(&[7.0f32; 24], &[2, 2, 1, 6]).unwrap();
    let vc = be.upload(&[7.0f32; 24], &[2, 2, 1, 6]).unwrap();
    let q_out = be.upload(&[f32::NAN; 24], &[4, 1, 6]).unwrap();
    be.qkv_rope_write(&QkvRope {
        qkv: &qkv,
        head_norm: None,
        eps: 1e-6,
        positions: &pos,
        cos_sin: &cs,
        slot_mapping: &slots,
        q_out: &q_out,
        k_cache: &kc,
        v_cache: &vc,
        kv_scale: KvScale::ONE,
    })
    .unwrap();
    let close = |got: &[f32], want: &[f32]| {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-5, "{got:?} vs {want:?}");
        }
    };
    let got = be.download::<f32>(&q_out).unwrap();
    close(&got, &[rotated(q, 2.0), q, q, rotated(q, 1.0)].concat());
    let got = be.download::<f32>(&kc).unwrap();
    close(&got, &[[7.0; 6], rotated(k, 2.0), k, [7.0; 6]].concat());
    assert_eq!(
        be.download::<f32>(&vc).unwrap(),
        [[7.0; 6], v, v, [7.0; 6]].concat()
    );
}

#[test]
fn silu_mul_and_matmul_by_hand() {
    let be = cpu();
    let gu = be
        .upload(&[0.0f32, 20.0, -20.0, 3.0, 5.0, 2.0], &[1, 6])
        .unwrap();
    let out = be.alloc(DType::F32, &[1, 3]).unwrap();
    be.silu_mul(&gu, &out).unwrap();
    let got = be.download::<f32>(&out).unwrap();
    let silu = |x: f32| x / (1.0 + (-x).exp());
    assert_eq!(got[0], 0.0);
    assert!((got[1] - silu(20.0) * 5.0).abs() < 1e-4 && got[1] > 99.99);
    assert!((got[2] - silu(-20.0) * 2.0).abs() < 1e-9);

    let x = be.upload(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let w = be
        .upload(&[1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2])
        .unwrap();
    let bias = be.upload(&[0.5f32, 0.0, -1.0], &[3]).unwrap();
    let out = be.alloc(DType::F32, &[2, 3]).unwrap();
    be.matmul(&x, &w, Some(&bias), &out).unwrap();
    assert_eq!(
        be.download::<f32>(&out).unwrap(),
        vec![1.5, 2.0, 2.0, 3.5, 4.0, 6.0]
    );
    // k = 0: the product is empty, only the bias remains.
    let x0 = be.alloc(DType::F32, &[2, 0]).unwrap();
    let w0 = be.alloc(DType::F32, &[3, 0]).unwrap();
    be.matmul(&x0, &w0, Some(&bias), &out).unwrap();
    assert_eq!(
        be.download::<f32>(&out).unwrap(),
        vec![0.5, 0.0, -1.0, 0.5, 0.0, -1.0]
    );
}

/// One-head attention over a 3-block cache of block size 2, head_dim 2: key/value at
/// slot `s` are `[s, 1]` / `[10 s, -s]`.
struct Tiny {
    be: Box<dyn Backend>,
    kc: Tensor,
    vc: Tensor,
}

impl Tiny {
    fn new() -> Tiny {
        let be = cpu();
        let k: Vec<f32> = (0..6).flat_map(|s| [s as f32, 1.0]).collect();
        let v: Vec<f32> = (0..6)
            .flat_map(|s| [10.0 * s as f32, -(s as f32)])
            .collect();
        let kc = be.upload(&k, &[3, 2, 1, 2]).unwrap();
        let vc = be.upload(&v, &[3, 2, 1, 2]).unwrap();
        Tiny { be, kc, vc }
    }

    fn run(
        &self,
        q: &[f32],
        tables: &[i32],
        width: usize,
        lens: &[i32],
        cu: Option<&[i32]>,
    ) -> Vec<f32> {
        self.run_window(q, tables, width, lens, cu, None)
    }

    fn run_window(
        &self,
        q: &[f32],
        tables: &[i32],
        width: usize,
        lens: &[i32],
        cu: Option<&[i32]>,
        window: Option<usize>,
    ) -> Vec<f32> {
        let be = self.be.as_ref();
        let rows = q.len() / 2;
        let q = be.upload(q, &[rows, 1, 2]).unwrap();
        let tables = be.upload(tables, &[lens.len(), width]).unwrap();
        let lens_t = be.upload(lens, &[lens.len()]).unwrap();
        let cu = cu.map(|cu| be.upload(cu, &[cu.len()]).unwrap());
        let out = be.upload(&vec![f32::NAN; rows * 2], &[rows, 1, 2]).unwrap();
        let scratch = be.alloc(DType::F32, &[1]).unwrap();
        be.attention(&Attention {
            q: &q,
            k_cache: &self.kc,
            v_cache: &self.vc,
            kv_scale: KvScale::ONE,
            block_tables: &tables,
            seq_lens: &lens_t,
            cu_seqlens_q: cu.as_ref(),
            scale: 1.0,
            softcap: None,
            window,
            out: &out,
            scratch: &scratch,
        })
        .unwrap();
        be.download::<f32>(&out).unwrap()
    }
}

#[test]
fn attention_edge_cases_by_hand() {
    let t = Tiny::new();
    // Decode. seq 0: len 1 in block 2 -> exactly value slot 4. seq 1: len 0 -> zeros.
    // seq 2: len 2 in block 1 (slots 2, 3), q = [0, 0] -> uniform average of values.
    // seq 3: block id 7 is outside the cache: its keys contribute nothing -> zeros.
    let out = t.run(
        &[1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0],
        &[2, 0, 1, 7],
        1,
        &[1, 0, 2, 2],
        None,
    );
    assert_eq!(out, vec![40.0, -4.0, 0.0, 0.0, 25.0, -2.5, 0.0, 0.0]);

    // Context beyond the table (len 9 > width 2 * block 2) is clamped to 4 positions,
    // with the second entry out of range: only slots 0, 1 of block 0 count.
    let clamped = t.run(&[0.0, 0.0], &[0, -3], 2, &[9], None);
    assert_eq!(clamped, vec![5.0, -0.5]);

    // A softmax by hand: q = [ln 2, 0] over slots 2, 3 -> weights 2^2 : 2^3 = 1 : 2.
    let ln2 = std::f32::consts::LN_2;
    let out = t.run(&[ln2, 0.0], &[1], 1, &[2], None);
    let want = [(20.0 + 2.0 * 30.0) / 3.0, (-2.0 - 2.0 * 3.0) / 3.0];
    assert!(
        (out[0] - want[0]).abs() < 1e-4 && (out[1] - want[1]).abs() < 1e-5,
        "{out:?}"
    );

    // Prefill: seq 0 has len 2 and 3 query rows -> the first row's position is -1
    // (zeros), the second attends to slot 2 only, the third to slots 2 and 3. Seq 1 has
    // len 0 and 1 row (zeros); the last row is beyond cu[2] (zeros).
    let q = [0.0f32; 10];
    let out = t.run(&q, &[1, 2], 1, &[2, 0], Some(&[0, 3, 4]));
    assert_eq!(
        out,
        vec![0.0, 0.0, 20.0, -2.0, 25.0, -2.5, 0.0, 0.0, 0.0, 0.0]
    );

    // Sliding window, q = [0, 0] (uniform weights over the visible keys). Decode at
    // position 4 over blocks [0, 1, 2] (slots = positions): window 1 sees slot 4 only,
    // window 2 slots 3-4, window 5 all five, window 9 (beyond the context) all five too.
    let decode = |w| t.run_window(&[0.0, 0.0], &[0, 1, 2], 3, &[5], None, Some(w));
    assert_eq!(decode(1), vec![40.0, -4.0]);
    assert_eq!(decode(2), vec![35.0, -3.5]);
    assert_eq!(decode(5), vec![20.0, -2.0]);
    assert_eq!(decode(9), decode(5));
    assert_eq!(decode(5), t.run(&[0.0, 0.0], &[0, 1, 2], 3, &[5], None));
    // Prefill rows at positions 2, 3, 4 with window 2: slots {1, 2}, {2, 3}, {3, 4}.
    let out = t.run_window(&[0.0; 6], &[0, 1, 2], 3, &[5], Some(&[0, 3]), Some(2));
    assert_eq!(out, vec![15.0, -1.5, 25.0, -2.5, 35.0, -3.5]);
    // The window counts back from the position, not from the clamped context: position 8
    // (len 9) with a table of 2 blocks (positions 0-3) and window 3 sees positions 6-8,
    // none of them in the table -> zeros; window 6 sees positions 3-8 -> slot 3 only.
    let clamped = |w| t.run_window(&[0.0, 0.0], &[0, 1], 2, &[9], None, Some(w));
    assert_eq!(clamped(3), vec![0.0, 0.0]);
    assert_eq!(clamped(6), vec![30.0, -3.0]);
}

/// `err` matches the pattern (its message shown otherwise).
macro_rules! assert_matches {
    ($err:expr, $pat:pat) => {
        assert!(matches!($err, $pat), "{}", $err)
    };
}

#[test]
fn wrong_shapes_and_dtypes_name_the_tensor() {
    let be = cpu();
    let f32s = |shape: &[usize]| be.alloc(DType::F32, shape).unwrap();
    let x = f32s(&[2, 8]);

    let err = be
        .matmul(&x, &f32s(&[4, 7]), None, &f32s(&[2, 4]))
        .unwrap_err();
    assert_matches!(
        err,
        Error::Shape {
            op: "matmul",
            name: "w",
            ..
        }
    );
    let err = be
        .matmul(&x, &f32s(&[4, 8]), Some(&f32s(&[5])), &f32s(&[2, 4]))
        .unwrap_err();
    assert_matches!(err, Error::Shape { name: "bias", .. });
    let err = be
        .matmul(
            &x,
            &f32s(&[4, 8]),
            None,
            &be.alloc(DType::I32, &[2, 4]).unwrap(),
        )
        .unwrap_err();
    assert_matches!(
        err,
        Error::DType {
            name: "out",
            found: DType::I32,
            ..
        }
    );

    let w16 = be.alloc(DType::F16, &[8]).unwrap();
    let err = be.rms_norm(&x, None, (&w16).into(), 1e-5, &x).unwrap_err();
    assert_matches!(
        err,
        Error::DType {
            op: "rms_norm",
            name: "weight",
            found: DType::F16,
            ..
        }
    );
    let err = be
        .rms_norm(&x, Some(&f32s(&[2, 7])), (&f32s(&[8])).into(), 1e-5, &x)
        .unwrap_err();
    assert_matches!(
        err,
        Error::Shape {
            name: "residual",
            ..
        }
    );
    assert!(err.to_string().contains("residual"));

    let err = be.embedding(&f32s(&[2]), &x, &f32s(&[2, 8])).unwrap_err();
    assert_matches!(
        err,
        Error::DType {
            op: "embedding",
            name: "ids",
            ..
        }
    );

    let err = be.silu_mul(&f32s(&[2, 7]), &f32s(&[2, 3])).unwrap_err();
    assert_matches!(
        err,
        Error::Shape {
            name: "gate_up",
            ..
        }
    );
}

#[test]
fn wrong_attention_operands_name_the_tensor() {
    let be = cpu();
    let f32s = |shape: &[usize]| be.alloc(DType::F32, shape).unwrap();
    let i32s = |shape: &[usize]| be.alloc(DType::I32, shape).unwrap();
    let q = f32s(&[3, 4, 8]);
    let cache = f32s(&[5, 4, 2, 8]);
    let scratch = f32s(&[1]);
    let attention = |tables: &Tensor, lens: &Tensor, window: Option<usize>| {
        be.attention(&Attention {
            q: &q,
            k_cache: &cache,
            v_cache: &cache,
            kv_scale: KvScale::ONE,
            block_tables: tables,
            seq_lens: lens,
            cu_seqlens_q: None,
            scale: 1.0,
            softcap: None,
            window,
            out: &q,
            scratch: &scratch,
        })
        .unwrap_err()
    };
    let err = attention(&i32s(&[3, 2]), &i32s(&[4]), None);
    assert_matches!(
        err,
        Error::Shape {
            op: "attention",
            name: "seq_lens",
            ..
        }
    );
    let err = attention(&f32s(&[3, 2]), &i32s(&[3]), None);
    assert_matches!(
        err,
        Error::DType {
            name: "block_tables",
            ..
        }
    );
    let err = attention(&i32s(&[3, 2]), &i32s(&[3]), Some(0));
    assert!(err.to_string().contains("window must be >= 1"), "{err}");
}

#[test]
fn wrong_sampling_operands_name_the_tensor() {
    let be = cpu();
    let f32s = |shape: &[usize]| be.alloc(DType::F32, shape).unwrap();
    let i32s = |shape: &[usize]| be.alloc(DType::I32, shape).unwrap();
    let logits = f32s(&[2, 10]);
    let (t, k, p) = (f32s(&[2]), i32s(&[2]), f32s(&[2]));
    let seeds = i32s(&[2]);
    let min_p = f32s(&[2]);
    let params = Sampling {
        temperature: &t,
        top_k: &k,
        top_p: &p,
        min_p: &min_p,
        seeds: &seeds,
        penalties: None,
        logprobs: None,
        mask: None,
    };
    let err = be.sample(&logits, &params, &i32s(&[2])).unwrap_err();
    assert_matches!(
        err,
        Error::DType {
            op: "sample",
            name: "seeds",
            found: DType::I32,
            ..
        }
    );
    let seeds = be.alloc(DType::I64, &[2]).unwrap();
    let (counts, slot) = (i32s(&[3, 11]), i32s(&[2]));
    let (rep, freq, pres) = (f32s(&[2]), f32s(&[2]), f32s(&[2]));
    let penalties = || {
        Some(encore_backend::Penalties {
            counts: &counts,
            slot: &slot,
            repetition: &rep,
            frequency: &freq,
            presence: &pres,
        })
    };
    let params = Sampling {
        seeds: &seeds,
        penalties: penalties(),
        ..params
    };
    let err = be.sample(&logits, &params, &i32s(&[2])).unwrap_err();
    assert_matches!(
        err,
        Error::Shape {
            op: "sample",
            name: "counts",
            ..
        }
    );
    let (num, token) = (i32s(&[2]), f32s(&[2]));
    let (ids, top) = (i32s(&[2, 21]), f32s(&[2, 21]));
    let params = Sampling {
        penalties: None,
        logprobs: Some(encore_backend::SampleLogprobs {
            num: &num,
            token: &token,
            top_ids: &ids,
            top: &top,
            target: None,
        }),
        ..params
    };
    let err = be.sample(&logits, &params, &i32s(&[2])).unwrap_err();
    assert_matches!(
        err,
        Error::Shape {
            op: "sample",
            name: "top_ids",
            ..
        }
    );
    // A mask narrower than the vocabulary needs (21 tokens: one word), and one of the
    // wrong type.
    let (bits, on) = (i32s(&[2, 0]), i32s(&[2]));
    let params = Sampling {
        logprobs: None,
        mask: Some(encore_backend::TokenMask {
            bits: &bits,
            on: &on,
        }),
        ..params
    };
    let err = be.sample(&logits, &params, &i32s(&[2])).unwrap_err();
    assert_matches!(
        err,
        Error::Shape {
            op: "sample",
            name: "mask_bits",
            ..
        }
    );
    let bits = f32s(&[2, 1]);
    let params = Sampling {
        mask: Some(encore_backend::TokenMask {
            bits: &bits,
            on: &on,
        }),
        ..params
    };
    assert!(be.sample(&logits, &params, &i32s(&[2])).is_err());
    // NOTE: wrong-device errors need tensors of a second device kind; the GPU suite
    // (tests/cuda.rs) covers them.
}

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
