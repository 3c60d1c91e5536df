//! Weight offload planning: the host-side, device-free half of running a model whose
//! weights exceed the device budget. The device half, [`Offload`] (the executor, one of
//! the model's step hooks), is in `exec`.
//!
//! One forward step reads the weights in a static order ([`AccessOrder`], derived from the
//! model's declaration by [`AccessOrder::from_decl`]), step after step, so the future is
//! known. From it this module derives:
//! - the **floor** ([`AccessOrder::floor`]): the smallest budget any streaming schedule
//!   of this layer can use; a smaller `--weight-budget` ([`WeightBudget`]) is refused
//!   with the exact minimum;
//! - a **plan** ([`plan`]): a fixed resident set plus a ring of prefetch slots, each
//!   streamed weight with its slot range, the op at which its copy starts and the op that
//!   consumes it, chosen to stream as few bytes per step as the budget allows;
//! - an **LRU baseline** ([`lru_streamed_per_step`]) for comparison;
//! - a **validator** ([`validate`]) checking a plan never lets a copy overwrite bytes an
//!   op still reads and never lets an op read a weight that has not landed.
//!
//! Timing model (what "op at which its copy starts" means): copies are issued on a copy
//! stream in the plan's order; the copy of weight `w` starting at op `a` runs while ops
//! `a, a+1, ..` execute and must complete before its first reader `c` begins (an event
//! orders them), so `a` is strictly before `c`. `w`'s slot range is then busy during the
//! cyclic arc of ops `a ..= l` where `l` is its last reader. Two streamed weights whose
//! slot ranges share a byte must have disjoint arcs; the copy of the later one waits for
//! the earlier one's last reader (another event).

mod exec;
pub mod experts;
mod prepare;

pub use exec::{Offload, SLOT_ALIGN};
pub use experts::{ExpertLayout, ExpertStats};
pub use prepare::{
    device_bytes, executor_order, HostPart, HostWeights, OffloadConfig, OffloadReport, Place,
    Policy, Prepared,
};

use std::collections::{HashMap, VecDeque};

use crate::error::{gib, Error, Result};
use crate::model::config::ModelConfig;
use crate::model::decl::Decl;
use crate::tensor::DType;

/// One device weight tensor as the offloader moves it: a name and its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Weight {
    pub name: String,
    pub bytes: usize,
}

/// One op of the forward step: a name and the weights it reads (indices into
/// [`AccessOrder::weights`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    pub name: String,
    pub reads: Vec<usize>,
}

/// The weights one forward step reads, op by op, in order; the step repeats cyclically
/// (op 0 of step `k + 1` follows the last op of step `k`).
///
/// Invariants checked by [`AccessOrder::new`]: at least two ops; every weight is read;
/// the ops reading a weight form one run of cyclically consecutive ops that is not the
/// whole step (so one copy per step serves all its reads and there is an op during
/// which it can land). A tied embedding, read by the first op and the last, satisfies it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessOrder {
    weights: Vec<Weight>,
    ops: Vec<Op>,
    /// Per weight: (first reader, last reader) of its cyclic run of readers.
    runs: Vec<(usize, usize)>,
}

fn invalid(what: impl Into<String>) -> Error {
    Error::invalid("weight offload", what)
}

