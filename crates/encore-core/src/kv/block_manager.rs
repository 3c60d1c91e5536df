//! The block manager: which cache blocks each live sequence owns. Pure bookkeeping, no
//! device code.

use std::collections::HashMap;
use std::fmt;

use crate::error::{Error, Result};

/// The block that is never handed to a sequence. Padding rows of a step point their
/// block-table row at it (seq_len 0, slot -1: nothing reads or writes it, but the row is
/// a valid index), and `KvCache::new` zeroes it.
pub const NULL_BLOCK: u32 = 0;

/// Identifies one sequence to the block manager (the engine's request id, or any other
/// unique number).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seq {}", self.0)
    }
}

/// Hands out cache blocks to sequences and takes them back.
///
/// Invariants, checked by `tests/kv.rs`:
/// - a live sequence of `t` tokens owns exactly `ceil(t / block_size)` blocks, in
///   position order (token `p` lives in `block_table[p / block_size]`, row
///   `p % block_size`);
/// - no block is owned by two live sequences, and [`NULL_BLOCK`] by none;
/// - free + owned == `num_blocks - 1` (the null block is neither);
/// - a failing call changes nothing.
///
/// The free list is a LIFO stack: the blocks freed last are handed out first (they are
/// the likeliest to still be in cache). A fresh manager hands out blocks `1, 2, 3, ...`.
#[derive(Clone, Debug)]
pub struct BlockManager {
    num_blocks: usize,
    block_size: usize,
    /// Free blocks; the top of the stack (the end) is handed out next.
    free: Vec<u32>,
    seqs: HashMap<SeqId, SeqBlocks>,
}

#[derive(Clone, Debug, Default)]
struct SeqBlocks {
    blocks: Vec<u32>,
    num_tokens: usize,
}

impl BlockManager {
    /// A manager of `num_blocks` blocks of `block_size` tokens each, block
    /// [`NULL_BLOCK`] included (so `num_blocks - 1` are usable). Needs `num_blocks >= 2`,
    /// `block_size >= 1`, and every slot `num_blocks * block_size` to fit in an i32 (the
    /// slot mapping's dtype).
    pub fn new(num_blocks: usize, block_size: usize) -> Result<Self> {
        const OP: &str = "BlockManager::new";
        if block_size == 0 {
            return Err(Error::invalid(OP, "block_size must be at least 1"));
        }
        if num_blocks < 2 {
            return Err(Error::invalid(
                OP,
                format!(
                    "num_blocks is {num_blocks}, need at least 2 (block {NULL_BLOCK} is \
                     reserved for padding)"
                ),
            ));
        }
        match num_blocks.checked_mul(block_size) {
            Some(slots) if slots <= i32::MAX as usize => {}
            _ => {
                return Err(Error::invalid(
                    OP,
                    format!(
                        "{num_blocks} blocks x {block_size} tokens exceeds the i32 slot \
                         range ({} slots); use fewer blocks",
                        i32::MAX
                    ),
                ))
            }
        }
        let free = (1..num_blocks as u32).rev().collect();
        Ok(BlockManager {
            num_blocks,
            block_size,
            free,
            seqs: HashMap::new(),
        })
    }

    /// Start tracking a new sequence holding `num_tokens` tokens (its prompt, or the
    /// first chunk of it). Fails if `seq` is already live or too few blocks are free.
    pub fn allocate(&mut self, seq: SeqId, num_tokens: usize) -> Result<()> {
        if self.seqs.contains_key(&seq) {
            return Err(Error::invalid(
                "BlockManager::allocate",
                format!("{seq} is already allocated; free it first"),
            ));
        }
        let needed = self.blocks_for_tokens(num_tokens);
        self.check_free(needed, || format!("allocating {seq} ({num_tokens} tokens)"))?;
        let blocks = self.free.split_off(self.free.len() - needed);
        // The stack's top is its end: take blocks in pop order.
        let blocks = blocks.into_iter().rev().collect();
        self.seqs.insert(seq, SeqBlocks { blocks, num_tokens });
        Ok(())
    }

    /// Grow a live sequence by `n` tokens, taking a new block only when the tokens cross
    /// a block boundary.
    pub fn append(&mut self, seq: SeqId, n: usize) -> Result<()> {
        let needed = self.append_blocks_needed(seq, n)?;
        self.check_free(needed, || format!("appending {n} tokens to {seq}"))?;
        let start = self.free.len() - needed;
        let s = self.seqs.get_mut(&seq).expect("checked above");
        s.blocks.extend(self.free.drain(start..).rev());
        s.num_tokens += n;
        Ok(())
    }

    /// Stop tracking `seq` and return its blocks to the free list.
    pub fn free(&mut self, seq: SeqId) -> Result<()> {
        let s = self
            .seqs
            .remove(&seq)
            .ok_or_else(|| unknown("BlockManager::free", seq))?;
        // Push in reverse so the next allocation takes them back in the same order.
        self.free.extend(s.blocks.into_iter().rev());
        Ok(())
    }

