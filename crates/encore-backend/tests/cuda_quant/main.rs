//! GPU tests (`#[ignore = "needs a CUDA device"]`; run with `--include-ignored` on the GPU
//! machine): the CUDA backend's matmuls with a quantized weight against the CPU backend,
//! the reference (it decodes with `quant::dequantize_row` and accumulates in f32). Every
//! format; 1..=8 rows of x (the quantized gemv kernels, whole and partial chunks, k split
//! over warps) and more (bf16/f16 x: the tensor-core kernel, 64- and 128-row tiles, k split
//! over CTAs; f32 x: decode into the scratch, then cuBLASLt); odd n; k of 1, 3 and 16
//! blocks; x in bf16, f16, f32; out in x's dtype or f32; with and without a bias; the fused
//! gate/up + SiLU·mul; decoded weights bit for bit; capture and replay.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use encore_backend::backend::cpu::CpuBackend;
use encore_backend::backend::cuda::{
    qgemv_default_rows, CudaBackend, QuantGemm, FP8_ROWWISE_MIN_ROWS,
};
use encore_backend::backend::Activation;
use encore_backend::quant::{self, QuantFormat};
use encore_backend::testing::compare::{tolerance, OpClass};
use encore_backend::{Backend, DType, ExpertSlots, Tensor};

mod marlin;
mod moe;
mod moe_bias;

/// One test at a time: a backend has one stream, and a capture must not see another
/// test's launches.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// One backend for the binary per quantized-GEMM mode (opening one compiles or loads every
/// kernel), its scratch reserved as a model's would be (so which kernel runs a shape does
/// not depend on the tests that ran before); one more, `Auto` with the quantized gemv up to
/// 8 rows (`gemv8`), for the gemv's variants past its default rows.
fn backend_with(mode: QuantGemm, gemv8: bool) -> Arc<CudaBackend> {
    static BE: [OnceLock<Arc<CudaBackend>>; 5] = [
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
    ];
    let i = match (mode, gemv8) {
        (QuantGemm::Auto, false) => 0,
        (QuantGemm::Mma, _) => 1,
        (QuantGemm::Dequant, _) => 2,
        (QuantGemm::Auto, true) => 3,
        (QuantGemm::Marlin, _) => 4,
    };
    BE[i]
        .get_or_init(|| {
            let mut be = CudaBackend::new(0)
                .unwrap_or_else(|e| panic!("{e}"))
                .with_quant_gemm(mode);
            if gemv8 {
                be = be.with_qgemv_max_rows(8);
            }
            be.reserve_dequant_scratch(64 << 20).unwrap();
            Arc::new(be)
        })
        .clone()
}

fn backend(mode: QuantGemm) -> Arc<CudaBackend> {
    backend_with(mode, false)
}

/// The backend as a model runs it (`QuantGemm::Auto`).
fn cuda() -> Arc<CudaBackend> {
    backend(QuantGemm::Auto)
}

/// Seeded uniform values in [-1, 1) (xorshift), with a few larger ones so that block
/// scales differ.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let v = ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0;
            if i % 53 == 0 {
                4.0 * v
            } else {
                v
            }
        })
        .collect()
}

/// The device bytes of a random `[n, k]` weight quantized to `fmt` (FP8: one scale a row).
fn weight_bytes(fmt: QuantFormat, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; fmt.bytes(n, k).unwrap()];
    quant::quantize_rows(fmt, &values(n * k, seed), k, &mut bytes);
    bytes
}

/// [`weight_bytes`] with every block scaled alone (FP8: 128-value scales, as a
/// block-scaled checkpoint).
fn weight_bytes_by_block(fmt: QuantFormat, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; fmt.bytes(n, k).unwrap()];
    quant::quantize_rows_by_block(fmt, &values(n * k, seed), k, &mut bytes);
    bytes
}

fn upload_q(be: &dyn Backend, fmt: QuantFormat, n: usize, k: usize, bytes: &[u8]) -> Tensor {
    let w = be.alloc(DType::Q(fmt), &[n, k]).unwrap();
    be.write_bytes(&w, bytes).unwrap();
    w
}

