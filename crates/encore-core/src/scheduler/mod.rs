//! Continuous batching: requests join and leave between steps. Each step the scheduler
//! fills a token budget (`max_num_batched_tokens`) and a sequence budget (`max_num_seqs`)
//! — running sequences first, in arrival order (a decode token each, or the next chunk of
//! a prompt still prefilling), then waiting requests, in arrival order, as far as the
//! budgets and the free KV blocks allow (a long prompt is prefilled in chunks, mixed with
//! the decodes of the others) — and runs it as one runner step.
//!
//! When a running sequence needs a KV block and none is free, the newest running sequence
//! is preempted: its blocks are freed and it goes back to the front of the queue, to be
//! recomputed (its prompt and the tokens it already produced) when blocks free up. No
//! token is lost or repeated: a sequence only produces a token when a step reaches the end
//! of everything it holds, and sampling depends only on the request's seed and the
//! token's index.
//!
//! With prefix caching on, a request being admitted (fresh, or again after a preemption)
//! starts from the longest run of cached full KV blocks holding a prefix of its tokens
//! (`BlockManager::lookup`) and computes only the rest; after each step the scheduler
//! commits every sequence's computed tokens, so blocks that filled up — with prompt or
//! produced tokens — become cached for later requests. Requests that share their prompt
//! (`RequestParams::share_prompt`, the `n` samples of one API request) wait while one of
//! them computes it, then start from its cached blocks.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use rayon::prelude::*;

use crate::constraint::{ConstraintCompiler, TokenConstraint};
use crate::error::{Error, Result};
use crate::kv::{BlockManager, PrefixHit, SeqId};
use crate::request::{FinishReason, Limits, Output, Param, Refusal, Request, TokenLogprobs};
use crate::runner::{Runner, Score, SeqStep, Seqs};
use crate::spec::draft::{DraftRequest, Drafter};
use crate::spec::ngram::NgramIndex;
use crate::spec::Proposer;

mod overlap;
mod plan;

/// The scheduler's budgets and policies.
#[derive(Clone, Copy, Debug)]
pub struct SchedulerConfig {
    /// Tokens in one step at most (<= the runner's `max_tokens_per_step`).
    pub max_num_batched_tokens: usize,
    /// Sequences in one step at most (<= the runner's `max_seqs`).
    pub max_num_seqs: usize,
    /// Reuse cached full KV blocks of earlier sequences with the same prefix (see the
    /// module docs); off, every request computes all its tokens.
    pub prefix_cache: bool,
    /// Speculative decoding: a decoding sequence (its logit bias and penalties apply to
    /// every verify row; with penalties, as many drafts as free penalty slots) gets drafts from the proposer (n-grams of its own tokens,
    /// [`crate::spec::ngram`], or a draft model, [`crate::spec::draft`], which
    /// [`Scheduler::step_with`] is given; under a constraint, the tokens it forces or the
    /// proposals it allows), and a verify step samples after each ([`SeqStep::verify`]); each draft equal to the target's sample there is kept, then
    /// the target's own sample. The tokens are those decoding one at a time gives, sampled
    /// or greedy (each position's sample uses that token's seed either way). `None`: off.
    pub speculative: Option<Proposer>,
    /// No sequence speculates in a step planned while more than this many run (vLLM's
    /// `speculative_disable_by_batch_size`: a large batch is compute-bound, and a verify
    /// step past the verify graphs' buckets runs eagerly); 0: no limit.
    pub speculative_max_batch: usize,
}

impl SchedulerConfig {
    /// These budgets, with prefix caching on.
    pub fn new(max_num_batched_tokens: usize, max_num_seqs: usize) -> Self {
        SchedulerConfig {
            max_num_batched_tokens,
            max_num_seqs,
            prefix_cache: true,
            speculative: None,
            speculative_max_batch: 0,
        }
    }
}