impl AccessOrder {
    /// Check and build an order (see the type's invariants).
    pub fn new(weights: Vec<Weight>, ops: Vec<Op>) -> Result<Self> {
        let n = ops.len();
        if n < 2 {
            return Err(invalid(format!(
                "the access order has {n} op(s); streaming needs at least 2 (a copy lands \
                 while another op runs)"
            )));
        }
        let mut readers = vec![Vec::new(); weights.len()];
        for (i, op) in ops.iter().enumerate() {
            for &w in &op.reads {
                let r: &mut Vec<usize> = readers.get_mut(w).ok_or_else(|| {
                    invalid(format!(
                        "op `{}` reads weight #{w}, but there are {} weights",
                        op.name,
                        weights.len()
                    ))
                })?;
                if r.last() == Some(&i) {
                    return Err(invalid(format!(
                        "op `{}` lists weight `{}` twice",
                        op.name, weights[w].name
                    )));
                }
                r.push(i);
            }
        }
        let mut runs = Vec::with_capacity(weights.len());
        for (w, r) in readers.iter().enumerate() {
            let name = &weights[w].name;
            if r.is_empty() {
                return Err(invalid(format!("weight `{name}` is read by no op")));
            }
            if r.len() == n {
                return Err(invalid(format!(
                    "weight `{name}` is read by every op, so it can never be streamed"
                )));
            }
            // The run starts at the reader whose predecessor (cyclically) is no reader.
            let is_reader = |op: usize| r.binary_search(&op).is_ok();
            let starts: Vec<usize> = r
                .iter()
                .copied()
                .filter(|&op| !is_reader((op + n - 1) % n))
                .collect();
            if starts.len() != 1 {
                return Err(invalid(format!(
                    "weight `{name}` is read by ops {} which are not one run of consecutive \
                     ops; a streamed weight is copied once per step",
                    r.iter()
                        .map(|&i| format!("`{}`", ops[i].name))
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            let first = starts[0];
            runs.push((first, (first + r.len() - 1) % n));
        }
        Ok(AccessOrder { weights, ops, runs })
    }

    /// The Llama-family forward (Llama, Mistral, Qwen2, Qwen3) as `model/llama.rs` runs
    /// it: the order of `cfg`'s declaration ([`Self::from_decl`]). Sizes are in `dtype`.
    pub fn llama(cfg: &ModelConfig, dtype: DType) -> Result<Self> {
        Self::from_decl(&cfg.decl(), dtype)
    }

    /// The order of a model declaration: its device tensors (merged q/k/v and gate/up)
    /// with their bytes in `dtype`, and its ops in forward order, each reading the tensors
    /// the declaration gives it (a tied embedding is read by the first op and the last).
    pub fn from_decl(decl: &Decl, dtype: DType) -> Result<Self> {
        let weights = decl
            .tensors()
            .iter()
            .map(|t| Weight {
                name: t.name(),
                bytes: t.bytes(dtype),
            })
            .collect();
        let ops = decl
            .ops()
            .iter()
            .map(|o| Op {
                name: o.op.name(),
                reads: o.reads.clone(),
            })
            .collect();
        Self::new(weights, ops)
    }

    pub fn weights(&self) -> &[Weight] {
        &self.weights
    }

    /// The same order with weight `w` at zero device bytes: it is read in place from host
    /// memory, so it takes no budget, no slot and no copy.
    pub fn served_from_host(mut self, w: usize) -> Self {
        if let Some(x) = self.weights.get_mut(w) {
            x.bytes = 0;
        }
        self
    }

    /// The same order with every weight's bytes rounded up to a multiple of `align`: the
    /// device bytes it takes when each slot starts aligned.
    pub fn aligned(mut self, align: usize) -> Self {
        for w in &mut self.weights {
            w.bytes = w.bytes.next_multiple_of(align.max(1));
        }
        self
    }

    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// The (first, last) op of the cyclic run of ops reading weight `w`.
    pub fn run(&self, w: usize) -> (usize, usize) {
        self.runs[w]
    }

    /// Bytes of all weights (each counted once).
    pub fn total_bytes(&self) -> usize {
        self.weights.iter().map(|w| w.bytes).sum()
    }

    /// Bytes of the weights read by op `i` or op `i + 1` (cyclically), each counted once,
    /// restricted to weights for which `keep` holds.
    fn pair_bytes(&self, i: usize, keep: impl Fn(usize) -> bool) -> usize {
        let next = &self.ops[(i + 1) % self.ops.len()].reads;
        let here = &self.ops[i].reads;
        here.iter()
            .chain(next.iter().filter(|w| !here.contains(w)))
            .filter(|&&w| keep(w))
            .map(|&w| self.weights[w].bytes)
            .sum()
    }

    /// The weights sorted largest first (ties by index): the order in which [`plan`] and
    /// the floor keep weights resident.
    fn by_size(&self) -> Vec<usize> {
        let mut v: Vec<usize> = (0..self.weights.len()).collect();
        v.sort_by_key(|&w| (std::cmp::Reverse(self.weights[w].bytes), w));
        v
    }

    /// The minimum budget: over the choices "keep the `k` largest weights resident and
    /// stream the rest" (`k` from none to all), the least of the resident bytes plus the
    /// streaming ring's floor — the largest bytes two consecutive ops read of the
    /// streamed weights (the last op and the first one included), plus the largest
    /// streamed weight (one prefetch slot).
    ///
    /// Why a ring cannot use less: when op `i` runs, its weights are on the device and
    /// being read, and the weights of op `i + 1` must land before `i + 1` starts; the only
    /// time to copy them without stalling the forward is while `i` runs, so both sets
    /// occupy distinct device bytes at once. The slots form a ring reused step after step
    /// at fixed offsets, and a slot range is contiguous: when a weight does not fit
    /// between the ring's write position and its end it is placed at the start, and the
    /// skipped tail (less than that weight's bytes) is lost for that lap; one largest
    /// streamed weight of headroom covers it. Keeping the largest weights resident costs
    /// their bytes once and takes them out of both terms, which wins when one weight
    /// dominates (a tied embedding table: read by the first op and the last, it would
    /// otherwise count in a pair and as the slot). A budget at the floor admits the plan
    /// that keeps those weights resident (see [`plan`] for the one shape of order where
    /// the ring layout needs more than this headroom).
    pub fn floor(&self) -> Floor {
        let nw = self.weights.len();
        let mut resident = vec![false; nw];
        let mut resident_bytes = 0;
        let order = self.by_size();
        let mut best: Option<Floor> = None;
        for k in 0..=nw {
            if k > 0 {
                resident[order[k - 1]] = true;
                resident_bytes += self.weights[order[k - 1]].bytes;
            }
            let (mut pair, mut at) = (0, 0);
            for i in 0..self.ops.len() {
                let b = self.pair_bytes(i, |w| !resident[w]);
                if b > pair {
                    (pair, at) = (b, i);
                }
            }
            let slot = (0..nw)
                .filter(|&w| !resident[w])
                .map(|w| self.weights[w].bytes)
                .max()
                .unwrap_or(0);
            let bytes = resident_bytes + pair + slot;
            if best.is_none_or(|b| bytes < b.bytes) {
                best = Some(Floor {
                    bytes,
                    pair_bytes: pair,
                    pair_at: at,
                    slot_bytes: slot,
                    resident_bytes,
                });
            }
        }
        best.expect("k = 0 is always tried")
    }
}

/// The minimum weight budget of an [`AccessOrder`] and where it comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Floor {
    /// `resident_bytes + pair_bytes + slot_bytes`.
    pub bytes: usize,
    /// The largest bytes of streamed weights read by two consecutive ops.
    pub pair_bytes: usize,
    /// The first op of that pair.
    pub pair_at: usize,
    /// The largest streamed weight.
    pub slot_bytes: usize,
    /// The bytes of the largest weights kept resident at the floor (all of them when
    /// streaming would need more than keeping every weight).
    pub resident_bytes: usize,
}

/// A `--weight-budget` value: bytes, or a percentage of the model's weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum WeightBudget {
    Bytes(usize),
    /// In `(0, 100]`.
    Percent(f64),
}

impl WeightBudget {
    /// Parse `N`, `N B`, `N KiB`, `N MiB`, `N GiB` (integer `N`, optional space) or `P%`
    /// (`0 < P <= 100`, decimals allowed). Errors name the value.
    pub fn parse(text: &str) -> Result<Self> {
        let err = |why: &str| {
            Error::invalid(
                "--weight-budget",
                format!(
                    "`{text}` {why}; expected bytes with an optional KiB/MiB/GiB suffix \
                     (e.g. `6GiB`) or a percentage of the weights (e.g. `50%`)"
                ),
            )
        };
        let t = text.trim();
        if let Some(p) = t.strip_suffix('%') {
            let p: f64 = p
                .trim()
                .parse()
                .map_err(|_| err("is not a number followed by `%`"))?;
            if !(p > 0.0 && p <= 100.0) {
                return Err(err("is not a percentage in (0, 100]"));
            }
            return Ok(WeightBudget::Percent(p));
        }
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (digits, unit) = (&t[..split], t[split..].trim());
        if digits.is_empty() {
            return Err(err("does not start with a number"));
        }
        let n: usize = digits.parse().map_err(|_| err("is too large"))?;
        let scale: usize = match unit {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            _ => return Err(err("has an unknown unit")),
        };
        let bytes = n.checked_mul(scale).ok_or_else(|| err("is too large"))?;
        if bytes == 0 {
            return Err(err("is zero"));
        }
        Ok(WeightBudget::Bytes(bytes))
    }

    /// The budget in bytes for weights totalling `total` bytes (a percentage rounds down).
    pub fn bytes(self, total: usize) -> usize {
        match self {
            WeightBudget::Bytes(b) => b,
            WeightBudget::Percent(p) => (total as f64 * p / 100.0) as usize,
        }
    }
}

/// Refuse a budget below the floor, giving the exact minimum.
pub fn check_budget(order: &AccessOrder, budget: usize) -> Result<Floor> {
    let floor = order.floor();
    if budget < floor.bytes {
        let (a, b) = (floor.pair_at, (floor.pair_at + 1) % order.ops.len());
        let why = if floor.resident_bytes == order.total_bytes() {
            "streaming would need more than keeping every weight resident".to_string()
        } else {
            format!(
                "{}ops `{}` and `{}` read {} bytes of streamed weights together and the \
                 largest streamed weight needs a {} byte prefetch slot",
                if floor.resident_bytes > 0 {
                    format!(
                        "with the largest weights resident ({} bytes), ",
                        floor.resident_bytes
                    )
                } else {
                    String::new()
                },
                order.ops[a].name,
                order.ops[b].name,
                floor.pair_bytes,
                floor.slot_bytes
            )
        };
        return Err(invalid(format!(
            "a weight budget of {budget} bytes ({:.3} GiB) is below the minimum of {} bytes \
             ({:.3} GiB): {why}; raise --weight-budget to at least {} bytes",
            gib(budget),
            floor.bytes,
            gib(floor.bytes),
            floor.bytes
        )));
    }
    Ok(floor)
}

/// One streamed weight of a [`Plan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stream {
    pub weight: usize,
    /// Its slot range in the ring: `offset .. offset + bytes`.
    pub offset: usize,
    pub bytes: usize,
    /// The op at whose start its copy is issued (cyclically before `consumer`; when
    /// numerically larger than `consumer` it is an op of the previous step).
    pub copy_start: usize,
    /// Its first reader.
    pub consumer: usize,
    /// Its last reader, after which the slot range may be reused.
    pub last_reader: usize,
}

/// A residency plan: weights kept on the device, and the rest streamed through a ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub budget: usize,
    /// Resident weights, ascending.
    pub resident: Vec<usize>,
    pub resident_bytes: usize,
    pub ring_bytes: usize,
    /// Streamed weights in the order their copies are issued within a step.
    pub streams: Vec<Stream>,
}

