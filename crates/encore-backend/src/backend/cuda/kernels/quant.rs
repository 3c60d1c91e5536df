//! Matmuls with a quantized weight (`kernels/quant_*.cu`, the layout of `crate::quant`).
//!
//! Up to [`GEMV_MAX_ROWS`] rows of x run the quantized gemv kernels, which decode the weight
//! in registers and stream its bytes once (the decode path: bound by weight bandwidth); a
//! one-row gate/up projection fuses SiLU·mul the same way. More rows of a bf16 or f16 x
//! (prefill, large batches) run `qmma_*`, a tensor-core GEMM that decodes each weight tile
//! into shared memory (mma.sync m16n8k16, f32 accumulation), splitting k over CTAs into the
//! scratch when the tiles alone would leave SMs idle. A weight with a repacked copy (Q4_0,
//! Q4_1, Q4_K, Q8_0 made at load, [`super::marlin`]) runs the mixed-input GEMM instead, up
//! to [`super::marlin::MARLIN_AUTO_MAX_ROWS`] rows. The baseline beside it (f32 x, or
//! `ENCORE_QUANT_GEMM=dequant`) decodes the whole weight into the persistent scratch in x's
//! dtype and runs the cuBLASLt GEMM on it. `reserve_dequant_scratch` sizes the scratch
//! before any capture; a capture never grows it.

use std::sync::MutexGuard;

use super::{aligned16, cfg, grid_x, int, launch_gemv, launch_gemv_act, GEMV_MAX_ROWS, GEMV_WARPS};
use crate::backend::cuda::{blas, dptr, CudaBackend, CudaBuffer};
use crate::backend::{Activation, Backend, Norm, PreNorm};
use crate::error::{Error, Result};
use crate::ops::MatmulDims;
use crate::quant::QuantFormat;
use crate::tensor::{DType, Tensor};

/// Rows of w one warp of `qgemv_*` owns (`QG_R` in quant_mma.cuh).
const ROWS_PER_WARP: usize = 2;

/// A warp lane's share of a block (`UPB` of each format's struct in `quant_*.cu`).
fn units_per_block(fmt: QuantFormat) -> usize {
    match fmt {
        QuantFormat::Q4_0
        | QuantFormat::Q4_1
        | QuantFormat::Q5_0
        | QuantFormat::Q5_1
        | QuantFormat::Mxfp4 => 1,
        QuantFormat::Q8_0 | QuantFormat::Q4K | QuantFormat::Q5K => 2,
        QuantFormat::Q6K => 4,
        QuantFormat::F8E4M3 => 8,
    }
}

/// The lane groups of `qmoe_*` (quant_gemv.cuh) for rows of k values: lanes per group (the
/// row's units rounded up to a power of two, at most 32) and groups per 256-thread CTA.
pub(in crate::backend::cuda) fn moe_groups(fmt: QuantFormat, k: usize) -> (i32, usize) {
    let units = k / fmt.block_elems() * units_per_block(fmt);
    let g = units.next_power_of_two().clamp(1, 32);
    (g as i32, 256 / g)
}

/// The handle slot of `fmt` (`QuantFormat::ALL`'s order, as the handles are resolved).
pub(in crate::backend::cuda) fn format_slot(fmt: QuantFormat) -> usize {
    QuantFormat::ALL
        .iter()
        .position(|&f| f == fmt)
        .expect("QuantFormat::ALL holds every format")
}

/// Rows up to which the quantized gemv runs by default: 2 for the K-quants, 4 for the
/// others. Its 4- and 8-row variants decode in f32 and do 4 or 8 FMAs a weight in CUDA
/// cores, so they are bound by arithmetic, the K-quants' most: on the H100 an 8B step took
/// 9.03 ms at batch 4 on the Q4_K gemv and 8.09 ms on the tensor-core kernel, 6.17 against
/// 7.14 ms for Q8_0; at batch 8 Q4_K 18.2 against 8.2 ms (BENCHMARKS.md, "Quantized
/// weights").
pub fn qgemv_default_rows(fmt: QuantFormat) -> usize {
    match fmt {
        QuantFormat::Q4K | QuantFormat::Q5K | QuantFormat::Q6K => 2,
        _ => 4,
    }
}

