//! The mixture-of-experts ops' argument checks: the router and experts of a layer, the
//! expert cache and its prefetch, and the shared expert's gated sum.

use super::{check_dtype, check_rank, check_shape, same_dtype, RowDims, FLOAT_DTYPES};
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeDims {
    pub n: usize,
    pub hidden: usize,
    pub experts: usize,
    pub inter: usize,
    pub top_k: usize,
    /// With an expert cache ([`crate::args::ExpertCache`]).
    pub cache: Option<CacheDims>,
}

/// The expert cache of a [`crate::args::Moe`] call, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheDims {
    pub layer: usize,
    pub slots: usize,
    /// Bytes of one expert's gate rows (= its up rows) and of its down rows.
    pub half_bytes: usize,
    pub down_bytes: usize,
    /// Bytes of a slot in `gate_up_slots` and in `down_slots`.
    pub gate_up_slot: usize,
    pub down_slot: usize,
    /// A later layer's experts fetched ahead ([`crate::args::ExpertPrefetch`]).
    pub prefetch: Option<PrefetchDims>,
}

/// A validated [`crate::args::ExpertPrefetch`]: its layer and its experts' bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefetchDims {
    pub layer: usize,
    pub half_bytes: usize,
    pub down_bytes: usize,
}

impl PrefetchDims {
    /// Bytes copied to fill one slot.
    pub fn expert_bytes(&self) -> usize {
        2 * self.half_bytes + self.down_bytes
    }
}

impl CacheDims {
    /// Bytes copied to fill one slot.
    pub fn expert_bytes(&self) -> usize {
        2 * self.half_bytes + self.down_bytes
    }
}

/// The expert cache's checks: shapes, dtypes, slots large enough for this layer's experts
/// and numerous enough for this call's `n * top_k` pairs; a prefetch's tensors.
fn check_expert_cache(
    a: &crate::args::Moe<'_>,
    c: &crate::args::ExpertCache<'_>,
    experts: usize,
    half_bytes: usize,
    down_bytes: usize,
) -> Result<CacheDims> {
    let (n, pairs) = (a.x.dim(0), a.x.dim(0) * a.top_k);
    const OP: &str = "moe (expert cache)";
    check_dtype(OP, "slot_of", c.slot_of, &[DType::I32])?;
    check_rank(OP, "slot_of", c.slot_of, 2, "[layers, experts]")?;
    let layers = c.slot_of.dim(0);
    if c.slot_of.dim(1) != experts || c.layer >= layers {
        return Err(Error::Shape {
            op: OP,
            name: "slot_of",
            found: c.slot_of.shape().to_vec(),
            expected: format!("[layers > {}, {experts}]", c.layer),
        });
    }
    check_dtype(OP, "score", c.score, &[DType::F32])?;
    check_shape(
        OP,
        "score",
        c.score,
        &[layers, experts],
        "[layers, experts]",
    )?;
    check_dtype(OP, "owner", c.owner, &[DType::I32])?;
    check_rank(OP, "owner", c.owner, 1, "[slots]")?;
    let slots = c.owner.dim(0);
    check_dtype(OP, "fills", c.fills, &[DType::I32])?;
    check_shape(
        OP,
        "fills",
        c.fills,
        &[1 + 2 * experts],
        "[1 + 2 * experts]",
    )?;
    check_dtype(OP, "stats", c.stats, &[DType::I64])?;
    let stats = crate::backend::EXPERT_STATS;
    check_shape(OP, "stats", c.stats, &[stats], "[5]")?;
    let prefetch = match &c.prefetch {
        None => None,
        Some(p) => {
            if p.layer >= layers || p.layer == c.layer {
                return Err(Error::invalid(
                    OP,
                    format!(
                        "a prefetch of layer {} from layer {} of {layers}",
                        p.layer, c.layer
                    ),
                ));
            }
            check_dtype(OP, "prefetch.logits", p.logits, &[a.logits.dtype()])?;
            check_shape(
                OP,
                "prefetch.logits",
                p.logits,
                a.logits.shape(),
                "as logits",
            )?;
            check_dtype(OP, "prefetch.ids", p.ids, &[DType::I32])?;
            check_shape(OP, "prefetch.ids", p.ids, &[n, a.top_k], "[n, top_k]")?;
            check_dtype(OP, "prefetch.weights", p.weights, &[DType::F32])?;
            check_shape(
                OP,
                "prefetch.weights",
                p.weights,
                &[n, a.top_k],
                "[n, top_k]",
            )?;
            check_dtype(OP, "prefetch.fills", p.fills, &[DType::I32])?;
            check_shape(
                OP,
                "prefetch.fills",
                p.fills,
                &[1 + 2 * experts],
                "[1 + 2 * experts]",
            )?;
            for (name, w, like) in [
                ("prefetch.gate_up", p.gate_up, a.gate_up),
                ("prefetch.down", p.down, a.down),
            ] {
                // Formats may differ between layers; the experts' shapes may not.
                if w.rank() != 2 || w.dim(0) != like.dim(0) || w.dim(1) != like.dim(1) {
                    return Err(Error::Shape {
                        op: OP,
                        name,
                        found: w.shape().to_vec(),
                        expected: format!("{:?}, as this layer's", like.shape()),
                    });
                }
            }
            Some(PrefetchDims {
                layer: p.layer,
                half_bytes: p.gate_up.size_bytes() / (2 * experts),
                down_bytes: p.down.size_bytes() / experts,
            })
        }
    };
    let mut sizes = [0usize; 2];
    let (pf_half, pf_down) = prefetch.map_or((0, 0), |p| (p.half_bytes, p.down_bytes));
    for (i, (name, t, need)) in [
        (
            "gate_up_slots",
            c.gate_up_slots,
            2 * half_bytes.max(pf_half),
        ),
        ("down_slots", c.down_slots, down_bytes.max(pf_down)),
    ]
    .into_iter()
    .enumerate()
    {
        let slot = if t.rank() == 2 && t.dim(0) == slots {
            t.size_bytes() / slots.max(1)
        } else {
            0
        };
        if slot < need || !slot.is_multiple_of(16) {
            return Err(Error::Shape {
                op: OP,
                name,
                found: t.shape().to_vec(),
                expected: format!(
                    "[{slots} slots, a row of at least {need} bytes, a multiple of 16]"
                ),
            });
        }
        sizes[i] = slot;
    }
    if !(0.0..=1.0).contains(&c.decay) {
        return Err(Error::invalid(
            OP,
            format!("decay {} must be in [0, 1]", c.decay),
        ));
    }
    let worst = experts.min(pairs);
    if slots < worst {
        return Err(Error::invalid(
            OP,
            format!(
                "{slots} expert slots for {pairs} (token, expert) pairs of {experts} experts: \
                 a step may need {worst}"
            ),
        ));
    }
    Ok(CacheDims {
        layer: c.layer,
        slots,
        half_bytes,
        down_bytes,
        gate_up_slot: sizes[0],
        down_slot: sizes[1],
        prefetch,
    })
}

