//! The attention launchers: the tensor-core decode kernel (GQA decode rows), the split-K
//! paged attention kernel and its combine pass (the other decode rows, and prefill when the
//! tensor-core kernel does not apply), and the tensor-core flash-attention prefill
//! kernel.

use super::{aligned16, cfg, grid_x, int};
use crate::backend::cuda::handles::Kernel;
use crate::backend::cuda::{dptr, CudaBackend};
use crate::backend::Attention;
use crate::error::{Error, Result};
use crate::ops::AttentionDims;
use crate::tensor::DType;

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
        AttentionPlan {
            heads_per_cta,
            gmax,
            num_sub,
            num_splits: cheapest_splits(ctas, slots, max_ctx, by_len),
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
pub(in crate::backend::cuda) fn attention_scratch_len(
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
            let split = AttentionPlan::new(
                sm_count,
                rows,
                num_heads,
                kvh,
                table_width,
                block_size,
                None,
            )
            .scratch_len(rows, num_heads, head_dim);
            // Either cache's launch (their CTAs an SM differ).
            let tc = [false, true]
                .map(|kv8| decode_splits(sm_count, rows, kvh, table_width, block_size, None, kv8))
                .into_iter()
                .max()
                .map_or(0, |s| {
                    if s == 1 {
                        0
                    } else {
                        rows * num_heads * s * (head_dim + 2)
                    }
                });
            split.max(tc)
        })
        .max()
        .unwrap_or(0)
}

/// Threads of `attention_decode_*` (`DA_THREADS` in attention_decode.cu).
const DA_THREADS: u32 = 128;
/// Keys per tile of `attention_decode_*` (`DA_KEYS`): a split is a whole number of tiles.
const DA_KEYS: usize = 64;
/// CTAs of `attention_decode_*` resident per SM: 2 over a cache of T (157 registers a
/// thread by `scripts/check-kernels.py -v`, about 108 KiB of shared memory each at
/// head_dim 128), 3 over FP8 (150 registers, about 60 KiB). Only steers the split count.
const fn da_ctas_per_sm(kv8: bool) -> usize {
    if kv8 {
        3
    } else {
        2
    }
}

/// Dynamic shared memory of `attention_decode_hd{head_dim}_*[_kv8]` (`DA_SMEM_BYTES`):
/// Q, then 3 K/V tiles of 16-bit rows padded to head_dim + 8 elements, or 3 raw FP8 K/V
/// tiles of rows padded to head_dim + 16 bytes, then a key-validity array per stage.
const fn da_smem_bytes(head_dim: usize, kv8: bool) -> usize {
    let q = 16 * (head_dim + 8) * 2;
    if kv8 {
        q + 3 * 2 * DA_KEYS * (head_dim + 16) + 3 * DA_KEYS * 4
    } else {
        q + 3 * 2 * DA_KEYS * (head_dim + 8) * 2 + 3 * DA_KEYS * 4
    }
}

/// The split count of the tensor-core decode kernel (a CTA per row, KV head and split):
/// the one that minimises (waves of CTAs) x (keys per split + a CTA's fixed cost) plus the
/// combine launch, for the longest range of keys a row can attend to (the table's capacity,
/// or the window when shorter; never more splits than without the window, whose scratch
/// `attention_scratch_len` provides), never finer than a tile of keys. A function of
/// shapes, the SM count and the layer's window only.
fn decode_splits(
    sm_count: usize,
    rows: usize,
    num_kv_heads: usize,
    table_width: usize,
    block_size: usize,
    window: Option<usize>,
    kv8: bool,
) -> usize {
    let ctas = (rows * num_kv_heads).max(1);
    let slots = da_ctas_per_sm(kv8) * sm_count.max(1);
    let capacity = table_width.saturating_mul(block_size);
    let max_ctx = window.map_or(capacity, |w| w.min(capacity));
    let limit = match window {
        Some(_) => decode_splits(
            sm_count,
            rows,
            num_kv_heads,
            table_width,
            block_size,
            None,
            kv8,
        ),
        None => ATT_MAX_SPLITS,
    };
    let by_len = (max_ctx / DA_KEYS.max(block_size)).clamp(1, limit);
    cheapest_splits(ctas, slots, max_ctx, by_len)
}