/// Whether the quantized gemv runs this matmul: 1..=the backend's `qgemv_max_rows` (at most
/// [`GEMV_MAX_ROWS`]; [`qgemv_default_rows`] unless set) rows and 16-byte aligned x and w
/// (every row of both is then aligned: a quantized row is a multiple of 16 bytes, and k, a
/// whole number of blocks, is a multiple of 32 values).
pub(in crate::backend::cuda) fn qgemv_fits(
    be: &CudaBackend,
    fmt: QuantFormat,
    x: &Tensor,
    w: &Tensor,
    d: &MatmulDims,
) -> bool {
    let rows = be
        .qgemv_max_rows()
        .unwrap_or_else(|| qgemv_default_rows(fmt));
    d.m >= 1 && d.m <= rows.min(GEMV_MAX_ROWS) && aligned16(x) && aligned16(w)
}

/// `(ksplit, CTAs)` for `n_outs` outputs per x row, each warp computing `outs_per_warp` of
/// them: as `gemv_layout`, with chunks of 32 units (one per lane) of a row, but aiming for
/// two CTAs per SM (the dense gemv's eight were measured on bf16 weights only).
fn qgemv_layout(
    be: &CudaBackend,
    fmt: QuantFormat,
    n_outs: usize,
    k: usize,
    outs_per_warp: usize,
) -> (usize, usize) {
    let units = k / fmt.block_elems() * units_per_block(fmt);
    let nchunks = units.div_ceil(32);
    let mut ksplit = 1;
    while ksplit < GEMV_WARPS
        && (n_outs * ksplit).div_ceil(GEMV_WARPS * outs_per_warp) < 2 * be.sm_count()
        && 2 * ksplit <= nchunks
    {
        ksplit *= 2;
    }
    (ksplit, n_outs.div_ceil(GEMV_WARPS / ksplit * outs_per_warp))
}

/// How matmuls with a quantized weight and more rows than the quantized gemv takes run on
/// CUDA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantGemm {
    /// FP8 weights: Hopper's FP8 GEMM (x quantized per 128 values); other formats with x
    /// in bf16/f16: the tensor-core kernel up to [`QMMA_AUTO_MAX_ROWS`] rows, where it is
    /// the faster, the decode-then-GEMM path above (and for f32 x).
    Auto,
    /// The tensor-core kernel (weights decoded to x's type) wherever it runs, FP8 too; no
    /// weight is repacked for the mixed-input GEMM (`qmma` in `ENCORE_QUANT_GEMM`, or `mma`).
    Mma,
    /// The mixed-input GEMM on repacked weights (`kernels/quant_marlin.cu`,
    /// [`super::marlin`]) at every row count, the gemv's too, wherever the weight has its
    /// repacked copy; the other formats as `Auto`. (`Auto` takes it too, past the gemv's
    /// rows up to [`super::marlin::MARLIN_AUTO_MAX_ROWS`].)
    Marlin,
    /// Always the decode-then-GEMM path.
    Dequant,
}

/// Rows up to which `Auto` runs the tensor-core kernel rather than decode-then-GEMM
/// (measured on the H100, 8B Q4_K decode step: 12.0 against 18.6 ms at 64 rows, 31.9
/// against 22.5 ms at 256; BENCHMARKS.md, "Quantized weights").
pub const QMMA_AUTO_MAX_ROWS: usize = 128;

/// Rows from which the FP8 GEMM takes the row-wise path for a weight with one scale a row
/// (below, the 128-value path, which such a weight also fits). Measured on the H200, 8B FP8
/// decode step over an FP8 cache at 2k tokens, row-wise against 128-value: 6.42 / 5.26 ms
/// at batch 32, 7.52 / 6.81 at 64, 9.48 / 9.38 at 128, 16.45 / 17.66 at 256 (BENCHMARKS.md).
/// `ENCORE_FP8_ROWWISE_MIN_ROWS` overrides it (an A/B knob; a value that is not a count is
/// ignored with a warning).
pub const FP8_ROWWISE_MIN_ROWS: usize = 160;

fn fp8_rowwise_min_rows() -> usize {
    static ROWS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| match std::env::var("ENCORE_FP8_ROWWISE_MIN_ROWS") {
        Err(_) => FP8_ROWWISE_MIN_ROWS,
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            tracing::warn!(
                "ENCORE_FP8_ROWWISE_MIN_ROWS={v:?} is not a count; using {FP8_ROWWISE_MIN_ROWS}"
            );
            FP8_ROWWISE_MIN_ROWS
        }),
    })
}