pub fn check_moe(a: &crate::args::Moe<'_>) -> Result<MoeDims> {
    const OP: &str = "moe";
    check_dtype(OP, "x", a.x, FLOAT_DTYPES)?;
    check_rank(OP, "x", a.x, 2, "[n, hidden]")?;
    let (n, hidden) = (a.x.dim(0), a.x.dim(1));
    check_dtype(OP, "logits", a.logits, &[a.x.dtype(), DType::F32])?;
    check_rank(OP, "logits", a.logits, 2, "[n, num_experts]")?;
    let experts = a.logits.dim(1);
    if a.logits.dim(0) != n || experts == 0 {
        return Err(Error::Shape {
            op: OP,
            name: "logits",
            found: a.logits.shape().to_vec(),
            expected: format!("[{n}, num_experts >= 1]"),
        });
    }
    if a.top_k == 0 || a.top_k > experts {
        return Err(Error::invalid(
            OP,
            format!("top_k {} must be 1..={experts} (the experts)", a.top_k),
        ));
    }
    for (name, w) in [("gate_up", a.gate_up), ("down", a.down)] {
        if !w.dtype().is_quantized() {
            same_dtype(OP, name, w, a.x.dtype())?;
        }
        check_rank(OP, name, w, 2, "[rows, k]")?;
    }
    let rows = a.gate_up.dim(0);
    if a.gate_up.dim(1) != hidden || rows == 0 || !rows.is_multiple_of(2 * experts) {
        return Err(Error::Shape {
            op: OP,
            name: "gate_up",
            found: a.gate_up.shape().to_vec(),
            expected: format!("[2 * {experts} * inter, {hidden}]"),
        });
    }
    let inter = rows / (2 * experts);
    check_shape(
        OP,
        "down",
        a.down,
        &[experts * hidden, inter],
        "[experts * hidden, inter]",
    )?;
    check_dtype(OP, "ids", a.ids, &[DType::I32])?;
    check_shape(OP, "ids", a.ids, &[n, a.top_k], "[n, top_k]")?;
    check_dtype(OP, "weights", a.weights, &[DType::F32])?;
    check_shape(OP, "weights", a.weights, &[n, a.top_k], "[n, top_k]")?;
    same_dtype(OP, "out", a.out, a.x.dtype())?;
    check_shape(OP, "out", a.out, &[n, hidden], "[n, hidden]")?;
    same_dtype(OP, "scratch", a.scratch, a.x.dtype())?;
    check_shape(
        OP,
        "scratch",
        a.scratch,
        &[n * a.top_k, inter],
        "[n * top_k, inter]",
    )?;
    if let Some(b) = &a.bias {
        same_dtype(OP, "gate_up_bias", b.gate_up, a.x.dtype())?;
        let gu = [2 * experts * inter];
        check_shape(OP, "gate_up_bias", b.gate_up, &gu, "[2 * experts * inter]")?;
        same_dtype(OP, "down_bias", b.down, a.x.dtype())?;
        let dn = [experts * hidden];
        // (Under an expert cache the biases stay whole and resident: every kernel indexes
        // them by expert, its weights by the expert's slot.)
        check_shape(OP, "down_bias", b.down, &dn, "[experts * hidden]")?;
    }
    let cache = match &a.cache {
        Some(c) => Some(check_expert_cache(
            a,
            c,
            experts,
            a.gate_up.size_bytes() / (2 * experts),
            a.down.size_bytes() / experts,
        )?),
        None => None,
    };
    Ok(MoeDims {
        n,
        hidden,
        experts,
        inter,
        top_k: a.top_k,
        cache,
    })
}

pub fn check_sigmoid_gate_add(x: &Tensor, gate: &Tensor, y: &Tensor) -> Result<RowDims> {
    const OP: &str = "sigmoid_gate_add";
    check_dtype(OP, "x", x, FLOAT_DTYPES)?;
    check_rank(OP, "x", x, 2, "[n, d]")?;
    let (rows, dim) = (x.dim(0), x.dim(1));
    same_dtype(OP, "gate", gate, x.dtype())?;
    check_shape(OP, "gate", gate, &[rows, 1], "[n, 1]")?;
    same_dtype(OP, "y", y, x.dtype())?;
    check_shape(OP, "y", y, &[rows, dim], "[n, d]")?;
    Ok(RowDims { rows, dim })
}
