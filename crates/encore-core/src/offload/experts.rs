//! The expert cache: a mixture of experts' routed experts streamed under a weight budget,
//! inside the graphs ([`super::Policy::Experts`]).
//!
//! Every weight but the routed experts' stacks stays on the device (attention, norms,
//! routers, shared experts, the LM head; an untied embedding table is read in place from
//! host memory as under the other policies). The experts' stacks live in page-locked host
//! memory, and the device holds a pool of *slots*, each one expert of one sparse layer (its
//! gate and up rows, and its down rows, at the largest layer's size). Which experts a step
//! needs is known only after its router runs, so the cache is run on the device by the
//! backend's MoE op ([`crate::backend::ExpertCache`]): a device table maps each (layer,
//! expert) to its slot, each miss takes the slot of least score, and a copy kernel reads
//! the missed experts over the bus from mapped host memory into their slots before the
//! experts run. No host synchronisation, nothing decided on the host, so the same calls
//! are captured into the decode graphs and the piecewise pieces.
//!
//! **Misses are copied, not read in place.** On the H100 (`encore bench kernels`, one
//! token of Qwen3-30B-A3B's experts) the quantized expert kernels reading Q4_K experts in
//! place over the bus reach half the copy kernel's rate (23 against 47 GB/s), and bf16
//! experts read in place are only 3% faster than copied; a copy also keeps the expert.
//!
//! **Replacement policy: frequency over a decaying window.** Each call of a layer updates
//! its experts' scores as `score = score * decay + pairs routed to the expert` and evicts
//! the least-scored unpinned slot. Real routers have skewed, slowly drifting popularity
//! (a few experts per layer take a large share of tokens; which ones changes with the
//! text): a recency order (LRU) evicts a hot expert after one step in which other
//! experts were picked, while a decayed count keeps it; the decay (default
//! [`DEFAULT_DECAY`], a window of about 20 steps; `ENCORE_EXPERT_DECAY` sets it) lets
//! popularity drift. Scores of different layers are comparable (each layer decays once a
//! step), so one pool serves all layers and a layer with concentrated routing keeps more
//! of its experts.
//!
//! **The floor is exact.** A call of `n` rows needs at most `min(E, n * top_k)` distinct
//! experts at once, all of one layer (a layer's slots are free for the next layer's
//! misses once its experts ran, in stream order). So the pool needs that many slots for
//! the largest step (`max_tokens`, padding rows included, which route too); a budget below
//! the resident weights plus those slots and the tables is refused with the minimum.

use crate::backend::{Backend, ExpertCache, ExpertSlots};
use crate::error::{gib, Error, Result};
use crate::model::config::ModelConfig;
use crate::model::decl::Role;

/// The scores' decay per step when `ENCORE_EXPERT_DECAY` is unset: a window of about 20
/// steps.
pub const DEFAULT_DECAY: f32 = 0.95;

/// Slots are multiples of this many bytes (every kernel's loads stay aligned).
const SLOT_ALIGN: usize = 256;

/// How a budget divides between resident weights and expert slots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertLayout {
    /// Device bytes of every weight but the routed experts (aligned as the executor
    /// allocates them).
    pub resident_bytes: usize,
    /// Bytes of all the routed experts (host memory).
    pub expert_bytes: usize,
    /// Bytes of a slot's gate/up part and of its down part.
    pub gate_up_slot: usize,
    pub down_slot: usize,
    pub experts: usize,
    pub layers: usize,
    /// Sparse layers times experts: the experts there are to cache.
    pub total_experts: usize,
    /// Slots the largest step can need at once.
    pub min_slots: usize,
    /// Slots the budget gives.
    pub slots: usize,
    /// The smallest budget that runs: resident + `min_slots` slots + tables.
    pub floor_bytes: usize,
}

impl ExpertLayout {
    /// Device bytes of `slots` slots and the tables.
    pub fn pool_bytes(&self, slots: usize) -> usize {
        slots * (self.gate_up_slot + self.down_slot) + table_bytes(self.layers, self.experts, slots)
    }

    /// Bytes of one slot (gate/up and down).
    pub fn slot_bytes(&self) -> usize {
        self.gate_up_slot + self.down_slot
    }
}

fn align(v: usize) -> usize {
    v.div_ceil(SLOT_ALIGN) * SLOT_ALIGN
}

/// The tables' device bytes: `slot_of` and `score` (`[layers, experts]`), `owner`
/// (`[slots]`), `fills` and `stats`.
fn table_bytes(layers: usize, experts: usize, slots: usize) -> usize {
    2 * align(layers * experts * 4) + align(slots * 4) + align((1 + 2 * experts) * 4) + align(32)
}

