//! Asynchronous scheduling: the next step is planned, packed and queued while the device
//! runs the current one, whose samples are read only after that (vLLM's
//! `--async-scheduling`, SGLang's overlap scheduler). The device then goes from step to
//! step without waiting for the host's planning, packing and output handling.
//!
//! A sequence whose sample the step in flight gives gets a stand-in token at the end of
//! its `tokens` ([`Seq::ahead`]); the next step feeds it, its id taken on the device from
//! that step's sample row ([`Runner::launch`]). When the samples arrive, the stand-ins
//! become the real tokens and each is checked for a finish as a synchronous step does.
//! What a sequence's length ends is known at launch: such a sequence is not planned
//! again ([`Seq::ends_by_length`]). A stop token is known only once read: the step already
//! planned computes one more token for it, which is dropped. Tokens are the ones the
//! synchronous loop gives: each sample depends on the request's seed and the token's
//! index only.
//!
//! Penalties run this way too (a row counts its sample into its slot on the device), and
//! log-probabilities (copied to the host with the samples). A constraint, a scored prompt
//! or speculation do not (their host work needs the tokens first); with any such request
//! running or next in line, or when a planned-ahead step found the KV cache full (a
//! synchronous step may preempt), the step in flight is read and the loop steps
//! synchronously until it may overlap again.

use std::collections::HashMap;

use super::*;
use crate::runner::Launched;

/// The stand-in for a token the step in flight samples (the device replaces it).
const STAND_IN: u32 = 0;

/// A step launched and not yet read.
pub(super) struct InFlight {
    launched: Launched,
    /// Per sequence of the step, in its batch order: the sequence and the index in its
    /// `tokens` of the stand-in the step's sample replaces (`None`: a prompt chunk short
    /// of the end, whose sample is dropped).
    entries: Vec<(SeqId, Option<usize>)>,
}

impl Scheduler {
    /// Whether the next step may be planned before the one in flight is read.
    pub(super) fn overlapping(&self, runner: &Runner<'_>, drafter: bool) -> bool {
        runner.overlap()
            && !drafter
            && self.cfg.speculative.is_none()
            && !self.tight
            && self.running.iter().all(Seq::plain)
            && self.waiting.front().is_none_or(Seq::plain)
    }

    /// One overlapped step: plan and launch the next step, then read the one in flight
    /// and return its outputs.
    pub(super) fn step_overlapped(&mut self, runner: &mut Runner<'_>) -> Result<Vec<Output>> {
        let plan = self.schedule(runner, None, true)?;
        let next = match plan.is_empty() {
            true => None,
            false => match self.launch_plan(runner, &plan) {
                Ok(f) => Some(f),
                Err(e) => {
                    self.inflight = None;
                    return Err(e);
                }
            },
        };
        let outputs = self.drain(runner)?;
        self.inflight = next;
        Ok(outputs)
    }

    /// Read the step in flight, if any, and return its outputs.
    pub(super) fn drain(&mut self, runner: &mut Runner<'_>) -> Result<Vec<Output>> {
        match self.inflight.take() {
            Some(f) => self.collect(runner, f),
            None => Ok(Vec::new()),
        }
    }

    /// Launch the planned step: the sequences fed a stand-in take its id from the step
    /// in flight; each whose sample the step keeps gets a stand-in of its own.
    fn launch_plan(
        &mut self,
        runner: &mut Runner<'_>,
        plan: &[(usize, usize)],
    ) -> Result<InFlight> {
        let prev: Vec<i32> = plan
            .iter()
            .map(|&(i, take)| {
                let s = &self.running[i];
                match s.ahead {
                    Some((at, row)) if take == 1 && at == s.computed => row as i32,
                    _ => -1,
                }
            })
            .collect();
        let steps: Vec<SeqStep<'_>> = plan
            .iter()
            .map(|&(i, take)| {
                let s = &self.running[i];
                SeqStep {
                    seq: s.seq,
                    tokens: &s.tokens[s.computed..s.computed + take],
                    sampling: s.req.params.sampling,
                    masked: false,
                    logit_bias: &s.req.params.logit_bias,
                    score: None,
                    verify: false,
                }
            })
            .collect();
        let launched = runner.launch(&mut self.seqs, &steps, &prev)?;
        drop(steps);
        self.stats.steps += 1;
        self.stats.overlapped += u64::from(self.inflight.is_some());
        let mut entries = Vec::with_capacity(plan.len());
        for (k, &(i, take)) in plan.iter().enumerate() {
            self.stats.tokens_computed += take as u64;
            let s = &mut self.running[i];
            s.computed += take;
            let mut at = None;
            if s.computed == s.tokens.len() {
                let row = launched.row(k).ok_or_else(|| {
                    Error::invalid("scheduler", format!("no sample row for sequence {k}"))
                })?;
                s.tokens.push(STAND_IN);
                let index = s.tokens.len() - 1;
                s.ahead = Some((index, row));
                at = Some(index);
            }
            entries.push((s.seq, at));
        }
        Ok(InFlight { launched, entries })
    }

    /// Read step `f`'s samples: the stand-ins become tokens, each checked for a finish;
    /// finished sequences free their blocks. A sequence that ended meanwhile (a stop
    /// token of the step before, an abort) is skipped.
    fn collect(&mut self, runner: &mut Runner<'_>, f: InFlight) -> Result<Vec<Output>> {
        let sampled = runner.collect(f.launched)?;
        let index: HashMap<SeqId, usize> = self
            .running
            .iter()
            .enumerate()
            .map(|(i, s)| (s.seq, i))
            .collect();
        let max_seq_len = runner.config().max_seq_len;
        let mut outputs = Vec::new();
        let mut done = Vec::new();
        for (&(seq, at), out) in f.entries.iter().zip(sampled) {
            let token = out.token;
            let Some(&i) = index.get(&seq) else { continue };
            let s = &mut self.running[i];
            if let Some(at) = at {
                s.tokens[at] = token;
                if s.ahead.is_some_and(|(a, _)| a == at) {
                    s.ahead = None;
                }
            }
            if self.cfg.prefix_cache {
                // Tokens before a stand-in still in flight; their KV is queued.
                let known = s.computed.min(s.ahead.map_or(s.tokens.len(), |(a, _)| a));
                self.seqs.blocks.commit(s.seq, &s.tokens, known)?;
            }
            let Some(at) = at else { continue };
            if done.last() == Some(&i) {
                continue;
            }
            let finish = s.finish_at(token, at + 1, max_seq_len);
            outputs.push(Output {
                id: s.req.id,
                token,
                logprobs: out.logprobs,
                prompt_logprobs: s.prompt_lp.take(),
                finish,
            });
            if finish.is_some() {
                // The stand-in a planned step fed after it is dropped with the sequence.
                done.push(i);
            }
        }
        done.sort_unstable_by(|a, b| b.cmp(a));
        done.dedup();
        for i in done {
            let s = self.running.remove(i);
            self.seqs.release(s.seq)?;
            self.stats.finished += 1;
        }
        Ok(outputs)
    }
}
