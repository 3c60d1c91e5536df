//! The NVRTC kernel sources of the CUDA backend and one launcher per op.
//!
//! Sources live in `crates/encore-backend/kernels/`: the headers (`common.cuh`,
//! `quant_gemv.cuh`, `quant_mma.cuh`, `fp8_kv.cuh`) are prepended to every `.cu` file before
//! compiling (see [`COMMON`]), and [`SOURCES`] lists every file with every
//! `extern "C"` entry point it defines (nvrtc.rs's tests and `scripts/check-kernels.py` check
//! both lists against NVRTC's output). The backend validates shapes, dtypes and devices and then calls the
//! launchers here (the attention launchers in `attention`), which only choose launch
//! shapes (from tensor shapes alone: graphs replay them with new buffer contents), pick
//! the function from the handles resolved at load (`super::handles`), check alignment and
//! pass pointers.

use cudarc::driver::LaunchConfig;

use super::handles::Kernel;
use super::{dptr, CudaBackend};
use crate::backend::{Activation, LogitBias, Norm, QkvRope, Sampling};
use crate::error::{Error, Result};
use crate::ops::{ColumnDims, EmbeddingDims, MatmulDims, QkvRopeDims, RowDims, SampleDims};
use crate::tensor::{DType, Tensor};

mod sources;
mod sources_quant;
pub(super) use sources::{KernelSource, COMMON, SOURCES};

/// `[*mut c_void; N]` of pointers to the (local, named) kernel arguments, in order.
macro_rules! args {
    ($($a:ident),* $(,)?) => {
        [$(&$a as *const _ as *mut std::ffi::c_void),*]
    };
}

mod gather;
pub(super) use gather::{fill_rows, gather_columns};
mod attention;
pub(super) use attention::{attention, attention_scratch_len, dynamic_smem_limit};
mod moe;
pub(super) use moe::{moe, moe_workspace_bytes, MOE_PREFETCH_CTAS_PER_SM};
pub(super) mod marlin;
pub(super) mod quant;

fn cfg(grid: (u32, u32, u32), block: (u32, u32, u32)) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: block,
        shared_mem_bytes: 0,
    }
}

/// A launch dimension or scalar kernel argument as i32, or an error naming it.
fn int(op: &'static str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| Error::invalid(op, format!("{what} = {v} exceeds the kernels' i32 range")))
}

/// Grid dimension x (at most 2^31 - 1).
fn grid_x(op: &'static str, what: &str, v: usize) -> Result<u32> {
    int(op, what, v).map(|v| v as u32)
}

fn aligned16(t: &Tensor) -> bool {
    dptr(t).is_multiple_of(16)
}

/// Threads for a block that strides over `work` items: a multiple of 32 in 32..=max.
pub(super) fn threads_for(work: usize, max: u32) -> u32 {
    (work.div_ceil(32) * 32).clamp(32, max as usize) as u32
}

/// The one-shot all-reduce's most blocks (`AR_MAX_BLOCKS` in allreduce.cu) and ranks.
pub(super) const AR_MAX_BLOCKS: usize = 64;
pub(super) const AR_MAX_RANKS: usize = 8;

