//! The mixture-of-experts launchers: the router and the experts (`moe.cu`), the expert
//! cache's plan and fill, and the grouped GEMM of many-token steps.

use super::{aligned16, cfg, grid_x, int, quant};
use crate::backend::cuda::{dptr, CudaBackend};
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

/// Warps of a `moe.cu` CTA (`MOE_WARPS`), and the experts and chosen experts its router
/// kernel holds (32 lanes x `MOE_PER_LANE`; one lane per chosen expert).
const MOE_WARPS: usize = 8;
const MOE_MAX_EXPERTS: usize = 32 * 16;
const MOE_MAX_TOP_K: usize = 32;
/// Output tiles of 8 a `qmoe_mma_gate_up` CTA computes (`QMM_GU_TILES`).
const QMM_GU_TILES: usize = 4;
/// The most x bytes a `qmoe_mma_*` CTA stages in shared memory (the default dynamic limit):
/// gate/up a token's hidden values, down its top_k rows of the expert width.
const QMM_SMEM_MAX: usize = 48 * 1024;

/// A mixture-of-experts layer (`moe.cu`): the router's top k into `ids` / `weights`, the
/// chosen experts' gate/up + SiLU into the scratch, their down projections summed by
/// weight into `out`. Three launches that read the routing from device memory.
pub(in crate::backend::cuda) fn moe(
    be: &CudaBackend,
    a: &crate::args::Moe<'_>,
    d: &crate::ops::MoeDims,
) -> Result<()> {
    const OP: &str = "moe";
    if d.experts > MOE_MAX_EXPERTS || d.top_k > MOE_MAX_TOP_K {
        return Err(Error::invalid(
            OP,
            format!(
                "{} experts, top {}: the CUDA kernels take at most {MOE_MAX_EXPERTS} experts and \
                 top {MOE_MAX_TOP_K}",
                d.experts, d.top_k
            ),
        ));
    }
    for (name, w) in [("gate_up", a.gate_up), ("down", a.down)] {
        if w.dtype().is_quantized() && !aligned16(w) {
            return Err(Error::invalid(
                OP,
                format!("a quantized {name} must start 16-byte aligned"),
            ));
        }
    }
    if d.n == 0 {
        return Ok(());
    }
    let dt = a.x.dtype();
    let k = be.kernels();
    let threads = ((MOE_WARPS * 32) as u32, 1, 1);
    let (n, hidden, inter) = (
        int(OP, "n", d.n)?,
        int(OP, "hidden", d.hidden)?,
        int(OP, "inter", d.inter)?,
    );
    let (experts, top_k) = (d.experts as i32, d.top_k as i32);
    let (ids, wts) = (dptr(a.ids), dptr(a.weights));
    let renorm = a.renormalize as i32;
    let logits = dptr(a.logits);
    // The router's logits are in x's dtype (the launcher of f32 logits is the f32 one).
    let route = k.moe_route.get(a.logits.dtype())?;
    be.launch(
        route,
        cfg(
            (grid_x(OP, "rows", d.n.div_ceil(MOE_WARPS))?, 1, 1),
            threads,
        ),
        &mut args![logits, n, experts, top_k, renorm, ids, wts],
    )?;
    let pairs = d.n * d.top_k;
    // Where the experts are read: the stacks, or the expert cache's slots once filled.
    let (ex, gu_t, dn_t) = match (&a.cache, &d.cache) {
        (Some(c), Some(cd)) => (
            expert_cache(be, a, c, cd, d)?,
            c.gate_up_slots,
            c.down_slots,
        ),
        _ => {
            let half = (a.gate_up.size_bytes() / (2 * d.experts)) as i64;
            let ex = MoeExpertsArg {
                gu: dptr(a.gate_up),
                dn: dptr(a.down),
                slot_of: 0,
                gu_stride: half,
                up_off: half * d.experts as i64,
                dn_stride: (a.down.size_bytes() / d.experts) as i64,
            };
            (ex, a.gate_up, a.down)
        }
    };
    let grouped = match be.moe_gemm_min_tokens() {
        Some(min) => d.n >= min,
        None => pairs >= MOE_GEMM_MIN_PAIRS_PER_EXPERT * d.experts,
    };
    // Every expert kernel takes the activation (SiLU, gpt-oss's clamped SwiGLU) and the
    // experts' biases (0: none).
    let act_kind = a.act.code();
    let (gu_bias, dn_bias) = a.bias.map_or((0, 0), |b| (dptr(b.gate_up), dptr(b.down)));
    if grouped && grouped_fits(a, d, gu_t, dn_t) {
        return moe_grouped(be, a, d, ex);
    }
    let (x, act) = (dptr(a.x), dptr(a.scratch));
    // 16-byte loads when every row starts 16-byte aligned.
    let rows16 = |len: usize, ts: &[&Tensor]| {
        (len * dt.size()).is_multiple_of(16) && ts.iter().all(|t| aligned16(t))
    };
    let vec_in = rows16(d.hidden, &[a.x, gu_t]) as i32;
    let vec_down = rows16(d.inter, &[a.scratch, dn_t]) as i32;
    let grid_y = |what, v: usize| {
        u32::try_from(v)
            .ok()
            .filter(|&v| v <= 65_535)
            .ok_or_else(|| Error::invalid(OP, format!("{v} {what} (at most 65535)")))
    };
    // A quantized expert tensor's x (x, then the scratch) is read in 16-byte pieces.
    let x_aligned = |w: &Tensor, x: &Tensor| {
        if aligned16(x) {
            Ok(())
        } else {
            Err(Error::invalid(
                OP,
                format!(
                    "{} experts need a 16-byte aligned input",
                    w.dtype().kernel_suffix()
                ),
            ))
        }
    };
    // The tensor-core pair kernels (quant_moe_mma.cuh): x in bf16, rows of whole 32-value
    // groups, the x rows a CTA stages within the default dynamic shared memory; by default
    // for MXFP4 (measured faster, below), `ENCORE_MOE_PAIRS` forcing either way.
    let (gu_smem, dn_smem) = (2 * d.hidden, 2 * d.top_k * d.inter);
    let fits = dt == DType::BF16
        && d.hidden.is_multiple_of(32)
        && d.inter.is_multiple_of(32)
        && gu_smem.max(dn_smem) <= QMM_SMEM_MAX;
    let mma = |w: &Tensor| match w.dtype() {
        DType::Q(fmt) if fits => be
            .moe_pairs_mma()
            .unwrap_or(fmt == crate::quant::QuantFormat::Mxfp4),
        _ => false,
    };
    let smem = |mut c: cudarc::driver::LaunchConfig, bytes: usize| {
        c.shared_mem_bytes = bytes as u32;
        c
    };
    if let DType::Q(_) = a.gate_up.dtype() {
        x_aligned(a.gate_up, a.x)?;
        x_aligned(a.gate_up, a.scratch)?;
    }
    if let DType::Q(_) = a.down.dtype() {
        x_aligned(a.down, a.scratch)?;
    }
    if let (DType::Q(fmt), true) = (a.gate_up.dtype(), mma(a.gate_up)) {
        be.launch(
            &k.qmoe_mma[quant::format_slot(fmt)][0],
            smem(
                cfg(
                    (
                        grid_x(OP, "inter", d.inter.div_ceil(8 * QMM_GU_TILES))?,
                        grid_y("(token, expert) pairs", pairs)?,
                        1,
                    ),
                    threads,
                ),
                gu_smem,
            ),
            &mut args![x, ex, ids, act, hidden, inter, experts, top_k, act_kind, gu_bias],
        )?;
    } else if let DType::Q(fmt) = a.gate_up.dtype() {
        let (g, per_cta) = quant::moe_groups(fmt, d.hidden);
        be.launch(
            k.qmoe_gate_up[quant::format_slot(fmt)].get(dt)?,
            cfg(
                (
                    grid_x(OP, "inter", d.inter.div_ceil(per_cta))?,
                    grid_y("(token, expert) pairs", pairs)?,
                    1,
                ),
                threads,
            ),
            &mut args![x, ex, ids, act, hidden, inter, experts, top_k, g, act_kind, gu_bias],
        )?;
    } else {
        be.launch(
            k.moe_gate_up.get(dt)?,
            cfg(
                (
                    grid_x(OP, "inter", d.inter.div_ceil(MOE_WARPS))?,
                    grid_y("(token, expert) pairs", pairs)?,
                    1,
                ),
                threads,
            ),
            &mut args![x, ex, ids, act, hidden, inter, experts, top_k, vec_in, act_kind, gu_bias],
        )?;
    }
    let out = dptr(a.out);
    if let (DType::Q(fmt), true) = (a.down.dtype(), mma(a.down)) {
        be.launch(
            &k.qmoe_mma[quant::format_slot(fmt)][1],
            smem(
                cfg(
                    (
                        grid_x(OP, "hidden", d.hidden.div_ceil(16))?,
                        grid_y("tokens", d.n)?,
                        1,
                    ),
                    threads,
                ),
                dn_smem,
            ),
            &mut args![act, ex, ids, wts, out, hidden, inter, experts, top_k, dn_bias],
        )
    } else if let DType::Q(fmt) = a.down.dtype() {
        // Two outputs per lane group, the lane groups of one warp per CTA.
        let (g, _) = quant::moe_groups(fmt, d.inter);
        be.launch(
            k.qmoe_down[quant::format_slot(fmt)].get(dt)?,
            cfg(
                (
                    grid_x(OP, "hidden", d.hidden.div_ceil(2 * 32 / g as usize))?,
                    grid_y("tokens", d.n)?,
                    1,
                ),
                threads,
            ),
            &mut args![act, ex, ids, wts, out, hidden, inter, experts, top_k, g, dn_bias],
        )
    } else {
        be.launch(
            k.moe_down.get(dt)?,
            cfg(
                (
                    grid_x(OP, "hidden", d.hidden.div_ceil(MOE_WARPS))?,
                    grid_y("tokens", d.n)?,
                    1,
                ),
                threads,
            ),
            &mut args![act, ex, ids, wts, out, hidden, inter, experts, top_k, vec_down, dn_bias],
        )
    }
}

