//! The samples of a launched step ([`super::Runner::launch`]) on their way to the host:
//! kept on the device for the next step's token ids, and copied into page-locked
//! staging with their log-probabilities where asked, two sets used in turn (a step's
//! samples are read after the next step is queued).

use crate::backend::{Backend, HostStaging, MAX_TOP_LOGPROBS};
use crate::error::{Error, Result};
use crate::request::TokenLogprobs;
use crate::tensor::{DType, Tensor};

use super::sampling::LogprobBuffers;

/// One launched step's host copies: the ids, and the log-probabilities' three parts.
struct Slot {
    ids: HostStaging,
    lp_token: HostStaging,
    lp_ids: HostStaging,
    lp_top: HostStaging,
}

pub(super) struct Deferred {
    /// A copy of the last launched step's samples, `[max_seqs]` i32: the step after it
    /// takes its decode rows' ids from here (a capture between the two overwrites the
    /// sampling output, never this).
    prev: Tensor,
    slots: [Slot; 2],
    /// The slot the last launched step used.
    last: usize,
}

impl Deferred {
    pub fn new(be: &dyn Backend, max_seqs: usize) -> Result<Self> {
        let slot = || -> Result<Slot> {
            Ok(Slot {
                ids: be.alloc_staging(max_seqs * 4)?,
                lp_token: be.alloc_staging(max_seqs * 4)?,
                lp_ids: be.alloc_staging(max_seqs * MAX_TOP_LOGPROBS * 4)?,
                lp_top: be.alloc_staging(max_seqs * MAX_TOP_LOGPROBS * 4)?,
            })
        };
        Ok(Deferred {
            prev: be.alloc(DType::I32, &[max_seqs])?,
            slots: [slot()?, slot()?],
            last: 1,
        })
    }

    /// Device bytes beside the host staging, for a memory estimate.
    pub fn device_bytes(max_seqs: usize) -> usize {
        max_seqs * 4
    }

    /// The last launched step's samples on the device.
    pub fn prev(&self) -> &Tensor {
        &self.prev
    }

    /// Keep the first `b` rows of `sampled` (the step just queued) on the device for the
    /// next step and queue their copy to the host, with their log-probabilities `lp` when
    /// `logprobs`; returns the slot [`Deferred::read`] reads them from.
    pub fn defer(
        &mut self,
        be: &dyn Backend,
        sampled: &Tensor,
        lp: &LogprobBuffers,
        b: usize,
        logprobs: bool,
    ) -> Result<usize> {
        let prev = self.prev.prefix(b)?;
        be.copy(&sampled.prefix(b)?, &prev)?;
        self.last ^= 1;
        let s = &mut self.slots[self.last];
        be.download_staging(&prev, &mut s.ids)?;
        if logprobs {
            be.download_staging(&lp.token.prefix(b)?, &mut s.lp_token)?;
            be.download_staging(&lp.top_ids.prefix(b)?, &mut s.lp_ids)?;
            be.download_staging(&lp.top.prefix(b)?, &mut s.lp_top)?;
        }
        Ok(self.last)
    }

    /// The `nums.len()` samples of slot `slot`, once they are on the host, with
    /// `nums[r]` top log-probabilities for row `r` (`None`: none).
    pub fn read(
        &mut self,
        slot: usize,
        nums: &[Option<usize>],
    ) -> Result<(Vec<u32>, Vec<Option<TokenLogprobs>>)> {
        let b = nums.len();
        let Slot {
            ids,
            lp_token,
            lp_ids,
            lp_top,
        } = &mut self.slots[slot & 1];
        let ids: Vec<u32> = words::<i32>(ids, b)?.iter().map(|&t| t as u32).collect();
        if nums.iter().all(Option::is_none) {
            return Ok((ids, vec![None; b]));
        }
        let token = words::<f32>(lp_token, b)?;
        let top_ids = words::<i32>(lp_ids, b * MAX_TOP_LOGPROBS)?;
        let top = words::<f32>(lp_top, b * MAX_TOP_LOGPROBS)?;
        Ok((ids, logprobs_of(nums, token, top_ids, top)))
    }
}

/// The first `n` 4-byte values of `staging`, once its last copy has landed.
fn words<T: bytemuck::Pod>(staging: &mut HostStaging, n: usize) -> Result<&[T]> {
    let bytes = staging.bytes_mut()?;
    let have = bytes.len();
    bytes
        .get(..n * 4)
        .and_then(|b| bytemuck::try_cast_slice(b).ok())
        .ok_or_else(|| {
            Error::invalid(
                "runner.collect",
                format!("{n} values asked of a {have}-byte sample staging"),
            )
        })
}

/// Per row `r` with `nums[r]` set: the sampled token's log-probability `token[r]` and
/// the row's first `nums[r]` (at most [`MAX_TOP_LOGPROBS`]) entries of `ids`/`top`
/// (`[rows, MAX_TOP_LOGPROBS]`; a negative id ends them).
pub(super) fn logprobs_of(
    nums: &[Option<usize>],
    token: &[f32],
    ids: &[i32],
    top: &[f32],
) -> Vec<Option<TokenLogprobs>> {
    nums.iter()
        .enumerate()
        .map(|(r, n)| {
            let n = (*n)?.min(MAX_TOP_LOGPROBS);
            let at = r * MAX_TOP_LOGPROBS;
            let top = ids[at..at + n]
                .iter()
                .zip(&top[at..at + n])
                .filter_map(|(&id, &lp)| u32::try_from(id).ok().map(|id| (id, lp)))
                .collect();
            Some(TokenLogprobs {
                logprob: token[r],
                top,
            })
        })
        .collect()
}