/// What the scheduler did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    pub steps: u64,
    /// Tokens run through the model (prompt tokens, recomputed tokens and decode tokens).
    pub tokens_computed: u64,
    pub preemptions: u64,
    pub finished: u64,
    pub aborted: u64,
    /// Prompt tokens looked up in the prefix cache (each request's prompt, once, when it
    /// is first admitted; 0 with prefix caching off).
    pub prefix_queried_tokens: u64,
    /// Of those, tokens found cached (not computed): the hit ratio is
    /// `prefix_hit_tokens / prefix_queried_tokens`.
    pub prefix_hit_tokens: u64,
    /// Speculative decoding: drafts verified, and of those kept (the acceptance rate is
    /// `drafts_accepted / drafts_proposed`).
    pub drafts_proposed: u64,
    pub drafts_accepted: u64,
    /// Verify chunks run (a sequence's drafts in one step): the mean tokens a verify emits
    /// is `1 + drafts_accepted / verifications`.
    pub verifications: u64,
    /// Times a sequence stopped speculating for a while because too few of its drafts
    /// were kept ([`Proposer::min_acceptance`]).
    pub spec_pauses: u64,
    /// Steps launched while the one before was still running (asynchronous scheduling).
    pub overlapped: u64,
}

/// A masked row's constraint, taken out of its sequence for a step (whose inputs borrow
/// the sequences): the sequence's row in the step, the constraint, and the token it has
/// yet to advance by.
struct Held {
    row: usize,
    constraint: Box<dyn TokenConstraint>,
    pending: Vec<u32>,
    /// A verify chunk's drafts: its rows' masks are computed through them, then rolled
    /// back.
    drafts: Vec<u32>,
}

/// A live request.
struct Seq {
    req: Request,
    seq: SeqId,
    /// The prompt, then every token produced so far.
    tokens: Vec<u32>,
    /// Tokens whose KV is in the cache (0 after a preemption, until it is admitted
    /// again).
    computed: usize,
    /// Whether it was ever admitted (its prompt was counted in the prefix statistics).
    admitted: bool,
    /// The request's compiled constraint (kept through preemption), and the tokens
    /// produced since it last advanced (the last one, or a verify step's run), which it
    /// advances by only when it writes the next mask (with that mask, while the device
    /// runs the next step, not between the steps) or checks drafts.
    constraint: Option<Box<dyn TokenConstraint>>,
    pending: Vec<u32>,
    /// The prompt's log-probabilities scored so far (one per prompt token after the
    /// first, [`crate::request::SamplingParams::prompt_logprobs`]); `None` once they
    /// went out with the first output (or were never asked for).
    prompt_lp: Option<Vec<TokenLogprobs>>,
    /// Speculative decoding: its n-gram index (made at its first proposal), and how many
    /// drafts sit at the end of `tokens` for the step being planned (0: none).
    ngram: Option<NgramIndex>,
    drafts: usize,
    /// How its drafts fare: see [`Backoff`].
    backoff: Backoff,
    /// Asynchronous scheduling: its last token stands in for the sample of the step in
    /// flight — its index in `tokens` and its sample row there ([`overlap`]).
    ahead: Option<(usize, usize)>,
}

/// Speculation that does not pay stops for a while: a sequence keeps a moving average of
/// the share of its drafts kept; below its proposer's [`Proposer::min_acceptance`] it
/// decodes plainly for `pause` steps, then proposes again from an average of 0.5 (a retry
/// that keeps nothing pauses again after two verify steps under a draft model, five under
/// n-grams). The pause is 8 steps, doubling up to 64 while the average has not climbed
/// back to 0.5 since the last pause.
#[derive(Clone, Copy, Debug)]
struct Backoff {
    kept: f32,
    pause: u32,
    next: u32,
}

impl Backoff {
    const FIRST: u32 = 8;
    const MAX: u32 = 64;
    /// The weight of the latest verify step in the average.
    const WEIGHT: f32 = 0.3;
    /// The average a retry starts from; climbing back to it ends a run of pauses.
    const RESTART: f32 = 0.5;

    fn new() -> Self {
        Backoff {
            kept: 1.0,
            pause: 0,
            next: Self::FIRST,
        }
    }

    /// After a verify step that kept `kept` of `drafts`: whether it pauses now.
    fn verified(&mut self, kept: usize, drafts: usize, min: f32) -> bool {
        let share = kept as f32 / drafts.max(1) as f32;
        self.kept = (1.0 - Self::WEIGHT) * self.kept + Self::WEIGHT * share;
        if self.kept >= Self::RESTART {
            self.next = Self::FIRST;
        }
        if self.kept >= min {
            return false;
        }
        self.pause = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        self.kept = Self::RESTART;
        true
    }

