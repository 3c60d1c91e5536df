//! The block manager: which cache blocks each live sequence owns, and which full blocks
//! are cached for reuse by later sequences with the same prefix (automatic prefix
//! caching). Pure bookkeeping, no device code.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::error::{Error, Result};

/// The block that is never handed to a sequence. Padding rows of a step point their
/// block-table row at it (seq_len 0, slot -1: nothing reads or writes it, but the row is
/// a valid index), and `KvCache::new` zeroes it.
pub const NULL_BLOCK: u32 = 0;

/// The chain id "before the first block": the parent of every sequence's block 0.
const ROOT: u64 = 0;

/// Identifies one sequence to the block manager (the engine's request id, or any other
/// unique number).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seq {}", self.0)
    }
}

/// What a cached block holds: the chain id of the block before it ([`ROOT`] for a
/// sequence's first block) and its own token ids. Equal keys mean equal prefixes, exactly:
/// the map compares whole keys, so a hash collision can never alias two prefixes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct BlockKey {
    parent: u64,
    tokens: Vec<u32>,
}

/// A cached block: its key and its chain id (unique for the manager's lifetime, never
/// reused, so a key naming an evicted parent can never match again).
#[derive(Clone, Debug)]
struct Cached {
    key: BlockKey,
    id: u64,
}

/// The cached blocks holding a prefix of some token sequence, from
/// [`BlockManager::lookup`]; hand it to [`BlockManager::allocate_with_prefix`] before
/// the manager changes (a stale hit is refused, not trusted).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixHit {
    /// The blocks, in position order, with the chain id each had at lookup.
    blocks: Vec<(u32, u64)>,
    num_tokens: usize,
}

impl PrefixHit {
    /// No cached prefix.
    pub fn none() -> Self {
        PrefixHit::default()
    }

    /// Tokens whose KV the hit's blocks hold (a whole number of blocks).
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// The blocks, in position order.
    pub fn blocks(&self) -> impl Iterator<Item = u32> + '_ {
        self.blocks.iter().map(|&(b, _)| b)
    }
}

/// Hands out cache blocks to sequences, takes them back, and keeps full blocks cached
/// for reuse.
///
/// **Prefix caching.** A block is *cached* once it is full and its KV is written: the
/// owner reports how many of its tokens are computed ([`BlockManager::commit`]), and each
/// newly completed block is keyed by (the chain id of the block before it, its token ids)
/// — a chain, so a block's identity includes every token before it. [`BlockManager::lookup`]
/// finds the longest run of cached blocks holding a prefix of a token sequence, and
/// [`BlockManager::allocate_with_prefix`] shares them with a new sequence (reference
/// counts) so only the rest is computed. A hit never covers a sequence's last token (it
/// is capped at `len - 1` tokens, rounded down to a block), so the block a step writes is
/// never shared and a whole-prompt hit still yields logits. When a block's last owner
/// frees it, a cached block stays cached but *evictable* (least recently freed first;
/// within one sequence its tail blocks first), an uncached one goes back to the free list.
/// Allocation takes free blocks first, then evicts the least recently used cached block.
/// Evictable blocks count as free everywhere ([`BlockManager::num_free_blocks`],
/// `can_allocate`, `can_append`). A manager whose owners never commit behaves exactly as
/// one without caching.
///
/// Invariants, checked by `tests/kv.rs`:
/// - a live sequence of `t` tokens owns exactly `ceil(t / block_size)` blocks, in
///   position order (token `p` lives in `block_table[p / block_size]`, row
///   `p % block_size`);
/// - a block's reference count is the number of live sequences owning it; only cached
///   (full, committed) blocks are owned by more than one, and [`NULL_BLOCK`] by none;
/// - every usable block is exactly one of: owned (count > 0), evictable (cached, count
///   0) or free (uncached, count 0); free + evictable + owned == `num_blocks - 1`;
/// - the cache maps each key to one block, and each cached block's key to itself;
/// - a failing call changes nothing.
///
/// The free list is a LIFO stack: the blocks freed last are handed out first (they are
/// the likeliest to still be in cache). A fresh manager hands out blocks `1, 2, 3, ...`.
#[derive(Clone, Debug)]
pub struct BlockManager {
    num_blocks: usize,
    block_size: usize,
    /// Free blocks (uncached, unowned); the top of the stack (the end) is handed out next.
    free: Vec<u32>,
    seqs: HashMap<SeqId, SeqBlocks>,
    /// Per block: how many live sequences own it.
    refs: Vec<u32>,
    /// Per block: its key and chain id while cached.
    cached: Vec<Option<Cached>>,
    /// Key -> cached block.
    index: HashMap<BlockKey, u32>,
    /// Evictable blocks (cached, unowned) by the tick they were freed at: the first entry
    /// is evicted next.
    evictable: BTreeMap<u64, u32>,
    /// Per block: its tick in `evictable` (meaningful while it is there).
    freed_at: Vec<u64>,
    tick: u64,
    /// Cached blocks evicted so far.
    evictions: u64,
    /// The next chain id to hand out (ids start after [`ROOT`]).
    next_id: u64,
}

