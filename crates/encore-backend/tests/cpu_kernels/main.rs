//! The CPU kernels against the naive f64 reference on random inputs, targeted edge cases
//! of the op semantics with hand-computed answers, and argument validation.

use encore_backend::backend::cpu::CpuBackend;
use encore_backend::testing::{self, compare};
use encore_backend::{Attention, Backend, DType, Error, KvScale, QkvRope, Sampling, Tensor};

mod gather;
mod gpt_oss;
mod moe;

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
            "gather_columns",
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
            sinks: None,
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
            sinks: None,
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
    // (tests/cuda/) covers them.
}
