//! Paged KV cache: the block manager (which blocks each sequence owns, pure bookkeeping)
//! and the cache's device memory (one allocation, per-layer views).
//!
//! Block [`NULL_BLOCK`] (block 0) is reserved: never handed to a sequence, zeroed at
//! creation. A padded row of a step is an empty sequence pointing at it: seq_len 0,
//! slot -1, block-table row all [`NULL_BLOCK`] — a valid row that nothing reads or writes.
//! Both [`BlockManager::new`] and [`KvCache::new`] take the block count *including* it.

mod block_manager;
mod cache;

pub use block_manager::{BlockManager, PrefixHit, SeqId, NULL_BLOCK};
pub use cache::{KvCache, KvCacheConfig, MIN_KV_BLOCKS};
