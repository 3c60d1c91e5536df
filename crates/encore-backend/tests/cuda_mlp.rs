//! GPU tests (`#[ignore = "needs a CUDA device"]`; run with `--include-ignored` on the GPU
//! machine): the dense MLP op (`Backend::mlp`). Where the FP8 GEMM runs the down projection,
//! CUDA quantizes the activation straight from the gate/up product into that GEMM's operand
//! (`fp8_act_quant_{rows,tokens}_*`): its result must be the unfused ops' (`matmul_act_mul`,
//! then `matmul`) bit for bit, with the activation buffer never written; elsewhere (the
//! rows of the quantized gemvs, another format) the op is the unfused ops. Both
//! block-scaled (per 128 values, below `FP8_ROWWISE_MIN_ROWS` rows or with 128-value weight
//! scales) and row-wise x, every activation, bf16 and f16, and inside a captured graph.

use encore_backend::backend::cpu::CpuBackend;
use encore_backend::backend::cuda::{qgemv_default_rows, CudaBackend, FP8_ROWWISE_MIN_ROWS};
use encore_backend::backend::{Activation, Mlp, Norm, NormMatmul, PreNorm};
use encore_backend::quant::{self, QuantFormat};
use encore_backend::testing::compare::{tolerance, OpClass};
use encore_backend::{Backend, DType, Tensor};

/// Seeded normal values (std 1: the shared test inputs' generator), so that scales differ.
fn values(n: usize, seed: u64) -> Vec<f32> {
    encore_backend::testing::inputs::normal(&mut encore_backend::testing::inputs::rng(seed), n, 1.0)
}

/// A random `[n, k]` weight in `fmt` on `be`: FP8 with one scale a row (marked so: the
/// row-wise GEMM) or one per 128 values.
fn weight(be: &dyn Backend, fmt: QuantFormat, n: usize, k: usize, rows: bool, seed: u64) -> Tensor {
    let v: Vec<f32> = values(n * k, seed)
        .iter()
        .map(|x| x / (k as f32).sqrt())
        .collect();
    let mut bytes = vec![0u8; fmt.bytes(n, k).unwrap()];
    if rows {
        quant::quantize_rows(fmt, &v, k, &mut bytes);
    } else {
        quant::quantize_rows_by_block(fmt, &v, k, &mut bytes);
    }
    let w = be.alloc(DType::Q(fmt), &[n, k]).unwrap();
    be.write_bytes(&w, &bytes).unwrap();
    if fmt == QuantFormat::F8E4M3 && rows {
        assert!(quant::rows_share_one_scale(fmt, k, &bytes));
        w.with_row_scale()
    } else {
        w
    }
}

/// One MLP's tensors on a backend (`x` is the block output before the residual add when
/// the shape has a pre-norm).
struct Run {
    x: Tensor,
    residual: Tensor,
    norm_w: Tensor,
    normed: Tensor,
    gate_up: Tensor,
    down: Tensor,
    gu_out: Tensor,
    act_out: Tensor,
    out: Tensor,
}

/// The bytes `act_out` holds before a call: a fused call leaves them.
const POISON: u8 = 0x5A;

struct Shape {
    m: usize,
    hidden: usize,
    inter: usize,
    dt: DType,
    act: Activation,
    /// The formats of gate/up and down, and whether FP8 weights hold one scale a row.
    fmt: (QuantFormat, QuantFormat),
    rows: bool,
    /// The residual add and RMSNorm first (`Mlp::norm`).
    norm: bool,
}

impl Shape {
    fn name(&self) -> String {
        format!(
            "m={} hidden={} inter={} {} {} {}/{}{}",
            self.m,
            self.hidden,
            self.inter,
            self.dt,
            self.act.hf_name(),
            self.fmt.0,
            self.fmt.1,
            if self.rows { " row-scaled" } else { "" }
        ) + if self.norm { " pre-norm" } else { "" }
    }

