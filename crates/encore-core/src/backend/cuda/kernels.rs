//! The NVRTC kernel sources of the CUDA backend and one launcher per op.
//!
//! Sources live in `crates/encore-core/kernels/`: `common.cuh` is prepended to every `.cu`
//! file before compiling (see [`COMMON`]), and [`SOURCES`] lists every file with every
//! `extern "C"` entry point it defines (`scripts/check-kernels.py` checks both lists against
//! NVRTC's output). The backend validates shapes, dtypes and devices and then calls the
//! launchers here, which only choose launch shapes (from tensor shapes alone: graphs replay
//! them with new buffer contents), check alignment and pass pointers.

use std::ffi::c_void;

use cudarc::driver::LaunchConfig;

use super::{dptr, CudaBackend};
use crate::backend::{Attention, QkvRope, Sampling};
use crate::error::{Error, Result};
use crate::ops::{AttentionDims, EmbeddingDims, MatmulDims, QkvRopeDims, RowDims, SampleDims};
use crate::tensor::{DType, Tensor};

/// One kernel file: its name, its text and the entry points it defines.
pub(super) struct KernelSource {
    pub file: &'static str,
    pub src: &'static str,
    pub functions: &'static [&'static str],
}

/// Prepended to every kernel file before NVRTC compiles it.
pub(super) const COMMON: &str = include_str!("../../../kernels/common.cuh");

pub(super) const SOURCES: &[KernelSource] = &[
    KernelSource {
        file: "embedding.cu",
        src: include_str!("../../../kernels/embedding.cu"),
        functions: &["embedding_bf16", "embedding_f16", "embedding_f32"],
    },
    KernelSource {
        file: "rms_norm.cu",
        src: include_str!("../../../kernels/rms_norm.cu"),
        functions: &["rms_norm_bf16", "rms_norm_f16", "rms_norm_f32"],
    },
    KernelSource {
        file: "silu_mul.cu",
        src: include_str!("../../../kernels/silu_mul.cu"),
        functions: &["silu_mul_bf16", "silu_mul_f16", "silu_mul_f32"],
    },
    KernelSource {
        file: "qkv_rope.cu",
        src: include_str!("../../../kernels/qkv_rope.cu"),
        functions: &["qkv_rope_bf16", "qkv_rope_f16", "qkv_rope_f32"],
    },
    KernelSource {
        file: "attention.cu",
        src: include_str!("../../../kernels/attention.cu"),
        functions: &[
            "attention_split_g1_bf16",
            "attention_split_g2_bf16",
            "attention_split_g4_bf16",
            "attention_split_g8_bf16",
            "attention_split_g1_f16",
            "attention_split_g2_f16",
            "attention_split_g4_f16",
            "attention_split_g8_f16",
            "attention_split_g1_f32",
            "attention_split_g2_f32",
            "attention_split_g4_f32",
            "attention_split_g8_f32",
            "attention_combine_bf16",
            "attention_combine_f16",
            "attention_combine_f32",
        ],
    },
    KernelSource {
        file: "attention_prefill.cu",
        src: include_str!("../../../kernels/attention_prefill.cu"),
        functions: &[
            "attention_prefill_hd64_bf16",
            "attention_prefill_hd128_bf16",
            "attention_prefill_hd64_f16",
            "attention_prefill_hd128_f16",
        ],
    },
    KernelSource {
        file: "gemv.cu",
        src: include_str!("../../../kernels/gemv.cu"),
        functions: &[
            "gemv_bf16_bf16_m1",
            "gemv_bf16_bf16_m2",
            "gemv_bf16_bf16_m4",
            "gemv_bf16_bf16_m8",
            "gemv_bf16_f32_m1",
            "gemv_bf16_f32_m2",
            "gemv_bf16_f32_m4",
            "gemv_bf16_f32_m8",
            "gemv_f16_f16_m1",
            "gemv_f16_f16_m2",
            "gemv_f16_f16_m4",
            "gemv_f16_f16_m8",
            "gemv_f16_f32_m1",
            "gemv_f16_f32_m2",
            "gemv_f16_f32_m4",
            "gemv_f16_f32_m8",
            "gemv_f32_f32_m1",
            "gemv_f32_f32_m2",
            "gemv_f32_f32_m4",
            "gemv_f32_f32_m8",
            "gemv_silu_bf16_m1",
            "gemv_silu_f16_m1",
            "gemv_silu_f32_m1",
        ],
    },
    KernelSource {
        file: "sampling.cu",
        src: include_str!("../../../kernels/sampling.cu"),
        functions: &["sample_f32"],
    },
];