    /// Whether a new sequence of `num_tokens` tokens would fit now.
    pub fn can_allocate(&self, num_tokens: usize) -> bool {
        self.blocks_for_tokens(num_tokens) <= self.free.len()
    }

    /// Whether `seq` is live and could grow by `n` tokens now.
    pub fn can_append(&self, seq: SeqId, n: usize) -> bool {
        self.append_blocks_needed(seq, n)
            .is_ok_and(|needed| needed <= self.free.len())
    }

    /// Blocks that growing `seq` by `n` tokens would take from the free list.
    pub fn append_blocks_needed(&self, seq: SeqId, n: usize) -> Result<usize> {
        let s = self.get("BlockManager::append", seq)?;
        Ok(self.blocks_for_tokens(s.num_tokens + n) - s.blocks.len())
    }

    /// Blocks holding `num_tokens` tokens: `ceil(num_tokens / block_size)`.
    pub fn blocks_for_tokens(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }

    /// Tokens of a live sequence.
    pub fn num_tokens(&self, seq: SeqId) -> Result<usize> {
        Ok(self.get("BlockManager::num_tokens", seq)?.num_tokens)
    }

    /// A live sequence's blocks, in position order.
    pub fn block_table(&self, seq: SeqId) -> Result<&[u32]> {
        Ok(&self.get("BlockManager::block_table", seq)?.blocks)
    }

    /// The cache slot (`block * block_size + position % block_size`) of token `position`
    /// of `seq`, or `None` if `seq` is not live or has no token at `position`.
    pub fn slot(&self, seq: SeqId, position: usize) -> Option<i32> {
        let s = self.seqs.get(&seq)?;
        if position >= s.num_tokens {
            return None;
        }
        let block = s.blocks[position / self.block_size] as usize;
        // Fits: `new` checked num_blocks * block_size <= i32::MAX.
        Some((block * self.block_size + position % self.block_size) as i32)
    }

    /// Write the slots of positions `start..start + out.len()` of `seq` into `out` (one
    /// step's slot mapping for this sequence). Every position must hold a token.
    pub fn fill_slots(&self, seq: SeqId, start: usize, out: &mut [i32]) -> Result<()> {
        const OP: &str = "BlockManager::fill_slots";
        let s = self.get(OP, seq)?;
        let end = start + out.len();
        if end > s.num_tokens {
            return Err(Error::invalid(
                OP,
                format!(
                    "positions {start}..{end} of {seq}, which holds {} tokens",
                    s.num_tokens
                ),
            ));
        }
        for (p, o) in (start..end).zip(out.iter_mut()) {
            let block = s.blocks[p / self.block_size] as usize;
            *o = (block * self.block_size + p % self.block_size) as i32;
        }
        Ok(())
    }

    /// Write `seq`'s block table into a block-table row of width `out.len()`, padding the
    /// rest with `pad_block` (usually [`NULL_BLOCK`]). Fails if the row is too narrow.
    pub fn fill_block_table_row(&self, seq: SeqId, out: &mut [i32], pad_block: i32) -> Result<()> {
        const OP: &str = "BlockManager::fill_block_table_row";
        let blocks = &self.get(OP, seq)?.blocks;
        if blocks.len() > out.len() {
            return Err(Error::invalid(
                OP,
                format!(
                    "{seq} owns {} blocks but the block-table row holds {}; raise the \
                     table width (max_model_len / block_size)",
                    blocks.len(),
                    out.len()
                ),
            ));
        }
        let (head, tail) = out.split_at_mut(blocks.len());
        for (o, &b) in head.iter_mut().zip(blocks) {
            *o = b as i32;
        }
        tail.fill(pad_block);
        Ok(())
    }

    /// Whether `seq` is live.
    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// Live sequences, in no particular order.
    pub fn seqs(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.seqs.keys().copied()
    }

    /// Number of live sequences.
    pub fn num_seqs(&self) -> usize {
        self.seqs.len()
    }

    pub fn num_free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Blocks owned by live sequences.
    pub fn num_used_blocks(&self) -> usize {
        self.num_usable_blocks() - self.free.len()
    }

    /// All blocks, [`NULL_BLOCK`] included.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Blocks that can be handed out: `num_blocks - 1`.
    pub fn num_usable_blocks(&self) -> usize {
        self.num_blocks - 1
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    fn get(&self, op: &'static str, seq: SeqId) -> Result<&SeqBlocks> {
        self.seqs.get(&seq).ok_or_else(|| unknown(op, seq))
    }

    fn check_free(&self, needed: usize, what: impl FnOnce() -> String) -> Result<()> {
        if needed > self.free.len() {
            return Err(Error::OutOfBlocks {
                what: what(),
                needed,
                free: self.free.len(),
            });
        }
        Ok(())
    }
}

fn unknown(op: &'static str, seq: SeqId) -> Error {
    Error::invalid(op, format!("{seq} is not allocated"))
}