/// The one-shot peer-memory all-reduce of `x` (allreduce.cu): `peers` is this rank's
/// `ArPeers` table, `count` its per-block call counters; x's bytes a multiple of 16, at
/// most `cap`.
pub(super) fn allreduce(
    be: &CudaBackend,
    x: &Tensor,
    peers: u64,
    count: u64,
    (rank, ranks): (usize, usize),
    cap: usize,
) -> Result<()> {
    const OP: &str = "all_reduce";
    let nv = (x.size_bytes() / 16) as i64;
    if nv == 0 {
        return Ok(());
    }
    // Blocks of 256 threads, one 16-byte vector each per pass, at most AR_MAX_BLOCKS:
    // a function of the shape alone, the same on every rank.
    let blocks = (nv as usize).div_ceil(256).clamp(1, AR_MAX_BLOCKS);
    // Each block stages its chunk in its own slot of the staging buffer.
    if (nv as usize).div_ceil(blocks) * 16 > cap / AR_MAX_BLOCKS {
        return Err(Error::invalid(
            OP,
            format!(
                "{} bytes exceed the one-shot all-reduce's {cap}",
                x.size_bytes()
            ),
        ));
    }
    let blocks = blocks as u32;
    let c = cfg((blocks, 1, 1), (256, 1, 1));
    let xp = dptr(x);
    let (rank, ranks) = (int(OP, "rank", rank)?, int(OP, "ranks", ranks)?);
    let cap = cap as i64;
    be.launch(
        be.kernels().allreduce.get(x.dtype())?,
        c,
        &mut args![xp, nv, peers, count, rank, ranks, cap],
    )
}

/// The pushed all-reduce: tensor parallelism's row-parallel projection `x · wᵀ` summed over
/// the ranks into `hidden`, then the residual RMSNorm, as two kernels: `gemv_push_*`
/// (gemv.cu: each CTA stores its outputs straight into every rank's staging), then
/// `pushed_rms_norm_*` (allreduce.cu: waits on the data from every rank, sums in rank
/// order, adds and normalises). `push` is this rank's `ArPush` table and call counter,
/// `cap` a slot's bytes. `None` when the shapes do not suit it (not the gemv's rows, not
/// 16-byte rows, more than a slot): the caller runs matmul, then all_reduce_rms_norm.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemv_push_rms_norm(
    be: &CudaBackend,
    (x, w, hidden): (&Tensor, &Tensor, &Tensor),
    (residual, norm_w, out): (&Tensor, &Tensor, &Tensor),
    eps: f32,
    d: &MatmulDims,
    push: (u64, u64),
    (rank, ranks): (usize, usize),
    (cap, max_rows): (usize, usize),
) -> Option<Result<()>> {
    const OP: &str = "matmul_all_reduce_rms_norm";
    let dt = x.dtype();
    let variant = d.m.next_power_of_two();
    let (ksplit, ctas) = gemv_layout(be, dt, d.n, d.k, variant.min(4));
    let fits = gemv_fits(x, w, d, max_rows)
        && w.dtype() == dt
        && hidden.dtype() == dt
        && (d.n * dt.size()).is_multiple_of(16)
        && d.m * d.n * dt.size() <= cap
        && [hidden, residual, norm_w, out].iter().all(|t| aligned16(t));
    if !fits || d.n == 0 {
        return None;
    }
    // pushed_rms_norm handles up to PUSH_MAX_ROWS (8) rows: the gemv's most.
    debug_assert!(d.m <= GEMV_MAX_ROWS && GEMV_MAX_ROWS <= 8);
    let run = || {
        let kernel = be.kernels().gemv_push(dt, variant)?;
        let c = cfg(
            (grid_x(OP, "n", ctas)?, 1, 1),
            ((GEMV_WARPS * 32) as u32, 1, 1),
        );
        let (xp, wp, bp) = (dptr(x), dptr(w), 0u64);
        let (m, n, k) = (d.m as i32, int(OP, "n", d.n)?, int(OP, "k", d.k)?);
        let ksplit = ksplit as i32;
        let (peers, count) = push;
        let (rank, ranks) = (int(OP, "rank", rank)?, int(OP, "ranks", ranks)?);
        let cap = cap as i64;
        be.launch(
            kernel,
            c,
            &mut args![xp, wp, bp, m, n, k, ksplit, peers, count, rank, ranks, cap],
        )?;
        let nv = d.n * dt.size() / 16;
        // rms_norm's block size, so each thread sums the same elements in the same order.
        let c = cfg((1, 1, 1), (threads_for(nv, 1024), 1, 1));
        let (hp, rp, gp, op) = (dptr(hidden), dptr(residual), dptr(norm_w), dptr(out));
        be.launch(
            be.kernels().pushed_rms_norm.get(dt)?,
            c,
            &mut args![hp, rp, gp, op, m, n, eps, peers, count, rank, ranks, cap],
        )
    };
    Some(run())
}

