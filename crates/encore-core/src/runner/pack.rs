//! Step planning's data side: every per-step input declared once ([`StepViews`]), and
//! the packing of a batch into the host staging of a layout, padded and uploaded in one
//! copy.

use crate::backend::{Backend, MAX_TOP_LOGPROBS};
use crate::error::{Error, Result};
use crate::graph::{InputTable, Layout};
use crate::kv::NULL_BLOCK;
use crate::request::MAX_LOGIT_BIAS;

use super::sampling::mix_seed;
use super::seqs::PenaltyFork;
use super::{SeqStep, Seqs};

crate::step_inputs! {
    /// Every per-step input, declared once (see `graph::inputs`). The block tables, the
    /// widest field, come last: a step uploads only the rows it uses of them.
    pub struct StepViews, StepHost {
        /// The step's token ids.
        token_ids: i32 [Tokens, One] = 0,
        /// Each token's position in its sequence.
        positions: i32 [Tokens, One] = 0,
        /// Each token's KV-cache slot; -1 (padding) writes nothing.
        slot_mapping: i32 [Tokens, One] = -1,
        /// Tokens in the cache per sequence after the step; 0 for padding.
        seq_lens: i32 [Seqs, One] = 0,
        /// Row offsets of the sequences' tokens.
        cu_seqlens_q: i32 [SeqsPlusOne, One] = 0,
        /// The row of each sequence's last token; -1 (padding) gathers a zero row.
        logits_indices: i32 [Seqs, One] = -1,
        /// Sampling per sequence; padding samples greedily.
        temperature: f32 [Seqs, One] = 0.0,
        top_k: i32 [Seqs, One] = 0,
        top_p: f32 [Seqs, One] = 1.0,
        min_p: f32 [Seqs, One] = 0.0,
        seeds: i64 [Seqs, One] = 0,
        /// The row's penalty slot; -1: no penalties (padding, a prompt chunk short of
        /// the end, a sequence without penalties).
        pen_slot: i32 [Seqs, One] = -1,
        repetition: f32 [Seqs, One] = 1.0,
        frequency: f32 [Seqs, One] = 0.0,
        presence: f32 [Seqs, One] = 0.0,
        /// Top log-probabilities per row; -1: none.
        num_logprobs: i32 [Seqs, One] = -1,
        /// 1 where the row's sample is limited to its allowed-token mask.
        mask_on: i32 [Seqs, One] = 0,
        /// The token whose log-probability the row reports instead of its sample's (a
        /// scored prompt token); -1: the sample's.
        lp_target: i32 [Seqs, One] = -1,
        /// The row's logit biases (its first entries of the bias tables).
        bias_n: i32 [Seqs, One] = 0,
        /// The sample row of the step before whose token this token is (asynchronous
        /// scheduling: its id was not known when the step was packed); -1: `token_ids`.
        prev_row: i32 [Tokens, One] = -1,
        /// A mixed step's `cu_seqlens_q` of the sequences after its leading decode rows,
        /// relative to their first row (attention runs the two groups separately).
        cu_rest: i32 [SeqsPlusOne, One] = 0,
        /// Each sequence's blocks; unused entries and padding rows hold the null block.
        block_tables: i32 [Seqs, Table] = NULL_BLOCK,
    }
}

impl StepViews {
    /// The views of `layout` with every sequence field cut to `seqs` rows (`cu_rest` to
    /// the rows after the `decode_rows` leading decode rows); token fields keep the
    /// layout's capacity.
    pub fn cut(
        table: &InputTable,
        layout: &Layout,
        seqs: usize,
        decode_rows: usize,
    ) -> Result<Self> {
        let mut v = StepViews::of(table, layout)?;
        v.seq_lens = v.seq_lens.prefix(seqs)?;
        v.cu_seqlens_q = v.cu_seqlens_q.prefix(seqs + 1)?;
        v.cu_rest = v.cu_rest.prefix(seqs - decode_rows + 1)?;
        v.block_tables = v.block_tables.prefix(seqs)?;
        v.temperature = v.temperature.prefix(seqs)?;
        v.top_k = v.top_k.prefix(seqs)?;
        v.top_p = v.top_p.prefix(seqs)?;
        v.seeds = v.seeds.prefix(seqs)?;
        v.min_p = v.min_p.prefix(seqs)?;
        v.pen_slot = v.pen_slot.prefix(seqs)?;
        v.repetition = v.repetition.prefix(seqs)?;
        v.frequency = v.frequency.prefix(seqs)?;
        v.presence = v.presence.prefix(seqs)?;
        v.num_logprobs = v.num_logprobs.prefix(seqs)?;
        v.mask_on = v.mask_on.prefix(seqs)?;
        v.lp_target = v.lp_target.prefix(seqs)?;
        v.bias_n = v.bias_n.prefix(seqs)?;
        Ok(v)
    }
}