impl QuantGemm {
    /// Whether FP8 weights take Hopper's FP8 GEMM (`Auto`, and `Marlin`, which changes only
    /// the integer formats).
    pub fn fp8_gemm(self) -> bool {
        matches!(self, QuantGemm::Auto | QuantGemm::Marlin)
    }

    /// `ENCORE_QUANT_GEMM` (`auto` when unset); another value is an error naming it.
    pub fn from_env() -> Result<Self> {
        match std::env::var("ENCORE_QUANT_GEMM") {
            Err(_) => Ok(QuantGemm::Auto),
            Ok(v) => match v.trim() {
                "" | "auto" => Ok(QuantGemm::Auto),
                "mma" | "qmma" => Ok(QuantGemm::Mma),
                "marlin" => Ok(QuantGemm::Marlin),
                "dequant" => Ok(QuantGemm::Dequant),
                other => Err(Error::invalid(
                    "ENCORE_QUANT_GEMM",
                    format!("`{other}` is not one of auto, marlin, mma (qmma), dequant"),
                )),
            },
        }
    }
}

/// Rows of w per `qmma` CTA (`QM_BN`) and values of k per tile (`QM_BK`).
const QMMA_BN: usize = 128;
const QMMA_BK: usize = 64;
/// Threads of a `qmma` CTA (`QM_THREADS`).
const QMMA_THREADS: u32 = 256;

/// Dynamic shared memory of `qmma_*_bm{bm}` (`QM_SMEM_BYTES`): two stages of a bm-row x
/// tile and a 128-row w tile, rows of 64 + 8 16-bit elements.
pub(in crate::backend::cuda) const fn qmma_smem_bytes(bm: usize) -> usize {
    2 * (bm + QMMA_BN) * (QMMA_BK + 8) * 2
}

/// Whether `qmma` runs this matmul: x in bf16 or f16, 16-byte aligned (so is every row: k
/// is a multiple of 32), out in x's type or f32.
fn qmma_fits(x: &Tensor, out: &Tensor) -> bool {
    matches!(x.dtype(), DType::BF16 | DType::F16)
        && (out.dtype() == x.dtype() || out.dtype() == DType::F32)
        && aligned16(x)
}

/// The `qmma` launch for `d`: rows of x per CTA and k splits. 32-row tiles for up to 32
/// rows, 64-row tiles up to 64; past 64 rows, 128-row tiles once there are enough of them
/// to keep the SMs busy, 64 otherwise (a 128-row tile for 64 rows wastes half its mma and
/// runs one CTA an SM: 8B Q4_K at batch 64 took 11.9 ms so, 9.4 ms in 64-row tiles); k
/// split (at least 4 tiles of k each) until the grid covers two CTAs per SM, as far as
/// `ws_bytes` of scratch holds the f32 partials. A function of the shapes, the SM count
/// and the reserved scratch only.
fn qmma_plan(sm_count: usize, d: &MatmulDims, ws_bytes: usize) -> (usize, usize) {
    let n_tiles = d.n.div_ceil(QMMA_BN);
    let bm = if d.m <= 32 {
        32
    } else if d.m > 64 && n_tiles * d.m.div_ceil(128) >= sm_count {
        128
    } else {
        64
    };
    let ctas = n_tiles * d.m.div_ceil(bm);
    let ktiles = d.k.div_ceil(QMMA_BK);
    let mut splits = 1;
    while ctas * splits * 2 <= 2 * sm_count
        && ktiles >= 8 * splits
        && 2 * splits * d.m * d.n * 4 <= ws_bytes
    {
        splits *= 2;
    }
    (bm, splits)
}

/// `qmma_*`: grid (ceil(n / 128), ceil(m / bm), splits), 256 threads, `qmma_smem_bytes`;
/// with splits, the partials go to the scratch and `qmma_reduce_*` sums them.
fn qmma(
    be: &CudaBackend,
    fmt: QuantFormat,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
    d: &MatmulDims,
) -> Result<()> {
    const OP: &str = "matmul (quantized mma)";
    let scratch = lock(be);
    let (bm, splits) = qmma_plan(be.sm_count(), d, scratch.len());
    let ws = if splits > 1 {
        scratch.buf.as_ref().map_or(0, |b| b.dptr())
    } else {
        0
    };
    let dt = x.dtype();
    let kernel = be.kernels().qmma(fmt, dt, out.dtype(), bm)?;
    let mut c = cfg(
        (
            grid_x(OP, "n tiles", d.n.div_ceil(QMMA_BN))?,
            u32::try_from(d.m.div_ceil(bm))
                .ok()
                .filter(|&y| y <= 65_535)
                .ok_or_else(|| Error::invalid(OP, format!("m = {} rows is too many", d.m)))?,
            splits as u32,
        ),
        (QMMA_THREADS, 1, 1),
    );
    c.shared_mem_bytes = qmma_smem_bytes(bm) as u32;
    let (xp, wp, op) = (dptr(x), dptr(w), dptr(out));
    let bp = bias.map_or(0, dptr);
    let m = int(OP, "m", d.m)?;
    let n = int(OP, "n", d.n)?;
    let k = int(OP, "k", d.k)?;
    be.launch(kernel, c, &mut args![xp, wp, bp, op, ws, m, n, k])?;
    split_k_reduce(be, splits, ws, bp, dt, out, d)
}