    /// After a plain decode step.
    fn decoded(&mut self) {
        self.pause = self.pause.saturating_sub(1);
    }
}

impl Seq {
    fn produced(&self) -> usize {
        self.tokens.len() - self.req.prompt.len()
    }

    /// Whether its tokens (a stand-in for the step in flight's sample among them) reach
    /// its `max_tokens` or the context: that step ends it, so none is planned after.
    fn ends_by_length(&self, max_seq_len: usize) -> bool {
        self.produced() >= self.req.params.max_tokens || self.tokens.len() >= max_seq_len
    }

    /// Whether `token`, which makes the sequence `len` tokens long, ends it: a stop
    /// token, its `max_tokens`, or the context.
    fn finish_at(&self, token: u32, len: usize, max_seq_len: usize) -> Option<FinishReason> {
        let p = &self.req.params;
        if !p.ignore_eos && p.stop_token_ids.contains(&token) {
            Some(FinishReason::Eos)
        } else if len - self.req.prompt.len() >= p.max_tokens {
            Some(FinishReason::Length)
        } else if len >= max_seq_len {
            Some(FinishReason::Context)
        } else {
            None
        }
    }

    /// Speculative decoding: how many drafts it may verify in its next step (0: none),
    /// when it is decoding (one token to compute) and its sampling allows it: as many as
    /// fit `budget` tokens, `rows` sampling rows, its `max_tokens` and `max_seq_len`, and
    /// `k`. None when drafts are already there.
    fn draft_cap(&self, k: usize, budget: usize, rows: usize, max_seq_len: usize) -> usize {
        let p = &self.req.params;
        let eligible = self.drafts == 0
            && self.backoff.pause == 0
            && self.tokens.len() == self.computed + 1
            && !self.scoring();
        if !eligible {
            return 0;
        }
        // Room for the drafts and the target's token after them.
        k.min(p.max_tokens.saturating_sub(self.produced() + 1))
            .min(max_seq_len.saturating_sub(self.tokens.len() + 1))
            .min(budget.saturating_sub(1))
            .min(rows.saturating_sub(1))
    }

    /// Append up to `cap` of `drafts` to `tokens` for its next step (`drafts`). Under a
    /// constraint (advanced by its pending tokens first), the tokens it forces replace
    /// them, and they are cut before the first one it rejects; none when it failed.
    fn add_drafts(&mut self, mut drafts: Vec<u32>, cap: usize) {
        if let Some(c) = &mut self.constraint {
            // A failed commit leaves the constraint failed: its next mask ends the request.
            if self
                .pending
                .drain(..)
                .try_for_each(|t| c.commit(t))
                .is_err()
            {
                return;
            }
            let forced = c.forced();
            if !forced.is_empty() {
                drafts = forced;
            }
            drafts.truncate(cap);
            let ok = c.validate(&drafts);
            drafts.truncate(ok);
        }
        drafts.truncate(cap);
        self.drafts = drafts.len();
        self.tokens.extend(drafts);
    }

    /// Whether a step may be planned for it before the one in flight is read
    /// ([`overlap`]): no constraint (its mask needs the token), scored prompt or drafts.
    /// Penalties may (a step's row counts its sample into the sequence's slot on the
    /// device, by position), and log-probabilities (read with the samples).
    fn plain(&self) -> bool {
        self.constraint.is_none() && !self.scoring() && self.drafts == 0
    }

    /// Whether its next chunk is scored (the prompt's log-probabilities are asked for
    /// and not out yet).
    fn scoring(&self) -> bool {
        self.prompt_lp.is_some()
    }

    /// Sampling rows a chunk of `take` tokens needs: one, or one per token when scored or
    /// verifying drafts.
    fn rows(&self, take: usize) -> usize {
        if self.scoring() || self.drafts > 0 {
            take
        } else {
            1
        }
    }

    /// The most tokens its next chunk may take with `rows` sampling rows left.
    fn max_take(&self, rows: usize) -> usize {
        if self.scoring() || self.drafts > 0 {
            rows
        } else {
            usize::MAX
        }
    }
}

