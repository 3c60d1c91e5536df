//! The KV cache's device memory: one allocation for every layer's keys and values, and
//! its sizing from a memory budget.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

use super::NULL_BLOCK;

/// Fewest blocks (the null block included) a memory budget must hold for
/// [`KvCache::size_from_free_memory`] to succeed. A sanity floor only: whether the
/// longest sequence fits is the engine's check.
pub const MIN_KV_BLOCKS: usize = 4;

/// Shape of the cache, from the model config and the engine config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvCacheConfig {
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// A float dtype (the model's activation dtype).
    pub dtype: DType,
}

impl KvCacheConfig {
    /// Bytes one block takes over all layers, K and V:
    /// `num_layers * 2 * block_size * num_kv_heads * head_dim * dtype.size()`.
    /// Saturates instead of overflowing (a config that large fails [`Self::validate`]).
    pub fn bytes_per_block(&self) -> usize {
        [
            self.num_layers,
            2,
            self.block_size,
            self.num_kv_heads,
            self.head_dim,
            self.dtype.size(),
        ]
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .unwrap_or(usize::MAX)
    }

    /// Elements of one block of one layer's K (or V): `block_size * num_kv_heads * head_dim`.
    pub fn block_numel(&self) -> usize {
        self.block_size * self.num_kv_heads * self.head_dim
    }

    /// Every dimension non-zero, a float dtype, and a block small enough to count.
    pub fn validate(&self) -> Result<()> {
        const OP: &str = "KvCacheConfig";
        for (name, v) in [
            ("num_layers", self.num_layers),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("block_size", self.block_size),
        ] {
            if v == 0 {
                return Err(Error::invalid(OP, format!("{name} must be at least 1")));
            }
        }
        if !self.dtype.is_float() {
            return Err(Error::invalid(
                OP,
                format!("dtype {} is not a float dtype", self.dtype),
            ));
        }
        if self.bytes_per_block() == usize::MAX {
            return Err(Error::invalid(
                OP,
                format!("one block of {self:?} overflows usize"),
            ));
        }
        Ok(())
    }
}

/// Every layer's K and V cache in one backend allocation of shape
/// `[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]` (index 0 of the
/// second dimension is K, 1 is V), with per-layer views of shape
/// `[num_blocks, block_size, num_kv_heads, head_dim]`, the layout
/// [`Backend::kv_write`] and [`crate::Attention`] take.
///
/// Block [`NULL_BLOCK`] of every layer is zeroed at creation; the rest is uninitialised
/// (attention never reads a token it has not been given: see `seq_lens`).
pub struct KvCache {
    cfg: KvCacheConfig,
    num_blocks: usize,
    full: Tensor,
    k: Vec<Tensor>,
    v: Vec<Tensor>,
}

impl KvCache {
    /// Allocate a cache of `num_blocks` blocks (the null block included: pass the same
    /// number to [`super::BlockManager::new`]).
    pub fn new(backend: &dyn Backend, cfg: KvCacheConfig, num_blocks: usize) -> Result<KvCache> {
        cfg.validate()?;
        if num_blocks < 2 {
            return Err(Error::invalid(
                "KvCache::new",
                format!(
                    "num_blocks is {num_blocks}, need at least 2 (block {NULL_BLOCK} is \
                     reserved for padding)"
                ),
            ));
        }
        if cfg.bytes_per_block().checked_mul(num_blocks).is_none() {
            return Err(Error::invalid(
                "KvCache::new",
                format!("{num_blocks} blocks of {cfg:?} overflow usize"),
            ));
        }
        let KvCacheConfig {
            num_layers,
            num_kv_heads: kvh,
            head_dim: hd,
            block_size: bs,
            dtype,
        } = cfg;
        let full = backend.alloc(dtype, &[num_layers, 2, num_blocks, bs, kvh, hd])?;
        // One row per (layer, K|V) so that `narrow` picks a layer's K or V.
        let by_kv = full.reshape(&[num_layers * 2, num_blocks, bs, kvh, hd])?;
        let layer_view = |i: usize| by_kv.narrow(i, 1)?.reshape(&[num_blocks, bs, kvh, hd]);
        let k = (0..num_layers)
            .map(|l| layer_view(2 * l))
            .collect::<Result<Vec<_>>>()?;
        let v = (0..num_layers)
            .map(|l| layer_view(2 * l + 1))
            .collect::<Result<Vec<_>>>()?;
        let zeros = vec![0u8; cfg.block_numel() * dtype.size()];
        for t in k.iter().chain(&v) {
            backend.write_bytes(&t.narrow(NULL_BLOCK as usize, 1)?, &zeros)?;
        }
        Ok(KvCache {
            cfg,
            num_blocks,
            full,
            k,
            v,
        })
    }

    /// Layer `layer`'s key cache, `[num_blocks, block_size, num_kv_heads, head_dim]`.
    ///
    /// # Panics
    /// If `layer >= num_layers` (a bug in the caller, like indexing a slice).
    pub fn k(&self, layer: usize) -> &Tensor {
        &self.k[layer]
    }

    /// Layer `layer`'s value cache; see [`KvCache::k`].
    pub fn v(&self, layer: usize) -> &Tensor {
        &self.v[layer]
    }

    /// The whole allocation, `[num_layers, 2, num_blocks, block_size, num_kv_heads,
    /// head_dim]`.
    pub fn tensor(&self) -> &Tensor {
        &self.full
    }

    pub fn config(&self) -> &KvCacheConfig {
        &self.cfg
    }

    /// Blocks, the null block included.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// See [`KvCacheConfig::bytes_per_block`].
    pub fn bytes_per_block(&self) -> usize {
        self.cfg.bytes_per_block()
    }

    /// Bytes of the whole allocation.
    pub fn size_bytes(&self) -> usize {
        self.full.size_bytes()
    }

    /// How many blocks (the null block included) fit in `bytes`, capped so that every
    /// slot fits in an i32.
    pub fn num_blocks_for_budget(cfg: &KvCacheConfig, bytes: usize) -> usize {
        let max_by_slots = i32::MAX as usize / cfg.block_size.max(1);
        (bytes / cfg.bytes_per_block().max(1)).min(max_by_slots)
    }

    /// Size the cache from the device's free memory (measured after loading weights and
    /// warming up): use `fraction` of `free_bytes`, minus `reserve_bytes` kept back for
    /// anything allocated later. Fails with [`Error::OutOfMemory`] naming the bytes
    /// [`MIN_KV_BLOCKS`] blocks need when not even those fit.
    pub fn size_from_free_memory(
        cfg: &KvCacheConfig,
        free_bytes: usize,
        fraction: f64,
        reserve_bytes: usize,
    ) -> Result<usize> {
        cfg.validate()?;
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(Error::invalid(
                "KvCache::size_from_free_memory",
                format!("fraction {fraction} is not in (0, 1]"),
            ));
        }
        let budget = ((free_bytes as f64 * fraction) as usize).saturating_sub(reserve_bytes);
        let n = Self::num_blocks_for_budget(cfg, budget);
        if n < MIN_KV_BLOCKS {
            let required = MIN_KV_BLOCKS.saturating_mul(cfg.bytes_per_block());
            return Err(Error::OutOfMemory {
                device: "the KV cache budget".to_string(),
                bytes: required,
                what: format!(
                    "{MIN_KV_BLOCKS} KV blocks of {} bytes: the budget is {budget} bytes \
                     ({fraction} x {free_bytes} free - {reserve_bytes} reserved); free \
                     memory, raise the fraction or shrink the reserve",
                    cfg.bytes_per_block()
                ),
            });
        }
        Ok(n)
    }
}
