//! The device memory of an expert cache ([`crate::args::ExpertCache`]): its tables and
//! slots, owned, every slot empty at the start.

use super::Backend;
use crate::args::ExpertCache;
use crate::error::Result;
use crate::tensor::{DType, Tensor};

/// Entries of [`ExpertCache::stats`].
pub const STATS: usize = 5;

/// An expert cache's tables and slots for `layers` layers of `experts` experts (the
/// tensors [`ExpertCache`] borrows; see it for their meaning).
pub struct ExpertSlots {
    pub slot_of: Tensor,
    pub owner: Tensor,
    pub score: Tensor,
    pub fills: Tensor,
    pub stats: Tensor,
    pub gate_up_slots: Tensor,
    pub down_slots: Tensor,
    /// i32 `[2, 1 + 2 * experts]`: the prefetches' fills
    /// ([`crate::args::ExpertPrefetch::fills`]), two rows for successive prefetches to
    /// alternate between ([`ExpertSlots::prefetch_fills`]).
    pub prefetch_fills: Tensor,
}

impl ExpertSlots {
    /// `slots` empty slots of `gate_up_slot` and `down_slot` bytes (multiples of 16, at
    /// least a layer's expert: [`Backend::moe`] checks), no expert cached, scores 0.
    pub fn new(
        be: &dyn Backend,
        layers: usize,
        experts: usize,
        slots: usize,
        gate_up_slot: usize,
        down_slot: usize,
    ) -> Result<Self> {
        Ok(ExpertSlots {
            gate_up_slots: be.alloc(DType::I32, &[slots, gate_up_slot / 4])?,
            down_slots: be.alloc(DType::I32, &[slots, down_slot / 4])?,
            slot_of: be.upload(&vec![-1i32; layers * experts], &[layers, experts])?,
            owner: be.upload(&vec![-1i32; slots], &[slots])?,
            score: be.upload(&vec![0f32; layers * experts], &[layers, experts])?,
            fills: be.upload(&vec![0i32; 1 + 2 * experts], &[1 + 2 * experts])?,
            stats: be.upload(&[0i64; STATS], &[STATS])?,
            prefetch_fills: be.upload(&vec![0i32; 2 + 4 * experts], &[2, 1 + 2 * experts])?,
        })
    }

    /// The tensors `c` borrows, held (the CPU backend's queued op keeps them).
    pub fn of(c: &ExpertCache<'_>) -> Self {
        ExpertSlots {
            slot_of: c.slot_of.clone(),
            owner: c.owner.clone(),
            score: c.score.clone(),
            fills: c.fills.clone(),
            stats: c.stats.clone(),
            gate_up_slots: c.gate_up_slots.clone(),
            down_slots: c.down_slots.clone(),
            // Unread by the queued op: a prefetch's own fills row travels with its args.
            prefetch_fills: c.fills.clone(),
        }
    }

    /// The fills row of the `i`-th prefetch of a sequence ([`crate::args::ExpertPrefetch`]:
    /// successive ones alternate, as one's copies may still read its row while the next
    /// is planned).
    pub fn prefetch_fills(&self, i: usize) -> Result<Tensor> {
        let w = self.prefetch_fills.dim(1);
        self.prefetch_fills.narrow(i % 2, 1)?.reshape(&[w])
    }

    /// The cache arguments of layer `layer`'s MoE call, scores decaying by `decay`.
    pub fn args(&self, layer: usize, decay: f32) -> ExpertCache<'_> {
        ExpertCache {
            layer,
            slot_of: &self.slot_of,
            owner: &self.owner,
            score: &self.score,
            fills: &self.fills,
            stats: &self.stats,
            gate_up_slots: &self.gate_up_slots,
            down_slots: &self.down_slots,
            decay,
            prefetch: None,
        }
    }

    /// The running totals ([`ExpertCache::stats`]: distinct experts needed, hits, misses,
    /// bytes filled, experts prefetched); synchronises with the device.
    pub fn totals(&self, be: &dyn Backend) -> Result<[u64; STATS]> {
        let v = be.download::<i64>(&self.stats)?;
        Ok(std::array::from_fn(|i| v[i].max(0) as u64))
    }
}