/// The one-shot all-reduce fused with the residual RMSNorm after it
/// (allreduce.cu's `allreduce_rms_norm`); `None` when the shapes do not suit it (not
/// 16-byte vectors, or more than `cap` bytes): the caller runs the two ops.
#[allow(clippy::too_many_arguments)]
pub(super) fn allreduce_rms_norm(
    be: &CudaBackend,
    (x, residual, w, out): (&Tensor, &Tensor, &Tensor, &Tensor),
    eps: f32,
    d: &RowDims,
    peers: u64,
    count: u64,
    (rank, ranks): (usize, usize),
    cap: usize,
) -> Option<Result<()>> {
    const OP: &str = "all_reduce_rms_norm";
    let dt = x.dtype();
    // Block b stages its rows (b, b + grid, ...) in its own slot of the staging buffer.
    let grid = d.rows.min(AR_MAX_BLOCKS);
    let fits = (d.dim * dt.size()).is_multiple_of(16)
        && [x, residual, w, out].iter().all(|t| aligned16(t))
        && d.rows > 0
        && d.rows.div_ceil(grid.max(1)) * d.dim * dt.size() <= cap / AR_MAX_BLOCKS;
    if !fits {
        return None;
    }
    let run = || {
        let nv = d.dim * dt.size() / 16;
        // rms_norm's block size, so each thread sums the same elements in the same order.
        let c = cfg((grid as u32, 1, 1), (threads_for(nv, 1024), 1, 1));
        let (xp, rp, wp, op) = (dptr(x), dptr(residual), dptr(w), dptr(out));
        let (rows, dim) = (int(OP, "rows", d.rows)?, int(OP, "dim", d.dim)?);
        let (rank, ranks) = (int(OP, "rank", rank)?, int(OP, "ranks", ranks)?);
        let cap = cap as i64;
        be.launch(
            be.kernels().allreduce_rms_norm.get(dt)?,
            c,
            &mut args![xp, rp, wp, op, rows, dim, eps, peers, count, rank, ranks, cap],
        )
    };
    Some(run())
}

pub(super) fn embedding(
    be: &CudaBackend,
    ids: &Tensor,
    table: &Tensor,
    out: &Tensor,
    d: &EmbeddingDims,
) -> Result<()> {
    const OP: &str = "embedding";
    if d.n == 0 || d.hidden == 0 {
        return Ok(());
    }
    let dt = table.dtype();
    let vec = (d.hidden * dt.size()).is_multiple_of(16) && aligned16(table) && aligned16(out);
    let work = if vec {
        d.hidden * dt.size() / 16
    } else {
        d.hidden
    };
    let c = cfg(
        (grid_x(OP, "n", d.n)?, 1, 1),
        (threads_for(work, 256), 1, 1),
    );
    let (ids, table, out) = (dptr(ids), dptr(table), dptr(out));
    let vocab = int(OP, "vocab", d.vocab)?;
    let hidden = int(OP, "hidden", d.hidden)?;
    let vec = vec as i32;
    let first = int(OP, "first", d.first)?;
    be.launch(
        be.kernels().embedding.get(dt)?,
        c,
        &mut args![ids, table, out, vocab, hidden, vec, first],
    )
}

pub(super) fn rms_norm(
    be: &CudaBackend,
    x: &Tensor,
    residual: Option<&Tensor>,
    norm: Norm<'_>,
    eps: f32,
    out: &Tensor,
    d: &RowDims,
) -> Result<()> {
    norm_rows(be, x, None, residual, Some(norm), eps, out, &d.whole_rows())
}

