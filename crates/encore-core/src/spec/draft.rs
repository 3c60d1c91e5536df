//! The draft-model proposer (`--speculative-method draft --draft-model ...`): a smaller
//! model with the target's vocabulary, run by a runner of its own (its own KV cache, its
//! own decode graphs), proposes each speculating sequence's drafts greedily.
//!
//! Per scheduler step, [`Drafter::propose`] takes every speculating sequence's tokens and
//! how many drafts it may have, and runs the draft model over all of them at once:
//! - **sync**: the draft's KV of a sequence holds a prefix of the tokens it was fed
//!   ([`Drafter`] remembers them); whatever no longer matches the sequence's tokens (the
//!   drafts the target rejected) is cut off its blocks, and the last token is always fed
//!   again so the step samples after it;
//! - **catch-up**: each sequence's tokens the draft has not seen (its prompt the first
//!   time, then the tokens emitted since) in chunks of the draft runner's token budget;
//!   the sample after a sequence's last token is its first draft;
//! - **rounds**: one decode step per further draft over the sequences that may have it,
//!   each fed its previous draft (replayed from the draft runner's decode graphs).
//!
//! Drafts are the draft model's argmax. Any proposer works with the scheduler's acceptance
//! (a draft is kept when it equals the target's sample at its position): the output is
//! that of decoding one token at a time, whatever the drafts. A sequence whose draft KV
//! cannot grow gets no drafts this step.

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::kv::SeqId;
use crate::model::config::ModelConfig;
use crate::request::SamplingParams;
use crate::runner::{Runner, SeqStep, Seqs};

/// A draft model's runner and the KV it holds per sequence.
pub struct Drafter<'b> {
    pub(super) runner: Runner<'b>,
    pub(super) seqs: Seqs,
    /// Per sequence, the tokens whose KV the draft's cache holds, in order (an EAGLE
    /// head's: the token after each position it holds).
    pub(super) fed: HashMap<SeqId, Vec<u32>>,
    /// An EAGLE-3 head's state ([`super::eagle`]); `None`: a draft model.
    pub(super) eagle: Option<super::eagle::Eagle>,
    /// Draft tokens proposed and draft-model steps run, for statistics.
    pub stats: DraftStats,
}

/// What the draft model did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DraftStats {
    /// Steps of the draft runner: catch-up steps and draft rounds.
    pub steps: u64,
    /// Tokens the draft model computed (catch-up and fed drafts).
    pub tokens: u64,
    /// Drafts proposed.
    pub drafts: u64,
    /// Wall time in [`Drafter::propose`], microseconds (it ends with the draft's sampled
    /// tokens read back, so this is the device's time too).
    pub micros: u64,
}

/// One sequence's request to [`Drafter::propose`]: its tokens (prompt and output so far)
/// and the most drafts it may have.
pub struct DraftRequest<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
    pub max_drafts: usize,
}

impl<'b> Drafter<'b> {
    /// A drafter over `runner` (the draft model's), checked against the target's:
    /// the vocabularies must be the same size and the draft must hold the target's
    /// longest sequence. Errors name `--draft-model`.
    pub fn new(runner: Runner<'b>, target: &Runner<'_>) -> Result<Self> {
        Self::checked(runner, target, None)
    }

    /// A drafter of `runner` and `eagle`'s state, checked against `target`: the pair
    /// ([`check_pair`]) and the longest sequence.
    fn checked(
        runner: Runner<'b>,
        target: &Runner<'_>,
        eagle: Option<super::eagle::Eagle>,
    ) -> Result<Self> {
        check_pair(&target.model().cfg, &runner.model().cfg)?;
        let (tl, dl) = (target.config().max_seq_len, runner.config().max_seq_len);
        if dl < tl {
            return Err(Error::invalid(
                "--draft-model",
                format!("the draft runner holds {dl} tokens a sequence, the target {tl}"),
            ));
        }
        let seqs = Seqs::for_runner(&runner)?;
        Ok(Drafter {
            runner,
            seqs,
            fed: HashMap::new(),
            eagle,
            stats: DraftStats::default(),
        })
    }

