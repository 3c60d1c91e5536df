//! The one place that captures and replays. A step is a list of *pieces* (captured) with
//! a *seam* after each (run eagerly, with the step's fresh metadata): a decode step is one
//! piece holding everything; a prefill or mixed step splits at every attention call, so
//! attention — whose launch depends on how the tokens split into sequences — runs eagerly
//! between captured pieces. Entries are keyed by (phase, bucket); all of them draw their
//! intermediates from one arena, so graph memory is the largest entry's, not the sum.
//!
//! Nothing here knows the model: a step is anything implementing [`Pieces`]. The
//! executor also keeps the capture protocol: it calls the step's [`StepHooks`] before a
//! step, after each segment, and around a capture.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use crate::backend::{Backend, Graph};
use crate::error::{Error, Result};
use crate::graph::StepHooks;
use crate::memory::{Arena, ArenaStats, CaptureMemory, GraphMemory};

/// Which kind of step a graph serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// Every sequence adds one token: one full graph per batch-size bucket.
    Decode,
    /// A decode bucket's graph stopping at the logits, for steps with allowed-token
    /// masks: their sampling runs after the graph, once the host has written the masks
    /// while the graph ran. Captured on a bucket's first such step.
    DecodeLogits,
    /// Prefill, chunked prefill and decode rows together: pieces per token-count bucket,
    /// attention eager between them.
    Mixed,
    /// Speculative decoding's verify steps: one full graph per batch-size bucket `B`,
    /// `B * (k + 1)` token rows (each sequence's last token and up to `k` drafts, or one
    /// decode token) and as many sampling rows, attention through the prefill path.
    Verify,
    /// A verify graph stopping at the logits, for verify steps with masks (structured
    /// outputs); captured on a bucket's first such step.
    VerifyLogits,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::Decode => "decode",
            Phase::DecodeLogits => "decode (logits)",
            Phase::Mixed => "mixed",
            Phase::Verify => "verify",
            Phase::VerifyLogits => "verify (logits)",
        })
    }
}

/// What a captured entry serves: a phase and its bucket (sequences for decode, tokens
/// for mixed steps).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub phase: Phase,
    pub bucket: usize,
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.phase, self.bucket)
    }
}

/// One step, split into pieces and seams. Pieces are captured (so they must only enqueue
/// capturable work over buffers whose addresses do not change from step to step); seam
/// `i` runs eagerly after piece `i`, also after a replay.
pub trait Pieces {
    /// What the pieces work in: the step's intermediates, allocated from the arena.
    type State;
    /// Allocate the step's intermediates (always in the same order: a warm-up and the
    /// capture after it must get the same addresses).
    fn alloc(&self, arena: &mut Arena) -> Result<Self::State>;
    fn count(&self) -> usize;
    fn piece(&self, state: &Self::State, i: usize) -> Result<()>;
    fn seam(&self, state: &Self::State, i: usize) -> Result<()>;
    /// What the executor tells about the step's progress (see [`StepHooks`]); `None`:
    /// nobody listens.
    fn hooks(&self) -> Option<&dyn StepHooks> {
        None
    }
}

/// The hooks of `step`'s listener, each a no-op when there is none.
struct Hooks<'a>(Option<&'a dyn StepHooks>);

impl Hooks<'_> {
    fn of<P: Pieces>(step: &P) -> Hooks<'_> {
        Hooks(step.hooks())
    }

    fn begin_step(&self, be: &dyn Backend) -> Result<()> {
        self.0.map_or(Ok(()), |h| h.begin_step(be))
    }

    fn end_segment(&self, be: &dyn Backend) -> Result<()> {
        self.0.map_or(Ok(()), |h| h.end_segment(be))
    }

    fn begin_capture(&self) {
        if let Some(h) = self.0 {
            h.begin_capture();
        }
    }

    fn end_capture(&self) {
        if let Some(h) = self.0 {
            h.end_capture();
        }
    }
}

/// What one key's graphs did so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GraphStats {
    /// Steps that replayed an existing entry.
    pub hits: usize,
    /// Steps that had to capture first.
    pub misses: usize,
    pub captures: usize,
    /// Graphs captured (pieces of every capture).
    pub pieces: usize,
    pub capture_secs: f64,
    /// Rows (sequences for decode, tokens for mixed steps) run in graphs, and how many of
    /// them were padding.
    pub rows: usize,
    pub padded_rows: usize,
    /// Replays checked against eager, and the largest error seen.
    pub verified: usize,
    pub max_verify_error: f64,
}

