//! Host staging: the host bytes a step's inputs are packed into before their one upload
//! ([`super::Backend::upload_staging`]). On CUDA it is page-locked, so the upload is a true
//! asynchronous DMA queued on the stream (no driver-side bounce copy, no host stall); the
//! bytes then stay borrowed by the copy until the stream passes it, which
//! [`HostStaging::bytes_mut`] waits for before handing them out again.

use crate::error::{Error, Result};
use crate::tensor::Tensor;

use super::cuda::PinnedStaging;

/// Host bytes for uploads; see the module docs.
pub struct HostStaging(pub(crate) Staging);

pub(crate) enum Staging {
    /// Ordinary heap memory (the CPU backend, or CUDA's fallback), `len` bytes held in
    /// 8-byte words (so the bytes are aligned for any word view): uploads copy it at once.
    Heap(Vec<u64>, usize),
    /// Page-locked memory with the event of the last upload that reads it.
    Pinned(PinnedStaging),
}

impl HostStaging {
    /// `len` zeroed bytes of ordinary heap memory.
    pub fn heap(len: usize) -> Self {
        HostStaging(Staging::Heap(vec![0u64; len.div_ceil(8)], len))
    }

    pub fn len(&self) -> usize {
        match &self.0 {
            Staging::Heap(_, len) => *len,
            Staging::Pinned(p) => p.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether uploads from this staging are asynchronous DMA (page-locked memory).
    pub fn is_pinned(&self) -> bool {
        matches!(self.0, Staging::Pinned(_))
    }

    /// The bytes, to read (an upload in flight only reads them too).
    pub fn bytes(&self) -> &[u8] {
        match &self.0 {
            Staging::Heap(v, len) => &bytemuck::cast_slice(v)[..*len],
            Staging::Pinned(p) => p.bytes(),
        }
    }

    /// The first `dst.size_bytes()` bytes, what an upload into `dst` copies; an error when
    /// the staging is smaller than `dst`.
    pub fn prefix_for(&self, dst: &Tensor) -> Result<&[u8]> {
        let n = dst.size_bytes();
        self.bytes().get(..n).ok_or_else(|| {
            Error::invalid(
                "upload_staging",
                format!(
                    "staging of {} bytes is smaller than dst ({n} bytes)",
                    self.len()
                ),
            )
        })
    }

    /// The bytes, to write the next step into: first waits for an upload still reading
    /// them.
    pub fn bytes_mut(&mut self) -> Result<&mut [u8]> {
        match &mut self.0 {
            Staging::Heap(v, len) => Ok(&mut bytemuck::cast_slice_mut(v)[..*len]),
            Staging::Pinned(p) => p.bytes_mut(),
        }
    }

    /// [`HostStaging::bytes_mut`] as 32-bit words (the bytes are aligned for them: heap
    /// staging is held in 8-byte words, page-locked staging starts a page), the last
    /// `len % 4` bytes left out.
    pub fn words_mut(&mut self) -> Result<&mut [u32]> {
        let bytes = self.bytes_mut()?;
        let n = bytes.len() / 4 * 4;
        bytemuck::try_cast_slice_mut(&mut bytes[..n])
            .map_err(|e| Error::invalid("host staging", format!("not a word view: {e}")))
    }
}