/// `rms_norm_*` over [`ColumnDims`]: the norm by `norm` (with the residual add first), or
/// with no `norm` the residual add alone, `out` = the sum; with `pre_w` (and a residual) x
/// is RMS-normed by it before the add. A LayerNorm is `layer_norm_*` (no `pre_w`).
#[allow(clippy::too_many_arguments)]
pub(super) fn norm_rows(
    be: &CudaBackend,
    x: &Tensor,
    pre_w: Option<&Tensor>,
    residual: Option<&Tensor>,
    norm: Option<Norm<'_>>,
    eps: f32,
    out: &Tensor,
    d: &ColumnDims,
) -> Result<()> {
    const OP: &str = "rms_norm";
    if d.rows == 0 || d.dim == 0 {
        return Ok(());
    }
    let (w, bias) = (norm.map(Norm::weight), norm.and_then(Norm::bias));
    if bias.is_some() && pre_w.is_some() {
        return Err(Error::invalid(
            OP,
            "a LayerNorm takes no pre-norm in one kernel",
        ));
    }
    let dt = x.dtype();
    let size = dt.size();
    let off = (d.col0 * size) as u64;
    let vec = (d.dim * size).is_multiple_of(16)
        && (d.ld * size).is_multiple_of(16)
        && off.is_multiple_of(16)
        && aligned16(x)
        && w.is_none_or(aligned16)
        && pre_w.is_none_or(aligned16)
        && bias.is_none_or(aligned16)
        && aligned16(out)
        && residual.is_none_or(aligned16);
    let work = if vec { d.dim * size / 16 } else { d.dim };
    let c = cfg(
        (grid_x(OP, "rows", d.rows)?, 1, 1),
        (threads_for(work, 1024), 1, 1),
    );
    let has_res = residual.is_some() as i32;
    let plain = w.is_none() as i32;
    let (xp, res, out) = (dptr(x) + off, residual.map_or(0, dptr), dptr(out) + off);
    // The weight pointer is never read without a weight.
    let wp = w.map_or(xp, dptr);
    let pre = pre_w.map_or(0, dptr);
    let dim = int(OP, "dim", d.dim)?;
    let ld = d.ld as i64;
    let vec = vec as i32;
    match bias {
        None => be.launch(
            be.kernels().rms_norm.get(dt)?,
            c,
            &mut args![xp, res, wp, out, dim, eps, has_res, vec, ld, plain, pre],
        ),
        Some(b) => {
            let bp = dptr(b);
            be.launch(
                be.kernels().layer_norm.get(dt)?,
                c,
                &mut args![xp, res, wp, bp, out, dim, eps, has_res, vec, ld],
            )
        }
    }
}

/// `x *= s` in place, then `x = cap * tanh(x / cap)` when `cap > 0` (`scale_*`).
pub(super) fn scale_softcap(be: &CudaBackend, x: &Tensor, s: f32, cap: f32) -> Result<()> {
    const OP: &str = "scale";
    let total = x.numel();
    if total == 0 {
        return Ok(());
    }
    const THREADS: usize = 256;
    let c = cfg(
        (grid_x(OP, "elements", total.div_ceil(THREADS))?, 1, 1),
        (THREADS as u32, 1, 1),
    );
    let (xp, total) = (dptr(x), total as i64);
    be.launch(
        be.kernels().scale.get(x.dtype())?,
        c,
        &mut args![xp, s, cap, total],
    )
}

/// `x += sigmoid(gate) * y` (`moe_shared_add`): Qwen2-MoE's shared expert.
pub(super) fn sigmoid_gate_add(
    be: &CudaBackend,
    x: &Tensor,
    gate: &Tensor,
    y: &Tensor,
    d: &RowDims,
) -> Result<()> {
    const OP: &str = "sigmoid_gate_add";
    let total = d.rows * d.dim;
    if total == 0 {
        return Ok(());
    }
    const THREADS: usize = 256;
    let c = cfg(
        (grid_x(OP, "elements", total.div_ceil(THREADS))?, 1, 1),
        (THREADS as u32, 1, 1),
    );
    let (xp, gp, yp) = (dptr(x), dptr(gate), dptr(y));
    let (total, dim) = (total as i64, int(OP, "dim", d.dim)?);
    be.launch(
        be.kernels().moe_shared_add.get(x.dtype())?,
        c,
        &mut args![xp, gp, yp, total, dim],
    )
}