/// The split count in `1..=most` that minimises (waves of `ctas` x splits CTAs over
/// `slots` resident ones) x (a split's share of `max_ctx` keys + a CTA's fixed cost), plus
/// the combine launch when split; ties go to fewer splits.
fn cheapest_splits(ctas: usize, slots: usize, max_ctx: usize, most: usize) -> usize {
    let mut best = (usize::MAX, 1);
    for s in 1..=most {
        let waves = ctas.saturating_mul(s).div_ceil(slots);
        let combine = if s > 1 { ATT_COMBINE_TOKENS } else { 0 };
        let cost = waves.saturating_mul(max_ctx.div_ceil(s) + ATT_CTA_OVERHEAD_TOKENS) + combine;
        if cost < best.0 {
            best = (cost, s);
        }
    }
    best.1
}

/// The integer launch arguments every attention kernel takes, checked to fit an i32:
/// rows, num_heads, num_kv_heads, num_blocks, block_size, table_width, group.
fn launch_ints(op: &'static str, d: &AttentionDims) -> Result<[i32; 7]> {
    Ok([
        int(op, "rows", d.rows)?,
        int(op, "num_heads", d.num_heads)?,
        int(op, "num_kv_heads", d.num_kv_heads)?,
        int(op, "num_blocks", d.num_blocks)?,
        // table_width * block_size <= 2^30, checked by `attention`.
        d.block_size as i32,
        d.table_width as i32,
        (d.num_heads / d.num_kv_heads.max(1)) as i32,
    ])
}

/// The tensor-core decode kernel for a launch, or `None`: decode rows (no
/// `cu_seqlens_q`) of a GQA model (2 to 16 query heads per KV head) in bf16 / f16 with
/// head_dim 64 or 128, unless `ENCORE_DECODE_ATTENTION=split`.
fn decode_kernel<'k>(
    be: &'k CudaBackend,
    a: &Attention<'_>,
    d: &AttentionDims,
    kv8: bool,
) -> Option<&'k Kernel> {
    let group = d.num_heads / d.num_kv_heads.max(1);
    if a.cu_seqlens_q.is_some() || !be.tc_decode() || !(2..=16).contains(&group) {
        return None;
    }
    be.kernels().attention_decode(d.head_dim, a.q.dtype(), kv8)
}

/// `attention_decode_*`: grid (rows, num_kv_heads, splits), 128 threads, `da_smem_bytes`
/// of dynamic shared memory; then the combine pass when split.
fn attention_decode(
    be: &CudaBackend,
    a: &Attention<'_>,
    d: &AttentionDims,
    kernel: &Kernel,
    kv8: bool,
) -> Result<()> {
    const OP: &str = "attention";
    let splits = decode_splits(
        be.sm_count(),
        d.rows,
        d.num_kv_heads,
        d.table_width,
        d.block_size,
        a.window,
        kv8,
    );
    if d.num_kv_heads > 65_535 || d.num_heads > 65_535 {
        return Err(Error::invalid(
            OP,
            format!("num_heads = {} is too large (grid y)", d.num_heads),
        ));
    }
    // A row's KV heads in adjacent CTAs (they read the same blocks' rows at the same time;
    // measured 1-2% faster), rows on grid y while they fit it.
    let heads_fast = d.rows <= 65_535;
    let grid = if heads_fast {
        (d.num_kv_heads as u32, d.rows as u32, splits as u32)
    } else {
        (
            grid_x(OP, "rows", d.rows)?,
            d.num_kv_heads as u32,
            splits as u32,
        )
    };
    let mut c = cfg(grid, (DA_THREADS, 1, 1));
    c.shared_mem_bytes = da_smem_bytes(d.head_dim, kv8) as u32;
    let (q, kc, vc) = (dptr(a.q), dptr(a.k_cache), dptr(a.v_cache));
    let (bt, sl) = (dptr(a.block_tables), dptr(a.seq_lens));
    let (out, scratch) = (dptr(a.out), dptr(a.scratch));
    let (qscale, vscale) = scales(a);
    let cap = softcap_arg(a);
    // gpt-oss's per-head sinks (0: none).
    let sinks = a.sinks.map_or(0, dptr);
    let window = window_arg(a.window);
    let [rows, nh, nkv, nb, bs, tw, group] = launch_ints(OP, d)?;
    let ns = splits as i32;
    let hf = heads_fast as i32;
    be.launch(
        kernel,
        c,
        &mut args![
            q, kc, vc, bt, sl, out, scratch, qscale, vscale, cap, window, rows, nh, nkv, nb, bs,
            tw, group, ns, hf, sinks
        ],
    )?;
    if splits > 1 {
        let hd = d.head_dim as i32;
        let c = cfg((rows as u32, d.num_heads as u32, 1), (256, 1, 1));
        be.launch(
            be.kernels().attention_combine.get(a.q.dtype())?,
            c,
            &mut args![scratch, out, rows, nh, hd, ns, sinks],
        )?;
    }
    Ok(())
}

