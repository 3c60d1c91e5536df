//! The KV cache's device memory: one allocation for every layer's keys and values, and
//! its sizing from a memory budget.

use crate::backend::{Backend, KvScale};
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
    /// A float dtype (usually the model's activation dtype) or [`DType::F8E4M3`].
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

    /// Every dimension non-zero, a KV cache dtype, and a block small enough to count.
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
        if !self.dtype.is_kv_cache() {
            return Err(Error::invalid(
                OP,
                format!(
                    "dtype {} cannot hold a KV cache (bf16, f16, f32 or f8e4m3)",
                    self.dtype
                ),
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
///
/// An FP8 cache ([`DType::F8E4M3`]) stores each layer's keys and values divided by that
/// layer's [`KvScale`] (1.0 until [`KvCache::set_scales`]).
pub struct KvCache {
    cfg: KvCacheConfig,
    num_blocks: usize,
    full: Tensor,
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    scales: Vec<KvScale>,
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
            scales: vec![KvScale::ONE; num_layers],
        })
    }

    /// Layer `layer`'s scales (what [`crate::QkvRope`] and [`crate::Attention`] take; a
    /// cache of a float dtype ignores them).
    ///
    /// # Panics
    /// If `layer >= num_layers`.
    pub fn scale(&self, layer: usize) -> KvScale {
        self.scales[layer]
    }

    /// Set every layer's scales (a checkpoint's `k_scale` / `v_scale`): one per layer,
    /// finite and positive. Only before anything is written: the cache's bytes are the
    /// values divided by the scales they were written with.
    pub fn set_scales(&mut self, scales: Vec<KvScale>) -> Result<()> {
        if scales.len() != self.cfg.num_layers {
            return Err(Error::invalid(
                "KvCache::set_scales",
                format!("{} scales for {} layers", scales.len(), self.cfg.num_layers),
            ));
        }
        if let Some((l, s)) = scales.iter().enumerate().find(|(_, s)| !s.is_valid()) {
            return Err(Error::invalid(
                "KvCache::set_scales",
                format!("layer {l}: {s:?} is not finite and positive"),
            ));
        }
        self.scales = scales;
        Ok(())
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
