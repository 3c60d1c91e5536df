//! Asynchronous scheduling's side of the runner: a step launched without waiting for
//! its samples ([`Runner::launch`]), whose next step is planned and queued behind it
//! while the device runs it, its decode rows' token ids taken on the device from the
//! samples of the step before ([`crate::backend::Backend::fill_rows`]); the samples are
//! read once the host has queued that next step ([`Runner::collect`]). As vLLM's
//! `--async-scheduling` and SGLang's overlap scheduler: the host's planning, packing and
//! output handling run while the device computes, instead of between its steps.

use crate::error::{Error, Result};

use super::{Runner, Sampled, SeqStep, Seqs};

/// A step [`Runner::launch`] queued: its samples are on their way to the host.
#[derive(Debug)]
pub struct Launched {
    /// The batch index of each sample row.
    order: Vec<usize>,
    /// The sample row of each batch index.
    rows: Vec<usize>,
    /// The top log-probabilities each sample row asks for (`None`: none).
    nums: Vec<Option<usize>>,
    /// The staging its samples come to.
    slot: usize,
}

impl Launched {
    /// The sample row of the launched batch's `i`-th sequence: the `prev` entry of a
    /// sequence whose next token is that sample ([`Runner::launch`]).
    pub fn row(&self, i: usize) -> Option<usize> {
        self.rows.get(i).copied()
    }

    /// Sequences in the step.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

impl Runner<'_> {
    /// Whether steps may take token ids from the step before ([`Runner::launch`]).
    pub fn overlap(&self) -> bool {
        self.parts.overlap
    }

    /// Turn [`Runner::launch`] on or off; returns whether it is on. Captured graphs are
    /// dropped when it changes (every step then starts with the ids' fill). A
    /// tensor-parallel group keeps it off (a follower does not sample).
    pub fn set_overlap(&mut self, on: bool) -> bool {
        let on = on && self.group.is_none() && self.parts.sample;
        if on != self.parts.overlap {
            self.exec.clear();
            self.parts.overlap = on;
        }
        on
    }

    /// Queue one step over `batch` and return without waiting for it: its samples stay
    /// on the device for the step after it, and [`Runner::collect`] reads them. `prev[i]`
    /// (when given and not negative) is the sample row ([`Launched::row`]) of the step
    /// launched just before whose token is `batch[i]`'s only token, which the host does
    /// not know yet (any value stands in for it in `tokens`). The steps of one runner
    /// run in launch order, so such a step may be launched before the one it follows is
    /// collected — and must be, before any other step runs. A launched step has no
    /// masks, scores or drafts (an error names them); log-probabilities come with its
    /// samples.
    pub fn launch(
        &mut self,
        seqs: &mut Seqs,
        batch: &[SeqStep<'_>],
        prev: &[i32],
    ) -> Result<Launched> {
        if !self.parts.overlap || self.policy.verify {
            return Err(Error::invalid(
                "runner.launch",
                "steps are not launched ahead on this runner (Runner::set_overlap; not with --verify-graphs)",
            ));
        }
        if let Some(s) = batch
            .iter()
            .find(|s| s.masked || s.score.is_some() || s.verify)
        {
            return Err(Error::invalid(
                "runner.launch",
                format!(
                    "sequence {}: a launched step has no mask, scores or drafts",
                    s.seq
                ),
            ));
        }
        self.parts.inputs.prev_rows.clear();
        self.parts.inputs.prev_rows.extend_from_slice(prev);
        self.deferred = Some((Vec::new(), 0));
        let ran = self.run(seqs, batch, false, None);
        self.parts.inputs.prev_rows.clear();
        let (order, slot) = self.deferred.take().unwrap_or_default();
        ran?;
        let mut rows = vec![0; order.len()];
        for (k, &i) in order.iter().enumerate() {
            rows[i] = k;
        }
        let nums = order.iter().map(|&i| batch[i].sampling.logprobs).collect();
        Ok(Launched {
            order,
            rows,
            nums,
            slot,
        })
    }

    /// The samples of the step `l` launched (with their log-probabilities where the
    /// sequence's sampling asks for them), one per sequence of its batch in the batch's
    /// order, once they are on the host.
    pub fn collect(&mut self, l: Launched) -> Result<Vec<Sampled>> {
        let t0 = std::time::Instant::now();
        let read = self.parts.sampling.read_deferred(l.slot, &l.nums);
        self.device_wait.set(self.device_wait.get() + t0.elapsed());
        let (tokens, mut logprobs) = read?;
        let mut out = vec![None; tokens.len()];
        for (k, &i) in l.order.iter().enumerate() {
            out[i] = Some(Sampled {
                token: tokens[k],
                logprobs: logprobs[k].take(),
                prompt: Vec::new(),
                verified: Vec::new(),
                verified_logprobs: Vec::new(),
            });
        }
        out.into_iter()
            .map(|s| s.ok_or_else(|| Error::invalid("runner.collect", "a sample row twice")))
            .collect()
    }
}