/// The split-K sum of `qmma` and the mixed-input GEMM (`qmma_reduce_<x>_<out>`): the
/// `splits` f32 partials in `ws` summed into `out` (x's type `dt`, or f32) with the bias;
/// nothing for one split.
pub(in crate::backend::cuda) fn split_k_reduce(
    be: &CudaBackend,
    splits: usize,
    ws: u64,
    bp: u64,
    dt: DType,
    out: &Tensor,
    d: &MatmulDims,
) -> Result<()> {
    const OP: &str = "matmul (split-K reduce)";
    if splits <= 1 {
        return Ok(());
    }
    let (m, n, op_out) = (int(OP, "m", d.m)?, int(OP, "n", d.n)?, dptr(out));
    let c = cfg(
        (
            grid_x(OP, "reduce CTAs", (d.m * d.n).div_ceil(256).min(1 << 16))?,
            1,
            1,
        ),
        (256, 1, 1),
    );
    let splits = splits as i32;
    be.launch(
        be.kernels().qmma_reduce(dt, out.dtype())?,
        c,
        &mut args![ws, bp, op_out, m, n, splits],
    )
}

/// Offsets in the scratch of the FP8 GEMM's operands for `d`: (x's E4M3 values, x's
/// scales, w's scales, a staging output for an m that is not a multiple of 4 or 0, bytes
/// in all), each 256-byte aligned. `rows`: one scale a row of x and of w, else one per 128
/// values.
fn fp8_layout(d: &MatmulDims, out: DType, rows: bool) -> (usize, usize, usize, usize, usize) {
    let al = |v: usize| v.div_ceil(256) * 256;
    let m_pad = d.m.div_ceil(4) * 4;
    let groups = if rows { 1 } else { d.k / 128 };
    let xq = 0;
    let xs = al(m_pad * d.k);
    let ws = xs + al(groups * m_pad * 4);
    let staged = ws + al(groups * d.n * 4);
    let end = if m_pad == d.m {
        staged
    } else {
        staged + al(m_pad * d.n * out.size())
    };
    (xq, xs, ws, if m_pad == d.m { 0 } else { staged }, end)
}