impl Plan {
    /// Bytes copied to the device per step: every streamed weight once.
    pub fn streamed_bytes_per_step(&self) -> usize {
        self.streams.iter().map(|s| s.bytes).sum()
    }
}

/// Cyclic distance from op `a` forward to op `b`.
fn dist(a: usize, b: usize, n: usize) -> usize {
    (b + n - a) % n
}

/// Whether op `x` lies on the cyclic arc `from ..= to`.
fn on_arc(x: usize, from: usize, to: usize, n: usize) -> bool {
    dist(from, x, n) <= dist(from, to, n)
}

/// Whether the cyclic arcs `a.0 ..= a.1` and `b.0 ..= b.1` share an op.
fn arcs_meet(a: (usize, usize), b: (usize, usize), n: usize) -> bool {
    on_arc(b.0, a.0, a.1, n) || on_arc(a.0, b.0, b.1, n)
}

/// Lay the `streamed` weights out in a ring: returns (ring bytes, streams). Each weight's
/// busy arc with a just-in-time copy is `consumer - 1 ..= last_reader`; weights whose
/// arcs meet get disjoint byte ranges, each placed first-fit (lowest offset) in copy
/// order. Copy starts are then pulled as early as the layout allows: right after the
/// last read of the nearest earlier weight sharing bytes with it.
fn layout(order: &AccessOrder, streamed: &[usize]) -> (usize, Vec<Stream>) {
    let n = order.ops.len();
    // Copy order: by first reader, starting at an op whose predecessor shares no weight
    // with it, so no weight's run straddles the start (op 0 when none exists).
    let start = (0..n)
        .find(|&i| {
            let prev = &order.ops[(i + n - 1) % n].reads;
            !order.ops[i].reads.iter().any(|w| prev.contains(w))
        })
        .unwrap_or(0);
    let mut ws = streamed.to_vec();
    ws.sort_by_key(|&w| (dist(start, order.runs[w].0, n), w));
    let jit = |w: usize| {
        let (c, l) = order.runs[w];
        ((c + n - 1) % n, l)
    };
    let mut placed: Vec<(usize, usize, usize)> = Vec::new(); // (weight, offset, bytes)
    let mut ring = 0;
    for &w in &ws {
        let bytes = order.weights[w].bytes;
        let mut busy: Vec<(usize, usize)> = placed
            .iter()
            .filter(|p| arcs_meet(jit(w), jit(p.0), n))
            .map(|p| (p.1, p.1 + p.2))
            .collect();
        busy.sort_unstable();
        let mut offset = 0;
        for (lo, hi) in busy {
            if offset + bytes <= lo {
                break;
            }
            offset = offset.max(hi);
        }
        ring = ring.max(offset + bytes);
        placed.push((w, offset, bytes));
    }
    let streams = placed
        .iter()
        .map(|&(w, offset, bytes)| {
            let (consumer, last_reader) = order.runs[w];
            // The nearest read-end before `consumer` of another weight sharing bytes;
            // none: the copy may start right after this weight's own last read.
            let back = placed
                .iter()
                .filter(|p| p.0 != w && p.1 < offset + bytes && offset < p.1 + p.2)
                .map(|p| dist(order.runs[p.0].1, consumer, n))
                .min()
                .unwrap_or(dist(last_reader, consumer, n));
            Stream {
                weight: w,
                offset,
                bytes,
                copy_start: (consumer + n - back + 1) % n,
                consumer,
                last_reader,
            }
        })
        .collect();
    (ring, streams)
}