/// A matmul's inputs, as host data.
struct Case {
    fmt: QuantFormat,
    m: usize,
    n: usize,
    k: usize,
    dt: DType,
    out: DType,
    bias: bool,
    seed: u64,
    /// The weight is marked as one scale a row (`Tensor::with_row_scale`: the row-wise
    /// FP8 GEMM); its bytes must be so.
    row_scale: bool,
}

impl Case {
    fn name(&self) -> String {
        format!(
            "{} m={} n={} k={} x {} out {}{}{}",
            self.fmt,
            self.m,
            self.n,
            self.k,
            self.dt,
            self.out,
            if self.bias { " bias" } else { "" },
            if self.row_scale { " row-scaled" } else { "" }
        )
    }

    /// Whether CUDA in `mode`, its gemv taking up to `gemv_rows` rows, runs this case as
    /// Hopper's FP8 GEMM, whose x is quantized to E4M3 per row and 128 values (`fp8_fits`
    /// in the backend, given the reserved scratch).
    fn fp8_gemm(&self, mode: QuantGemm, gemv_rows: usize) -> bool {
        mode == QuantGemm::Auto
            && self.fmt == QuantFormat::F8E4M3
            && self.m > gemv_rows
            && self.dt != DType::F32
            && self.n.is_multiple_of(8)
            && (self.out == self.dt || !self.bias)
    }

    /// The CPU's result for CUDA in `mode`: `run`, or for the FP8 GEMM the same product with
    /// x as that GEMM sees it (rounded to the dtype, then quantized to E4M3 with per-128
    /// scales as `fp8_quant_rows` does, or one scale a row as `fp8_quant_tokens` does for a
    /// row-scaled weight from `FP8_ROWWISE_MIN_ROWS` rows), in f32.
    fn reference(
        &self,
        cpu: &dyn Backend,
        w_bytes: &[u8],
        mode: QuantGemm,
        gemv_rows: usize,
    ) -> Vec<f32> {
        if !self.fp8_gemm(mode, gemv_rows) {
            return self.run(cpu, w_bytes);
        }
        let x = cpu
            .upload_f32_as(
                &values(self.m * self.k, self.seed + 1),
                &[self.m, self.k],
                self.dt,
            )
            .unwrap();
        let x = cpu.download_f32(&x).unwrap();
        let fmt = QuantFormat::F8E4M3;
        let mut q = vec![0u8; fmt.bytes(self.m, self.k).unwrap()];
        if self.row_scale && self.m >= FP8_ROWWISE_MIN_ROWS {
            quant::quantize_rows(fmt, &x, self.k, &mut q);
        } else {
            quant::quantize_rows_by_block(fmt, &x, self.k, &mut q);
        }
        let rb = fmt.row_bytes(self.k).unwrap();
        let mut xq = vec![0f32; self.m * self.k];
        for (row, o) in q.chunks_exact(rb).zip(xq.chunks_exact_mut(self.k)) {
            quant::dequantize_row(fmt, row, o);
        }
        let x = cpu
            .upload_f32_as(&xq, &[self.m, self.k], DType::F32)
            .unwrap();
        let w = upload_q(cpu, self.fmt, self.n, self.k, w_bytes);
        let bias = self.bias.then(|| {
            let b = cpu
                .upload_f32_as(&values(self.n, self.seed + 2), &[self.n], self.dt)
                .unwrap();
            let b = cpu.download_f32(&b).unwrap();
            cpu.upload_f32_as(&b, &[self.n], DType::F32).unwrap()
        });
        let out = cpu.alloc(DType::F32, &[self.m, self.n]).unwrap();
        cpu.matmul(&x, &w, bias.as_ref(), &out).unwrap();
        cpu.download_f32(&out).unwrap()
    }

    /// `matmul` on `be`, the result as f32.
    fn run(&self, be: &dyn Backend, w_bytes: &[u8]) -> Vec<f32> {
        let x = be
            .upload_f32_as(
                &values(self.m * self.k, self.seed + 1),
                &[self.m, self.k],
                self.dt,
            )
            .unwrap();
        let mut w = upload_q(be, self.fmt, self.n, self.k, w_bytes);
        if self.row_scale {
            assert!(quant::rows_share_one_scale(self.fmt, self.k, w_bytes));
            w = w.with_row_scale();
        }
        let bias = self.bias.then(|| {
            be.upload_f32_as(&values(self.n, self.seed + 2), &[self.n], self.dt)
                .unwrap()
        });
        let out = be.alloc(self.out, &[self.m, self.n]).unwrap();
        be.matmul(&x, &w, bias.as_ref(), &out)
            .unwrap_or_else(|e| panic!("{}: {e}", self.name()));
        be.download_f32(&out).unwrap()
    }
}

