//! What an offloaded model's weights need before the first step: the policy, the
//! budget's split into resident weights and a ring or pool of slots, where each weight
//! lives (device, a host view, streamed), and the bytes the device must hold.

use std::sync::Arc;

use super::experts::ExpertLayout;
use super::{plan, validate, AccessOrder, Plan, WeightBudget, SLOT_ALIGN};
use crate::backend::{Backend, HostMemory};
use crate::error::{gib, Error, Result};
use crate::model::config::ModelConfig;
use crate::model::decl::{Decl, Role};
use crate::tensor::{DType, Tensor};

/// How streamed weights are chosen and moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Policy {
    /// `experts` for a model with routed experts, `planned` otherwise.
    #[default]
    Auto,
    /// A fixed resident set and a ring of prefetch slots (see [`super::plan`]); works in
    /// graphs.
    Planned,
    /// On-demand LRU over a pool of the budget's bytes (the baseline; eager only).
    Lru,
    /// Every weight but the routed experts resident, the experts in a device cache of
    /// slots filled on the device (see [`super::experts`]); works in graphs.
    Experts,
}

impl Policy {
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim() {
            "auto" => Ok(Policy::Auto),
            "planned" => Ok(Policy::Planned),
            "lru" => Ok(Policy::Lru),
            "experts" => Ok(Policy::Experts),
            _ => Err(Error::invalid(
                "--offload-policy",
                format!("`{s}`: expected `auto`, `planned`, `lru` or `experts`"),
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Policy::Auto => "auto",
            Policy::Planned => "planned",
            Policy::Lru => "lru",
            Policy::Experts => "experts",
        }
    }

    /// The policy that runs for `cfg`: `Auto` resolved (the expert cache for a model with
    /// routed experts).
    pub fn resolve(self, cfg: &ModelConfig) -> Policy {
        match self {
            Policy::Auto if cfg.moe.is_some() => Policy::Experts,
            Policy::Auto => Policy::Planned,
            p => p,
        }
    }

    /// Whether the policy can run with graphs on (`graphs_on`): the LRU policy decides
    /// its copies at run time on the host, so a graph replay would repeat one step's
    /// choice; it is refused here, once, when the configuration is validated.
    pub fn check_graphs(self, graphs_on: bool) -> Result<()> {
        if self == Policy::Lru && graphs_on {
            return Err(Error::invalid(
                "--offload-policy lru",
                "the LRU policy decides its copies at run time and cannot run inside \
                 graphs; add --eager, or use --offload-policy planned",
            ));
        }
        Ok(())
    }
}

/// A weight budget and its policy (`--weight-budget`, `--offload-policy`,
/// `--expert-prefetch`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OffloadConfig {
    pub budget: WeightBudget,
    pub policy: Policy,
    /// The expert cache: each sparse layer's call fetches the next sparse layer's
    /// predicted experts ahead, on a second stream (Pre-gated MoE;
    /// [`crate::backend::ExpertPrefetch`]). Off by default: it pays only with an accurate
    /// predictor (BENCHMARKS.md); never when every expert has a slot.
    pub expert_prefetch: bool,
}

impl OffloadConfig {
    /// Refuse a policy that cannot run with graphs on ([`Policy::check_graphs`]).
    pub fn check_graphs(&self, graphs_on: bool) -> Result<()> {
        self.policy.check_graphs(graphs_on)
    }
}

/// Where one part (one HF tensor's rows) of a streamed weight's bytes lie on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostPart {
    /// Index into [`HostWeights::memory`].
    pub memory: usize,
    pub offset: usize,
    pub bytes: usize,
    /// Byte offset of these rows within the weight.
    pub dst_offset: usize,
}

/// Where a weight lives under a budget.
#[derive(Clone)]
pub enum Place {
    /// On the device for good.
    Device,
    /// Streamed: copied into this device view each step (its ring slot; under LRU a
    /// placeholder view of the pool, never read: the executor hands out placements).
    Slot(Tensor),
    /// Read in place from host memory (the embedding table of a model with untied
    /// embeddings: its op gathers a few rows per step, so it costs no budget).
    Host,
}

/// The host side of the streamed weights, filled by the loader.
#[derive(Default)]
pub struct HostWeights {
    pub memory: Vec<Arc<HostMemory>>,
    /// Per weight (the [`AccessOrder`] index): its parts; empty unless streamed.
    pub parts: Vec<Vec<HostPart>>,
    /// Per weight: the tensor over host memory of a [`Place::Host`] weight.
    pub views: Vec<Option<Tensor>>,
    /// Bytes read in place from registered mapped files (no copy on the host).
    pub registered_bytes: usize,
    /// Bytes in page-locked copies (converted, dequantized or generated weights).
    pub copied_bytes: usize,
}

