//! Sampling: what a step hands back per sequence (the token and its log-probabilities,
//! [`crate::request::SamplingParams`] says what it asked for), and the device buffers sampling writes (sampled ids,
//! log-probabilities, the penalty table whose rows the scheduler hands out).

use crate::backend::{
    Backend, HostStaging, LogitBias, Penalties, SampleLogprobs, Sampling, TokenMask,
    MAX_TOP_LOGPROBS, PROMPT_BIT,
};
use crate::error::{Error, Result};
use crate::request::MAX_LOGIT_BIAS;
use crate::tensor::{DType, Tensor};

use super::deferred::{logprobs_of, Deferred};
use super::pack::{Packer, StepViews};
use super::seqs::PenaltyFork;
use super::{FillMasks, SeqStep};
use crate::request::TokenLogprobs;

/// What a step produced for one sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// When the sequence's sampling asked for them.
    pub logprobs: Option<TokenLogprobs>,
    /// A scored chunk's ([`super::Score`]): one entry per token after its first, and one
    /// for the token after it when given; empty otherwise.
    pub prompt: Vec<TokenLogprobs>,
    /// A verify step's ([`super::SeqStep::verify`]): the target's sample after each of its
    /// tokens but the last (`token` is the sample after the last); empty otherwise.
    pub verified: Vec<u32>,
    /// Their log-probabilities, one per sample (`None` each unless the sequence's
    /// sampling asks for them).
    pub verified_logprobs: Vec<Option<TokenLogprobs>>,
}

/// The log-probability outputs of sampling: the token's `[max_seqs]`, the top ids and
/// log-probabilities `[max_seqs, MAX_TOP_LOGPROBS]`.
pub(super) struct LogprobBuffers {
    pub token: Tensor,
    pub top_ids: Tensor,
    pub top: Tensor,
}

impl LogprobBuffers {
    /// The first `rows` rows of each.
    fn prefix(&self, rows: usize) -> Result<LogprobBuffers> {
        Ok(LogprobBuffers {
            token: self.token.prefix(rows)?,
            top_ids: self.top_ids.prefix(rows)?,
            top: self.top.prefix(rows)?,
        })
    }
}

/// What sampling writes on the device: the sampled ids, the log-probabilities, and the
/// penalty table (i32 `[penalty_slots, vocab]`, see [`Penalties`]; `None` with 0 slots).
pub(super) struct SampleBuffers {
    /// Sampled token ids, `[max_seqs]`.
    sampled: Tensor,
    /// Asynchronous scheduling: the samples of launched steps on their way to the host.
    deferred: Deferred,
    lp: LogprobBuffers,
    pen_counts: Option<Tensor>,
    /// Allowed-token masks, i32 `[max_seqs, mask_words]`: row r is the step's row r's
    /// (read only where the step's `mask_on` is set).
    mask_bits: Tensor,
    /// Host staging of the masks, which their writer fills in place (page-locked on
    /// CUDA: the upload is an asynchronous DMA).
    mask_staging: HostStaging,
    /// Logit-bias tables, i32 ids and f32 values `[max_seqs, MAX_LOGIT_BIAS]`: row r's
    /// first `bias_n[r]` entries are the step's row r's (see [`crate::backend::LogitBias`]).
    bias_ids: Tensor,
    bias_vals: Tensor,
    bias_staging: [HostStaging; 2],
    /// The (slot, token) pairs a verify step's penalty forks count, i32
    /// `[max_seqs * FORK_PAIRS]` each (see [`SampleBuffers::fork_penalties`]).
    fork_slots: Tensor,
    fork_tokens: Tensor,
    vocab: usize,
}

/// Draft counts one sequence's penalty fork may need: drafts `1..=j` for each `j <= k`.
const FORK_PAIRS: usize = {
    let k = crate::spec::ngram::MAX_SPECULATIVE_TOKENS;
    k * (k + 1) / 2
};

/// [`SampleBuffers`] cut to one step's rows, for the step's sampling call.
pub(super) struct StepSampling<'a> {
    sampled: Tensor,
    lp: LogprobBuffers,
    pen_counts: Option<&'a Tensor>,
    mask_bits: Tensor,
    bias_ids: Tensor,
    bias_vals: Tensor,
}