/// `got` against `want`: the normalised error over the tensor within the repository's
/// matmul tolerance for the dtype of the inputs, and every element within 4 tolerances of
/// its own size plus the tensor's RMS (so one wrong element cannot hide in a large tensor).
/// The CUDA paths of a mixture-of-experts layer, each pinned: the pair kernels on the
/// tensor cores (x in bf16; the others fall back to f32), the f32 pair kernels, and the
/// grouped GEMM from one token on (x in bf16 / f16; f32 stays on the pair kernels).
fn moe_paths() -> [(&'static str, CudaBackend); 3] {
    let pairs = || {
        CudaBackend::new(0)
            .unwrap()
            .with_moe_gemm_min_tokens(usize::MAX)
    };
    [
        ("pairs", pairs().with_moe_pairs_mma(true)),
        ("pairs in f32", pairs().with_moe_pairs_mma(false)),
        (
            "grouped",
            CudaBackend::new(0).unwrap().with_moe_gemm_min_tokens(1),
        ),
    ]
}

fn assert_close(name: &str, got: &[f32], want: &[f32], dt: DType) {
    assert_eq!(got.len(), want.len(), "{name}");
    let tol = tolerance(OpClass::Reduction, dt);
    let (mut diff, mut norm) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        assert!(g.is_finite(), "{name}: non-finite output {g}");
        diff += (g as f64 - w as f64).powi(2);
        norm += (w as f64).powi(2);
    }
    let rms = (norm / want.len() as f64).sqrt();
    let err = if norm == 0.0 {
        diff.sqrt()
    } else {
        (diff / norm).sqrt()
    };
    assert!(err <= tol, "{name}: normalised error {err:.3e} > {tol:.1e}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let bound = 4.0 * tol * (w.abs() as f64 + rms) + 1e-30;
        assert!(
            (g as f64 - w as f64).abs() <= bound,
            "{name}: element {i}: {g} vs {w} (bound {bound:.3e})"
        );
    }
}

const ROWS: [usize; 12] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 33, 64];
const NS: [usize; 4] = [1, 7, 129, 1000];
const BLOCKS: [usize; 3] = [1, 3, 16];
/// (x, out, bias) combinations: out in x's dtype or f32, a bias only with out in x's dtype.
const KINDS: [(DType, DType, bool); 8] = [
    (DType::BF16, DType::BF16, false),
    (DType::BF16, DType::BF16, true),
    (DType::BF16, DType::F32, false),
    (DType::F16, DType::F16, false),
    (DType::F16, DType::F16, true),
    (DType::F16, DType::F32, false),
    (DType::F32, DType::F32, false),
    (DType::F32, DType::F32, true),
];

/// Every format x every row count x every (x, out, bias) kind, with n and k rotating
/// through their lists so that each row count meets every n and every k.
#[test]
#[ignore = "needs a CUDA device"]
fn quantized_matmul_matches_cpu() {
    let _serial = serial();
    let gpu = cuda();
    let gpu: &dyn Backend = gpu.as_ref();
    let gemv8 = backend_with(QuantGemm::Auto, true);
    let gemv8: &dyn Backend = gemv8.as_ref();
    let cpu = CpuBackend::new();
    let mut count = 0;
    for (f, fmt) in QuantFormat::ALL.into_iter().enumerate() {
        for (i, &m) in ROWS.iter().enumerate() {
            for (j, &(dt, out, bias)) in KINDS.iter().enumerate() {
                let n = NS[(i + j + f) % NS.len()];
                let k = BLOCKS[(i + 2 * j + f) % BLOCKS.len()] * fmt.block_elems();
                let seed = (1000 * f + 100 * i + j) as u64;
                // FP8 twice: 128-value weight scales, then one a row (the row-wise GEMM).
                for row_scale in [false, true] {
                    if row_scale && fmt != QuantFormat::F8E4M3 {
                        continue;
                    }
                    let case = Case {
                        fmt,
                        m,
                        n,
                        k,
                        dt,
                        out,
                        bias,
                        seed,
                        row_scale,
                    };
                    let w = if row_scale {
                        weight_bytes(fmt, n, k, seed)
                    } else {
                        weight_bytes_by_block(fmt, n, k, seed)
                    };
                    let got = case.run(gpu, &w);
                    let want = case.reference(&cpu, &w, QuantGemm::Auto, qgemv_default_rows(fmt));
                    assert_close(&case.name(), &got, &want, dt);
                    count += 1;
                    if (qgemv_default_rows(fmt) + 1..=8).contains(&m) {
                        // The gemv's variants past its default rows.
                        let got = case.run(gemv8, &w);
                        let want = case.reference(&cpu, &w, QuantGemm::Auto, 8);
                        assert_close(&format!("gemv8 {}", case.name()), &got, &want, dt);
                    }
                }
            }
        }
    }
    eprintln!("{count} quantized matmuls match the CPU");
}

