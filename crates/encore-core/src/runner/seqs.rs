//! What the caller of a step owns about its live sequences: their KV blocks (the
//! [`BlockManager`]) and their penalty slots. The scheduler holds one [`Seqs`]; a step
//! reads its block tables and slots, and counts each kept sample into the sequence's
//! penalty row.

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::kv::{BlockManager, SeqId};

use super::{Runner, RunnerConfig};

/// The live sequences' KV blocks and penalty slots, sized for one runner.
pub struct Seqs {
    /// Which KV-cache blocks each sequence owns (allocate before a step, free after).
    pub blocks: BlockManager,
    penalties: PenaltySlots,
}

/// Who holds which row of the runner's penalty table.
struct PenaltySlots {
    /// Rows in the table (0: penalties off).
    total: usize,
    free: Vec<usize>,
    held: HashMap<SeqId, PenaltySeq>,
}

/// A sequence's penalty row, and the length the sequence has when a step samples the
/// token it keeps (a step ending short of it is a prompt chunk whose sample is dropped).
/// A verify step in flight also holds `fork`: a scratch row per draft, the sequence's
/// row with the drafts up to it counted (see [`Seqs::penalty_fork`]).
struct PenaltySeq {
    slot: usize,
    len: usize,
    fork: Vec<usize>,
}

/// A verify chunk's penalty rows ([`Seqs::penalty_fork`]): its first row samples with the
/// sequence's `slot`; the row after draft `j` (1-based) with `fork[j - 1]`, which the step
/// must first make a copy of `slot` with drafts `1..=j` counted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PenaltyFork {
    pub seq: SeqId,
    pub slot: usize,
    pub fork: Vec<usize>,
    pub drafts: Vec<u32>,
}

impl Seqs {
    /// Blocks and penalty slots for a runner of `cfg` (`num_blocks` KV blocks,
    /// `penalty_slots` rows).
    pub fn new(cfg: &RunnerConfig) -> Result<Self> {
        Ok(Seqs {
            blocks: BlockManager::new(cfg.num_blocks, cfg.block_size)?,
            penalties: PenaltySlots {
                total: cfg.penalty_slots,
                free: (0..cfg.penalty_slots).rev().collect(),
                held: HashMap::new(),
            },
        })
    }

    /// [`Seqs::new`] for `runner`'s sizes.
    pub fn for_runner(runner: &Runner<'_>) -> Result<Self> {
        Self::new(runner.config())
    }

    /// Give sequence `seq` a penalty slot for the tokens it holds: `prompt` (flagged as
    /// prompt tokens) and `output` (counted), written to `runner`'s table now, outside any
    /// step. Its next token is counted once a step samples at its end (after `prompt`
    /// and `output`), and so on for every token after. `Ok(false)` when every slot is
    /// held; an error with no slots at all, a token outside the vocabulary, or a sequence
    /// that holds one already.
    pub fn begin_penalties(
        &mut self,
        runner: &Runner<'_>,
        seq: SeqId,
        prompt: &[u32],
        output: &[u32],
    ) -> Result<bool> {
        const OP: &str = "runner.begin_penalties";
        let p = &mut self.penalties;
        if p.total == 0 {
            return Err(Error::invalid(
                OP,
                "penalties need a penalty slot; the runner has none (RunnerConfig::penalty_slots 0)",
            ));
        }
        if p.held.contains_key(&seq) {
            return Err(Error::invalid(
                OP,
                format!("sequence {seq} already holds a penalty slot"),
            ));
        }
        let sampling = &runner.parts.sampling;
        let row = sampling.penalty_row(OP, &format!("sequence {seq}"), prompt, output)?;
        let Some(slot) = p.free.pop() else {
            return Ok(false);
        };
        if let Err(e) = sampling.write_penalty_row(runner.parts.be, slot, &row) {
            p.free.push(slot);
            return Err(e);
        }
        p.held.insert(
            seq,
            PenaltySeq {
                slot,
                len: prompt.len() + output.len(),
                fork: Vec::new(),
            },
        );
        Ok(true)
    }