impl SampleBuffers {
    pub fn new(
        be: &dyn Backend,
        max_seqs: usize,
        penalty_slots: usize,
        vocab: usize,
    ) -> Result<Self> {
        Ok(SampleBuffers {
            sampled: be.alloc(DType::I32, &[max_seqs])?,
            deferred: Deferred::new(be, max_seqs)?,
            lp: LogprobBuffers {
                token: be.alloc(DType::F32, &[max_seqs])?,
                top_ids: be.alloc(DType::I32, &[max_seqs, MAX_TOP_LOGPROBS])?,
                top: be.alloc(DType::F32, &[max_seqs, MAX_TOP_LOGPROBS])?,
            },
            pen_counts: match penalty_slots {
                0 => None,
                n => Some(be.alloc(DType::I32, &[n, vocab])?),
            },
            mask_bits: be.alloc(DType::I32, &[max_seqs, mask_words(vocab)])?,
            mask_staging: be.alloc_staging(max_seqs * mask_words(vocab) * 4)?,
            bias_ids: be.alloc(DType::I32, &[max_seqs, MAX_LOGIT_BIAS])?,
            bias_vals: be.alloc(DType::F32, &[max_seqs, MAX_LOGIT_BIAS])?,
            bias_staging: [
                be.alloc_staging(max_seqs * MAX_LOGIT_BIAS * 4)?,
                be.alloc_staging(max_seqs * MAX_LOGIT_BIAS * 4)?,
            ],
            fork_slots: be.alloc(DType::I32, &[max_seqs * FORK_PAIRS])?,
            fork_tokens: be.alloc(DType::I32, &[max_seqs * FORK_PAIRS])?,
            vocab,
        })
    }

    /// Device bytes of a runner's sampling buffers (sampled tokens, log-probabilities and
    /// the penalty table), for a memory estimate.
    pub fn bytes_for(max_seqs: usize, penalty_slots: usize, vocab: usize) -> usize {
        max_seqs.saturating_mul(
            2 + 2 * MAX_TOP_LOGPROBS + mask_words(vocab) + 2 * MAX_LOGIT_BIAS + 2 * FORK_PAIRS,
        ) * 4
            + Deferred::device_bytes(max_seqs)
            + penalty_slots.saturating_mul(vocab).saturating_mul(4)
    }