/// (Token, expert) pairs per expert, on average, from which a mixture-of-experts layer runs
/// the grouped GEMM by default (unless `ENCORE_MOE_GEMM_MIN_TOKENS` sets a token count);
/// fewer run one pair at a time. Measured on the H100 under uniform routing
/// (`--router-skew 0`, BENCHMARKS.md), pair kernels against the grouped GEMM, decode step
/// ms: Qwen3-30B-A3B shapes in Q4_K (128 experts, top 8) 7.7 / 11.9 at 8 tokens (0.5 pairs
/// an expert), 11.8 / 16.0 at 16 (1), 20.3 / 21.0 at 32 (2), grouped 24.0 at 64;
/// Mixtral-8x7B shapes (8 experts, top 2) 31.8 / 26.7 at 8 tokens (2 an expert).
pub(in crate::backend::cuda) const MOE_GEMM_MIN_PAIRS_PER_EXPERT: usize = 2;

/// Whether the grouped GEMM runs this layer: x in bf16 / f16, expert rows of whole 32-value
/// groups (the tile loader's unit), the experts' tensors 16-byte aligned.
fn grouped_fits(
    a: &crate::args::Moe<'_>,
    d: &crate::ops::MoeDims,
    gate_up: &Tensor,
    down: &Tensor,
) -> bool {
    matches!(a.x.dtype(), DType::BF16 | DType::F16)
        && d.hidden.is_multiple_of(32)
        && d.inter.is_multiple_of(32)
        && [a.x, gate_up, down, a.scratch].iter().all(|t| aligned16(t))
}

