//! The offload executor: the device half of a weight budget.
//!
//! [`Prepared::new`] turns a `--weight-budget` into device memory before the weights
//! load: for the **planned** policy the resident set and the ring of [`super::plan`],
//! each streamed weight a fixed view of the ring at its slot; for **LRU** one pool of the
//! budget's bytes. The loader then puts resident weights on the device and the streamed
//! ones in host memory ([`crate::backend::HostMemory`]: page-locked on CUDA).
//!
//! The executor of a step calls the capture protocol's hooks: [`Offload::begin_step`]
//! before a step (it primes the slots when needed), [`Offload::end_segment`] where a
//! captured piece or an eager seam ends, and [`Offload::begin_capture`] /
//! [`Offload::end_capture`] around a graph capture (nothing is primed inside one). The
//! policy is one [`Policy`]; whether it can run in graphs is checked once, when the
//! configuration is validated ([`OffloadConfig::check_graphs`]).
//!
//! During a step the forward announces each op before it runs ([`Offload::enter`]):
//! - **planned**: the copies the plan starts at this op are queued on the copy queue
//!   after a fork (so they wait for every op queued before, the last readers of the bytes
//!   they overwrite included), each followed by its event; an op that first reads a
//!   weight copied in the same segment waits for that event. A *segment* is what runs
//!   between two joins ([`Offload::end_segment`], called where a captured piece or an eager
//!   seam ends): a capture must join its forked copy stream before it ends, and a copy
//!   from an earlier segment has landed by then. Copies the plan starts in the previous
//!   step (the first layers' weights, copied while the last ones run) are queued by the
//!   previous step; before the first step, or after a step that did not finish, they
//!   are queued by a *prime*. Everything is static, so the same calls are captured into
//!   the decode graphs and the piecewise pieces, and `--eager` runs the same plan.
//! - **LRU**: on-demand. A missing weight evicts least recently used ones (never the
//!   running op's) until a first-fit hole holds it, then is copied while the compute
//!   stream waits. Decisions are made on the host at run time, so it cannot be captured.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::experts::{ExpertLayout, ExpertPool, ExpertStats};
use super::{plan, validate, AccessOrder, Plan, WeightBudget};
use crate::backend::{Backend, CopyQueue, ExpertCache, HostMemory};
use crate::error::{gib, Error, Result};
use crate::graph::StepHooks;
use crate::model::config::ModelConfig;
use crate::model::decl::{Decl, Role};
use crate::tensor::{DType, Storage, Tensor};

/// Device offsets of streamed weights (ring slots, LRU placements) are multiples of this,
/// so every kernel's vector loads stay aligned; the planner sees sizes rounded up to it.
pub const SLOT_ALIGN: usize = 256;

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
    plan: Option<Plan>,
    /// The expert cache's layout (the experts policy).
    experts: Option<ExpertLayout>,
    /// Whether the expert cache prefetches ([`OffloadConfig::expert_prefetch`]).
    expert_prefetch: bool,
    /// The ring or the pool (none under the experts policy, whose pool is allocated with
    /// its tables by the executor).
    memory: Option<Tensor>,
}