pub struct Scheduler {
    cfg: SchedulerConfig,
    /// The live sequences' KV blocks and penalty slots (the runner reads them each step).
    seqs: Seqs,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    next_seq: u64,
    stats: SchedulerStats,
    /// Compiles requests' constraints; `None`: a request with one is refused.
    constraints: Option<Arc<ConstraintCompiler>>,
    /// Requests that ended with an error since the last [`Scheduler::take_failed`].
    failed: Vec<(u64, String)>,
    /// Asynchronous scheduling ([`overlap`]): the step launched and not yet collected.
    inflight: Option<overlap::InFlight>,
    /// A step planned ahead stopped at a full KV cache: the next runs synchronously,
    /// where it may preempt.
    tight: bool,
}

impl Scheduler {
    /// A scheduler for `runner`'s sizes, owning the KV blocks of its cache and its penalty
    /// slots; the budgets must fit the runner.
    pub fn new(cfg: SchedulerConfig, runner: &Runner<'_>) -> Result<Self> {
        Self::with_seqs(cfg, runner, Seqs::for_runner(runner)?)
    }

    /// [`Scheduler::new`] over `seqs`, the blocks and penalty slots of an earlier
    /// scheduler of the same runner ([`Scheduler::into_seqs`]): its cached prefixes stay
    /// cached.
    pub fn with_seqs(cfg: SchedulerConfig, runner: &Runner<'_>, seqs: Seqs) -> Result<Self> {
        let r = runner.config();
        let blocks = &seqs.blocks;
        if (blocks.num_blocks(), blocks.block_size()) != (r.num_blocks, r.block_size) {
            return Err(Error::invalid(
                "scheduler",
                format!(
                    "blocks of {} x {} tokens do not match the runner's KV cache of {} x {}",
                    blocks.num_blocks(),
                    blocks.block_size(),
                    r.num_blocks,
                    r.block_size
                ),
            ));
        }
        if cfg.max_num_batched_tokens == 0
            || cfg.max_num_seqs == 0
            || cfg.max_num_batched_tokens > r.max_tokens_per_step
            || cfg.max_num_seqs > r.max_seqs
        {
            return Err(Error::invalid(
                "scheduler",
                format!(
                    "budgets of {} tokens / {} sequences per step must be >= 1 and within the runner's {} / {}",
                    cfg.max_num_batched_tokens, cfg.max_num_seqs, r.max_tokens_per_step, r.max_seqs
                ),
            ));
        }
        if let Some(p) = cfg.speculative {
            let max = crate::spec::ngram::MAX_SPECULATIVE_TOKENS;
            if p.k() == 0 || p.k() > max {
                return Err(Error::invalid(
                    "--num-speculative-tokens",
                    format!("{} drafts a step: 1 to {max}", p.k()),
                ));
            }
        }
        Ok(Scheduler {
            cfg,
            seqs,
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_seq: 0,
            stats: SchedulerStats::default(),
            constraints: None,
            failed: Vec::new(),
            inflight: None,
            tight: false,
        })
    }

    /// Compile requests' constraints with `c` (the model's tokenizer indexed once); without
    /// it a request with a constraint is refused.
    pub fn set_constraint_compiler(&mut self, c: Arc<ConstraintCompiler>) {
        self.constraints = Some(c);
    }

    /// The requests that ended with an error since the last call (a constraint that allows
    /// no token, or failed), with the error; their blocks are already free and they
    /// produce nothing more.
    pub fn take_failed(&mut self) -> Vec<(u64, String)> {
        std::mem::take(&mut self.failed)
    }

    /// Queue a request. Refused, naming the parameter, when it can never run (see
    /// [`Limits::check`]) or its id is already live.
    pub fn add(&mut self, req: Request, runner: &Runner<'_>) -> Result<(), Refusal> {
        self.limits(runner).check(&req)?;
        if self.live().any(|s| s.req.id == req.id) {
            let m = format!("{} is already live", req.id);
            return Err(Refusal::new(req.id, Param::Id, m));
        }
        let constraint = match &req.params.constraint {
            None => None,
            Some(c) => {
                let Some(compiler) = &self.constraints else {
                    let m = "is not supported by this engine (no constraint compiler)";
                    return Err(Refusal::new(req.id, Param::Constraint, m));
                };
                let m = |e| format!("is invalid: {e}");
                Some(
                    compiler
                        .compile(c)
                        .map_err(|e| Refusal::new(req.id, Param::Constraint, m(e)))?,
                )
            }
        };
        let prompt_lp = req.params.sampling.prompt_logprobs.map(|_| Vec::new());
        let seq = SeqId(self.next_seq);
        self.next_seq += 1;
        self.waiting.push_back(Seq {
            tokens: req.prompt.clone(),
            req,
            seq,
            computed: 0,
            admitted: false,
            constraint,
            pending: Vec::new(),
            prompt_lp,
            ngram: None,
            drafts: 0,
            backoff: Backoff::new(),
            ahead: None,
        });
        Ok(())
    }