/// `out = act(gate) * up` (`silu_mul_*`, the activation by its code).
pub(super) fn act_mul(
    be: &CudaBackend,
    act: Activation,
    gate_up: &Tensor,
    out: &Tensor,
    d: &RowDims,
) -> Result<()> {
    const OP: &str = "act_mul";
    if d.rows == 0 || d.dim == 0 {
        return Ok(());
    }
    let dt = gate_up.dtype();
    let vec = (d.dim * dt.size()).is_multiple_of(16) && aligned16(gate_up) && aligned16(out);
    let cols = if vec { d.dim * dt.size() / 16 } else { d.dim };
    const THREADS: usize = 256;
    let c = cfg(
        (cols.div_ceil(THREADS) as u32, d.rows.min(65_535) as u32, 1),
        (THREADS as u32, 1, 1),
    );
    let (gu, out) = (dptr(gate_up), dptr(out));
    let rows = int(OP, "rows", d.rows)?;
    let inter = int(OP, "inter", 2 * d.dim).map(|_| d.dim as i32)?;
    let (vec, act) = (vec as i32, act.code());
    be.launch(
        be.kernels().silu_mul.get(dt)?,
        c,
        &mut args![gu, out, rows, inter, vec, act],
    )
}

/// Warps of one qkv_rope CTA (`QKV_WARPS` in qkv_rope.cu).
const QKV_WARPS: usize = 4;

pub(super) fn qkv_rope_write(be: &CudaBackend, a: &QkvRope<'_>, d: &QkvRopeDims) -> Result<()> {
    const OP: &str = "qkv_rope_write";
    let heads = d.num_heads + 2 * d.num_kv_heads;
    if d.n == 0 || heads == 0 || d.head_dim == 0 {
        return Ok(());
    }
    if d.head_dim > 256 {
        return Err(Error::invalid(
            OP,
            format!("head_dim = {} is not supported (at most 256)", d.head_dim),
        ));
    }
    let items = d.n * heads;
    let c = cfg(
        (grid_x(OP, "n * heads", items.div_ceil(QKV_WARPS))?, 1, 1),
        ((QKV_WARPS * 32) as u32, 1, 1),
    );
    int(OP, "n * heads * head_dim", items * d.head_dim)?;
    let (qkv, pos, cs, sm) = (
        dptr(a.qkv),
        dptr(a.positions),
        dptr(a.cos_sin),
        dptr(a.slot_mapping),
    );
    let (qn, kn) = a.head_norm.map_or((0, 0), |(q, k)| (dptr(q), dptr(k)));
    let has_norm = a.head_norm.is_some() as i32;
    let eps = a.eps;
    let (q_out, kc, vc) = (dptr(a.q_out), dptr(a.k_cache), dptr(a.v_cache));
    let kv8 = a.k_cache.dtype() == DType::F8E4M3;
    let (k_inv, v_inv) = a.kv_scale.inverse();
    let n = int(OP, "n", d.n)?;
    let nh = int(OP, "num_heads", d.num_heads)?;
    let nkv = int(OP, "num_kv_heads", d.num_kv_heads)?;
    let hd = d.head_dim as i32;
    let rot = d.rot as i32; // <= head_dim
    let maxp = int(OP, "max_positions", d.max_positions).unwrap_or(i32::MAX);
    let num_slots = (d.num_blocks as u64 * d.block_size as u64).min(i64::MAX as u64) as i64;
    be.launch(
        be.kernels().qkv_rope[usize::from(kv8)].get(a.qkv.dtype())?,
        c,
        &mut args![
            qkv, qn, kn, has_norm, eps, pos, cs, sm, q_out, kc, vc, n, nh, nkv, hd, rot, maxp,
            num_slots, k_inv, v_inv
        ],
    )
}