pub(in crate::backend::cuda) fn attention(
    be: &CudaBackend,
    a: &Attention<'_>,
    d: &AttentionDims,
) -> Result<()> {
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

    let has_cu = a.cu_seqlens_q.is_some();
    let kv8 = a.k_cache.dtype() == DType::F8E4M3;
    let enabled = be.flash_prefill() && !few_queries(d, be.sm_count());
    if let Some((kernel, wg)) = prefill_kernel(be, a.q.dtype(), d.head_dim, has_cu, kv8, enabled) {
        return attention_prefill(be, a, d, kernel, wg);
    }
    if let Some(kernel) = decode_kernel(be, a, d, kv8) {
        return attention_decode(be, a, d, kernel, kv8);
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
    let kernel = be.kernels().attention_split(plan.gmax, dt, kv8)?;

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
    let (qscale, vscale) = scales(a);
    let cap = softcap_arg(a);
    // gpt-oss's per-head sinks (0: none).
    let sinks = a.sinks.map_or(0, dptr);
    let window = window_arg(a.window);
    let num_seqs = int(OP, "num_seqs", d.num_seqs)?;
    let [rows, nh, nkv, nb, bs, tw, group] = launch_ints(OP, d)?;
    let hd = d.head_dim as i32;
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
        kernel,
        c,
        &mut args![
            q, kc, vc, bt, sl, cu, has_cu, out, scratch, qscale, vscale, cap, window, num_seqs,
            rows, nh, nkv, hd, nb, bs, tw, group, hpc, nsub, splits, lpt, sinks
        ],
    )?;
    if plan.num_splits > 1 {
        // One CTA per (row, head) (`ATT_COMBINE_THREADS` in attention.cu).
        let c = cfg((rows as u32, y_heads, 1), (256, 1, 1));
        be.launch(
            be.kernels().attention_combine.get(dt)?,
            c,
            &mut args![scratch, out, rows, nh, hd, splits, sinks],
        )?;
    }
    Ok(())
}

/// The kernels' `qscale` (the softmax scale in log2 units, times an FP8 cache's key scale)
/// and `vscale` (an FP8 cache's value scale, else 1).
fn scales(a: &Attention<'_>) -> (f32, f32) {
    let q = a.scale * std::f32::consts::LOG2_E;
    if a.k_cache.dtype() == DType::F8E4M3 {
        (q * a.kv_scale.k, a.kv_scale.v)
    } else {
        (q, 1.0)
    }
}

/// The kernels' `softcap`: the logit cap in log2 units (`cap * log2(e)`: a score `s` in
/// those units becomes `C tanh(s / C)`, as `cap tanh(x / cap)` in natural units), 0 for none.
fn softcap_arg(a: &Attention<'_>) -> f32 {
    a.softcap.map_or(0.0, |c| c * std::f32::consts::LOG2_E)
}

/// The attention kernels' `window` argument: 0 for full attention. A window of
/// `i32::MAX` or more reaches back past position 0 from any position a seq_len can give,
/// so it is full attention as well.
fn window_arg(window: Option<usize>) -> i32 {
    window.map_or(0, |w| w.min(i32::MAX as usize) as i32)
}

/// Query rows per CTA of `attention_prefill_*` (`FA_BM` in attention_prefill.cu).
const FA_BM: usize = 128;
/// Threads per CTA of `attention_prefill_*` (`FA_THREADS`).
const FA_THREADS: u32 = 128;

/// Keys per K/V tile (`FA_BN`) and tiles in flight (`FA_STAGES`) of `attention_prefill_*`:
/// the kernel's defaults, or the values of those kernel defines.
fn fa_tiles() -> (usize, usize) {
    static TILES: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    use crate::backend::cuda::nvrtc::kernel_define;
    *TILES.get_or_init(|| (kernel_define("FA_BN", 32), kernel_define("FA_STAGES", 2)))
}

/// Threads per CTA of `attention_prefill_wg_*` (`WS_THREADS`: a producer warpgroup and two
/// consumers); its rows per CTA are `FA_BM`'s 128 as well (`WG_BM`), so the grid is the
/// same.
const WG_THREADS: u32 = 384;
/// Keys per tile of `attention_prefill_wg_*` (`WG_BN`).
const WG_BN: usize = 128;