/// The layout of `budget` bytes for `cfg`'s weights in `dtype` (`order_bytes`: each
/// weight's device bytes in declaration order, 0 for one read in place from host memory),
/// for steps of at most `max_tokens` rows. Refuses a model without routed experts and a
/// budget below the floor, naming the minimum.
pub fn layout(
    cfg: &ModelConfig,
    order_bytes: &[usize],
    budget: usize,
    max_tokens: usize,
) -> Result<ExpertLayout> {
    let Some(moe) = &cfg.moe else {
        return Err(Error::invalid(
            "--offload-policy experts",
            "the model has no routed experts; use --offload-policy planned",
        ));
    };
    let decl = cfg.decl();
    let (e, top_k) = (moe.num_experts, moe.top_k);
    let (mut resident, mut expert_bytes, mut gu, mut dn, mut sparse) = (0, 0, 0, 0, 0);
    for (t, &bytes) in decl.tensors().iter().zip(order_bytes) {
        match t.role {
            Role::ExpertsGateUp => {
                expert_bytes += bytes;
                gu = gu.max(align(bytes.div_ceil(e)));
                sparse += 1;
            }
            Role::ExpertsDown => {
                expert_bytes += bytes;
                dn = dn.max(align(bytes.div_ceil(e)));
            }
            _ => resident += bytes,
        }
    }
    let total_experts = sparse * e;
    let min_slots = e.min(max_tokens.max(1) * top_k).min(total_experts);
    let mut l = ExpertLayout {
        resident_bytes: resident,
        expert_bytes,
        gate_up_slot: gu,
        down_slot: dn,
        experts: e,
        layers: cfg.num_layers,
        total_experts,
        min_slots,
        slots: 0,
        floor_bytes: 0,
    };
    l.floor_bytes = resident + l.pool_bytes(min_slots);
    if budget < l.floor_bytes {
        return Err(Error::invalid(
            "--weight-budget",
            format!(
                "a weight budget of {budget} bytes ({:.3} GiB) is below the minimum of {} bytes \
                 ({:.3} GiB) for the expert cache: {} bytes of weights besides the routed \
                 experts stay resident, and a step of {max_tokens} tokens can need {min_slots} \
                 expert slots of {} bytes at once; raise --weight-budget to at least {} bytes",
                gib(budget),
                l.floor_bytes,
                gib(l.floor_bytes),
                resident,
                l.slot_bytes(),
                l.floor_bytes
            ),
        ));
    }
    // The most slots the budget holds, at most one per expert.
    let mut slots = (budget - resident) / (l.slot_bytes() + 4);
    slots = slots.clamp(min_slots, total_experts);
    while slots > min_slots && resident + l.pool_bytes(slots) > budget {
        slots -= 1;
    }
    l.slots = slots;
    Ok(l)
}

/// The device side of the expert cache: the slots and the tables.
pub struct ExpertPool {
    pub layout: ExpertLayout,
    slots: ExpertSlots,
    decay: f32,
    /// Whether each sparse layer's call fetches the next sparse layer's predicted experts
    /// ahead (`--expert-prefetch`; never when every expert has a slot).
    prefetch: bool,
}

/// The expert cache's running totals ([`ExpertCache::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpertStats {
    /// Distinct experts the layers' calls needed, summed over calls.
    pub needed: u64,
    pub hits: u64,
    pub misses: u64,
    /// Bytes copied into slots (prefetches included).
    pub bytes: u64,
    /// Experts copied ahead of their layer's call ([`crate::backend::ExpertPrefetch`]).
    pub prefetched: u64,
}

impl ExpertStats {
    /// Hits over needed experts.
    pub fn hit_rate(&self) -> f64 {
        if self.needed == 0 {
            1.0
        } else {
            self.hits as f64 / self.needed as f64
        }
    }

    /// The totals since `earlier`.
    pub fn since(&self, earlier: &ExpertStats) -> ExpertStats {
        ExpertStats {
            needed: self.needed - earlier.needed,
            hits: self.hits - earlier.hits,
            misses: self.misses - earlier.misses,
            bytes: self.bytes - earlier.bytes,
            prefetched: self.prefetched - earlier.prefetched,
        }
    }
}

/// The decay from `ENCORE_EXPERT_DECAY` (a number in [0, 1]), else [`DEFAULT_DECAY`].
fn decay_from_env() -> Result<f32> {
    match std::env::var("ENCORE_EXPERT_DECAY") {
        Ok(v) => v
            .trim()
            .parse::<f32>()
            .ok()
            .filter(|d| (0.0..=1.0).contains(d))
            .ok_or_else(|| {
                Error::invalid(
                    "ENCORE_EXPERT_DECAY",
                    format!("`{v}`: expected a number in [0, 1]"),
                )
            }),
        Err(_) => Ok(DEFAULT_DECAY),
    }
}

impl ExpertPool {
    /// Allocate the slots and the tables of `layout` (every slot empty).
    pub fn new(be: &dyn Backend, layout: ExpertLayout, prefetch: bool) -> Result<Self> {
        let l = &layout;
        let slots = ExpertSlots::new(
            be,
            l.layers,
            l.experts,
            l.slots,
            l.gate_up_slot,
            l.down_slot,
        )
        .map_err(|err| match err {
            Error::OutOfMemory { device, bytes, .. } => Error::OutOfMemory {
                device,
                bytes,
                what: format!(
                    "the expert cache's {} slots ({:.3} GiB)",
                    l.slots,
                    gib(l.slots * l.slot_bytes())
                ),
            },
            e => e,
        })?;
        let prefetch = prefetch && l.slots < l.total_experts;
        Ok(ExpertPool {
            slots,
            decay: decay_from_env()?,
            prefetch,
            layout,
        })
    }

    /// The cache arguments of decoder layer `layer`'s MoE call.
    pub fn cache(&self, layer: usize) -> ExpertCache<'_> {
        self.slots.args(layer, self.decay)
    }

    /// Whether the calls prefetch the next sparse layer's experts.
    pub fn prefetches(&self) -> bool {
        self.prefetch
    }

    /// Where the `i`-th prefetch of a step plans its fills
    /// ([`crate::backend::ExpertPrefetch::fills`]).
    pub fn prefetch_fills(&self, i: usize) -> Result<crate::tensor::Tensor> {
        self.slots.prefetch_fills(i)
    }

    /// The running totals (synchronises with the device).
    pub fn stats(&self, be: &dyn Backend) -> Result<ExpertStats> {
        let [needed, hits, misses, bytes, prefetched] = self.slots.totals(be)?;
        Ok(ExpertStats {
            needed,
            hits,
            misses,
            bytes,
            prefetched,
        })
    }
}