// ---------------------------------------------------------------------------------------
// GEMV (matmul with few rows)

/// Most rows of x the gemv kernels take (the largest `gemv_*_m*` variant).
pub(super) const GEMV_MAX_ROWS: usize = 8;
/// Rows up to which matmul takes the gemv kernels by default. Measured on H100 (decode
/// step, graph mode, BENCHMARKS.md): 1 row is 9-17% faster than cuBLASLt on the 0.5B and
/// 8B shapes; 2 rows is faster on 0.5B but 3% slower on 8B; 3..8 rows are slower (x is
/// re-read through L1 for every row pair: a tensor-core variant is future work).
pub(super) const GEMV_DEFAULT_ROWS: usize = 1;
/// Warps of one gemv CTA (`GEMV_WARPS` in gemv.cu).
const GEMV_WARPS: usize = 8;

/// Whether [`gemv`] can run this matmul: few rows, k a whole number of 16-byte vectors,
/// 16-byte aligned x and w (so every row of both is aligned).
pub(super) fn gemv_fits(x: &Tensor, w: &Tensor, d: &MatmulDims, max_rows: usize) -> bool {
    let v = 16 / x.dtype().size();
    d.m >= 1
        && d.m <= max_rows.min(GEMV_MAX_ROWS)
        && d.k.is_multiple_of(v)
        && aligned16(x)
        && aligned16(w)
}

/// CTAs per SM the gemv's k split aims for: enough loads in flight to stream at the copy
/// rate. Eight, not two, took 1.5% off an 8B decode step on the H100 and 4.4% on the H200
/// (the o and down projections, 4096 and 8192 rows, streamed 7-17% faster; BENCHMARKS.md).
pub(super) const GEMV_CTAS_PER_SM: usize = 8;

/// Chunks of k a gemv warp keeps in flight (`GEMV_UNROLL` in gemv.cu, at one row a warp):
/// a warp with fewer left loads them one at a time.
const GEMV_ROUND: usize = 4;

/// `(ksplit, CTAs)` of a gemv over `n` rows of `k` with `rows_per_warp` rows per warp:
/// split k over more warps while there are too few CTAs to keep every SM streaming
/// ([`GEMV_CTAS_PER_SM`], `ENCORE_GEMV_CTAS_PER_SM`) and each warp still gets a
/// 16-byte-per-lane chunk of k; once there are half that many CTAs, not below a whole
/// round of loads a warp ([`GEMV_ROUND`] chunks): 8B's o projection over 2 GPUs (4,096 x
/// 2,048) streamed at 2,620-2,640 GB/s as 1,024 CTAs of 4 chunks a warp, 2,230 as 2,048
/// CTAs of 2 (H200, BENCHMARKS.md). Among Llama-3 8B and 70B shards it binds that one
/// and 8B's q/k/v, o and down over 4 GPUs, 8B's down and gate/up and 70B's o over 8.
fn gemv_layout(
    be: &CudaBackend,
    dt: DType,
    n: usize,
    k: usize,
    rows_per_warp: usize,
) -> (usize, usize) {
    let nchunks = k.div_ceil(32 * 16 / dt.size());
    let ctas = |ksplit: usize| (n * ksplit).div_ceil(GEMV_WARPS * rows_per_warp);
    let target = be.gemv_ctas_per_sm() * be.sm_count();
    let mut ksplit = 1;
    while ksplit < GEMV_WARPS
        && ctas(ksplit) < target
        && 2 * ksplit <= nchunks
        && (2 * ctas(ksplit) < target || nchunks >= 2 * ksplit * GEMV_ROUND)
    {
        ksplit *= 2;
    }
    (ksplit, n.div_ceil(GEMV_WARPS / ksplit * rows_per_warp))
}