/// The large shapes of a decode step (k split over warps, many CTAs) for every format,
/// one and eight rows.
#[test]
#[ignore = "needs a CUDA device"]
fn quantized_gemv_matches_cpu_at_model_shapes() {
    let _serial = serial();
    let gpu = backend_with(QuantGemm::Auto, true);
    let gpu: &dyn Backend = gpu.as_ref();
    let cpu = CpuBackend::new();
    for fmt in QuantFormat::ALL {
        for (m, n, k) in [
            (1, 4096, 4096),
            (1, 256, 14336),
            (8, 1024, 4096),
            (3, 96, 8192),
        ] {
            let case = Case {
                fmt,
                m,
                n,
                k,
                dt: DType::BF16,
                out: DType::BF16,
                bias: false,
                seed: (m * n) as u64,
                row_scale: false,
            };
            let w = weight_bytes(fmt, n, k, case.seed);
            assert_close(
                &case.name(),
                &case.run(gpu, &w),
                &case.run(&cpu, &w),
                DType::BF16,
            );
        }
    }
}

/// x = the identity (k rows: the tensor-core kernel for bf16/f16, decode-then-GEMM for
/// f32): out = the decoded weight, transposed and rounded to T once, bit for bit the CPU's.
/// Except bf16 with the formats the tensor-core kernel decodes straight to bf16 pairs
/// (`decode_bf16`: Q4_0, Q4_1, Q4_K, Q5_K, Q6_K): their scales are rounded to bf16 before
/// the one rounding of the value, so a weight may differ from the CPU's by about an ulp
/// of the largest weight of its row: 2^-6 of it is allowed (Q4's own step is 1/15 of a
/// block's range).
#[test]
#[ignore = "needs a CUDA device"]
fn dequantized_weights_are_bit_exact() {
    let _serial = serial();
    let gpu = cuda();
    let gpu: &dyn Backend = gpu.as_ref();
    let cpu = CpuBackend::new();
    for fmt in QuantFormat::ALL {
        for (n, blocks) in [(7, 1), (129, 3)] {
            let k = blocks * fmt.block_elems();
            let w_bytes = weight_bytes(fmt, n, k, (n + k) as u64);
            for dt in [DType::BF16, DType::F16, DType::F32] {
                let eye: Vec<f32> = (0..k * k)
                    .map(|i| if i / k == i % k { 1.0 } else { 0.0 })
                    .collect();
                let run = |be: &dyn Backend| {
                    let x = be.upload_f32_as(&eye, &[k, k], dt).unwrap();
                    let w = upload_q(be, fmt, n, k, &w_bytes);
                    let out = be.alloc(dt, &[k, n]).unwrap();
                    be.matmul(&x, &w, None, &out).unwrap();
                    be.download_f32(&out).unwrap()
                };
                let (got, want) = (run(gpu), run(&cpu));
                let direct = dt == DType::BF16
                    && matches!(
                        fmt,
                        QuantFormat::Q4_0
                            | QuantFormat::Q4_1
                            | QuantFormat::Q4K
                            | QuantFormat::Q5K
                            | QuantFormat::Q6K
                    );
                // out is [k, n]: weight row r is column r.
                let row_max: Vec<f32> = (0..n)
                    .map(|r| (0..k).map(|c| want[c * n + r].abs()).fold(0.0, f32::max))
                    .collect();
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let tol = if direct { row_max[i % n] / 64.0 } else { 0.0 };
                    // <= rather than bits: a decoded -0 summed with the identity's zero
                    // products may come out as either zero.
                    assert!(
                        (g - w).abs() <= tol,
                        "{fmt} {dt} n={n} k={k}: w[{}, {}] decodes to {g}, the CPU {w}",
                        i % n,
                        i / n
                    );
                }
            }
        }
    }
}