/// The shape and device dtype (the run dtype `dtype`, or a quantized format) of every
/// weight in [`AccessOrder::llama`] order: the declared device tensors.
fn shapes(cfg: &ModelConfig, dtype: DType) -> Vec<(Vec<usize>, DType)> {
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
fn alloc_bytes(be: &dyn Backend, bytes: usize, policy: Policy) -> Result<Tensor> {
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

/// Host-side bookkeeping of the planned policy within a step.
#[derive(Default)]
struct PlannedState {
    /// Per stream: its copy was queued in the current segment (so its first reader waits).
    pending: Vec<bool>,
    /// The copy queue was forked in the current segment (so the segment ends with a join).
    forked: bool,
    /// The slots hold what a step expects when it starts: the last step queued its final
    /// op (so the copies it starts for the next step are queued) or a prime ran. False
    /// before the first step, during a step, and after a step that stopped part way.
    ready: bool,
}

struct Planned {
    plan: Plan,
    /// Per op: streams whose copies start at it.
    issue_at: Vec<Vec<usize>>,
    /// Per op: streams it reads first.
    consume_at: Vec<Vec<usize>>,
    /// Streams whose bytes must be in place when a step starts (copied during the
    /// previous step).
    prime: Vec<usize>,
    /// Per stream: the device view its copies fill.
    dst: Vec<Tensor>,
    state: Mutex<PlannedState>,
}

impl Planned {
    /// The per-op schedule of `plan` over `n` ops, copying into the slot views of `place`.
    fn new(plan: Plan, place: &[Place], n: usize) -> Result<Self> {
        let mut issue_at = vec![Vec::new(); n];
        let mut consume_at = vec![Vec::new(); n];
        let mut prime = Vec::new();
        let mut dst = Vec::with_capacity(plan.streams.len());
        for (i, s) in plan.streams.iter().enumerate() {
            issue_at[s.copy_start].push(i);
            consume_at[s.consumer].push(i);
            // The busy arc copy_start ..= last_reader crosses the step boundary.
            if s.copy_start > s.last_reader {
                prime.push(i);
            }
            match &place[s.weight] {
                Place::Slot(v) => dst.push(v.clone()),
                _ => {
                    return Err(Error::invalid(
                        "weight offload",
                        "a planned stream has no slot view",
                    ))
                }
            }
        }
        let state = PlannedState {
            pending: vec![false; plan.streams.len()],
            ..Default::default()
        };
        Ok(Planned {
            plan,
            issue_at,
            consume_at,
            prime,
            dst,
            state: Mutex::new(state),
        })
    }
}

/// The LRU pool: placements, recency and free space (offset -> length, coalesced).
struct LruState {
    placed: std::collections::HashMap<usize, usize>,
    recency: VecDeque<usize>,
    free: BTreeMap<usize, usize>,
}

struct Lru {
    pool_bytes: usize,
    shapes: Vec<(Vec<usize>, DType)>,
    state: Mutex<LruState>,
}

/// The policy at work, with its state.
enum Executor {
    Planned(Planned),
    Lru(Lru),
    Experts(Box<ExpertPool>),
}

impl Lru {
    /// An empty pool of `pool_bytes` for weights of `shapes`.
    fn new(pool_bytes: usize, shapes: Vec<(Vec<usize>, DType)>) -> Self {
        let mut free = BTreeMap::new();
        free.insert(0, pool_bytes);
        Lru {
            pool_bytes,
            shapes,
            state: Mutex::new(LruState {
                placed: Default::default(),
                recency: VecDeque::new(),
                free,
            }),
        }
    }
}

/// A running offloaded model's weight traffic (see the module docs).
pub struct Offload {
    order: AccessOrder,
    host: HostWeights,
    queue: Box<dyn CopyQueue>,
    memory: Option<Tensor>,
    executor: Executor,
    report: OffloadReport,
    copied: AtomicU64,
    /// A graph capture is running ([`Offload::begin_capture`]): nothing may be primed.
    capturing: AtomicBool,
}

impl Offload {
    /// The executor for a prepared budget and the loaded host side of its streamed
    /// weights.
    pub fn new(
        be: &dyn Backend,
        cfg: &ModelConfig,
        prepared: Prepared,
        host: HostWeights,
    ) -> Result<Self> {
        let Prepared {
            order,
            policy,
            place,
            mut report,
            dtype,
            plan,
            experts,
            expert_prefetch,
            memory,
        } = prepared;
        let n = order.ops().len();
        report.registered_bytes = host.registered_bytes;
        report.copied_bytes = host.copied_bytes;
        for (w, p) in place.iter().enumerate() {
            let missing = match p {
                Place::Slot(_) => host.parts.get(w).is_none_or(|p| p.is_empty()),
                Place::Host => host.views.get(w).is_none_or(Option::is_none),
                Place::Device => false,
            };
            if missing {
                return Err(Error::invalid(
                    "weight offload",
                    format!(
                        "weight `{}` is not on the device and has no host bytes",
                        order.weights()[w].name
                    ),
                ));
            }
        }
        let executor = match (policy, plan, experts) {
            (Policy::Planned, Some(plan), _) => Executor::Planned(Planned::new(plan, &place, n)?),
            (Policy::Lru, _, _) => {
                Executor::Lru(Lru::new(report.streaming_bytes, shapes(cfg, dtype)))
            }
            (Policy::Experts, _, Some(layout)) => {
                let pool = ExpertPool::new(be, layout, expert_prefetch)?;
                report.expert_slots = pool.layout.slots;
                Executor::Experts(Box::new(pool))
            }
            (p, _, _) => {
                return Err(Error::invalid(
                    "weight offload",
                    format!("the {} policy was prepared without its plan", p.name()),
                ))
            }
        };
        let events = match &executor {
            Executor::Planned(p) => p.plan.streams.len(),
            _ => 0,
        };
        let queue = be.copy_queue(events)?;
        let o = Offload {
            order,
            host,
            queue,
            memory,
            executor,
            report,
            copied: AtomicU64::new(0),
            capturing: AtomicBool::new(false),
        };
        Ok(o)
    }

    pub fn report(&self) -> &OffloadReport {
        &self.report
    }

    pub fn policy(&self) -> Policy {
        match self.executor {
            Executor::Planned(_) => Policy::Planned,
            Executor::Lru(_) => Policy::Lru,
            Executor::Experts(_) => Policy::Experts,
        }
    }

    pub fn plan(&self) -> Option<&Plan> {
        match &self.executor {
            Executor::Planned(p) => Some(&p.plan),
            _ => None,
        }
    }

    /// The expert cache arguments of decoder layer `layer`'s MoE call (the experts
    /// policy); `None` under the other policies.
    pub fn expert_cache(&self, layer: usize) -> Option<ExpertCache<'_>> {
        match &self.executor {
            Executor::Experts(pool) => Some(pool.cache(layer)),
            _ => None,
        }
    }

    /// Whether the expert cache's calls prefetch the next sparse layer's experts.
    pub fn prefetches_experts(&self) -> bool {
        matches!(&self.executor, Executor::Experts(pool) if pool.prefetches())
    }

    /// Where the `i`-th expert prefetch of a step plans its fills, when the calls
    /// prefetch the next sparse layer's experts (the experts policy, unless every expert
    /// has a slot or `--expert-prefetch` is off).
    pub fn expert_prefetch_fills(&self, i: usize) -> Option<Result<Tensor>> {
        match &self.executor {
            Executor::Experts(pool) if pool.prefetches() => Some(pool.prefetch_fills(i)),
            _ => None,
        }
    }

    /// The expert cache's running totals (synchronises with the device); `None` under the
    /// other policies.
    pub fn expert_stats(&self, be: &dyn Backend) -> Result<Option<ExpertStats>> {
        match &self.executor {
            Executor::Experts(pool) => pool.stats(be).map(Some),
            _ => Ok(None),
        }
    }

    fn capturing(&self) -> bool {
        self.capturing.load(Ordering::Acquire)
    }

    pub fn order(&self) -> &AccessOrder {
        &self.order
    }

    /// Bytes queued for copying since start-up (each graph replay's copies are not seen
    /// by the host: planned steps copy [`OffloadReport::streamed_bytes_per_step`] each).
    pub fn copied_bytes(&self) -> u64 {
        self.copied.load(Ordering::Relaxed)
    }

    /// Queue the copies of weight `w` into `dst` (its slot or placement).
    fn copy_weight(&self, w: usize, dst: &Tensor) -> Result<()> {
        let storage: &Storage = dst.storage();
        // Parts are whole rows of the weight (dense or quantized alike).
        let row_bytes = dst.size_bytes() / dst.dim(0).max(1);
        for p in &self.host.parts[w] {
            let mut shape = dst.shape().to_vec();
            shape[0] = p.bytes / row_bytes.max(1);
            let base = dst.offset() + p.dst_offset;
            let view = Tensor::new(storage.clone(), base, &shape, dst.dtype())?;
            self.queue
                .copy(&self.host.memory[p.memory], p.offset, &view)?;
            self.copied.fetch_add(p.bytes as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Op `op` of the access order is about to be queued: queue the copies it starts and
    /// the waits its reads need. Returns, under LRU, the device tensors of the op's
    /// weights (in the op's read order); `None` when the model's own tensors serve.
    pub fn enter(&self, op: usize) -> Result<Option<Vec<Tensor>>> {
        match &self.executor {
            Executor::Planned(p) => self.enter_planned(p, op).map(|()| None),
            // The cache runs inside the MoE op; every other weight is resident.
            Executor::Experts(_) => Ok(None),
            Executor::Lru(lru) => {
                // The configuration refuses this ([`Policy::check_graphs`]); a capture
                // reaching here anyway gets the same refusal rather than a frozen choice.
                Policy::Lru.check_graphs(self.capturing())?;
                self.enter_lru(lru, op).map(Some)
            }
        }
    }

    fn enter_planned(&self, p: &Planned, op: usize) -> Result<()> {
        let mut st = p.state.lock().unwrap_or_else(|e| e.into_inner());
        if op == 0 {
            if !st.ready && !self.capturing() {
                self.prime(p, &mut st)?;
            }
            st.ready = false;
        }
        let issue = &p.issue_at[op];
        if !issue.is_empty() {
            self.queue.fork()?;
            st.forked = true;
            for &s in issue {
                self.copy_weight(p.plan.streams[s].weight, &p.dst[s])?;
                self.queue.record(s)?;
                st.pending[s] = true;
            }
        }
        for &s in &p.consume_at[op] {
            if st.pending[s] {
                self.queue.wait(s)?;
                st.pending[s] = false;
            }
        }
        if op + 1 == p.issue_at.len() {
            st.ready = true;
        }
        Ok(())
    }

    /// Queue the copies a step expects to find done, and join them.
    fn prime(&self, p: &Planned, st: &mut PlannedState) -> Result<()> {
        self.queue.fork()?;
        for &s in &p.prime {
            self.copy_weight(p.plan.streams[s].weight, &p.dst[s])?;
        }
        self.queue.join()?;
        st.pending.fill(false);
        st.forked = false;
        st.ready = true;
        Ok(())
    }

    /// Join the copies queued since the last segment ended (see the `end_segment` hook).
    fn join_segment(&self) -> Result<()> {
        let Executor::Planned(p) = &self.executor else {
            return Ok(());
        };
        let mut st = p.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.forked {
            self.queue.join()?;
            st.forked = false;
            st.pending.fill(false);
        }
        Ok(())
    }

    fn enter_lru(&self, lru: &Lru, op: usize) -> Result<Vec<Tensor>> {
        let reads = &self.order.ops()[op].reads;
        let mut st = lru.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::with_capacity(reads.len());
        let mut forked = false;
        for &w in reads {
            if let Some(Some(v)) = self.host.views.get(w) {
                out.push(v.clone());
                continue;
            }
            let (offset, missing) = match st.placed.get(&w) {
                Some(&off) => {
                    if let Some(i) = st.recency.iter().position(|&x| x == w) {
                        st.recency.remove(i);
                    }
                    st.recency.push_back(w);
                    (off, false)
                }
                None => {
                    let bytes = self.order.weights()[w].bytes;
                    let off = loop {
                        if let Some(off) = st.first_fit(bytes) {
                            break off;
                        }
                        let victim = st
                            .recency
                            .iter()
                            .position(|v| !reads.contains(v))
                            .ok_or_else(|| {
                                Error::invalid(
                                    "weight offload (LRU)",
                                    format!(
                                        "no hole of {bytes} bytes for `{}` in the {} byte pool \
                                         after evicting every other weight (fragmentation); \
                                         raise --weight-budget or use --offload-policy planned",
                                        self.order.weights()[w].name,
                                        lru.pool_bytes
                                    ),
                                )
                            })?;
                        let v = st.recency.remove(victim).expect("in range");
                        let off = st.placed.remove(&v).expect("placed");
                        st.release(off, self.order.weights()[v].bytes);
                    };
                    st.placed.insert(w, off);
                    st.recency.push_back(w);
                    (off, true)
                }
            };
            let (shape, dt) = &lru.shapes[w];
            let pool = self.memory.as_ref().expect("the LRU policy has a pool");
            let t = Tensor::new(pool.storage().clone(), offset, shape, *dt)?;
            if missing {
                if !forked {
                    self.queue.fork()?;
                    forked = true;
                }
                self.copy_weight(w, &t)?;
            }
            out.push(t);
        }
        if forked {
            // On demand: the op waits for its copies (nothing was prefetched).
            self.queue.join()?;
        }
        Ok(out)
    }
}

impl LruState {
    /// The lowest offset of a free hole of `bytes` bytes.
    fn first_fit(&mut self, bytes: usize) -> Option<usize> {
        let (&off, &len) = self.free.iter().find(|(_, &len)| len >= bytes)?;
        self.free.remove(&off);
        if len > bytes {
            self.free.insert(off + bytes, len - bytes);
        }
        Some(off)
    }

    /// Return `off .. off + bytes` to the free list, merging with its neighbours.
    fn release(&mut self, off: usize, bytes: usize) {
        let (mut start, mut len) = (off, bytes);
        if let Some((&p, &plen)) = self.free.range(..off).next_back() {
            if p + plen == off {
                self.free.remove(&p);
                start = p;
                len += plen;
            }
        }
        if let Some(&nlen) = self.free.get(&(off + bytes)) {
            self.free.remove(&(off + bytes));
            len += nlen;
        }
        self.free.insert(start, len);
    }
}

/// The capture protocol ([`StepHooks`]): the executor tells the offload when a step
/// begins, when a segment (a captured piece or an eager seam) ends, and when a capture
/// runs; the offload never asks the backend whether it is capturing.
impl StepHooks for Offload {
    /// Before a step that may start with a graph replay (which does not announce its ops
    /// to the host): prime the slots unless the last step left them ready (a step that
    /// failed part way, or a piecewise capture, which runs no ops). Never called inside
    /// a capture.
    fn begin_step(&self, _be: &dyn Backend) -> Result<()> {
        let Executor::Planned(p) = &self.executor else {
            return Ok(());
        };
        let mut st = p.state.lock().unwrap_or_else(|e| e.into_inner());
        if !st.ready && !self.capturing() {
            self.prime(p, &mut st)?;
        }
        Ok(())
    }

    /// A graph capture starts: until `end_capture`, nothing is primed (a
    /// capture records the step's own copies only).
    fn begin_capture(&self) {
        self.capturing.store(true, Ordering::Release);
    }

    /// The graph capture `begin_capture` announced has ended.
    fn end_capture(&self) {
        self.capturing.store(false, Ordering::Release);
    }

    /// Where a captured piece or an eager seam ends: the compute stream waits for every
    /// copy queued in it.
    fn end_segment(&self, be: &dyn Backend) -> Result<()> {
        if let Executor::Experts(_) = &self.executor {
            be.join_expert_prefetch()?;
        }
        self.join_segment()
    }
}