/// The persistent step inputs and how a batch goes into them.
pub(super) struct Packer<'b> {
    be: &'b dyn Backend,
    pub table: InputTable,
    /// Blocks per block-table row.
    pub table_width: usize,
    /// The last pack's verify chunks with penalties: their rows' penalty slots, which the
    /// step prepares before it samples ([`super::Runner::prepare_forks`]).
    pub forks: Vec<PenaltyFork>,
    /// Per sequence of the next pack, in its order, the sample row of the step before
    /// whose token is its first ([`StepViews::prev_row`]); -1 or missing: none.
    pub prev_rows: Vec<i32>,
    /// LongRoPE ([`crate::model::Model::long_rope`]): a sequence holding more than
    /// `.0` tokens after the step gets positions `.1` higher (the long factors' rows).
    pub long_rope: Option<(usize, usize)>,
}

impl<'b> Packer<'b> {
    /// Inputs for steps of up to `max_tokens` token rows and `max_seqs` sequences, block
    /// tables `table_width` wide.
    pub fn new(
        be: &'b dyn Backend,
        max_tokens: usize,
        max_seqs: usize,
        table_width: usize,
    ) -> Result<Self> {
        Ok(Packer {
            be,
            table: InputTable::new(be, StepViews::FIELDS, max_tokens, max_seqs, table_width)?,
            table_width,
            forks: Vec::new(),
            prev_rows: Vec::new(),
            long_rope: None,
        })
    }

    /// Device and host bytes of [`Packer::new`]'s inputs, for a memory estimate.
    pub fn bytes_for(max_tokens: usize, max_seqs: usize, table_width: usize) -> usize {
        InputTable::bytes_for(StepViews::FIELDS, max_tokens, max_seqs, table_width)
            .saturating_mul(2)
    }

    /// The layout of a step capacity of `tokens` tokens and `seqs` sequences.
    pub fn layout(&self, tokens: usize, seqs: usize) -> Layout {
        self.table.layout(tokens, seqs)
    }