/// The FP8 GEMM's x, quantized by the GEMM's first kernel: a matrix `[m, k]`, or the
/// gated MLP's activation `act_mul(act, gate_up)` of gate_up `[m, 2 k]` (`fp8_act_quant_*`:
/// the activation is never written in bf16).
#[derive(Clone, Copy)]
enum Fp8X<'a> {
    Dense(&'a Tensor),
    ActMul(Activation, &'a Tensor),
    /// x `[m, k]` added to the residual, normed (`fp8_norm_quant_*`): the normed rows are
    /// never written in bf16.
    Norm(&'a Tensor, &'a PreNorm<'a>),
}

impl Fp8X<'_> {
    fn tensor(&self) -> &Tensor {
        match self {
            Fp8X::Dense(t) | Fp8X::ActMul(_, t) | Fp8X::Norm(t, _) => t,
        }
    }
}

/// The vectors of 8 values a thread of `fp8_norm_quant_*` holds (`FNQ_HELD`): k at most
/// this times 8 x 1024.
const FNQ_HELD: usize = 4;

/// `out = (norm(residual + x) * weight) · decode(w)ᵀ (+ bias)` through the FP8 GEMM with
/// the residual add and the norm in the kernel that quantizes its x (bit for bit
/// `rms_norm` then the GEMM), when that GEMM runs it: `Ok(false)` (nothing done, the
/// residual untouched) otherwise (a LayerNorm among those cases). The caller checked the
/// shapes `d` (x `[m, k]`) and the norm's tensors.
pub(in crate::backend::cuda) fn norm_matmul(
    be: &CudaBackend,
    x: &Tensor,
    n: &PreNorm<'_>,
    w: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
    d: &MatmulDims,
) -> Result<bool> {
    let DType::Q(fmt) = w.dtype() else {
        return Ok(false);
    };
    if d.m == 0 || d.n == 0 || !aligned16(w) || qgemv_fits(be, fmt, x, w, d) {
        return Ok(false);
    }
    let Norm::Rms(weight) = n.norm else {
        return Ok(false);
    };
    let fits = be.quant_gemm().fp8_gemm()
        && d.k <= FNQ_HELD * 8 * 1024
        && [n.residual, weight]
            .iter()
            .all(|t| aligned16(t) && t.dtype() == x.dtype());
    if !fits {
        return Ok(false);
    }
    let scratch = lock(be);
    if !fp8_fits(fmt, x, out, bias.is_some(), d, scratch.len()) {
        return Ok(false);
    }
    fp8_gemm(be, &scratch, Fp8X::Norm(x, n), w, bias, out, d)?;
    Ok(true)
}

/// `out = act_mul(act, gate_up) · decode(w)ᵀ` through the FP8 GEMM with the activation
/// quantized straight from gate_up (its values rounded to T as `act_mul` rounds them, so
/// the result is the unfused ops'), when that GEMM runs it: `Ok(false)` (nothing done)
/// otherwise. The caller checked the shapes `d` (x = the activation `[m, inter]`).
pub(in crate::backend::cuda) fn act_mul_matmul(
    be: &CudaBackend,
    act: Activation,
    gate_up: &Tensor,
    w: &Tensor,
    out: &Tensor,
    d: &MatmulDims,
) -> Result<bool> {
    let DType::Q(fmt) = w.dtype() else {
        return Ok(false);
    };
    if d.m == 0 || d.n == 0 || !aligned16(w) || qgemv_fits(be, fmt, gate_up, w, d) {
        return Ok(false);
    }
    if !be.quant_gemm().fp8_gemm() {
        return Ok(false);
    }
    let scratch = lock(be);
    if !fp8_fits(fmt, gate_up, out, false, d, scratch.len()) {
        return Ok(false);
    }
    fp8_gemm(be, &scratch, Fp8X::ActMul(act, gate_up), w, None, out, d)?;
    Ok(true)
}

/// Whether the FP8 GEMM runs this matmul: an FP8 weight, x in bf16 or f16, out in x's
/// type or f32 (a bias only with out in x's type), n a multiple of 8 (cuBLASLt's FP8
/// kernels), the operands within `scratch` bytes.
fn fp8_fits(
    fmt: QuantFormat,
    x: &Tensor,
    out: &Tensor,
    bias: bool,
    d: &MatmulDims,
    scratch: usize,
) -> bool {
    fmt == QuantFormat::F8E4M3
        && matches!(x.dtype(), DType::BF16 | DType::F16)
        && (out.dtype() == x.dtype() || (out.dtype() == DType::F32 && !bias))
        && d.n.is_multiple_of(8)
        && d.k.is_multiple_of(128)
        && aligned16(x)
        && aligned16(out)
        && fp8_layout(d, out.dtype(), false).4 <= scratch
}

/// FP8 weights on Hopper's FP8 tensor cores: x quantized to E4M3 per row and 128 values
/// (`fp8_quant_rows_*`, scale amax / 448), the weight's per-128 scales gathered into
/// cuBLASLt's layout (`fp8_weight_scales`), then cuBLASLt's block-scaled FP8 GEMM
/// (`blas::Fp8Operands`) straight from the weight's bytes. A weight with one scale a row
/// ([`Tensor::row_scale`]) takes the row-wise GEMM instead from [`FP8_ROWWISE_MIN_ROWS`]
/// rows (~1.4x faster on an H200 at 8k rows): x with one scale a row
/// (`fp8_quant_tokens_*`), the weight's row scales
/// (`fp8_row_scales`). An m that is not a multiple of 4 is padded with zero rows into a
/// staging output, whose first m rows are copied out.
fn fp8_gemm(
    be: &CudaBackend,
    scratch: &DequantScratch,
    x: Fp8X<'_>,
    w: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
    d: &MatmulDims,
) -> Result<()> {
    const OP: &str = "matmul (FP8 GEMM)";
    let base = scratch.buf.as_ref().map_or(0, |b| b.dptr());
    let rows = w.row_scale() && d.m >= fp8_rowwise_min_rows();
    let (xq, xs, ws, staged, _) = fp8_layout(d, out.dtype(), rows);
    let (xq, xs, ws) = (base + xq as u64, base + xs as u64, base + ws as u64);
    let m_pad = d.m.div_ceil(4) * 4;
    let (m, mp, k) = (int(OP, "m", d.m)?, int(OP, "m", m_pad)?, int(OP, "k", d.k)?);
    // A CTA a row (row-wise), or a warp per row and 128 values.
    let ctas = if rows {
        m_pad
    } else {
        (m_pad * (d.k / 128)).div_ceil(8)
    };
    let c = cfg((grid_x(OP, "CTAs", ctas.min(1 << 16))?, 1, 1), (256, 1, 1));
    let kn = be.kernels();
    let dt = x.tensor().dtype();
    match x {
        Fp8X::Norm(x, n) => {
            // A CTA a row, of rms_norm's threads for it (the same sum order).
            let threads = super::threads_for(d.k / 8, 1024);
            let c = cfg(
                (grid_x(OP, "CTAs", m_pad.min(1 << 16))?, 1, 1),
                (threads, 1, 1),
            );
            let (xp, rp, wp) = (dptr(x), dptr(n.residual), dptr(n.norm.weight()));
            let (eps, per_row) = (n.eps, rows as i32);
            let f = kn.fp8_norm_quant(dt)?;
            be.launch(f, c, &mut args![xp, rp, wp, xq, xs, m, mp, k, eps, per_row])?
        }
        Fp8X::Dense(x) => {
            let xp = dptr(x);
            let f = kn.fp8_quant_rows(dt, rows)?;
            be.launch(f, c, &mut args![xp, xq, xs, m, mp, k])?
        }
        Fp8X::ActMul(act, gate_up) => {
            let (gp, a) = (dptr(gate_up), act.code());
            let f = kn.fp8_act_quant(dt, rows)?;
            be.launch(f, c, &mut args![gp, xq, xs, m, mp, k, a])?
        }
    }
    let wp = dptr(w);
    let n = int(OP, "n", d.n)?;
    if rows {
        let c = cfg((grid_x(OP, "CTAs", d.n.div_ceil(256))?, 1, 1), (256, 1, 1));
        be.launch(&be.kernels().fp8_row_scales, c, &mut args![wp, ws, n, k])?;
    } else {
        let c = cfg((grid_x(OP, "CTAs", d.n.div_ceil(32))?, 1, 1), (256, 1, 1));
        be.launch(&be.kernels().fp8_weight_scales, c, &mut args![wp, ws, n, k])?;
    }
    let dst = if staged == 0 {
        dptr(out)
    } else {
        base + staged as u64
    };
    be.lt.matmul(
        &be.stream,
        &blas::MatmulCall {
            m: m_pad,
            n: d.n,
            k: d.k,
            dtype: dt,
            out_dtype: out.dtype(),
            x: xq,
            w: wp,
            bias: bias.map(dptr),
            out: dst,
            fp8: Some(blas::Fp8Operands {
                w_ld: QuantFormat::F8E4M3.row_bytes(d.k).ok_or_else(|| {
                    Error::invalid(OP, format!("k = {} is not whole blocks", d.k))
                })?,
                w_scales: ws,
                x_scales: xs,
                rows,
            }),
        },
    )?;
    if staged != 0 {
        // SAFETY: the staging output holds m_pad >= m rows of out; out holds m.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                dptr(out),
                dst,
                out.size_bytes(),
                be.stream.cu_stream(),
            )
        }
        .map_err(|e| Error::cuda("cuMemcpyDtoDAsync", e))?;
    }
    Ok(())
}

