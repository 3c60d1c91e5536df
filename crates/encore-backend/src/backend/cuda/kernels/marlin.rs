//! The mixed-input tensor-core GEMM (`kernels/quant_marlin.cu`) on weights repacked at
//! load into its layout ([`crate::quant::marlin`]): Q4_0, Q4_1, Q4_K as 4-bit codes, Q8_0
//! as bytes, each 32 values with an f16 scale and min, in mma fragment order.
//!
//! [`prepare`] (`Backend::prepare_weight`) makes the repacked copy once, when the model's
//! weights are loaded: the block-layout bytes are read back, repacked on the host (rows in
//! parallel) and uploaded beside them, so the device holds both: the gemv (batch 1-2, and
//! the fused one-row gate/up) and the expert kernels read the block layout, this GEMM the
//! repacked one (about 5/4.5 of a Q4_K weight's bytes again, 9/8.5 of Q8_0's). The
//! repack is skipped under `ENCORE_QUANT_GEMM=mma` or `dequant`, so those runs hold one
//! copy. [`matmul`] launches it: grid (n / 128, m blocks, k splits), f32 partials in the
//! dequantize scratch and `qmma_reduce` when k is split, nothing allocated: capturable.

use std::sync::Arc;

use super::quant::{DequantScratch, QuantGemm};
use super::{aligned16, cfg, grid_x, int};
use crate::backend::cuda::{dptr, CudaBackend, CudaBuffer};
use crate::error::{Error, Result};
use crate::ops::MatmulDims;
use crate::quant::marlin::{self, Layout};
use crate::quant::QuantFormat;
use crate::tensor::{DType, Storage, Tensor};

/// Rows of x up to which `ENCORE_QUANT_GEMM=auto` runs this GEMM on a repacked weight
/// (above, the decode-then-cuBLASLt path). Measured on the H200 (BENCHMARKS.md, "The
/// mixed-input GEMM"; 8B projections, Q4_K / Q8_0 / Q4_0): faster than `qmma` at 16-128
/// rows on every shape, slower than decoding then cuBLASLt's bf16 GEMM from 256 rows.
pub const MARLIN_AUTO_MAX_ROWS: usize = 128;

/// cp.async stages of the kernel (`MQ_STAGES`).
const STAGES: usize = 4;
/// Threads a CTA (`MQ_THREADS`).
const THREADS: u32 = 256;
/// Blocks of 16 rows of x a CTA of the variants (`_mb1` .. `_mb8`).
pub(in crate::backend::cuda) const MBS: [usize; 4] = [1, 2, 4, 8];

/// Dynamic shared memory of `marlin_q<bits>_*_mb<mb>` (`MqSmem::BYTES`): per stage the x
/// tile (16 mb rows of 64 + 8 16-bit values), the codes of a 128 x 64 tile and its scales.
pub(in crate::backend::cuda) const fn smem_bytes(bits: usize, mb: usize) -> usize {
    STAGES * (mb * 16 * (marlin::BK + 8) * 2 + marlin::BN * marlin::BK * bits / 8 + 1024)
}

/// The shared memory of the entry point `name` (`marlin_q4_bf16_mb8`, ...).
pub(in crate::backend::cuda) fn smem_of(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("marlin_q")?;
    let (bits, rest) = rest.split_once('_')?;
    let mb = rest.rsplit_once("_mb")?.1;
    Some(smem_bytes(bits.parse().ok()?, mb.parse().ok()?))
}