/// `[*mut c_void; N]` of pointers to the (local, named) kernel arguments, in order.
macro_rules! args {
    ($($a:ident),* $(,)?) => {
        [$(&$a as *const _ as *mut c_void),*]
    };
}

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
fn threads_for(work: usize, max: u32) -> u32 {
    (work.div_ceil(32) * 32).clamp(32, max as usize) as u32
}

fn kernel(op: &str, dtype: DType) -> String {
    format!("{op}_{}", dtype.kernel_suffix())
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
    be.launch(
        &kernel(OP, dt),
        c,
        &mut args![ids, table, out, vocab, hidden, vec],
    )
}

pub(super) fn rms_norm(
    be: &CudaBackend,
    x: &Tensor,
    residual: Option<&Tensor>,
    w: &Tensor,
    eps: f32,
    out: &Tensor,
    d: &RowDims,
) -> Result<()> {
    const OP: &str = "rms_norm";
    if d.rows == 0 || d.dim == 0 {
        return Ok(());
    }
    let dt = x.dtype();
    let vec = (d.dim * dt.size()).is_multiple_of(16)
        && aligned16(x)
        && aligned16(w)
        && aligned16(out)
        && residual.is_none_or(aligned16);
    let work = if vec { d.dim * dt.size() / 16 } else { d.dim };
    let c = cfg(
        (grid_x(OP, "rows", d.rows)?, 1, 1),
        (threads_for(work, 1024), 1, 1),
    );
    let has_res = residual.is_some() as i32;
    let (x, res, w, out) = (dptr(x), residual.map_or(0, dptr), dptr(w), dptr(out));
    let dim = int(OP, "dim", d.dim)?;
    let vec = vec as i32;
    be.launch(
        &kernel(OP, dt),
        c,
        &mut args![x, res, w, out, dim, eps, has_res, vec],
    )
}