/// Plan residency for `budget` bytes: refuse a budget below the floor, then choose the
/// resident set greedily and lay the rest out in a ring.
///
/// Why this is the MIN/Belady choice: each weight is read in one run per step, so any
/// weight not kept on the device across a whole step is copied at least once per step,
/// and a streamed weight costs exactly its bytes once per step with the ring. Belady's
/// rule (evict the block used furthest in the future) on a cyclic order with every block
/// used once per period degenerates into keeping a fixed set and cycling the rest
/// through the remaining space; bytes streamed per step = total - resident, so
/// minimising traffic is maximising resident bytes subject to
/// `resident + ring(streamed) <= budget`. The ring needed by a streamed set follows the
/// same consecutive-pair rule as the floor, restricted to streamed weights.
///
/// The resident set is chosen largest weight first. It starts with the fewest largest
/// weights whose residency lets the ring fit (none, unless a dominant weight such as a
/// tied embedding table would need a ring of its own size twice: see
/// [`AccessOrder::floor`]); after them a weight becomes resident when the budget still
/// holds with the ring recomputed for the weights left streaming (keeping a large weight
/// also shrinks the ring). This is exact for the Llama order in practice
/// (the ring is set by a few large neighbours) but is a greedy answer to a knapsack, not
/// a proven optimum for arbitrary orders.
///
/// On orders where every op's weights conflict with three or more others at once (an
/// odd cycle of large ops), first-fit may need more ring than the floor's headroom; the
/// plan then fails with an error naming the ring it needs rather than overrun.
pub fn plan(order: &AccessOrder, budget: usize) -> Result<Plan> {
    check_budget(order, budget)?;
    let nw = order.weights.len();
    let by_size = order.by_size();
    let streamed_of = |res: &[bool]| (0..nw).filter(|&w| !res[w]).collect::<Vec<_>>();
    // Start from the fewest largest weights kept resident for which the ring fits (none,
    // unless one weight dominates; see `AccessOrder::floor`), then add more greedily.
    let mut resident = vec![false; nw];
    let mut resident_bytes = 0;
    let mut first = 0;
    let (mut ring, mut streams) = loop {
        let (ring, streams) = layout(order, &streamed_of(&resident));
        if resident_bytes + ring <= budget {
            break (ring, streams);
        }
        let Some(&w) = by_size.get(first) else {
            return Err(invalid(format!(
                "the prefetch ring for this access order needs more than the budget of \
                 {budget} bytes beside its resident weights (the floor's headroom does not \
                 cover this order's slot fragmentation); raise --weight-budget"
            )));
        };
        resident[w] = true;
        resident_bytes += order.weights[w].bytes;
        first += 1;
    };
    for &w in &by_size[first..] {
        let bytes = order.weights[w].bytes;
        if resident_bytes + bytes > budget {
            continue;
        }
        resident[w] = true;
        let (r, s) = layout(order, &streamed_of(&resident));
        if resident_bytes + bytes + r <= budget {
            resident_bytes += bytes;
            (ring, streams) = (r, s);
        } else {
            resident[w] = false;
        }
    }
    Ok(Plan {
        budget,
        resident: (0..nw).filter(|&w| resident[w]).collect(),
        resident_bytes,
        ring_bytes: ring,
        streams,
    })
}