impl GraphStats {
    fn add(&mut self, o: &GraphStats) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.captures += o.captures;
        self.pieces += o.pieces;
        self.capture_secs += o.capture_secs;
        self.rows += o.rows;
        self.padded_rows += o.padded_rows;
        self.verified += o.verified;
        self.max_verify_error = self.max_verify_error.max(o.max_verify_error);
    }
}

/// Fields drop in order: the graphs go before the memory they point into.
struct Entry<S> {
    graphs: Vec<Box<dyn Graph>>,
    state: S,
    /// The entry's intermediates stay mapped while this lives.
    memory: CaptureMemory,
}

/// Captured entries, the arena they share, and per-key statistics.
pub struct Executor<S> {
    arena: Arena,
    entries: BTreeMap<Key, Entry<S>>,
    stats: BTreeMap<Key, GraphStats>,
    /// Keys captured ahead of the replay that needed them ([`Executor::capture_ahead`]):
    /// that replay counts as the miss.
    ahead: BTreeSet<Key>,
}

impl<S> Executor<S> {
    /// An executor whose steps may use up to `arena_bytes` of intermediates at once.
    pub fn new(be: &dyn Backend, arena_bytes: usize, memory: GraphMemory) -> Result<Self> {
        Ok(Executor {
            arena: Arena::for_graphs(be, arena_bytes, memory)?,
            entries: BTreeMap::new(),
            stats: BTreeMap::new(),
            ahead: BTreeSet::new(),
        })
    }