/// What a budget gives, for reports (`bench offload`, start-up logs).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OffloadReport {
    pub policy: Option<Policy>,
    pub budget_bytes: usize,
    pub total_bytes: usize,
    pub floor_bytes: usize,
    pub resident_bytes: usize,
    /// The ring (planned) or the pool (LRU).
    pub streaming_bytes: usize,
    /// Planned: bytes copied per step. LRU: its steady-state estimate
    /// ([`super::lru_streamed_per_step`]); the executor counts the real figure. Experts:
    /// 0 (it depends on the routing; the cache counts it).
    pub streamed_bytes_per_step: usize,
    /// The expert cache's slots (0 under the other policies).
    pub expert_slots: usize,
    pub registered_bytes: usize,
    pub copied_bytes: usize,
}

/// The device memory a budget takes, decided before the weights load.
pub struct Prepared {
    pub order: AccessOrder,
    pub policy: Policy,
    /// Per weight (the [`AccessOrder`] index, which is the loader's order).
    pub place: Vec<Place>,
    pub report: OffloadReport,
    /// The run dtype of the weights.
    pub dtype: DType,
    pub(super) plan: Option<Plan>,
    /// The expert cache's layout (the experts policy).
    pub(super) experts: Option<ExpertLayout>,
    /// Whether the expert cache prefetches ([`OffloadConfig::expert_prefetch`]).
    pub(super) expert_prefetch: bool,
    /// The ring or the pool (none under the experts policy, whose pool is allocated with
    /// its tables by the executor).
    pub(super) memory: Option<Tensor>,
}

/// The shape and device dtype (the run dtype `dtype`, or a quantized format) of every
/// weight in [`AccessOrder::llama`] order: the declared device tensors.
pub(super) fn shapes(cfg: &ModelConfig, dtype: DType) -> Vec<(Vec<usize>, DType)> {
    cfg.decl()
        .tensors()
        .iter()
        .map(|t| (t.shape.clone(), t.dtype(dtype)))
        .collect()
}

/// The access order the executor plans with: [`AccessOrder::llama`] with sizes aligned to
/// [`SLOT_ALIGN`], and, when the embeddings are untied, the embedding table at zero device
/// bytes ([`Place::Host`]: its op reads the rows it needs from host memory). A tied table
/// stays a device weight: the LM head reads all of it.
pub fn executor_order(cfg: &ModelConfig, dtype: DType) -> Result<AccessOrder> {
    let decl = cfg.decl();
    let mut order = AccessOrder::from_decl(&decl, dtype)?.aligned(SLOT_ALIGN);
    for w in host_served(&decl) {
        order = order.served_from_host(w);
    }
    Ok(order)
}

/// The weights of [`executor_order`] read in place from host memory: an embedding table
/// only the embedding op reads (untied), which gathers a few rows per step.
fn host_served(decl: &Decl) -> Vec<usize> {
    let readers = |w: usize| decl.ops().iter().filter(|o| o.reads.contains(&w)).count();
    (0..decl.tensors().len())
        .filter(|&w| decl.tensors()[w].role == Role::Embedding && readers(w) == 1)
        .collect()
}

/// Device bytes a budget takes for `cfg` in `dtype` (resident weights + ring, or the LRU
/// pool), and the report, without allocating: for the memory check before loading.
/// `None` when the budget holds every weight (nothing is offloaded).
///
/// `max_tokens` is the most token rows of one step (the expert cache's floor depends on
/// it).
pub fn device_bytes(
    cfg: &ModelConfig,
    dtype: DType,
    config: &OffloadConfig,
    max_tokens: usize,
) -> Result<Option<OffloadReport>> {
    let policy = config.policy.resolve(cfg);
    if config.expert_prefetch && policy != Policy::Experts {
        return Err(Error::invalid(
            "--expert-prefetch",
            format!(
                "prefetches a mixture of experts' routed experts into the expert cache; \
                 {} runs the {} offload policy",
                cfg.arch.model_type(),
                policy.name()
            ),
        ));
    }
    let total = cfg.weight_bytes(dtype);
    let budget = config.budget.bytes(total);
    if budget >= total {
        return Ok(None);
    }
    let order = executor_order(cfg, dtype)?;
    if policy == Policy::Experts {
        let l = expert_layout(cfg, &order, budget, max_tokens)?;
        return Ok(Some(OffloadReport {
            policy: Some(policy),
            budget_bytes: budget,
            total_bytes: total,
            floor_bytes: l.floor_bytes,
            resident_bytes: l.resident_bytes,
            streaming_bytes: l.pool_bytes(l.slots),
            expert_slots: l.slots,
            ..Default::default()
        }));
    }
    let floor = super::check_budget(&order, budget)?;
    let mut r = OffloadReport {
        policy: Some(policy),
        budget_bytes: budget,
        total_bytes: total,
        floor_bytes: floor.bytes,
        ..Default::default()
    };
    match policy {
        Policy::Planned => {
            let p = plan(&order, budget)?;
            r.resident_bytes = p.resident_bytes;
            r.streaming_bytes = p.ring_bytes;
            r.streamed_bytes_per_step = p.streamed_bytes_per_step();
        }
        Policy::Lru => {
            r.streaming_bytes = budget;
            r.streamed_bytes_per_step = super::lru_streamed_per_step(&order, budget, 3)?;
        }
        Policy::Auto | Policy::Experts => unreachable!("resolved above"),
    }
    Ok(Some(r))
}

