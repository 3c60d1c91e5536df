//! Asynchronous scheduling's side of the runner: a step launched without waiting for
//! its samples ([`Runner::launch`]), whose next step is planned and queued behind it
//! while the device runs it, its decode rows' token ids taken on the device from the
//! samples of the step before ([`crate::backend::Backend::fill_rows`]); the samples are
//! read once the host has queued that next step ([`Runner::collect`]). As vLLM's
//! `--async-scheduling` and SGLang's overlap scheduler: the host's planning, packing and
//! output handling run while the device computes, instead of between its steps.

use crate::error::{Error, Result};

use super::{Runner, SeqStep, Seqs};

/// A step [`Runner::launch`] queued: its samples are on their way to the host.
#[derive(Debug)]
pub struct Launched {
    /// The batch index of each sample row.
    order: Vec<usize>,
    /// The sample row of each batch index.
    rows: Vec<usize>,
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
    pub fn set_overlap(&mut self, on: bool) -> Result<bool> {
        let on = on && self.group.is_none() && self.parts.sample;
        if on != self.parts.overlap {
            self.exec.clear();
            self.parts.overlap = on;
        }
        Ok(on)
    }

    /// Queue one step over `batch` and return without waiting for it: its samples stay
    /// on the device for the step after it, and [`Runner::collect`] reads them. `prev[i]`
    /// (when given and not negative) is the sample row ([`Launched::row`]) of the step
    /// launched just before whose token is `batch[i]`'s only token, which the host does
    /// not know yet (any value stands in for it in `tokens`). The steps of one runner
    /// run in launch order, so such a step may be launched before the one it follows is
    /// collected — and must be, before any other step runs. A launched step samples
    /// plainly: no masks, scores, drafts or log-probabilities (an error names them).
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
            .find(|s| s.masked || s.score.is_some() || s.verify || s.sampling.logprobs.is_some())
        {
            return Err(Error::invalid(
                "runner.launch",
                format!(
                    "sequence {}: a launched step samples plainly (no mask, scores, drafts or log-probabilities)",
                    s.seq
                ),
            ));
        }
        self.parts.inputs.prev_rows.clear();
        self.parts.inputs.prev_rows.extend_from_slice(prev);
        self.deferred = Some(Vec::new());
        let ran = self.run(seqs, batch, false, None);
        self.parts.inputs.prev_rows.clear();
        let order = self.deferred.take().unwrap_or_default();
        ran?;
        let mut rows = vec![0; order.len()];
        for (k, &i) in order.iter().enumerate() {
            rows[i] = k;
        }
        Ok(Launched {
            order,
            rows,
            slot: self.parts.sampling.deferred_slot(),
        })
    }

    /// The samples of the step `l` launched, one per sequence of its batch in the
    /// batch's order, once they are on the host.
    pub fn collect(&mut self, l: Launched) -> Result<Vec<u32>> {
        let t0 = std::time::Instant::now();
        let sorted = self.parts.sampling.deferred_tokens(l.slot, l.order.len());
        self.device_wait.set(self.device_wait.get() + t0.elapsed());
        let sorted = sorted?;
        let mut tokens = vec![0u32; sorted.len()];
        for (k, &i) in l.order.iter().enumerate() {
            tokens[i] = sorted[k];
        }
        Ok(tokens)
    }
}