/// Every path of more than 8 rows at model shapes, each backend mode: `Mma` (the
/// tensor-core kernel: 32-row tiles for 16 rows, 64-row tiles and k split over CTAs for 64,
/// 128-row tiles for 300), `Auto` (FP8 weights through the FP8 GEMM, 202 rows padded to a
/// multiple of 4 there; 300 rows decode-then-GEMM), `Dequant`; every format, bf16 and f16
/// x, out in x's type and f32, with a bias where out is x's type.
#[test]
#[ignore = "needs a CUDA device"]
fn quantized_gemm_paths_match_cpu_at_model_shapes() {
    let _serial = serial();
    let cpu = CpuBackend::new();
    for mode in [QuantGemm::Mma, QuantGemm::Auto, QuantGemm::Dequant] {
        let gpu = backend(mode);
        let gpu: &dyn Backend = gpu.as_ref();
        for (f, fmt) in QuantFormat::ALL.into_iter().enumerate() {
            for (i, (m, n, k, dt, out)) in [
                (16, 2048, 4096usize, DType::BF16, DType::BF16),
                (64, 1536, 2048, DType::F16, DType::F32),
                (300, 4096, 1024, DType::BF16, DType::F32),
                (202, 520, 768, DType::F16, DType::F16),
                // Rows longer than the token quantizer holds in registers (16,384 values),
                // by block then by row for FP8 (168 rows: the row-wise path).
                (24, 136, 17024, DType::BF16, DType::BF16),
                (168, 264, 16512, DType::F16, DType::F16),
            ]
            .into_iter()
            .enumerate()
            {
                let k = k.div_ceil(fmt.block_elems()) * fmt.block_elems();
                // FP8: 128-value weight scales, or one a row (the row-wise GEMM) in turn.
                let row_scale = fmt == QuantFormat::F8E4M3 && i % 2 == 1;
                let case = Case {
                    fmt,
                    m,
                    n,
                    k,
                    dt,
                    out,
                    bias: out == dt,
                    seed: (10 * f + i) as u64,
                    row_scale,
                };
                let w = if row_scale {
                    weight_bytes(fmt, n, k, case.seed)
                } else {
                    weight_bytes_by_block(fmt, n, k, case.seed)
                };
                assert_close(
                    &format!("{mode:?}: {}", case.name()),
                    &case.run(gpu, &w),
                    &case.reference(&cpu, &w, mode, qgemv_default_rows(fmt)),
                    dt,
                );
            }
        }
    }
}

/// The fused gate/up + activation·mul (one row: the quantized gemv's epilogue; more rows:
/// matmul then act_mul) against the CPU's matmul then act_mul, SiLU and GELU-tanh.
#[test]
#[ignore = "needs a CUDA device"]
fn quantized_matmul_act_mul_matches_cpu() {
    let _serial = serial();
    let gpu = cuda();
    let gpu: &dyn Backend = gpu.as_ref();
    let cpu = CpuBackend::new();
    for (f, fmt) in QuantFormat::ALL.into_iter().enumerate() {
        for (i, (m, inter, blocks)) in [(1, 1, 1), (1, 70, 4), (1, 500, 3), (2, 33, 1), (9, 70, 2)]
            .into_iter()
            .enumerate()
        {
            for (dt, act) in [
                (DType::BF16, Activation::Silu),
                (DType::F16, Activation::Silu),
                (DType::F32, Activation::Silu),
                (DType::BF16, Activation::GeluTanh),
            ] {
                let k = blocks * fmt.block_elems();
                let seed = (100 * f + 10 * i) as u64;
                let w_bytes = weight_bytes(fmt, 2 * inter, k, seed);
                let x_vals = values(m * k, seed + 1);
                let run = |be: &dyn Backend| {
                    let x = be.upload_f32_as(&x_vals, &[m, k], dt).unwrap();
                    let w = upload_q(be, fmt, 2 * inter, k, &w_bytes);
                    let gate_up = be.alloc(dt, &[m, 2 * inter]).unwrap();
                    let out = be.alloc(dt, &[m, inter]).unwrap();
                    be.matmul_act_mul(act, &x, &w, &gate_up, &out).unwrap();
                    be.download_f32(&out).unwrap()
                };
                let name = format!("matmul_act_mul {act:?} {fmt} m={m} inter={inter} k={k} {dt}");
                assert_close(&name, &run(gpu), &run(&cpu), dt);
            }
        }
    }
}