    fn pre<'a>(&self, r: &'a Run) -> Option<PreNorm<'a>> {
        self.norm.then_some(PreNorm {
            residual: &r.residual,
            norm: Norm::Rms(&r.norm_w),
            eps: 1e-5,
            normed: &r.normed,
        })
    }

    /// Whether CUDA fuses the activation into the down projection's FP8 operand: past the
    /// rows the quantized gemvs take (their x is never quantized).
    fn fused(&self) -> bool {
        self.m > qgemv_default_rows(self.fmt.1)
            && self.fmt.1 == QuantFormat::F8E4M3
            && self.dt != DType::F32
    }

    fn alloc(&self, be: &dyn Backend, seed: u64) -> Run {
        let (m, h, i) = (self.m, self.hidden, self.inter);
        let run = Run {
            x: be
                .upload_f32_as(&values(m * h, seed), &[m, h], self.dt)
                .unwrap(),
            residual: be
                .upload_f32_as(&values(m * h, seed + 3), &[m, h], self.dt)
                .unwrap(),
            norm_w: be
                .upload_f32_as(&values(h, seed + 4), &[h], self.dt)
                .unwrap(),
            normed: be.alloc(self.dt, &[m, h]).unwrap(),
            gate_up: weight(be, self.fmt.0, 2 * i, h, self.rows, seed + 1),
            down: weight(be, self.fmt.1, h, i, self.rows, seed + 2),
            gu_out: be.alloc(self.dt, &[m, 2 * i]).unwrap(),
            act_out: be.alloc(self.dt, &[m, i]).unwrap(),
            out: be.alloc(self.dt, &[m, h]).unwrap(),
        };
        let act_bytes = run.act_out.size_bytes();
        be.write_bytes(&run.act_out, &vec![POISON; act_bytes])
            .unwrap();
        run
    }

    fn mlp(&self, be: &dyn Backend, r: &Run) {
        be.mlp(&Mlp {
            act: self.act,
            x: &r.x,
            norm: self.pre(r),
            gate_up: &r.gate_up,
            down: &r.down,
            gate_up_out: &r.gu_out,
            act_out: &r.act_out,
            out: &r.out,
        })
        .unwrap_or_else(|e| panic!("{}: {e}", self.name()));
    }

    fn unfused(&self, be: &dyn Backend, r: &Run) {
        let x = match self.pre(r) {
            Some(n) => {
                be.rms_norm(&r.x, Some(n.residual), n.norm, n.eps, n.normed)
                    .unwrap();
                &r.normed
            }
            None => &r.x,
        };
        be.matmul_act_mul(self.act, x, &r.gate_up, &r.gu_out, &r.act_out)
            .unwrap();
        be.matmul(&r.act_out, &r.down, None, &r.out).unwrap();
    }
}

fn bits(be: &dyn Backend, t: &Tensor) -> Vec<u32> {
    be.download_f32(t)
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// The normalised error of `got` against `want`.
fn normalised(got: &[f32], want: &[f32]) -> f64 {
    let (mut d, mut n) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        d += (g as f64 - w as f64).powi(2);
        n += (w as f64).powi(2);
    }
    (d / n.max(1e-30)).sqrt()
}

fn shapes() -> Vec<Shape> {
    let f8 = QuantFormat::F8E4M3;
    let r = FP8_ROWWISE_MIN_ROWS;
    let mut out = Vec::new();
    for (dt, act) in [
        (DType::BF16, Activation::Silu),
        (DType::F16, Activation::GeluTanh),
        (DType::BF16, Activation::Gelu),
        (DType::F16, Activation::Relu2),
    ] {
        // (m, hidden, inter, formats, row-scaled): per-128 x at 2..r rows or with block
        // weight scales; per-token x from r rows (inter past FQT_HELD * 2048 values once:
        // the row read twice); one and two rows (the gemvs) and a Q8_0 down (the unfused
        // ops).
        for (m, hidden, inter, fmt, rows) in [
            (2, 256, 384, (f8, f8), true),
            (7, 128, 640, (f8, f8), false),
            (64, 384, 512, (f8, f8), true),
            (r - 1, 256, 384, (f8, f8), true),
            (r, 256, 384, (f8, f8), true),
            (300, 512, 1280, (f8, f8), true),
            (300, 256, 384, (f8, f8), false),
            (1024, 256, 640, (QuantFormat::Q4K, f8), true),
            (161, 128, 16384 + 256, (f8, f8), true),
            (1, 256, 384, (f8, f8), true),
            (2, 256, 384, (f8, f8), false),
            (64, 256, 384, (f8, QuantFormat::Q8_0), true),
        ] {
            for norm in [false, true] {
                out.push(Shape {
                    m,
                    hidden,
                    inter,
                    dt,
                    act,
                    fmt,
                    rows,
                    norm,
                });
            }
        }
    }
    out
}