    /// Pack the step's metadata into the host staging of `layout` (rows beyond the
    /// step's padded), and upload what the step reads (`read_seqs` sequence rows): one
    /// copy. Block tables and slots come from `seqs.blocks`. With `penalties`, a row with
    /// penalties whose sample is kept gets its slot (and the slot's sequence advances by
    /// the token); otherwise none does. The first `d` sequences are a mixed step's
    /// decode rows (0: no split). Extra sampling rows (scored or verified tokens) start
    /// at row `first_extra` (at least the batch's size); a verify graph's padding
    /// sequences sit between.
    #[allow(clippy::too_many_arguments)]
    pub fn pack(
        &mut self,
        seqs: &mut Seqs,
        batch: &[SeqStep<'_>],
        layout: &Layout,
        read_seqs: usize,
        d: usize,
        penalties: bool,
        first_extra: usize,
    ) -> Result<()> {
        let first_extra = first_extra.max(batch.len());
        let w = self.table_width;
        self.forks.clear();
        // Per batch index, its verify chunk's penalty rows (an index into `forks`).
        let mut fork_of: Vec<Option<usize>> = vec![None; batch.len()];
        let h = StepHost::of(&mut self.table, layout)?;
        h.cu_seqlens_q[0] = 0;
        let mut t = 0usize;
        for (i, s) in batch.iter().enumerate() {
            let blocks = &seqs.blocks;
            let total = blocks.num_tokens(s.seq)?;
            if s.tokens.is_empty() || s.tokens.len() > total {
                return Err(Error::invalid(
                    "runner.step",
                    format!(
                        "sequence {}: {} new tokens but {total} in the cache",
                        s.seq,
                        s.tokens.len()
                    ),
                ));
            }
            let start = total - s.tokens.len();
            let shift = match self.long_rope {
                Some((orig, rows)) if total > orig => rows,
                _ => 0,
            };
            let prev = self.prev_rows.get(i).copied().unwrap_or(-1);
            for (j, &tok) in s.tokens.iter().enumerate() {
                h.token_ids[t] = tok as i32;
                h.prev_row[t] = if j == 0 { prev } else { -1 };
                h.positions[t] = (shift + start + j) as i32;
                h.slot_mapping[t] = blocks.slot(s.seq, start + j).ok_or_else(|| {
                    Error::invalid(
                        "runner.step",
                        format!("sequence {}: no slot for position {}", s.seq, start + j),
                    )
                })?;
                t += 1;
            }
            blocks.fill_block_table_row(
                s.seq,
                &mut h.block_tables[i * w..(i + 1) * w],
                NULL_BLOCK as i32,
            )?;
            h.seq_lens[i] = total as i32;
            h.cu_seqlens_q[i + 1] = t as i32;
            h.logits_indices[i] = t as i32 - 1;
            let sp = &s.sampling;
            h.temperature[i] = sp.temperature;
            h.top_k[i] = sp.top_k;
            h.top_p[i] = sp.top_p;
            h.min_p[i] = sp.min_p;
            h.seeds[i] = mix_seed(sp.seed, total as u64) as i64;
            h.repetition[i] = sp.repetition_penalty;
            h.frequency[i] = sp.frequency_penalty;
            h.presence[i] = sp.presence_penalty;
            h.num_logprobs[i] = sp.logprobs.map_or(-1, |n| n.min(MAX_TOP_LOGPROBS) as i32);
            h.mask_on[i] = s.masked as i32;
            h.lp_target[i] = -1;
            h.bias_n[i] = s.logit_bias.len().min(MAX_LOGIT_BIAS) as i32;
            h.pen_slot[i] = -1;
            if penalties && sp.has_penalties() {
                if s.verify && s.tokens.len() > 1 {
                    // The row after the last draft samples with the last scratch row.
                    let drafts = &s.tokens[1..];
                    let f = seqs.penalty_fork(s.seq, total - drafts.len(), drafts)?;
                    h.pen_slot[i] = *f.fork.last().expect("a draft") as i32;
                    fork_of[i] = Some(self.forks.len());
                    self.forks.push(f);
                } else if let Some(slot) = seqs.penalty_slot_for_step(s.seq, total)? {
                    h.pen_slot[i] = slot as i32;
                }
            }
        }
        // The sequences after the `d` decode rows, relative to their first row.
        if d > 0 {
            for k in 0..=batch.len() - d {
                h.cu_rest[k] = h.cu_seqlens_q[d + k] - d as i32;
            }
        }
        // Padding sequences before the extra rows: empty, every field its padding value.
        let h = if first_extra > batch.len() {
            self.table.pad(layout, t, batch.len())?;
            let h = StepHost::of(&mut self.table, layout)?;
            h.cu_seqlens_q[batch.len() + 1..=first_extra].fill(t as i32);
            h
        } else {
            h
        };
        // Scored chunks: a greedy, penalty-free row per token after a chunk's first, after
        // the batch's rows (and padding) in batch order; the sequence's own row scores
        // `next`.
        let mut row = first_extra;
        for (i, s) in batch.iter().enumerate() {
            if s.verify {
                // Verify rows: a row per token before the last, sampled as the sequence's
                // own row would be there (its sampling, the seed of the token it samples).
                let sp = &s.sampling;
                // With penalties, row j samples with the sequence's slot (j = 0) or the
                // scratch row holding drafts 1..=j.
                let fork = fork_of[i].map(|f| &self.forks[f]);
                if penalties && sp.has_penalties() && fork.is_none() {
                    return Err(Error::invalid(
                        "runner.step",
                        format!(
                            "sequence {}: a verify step with penalties needs its penalty rows",
                            s.seq
                        ),
                    ));
                }
                let first = h.cu_seqlens_q[i];
                let start = h.seq_lens[i] as usize - s.tokens.len();
                for j in 0..s.tokens.len().saturating_sub(1) {
                    if row >= layout.seqs {
                        return Err(Error::invalid(
                            "runner.step",
                            format!(
                                "drafts and sequences exceed the step's {} sampling rows",
                                layout.seqs
                            ),
                        ));
                    }
                    h.logits_indices[row] = first + j as i32;
                    h.temperature[row] = sp.temperature;
                    h.top_k[row] = sp.top_k;
                    h.top_p[row] = sp.top_p;
                    h.min_p[row] = sp.min_p;
                    h.seeds[row] = mix_seed(sp.seed, (start + j + 1) as u64) as i64;
                    h.repetition[row] = sp.repetition_penalty;
                    h.frequency[row] = sp.frequency_penalty;
                    h.presence[row] = sp.presence_penalty;
                    h.num_logprobs[row] =
                        sp.logprobs.map_or(-1, |n| n.min(MAX_TOP_LOGPROBS) as i32);
                    h.mask_on[row] = s.masked as i32;
                    h.bias_n[row] = s.logit_bias.len().min(MAX_LOGIT_BIAS) as i32;
                    h.pen_slot[row] = match fork {
                        Some(f) if j == 0 => f.slot as i32,
                        Some(f) => f.fork[j - 1] as i32,
                        None => -1,
                    };
                    h.lp_target[row] = -1;
                    row += 1;
                }
                continue;
            }
            let Some(score) = s.score else { continue };
            let num = score.num.min(MAX_TOP_LOGPROBS) as i32;
            let first = h.cu_seqlens_q[i];
            for (j, &target) in s.tokens.iter().enumerate().skip(1) {
                if row >= layout.seqs {
                    return Err(Error::invalid(
                        "runner.step",
                        format!(
                            "scored tokens and sequences exceed the step's {} sampling rows",
                            layout.seqs
                        ),
                    ));
                }
                h.logits_indices[row] = first + j as i32 - 1;
                h.temperature[row] = 0.0;
                h.top_k[row] = 0;
                h.top_p[row] = 1.0;
                h.min_p[row] = 0.0;
                h.seeds[row] = 0;
                h.repetition[row] = 1.0;
                h.frequency[row] = 0.0;
                h.presence[row] = 0.0;
                h.num_logprobs[row] = num;
                h.mask_on[row] = 0;
                h.bias_n[row] = 0;
                h.pen_slot[row] = -1;
                h.lp_target[row] = target as i32;
                row += 1;
            }
            if let Some(next) = score.next {
                h.lp_target[i] = next as i32;
                h.num_logprobs[i] = num;
            }
        }
        self.finish(layout, t, row, read_seqs)
    }

    /// Sampling rows of a step over `batch`: one per sequence, and one per scored token
    /// after a chunk's first ([`super::Score`]).
    pub fn rows(batch: &[SeqStep<'_>]) -> usize {
        batch.iter().map(|s| 1 + Self::extra_rows(s)).sum()
    }

    /// Each sequence's extra sampling rows (see [`Packer::extra_rows`]), in batch order
    /// from row `first_extra` (at least the batch's size).
    pub fn extra_row_ranges<'s>(
        batch: &'s [SeqStep<'_>],
        first_extra: usize,
    ) -> impl Iterator<Item = std::ops::Range<usize>> + 's {
        batch.iter().scan(first_extra.max(batch.len()), |at, s| {
            let start = *at;
            *at += Self::extra_rows(s);
            Some(start..*at)
        })
    }

    /// A sequence's sampling rows beside its own: one per token after its chunk's first
    /// when scored or verifying (in batch order, after the batch's own rows).
    pub fn extra_rows(s: &SeqStep<'_>) -> usize {
        if s.score.is_some() || s.verify {
            s.tokens.len().saturating_sub(1)
        } else {
            0
        }
    }

    /// Inputs of `seqs` empty sequences and no tokens: every row padding, `cu` all zero.
    pub fn pad_only(&mut self, layout: &Layout, seqs: usize) -> Result<()> {
        StepHost::of(&mut self.table, layout)?.cu_seqlens_q[0] = 0;
        self.finish(layout, 0, 0, seqs)
    }

    /// Pad the rows a step of `tokens` / `seqs` leaves unused, and upload what a step
    /// reading `read_seqs` rows of the block tables needs.
    fn finish(
        &mut self,
        layout: &Layout,
        tokens: usize,
        seqs: usize,
        read_seqs: usize,
    ) -> Result<()> {
        self.table.pad(layout, tokens, seqs)?;
        self.table.upload(self.be, layout, layout.tokens, read_seqs)
    }
}