/// `out = x · decode(w)ᵀ (+ bias)` for the checked shapes `d`, w quantized in `fmt`.
pub(in crate::backend::cuda) fn matmul(
    be: &CudaBackend,
    fmt: QuantFormat,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
    d: &MatmulDims,
) -> Result<()> {
    if d.m == 0 || d.n == 0 {
        return Ok(());
    }
    // Both kernels read the weight in 16-byte pieces. A quantized tensor's rows are a
    // multiple of 16 bytes, so only a view made at an odd byte offset can fail this.
    if !aligned16(w) {
        return Err(Error::invalid(
            "matmul",
            "a quantized w must start 16-byte aligned",
        ));
    }
    let mode = be.quant_gemm();
    // The mixed-input GEMM on the repacked weight: at every row under `Marlin`, past the
    // gemv's under `Auto`.
    let marlin = super::marlin::fits(mode, x, w, out, d);
    if marlin && mode == QuantGemm::Marlin {
        return super::marlin::matmul(be, fmt, x, w, bias, out, d, &lock(be));
    }
    if qgemv_fits(be, fmt, x, w, d) {
        return qgemv(be, fmt, x, w, bias, out, d);
    }
    if marlin {
        return super::marlin::matmul(be, fmt, x, w, bias, out, d, &lock(be));
    }
    if mode.fp8_gemm() && fmt == QuantFormat::F8E4M3 {
        let scratch = lock(be);
        if fp8_fits(fmt, x, out, bias.is_some(), d, scratch.len()) {
            return fp8_gemm(be, &scratch, Fp8X::Dense(x), w, bias, out, d);
        }
    }
    let mma = match mode {
        QuantGemm::Auto | QuantGemm::Marlin => d.m <= QMMA_AUTO_MAX_ROWS,
        QuantGemm::Mma => true,
        QuantGemm::Dequant => false,
    };
    if mma && qmma_fits(x, out) {
        return qmma(be, fmt, x, w, bias, out, d);
    }
    // Decode w into the scratch (dense [n, k] in x's dtype), then the GEMM.
    const OP: &str = "matmul (quantized)";
    let dt = x.dtype();
    let bytes =
        d.n.checked_mul(d.k)
            .and_then(|e| e.checked_mul(dt.size()))
            .ok_or_else(|| Error::invalid(OP, format!("w [{}, {}] overflows", d.n, d.k)))?;
    let scratch = scratch_of_at_least(be, bytes, d)?;
    let wd = scratch
        .buf
        .as_ref()
        .expect("scratch_of_at_least allocates")
        .dptr();
    dequant(be, fmt, w, wd, dt, d.n, d.k)?;
    be.lt.matmul(
        &be.stream,
        &blas::MatmulCall {
            m: d.m,
            n: d.n,
            k: d.k,
            dtype: dt,
            out_dtype: out.dtype(),
            x: dptr(x),
            w: wd,
            bias: bias.map(dptr),
            out: dptr(out),
            fp8: None,
        },
    )
}