/// Quantized matmuls inside a capture replay what they did eagerly, bit for bit, once the
/// scratch is reserved; a capture that needs more scratch than reserved is an error naming
/// the bytes, not a capture of an allocation.
#[test]
#[ignore = "needs a CUDA device"]
fn quantized_matmuls_capture_and_replay() {
    let _serial = serial();
    // A backend of its own: its scratch starts empty.
    let be = CudaBackend::new(0).unwrap();
    let be: &dyn Backend = &be;
    let fmt = QuantFormat::Q4K;
    let (n, k) = (96, 512);
    let w = upload_q(be, fmt, n, k, &weight_bytes(fmt, n, k, 5));
    let x1 = be
        .upload_f32_as(&values(k, 6), &[1, k], DType::BF16)
        .unwrap();
    let x16 = be
        .upload_f32_as(&values(16 * k, 7), &[16, k], DType::BF16)
        .unwrap();
    let (o1, o16) = (
        be.alloc(DType::BF16, &[1, n]).unwrap(),
        be.alloc(DType::BF16, &[16, n]).unwrap(),
    );

    // Not reserved: a 16-row f32 matmul (decode, then the GEMM) during a capture fails and
    // names the scratch; the bf16 one (the tensor-core kernel) needs none.
    let x16f = be
        .upload_f32_as(&values(16 * k, 8), &[16, k], DType::F32)
        .unwrap();
    let o16f = be.alloc(DType::F32, &[16, n]).unwrap();
    be.begin_capture().unwrap();
    let err = be.matmul(&x16f, &w, None, &o16f).unwrap_err().to_string();
    let _ = be.end_capture();
    assert!(err.contains("reserve_dequant_scratch"), "{err}");
    assert!(err.contains(&(n * k * 4).to_string()), "{err}");

    be.reserve_dequant_scratch(n * k * 4).unwrap();
    be.matmul(&x1, &w, None, &o1).unwrap();
    be.matmul(&x16, &w, None, &o16).unwrap();
    be.matmul(&x16f, &w, None, &o16f).unwrap();
    let (e1, e16, e16f) = (
        be.download_f32(&o1).unwrap(),
        be.download_f32(&o16).unwrap(),
        be.download_f32(&o16f).unwrap(),
    );
    be.begin_capture().unwrap();
    // Capturing the reservation itself is refused.
    assert!(be.reserve_dequant_scratch(1 << 30).is_err());
    be.matmul(&x1, &w, None, &o1).unwrap();
    be.matmul(&x16, &w, None, &o16).unwrap();
    be.matmul(&x16f, &w, None, &o16f).unwrap();
    let graph = be.end_capture().unwrap();
    for o in [&o1, &o16, &o16f] {
        be.write_bytes(o, &vec![0xFF; o.size_bytes()]).unwrap();
    }
    graph.replay().unwrap();
    assert_eq!(be.download_f32(&o1).unwrap(), e1);
    assert_eq!(be.download_f32(&o16).unwrap(), e16);
    assert_eq!(be.download_f32(&o16f).unwrap(), e16f);
}