/// The kernels' `MoeExperts` (quant_gemv.cuh): where expert `e`'s rows lie, in bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct MoeExpertsArg {
    gu: u64,
    dn: u64,
    /// Device address of this layer's `slot_of` row; 0: the stacks (slot = expert).
    slot_of: u64,
    gu_stride: i64,
    up_off: i64,
    dn_stride: i64,
}

/// CTAs per SM of `moe_cache_fill`'s grid (256 threads, 4 reads of 16 bytes in flight
/// each): megabytes in flight, far more than the bus's bandwidth-delay product.
const MOE_FILL_CTAS_PER_SM: u32 = 2;

/// CTAs per SM of a prefetch's `moe_cache_fill` (on the side stream, beside the compute
/// stream's kernels, so it leaves them most of each SM).
pub(in crate::backend::cuda) const MOE_PREFETCH_CTAS_PER_SM: u32 = 1;

/// The expert cache's step (after `moe_route`): `moe_cache_plan` decides the fills,
/// `moe_cache_fill` copies them from host memory into their slots; the experts are then
/// read from the slots.
fn expert_cache(
    be: &CudaBackend,
    a: &crate::args::Moe<'_>,
    c: &crate::args::ExpertCache<'_>,
    cd: &crate::ops::CacheDims,
    d: &crate::ops::MoeDims,
) -> Result<MoeExpertsArg> {
    const OP: &str = "moe (expert cache)";
    if !cd.half_bytes.is_multiple_of(16) || !cd.down_bytes.is_multiple_of(16) {
        return Err(Error::invalid(
            OP,
            format!(
                "an expert's gate rows ({} bytes) and down rows ({} bytes) must be multiples \
                 of 16 bytes to be copied into a slot",
                cd.half_bytes, cd.down_bytes
            ),
        ));
    }
    for (name, t) in [
        ("gate_up", a.gate_up),
        ("down", a.down),
        ("gate_up_slots", c.gate_up_slots),
        ("down_slots", c.down_slots),
    ] {
        if !aligned16(t) {
            return Err(Error::invalid(
                OP,
                format!("{name} must start 16-byte aligned"),
            ));
        }
    }
    if let Some(p) = &c.prefetch {
        for (name, t) in [("prefetch.gate_up", p.gate_up), ("prefetch.down", p.down)] {
            if !aligned16(t) {
                return Err(Error::invalid(
                    OP,
                    format!("{name} must start 16-byte aligned"),
                ));
            }
        }
    }
    let k = be.kernels();
    let (ids, pairs) = (dptr(a.ids), int(OP, "pairs", d.n * d.top_k)?);
    let (experts, layer, slots) = (
        d.experts as i32,
        int(OP, "layer", cd.layer)?,
        int(OP, "slots", cd.slots)?,
    );
    let (slot_of, owner, score, fills, stats) = (
        dptr(c.slot_of),
        dptr(c.owner),
        dptr(c.score),
        dptr(c.fills),
        dptr(c.stats),
    );
    let decay = c.decay;
    // The plan (prefetch: the predicted experts of `plan_layer`, the slots of this call's
    // experts pinned).
    let plan = |stream: &cudarc::driver::CudaStream,
                pdl: bool,
                ids: u64,
                plan_layer: i32,
                fills: u64,
                expert_bytes: i64,
                prefetch: bool|
     -> Result<()> {
        let (pin_ids, pin_pairs, pin_layer) = if prefetch {
            (dptr(a.ids), pairs, layer)
        } else {
            (0u64, 0i32, -1i32)
        };
        let prefetch = prefetch as i32;
        be.launch_on(
            stream,
            pdl,
            None,
            &k.moe_cache_plan,
            cfg((1, 1, 1), (1024, 1, 1)),
            &mut args![
                ids,
                pairs,
                experts,
                plan_layer,
                slots,
                slot_of,
                owner,
                score,
                fills,
                stats,
                decay,
                expert_bytes,
                pin_ids,
                pin_pairs,
                pin_layer,
                prefetch
            ],
        )
    };
    // The fills' copies, from the host stacks `gate_up` / `down` of experts `half` and
    // `down` bytes, over `ctas` CTAs.
    let (gu_slots, dn_slots) = (dptr(c.gate_up_slots), dptr(c.down_slots));
    let (gu_slot, dn_slot) = (cd.gate_up_slot as i64, cd.down_slot as i64);
    let fill = |stream: &cudarc::driver::CudaStream,
                pdl: bool,
                priority: Option<i32>,
                fills: u64,
                gate_up: &Tensor,
                down: &Tensor,
                (half, dn): (usize, usize),
                ctas: u32|
     -> Result<()> {
        let (gu_host, dn_host, half, down) = (dptr(gate_up), dptr(down), half as i64, dn as i64);
        let (kernel, grid, block) = match be.bulk_fill {
            Some(b) => (&k.moe_cache_fill_bulk, b, 32),
            None => (&k.moe_cache_fill, ctas, 256),
        };
        be.launch_on(
            stream,
            pdl,
            priority,
            kernel,
            cfg((grid, 1, 1), (block, 1, 1)),
            &mut args![
                fills, gu_host, dn_host, gu_slots, dn_slots, experts, half, down, gu_slot, dn_slot
            ],
        )
    };
    plan(
        &be.stream,
        be.pdl,
        ids,
        layer,
        fills,
        cd.expert_bytes() as i64,
        false,
    )?;
    // The prefetch: the prediction routed and planned on the compute stream (every table
    // is written in stream order there), its copies forked onto the side stream, where
    // they run one prefetch after another, beside this call's and the next layers' work.
    // Its slots are disjoint from this call's (pinned), so only the call of its layer
    // waits for it, before its own fill (that fill may take a slot a wrong prediction is
    // still copying into) and its experts.
    let copies = match (&c.prefetch, cd.prefetch) {
        (Some(p), Some(pd)) => {
            let (n, top_k) = (int(OP, "n", d.n)?, d.top_k as i32);
            let renorm = a.renormalize as i32;
            let (logits, pids, pwts, pfills) =
                (dptr(p.logits), dptr(p.ids), dptr(p.weights), dptr(p.fills));
            be.launch(
                k.moe_route.get(p.logits.dtype())?,
                cfg(
                    (grid_x(OP, "rows", d.n.div_ceil(MOE_WARPS))?, 1, 1),
                    ((MOE_WARPS * 32) as u32, 1, 1),
                ),
                &mut args![logits, n, experts, top_k, renorm, pids, pwts],
            )?;
            let pl = int(OP, "prefetch layer", pd.layer)?;
            plan(
                &be.stream,
                be.pdl,
                pids,
                pl,
                pfills,
                pd.expert_bytes() as i64,
                true,
            )?;
            Some((p, pd, pfills))
        }
        _ => None,
    };
    let ctas = be.info.sm_count as u32 * be.prefetch_ctas_per_sm;
    let side_fill = |side: &cudarc::driver::CudaStream, priority: i32| -> Result<()> {
        let (p, pd, pfills) = copies.as_ref().expect("a prefetch");
        fill(
            side,
            false,
            Some(priority),
            *pfills,
            p.gate_up,
            p.down,
            (pd.half_bytes, pd.down_bytes),
            ctas,
        )
    };
    be.expert_side(copies.is_some().then_some(&side_fill as _))?;
    fill(
        &be.stream,
        be.pdl,
        None,
        fills,
        a.gate_up,
        a.down,
        (cd.half_bytes, cd.down_bytes),
        be.info.sm_count as u32 * MOE_FILL_CTAS_PER_SM,
    )?;
    let half = cd.half_bytes as i64;
    Ok(MoeExpertsArg {
        gu: gu_slots,
        dn: dn_slots,
        slot_of: slot_of + (cd.layer * d.experts * 4) as u64,
        gu_stride: gu_slot,
        up_off: half,
        dn_stride: dn_slot,
    })
}