#[test]
#[ignore = "needs a CUDA device"]
fn fp8_mlp_fuses_the_activation_bit_for_bit() {
    let gpu = CudaBackend::new(0).unwrap();
    gpu.reserve_dequant_scratch(256 << 20).unwrap();
    let gpu: &dyn Backend = &gpu;
    let cpu = CpuBackend::new();
    let cpu: &dyn Backend = &cpu;
    let mut fused = 0;
    for (i, s) in shapes().iter().enumerate() {
        let seed = 100 * i as u64;
        let (a, b) = (s.alloc(gpu, seed), s.alloc(gpu, seed));
        s.mlp(gpu, &a);
        s.unfused(gpu, &b);
        let name = s.name();
        let (got, want) = (bits(gpu, &a.out), bits(gpu, &b.out));
        let differ = got.iter().zip(&want).filter(|(g, w)| g != w).count();
        assert_eq!(
            differ,
            0,
            "{name}: {differ} of {} outputs differ",
            got.len()
        );
        assert_eq!(
            bits(gpu, &a.residual),
            bits(gpu, &b.residual),
            "{name}: residual"
        );
        let mut act = vec![0u8; a.act_out.size_bytes()];
        gpu.read_bytes(&a.act_out, &mut act).unwrap();
        if s.fused() {
            assert!(
                act.iter().all(|&v| v == POISON),
                "{name}: the fused MLP wrote its activation"
            );
            fused += 1;
        } else {
            assert_eq!(bits(gpu, &a.act_out), bits(gpu, &b.act_out), "{name}");
        }
        // And near the CPU's exact decode (the GPU's x is quantized to E4M3).
        let c = s.alloc(cpu, seed);
        s.mlp(cpu, &c);
        let (g, w) = (
            gpu.download_f32(&a.out).unwrap(),
            cpu.download_f32(&c.out).unwrap(),
        );
        let (err, tol) = (normalised(&g, &w), tolerance(OpClass::Fp8Activations, s.dt));
        assert!(
            err <= tol,
            "{name}: normalised error {err:.3e} > {tol:.1e} vs the CPU"
        );
    }
    assert!(fused >= 60, "{fused} shapes fused");
}

/// The fused op inside a captured graph replays as it runs eagerly, on new x (with the
/// pre-norm from 100 rows).
#[test]
#[ignore = "needs a CUDA device"]
fn fp8_mlp_captures_and_replays() {
    let gpu = CudaBackend::new(0).unwrap();
    gpu.reserve_dequant_scratch(256 << 20).unwrap();
    let gpu: &dyn Backend = &gpu;
    for m in [48, 2 * FP8_ROWWISE_MIN_ROWS] {
        let s = Shape {
            m,
            hidden: 256,
            inter: 768,
            dt: DType::BF16,
            act: Activation::Silu,
            fmt: (QuantFormat::F8E4M3, QuantFormat::F8E4M3),
            rows: true,
            norm: m > 100,
        };
        let r = s.alloc(gpu, 7);
        // The pre-norm adds x to the residual in place: each run starts from this one.
        let residual0 = gpu.alloc(DType::BF16, &[m, 256]).unwrap();
        gpu.copy(&r.residual, &residual0).unwrap();
        gpu.begin_capture().unwrap();
        s.mlp(gpu, &r);
        let graph = gpu.end_capture().unwrap();
        let x2 = gpu
            .upload_f32_as(&values(m * 256, 99), &[m, 256], DType::BF16)
            .unwrap();
        gpu.copy(&x2, &r.x).unwrap();
        graph.replay().unwrap();
        let (replayed, res_replayed) = (bits(gpu, &r.out), bits(gpu, &r.residual));
        gpu.copy(&residual0, &r.residual).unwrap();
        s.mlp(gpu, &r);
        assert_eq!(replayed, bits(gpu, &r.out), "m={m}");
        assert_eq!(res_replayed, bits(gpu, &r.residual), "m={m}: residual");
    }
}