/// `out = act_mul(act, x · decode(w)ᵀ)` for one row of x in one pass over the merged
/// gate/up weight (`qgemv_act_*`). The caller checked shapes, out's dtype (x's) and
/// [`qgemv_fits`].
pub(in crate::backend::cuda) fn qgemv_act(
    be: &CudaBackend,
    act: Activation,
    fmt: QuantFormat,
    x: &Tensor,
    w: &Tensor,
    out: &Tensor,
    d: &MatmulDims,
) -> Result<()> {
    const OP: &str = "matmul_act_mul (quantized gemv)";
    let inter = d.n / 2;
    if inter == 0 {
        return Ok(());
    }
    let dt = x.dtype();
    let layout = qgemv_layout(be, fmt, inter, d.k, 1);
    let kernel = be.kernels().qgemv_act(fmt, dt)?;
    launch_gemv_act(be, OP, act, kernel, layout, x, w, out, d)
}

/// The quantized gemv for `m <= GEMV_MAX_ROWS` rows (checked by [`qgemv_fits`]).
fn qgemv(
    be: &CudaBackend,
    fmt: QuantFormat,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
    d: &MatmulDims,
) -> Result<()> {
    const OP: &str = "matmul (quantized gemv)";
    let dt = x.dtype();
    let variant = d.m.next_power_of_two();
    let layout = qgemv_layout(be, fmt, d.n, d.k, ROWS_PER_WARP);
    let kernel = be.kernels().qgemv(fmt, dt, out.dtype(), variant)?;
    launch_gemv(be, OP, kernel, layout, x, w, bias, out, d)
}

/// Threads of a dequantize CTA, each decoding 32 consecutive values.
const DEQUANT_THREADS: usize = 256;