pub(super) fn silu_mul(
    be: &CudaBackend,
    gate_up: &Tensor,
    out: &Tensor,
    d: &RowDims,
) -> Result<()> {
    const OP: &str = "silu_mul";
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
    let vec = vec as i32;
    be.launch(&kernel(OP, dt), c, &mut args![gu, out, rows, inter, vec])
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
    let n = int(OP, "n", d.n)?;
    let nh = int(OP, "num_heads", d.num_heads)?;
    let nkv = int(OP, "num_kv_heads", d.num_kv_heads)?;
    let hd = d.head_dim as i32;
    let rot = d.rot as i32; // <= head_dim
    let maxp = int(OP, "max_positions", d.max_positions).unwrap_or(i32::MAX);
    let num_slots = (d.num_blocks as u64 * d.block_size as u64).min(i64::MAX as u64) as i64;
    be.launch(
        &kernel("qkv_rope", a.qkv.dtype()),
        c,
        &mut args![
            qkv, qn, kn, has_norm, eps, pos, cs, sm, q_out, kc, vc, n, nh, nkv, hd, rot, maxp,
            num_slots
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

/// `(ksplit, CTAs)` of a gemv over `n` rows of `k` with `rows_per_warp` rows per warp:
/// split k over more warps while there are too few CTAs to keep every SM streaming (two
/// per SM) and each warp still gets a 16-byte-per-lane chunk of k.
fn gemv_layout(
    be: &CudaBackend,
    dt: DType,
    n: usize,
    k: usize,
    rows_per_warp: usize,
) -> (usize, usize) {
    let nchunks = k.div_ceil(32 * 16 / dt.size());
    let mut ksplit = 1;
    while ksplit < GEMV_WARPS
        && (n * ksplit).div_ceil(GEMV_WARPS * rows_per_warp) < 2 * be.sm_count()
        && 2 * ksplit <= nchunks
    {
        ksplit *= 2;
    }
    (ksplit, n.div_ceil(GEMV_WARPS / ksplit * rows_per_warp))
}

/// `out = silu_mul(x · wᵀ)` for one row of x in one gemv pass (`gemv_silu_*`): w is the
/// merged `[2 * inter, k]` gate/up weight. The caller checked shapes and [`gemv_fits`].
pub(super) fn gemv_silu(
    be: &CudaBackend,
    x: &Tensor,
    w: &Tensor,
    out: &Tensor,
    d: &MatmulDims,
) -> Result<()> {
    const OP: &str = "matmul_silu_mul (gemv)";
    let inter = d.n / 2;
    if inter == 0 {
        return Ok(());
    }
    let dt = x.dtype();
    let (ksplit, ctas) = gemv_layout(be, dt, inter, d.k, 1);
    let c = cfg(
        (grid_x(OP, "inter", ctas)?, 1, 1),
        ((GEMV_WARPS * 32) as u32, 1, 1),
    );
    let (xp, wp, op) = (dptr(x), dptr(w), dptr(out));
    let n = int(OP, "2 * inter", d.n).map(|_| inter as i32)?;
    let k = int(OP, "k", d.k)?;
    let ksplit = ksplit as i32;
    be.launch(
        &format!("gemv_silu_{}_m1", dt.kernel_suffix()),
        c,
        &mut args![xp, wp, op, n, k, ksplit],
    )
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
    let (ksplit, ctas) = gemv_layout(be, dt, d.n, d.k, variant.min(4));
    let name = format!(
        "gemv_{}_{}_m{variant}",
        dt.kernel_suffix(),
        out.dtype().kernel_suffix()
    );
    let c = cfg(
        (grid_x(OP, "n", ctas)?, 1, 1),
        ((GEMV_WARPS * 32) as u32, 1, 1),
    );
    let (xp, wp, bp, op) = (dptr(x), dptr(w), bias.map_or(0, dptr), dptr(out));
    let m = d.m as i32; // <= GEMV_MAX_ROWS
    let n = int(OP, "n", d.n)?;
    let k = int(OP, "k", d.k)?;
    let ksplit = ksplit as i32;
    be.launch(&name, c, &mut args![xp, wp, bp, op, m, n, k, ksplit])
}

// ---------------------------------------------------------------------------------------
// Attention

/// Threads per CTA of the split kernel (`ATT_THREADS` in attention.cu).
const ATT_THREADS: usize = 128;
/// Query heads one CTA can hold (the largest `attention_split_g*` variant).
const ATT_MAX_HEADS_PER_CTA: usize = 8;
/// Largest GQA group: groups of 9..=16 heads are split over two CTAs.
const ATT_MAX_GROUP: usize = 16;
const ATT_MAX_SPLITS: usize = 32;
/// A split gets at least this many tokens of the longest context the table can hold.
const ATT_MIN_SPLIT_TOKENS: usize = 64;
/// Fixed cost of one CTA (loading q, merging its token slots, writing), in tokens.
const ATT_CTA_OVERHEAD_TOKENS: usize = 128;
/// Cost of the combine launch that any split count above 1 adds, in tokens.
const ATT_COMBINE_TOKENS: usize = 128;

/// CTAs of `attention_split_g{gmax}_*` resident per SM (registers and shared memory per
/// CTA as reported by `scripts/check-kernels.py -v`). Only steers the split count.
fn att_ctas_per_sm(gmax: usize) -> usize {
    match gmax {
        1 => 6,
        2 => 5,
        4 => 4,
        _ => 2,
    }
}

/// How one attention launch is laid out; a function of shapes, the SM count and the
/// layer's window (model constants) only.
struct AttentionPlan {
    /// Heads of one CTA (`gmax` is the kernel variant holding them), CTAs per GQA group.
    heads_per_cta: usize,
    gmax: usize,
    num_sub: usize,
    /// Split-K factor; 1 means kernel 1 writes `out` directly and there is no combine.
    num_splits: usize,
}

impl AttentionPlan {
    fn new(
        sm_count: usize,
        rows: usize,
        num_heads: usize,
        num_kv_heads: usize,
        table_width: usize,
        block_size: usize,
        window: Option<usize>,
    ) -> Self {
        let group = num_heads / num_kv_heads.max(1);
        let mut heads_per_cta = if group <= ATT_MAX_HEADS_PER_CTA {
            group
        } else {
            group.div_ceil(2)
        }
        .max(1);
        // A CTA holding a whole GQA group reads each K/V row once for all its heads (what
        // large batches need), but its per-token work grows with the heads it holds. With
        // fewer (row, KV head) pairs than SMs (small batches), the step is bound by the
        // latency of a few such CTAs: spread the group's heads over more CTAs instead,
        // halving the heads per CTA until every SM has one (the extra K/V reads hit L2).
        while heads_per_cta > 1 && rows * num_kv_heads * group.div_ceil(heads_per_cta) < sm_count {
            heads_per_cta = heads_per_cta.div_ceil(2);
        }
        let gmax = heads_per_cta.next_power_of_two();
        let num_sub = group.div_ceil(heads_per_cta).max(1);
        // Pick the split count that minimises (waves of CTAs) x (tokens per CTA + fixed
        // cost), plus the combine launch when split, for the longest range of keys a row
        // can attend to (the block table's capacity, or the window when shorter), never
        // splitting it finer than a block (and ATT_MIN_SPLIT_TOKENS). Ties go to fewer
        // splits. A window never raises the split count above the full-attention plan's,
        // whose scratch `attention_scratch_len` provides.
        let ctas = (rows * num_kv_heads * num_sub).max(1);
        let slots = att_ctas_per_sm(gmax) * sm_count.max(1);
        let capacity = table_width.saturating_mul(block_size);
        let max_ctx = window.map_or(capacity, |w| w.min(capacity));
        let limit = match window {
            Some(_) => {
                Self::new(
                    sm_count,
                    rows,
                    num_heads,
                    num_kv_heads,
                    table_width,
                    block_size,
                    None,
                )
                .num_splits
            }
            None => ATT_MAX_SPLITS,
        };
        let by_len = (max_ctx / ATT_MIN_SPLIT_TOKENS.max(block_size)).clamp(1, limit);
        let mut best = (usize::MAX, 1);
        for s in 1..=by_len {
            let waves = ctas.saturating_mul(s).div_ceil(slots);
            let combine = if s > 1 { ATT_COMBINE_TOKENS } else { 0 };
            let cost =
                waves.saturating_mul(max_ctx.div_ceil(s) + ATT_CTA_OVERHEAD_TOKENS) + combine;
            if cost < best.0 {
                best = (cost, s);
            }
        }
        AttentionPlan {
            heads_per_cta,
            gmax,
            num_sub,
            num_splits: best.1,
        }
    }

    /// f32 scratch elements: acc `[rows, num_heads, splits, head_dim]` then (m, l) pairs.
    fn scratch_len(&self, rows: usize, num_heads: usize, head_dim: usize) -> usize {
        if self.num_splits == 1 {
            0
        } else {
            rows * num_heads * self.num_splits * (head_dim + 2)
        }
    }
}

/// Scratch for [`attention`] with these shapes: the largest need over every GQA layout
/// `num_heads` admits (the number of KV heads is not an argument), so it is always enough
/// for the plan `attention` picks.
pub(super) fn attention_scratch_len(
    sm_count: usize,
    rows: usize,
    num_heads: usize,
    head_dim: usize,
    table_width: usize,
    block_size: usize,
) -> usize {
    (1..=num_heads)
        .filter(|kvh| num_heads.is_multiple_of(*kvh) && num_heads / kvh <= ATT_MAX_GROUP)
        .map(|kvh| {
            AttentionPlan::new(
                sm_count,
                rows,
                num_heads,
                kvh,
                table_width,
                block_size,
                None,
            )
            .scratch_len(rows, num_heads, head_dim)
        })
        .max()
        .unwrap_or(0)
}

pub(super) fn attention(be: &CudaBackend, a: &Attention<'_>, d: &AttentionDims) -> Result<()> {
    const OP: &str = "attention";
    if d.rows == 0 || d.num_heads == 0 {
        return Ok(());
    }
    if d.head_dim == 0 || !d.head_dim.is_multiple_of(8) || d.head_dim > 256 {
        return Err(Error::invalid(
            OP,
            format!(
                "head_dim = {} is not supported (a multiple of 8 up to 256)",
                d.head_dim
            ),
        ));
    }
    let group = d.num_heads / d.num_kv_heads;
    if group > ATT_MAX_GROUP {
        return Err(Error::invalid(
            OP,
            format!(
                "GQA group of {group} query heads per KV head ({} / {}) is not supported \
                 (at most {ATT_MAX_GROUP})",
                d.num_heads, d.num_kv_heads
            ),
        ));
    }
    if d.table_width.saturating_mul(d.block_size) > 1 << 30 {
        return Err(Error::invalid(
            OP,
            format!(
                "table_width * block_size = {} * {} exceeds 2^30 tokens",
                d.table_width, d.block_size
            ),
        ));
    }
    for (name, t) in [
        ("q", a.q),
        ("k_cache", a.k_cache),
        ("v_cache", a.v_cache),
        ("out", a.out),
        ("scratch", a.scratch),
    ] {
        if !aligned16(t) {
            return Err(Error::invalid(
                OP,
                format!("tensor `{name}` must start at a 16-byte aligned address"),
            ));
        }
    }

    if let Some(name) = prefill_kernel(
        a.q.dtype(),
        d.head_dim,
        a.cu_seqlens_q.is_some(),
        be.flash_prefill(),
    ) {
        return attention_prefill(be, a, d, &name);
    }

    let plan = AttentionPlan::new(
        be.sm_count(),
        d.rows,
        d.num_heads,
        d.num_kv_heads,
        d.table_width,
        d.block_size,
        a.window,
    );
    // Scratch was checked against `attention_scratch_len` (the largest plan's need) by
    // the caller.

    let dt = a.q.dtype();
    // Lanes per token: a power of two holding the head's 16-byte vectors (at most 1 per
    // lane for 16-bit types, 2 for f32), at least 4 (ATT_THREADS / 4 token slots).
    let nvec = d.head_dim * dt.size() / 16;
    let lpt = nvec
        .div_ceil(if dt.size() == 4 { 2 } else { 1 })
        .next_power_of_two()
        .clamp(4, 32);
    let name = format!("attention_split_g{}_{}", plan.gmax, dt.kernel_suffix());

    let y = d.num_kv_heads * plan.num_sub;
    if y > 65_535 || d.num_heads > 65_535 {
        return Err(Error::invalid(
            OP,
            format!("num_heads = {} is too large (grid y)", d.num_heads),
        ));
    }
    let y_heads = d.num_heads as u32;
    let c = cfg(
        (
            grid_x(OP, "rows", d.rows)?,
            y as u32,
            plan.num_splits as u32,
        ),
        (ATT_THREADS as u32, 1, 1),
    );
    let (q, kc, vc) = (dptr(a.q), dptr(a.k_cache), dptr(a.v_cache));
    let (bt, sl) = (dptr(a.block_tables), dptr(a.seq_lens));
    let cu = a.cu_seqlens_q.map_or(0, dptr);
    let has_cu = a.cu_seqlens_q.is_some() as i32;
    let (out, scratch) = (dptr(a.out), dptr(a.scratch));
    let qscale = a.scale * std::f32::consts::LOG2_E;
    let window = window_arg(a.window);
    let num_seqs = int(OP, "num_seqs", d.num_seqs)?;
    let rows = int(OP, "rows", d.rows)?;
    let nh = int(OP, "num_heads", d.num_heads)?;
    let nkv = int(OP, "num_kv_heads", d.num_kv_heads)?;
    let hd = d.head_dim as i32;
    let nb = int(OP, "num_blocks", d.num_blocks)?;
    let bs = d.block_size as i32; // table_width * block_size <= 2^30 checked above
    let tw = d.table_width as i32;
    let group = group as i32;
    let hpc = plan.heads_per_cta as i32;
    let nsub = plan.num_sub as i32;
    let splits = plan.num_splits as i32;
    let lpt = lpt as i32;
    int(
        OP,
        "rows * num_heads * head_dim",
        d.rows * d.num_heads * d.head_dim,
    )
    .map(|_| ())?;
    be.launch(
        &name,
        c,
        &mut args![
            q, kc, vc, bt, sl, cu, has_cu, out, scratch, qscale, window, num_seqs, rows, nh, nkv,
            hd, nb, bs, tw, group, hpc, nsub, splits, lpt
        ],
    )?;
    if plan.num_splits > 1 {
        // One CTA per (row, head) (`ATT_COMBINE_THREADS` in attention.cu).
        let c = cfg((rows as u32, y_heads, 1), (256, 1, 1));
        be.launch(
            &kernel("attention_combine", dt),
            c,
            &mut args![scratch, out, rows, nh, hd, splits],
        )?;
    }
    Ok(())
}

/// The attention kernels' `window` argument: 0 for full attention. A window of
/// `i32::MAX` or more reaches back past position 0 from any position a seq_len can give,
/// so it is full attention as well.
fn window_arg(window: Option<usize>) -> i32 {
    window.map_or(0, |w| w.min(i32::MAX as usize) as i32)
}

/// Query rows per CTA of `attention_prefill_*` (`FA_BM` in attention_prefill.cu).
const FA_BM: usize = 128;
/// Keys per K/V tile of `attention_prefill_*` (`FA_BN`).
const FA_BN: usize = 32;
/// Threads per CTA of `attention_prefill_*` (`FA_THREADS`).
const FA_THREADS: u32 = 128;

/// Dynamic shared memory of `attention_prefill_hd{head_dim}_*` (`FA_SMEM_BYTES`): Q, two
/// K and two V tiles with rows padded to head_dim + 8 16-bit elements, and two key-validity
/// arrays.
const fn fa_smem_bytes(head_dim: usize) -> usize {
    (FA_BM + 4 * FA_BN) * (head_dim + 8) * 2 + 2 * FA_BN * 4
}

/// The dynamic shared memory kernel `name` is launched with, where that is over the
/// default 48 KiB limit: the backend raises the function's limit to this at load time.
pub(super) fn dynamic_smem_limit(name: &str) -> Option<usize> {
    let hd = name.strip_prefix("attention_prefill_hd")?;
    let hd: usize = hd.split('_').next()?.parse().ok()?;
    Some(fa_smem_bytes(hd))
}

/// The tensor-core prefill kernel for a launch, or `None` for the split-K kernel. A
/// function of the dtype, the head size and whether the step has `cu_seqlens_q` (prefill
/// or mixed) only; `enabled` is the backend's `ENCORE_PREFILL_ATTENTION` setting.
fn prefill_kernel(dt: DType, head_dim: usize, has_cu: bool, enabled: bool) -> Option<String> {
    let hd_ok = head_dim == 64 || head_dim == 128;
    let dt_ok = matches!(dt, DType::BF16 | DType::F16);
    (enabled && has_cu && hd_ok && dt_ok)
        .then(|| format!("attention_prefill_hd{head_dim}_{}", dt.kernel_suffix()))
}

/// `attention_prefill_*`: grid (num_heads, ceil(rows / 128) + num_seqs), 128 threads,
/// `fa_smem_bytes` of dynamic shared memory; each CTA finds its (sequence, 128-row tile)
/// in `cu_seqlens_q` on the device. Tiles are on y so that the longest-context tiles of
/// every head are dispatched first.
fn attention_prefill(
    be: &CudaBackend,
    a: &Attention<'_>,
    d: &AttentionDims,
    name: &str,
) -> Result<()> {
    const OP: &str = "attention";
    let Some(cu) = a.cu_seqlens_q else {
        return Err(Error::invalid(OP, "the prefill kernel needs cu_seqlens_q"));
    };
    let tiles = d.rows.div_ceil(FA_BM) + d.num_seqs;
    if tiles > 65_535 {
        return Err(Error::invalid(
            OP,
            format!("{tiles} row tiles (rows / 128 + num_seqs) are too many (grid y)"),
        ));
    }
    let mut c = cfg(
        (grid_x(OP, "num_heads", d.num_heads)?, tiles as u32, 1),
        (FA_THREADS, 1, 1),
    );
    c.shared_mem_bytes = fa_smem_bytes(d.head_dim) as u32;
    let (q, kc, vc) = (dptr(a.q), dptr(a.k_cache), dptr(a.v_cache));
    let (bt, sl, cu) = (dptr(a.block_tables), dptr(a.seq_lens), dptr(cu));
    let out = dptr(a.out);
    let qscale = a.scale * std::f32::consts::LOG2_E;
    let window = window_arg(a.window);
    let num_seqs = int(OP, "num_seqs", d.num_seqs)?;
    let rows = int(OP, "rows", d.rows)?;
    let nh = int(OP, "num_heads", d.num_heads)?;
    let nkv = int(OP, "num_kv_heads", d.num_kv_heads)?;
    let nb = int(OP, "num_blocks", d.num_blocks)?;
    let bs = d.block_size as i32; // table_width * block_size <= 2^30 checked by the caller
    let tw = d.table_width as i32;
    let group = (d.num_heads / d.num_kv_heads) as i32;
    be.launch(
        name,
        c,
        &mut args![
            q, kc, vc, bt, sl, cu, out, qscale, window, num_seqs, rows, nh, nkv, nb, bs, tw, group
        ],
    )
}

// ---------------------------------------------------------------------------------------
// Sampling

/// Threads per row (`SAMPLE_THREADS` in sampling.cu).
const SAMPLE_THREADS: u32 = 1024;

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
    let (num, tok, ids, top) = match &p.logprobs {
        Some(q) => (dptr(q.num), dptr(q.token), dptr(q.top_ids), dptr(q.top)),
        None => (0, 0, 0, 0),
    };
    let slots = int(OP, "penalty slots", d.slots)?;
    // slots * vocab indexes counts in i64; top_n <= MAX_TOP_LOGPROBS (check_sample).
    let top_n = d.top_n as i32;
    // The kernel walks the row in tiles of 4 * SAMPLE_THREADS with i32 indices.
    let vocab = int(OP, "vocab", d.vocab + 4 * SAMPLE_THREADS as usize).map(|_| d.vocab as i32)?;
    be.launch(
        "sample_f32",
        c,
        &mut args![
            l, t, k, tp, mp, s, o, counts, slot, rep, freq, pres, slots, num, tok, ids, top, top_n,
            vocab, vec
        ],
    )
}