/// `add_norm_matmul`: the residual add and RMSNorm fused into the FP8 GEMM's x (past the
/// gemvs' rows, bf16 / f16, block-scaled and row-wise x, with and without a bias, hidden
/// sizes that take one to four vectors a thread) against `rms_norm` then `matmul` on the
/// same device, bit for bit, the normed rows never written; a Q4_K weight and one row
/// take the unfused ops.
#[test]
#[ignore = "needs a CUDA device"]
fn fp8_add_norm_matmul_fuses_the_norm_bit_for_bit() {
    let gpu = CudaBackend::new(0).unwrap();
    gpu.reserve_dequant_scratch(256 << 20).unwrap();
    let gpu: &dyn Backend = &gpu;
    let f8 = QuantFormat::F8E4M3;
    let r = FP8_ROWWISE_MIN_ROWS;
    let mut fused = 0;
    for (i, &(m, d, n, dt, fmt, rows, bias)) in [
        (1, 256, 64, DType::BF16, f8, true, false),
        (8, 384, 72, DType::BF16, f8, true, true),
        (33, 4096, 128, DType::F16, f8, false, false),
        (r - 1, 1280, 96, DType::BF16, f8, true, false),
        (r, 512, 80, DType::F16, f8, true, true),
        (300, 4096, 256, DType::BF16, f8, true, false),
        (257, 8192, 64, DType::BF16, f8, true, false),
        (200, 16384 + 128, 32, DType::F16, f8, true, false),
        (300, 4096, 256, DType::BF16, f8, false, true),
        (64, 512, 96, DType::BF16, QuantFormat::Q4K, true, false),
    ]
    .iter()
    .enumerate()
    {
        let seed = 7000 + 10 * i as u64;
        let up = |v: Vec<f32>, shape: &[usize]| gpu.upload_f32_as(&v, shape, dt).unwrap();
        let make = || {
            let x = up(values(m * d, seed), &[m, d]);
            let res = up(values(m * d, seed + 1), &[m, d]);
            let normed = gpu.alloc(dt, &[m, d]).unwrap();
            gpu.write_bytes(&normed, &vec![POISON; normed.size_bytes()])
                .unwrap();
            (x, res, normed, gpu.alloc(dt, &[m, n]).unwrap())
        };
        let nw = up(values(d, seed + 2), &[d]);
        let w = weight(gpu, fmt, n, d, rows, seed + 3);
        let b = bias.then(|| up(values(n, seed + 4), &[n]));
        let name = format!(
            "m={m} d={d} n={n} {dt} {fmt}{}",
            if bias { " bias" } else { "" }
        );
        let (x, res, normed, out) = make();
        gpu.add_norm_matmul(&NormMatmul {
            x: &x,
            norm: PreNorm {
                residual: &res,
                norm: Norm::Rms(&nw),
                eps: 1e-6,
                normed: &normed,
            },
            w: &w,
            bias: b.as_ref(),
            out: &out,
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let (x2, res2, normed2, out2) = make();
        gpu.rms_norm(&x2, Some(&res2), Norm::Rms(&nw), 1e-6, &normed2)
            .unwrap();
        gpu.matmul(&normed2, &w, b.as_ref(), &out2).unwrap();
        assert_eq!(bits(gpu, &out), bits(gpu, &out2), "{name}: out");
        assert_eq!(bits(gpu, &res), bits(gpu, &res2), "{name}: residual");
        let mut raw = vec![0u8; normed.size_bytes()];
        gpu.read_bytes(&normed, &mut raw).unwrap();
        if m > qgemv_default_rows(fmt) && fmt == f8 {
            assert!(
                raw.iter().all(|&v| v == POISON),
                "{name}: wrote the normed rows"
            );
            fused += 1;
        } else {
            assert_eq!(bits(gpu, &normed), bits(gpu, &normed2), "{name}: normed");
        }
    }
    assert_eq!(fused, 8);
}
