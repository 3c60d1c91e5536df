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
struct PenaltySeq {
    slot: usize,
    len: usize,
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
            },
        );
        Ok(true)
    }

    /// Free `seq`'s penalty slot, if it holds one (when it finishes, is aborted or
    /// preempted).
    pub fn end_penalties(&mut self, seq: SeqId) {
        if let Some(p) = self.penalties.held.remove(&seq) {
            self.penalties.free.push(p.slot);
        }
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