    /// A drafter over the EAGLE-3 head `runner` runs (booted with the target's
    /// embedding), with the vocabulary map `d2t` ([`super::eagle::read_d2t`]), checked
    /// against the target's runner: its vocabulary and hidden size, the hidden states it
    /// captures, and its longest sequence. Errors name `--draft-model`.
    pub fn eagle(runner: Runner<'b>, target: &Runner<'_>, d2t: Vec<i64>) -> Result<Self> {
        if !target.model().captures_aux() {
            return Err(Error::invalid(
                "--draft-model",
                "the target was booted without capturing the hidden states the EAGLE-3 head reads",
            ));
        }
        let eagle = super::eagle::Eagle::new(&runner, d2t)?;
        Self::checked(runner, target, Some(eagle))
    }

    /// Whether the drafter is an EAGLE-3 head (which sees every running sequence's
    /// tokens, drafting or not: [`Drafter::propose`]).
    pub fn is_eagle(&self) -> bool {
        self.eagle.is_some()
    }

    /// The draft model's runner.
    pub fn runner(&self) -> &Runner<'b> {
        &self.runner
    }

    /// Forget `seq` (it finished, was aborted or preempted): its draft KV is freed.
    pub fn release(&mut self, seq: SeqId) -> Result<()> {
        if self.fed.remove(&seq).is_some() {
            self.seqs.release(seq)?;
        }
        Ok(())
    }

    /// Forget every sequence but those `keep` accepts.
    pub fn retain(&mut self, keep: impl Fn(SeqId) -> bool) -> Result<()> {
        let gone: Vec<SeqId> = self.fed.keys().copied().filter(|&s| !keep(s)).collect();
        for seq in gone {
            self.release(seq)?;
        }
        Ok(())
    }

    /// Sequences whose draft KV is held.
    pub fn live(&self) -> usize {
        self.fed.len()
    }

    /// Up to `max_drafts` greedy drafts for each request (fewer where its draft KV
    /// cannot grow; none for a request with no tokens or `max_drafts` 0), in request
    /// order. See the module docs for the steps run; an EAGLE-3 head's are in
    /// [`super::eagle`] (it reads the hidden states of `target`'s last step, and catches
    /// up on a request of `max_drafts` 0 too).
    pub fn propose(
        &mut self,
        reqs: &[DraftRequest<'_>],
        target: &Runner<'_>,
    ) -> Result<Vec<Vec<u32>>> {
        let start = std::time::Instant::now();
        let out = match self.eagle {
            Some(_) => self.propose_eagle(reqs, target),
            None => self.propose_model(reqs),
        };
        self.stats.micros += start.elapsed().as_micros() as u64;
        out
    }

    /// [`Drafter::propose`] of a draft model.
    fn propose_model(&mut self, reqs: &[DraftRequest<'_>]) -> Result<Vec<Vec<u32>>> {
        let mut drafts: Vec<Vec<u32>> = vec![Vec::new(); reqs.len()];
        // Sync: the longest prefix of what was fed that the tokens still begin with, never
        // the last token (it is fed again, for its sample).
        let mut todo: Vec<usize> = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            if r.max_drafts == 0 || r.tokens.is_empty() {
                continue;
            }
            let fed = self.fed.entry(r.seq).or_default();
            if !self.seqs.blocks.contains(r.seq) {
                fed.clear();
                self.seqs.blocks.allocate(r.seq, 0)?;
            }
            let same = fed.iter().zip(r.tokens).take_while(|(a, b)| a == b).count();
            let keep = same.min(r.tokens.len() - 1);
            // Against the blocks' count, not `fed`'s: a failed step may have left them
            // longer.
            if keep < self.seqs.blocks.num_tokens(r.seq)? {
                self.seqs.blocks.truncate(r.seq, keep)?;
            }
            fed.truncate(keep);
            todo.push(i);
        }
        // Catch-up: each sequence's unseen tokens, in chunks of the draft's token budget;
        // the sample after its last is its first draft.
        let budget = self.runner.config().max_tokens_per_step;
        let max_seqs = self.runner.config().max_seqs;
        let mut pending = todo.clone();
        while !pending.is_empty() {
            let mut plan: Vec<(usize, usize, usize)> = Vec::new(); // (request, from, take)
            let mut left = budget;
            let mut next = Vec::new();
            for &i in &pending {
                let r = &reqs[i];
                let from = self.fed[&r.seq].len();
                let take = (r.tokens.len() - from).min(left);
                if take == 0 || plan.len() == max_seqs {
                    next.push(i);
                    continue;
                }
                if !self.seqs.blocks.can_append(r.seq, take) {
                    continue; // no room: no drafts for it this step
                }
                self.seqs.blocks.append(r.seq, take)?;
                left -= take;
                plan.push((i, from, take));
            }
            if plan.is_empty() {
                break;
            }
            let steps: Vec<SeqStep<'_>> = plan
                .iter()
                .map(|&(i, from, take)| greedy(reqs[i].seq, &reqs[i].tokens[from..from + take]))
                .collect();
            let sampled = self.runner.step(&mut self.seqs, &steps)?;
            self.stats.steps += 1;
            for (&(i, from, take), token) in plan.iter().zip(sampled) {
                let r = &reqs[i];
                self.stats.tokens += take as u64;
                self.fed
                    .get_mut(&r.seq)
                    .expect("synced above")
                    .extend_from_slice(&r.tokens[from..from + take]);
                if from + take == r.tokens.len() {
                    drafts[i].push(token);
                } else {
                    next.push(i);
                }
            }
            pending = next;
        }
        // Rounds: each further draft, one decode step over the sequences that may have it.
        loop {
            // Each one's slot taken as it is checked (two at a block boundary may not both
            // find a free block).
            let mut round: Vec<usize> = Vec::new();
            for &i in &todo {
                if round.len() == max_seqs {
                    break;
                }
                let wants = !drafts[i].is_empty() && drafts[i].len() < reqs[i].max_drafts;
                if wants && self.seqs.blocks.can_append(reqs[i].seq, 1) {
                    self.seqs.blocks.append(reqs[i].seq, 1)?;
                    round.push(i);
                }
            }
            if round.is_empty() {
                break;
            }
            let last: Vec<[u32; 1]> = round
                .iter()
                .map(|&i| [*drafts[i].last().expect("non-empty")])
                .collect();
            let steps: Vec<SeqStep<'_>> = round
                .iter()
                .zip(&last)
                .map(|(&i, t)| greedy(reqs[i].seq, t))
                .collect();
            let sampled = self.runner.step(&mut self.seqs, &steps)?;
            self.stats.steps += 1;
            self.stats.tokens += round.len() as u64;
            for ((&i, t), token) in round.iter().zip(&last).zip(sampled) {
                self.fed
                    .get_mut(&reqs[i].seq)
                    .expect("synced above")
                    .push(t[0]);
                drafts[i].push(token);
            }
        }
        self.stats.drafts += drafts.iter().map(|d| d.len() as u64).sum::<u64>();
        Ok(drafts)
    }
}

