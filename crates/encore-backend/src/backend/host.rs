//! What weight offload needs from a backend: host memory the device can copy from
//! asynchronously ([`HostMemory`]), and a second queue for those copies ordered against
//! the compute stream by events ([`CopyQueue`]).
//!
//! On CUDA host memory is page-locked (allocated with `cuMemHostAlloc`, or a mapped
//! safetensors file registered read-only with `cuMemHostRegister`), so a copy is a true
//! DMA that can be queued on a second stream and captured into a graph; the copy queue is
//! that stream plus events. On the CPU the twin is plain memory and a worker thread doing
//! the copies (`memcpy`) while the calling thread computes, with the same ordering rules,
//! so the offload executor runs for real in CI.

use std::sync::Arc;

use crate::error::Result;
use crate::tensor::Tensor;

/// Host bytes a [`CopyQueue`] copies from; freed (or unregistered) on drop.
pub struct HostMemory {
    ptr: *mut u8,
    len: usize,
    writable: bool,
    page_locked: bool,
    /// Frees the allocation or unregisters the mapping when dropped; keeps what the bytes
    /// belong to alive.
    _owner: Box<dyn Send + Sync>,
}

// SAFETY: plain host bytes; writes need `&mut self`, and copies only read.
unsafe impl Send for HostMemory {}
unsafe impl Sync for HostMemory {}

impl HostMemory {
    /// `len` bytes at `ptr`, valid while `owner` lives.
    ///
    /// # Safety
    /// `ptr` must point to `len` bytes that stay valid (and, when `writable`, writable and
    /// not aliased elsewhere) until `owner` is dropped.
    pub(crate) unsafe fn from_raw(
        ptr: *mut u8,
        len: usize,
        writable: bool,
        page_locked: bool,
        owner: Box<dyn Send + Sync>,
    ) -> Self {
        HostMemory {
            ptr,
            len,
            writable,
            page_locked,
            _owner: owner,
        }
    }

    /// Zeroed ordinary heap memory (the CPU backend's host memory).
    pub fn heap(len: usize) -> Self {
        let mut v = vec![0u8; len.max(1)].into_boxed_slice();
        let ptr = v.as_mut_ptr();
        // SAFETY: the boxed slice owns `len.max(1)` bytes and moves into the owner without
        // reallocating.
        unsafe { Self::from_raw(ptr, len, true, false, Box::new(v)) }
    }

    /// Memory that is read in place (a mapped file on the CPU backend).
    pub fn borrowed(mem: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Self {
        let bytes = (*mem).as_ref();
        let (ptr, len) = (bytes.as_ptr() as *mut u8, bytes.len());
        // SAFETY: `mem` owns the bytes and is kept alive by the owner; never written.
        unsafe { Self::from_raw(ptr, len, false, false, Box::new(mem)) }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Page-locked (a true asynchronous DMA source), as on CUDA.
    pub fn is_page_locked(&self) -> bool {
        self.page_locked
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `len` valid bytes (see `from_raw`).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, to fill; `None` for memory registered read-only (a mapped file).
    /// No copy may be reading them (fill before the first step).
    pub fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        // SAFETY: `len` valid writable bytes, `&mut self` excludes other borrows.
        self.writable
            .then(|| unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
    }
}

/// A queue of host-to-device copies beside the compute stream, ordered against it by
/// events. Every method is capturable: inside a capture the copies become graph nodes
/// and the events edges (a fork/join of the capture), so an offload plan replays with
/// its graph.
pub trait CopyQueue: Send + Sync {
    /// Copies queued after this wait for every op queued on the compute stream so far.
    fn fork(&self) -> Result<()>;

    /// Copy `dst.size_bytes()` bytes of `src` from `offset` into `dst`, on the copy queue.
    fn copy(&self, src: &Arc<HostMemory>, offset: usize, dst: &Tensor) -> Result<()>;

    /// Record event `event` (`0..events` of [`crate::Backend::copy_queue`]) after the
    /// copies queued so far.
    fn record(&self, event: usize) -> Result<()>;

    /// Ops queued on the compute stream from now on wait for the last record of `event`.
    fn wait(&self, event: usize) -> Result<()>;

    /// Ops queued on the compute stream from now on wait for every copy queued so far
    /// (ends a fork; a capture must join before it ends).
    fn join(&self) -> Result<()>;
}

/// The error for a host range outside its memory or a bad destination.
pub(crate) fn check_copy(src: &HostMemory, offset: usize, dst: &Tensor) -> Result<()> {
    let n = dst.size_bytes();
    if offset.checked_add(n).is_none_or(|end| end > src.len()) {
        return Err(crate::Error::invalid(
            "copy_queue.copy",
            format!(
                "bytes {offset}..{} are outside the {} byte host memory",
                offset.saturating_add(n),
                src.len()
            ),
        ));
    }
    Ok(())
}

/// The error for a [`crate::Backend::host_view`] offset past its memory.
pub(crate) fn check_view(mem: &HostMemory, offset: usize) -> Result<()> {
    if offset > mem.len() {
        return Err(crate::Error::invalid(
            "host_view",
            format!("offset {offset} past the {} byte host memory", mem.len()),
        ));
    }
    Ok(())
}