/// Check `plan` against `order`: every weight is resident or streamed exactly once; the
/// resident set and the ring fit the budget; every slot range lies in the ring; every
/// copy starts strictly before its consumer and every reader of a streamed weight lies
/// in its run; and no two streamed weights sharing a byte are busy during the same op
/// (cyclically, so step `k + 1`'s copies against step `k`'s reads). Errors name the
/// weights and ops.
pub fn validate(order: &AccessOrder, plan: &Plan) -> Result<()> {
    let n = order.ops.len();
    let name = |w: usize| &order.weights[w].name;
    let op = |i: usize| &order.ops[i].name;
    let mut seen: HashMap<usize, &str> = HashMap::new();
    for &w in &plan.resident {
        if w >= order.weights.len() || seen.insert(w, "resident").is_some() {
            return Err(invalid(format!(
                "resident weight #{w} is unknown or listed twice"
            )));
        }
    }
    for s in &plan.streams {
        let w = s.weight;
        if w >= order.weights.len() {
            return Err(invalid(format!("streamed weight #{w} is unknown")));
        }
        if let Some(was) = seen.insert(w, "streamed") {
            return Err(invalid(format!(
                "weight `{}` is streamed but also {was}",
                name(w)
            )));
        }
        if s.bytes != order.weights[w].bytes || s.offset + s.bytes > plan.ring_bytes {
            return Err(invalid(format!(
                "weight `{}` ({} bytes) has slot {}..{} outside the {} byte ring or of the \
                 wrong size",
                name(w),
                order.weights[w].bytes,
                s.offset,
                s.offset + s.bytes,
                plan.ring_bytes
            )));
        }
        if (s.consumer, s.last_reader) != order.runs[w] {
            return Err(invalid(format!(
                "weight `{}` is read by ops `{}`..=`{}`, but the plan says `{}`..=`{}`",
                name(w),
                op(order.runs[w].0),
                op(order.runs[w].1),
                op(s.consumer),
                op(s.last_reader)
            )));
        }
        if s.copy_start >= n || on_arc(s.copy_start, s.consumer, s.last_reader, n) {
            return Err(invalid(format!(
                "the copy of weight `{}` starts at op #{}, not before its consumer `{}`",
                name(w),
                s.copy_start,
                op(s.consumer)
            )));
        }
    }
    if let Some(w) = (0..order.weights.len()).find(|w| !seen.contains_key(w)) {
        return Err(invalid(format!(
            "weight `{}` is neither resident nor streamed, so op `{}` would read it \
             before it lands",
            name(w),
            op(order.runs[w].0)
        )));
    }
    if plan.resident_bytes
        != plan
            .resident
            .iter()
            .map(|&w| order.weights[w].bytes)
            .sum::<usize>()
        || plan.resident_bytes + plan.ring_bytes > plan.budget
    {
        return Err(invalid(format!(
            "resident {} bytes + ring {} bytes exceed the budget of {} bytes (or the \
             resident bytes are miscounted)",
            plan.resident_bytes, plan.ring_bytes, plan.budget
        )));
    }
    for (i, a) in plan.streams.iter().enumerate() {
        for b in &plan.streams[i + 1..] {
            let share = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
            if share
                && arcs_meet(
                    (a.copy_start, a.last_reader),
                    (b.copy_start, b.last_reader),
                    n,
                )
            {
                return Err(invalid(format!(
                    "weights `{}` (copied at `{}`, read until `{}`) and `{}` (copied at \
                     `{}`, read until `{}`) share slot bytes while both are in flight",
                    name(a.weight),
                    op(a.copy_start),
                    op(a.last_reader),
                    name(b.weight),
                    op(b.copy_start),
                    op(b.last_reader)
                )));
            }
        }
    }
    Ok(())
}