    /// Drop every entry (their memory returns to the arena's pool) and the statistics.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.stats.clear();
        self.ahead.clear();
    }

    /// Capture `key` from `warm`, a step of the key's shape whose results do not matter
    /// (capturing runs it eagerly once), unless it is captured already; the next
    /// [`Executor::replay`] of `key` counts as its miss. For steps with side effects
    /// that must happen once (a replay after a capture from the step itself would run
    /// them twice).
    pub fn capture_ahead<P: Pieces<State = S>>(
        &mut self,
        be: &dyn Backend,
        key: Key,
        warm: &P,
    ) -> Result<()> {
        if self.entries.contains_key(&key) {
            return Ok(());
        }
        self.capture(be, key, warm)?;
        self.ahead.insert(key);
        Ok(())
    }

    /// Run `step` eagerly in a fresh arena epoch: the step begins, then piece 0, seam 0,
    /// piece 1, ..., each ending a segment.
    pub fn eager<P: Pieces<State = S>>(&mut self, be: &dyn Backend, step: &P) -> Result<S> {
        let hooks = Hooks::of(step);
        hooks.begin_step(be)?;
        self.arena.reset();
        let state = step.alloc(&mut self.arena)?;
        for i in 0..step.count() {
            step.piece(&state, i)?;
            hooks.end_segment(be)?;
            step.seam(&state, i)?;
            hooks.end_segment(be)?;
        }
        Ok(state)
    }

    pub fn contains(&self, key: Key) -> bool {
        self.entries.contains_key(&key)
    }

    /// Capture `key` from `step` (whose inputs must already be in place) unless it is
    /// captured: one eager run first (it plans GEMMs and loads lazily loaded kernels
    /// outside the capture, and maps the memory the capture will use: same shapes, same
    /// allocation order), then each piece into its own graph. Nothing is replayed.
    pub fn capture<P: Pieces<State = S>>(
        &mut self,
        be: &dyn Backend,
        key: Key,
        step: &P,
    ) -> Result<()> {
        if self.entries.contains_key(&key) {
            return Ok(());
        }
        self.eager(be, step)?;
        let expect = self.arena.used();
        let t = Instant::now();
        self.arena.begin_capture(expect)?;
        let captured = Self::capture_pieces(be, &mut self.arena, step);
        let memory = self.arena.end_capture();
        let (graphs, state) = captured?;
        let memory = memory?;
        let s = self.stats.entry(key).or_default();
        s.captures += 1;
        s.pieces += graphs.len();
        s.capture_secs += t.elapsed().as_secs_f64();
        self.entries.insert(
            key,
            Entry {
                graphs,
                state,
                memory,
            },
        );
        Ok(())
    }

    /// Each piece into its own graph, its segment ended inside the capture; the hooks
    /// hear the capture begin and end.
    fn capture_pieces<P: Pieces<State = S>>(
        be: &dyn Backend,
        arena: &mut Arena,
        step: &P,
    ) -> Result<(Vec<Box<dyn Graph>>, S)> {
        let hooks = Hooks::of(step);
        let state = step.alloc(arena)?;
        let mut graphs = Vec::with_capacity(step.count());
        hooks.begin_capture();
        let captured = (|| {
            for i in 0..step.count() {
                be.begin_capture()?;
                let enqueued = step.piece(&state, i).and_then(|()| hooks.end_segment(be));
                let graph = be.end_capture();
                enqueued?;
                graphs.push(graph?);
            }
            Ok(())
        })();
        hooks.end_capture();
        captured.map(|()| (graphs, state))
    }

    /// Replay `key` (capturing it first if needed) for a step of `real` rows of its
    /// `key.bucket`: each piece's graph, each followed by its seam run eagerly by `step`
    /// (built over the same input layout as the capture), each seam ending a segment.
    /// The step begins first, unless it was captured for this replay (the capture's eager
    /// run began it). Returns the entry's state.
    pub fn replay<P: Pieces<State = S>>(
        &mut self,
        be: &dyn Backend,
        key: Key,
        real: usize,
        step: &P,
    ) -> Result<&S> {
        if real > key.bucket {
            return Err(Error::invalid(
                "graph::Executor",
                format!("{real} rows do not fit bucket {key}"),
            ));
        }
        let captured_ahead = self.ahead.remove(&key);
        let miss = !self.entries.contains_key(&key) || captured_ahead;
        let hooks = Hooks::of(step);
        if !self.entries.contains_key(&key) {
            self.capture(be, key, step)?;
        } else if !captured_ahead {
            hooks.begin_step(be)?;
        }
        let s = self.stats.entry(key).or_default();
        if miss {
            s.misses += 1;
        } else {
            s.hits += 1;
        }
        s.rows += key.bucket;
        s.padded_rows += key.bucket - real;
        let e = &self.entries[&key];
        if e.graphs.len() != step.count() {
            return Err(Error::invalid(
                "graph::Executor",
                format!(
                    "{key} was captured with {} pieces, the step has {}",
                    e.graphs.len(),
                    step.count()
                ),
            ));
        }
        for (i, g) in e.graphs.iter().enumerate() {
            g.replay()?;
            step.seam(&e.state, i)?;
            hooks.end_segment(be)?;
        }
        Ok(&e.state)
    }

    /// Compare a replay's f32 outputs (rows of `width`) with an eager run of the same
    /// step; fail naming the key and row when a row's normalised error exceeds `tol`.
    pub fn verify(
        &mut self,
        key: Key,
        replayed: &[f32],
        eager: &[f32],
        width: usize,
        tol: f64,
    ) -> Result<()> {
        let mut worst = 0f64;
        for (row, (a, r)) in replayed
            .chunks(width.max(1))
            .zip(eager.chunks(width.max(1)))
            .enumerate()
        {
            let num: f64 = a.iter().zip(r).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
            let den: f64 = r
                .iter()
                .map(|y| (*y as f64).powi(2))
                .sum::<f64>()
                .max(f64::MIN_POSITIVE);
            let e = (num / den).sqrt();
            if e.is_nan() || e > tol {
                return Err(Error::invalid(
                    "verify-graphs",
                    format!("{key}, row {row}: replayed output differs from eager by {e:.3e} (tolerance {tol:.0e})"),
                ));
            }
            worst = worst.max(e);
        }
        let s = self.stats.entry(key).or_default();
        s.verified += 1;
        s.max_verify_error = s.max_verify_error.max(worst);
        Ok(())
    }

    /// Statistics per key, ascending by key.
    pub fn stats(&self) -> &BTreeMap<Key, GraphStats> {
        &self.stats
    }

    /// Statistics summed over keys (of one phase, or all).
    pub fn total(&self, phase: Option<Phase>) -> GraphStats {
        let mut t = GraphStats::default();
        for (k, s) in &self.stats {
            if phase.is_none_or(|p| p == k.phase) {
                t.add(s);
            }
        }
        t
    }

    /// Each captured key with its capture's arena need in bytes, ascending by key.
    pub fn captured(&self) -> Vec<(Key, usize)> {
        self.entries
            .iter()
            .map(|(&k, e)| (k, e.memory.bytes))
            .collect()
    }

    /// Physical and virtual bytes of the graph memory (the arena's pool, including what
    /// only captured entries hold), and the time spent mapping.
    pub fn memory_stats(&self) -> ArenaStats {
        self.arena.stats()
    }
}