/// `out = act_mul(act, x · wᵀ)` for one row of x in one gemv pass (`gemv_act_*`): w is
/// the merged `[2 * inter, k]` gate/up weight. The caller checked shapes and [`gemv_fits`].
pub(super) fn gemv_act(
    be: &CudaBackend,
    act: Activation,
    x: &Tensor,
    w: &Tensor,
    out: &Tensor,
    d: &MatmulDims,
) -> Result<()> {
    const OP: &str = "matmul_act_mul (gemv)";
    let inter = d.n / 2;
    if inter == 0 {
        return Ok(());
    }
    let dt = x.dtype();
    let layout = gemv_layout(be, dt, inter, d.k, 1);
    launch_gemv_act(
        be,
        OP,
        act,
        be.kernels().gemv_act.get(dt)?,
        layout,
        x,
        w,
        out,
        d,
    )
}

/// Launch a one-row fused gate/up + activation kernel of the gemv family (dense or
/// quantized): `layout` is its `(ksplit, CTAs)` for `d.n / 2` outputs.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch_gemv_act(
    be: &CudaBackend,
    op_name: &'static str,
    act: Activation,
    kernel: &Kernel,
    (ksplit, ctas): (usize, usize),
    x: &Tensor,
    w: &Tensor,
    out: &Tensor,
    d: &MatmulDims,
) -> Result<()> {
    let c = cfg(
        (grid_x(op_name, "inter", ctas)?, 1, 1),
        ((GEMV_WARPS * 32) as u32, 1, 1),
    );
    let (xp, wp, op) = (dptr(x), dptr(w), dptr(out));
    let n = int(op_name, "2 * inter", d.n).map(|n| n / 2)?;
    let k = int(op_name, "k", d.k)?;
    let (ksplit, act) = (ksplit as i32, act.code());
    be.launch(kernel, c, &mut args![xp, wp, op, n, k, ksplit, act])
}

/// `out = x · wᵀ (+ bias)` for `m <= GEMV_MAX_ROWS` rows (checked by [`gemv_fits`]).
pub(super) fn gemv(
    be: &CudaBackend,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
    d: &MatmulDims,
) -> Result<()> {
    const OP: &str = "matmul (gemv)";
    if d.n == 0 {
        return Ok(());
    }
    let dt = x.dtype();
    let variant = d.m.next_power_of_two();
    let layout = gemv_layout(be, dt, d.n, d.k, variant.min(4));
    let kernel = be.kernels().gemv(dt, out.dtype(), variant)?;
    launch_gemv(be, OP, kernel, layout, x, w, bias, out, d)
}

/// Launch a gemv-family kernel (dense or quantized) for `d.m <= GEMV_MAX_ROWS` rows:
/// `layout` is its `(ksplit, CTAs)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch_gemv(
    be: &CudaBackend,
    op_name: &'static str,
    kernel: &Kernel,
    (ksplit, ctas): (usize, usize),
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
    d: &MatmulDims,
) -> Result<()> {
    let c = cfg(
        (grid_x(op_name, "n", ctas)?, 1, 1),
        ((GEMV_WARPS * 32) as u32, 1, 1),
    );
    let (xp, wp, bp, op) = (dptr(x), dptr(w), bias.map_or(0, dptr), dptr(out));
    let m = d.m as i32; // <= GEMV_MAX_ROWS
    let n = int(op_name, "n", d.n)?;
    let k = int(op_name, "k", d.k)?;
    let ksplit = ksplit as i32;
    be.launch(kernel, c, &mut args![xp, wp, bp, op, m, n, k, ksplit])
}

// ---------------------------------------------------------------------------------------
// Sampling

/// Threads per row (`SAMPLE_THREADS` in sampling.cu).
const SAMPLE_THREADS: u32 = 1024;