/// Bytes an on-demand LRU cache of `budget` bytes copies in the last of `steps` steps of
/// the cyclic order (the steady state once the cache has warmed). A miss evicts least
/// recently used weights, never those of the running op, until the weight fits; the
/// cache counts bytes only (no fragmentation), which flatters LRU. Errors when one op's
/// weights exceed the budget.
pub fn lru_streamed_per_step(order: &AccessOrder, budget: usize, steps: usize) -> Result<usize> {
    let mut cache: VecDeque<usize> = VecDeque::new(); // front = least recently used
    let mut used = 0;
    let mut last = 0;
    for _ in 0..steps.max(1) {
        last = 0;
        for o in &order.ops {
            for &w in &o.reads {
                if let Some(pos) = cache.iter().position(|&c| c == w) {
                    cache.remove(pos);
                    cache.push_back(w);
                    continue;
                }
                let bytes = order.weights[w].bytes;
                while used + bytes > budget {
                    let pos = cache
                        .iter()
                        .position(|c| !o.reads.contains(c))
                        .ok_or_else(|| {
                            invalid(format!(
                                "LRU: op `{}` reads more than the budget of {budget} bytes",
                                o.name
                            ))
                        })?;
                    let victim = cache.remove(pos).expect("position is in range");
                    used -= order.weights[victim].bytes;
                }
                cache.push_back(w);
                used += bytes;
                last += bytes;
            }
        }
    }
    Ok(last)
}