    /// The admission rules of `runner`'s sizes and this scheduler's KV cache.
    pub fn limits(&self, runner: &Runner<'_>) -> Limits {
        Limits {
            vocab_size: runner.model().cfg.vocab_size,
            max_seq_len: runner.config().max_seq_len,
            block_size: self.seqs.blocks.block_size(),
            usable_blocks: self.seqs.blocks.num_usable_blocks(),
            penalty_slots: runner.config().penalty_slots,
        }
    }

    fn live(&self) -> impl Iterator<Item = &Seq> {
        self.waiting.iter().chain(&self.running)
    }

    /// Drop request `id` wherever it is, freeing its KV blocks; whether it was live.
    pub fn abort(&mut self, id: u64) -> Result<bool> {
        let live = self.remove(id)?;
        self.stats.aborted += u64::from(live);
        Ok(live)
    }

    /// End request `id` early as finished (its caller found a stop string in its text),
    /// freeing its KV blocks; whether it was live.
    pub fn finish(&mut self, id: u64) -> Result<bool> {
        let live = self.remove(id)?;
        self.stats.finished += u64::from(live);
        Ok(live)
    }

    fn remove(&mut self, id: u64) -> Result<bool> {
        if let Some(i) = self.waiting.iter().position(|s| s.req.id == id) {
            self.waiting.remove(i);
        } else if let Some(i) = self.running.iter().position(|s| s.req.id == id) {
            let s = self.running.remove(i);
            self.seqs.release(s.seq)?;
        } else {
            return Ok(false);
        }
        Ok(true)
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty() || self.inflight.is_some()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn stats(&self) -> SchedulerStats {
        self.stats
    }

    /// The KV blocks of the live sequences (and the prefix cache).
    pub fn blocks(&self) -> &BlockManager {
        &self.seqs.blocks
    }

    /// Penalty slots free now (of the runner's `penalty_slots`).
    pub fn free_penalty_slots(&self) -> usize {
        self.seqs.free_penalty_slots()
    }

    /// The live sequences' KV blocks and penalty slots.
    pub fn seqs(&self) -> &Seqs {
        &self.seqs
    }

    /// End the scheduler: every live request is dropped (its blocks and penalty slot
    /// freed), and the blocks with their cached prefixes come back for a later scheduler
    /// ([`Scheduler::with_seqs`]).
    pub fn into_seqs(mut self) -> Result<Seqs> {
        for s in std::mem::take(&mut self.running) {
            self.seqs.release(s.seq)?;
        }
        Ok(self.seqs)
    }

    /// Preempt the newest running sequence: free its blocks and queue it first, to be
    /// recomputed (with prefix caching, from those of its blocks still cached when it is
    /// admitted again).
    fn preempt_newest(&mut self) -> Result<()> {
        let mut s = self.running.pop().expect("a running sequence to preempt");
        self.seqs.release(s.seq)?;
        s.computed = 0;
        s.tokens.truncate(s.tokens.len() - s.drafts);
        s.drafts = 0;
        // A prompt being scored is scored again from its start.
        if let Some(lp) = &mut s.prompt_lp {
            lp.clear();
        }
        self.waiting.push_front(s);
        self.stats.preemptions += 1;
        Ok(())
    }

    /// The draft model's drafts for the running sequences that may speculate in the next
    /// step: each one's cap as the step's budgets would give it were every one before it
    /// to take its whole share (the step may cut a proposal shorter). The drafter first
    /// forgets the sequences no longer running.
    fn run_drafter(
        &mut self,
        drafter: &mut Drafter<'_>,
        target: &Runner<'_>,
        k: usize,
        max_rows: usize,
        max_seq_len: usize,
    ) -> Result<HashMap<SeqId, Vec<u32>>> {
        drafter.retain(|seq| self.running.iter().any(|s| s.seq == seq))?;
        let (mut budget, mut rows) = (self.cfg.max_num_batched_tokens, max_rows);
        let mut reqs = Vec::new();
        let eagle = drafter.is_eagle();
        for s in &self.running {
            if budget == 0 || rows == 0 {
                // An EAGLE head still catches up on what the target's last step computed.
                if eagle {
                    reqs.push(DraftRequest {
                        seq: s.seq,
                        tokens: &s.tokens,
                        max_drafts: 0,
                    });
                }
                continue;
            }
            let cap = s.draft_cap(k, budget, rows, max_seq_len);
            let take = if cap > 0 {
                cap + 1
            } else {
                (s.tokens.len() - s.computed).max(1)
            };
            budget = budget.saturating_sub(take);
            rows = rows.saturating_sub(if cap > 0 { take } else { 1 });
            // An EAGLE head sees every sequence's tokens as the target computes them.
            if cap > 0 || eagle {
                reqs.push(DraftRequest {
                    seq: s.seq,
                    tokens: &s.tokens,
                    max_drafts: cap,
                });
            }
        }
        if reqs.is_empty() {
            return Ok(HashMap::new());
        }
        let drafts = drafter.propose(&reqs, target)?;
        Ok(reqs.iter().map(|r| r.seq).zip(drafts).collect())
    }

    /// Run one step: schedule, run it on `runner`, and return the new tokens (at most one
    /// per sequence; a prompt chunk that does not reach the end produces none). Finished
    /// sequences free their blocks. An empty vector when nothing could run.
    pub fn step(&mut self, runner: &mut Runner<'_>) -> Result<Vec<Output>> {
        self.step_with(runner, None)
    }

    /// [`Scheduler::step`] with the draft model of [`Proposer::Draft`] (without it, no
    /// sequence speculates under that proposer).
    pub fn step_with(
        &mut self,
        runner: &mut Runner<'_>,
        drafter: Option<&mut Drafter<'_>>,
    ) -> Result<Vec<Output>> {
        if self.overlapping(runner, drafter.is_some()) {
            return self.step_overlapped(runner);
        }
        // A step still in flight is read first: the synchronous step may preempt.
        let mut outputs = self.drain(runner)?;
        self.tight = false;
        let plan = self.schedule(runner, drafter, false)?;
        if !plan.is_empty() {
            outputs.extend(self.run_plan(runner, &plan)?);
        }
        Ok(outputs)
    }

    /// End running sequence `i` with error `e`, freeing its blocks.
    fn fail_running(&mut self, i: usize, e: String) -> Result<()> {
        let s = self.running.remove(i);
        self.seqs.release(s.seq)?;
        self.stats.aborted += 1;
        self.failed.push((s.req.id, e));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Backoff;

    /// Verify steps that keep nothing pause a draft-model sequence after four of them
    /// (from an average of 1), then after two at each retry, for 8, 16, 32, 64 and 64
    /// steps; a verify that brings the average back to 0.5 starts over at 8.
    #[test]
    fn backoff_pauses_double_until_the_average_recovers() {
        let min = 0.3;
        let mut b = Backoff::new();
        let fails_to_pause = |b: &mut Backoff| {
            let mut n = 0;
            loop {
                n += 1;
                if b.verified(0, 4, min) {
                    return n;
                }
                assert!(n < 100);
            }
        };
        let mut pauses = Vec::new();
        let mut fails = Vec::new();
        for _ in 0..5 {
            fails.push(fails_to_pause(&mut b));
            pauses.push(b.pause);
            for _ in 0..b.pause {
                assert!(b.pause > 0);
                b.decoded();
            }
            assert_eq!(b.pause, 0);
        }
        assert_eq!(fails, vec![4, 2, 2, 2, 2]);
        assert_eq!(pauses, vec![8, 16, 32, 64, 64]);
        // A good run ends the streak: the next pause is 8 again.
        assert!(!b.verified(4, 4, min));
        assert!(b.kept >= 0.5);
        fails_to_pause(&mut b);
        assert_eq!(b.pause, 8);
        // n-grams (0.1): five verifies that keep nothing after a retry.
        let mut n = Backoff::new();
        n.kept = 0.5;
        let k = (1..).find(|_| n.verified(0, 4, 0.1)).unwrap();
        assert_eq!(k, 5);
    }
}