pub(super) fn logit_bias(
    be: &CudaBackend,
    logits: &Tensor,
    b: &LogitBias<'_>,
    (batch, vocab, k): (usize, usize, usize),
) -> Result<()> {
    const OP: &str = "logit_bias";
    if batch == 0 || k == 0 {
        return Ok(());
    }
    let c = cfg((grid_x(OP, "batch", batch)?, 1, 1), (128, 1, 1));
    let (l, ids, vals, count) = (dptr(logits), dptr(b.ids), dptr(b.vals), dptr(b.count));
    let vocab = int(OP, "vocab", vocab)?;
    let k = int(OP, "K", k)?;
    be.launch(
        &be.kernels().logit_bias_f32,
        c,
        &mut args![l, ids, vals, count, vocab, k],
    )
}

pub(super) fn penalty_count(
    be: &CudaBackend,
    counts: &Tensor,
    slots: &Tensor,
    tokens: &Tensor,
    (rows, vocab, n): (usize, usize, usize),
) -> Result<()> {
    const OP: &str = "penalty_count";
    if n == 0 {
        return Ok(());
    }
    let c = cfg((1, 1, 1), (32, 1, 1));
    let (p, s, t) = (dptr(counts), dptr(slots), dptr(tokens));
    let (n, rows, vocab) = (
        int(OP, "n", n)?,
        int(OP, "slots", rows)?,
        int(OP, "vocab", vocab)?,
    );
    be.launch(
        &be.kernels().penalty_count_i32,
        c,
        &mut args![p, s, t, n, rows, vocab],
    )
}

pub(super) fn sample(
    be: &CudaBackend,
    logits: &Tensor,
    p: &Sampling<'_>,
    out: &Tensor,
    d: &SampleDims,
) -> Result<()> {
    const OP: &str = "sample";
    if d.batch == 0 {
        return Ok(());
    }
    let counts_aligned = p.penalties.as_ref().is_none_or(|q| aligned16(q.counts));
    let vec = (d.vocab.is_multiple_of(4) && aligned16(logits) && counts_aligned) as i32;
    let c = cfg(
        (grid_x(OP, "batch", d.batch)?, 1, 1),
        (SAMPLE_THREADS, 1, 1),
    );
    let (l, t, k, tp, mp, s, o) = (
        dptr(logits),
        dptr(p.temperature),
        dptr(p.top_k),
        dptr(p.top_p),
        dptr(p.min_p),
        dptr(p.seeds),
        dptr(out),
    );
    // Null pointers tell the kernel a feature is off.
    let (counts, slot, rep, freq, pres) = match &p.penalties {
        Some(q) => (
            dptr(q.counts),
            dptr(q.slot),
            dptr(q.repetition),
            dptr(q.frequency),
            dptr(q.presence),
        ),
        None => (0, 0, 0, 0, 0),
    };
    let (num, tok, ids, top, target) = match &p.logprobs {
        Some(q) => (
            dptr(q.num),
            dptr(q.token),
            dptr(q.top_ids),
            dptr(q.top),
            q.target.map_or(0, dptr),
        ),
        None => (0, 0, 0, 0, 0),
    };
    let (mask_bits, mask_on) = match &p.mask {
        Some(m) => (dptr(m.bits), dptr(m.on)),
        None => (0, 0),
    };
    // row * mask_words indexes the bits in i64.
    let mask_words = int(OP, "mask words", d.mask_words)?;
    let slots = int(OP, "penalty slots", d.slots)?;
    // slots * vocab indexes counts in i64; top_n <= MAX_TOP_LOGPROBS (check_sample).
    let top_n = d.top_n as i32;
    // The kernel walks the row in tiles of 4 * SAMPLE_THREADS with i32 indices.
    let vocab = int(OP, "vocab", d.vocab + 4 * SAMPLE_THREADS as usize).map(|_| d.vocab as i32)?;
    be.launch(
        &be.kernels().sample_f32,
        c,
        &mut args![
            l, t, k, tp, mp, s, o, counts, slot, rep, freq, pres, slots, num, tok, ids, top, top_n,
            target, mask_bits, mask_on, mask_words, vocab, vec
        ],
    )
}