/// Dynamic shared memory of `attention_prefill_wg_hd{head_dim}_*` (`WS_SMEM_BYTES`): 1,024
/// bytes to align the base, Q, two K and two V stages of 16-bit elements, four raw E4M3
/// slots over an FP8 cache, two stages' key-validity words, eight mbarriers and the
/// producer's key rows of two tiles.
fn wg_smem_bytes(head_dim: usize, kv8: bool) -> usize {
    let raw = if kv8 { 4 * WG_BN * head_dim } else { 0 };
    1024 + FA_BM * head_dim * 2 + 4 * WG_BN * head_dim * 2 + raw + 2 * 4 * 4 + 8 * 8 + 2 * WG_BN * 4
}

/// Dynamic shared memory of `attention_prefill_hd{head_dim}_*` (`FA_SMEM_BYTES`): Q, the
/// K and V tiles of the dtype with rows padded to head_dim + 8 16-bit elements (a pair a
/// stage, or two pairs over an FP8 cache, whose stages are raw E4M3 rows), and the stages'
/// key-validity arrays.
fn fa_smem_bytes(head_dim: usize, kv8: bool) -> usize {
    let (bn, stages) = fa_tiles();
    let tbuf = if kv8 { 2 } else { stages };
    let raw = if kv8 { stages * 2 * bn * head_dim } else { 0 };
    (FA_BM + 2 * tbuf * bn) * (head_dim + 8) * 2 + raw + stages * bn * 4
}

/// The dynamic shared memory kernel `name` is launched with, where that is over the
/// default 48 KiB limit: the backend raises the function's limit to this at load time.
pub(in crate::backend::cuda) fn dynamic_smem_limit(name: &str) -> Option<usize> {
    if name.starts_with("marlin_") {
        return super::marlin::smem_of(name);
    }
    let tiled = name.starts_with("qmma_") && !name.starts_with("qmma_reduce");
    if tiled || name.starts_with("gmoe_") {
        let bm: usize = name.rsplit_once("_bm")?.1.parse().ok()?;
        return Some(super::quant::qmma_smem_bytes(bm));
    }
    if let Some(hd) = name.strip_prefix("attention_decode_hd") {
        let hd: usize = hd.split('_').next()?.parse().ok()?;
        return Some(da_smem_bytes(hd, name.ends_with("_kv8")));
    }
    if let Some(hd) = name.strip_prefix("attention_prefill_wg_hd") {
        let hd: usize = hd.split('_').next()?.parse().ok()?;
        return Some(wg_smem_bytes(hd, name.ends_with("_kv8")));
    }
    let hd = name.strip_prefix("attention_prefill_hd")?;
    let hd: usize = hd.split('_').next()?.parse().ok()?;
    Some(fa_smem_bytes(hd, name.ends_with("_kv8")))
}

/// Whether a step with `cu_seqlens_q` has so few queries per sequence that the split-K
/// kernel (a CTA per query row, splits of the context over the GPU) beats the tensor-core
/// kernel (a CTA per head and 128-row tile of a sequence): at most 2 per sequence (decode
/// rows, verify steps of one draft), or up to 16 when the tile kernel's CTAs with work,
/// `num_heads * num_seqs`, cannot fill the SMs (verify steps of few sequences). Measured
/// on the H100 (BENCHMARKS.md, verify graphs). A function of the launch's shape alone,
/// so a captured graph keeps its kernel.
fn few_queries(d: &AttentionDims, sm_count: usize) -> bool {
    let seqs = d.num_seqs.max(1);
    d.rows <= 2 * seqs || (d.rows <= 16 * seqs && d.num_heads * seqs < sm_count)
}

/// The tensor-core prefill kernel for a launch (and whether it is the warpgroup-MMA one),
/// or `None` for the split-K kernel. A function of the dtype, the head size, the cache
/// (FP8 or not) and whether the step has `cu_seqlens_q` (prefill or mixed) only; `enabled`
/// is the backend's `ENCORE_PREFILL_ATTENTION` setting.
fn prefill_kernel(
    be: &CudaBackend,
    dt: DType,
    head_dim: usize,
    has_cu: bool,
    kv8: bool,
    enabled: bool,
) -> Option<(&Kernel, bool)> {
    if !(enabled && has_cu) {
        return None;
    }
    if be.wgmma_prefill() {
        return be
            .kernels()
            .attention_prefill_wg(head_dim, dt, kv8)
            .map(|k| (k, true));
    }
    be.kernels()
        .attention_prefill(head_dim, dt, kv8)
        .map(|k| (k, false))
}