/// `Backend::prepare_weight` on CUDA: `w` with its repacked copy when the GEMM takes its
/// format and shape (a rank-2 weight in Q4_0, Q4_1, Q4_K or Q8_0 whose scales fit f16),
/// unless `ENCORE_QUANT_GEMM` pins another path, and while the device has room for both
/// layouts; `w` unchanged otherwise.
pub(in crate::backend::cuda) fn prepare(be: &CudaBackend, w: Tensor) -> Result<Tensor> {
    be.forbid_in_capture("prepare_weight")?;
    let DType::Q(fmt) = w.dtype() else {
        return Ok(w);
    };
    if matches!(be.quant_gemm(), QuantGemm::Mma | QuantGemm::Dequant)
        || w.rank() != 2
        || w.packed().is_some()
    {
        return Ok(w);
    }
    let (n, k) = (w.dim(0), w.dim(1));
    let Some(lay) = Layout::new(fmt, n, k) else {
        return Ok(w);
    };
    // Both layouts stay on the device: only while a tenth of its memory (at least 2 GiB)
    // stays free beside the copy, for the KV cache and the activations.
    if let Some((free, total)) = crate::backend::Backend::memory_info(be) {
        let keep = (total / 10).max(2 << 30);
        if free < lay.bytes() + keep {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(
                    "{} free of {} bytes: weights from {fmt} [{n}, {k}] on are not repacked \
                     for the mixed-input GEMM (they run qmma)",
                    free,
                    total
                )
            });
            return Ok(w);
        }
    }
    let mut bytes = vec![0u8; w.size_bytes()];
    crate::backend::Backend::read_bytes(be, &w, &mut bytes)?;
    let Some(packed) = marlin::repack(fmt, n, k, &bytes) else {
        tracing::debug!("{fmt} [{n}, {k}]: a scale overflows f16; not repacked");
        return Ok(w);
    };
    drop(bytes);
    let buf = CudaBuffer::new(
        &be.ctx,
        lay.bytes(),
        &format!("repacked {fmt} weight [{n}, {k}]"),
    )?;
    be.bind()?;
    // SAFETY: the buffer spans `packed.len()` bytes; the copy of pageable memory returns
    // once the bytes are staged, and the synchronize below orders it before any use.
    unsafe {
        cudarc::driver::result::memcpy_htod_async(buf.dptr(), &packed, be.stream.cu_stream())
    }
    .map_err(|e| Error::cuda("cuMemcpyHtoDAsync", e))?;
    be.stream
        .synchronize()
        .map_err(|e| Error::cuda("cuStreamSynchronize", e))?;
    Ok(w.with_packed(Storage::Cuda(Arc::new(buf))))
}

/// Whether `mode` sends this matmul to the GEMM: a repacked weight, x in bf16/f16 (16-byte
/// aligned), out in x's type or f32; `Auto` from the rows past the gemv's up to
/// [`MARLIN_AUTO_MAX_ROWS`] (the caller checked the gemv first), `Marlin` at every row.
pub(in crate::backend::cuda) fn fits(
    mode: QuantGemm,
    x: &Tensor,
    w: &Tensor,
    out: &Tensor,
    d: &MatmulDims,
) -> bool {
    let rows = match mode {
        QuantGemm::Auto => d.m <= MARLIN_AUTO_MAX_ROWS,
        QuantGemm::Marlin => true,
        QuantGemm::Mma | QuantGemm::Dequant => false,
    };
    rows && w.packed().is_some()
        && matches!(x.dtype(), DType::BF16 | DType::F16)
        && (out.dtype() == x.dtype() || out.dtype() == DType::F32)
        && aligned16(x)
}

/// `(16-row blocks a CTA, k splits)` for `d` on `sm_count` SMs with `ws_bytes` of scratch
/// for the partials: 1, 2 or 4 blocks up to 64 rows; past that 8 (128 rows, one CTA an SM)
/// where those tiles alone fill the SMs, else 4 (two CTAs an SM). k then splits in two
/// while the doubled grid stays within the SMs (twice over for two CTAs an SM), each split
/// keeping at least 4 of the 64-value k tiles, and the scratch holds the partials.
fn plan(sm_count: usize, d: &MatmulDims, ws_bytes: usize) -> (usize, usize) {
    let n_tiles = d.n.div_ceil(marlin::BN);
    let mb = match d.m {
        0..=16 => 1,
        17..=32 => 2,
        33..=64 => 4,
        m if n_tiles * m.div_ceil(128) >= sm_count => 8,
        _ => 4,
    };
    let ctas = n_tiles * d.m.div_ceil(16 * mb);
    let target = if mb == 8 { sm_count } else { 2 * sm_count };
    let ktiles = d.k.div_ceil(marlin::BK);
    let mut splits = 1;
    while 2 * ctas * splits <= target
        && ktiles >= 8 * splits
        && 2 * splits * d.m * d.n * 4 <= ws_bytes
    {
        splits *= 2;
    }
    (mb, splits)
}