#[derive(Clone, Debug, Default)]
struct SeqBlocks {
    blocks: Vec<u32>,
    num_tokens: usize,
    /// Leading blocks whose content is committed (cached, by this block or an equal one).
    committed: usize,
    /// The chain id of the last committed block ([`ROOT`] when none).
    chain: u64,
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
            refs: vec![0; num_blocks],
            cached: vec![None; num_blocks],
            index: HashMap::new(),
            evictable: BTreeMap::new(),
            freed_at: vec![0; num_blocks],
            tick: 0,
            evictions: 0,
            next_id: ROOT + 1,
        })
    }

    /// Start tracking a new sequence holding `num_tokens` tokens (its prompt, or the
    /// first chunk of it). Fails if `seq` is already live or too few blocks are free.
    pub fn allocate(&mut self, seq: SeqId, num_tokens: usize) -> Result<()> {
        self.allocate_with_prefix(seq, &PrefixHit::none(), num_tokens)
    }

    /// The longest run of cached blocks holding a prefix of `tokens`, capped so the hit
    /// leaves at least the last token to compute: at most `(tokens.len() - 1) /
    /// block_size` blocks.
    pub fn lookup(&self, tokens: &[u32]) -> PrefixHit {
        let bs = self.block_size;
        let max_blocks = tokens.len().saturating_sub(1) / bs;
        let mut hit = PrefixHit::none();
        let mut key = BlockKey {
            parent: ROOT,
            tokens: Vec::with_capacity(bs),
        };
        for chunk in tokens.chunks_exact(bs).take(max_blocks) {
            key.tokens.clear();
            key.tokens.extend_from_slice(chunk);
            let Some(&b) = self.index.get(&key) else {
                break;
            };
            let id = self.cached[b as usize]
                .as_ref()
                .expect("indexed blocks are cached")
                .id;
            hit.blocks.push((b, id));
            key.parent = id;
        }
        hit.num_tokens = hit.blocks.len() * bs;
        hit
    }

    /// Start tracking a new sequence holding `num_tokens` tokens whose first
    /// `hit.num_tokens()` are the cached prefix `hit` (from [`BlockManager::lookup`] on
    /// this manager, unchanged since): it shares the hit's blocks and takes new ones for
    /// the rest. Fails if `seq` is live, the hit is stale or longer than `num_tokens`, or
    /// too few blocks are free.
    pub fn allocate_with_prefix(
        &mut self,
        seq: SeqId,
        hit: &PrefixHit,
        num_tokens: usize,
    ) -> Result<()> {
        const OP: &str = "BlockManager::allocate";
        if self.seqs.contains_key(&seq) {
            return Err(Error::invalid(
                OP,
                format!("{seq} is already allocated; free it first"),
            ));
        }
        self.check_hit(OP, hit, num_tokens)?;
        let needed = self.blocks_for_tokens(num_tokens) - hit.blocks.len();
        let available = self.num_free_blocks() - self.unowned_in(hit);
        if needed > available {
            return Err(Error::OutOfBlocks {
                what: format!("allocating {seq} ({num_tokens} tokens)"),
                needed,
                free: available,
            });
        }
        let mut blocks = Vec::with_capacity(hit.blocks.len() + needed);
        for b in hit.blocks() {
            self.own(b);
            blocks.push(b);
        }
        self.take(needed, &mut blocks);
        let (committed, chain) = match hit.blocks.last() {
            Some(&(_, id)) => (hit.blocks.len(), id),
            None => (0, ROOT),
        };
        self.seqs.insert(
            seq,
            SeqBlocks {
                blocks,
                num_tokens,
                committed,
                chain,
            },
        );
        Ok(())
    }

    /// Grow a live sequence by `n` tokens, taking a new block only when the tokens cross
    /// a block boundary.
    pub fn append(&mut self, seq: SeqId, n: usize) -> Result<()> {
        let needed = self.append_blocks_needed(seq, n)?;
        self.check_free(needed, || format!("appending {n} tokens to {seq}"))?;
        let mut new = Vec::with_capacity(needed);
        self.take(needed, &mut new);
        let s = self.seqs.get_mut(&seq).expect("checked above");
        s.blocks.extend(new);
        s.num_tokens += n;
        Ok(())
    }

    /// Record that the first `computed` tokens of `seq` have their KV in the cache;
    /// `tokens` holds at least those tokens (the sequence's prompt and output so far).
    /// Every block this completes becomes cached, for [`BlockManager::lookup`]. A block
    /// whose content another block already caches stays uncached (its sequence's chain
    /// goes on from the cached one). Fails, changing nothing, if `seq` is not live or
    /// holds fewer than `computed` tokens, or `tokens` is shorter than `computed`.
    pub fn commit(&mut self, seq: SeqId, tokens: &[u32], computed: usize) -> Result<()> {
        const OP: &str = "BlockManager::commit";
        let bs = self.block_size;
        let s = self.seqs.get_mut(&seq).ok_or_else(|| unknown(OP, seq))?;
        if computed > s.num_tokens || computed > tokens.len() {
            return Err(Error::invalid(
                OP,
                format!(
                    "{computed} computed tokens of {seq}, which holds {} ({} token ids given)",
                    s.num_tokens,
                    tokens.len()
                ),
            ));
        }
        let full = computed / bs;
        while s.committed < full {
            let i = s.committed;
            let key = BlockKey {
                parent: s.chain,
                tokens: tokens[i * bs..(i + 1) * bs].to_vec(),
            };
            s.chain = match self.index.get(&key) {
                Some(&b) => {
                    self.cached[b as usize]
                        .as_ref()
                        .expect("indexed blocks are cached")
                        .id
                }
                None => {
                    let b = s.blocks[i];
                    let id = self.next_id;
                    self.next_id += 1;
                    self.index.insert(key.clone(), b);
                    self.cached[b as usize] = Some(Cached { key, id });
                    id
                }
            };
            s.committed += 1;
        }
        Ok(())
    }

    /// Shrink a live sequence to its first `num_tokens` tokens (speculative decoding: the
    /// KV of rejected drafts is dropped), giving back the blocks past them as
    /// [`BlockManager::free`] does (the tail's first). Fails, changing nothing, if `seq` is
    /// not live, holds fewer than `num_tokens` tokens, or `num_tokens` cuts into its
    /// committed blocks (cached content other sequences may share is never cut).
    pub fn truncate(&mut self, seq: SeqId, num_tokens: usize) -> Result<()> {
        const OP: &str = "BlockManager::truncate";
        let bs = self.block_size;
        let s = self.seqs.get_mut(&seq).ok_or_else(|| unknown(OP, seq))?;
        if num_tokens > s.num_tokens || num_tokens < s.committed * bs {
            return Err(Error::invalid(
                OP,
                format!(
                    "{seq} to {num_tokens} tokens: it holds {}, the first {} committed",
                    s.num_tokens,
                    s.committed * bs
                ),
            ));
        }
        let keep = num_tokens.div_ceil(bs);
        let dropped = s.blocks.split_off(keep);
        s.num_tokens = num_tokens;
        // Past the committed blocks, so uncached and owned by `seq` alone.
        for &b in dropped.iter().rev() {
            debug_assert!(self.cached[b as usize].is_none() && self.refs[b as usize] == 1);
            self.refs[b as usize] = 0;
            self.free.push(b);
        }
        Ok(())
    }

    /// Stop tracking `seq`. Each of its blocks that no other sequence owns becomes
    /// evictable if cached (tail blocks first in eviction order) or free otherwise.
    pub fn free(&mut self, seq: SeqId) -> Result<()> {
        let s = self
            .seqs
            .remove(&seq)
            .ok_or_else(|| unknown("BlockManager::free", seq))?;
        // From the tail, so a sequence's later blocks are evicted before its earlier ones
        // and the free list hands uncached blocks back in the same order.
        for &b in s.blocks.iter().rev() {
            let r = &mut self.refs[b as usize];
            *r -= 1;
            if *r > 0 {
                continue;
            }
            if self.cached[b as usize].is_some() {
                self.tick += 1;
                self.freed_at[b as usize] = self.tick;
                self.evictable.insert(self.tick, b);
            } else {
                self.free.push(b);
            }
        }
        Ok(())
    }

    /// Whether a new sequence of `num_tokens` tokens would fit now.
    pub fn can_allocate(&self, num_tokens: usize) -> bool {
        self.blocks_for_tokens(num_tokens) <= self.num_free_blocks()
    }

    /// Whether a new sequence of `num_tokens` tokens starting with the cached prefix
    /// `hit` would fit now (false for a stale hit or one longer than `num_tokens`).
    pub fn can_allocate_with_prefix(&self, hit: &PrefixHit, num_tokens: usize) -> bool {
        self.check_hit("BlockManager::allocate", hit, num_tokens)
            .is_ok()
            && self.blocks_for_tokens(num_tokens) - hit.blocks.len()
                <= self.num_free_blocks() - self.unowned_in(hit)
    }

    /// Whether `seq` is live and could grow by `n` tokens now.
    pub fn can_append(&self, seq: SeqId, n: usize) -> bool {
        self.append_blocks_needed(seq, n)
            .is_ok_and(|needed| needed <= self.num_free_blocks())
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

    /// Blocks a new sequence or a growing one can take: the free ones and the evictable
    /// cached ones.
    pub fn num_free_blocks(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// Blocks owned by live sequences (a shared block counts once).
    pub fn num_used_blocks(&self) -> usize {
        self.num_usable_blocks() - self.num_free_blocks()
    }

    /// Cached blocks, owned or evictable.
    pub fn num_cached_blocks(&self) -> usize {
        self.index.len()
    }

    /// Cached blocks no sequence owns (counted in [`BlockManager::num_free_blocks`]).
    pub fn num_evictable_blocks(&self) -> usize {
        self.evictable.len()
    }

    /// Cached blocks evicted (taken for new tokens) so far.
    pub fn num_evictions(&self) -> u64 {
        self.evictions
    }

    /// How many live sequences own `block` (0 for a block out of range).
    pub fn ref_count(&self, block: u32) -> usize {
        self.refs.get(block as usize).map_or(0, |&r| r as usize)
    }

    /// Whether `block` is cached (full, committed, findable by [`BlockManager::lookup`]).
    pub fn is_cached(&self, block: u32) -> bool {
        self.cached.get(block as usize).is_some_and(Option::is_some)
    }

    /// The evictable blocks, next to be evicted first.
    pub fn eviction_order(&self) -> impl Iterator<Item = u32> + '_ {
        self.evictable.values().copied()
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

    /// Check the internal bookkeeping against the invariants of the type's docs
    /// (reference counts against the sequences' tables, the free / evictable / owned
    /// partition, the cache index against the cached blocks); the first violation, named.
    /// For tests and debugging: it walks everything.
    pub fn check_consistency(&self) -> Result<()> {
        const OP: &str = "BlockManager::check_consistency";
        let bad = |m: String| Err(Error::invalid(OP, m));
        let mut refs = vec![0u32; self.num_blocks];
        for (seq, s) in &self.seqs {
            if s.blocks.len() != self.blocks_for_tokens(s.num_tokens) {
                return bad(format!(
                    "{seq} holds {} tokens in {} blocks",
                    s.num_tokens,
                    s.blocks.len()
                ));
            }
            if s.committed > s.num_tokens / self.block_size {
                return bad(format!(
                    "{seq} committed {} blocks of {} tokens",
                    s.committed, s.num_tokens
                ));
            }
            for &b in &s.blocks {
                if b == NULL_BLOCK || b as usize >= self.num_blocks {
                    return bad(format!("{seq} owns block {b}"));
                }
                refs[b as usize] += 1;
            }
        }
        let mut state = vec![0u8; self.num_blocks];
        for &b in &self.free {
            state[b as usize] += 1;
            if self.cached[b as usize].is_some() {
                return bad(format!("free block {b} is cached"));
            }
        }
        for (&t, &b) in &self.evictable {
            state[b as usize] += 1;
            if self.cached[b as usize].is_none() || self.freed_at[b as usize] != t {
                return bad(format!("evictable block {b} is not cached at tick {t}"));
            }
        }
        for b in 1..self.num_blocks {
            if refs[b] != self.refs[b] {
                return bad(format!(
                    "block {b}: count {} but {} owners",
                    self.refs[b], refs[b]
                ));
            }
            let owned = u8::from(refs[b] > 0);
            if state[b] + owned != 1 {
                return bad(format!(
                    "block {b} is in {} of free / evictable / owned",
                    state[b] + owned
                ));
            }
            if refs[b] > 1 && self.cached[b].is_none() {
                return bad(format!("uncached block {b} has {} owners", refs[b]));
            }
        }
        if self.refs[NULL_BLOCK as usize] != 0
            || state[NULL_BLOCK as usize] != 0
            || self.cached[0].is_some()
        {
            return bad(format!("the null block {NULL_BLOCK} is in use"));
        }
        let cached = self.cached.iter().filter(|c| c.is_some()).count();
        if cached != self.index.len() {
            return bad(format!(
                "{cached} cached blocks but {} index entries",
                self.index.len()
            ));
        }
        for (key, &b) in &self.index {
            match &self.cached[b as usize] {
                Some(c) if &c.key == key => {}
                _ => return bad(format!("index entry of block {b} does not match its key")),
            }
        }
        Ok(())
    }

    fn get(&self, op: &'static str, seq: SeqId) -> Result<&SeqBlocks> {
        self.seqs.get(&seq).ok_or_else(|| unknown(op, seq))
    }

    fn check_free(&self, needed: usize, what: impl FnOnce() -> String) -> Result<()> {
        if needed > self.num_free_blocks() {
            return Err(Error::OutOfBlocks {
                what: what(),
                needed,
                free: self.num_free_blocks(),
            });
        }
        Ok(())
    }

    /// `hit` is current (each block still cached under the id seen at lookup) and no
    /// longer than `num_tokens`.
    fn check_hit(&self, op: &'static str, hit: &PrefixHit, num_tokens: usize) -> Result<()> {
        if hit.num_tokens > num_tokens {
            return Err(Error::invalid(
                op,
                format!(
                    "a cached prefix of {} tokens for a sequence of {num_tokens}",
                    hit.num_tokens
                ),
            ));
        }
        for &(b, id) in &hit.blocks {
            let current = matches!(self.cached.get(b as usize), Some(Some(c)) if c.id == id);
            if !current {
                return Err(Error::invalid(
                    op,
                    format!("the cached prefix is stale: block {b} was evicted since the lookup"),
                ));
            }
        }
        Ok(())
    }

    /// Blocks of `hit` that no sequence owns (evictable now, taken out of the free count
    /// when shared).
    fn unowned_in(&self, hit: &PrefixHit) -> usize {
        hit.blocks().filter(|&b| self.refs[b as usize] == 0).count()
    }

    /// One more owner of cached block `b` (no longer evictable).
    fn own(&mut self, b: u32) {
        let r = &mut self.refs[b as usize];
        if *r == 0 {
            self.evictable.remove(&self.freed_at[b as usize]);
        }
        *r += 1;
    }

    /// Append `n` blocks, owned once each, to `out`: free blocks first (top of the stack
    /// first), then the least recently freed evictable ones, uncached. The caller checked
    /// that `n <= num_free_blocks()`.
    fn take(&mut self, n: usize, out: &mut Vec<u32>) {
        for _ in 0..n {
            let b = match self.free.pop() {
                Some(b) => b,
                None => {
                    let (_, b) = self.evictable.pop_first().expect("checked: enough blocks");
                    let c = self.cached[b as usize]
                        .take()
                        .expect("evictable blocks are cached");
                    self.index.remove(&c.key);
                    self.evictions += 1;
                    b
                }
            };
            self.refs[b as usize] = 1;
            out.push(b);
        }
    }
}

fn unknown(op: &'static str, seq: SeqId) -> Error {
    Error::invalid(op, format!("{seq} is not allocated"))
}