    /// Free `seq`'s penalty slot, if it holds one (when it finishes, is aborted or
    /// preempted), and the scratch rows of a verify step it had in flight.
    pub fn end_penalties(&mut self, seq: SeqId) {
        if let Some(p) = self.penalties.held.remove(&seq) {
            self.penalties.free.push(p.slot);
            self.penalties.free.extend(p.fork);
        }
    }

    /// A verify chunk of `seq` holding `drafts` after its last kept token, whose first
    /// row samples when the sequence has `first_total` tokens (its decode row's place):
    /// the rows each of its samples reads and counts into ([`PenaltyFork`]), a scratch
    /// slot per draft taken until [`Seqs::penalty_join`]. An error when `seq` holds no
    /// slot, the chunk does not start where the sequence samples next, or too few slots
    /// are free.
    pub(super) fn penalty_fork(
        &mut self,
        seq: SeqId,
        first_total: usize,
        drafts: &[u32],
    ) -> Result<PenaltyFork> {
        let p = &mut self.penalties;
        let held = p.held.get_mut(&seq).ok_or_else(|| {
            Error::invalid(
                "runner.step",
                format!("sequence {seq}: a verify chunk with penalties but no penalty slot"),
            )
        })?;
        // A step that failed left its scratch rows.
        p.free.append(&mut held.fork);
        if first_total != held.len {
            return Err(Error::invalid(
                "runner.step",
                format!(
                    "sequence {seq}: a verify chunk sampling first at {first_total} tokens, the sequence samples next at {}",
                    held.len
                ),
            ));
        }
        if p.free.len() < drafts.len() {
            return Err(Error::invalid(
                "runner.step",
                format!(
                    "sequence {seq}: {} drafts with penalties need as many free penalty slots, {} are",
                    drafts.len(),
                    p.free.len()
                ),
            ));
        }
        let at = p.free.len() - drafts.len();
        held.fork = p.free.split_off(at);
        Ok(PenaltyFork {
            seq,
            slot: held.slot,
            fork: held.fork.clone(),
            drafts: drafts.to_vec(),
        })
    }

    /// After a verify step of `seq` ([`Seqs::penalty_fork`]) of which the first `kept`
    /// samples are the sequence's (the drafts kept, then the target's token): its scratch
    /// slots are free again, the sequence advances by `kept` tokens, and `Some((from,
    /// to))` says that the caller must copy row `from` (the last kept sample's, which
    /// counted it) over the sequence's row `to`. `None` for a sequence with no fork.
    pub(super) fn penalty_join(&mut self, seq: SeqId, kept: usize) -> Option<(usize, usize)> {
        let p = &mut self.penalties;
        let held = p.held.get_mut(&seq)?;
        if held.fork.is_empty() {
            return None;
        }
        let fork = std::mem::take(&mut held.fork);
        held.len += kept;
        let last = kept.clamp(1, fork.len() + 1) - 1;
        let copy = (last > 0).then(|| (fork[last - 1], held.slot));
        p.free.extend(fork);
        copy
    }

    /// Penalty slots free now.
    pub fn free_penalty_slots(&self) -> usize {
        self.penalties.free.len()
    }

    /// Free everything `seq` holds: its KV blocks and its penalty slot.
    pub fn release(&mut self, seq: SeqId) -> Result<()> {
        self.blocks.free(seq)?;
        self.end_penalties(seq);
        Ok(())
    }

    /// The penalty slot a step's row of `seq`, which has `total` tokens after the step,
    /// counts its sample into: its slot when the step samples the token the sequence
    /// keeps (the sequence then advances by it), `None` for a prompt chunk short of the
    /// end. An error when `seq` holds no slot.
    pub(super) fn penalty_slot_for_step(
        &mut self,
        seq: SeqId,
        total: usize,
    ) -> Result<Option<usize>> {
        let p = self.penalties.held.get_mut(&seq).ok_or_else(|| {
            Error::invalid(
                "runner.step",
                format!(
                    "sequence {seq}: its sampling has penalties but it holds no penalty slot (Seqs::begin_penalties)"
                ),
            )
        })?;
        if total != p.len {
            return Ok(None);
        }
        p.len += 1;
        Ok(Some(p.slot))
    }
}