/// An error naming `--draft-model` unless a model of `draft` can draft for one of
/// `target`: the same vocabulary size (the same tokenizer, which the size stands for; the
/// target alone decides where a sequence ends).
pub fn check_pair(target: &ModelConfig, draft: &ModelConfig) -> Result<()> {
    const WHAT: &str = "--draft-model";
    if let Some(e) = &draft.eagle {
        // An EAGLE-3 head: the target's vocabulary and hidden size, over enough layers.
        let (tv, th) = (target.vocab_size, target.hidden_size);
        if e.target_vocab != tv {
            return Err(Error::invalid(
                WHAT,
                format!(
                    "the EAGLE-3 head was made for a vocabulary of {} tokens, the target's has {tv}",
                    e.target_vocab
                ),
            ));
        }
        if e.target_hidden != th {
            return Err(Error::invalid(
                WHAT,
                format!(
                    "the EAGLE-3 head reads hidden states of {} (target_hidden_size), the target's are {th}",
                    e.target_hidden
                ),
            ));
        }
        e.aux_layers_for(target.num_layers)?;
        return Ok(());
    }
    let (tv, dv) = (target.vocab_size, draft.vocab_size);
    if tv != dv {
        return Err(Error::invalid(
            WHAT,
            format!(
                "the draft model's vocabulary has {dv} tokens, the target's {tv}: a draft model must share the target's tokenizer"
            ),
        ));
    }
    Ok(())
}

/// A greedy step of `tokens` for `seq` on the draft runner.
pub(super) fn greedy(seq: SeqId, tokens: &[u32]) -> SeqStep<'_> {
    SeqStep {
        seq,
        tokens,
        sampling: SamplingParams::default(),
        masked: false,
        logit_bias: &[],
        score: None,
        verify: false,
    }
}
