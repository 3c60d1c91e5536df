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
use std::sync::Mutex;

use super::experts::{ExpertPool, ExpertStats};
use super::prepare::{shapes, HostWeights, OffloadReport, Place, Policy, Prepared};
use super::{AccessOrder, Plan};
use crate::backend::{Backend, CopyQueue, ExpertCache};
use crate::error::{Error, Result};
use crate::graph::StepHooks;
use crate::model::config::ModelConfig;
use crate::tensor::{DType, Storage, Tensor};

/// Device offsets of streamed weights (ring slots, LRU placements) are multiples of this,
/// so every kernel's vector loads stay aligned; the planner sees sizes rounded up to it.
pub const SLOT_ALIGN: usize = 256;

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