/// An x that is not 16-byte aligned takes the decode-then-GEMM path even for one row.
#[test]
#[ignore = "needs a CUDA device"]
fn misaligned_x_still_matches_cpu() {
    let _serial = serial();
    let gpu = cuda();
    let gpu: &dyn Backend = gpu.as_ref();
    let cpu = CpuBackend::new();
    let fmt = QuantFormat::Q8_0;
    let (m, n, k) = (2, 33, 64);
    let w_bytes = weight_bytes(fmt, n, k, 9);
    let x_vals = values(m * k + 1, 10);
    let run = |be: &dyn Backend| {
        let whole = be
            .upload_f32_as(&x_vals, &[m * k + 1], DType::BF16)
            .unwrap();
        // One element in: 2 bytes past an aligned start.
        let x = Tensor::new(whole.storage().clone(), 2, &[m, k], DType::BF16).unwrap();
        let w = upload_q(be, fmt, n, k, &w_bytes);
        let out = be.alloc(DType::BF16, &[m, n]).unwrap();
        be.matmul(&x, &w, None, &out).unwrap();
        be.download_f32(&out).unwrap()
    };
    assert_close("misaligned x", &run(gpu), &run(&cpu), DType::BF16);
}

/// The gemvs issue their first weight loads before the PDL wait, so they run beside the
/// kernel before them; x they still read after it. norm(x0) -> each weight's gemv and
/// gemv + SiLU (dense bf16, Q4_K, Q8_0), eagerly and replayed in one graph, with new x0
/// values before every step, against the CPU backend on the same values: a gemv that read
/// x before the norm wrote it would give the previous step's outputs.
#[test]
#[ignore = "needs a CUDA device"]
fn gemvs_wait_for_the_kernel_before_them() {
    let _serial = serial();
    let (n, k) = (1536, 2048);
    let cpu = CpuBackend::new();
    let gpu = CudaBackend::new(0).unwrap();
    // The outputs of norm(x0) -> every weight's gemv and gemv + SiLU, for each x0 given.
    let run = |be: &dyn Backend, x0s: &[Vec<f32>], graph: bool| -> Vec<Vec<f32>> {
        let ws = [
            be.upload_f32_as(&values(n * k, 11), &[n, k], DType::BF16)
                .unwrap(),
            upload_q(
                be,
                QuantFormat::Q4K,
                n,
                k,
                &weight_bytes(QuantFormat::Q4K, n, k, 12),
            ),
            upload_q(
                be,
                QuantFormat::Q8_0,
                n,
                k,
                &weight_bytes(QuantFormat::Q8_0, n, k, 13),
            ),
        ];
        let x0 = be.alloc(DType::BF16, &[1, k]).unwrap();
        let x = be.alloc(DType::BF16, &[1, k]).unwrap();
        let g = be.upload_f32_as(&values(k, 14), &[k], DType::BF16).unwrap();
        let outs: Vec<(Tensor, Tensor, Tensor)> = ws
            .iter()
            .map(|_| {
                (
                    be.alloc(DType::BF16, &[1, n]).unwrap(),
                    be.alloc(DType::BF16, &[1, n]).unwrap(),
                    be.alloc(DType::BF16, &[1, n / 2]).unwrap(),
                )
            })
            .collect();
        // Each gemv right after the norm that writes its x.
        let step = || {
            for (w, (o, gu, act)) in ws.iter().zip(&outs) {
                be.rms_norm(&x0, None, (&g).into(), 1e-5, &x).unwrap();
                be.matmul(&x, w, None, o).unwrap();
                be.rms_norm(&x0, None, (&g).into(), 1e-5, &x).unwrap();
                be.matmul_act_mul(Activation::Silu, &x, w, gu, act).unwrap();
            }
        };
        let graph = graph.then(|| {
            be.begin_capture().unwrap();
            step();
            be.end_capture().unwrap()
        });
        let mut got = Vec::new();
        for v in x0s {
            let host = be.upload_f32_as(v, &[1, k], DType::BF16).unwrap();
            be.copy(&host, &x0).unwrap();
            match &graph {
                Some(g) => g.replay().unwrap(),
                None => step(),
            }
            for (o, _, act) in &outs {
                got.push(be.download_f32(o).unwrap());
                got.push(be.download_f32(act).unwrap());
            }
        }
        got
    };
    let x0s: Vec<Vec<f32>> = (0..3).map(|i| values(k, 20 + i)).collect();
    let want = run(&cpu, &x0s, false);
    for graph in [false, true] {
        let got = run(&gpu, &x0s, graph);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_close(&format!("output {i}, graph {graph}"), g, w, DType::BF16);
        }
    }
}