/// The expert cache's layout of `budget` over `order`'s weights.
fn expert_layout(
    cfg: &ModelConfig,
    order: &AccessOrder,
    budget: usize,
    max_tokens: usize,
) -> Result<ExpertLayout> {
    let bytes: Vec<usize> = order.weights().iter().map(|w| w.bytes).collect();
    super::experts::layout(cfg, &bytes, budget, max_tokens)
}

impl Prepared {
    /// Check the budget and allocate the ring (or pool) for `cfg`'s weights in `dtype`.
    /// `None` when the budget holds every weight.
    pub fn new(
        be: &dyn Backend,
        cfg: &ModelConfig,
        dtype: DType,
        config: &OffloadConfig,
        max_tokens: usize,
    ) -> Result<Option<Prepared>> {
        let Some(mut report) = device_bytes(cfg, dtype, config, max_tokens)? else {
            return Ok(None);
        };
        let order = executor_order(cfg, dtype)?;
        let policy = config.policy.resolve(cfg);
        if policy == Policy::Experts {
            // Routed experts in host memory (the device reads them to fill its slots), an
            // untied embedding table read in place, every other weight resident.
            let l = expert_layout(cfg, &order, report.budget_bytes, max_tokens)?;
            let decl = cfg.decl();
            let host = host_served(&decl);
            let place = decl
                .tensors()
                .iter()
                .enumerate()
                .map(|(w, t)| match t.role {
                    Role::ExpertsGateUp | Role::ExpertsDown => Place::Host,
                    _ if host.contains(&w) => Place::Host,
                    _ => Place::Device,
                })
                .collect();
            report.streaming_bytes = l.pool_bytes(l.slots);
            return Ok(Some(Prepared {
                order,
                policy,
                place,
                report,
                dtype,
                plan: None,
                experts: Some(l),
                expert_prefetch: config.expert_prefetch,
                memory: None,
            }));
        }
        let shapes = shapes(cfg, dtype);
        if shapes.len() != order.weights().len() {
            return Err(Error::invalid(
                "weight offload",
                format!(
                    "{} weight shapes for {} weights in the access order",
                    shapes.len(),
                    order.weights().len()
                ),
            ));
        }
        let budget = report.budget_bytes;
        let (plan, bytes) = match policy {
            Policy::Lru => (None, budget),
            _ => {
                let p = plan(&order, budget)?;
                validate(&order, &p)?;
                let ring = p.ring_bytes;
                (Some(p), ring)
            }
        };
        let memory = alloc_bytes(be, bytes, policy)?;
        let view = |offset: usize, w: usize| {
            Tensor::new(memory.storage().clone(), offset, &shapes[w].0, shapes[w].1)
        };
        let mut place = vec![Place::Device; shapes.len()];
        match &plan {
            Some(p) => {
                for s in &p.streams {
                    place[s.weight] = Place::Slot(view(s.offset, s.weight)?);
                }
            }
            None => {
                for (w, slot) in place.iter_mut().enumerate() {
                    *slot = Place::Slot(view(0, w)?);
                }
            }
        }
        for w in host_served(&cfg.decl()) {
            place[w] = Place::Host;
        }
        report.streaming_bytes = bytes;
        Ok(Some(Prepared {
            order,
            policy,
            place,
            report,
            dtype,
            plan,
            experts: None,
            expert_prefetch: false,
            memory: Some(memory),
        }))
    }
}

/// `bytes` of device memory as one tensor (a whole number of f32 words).
pub(super) fn alloc_bytes(be: &dyn Backend, bytes: usize, policy: Policy) -> Result<Tensor> {
    let words = bytes.div_ceil(4).max(1);
    be.alloc(DType::F32, &[words]).map_err(|e| match e {
        Error::OutOfMemory { device, bytes, .. } => Error::OutOfMemory {
            device,
            bytes,
            what: format!(
                "the weight offload {} ({:.3} GiB); the device pool was refused",
                match policy {
                    Policy::Lru => "LRU pool",
                    _ => "ring",
                },
                gib(bytes)
            ),
        },
        e => e,
    })
}