    /// Have `fill` write the masks of the step's masked rows (`batch` in the step's row
    /// order, its extra sampling rows after its own) straight into the host staging, and
    /// upload them in one copy of the rows up to the last of them; other rows keep stale
    /// bits their `mask_on` of 0 leaves unread. A masked verify chunk's rows come as
    /// consecutive entries of its batch index, in the order of the tokens they sample
    /// after: its extra rows (from row `first_extra` in batch order), then its own row
    /// (after its last token).
    pub fn write_masks(
        &mut self,
        be: &dyn Backend,
        batch: &[SeqStep<'_>],
        first_extra: usize,
        fill: &mut FillMasks<'_>,
    ) -> Result<()> {
        // (batch index, sampling row) of every masked row, in the order `fill` gets them.
        let mut order: Vec<(usize, usize)> = Vec::new();
        let extras = Packer::extra_row_ranges(batch, first_extra);
        for ((i, s), extra) in batch.iter().enumerate().zip(extras) {
            if s.masked {
                if s.verify {
                    order.extend(extra.map(|r| (i, r)));
                }
                order.push((i, i));
            }
        }
        let Some(last) = order.iter().map(|&(_, r)| r).max() else {
            return Ok(());
        };
        let w = mask_words(self.vocab);
        // Waits until the previous upload has read the staging.
        let host = self.mask_staging.words_mut()?;
        let mut slots: Vec<Option<&mut [u32]>> = host[..(last + 1) * w]
            .chunks_exact_mut(w)
            .map(Some)
            .collect();
        let mut rows: Vec<(usize, &mut [u32])> = order
            .iter()
            .map(|&(i, r)| (i, slots[r].take().expect("each row once")))
            .collect();
        fill(&mut rows);
        drop(rows);
        be.upload_staging(&mut self.mask_staging, &self.mask_bits.prefix(last + 1)?)
    }

    /// Upload the logit biases of the step's rows that have some (`batch` in the step's
    /// row order; a verify chunk's extra rows, from row `first_extra` in batch order, have
    /// its biases too), the rows up to the last of them; other rows' `bias_n` of 0 leaves
    /// their stale entries unread.
    pub fn write_bias(
        &mut self,
        be: &dyn Backend,
        batch: &[SeqStep<'_>],
        first_extra: usize,
    ) -> Result<()> {
        // (sampling row, batch index) of every row with biases.
        let mut rows: Vec<(usize, usize)> = Vec::new();
        let extras = Packer::extra_row_ranges(batch, first_extra);
        for ((i, s), extra) in batch.iter().enumerate().zip(extras) {
            if !s.logit_bias.is_empty() {
                rows.push((i, i));
                if s.verify {
                    rows.extend(extra.map(|r| (r, i)));
                }
            }
        }
        let Some(last) = rows.iter().map(|&(r, _)| r).max() else {
            return Ok(());
        };
        let [ids_staging, vals_staging] = &mut self.bias_staging;
        // Each waits until the previous upload has read it.
        let (ids, vals) = (ids_staging.bytes_mut()?, vals_staging.bytes_mut()?);
        for &(row, i) in &rows {
            for (j, &(t, b)) in batch[i].logit_bias.iter().take(MAX_LOGIT_BIAS).enumerate() {
                let at = (row * MAX_LOGIT_BIAS + j) * 4;
                ids[at..at + 4].copy_from_slice(&(t as i32).to_ne_bytes());
                vals[at..at + 4].copy_from_slice(&b.to_ne_bytes());
            }
        }
        be.upload_staging(ids_staging, &self.bias_ids.prefix(last + 1)?)?;
        be.upload_staging(vals_staging, &self.bias_vals.prefix(last + 1)?)
    }

    /// The buffers of a step's first `seqs` rows.
    pub fn step(&self, seqs: usize) -> Result<StepSampling<'_>> {
        Ok(StepSampling {
            sampled: self.sampled.prefix(seqs)?,
            lp: self.lp.prefix(seqs)?,
            pen_counts: self.pen_counts.as_ref(),
            mask_bits: self.mask_bits.prefix(seqs)?,
            bias_ids: self.bias_ids.prefix(seqs)?,
            bias_vals: self.bias_vals.prefix(seqs)?,
        })
    }

    /// Build the penalty row of a sequence holding `prompt` (flagged as prompt tokens)
    /// and `output` (counted); an error for a token outside the vocabulary.
    pub fn penalty_row(
        &self,
        op: &'static str,
        what: &str,
        prompt: &[u32],
        output: &[u32],
    ) -> Result<Vec<i32>> {
        let vocab = self.vocab;
        let mut row = vec![0i32; vocab];
        let tokens = prompt.iter().map(|&t| (t, true));
        for (t, in_prompt) in tokens.chain(output.iter().map(|&t| (t, false))) {
            let Some(c) = row.get_mut(t as usize) else {
                return Err(Error::invalid(
                    op,
                    format!("{what}: token id {t} is outside the vocabulary of {vocab}"),
                ));
            };
            if in_prompt {
                *c |= PROMPT_BIT;
            } else {
                *c += 1;
            }
        }
        Ok(row)
    }

    /// Before a step that samples verify chunks with penalties (outside any capture): each
    /// fork's scratch row `j` becomes a copy of its sequence's row with drafts `1..=j + 1`
    /// counted.
    pub fn fork_penalties(&self, be: &dyn Backend, forks: &[PenaltyFork]) -> Result<()> {
        if forks.is_empty() {
            return Ok(());
        }
        let counts = self
            .pen_counts
            .as_ref()
            .ok_or_else(|| Error::invalid("runner.penalties", "the runner has no penalty table"))?;
        let (mut slots, mut tokens) = (Vec::new(), Vec::new());
        for f in forks {
            let row = counts.narrow(f.slot, 1)?;
            for (j, &dst) in f.fork.iter().enumerate() {
                be.copy(&row, &counts.narrow(dst, 1)?)?;
                for &d in &f.drafts[..=j] {
                    slots.push(dst as i32);
                    tokens.push(d as i32);
                }
            }
        }
        let n = slots.len();
        if n > self.fork_slots.numel() {
            return Err(Error::invalid(
                "runner.penalties",
                format!("{n} draft counts exceed {}", self.fork_slots.numel()),
            ));
        }
        let (s, t) = (self.fork_slots.prefix(n)?, self.fork_tokens.prefix(n)?);
        be.write_bytes(&s, bytemuck::cast_slice(&slots))?;
        be.write_bytes(&t, bytemuck::cast_slice(&tokens))?;
        be.penalty_count(counts, &s, &t)
    }

    /// Copy penalty row `from` over row `to` (a verify step's last kept sample's scratch
    /// row over its sequence's).
    pub fn copy_penalty_row(&self, be: &dyn Backend, from: usize, to: usize) -> Result<()> {
        let Some(counts) = &self.pen_counts else {
            return Ok(());
        };
        be.copy(&counts.narrow(from, 1)?, &counts.narrow(to, 1)?)
    }

    /// Write `row` into penalty slot `slot` of the table, outside any step.
    pub fn write_penalty_row(&self, be: &dyn Backend, slot: usize, row: &[i32]) -> Result<()> {
        let Some(counts) = &self.pen_counts else {
            return Err(Error::invalid(
                "runner.penalties",
                "the runner has no penalty table (RunnerConfig::penalty_slots 0)",
            ));
        };
        be.write_bytes(&counts.narrow(slot, 1)?, bytemuck::cast_slice(row))
    }

    /// The first `b` sampled ids.
    pub fn download_tokens(&self, be: &dyn Backend, b: usize) -> Result<Vec<u32>> {
        let ids = be.download::<i32>(&self.sampled.prefix(b)?)?;
        Ok(ids.into_iter().map(|t| t as u32).collect())
    }

    /// Asynchronous scheduling: keep the first `b` samples of the step just queued on the
    /// device for the next step's token ids ([`SampleBuffers::prev`]) and queue their
    /// copy to the host, with their log-probabilities when `logprobs`; returns the slot
    /// [`SampleBuffers::read_deferred`] reads them from.
    pub fn defer(&mut self, be: &dyn Backend, b: usize, logprobs: bool) -> Result<usize> {
        self.deferred
            .defer(be, &self.sampled, &self.lp, b, logprobs)
    }

    /// The samples [`SampleBuffers::defer`] queued into `slot`, one per entry of `nums`,
    /// with `nums[r]` top log-probabilities for row `r`, once they are on the host.
    pub fn read_deferred(
        &mut self,
        slot: usize,
        nums: &[Option<usize>],
    ) -> Result<(Vec<u32>, Vec<Option<TokenLogprobs>>)> {
        self.deferred.read(slot, nums)
    }

    /// The last launched step's samples on the device ([`SampleBuffers::defer`]).
    pub fn prev(&self) -> &Tensor {
        self.deferred.prev()
    }

    /// The log-probabilities of the step's first `nums.len()` rows, `nums[r]` top
    /// entries for row `r` (`None`: none; nothing is read back when no row has any).
    pub fn download_logprobs(
        &self,
        be: &dyn Backend,
        nums: &[Option<usize>],
    ) -> Result<Vec<Option<TokenLogprobs>>> {
        if nums.iter().all(Option::is_none) {
            return Ok(vec![None; nums.len()]);
        }
        let b = nums.len();
        let token = be.download::<f32>(&self.lp.token.prefix(b)?)?;
        let ids = be.download::<i32>(&self.lp.top_ids.prefix(b)?)?;
        let top = be.download::<f32>(&self.lp.top.prefix(b)?)?;
        Ok(logprobs_of(nums, &token, &ids, &top))
    }
}

impl StepSampling<'_> {
    /// Sample one token per row of `logits` (the step's `seqs` rows) with the step's
    /// inputs `v`.
    pub fn sample(&self, be: &dyn Backend, logits: &Tensor, v: &StepViews) -> Result<()> {
        // Rows without biases (`bias_n` 0) are untouched.
        be.logit_bias(
            logits,
            &LogitBias {
                ids: &self.bias_ids,
                vals: &self.bias_vals,
                count: &v.bias_n,
            },
        )?;
        be.sample(
            logits,
            &Sampling {
                temperature: &v.temperature,
                top_k: &v.top_k,
                top_p: &v.top_p,
                min_p: &v.min_p,
                seeds: &v.seeds,
                penalties: self.pen_counts.map(|counts| Penalties {
                    counts,
                    slot: &v.pen_slot,
                    repetition: &v.repetition,
                    frequency: &v.frequency,
                    presence: &v.presence,
                }),
                logprobs: Some(SampleLogprobs {
                    num: &v.num_logprobs,
                    token: &self.lp.token,
                    top_ids: &self.lp.top_ids,
                    top: &self.lp.top,
                    target: Some(&v.lp_target),
                }),
                mask: Some(TokenMask {
                    bits: &self.mask_bits,
                    on: &v.mask_on,
                }),
            },
            &self.sampled,
        )
    }
}

/// Words of a mask row over `vocab` tokens.
pub(super) fn mask_words(vocab: usize) -> usize {
    vocab.div_ceil(32)
}

/// The request seed mixed with the index of the token being sampled: a fresh,
/// reproducible seed per token.
pub(super) fn mix_seed(seed: u64, index: u64) -> u64 {
    crate::ops::mix64(seed ^ index.wrapping_mul(crate::ops::GOLDEN))
}