/// The grouped path's workspace for `pairs` (token, expert) pairs: `(sorted, tiles, y,
/// bytes in all)`, byte offsets of the pairs sorted by expert (i32, room for every
/// expert's run padded to 64 rows), the tiles' experts (i32, room for 32-row tiles) and
/// the pairs' down products (`[pairs, hidden]` of `dt`), each 256-byte aligned.
fn moe_workspace(
    pairs: usize,
    hidden: usize,
    experts: usize,
    dt: DType,
) -> (usize, usize, usize, usize) {
    let al = |v: usize| v.div_ceil(256) * 256;
    let sorted_len = pairs + experts * (GMOE_MAX_TILE - 1);
    let tiles = (pairs + experts * (GMOE_MIN_TILE - 1)).div_ceil(GMOE_MIN_TILE);
    let t_off = al(sorted_len * 4);
    let y_off = t_off + al(tiles * 4);
    (0, t_off, y_off, y_off + al(pairs * hidden * dt.size()))
}

/// Rows of the grouped GEMM's tiles (`GMOE_TILES`).
const GMOE_MIN_TILE: usize = 32;
const GMOE_MAX_TILE: usize = 64;

/// `Backend::moe_workspace_bytes` on CUDA.
pub(in crate::backend::cuda) fn moe_workspace_bytes(
    n: usize,
    hidden: usize,
    experts: usize,
    top_k: usize,
    dt: DType,
) -> usize {
    match dt {
        DType::BF16 | DType::F16 => moe_workspace(n * top_k, hidden, experts, dt).3,
        _ => 0,
    }
}