/// Decode the quantized `w` `[n, k]` into dense `dt` at `dst` (16-byte aligned, `n * k`
/// elements).
fn dequant(
    be: &CudaBackend,
    fmt: QuantFormat,
    w: &Tensor,
    dst: u64,
    dt: DType,
    n: usize,
    k: usize,
) -> Result<()> {
    const OP: &str = "matmul (dequantize)";
    let groups = n * (k / 32);
    // A grid-stride loop covers what a grid of at most 2^20 CTAs does not.
    let ctas = groups.div_ceil(DEQUANT_THREADS).min(1 << 20);
    let c = cfg(
        (grid_x(OP, "CTAs", ctas)?, 1, 1),
        (DEQUANT_THREADS as u32, 1, 1),
    );
    let wp = dptr(w);
    let n = int(OP, "n", n)?;
    let k = int(OP, "k", k)?;
    be.launch(be.kernels().dequant(fmt, dt)?, c, &mut args![wp, dst, n, k])
}

/// The decode-then-GEMM scratch of a backend: the buffer in use, and those it outgrew, kept
/// because graphs captured before a growth still name their addresses.
#[derive(Default)]
pub(in crate::backend::cuda) struct DequantScratch {
    buf: Option<CudaBuffer>,
    retired: Vec<CudaBuffer>,
}

impl DequantScratch {
    pub(in crate::backend::cuda) fn len(&self) -> usize {
        self.buf.as_ref().map_or(0, |b| b.len())
    }

    /// The buffer's device address (0 when none is reserved).
    pub(in crate::backend::cuda) fn ptr(&self) -> u64 {
        self.buf.as_ref().map_or(0, |b| b.dptr())
    }

    /// Make the buffer at least `bytes` long (a new allocation; the old one is retired).
    fn grow(&mut self, be: &CudaBackend, bytes: usize) -> Result<()> {
        if self.len() >= bytes && self.buf.is_some() {
            return Ok(());
        }
        let new = CudaBuffer::new(&be.ctx, bytes, "quantized matmul dequantize scratch")?;
        if let Some(old) = self.buf.replace(new) {
            self.retired.push(old);
        }
        Ok(())
    }
}

/// `Backend::reserve_dequant_scratch`: grow the scratch to `bytes` (never during capture).
pub(in crate::backend::cuda) fn reserve_scratch(be: &CudaBackend, bytes: usize) -> Result<()> {
    be.forbid_in_capture("reserve_dequant_scratch")?;
    if bytes == 0 {
        return Ok(());
    }
    lock(be).grow(be, bytes)
}

fn lock(be: &CudaBackend) -> MutexGuard<'_, DequantScratch> {
    be.dequant_scratch.lock().unwrap_or_else(|e| e.into_inner())
}

/// The scratch, grown to `bytes` when it is smaller and the stream is not capturing; an
/// error naming the bytes needed when it is smaller during a capture.
fn scratch_of_at_least<'a>(
    be: &'a CudaBackend,
    bytes: usize,
    d: &MatmulDims,
) -> Result<MutexGuard<'a, DequantScratch>> {
    let mut s = lock(be);
    if s.len() < bytes || s.buf.is_none() {
        if be.is_capturing() {
            return Err(Error::invalid(
                "matmul (quantized)",
                format!(
                    "decoding the quantized w [{}, {}] for {} rows needs {bytes} bytes of \
                     scratch, {} reserved: call reserve_dequant_scratch before capturing",
                    d.n,
                    d.k,
                    d.m,
                    s.len()
                ),
            ));
        }
        s.grow(be, bytes.max(1))?;
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tile rows and k splits of the 8B shape's matmuls on the H100's 132 SMs.
    #[test]
    fn qmma_tiles_fit_the_rows() {
        let plan = |m: usize, n: usize, k: usize| qmma_plan(132, &MatmulDims { m, n, k }, 1 << 30);
        // Up to 32 rows: 32-row tiles; up to 64: 64-row tiles, however many n tiles.
        assert_eq!(plan(16, 28672, 4096).0, 32);
        assert_eq!(plan(64, 28672, 4096).0, 64);
        assert_eq!(plan(64, 4096, 4096).0, 64);
        // Past 64 rows: 128-row tiles where they fill the SMs, 64 where they would not.
        assert_eq!(plan(96, 28672, 4096).0, 128);
        assert_eq!(plan(96, 4096, 4096).0, 64);
        // k splits until two CTAs an SM: 32 n tiles of 64 k tiles.
        let (bm, splits) = plan(64, 4096, 4096);
        assert_eq!((bm, splits), (64, 8));
        assert!(32 * splits >= 132 && 32 * splits <= 264);
        // No split without the scratch for the partials.
        assert_eq!(
            qmma_plan(
                132,
                &MatmulDims {
                    m: 64,
                    n: 4096,
                    k: 4096
                },
                0
            )
            .1,
            1
        );
    }
}