/// `attention_prefill_*`: grid (num_heads, ceil(rows / 128) + num_seqs), 128 threads,
/// `fa_smem_bytes` of dynamic shared memory; each CTA finds its (sequence, 128-row tile)
/// in `cu_seqlens_q` on the device. Tiles are on y so that the longest-context tiles of
/// every head are dispatched first. `attention_prefill_wg_*` (`wg`): the same grid and
/// arguments, 384 threads, `wg_smem_bytes`.
fn attention_prefill(
    be: &CudaBackend,
    a: &Attention<'_>,
    d: &AttentionDims,
    kernel: &Kernel,
    wg: bool,
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
    let kv8 = a.k_cache.dtype() == DType::F8E4M3;
    let threads = if wg { WG_THREADS } else { FA_THREADS };
    let mut c = cfg(
        (grid_x(OP, "num_heads", d.num_heads)?, tiles as u32, 1),
        (threads, 1, 1),
    );
    c.shared_mem_bytes = if wg {
        wg_smem_bytes(d.head_dim, kv8)
    } else {
        fa_smem_bytes(d.head_dim, kv8)
    } as u32;
    let (q, kc, vc) = (dptr(a.q), dptr(a.k_cache), dptr(a.v_cache));
    let (bt, sl, cu) = (dptr(a.block_tables), dptr(a.seq_lens), dptr(cu));
    let out = dptr(a.out);
    let (qscale, vscale) = scales(a);
    let cap = softcap_arg(a);
    // gpt-oss's per-head sinks (0: none).
    let sinks = a.sinks.map_or(0, dptr);
    let window = window_arg(a.window);
    let num_seqs = int(OP, "num_seqs", d.num_seqs)?;
    let [rows, nh, nkv, nb, bs, tw, group] = launch_ints(OP, d)?;
    be.launch(
        kernel,
        c,
        &mut args![
            q, kc, vc, bt, sl, cu, out, qscale, vscale, cap, window, num_seqs, rows, nh, nkv, nb,
            bs, tw, group, sinks
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(rows: usize, num_seqs: usize, num_heads: usize) -> AttentionDims {
        AttentionDims {
            rows,
            num_heads,
            num_kv_heads: num_heads / 4,
            head_dim: 128,
            num_blocks: 1024,
            block_size: 16,
            num_seqs,
            table_width: 128,
        }
    }

    /// Both prefill kernels' shared memory fits an sm_90 CTA (227 KiB), and the launch
    /// limit the backend sets is what the launch asks for.
    #[test]
    fn prefill_kernels_fit_shared_memory() {
        for hd in [64, 128] {
            for (kv, kv8) in [("", false), ("_kv8", true)] {
                let wg = format!("attention_prefill_wg_hd{hd}_bf16{kv}");
                let mma = format!("attention_prefill_hd{hd}_f16{kv}");
                assert_eq!(dynamic_smem_limit(&wg), Some(wg_smem_bytes(hd, kv8)));
                assert_eq!(dynamic_smem_limit(&mma), Some(fa_smem_bytes(hd, kv8)));
                assert!(wg_smem_bytes(hd, kv8) <= 227 * 1024, "{wg}");
                assert!(fa_smem_bytes(hd, kv8) <= 227 * 1024, "{mma}");
            }
        }
    }

    /// The split-K kernel takes decode-like steps (2 queries a sequence) and verify steps
    /// of few sequences; the tile kernel takes prompts and verify steps that fill the SMs
    /// (the H100's 132 SMs, 32 heads).
    #[test]
    fn few_queries_picks_the_split_kernel_for_verify_shapes() {
        let sm = 132;
        // Verify steps, k = 1, 4, 8 at batch 1; k = 4 at batch 8 and 64.
        assert!(few_queries(&dims(2, 1, 32), sm));
        assert!(few_queries(&dims(5, 1, 32), sm));
        assert!(few_queries(&dims(9, 1, 32), sm));
        assert!(!few_queries(&dims(40, 8, 32), sm));
        assert!(!few_queries(&dims(320, 64, 32), sm));
        // k = 1 at batch 64: two queries a sequence.
        assert!(few_queries(&dims(128, 64, 32), sm));
        // A prompt of 2,048 tokens, and 17 queries for one sequence.
        assert!(!few_queries(&dims(2048, 1, 32), sm));
        assert!(!few_queries(&dims(17, 1, 32), sm));
        // No sequence: no division by zero.
        assert!(few_queries(&dims(0, 0, 32), sm));
    }
}