/// `out = x · decode(w)ᵀ (+ bias)` on `w`'s repacked copy (checked by [`fits`]).
#[allow(clippy::too_many_arguments)]
pub(in crate::backend::cuda) fn matmul(
    be: &CudaBackend,
    fmt: QuantFormat,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
    d: &MatmulDims,
    scratch: &DequantScratch,
) -> Result<()> {
    const OP: &str = "matmul (quantized, marlin)";
    let packed = w
        .packed()
        .ok_or_else(|| Error::invalid(OP, "w has no repacked copy"))?;
    let lay = Layout::new(fmt, d.n, d.k)
        .ok_or_else(|| Error::invalid(OP, format!("{fmt} [{}, {}] is not repacked", d.n, d.k)))?;
    let Storage::Cuda(pb) = packed else {
        return Err(Error::invalid(OP, "the repacked w is not on the device"));
    };
    if pb.len() < lay.bytes() {
        return Err(Error::invalid(
            OP,
            format!(
                "the repacked w holds {} bytes, its layout {}",
                pb.len(),
                lay.bytes()
            ),
        ));
    }
    let (mb, splits) = plan(be.sm_count(), d, scratch.len());
    let ws = if splits > 1 { scratch.ptr() } else { 0 };
    let dt = x.dtype();
    let kernel = be.kernels().marlin(lay.bits, dt, mb)?;
    let mut c = cfg(
        (
            grid_x(OP, "n tiles", d.n.div_ceil(marlin::BN))?,
            u32::try_from(d.m.div_ceil(16 * mb))
                .ok()
                .filter(|&y| y <= 65_535)
                .ok_or_else(|| Error::invalid(OP, format!("m = {} rows is too many", d.m)))?,
            splits as u32,
        ),
        (THREADS, 1, 1),
    );
    c.shared_mem_bytes = smem_bytes(lay.bits, mb) as u32;
    let (xp, wp, op) = (dptr(x), pb.dptr(), dptr(out));
    let bp = bias.map_or(0, dptr);
    let m = int(OP, "m", d.m)?;
    let n = int(OP, "n", d.n)?;
    let k = int(OP, "k", d.k)?;
    let out_f32 = i32::from(out.dtype() == DType::F32);
    be.launch(kernel, c, &mut args![xp, wp, bp, op, ws, m, n, k, out_f32])?;
    super::quant::split_k_reduce(be, splits, ws, bp, dt, out, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 8B shape's plans on the H100's 132 SMs.
    #[test]
    fn plans_cover_the_sms() {
        let plan = |m: usize, n: usize, k: usize| plan(132, &MatmulDims { m, n, k }, 1 << 30);
        assert_eq!(plan(16, 4096, 4096), (1, 8));
        assert_eq!(plan(64, 28672, 4096).0, 4);
        // 224 n tiles of 128 rows fill the SMs: 128-row CTAs, no split.
        assert_eq!(plan(256, 28672, 4096), (8, 1));
        // 32 n tiles: 64-row CTAs, k split until two CTAs an SM.
        let (mb, splits) = plan(256, 4096, 4096);
        assert_eq!(mb, 4);
        assert_eq!(splits, 2);
        // 512 rows of the same: 256 CTAs already, no split.
        assert_eq!(plan(512, 4096, 4096), (4, 1));
        // No split without scratch.
        assert_eq!(
            super::plan(
                132,
                &MatmulDims {
                    m: 16,
                    n: 4096,
                    k: 4096
                },
                0
            )
            .1,
            1
        );
    }

    #[test]
    fn shared_memory_fits_hopper() {
        for bits in [4, 8] {
            for mb in MBS {
                let name = format!("marlin_q{bits}_bf16_mb{mb}");
                assert_eq!(smem_of(&name), Some(smem_bytes(bits, mb)));
                assert!(smem_bytes(bits, mb) <= 227 * 1024, "{name}");
            }
        }
        assert_eq!(smem_bytes(4, 1), 4 * (16 * 72 * 2 + 4096 + 1024));
        assert_eq!(smem_of("qmma_q4_0_bf16_bf16_bm32"), None);
    }
}