/// The grouped path (after `moe_route`): `moe_align` sorts the pairs by expert into tiles
/// of `bm` rows (64 where an expert averages more than 32 pairs, else 32), `gmoe_gate_up`
/// writes the activations into the scratch, `gmoe_down` each pair's down product into the
/// workspace, and `moe_combine` sums each token's slots in order.
fn moe_grouped(
    be: &CudaBackend,
    a: &crate::args::Moe<'_>,
    d: &crate::ops::MoeDims,
    ex: MoeExpertsArg,
) -> Result<()> {
    const OP: &str = "moe (grouped GEMM)";
    let dt = a.x.dtype();
    let pairs = d.n * d.top_k;
    let (s_off, t_off, y_off, need) = moe_workspace(pairs, d.hidden, d.experts, dt);
    if a.workspace.size_bytes() < need || !aligned16(a.workspace) {
        return Err(Error::invalid(
            OP,
            format!(
                "{} tokens need a 16-byte aligned workspace of {need} bytes \
                 (Backend::moe_workspace_bytes), got {}",
                d.n,
                a.workspace.size_bytes()
            ),
        ));
    }
    let bm = if pairs > 32 * d.experts {
        GMOE_MAX_TILE
    } else {
        GMOE_MIN_TILE
    };
    let sorted_len = pairs + d.experts * (bm - 1);
    let max_tiles = sorted_len.div_ceil(bm);
    let base = dptr(a.workspace);
    let (sorted, tiles, y) = (
        base + s_off as u64,
        base + t_off as u64,
        base + y_off as u64,
    );
    let k = be.kernels();
    let (experts, top_k) = (d.experts as i32, d.top_k as i32);
    let (np, nsorted, ntiles) = (
        int(OP, "pairs", pairs)?,
        int(OP, "sorted rows", sorted_len)?,
        int(OP, "tiles", max_tiles)?,
    );
    let bmi = bm as i32;
    let ids = dptr(a.ids);
    be.launch(
        &k.moe_align,
        cfg((1, 1, 1), (1024, 1, 1)),
        &mut args![ids, np, experts, bmi, sorted, nsorted, tiles, ntiles],
    )?;
    let tiles_y = u32::try_from(max_tiles)
        .ok()
        .filter(|&v| v <= 65_535)
        .ok_or_else(|| Error::invalid(OP, format!("{max_tiles} tiles (at most 65535)")))?;
    let fmt = |t: &Tensor| match t.dtype() {
        DType::Q(f) => Some(f),
        _ => None,
    };
    let (hidden, inter) = (int(OP, "hidden", d.hidden)?, int(OP, "inter", d.inter)?);
    let act_kind = a.act.code();
    let (gu_bias, dn_bias) = a.bias.map_or((0, 0), |b| (dptr(b.gate_up), dptr(b.down)));
    let smem = quant::qmma_smem_bytes(bm) as u32;
    let (x, act) = (dptr(a.x), dptr(a.scratch));
    let mut c = cfg(
        (grid_x(OP, "inter", d.inter.div_ceil(64))?, tiles_y, 1),
        (256, 1, 1),
    );
    c.shared_mem_bytes = smem;
    be.launch(
        k.gmoe(fmt(a.gate_up), dt, true, bm)?,
        c,
        &mut args![x, ex, sorted, tiles, act, hidden, inter, experts, top_k, act_kind, gu_bias],
    )?;
    let mut c = cfg(
        (grid_x(OP, "hidden", d.hidden.div_ceil(128))?, tiles_y, 1),
        (256, 1, 1),
    );
    c.shared_mem_bytes = smem;
    be.launch(
        k.gmoe(fmt(a.down), dt, false, bm)?,
        c,
        &mut args![act, ex, sorted, tiles, y, inter, hidden, experts, top_k, act_kind, dn_bias],
    )?;
    let total = d.n * d.hidden;
    let (wts, out) = (dptr(a.weights), dptr(a.out));
    let total_i = total as i64;
    be.launch(
        k.moe_combine.get(dt)?,
        cfg(
            (grid_x(OP, "elements", total.div_ceil(256))?, 1, 1),
            (256, 1, 1),
        ),
        &mut args![y, ids, wts, out, total_i, hidden, experts, top_k],
    )
}
