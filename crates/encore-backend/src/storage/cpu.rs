//! Host memory for CPU tensors: an aligned allocation, or a view of mapped memory.

use std::alloc::Layout;
use std::sync::Arc;

use crate::error::{Error, Result};

/// Alignment of every CPU buffer (one cache line, enough for any SIMD load).
const ALIGN: usize = 64;

/// A host allocation, or a view of mapped memory it does not own. Ops write through
/// shared references: like device memory, a buffer is plain bytes that the one stream of
/// ops reads and writes in order.
pub struct CpuBuffer {
    ptr: *mut u8,
    len: usize,
    /// `Some` for mapped memory (`crate::vmm`): what keeps the mapping alive.
    /// Such a buffer frees nothing on drop.
    keep: Option<Arc<dyn Send + Sync>>,
}

// SAFETY: the buffer is plain memory; ops on one backend run one at a time (eagerly on
// the calling thread or from a tape on the calling thread), which is the discipline a
// device stream gives CUDA buffers.
unsafe impl Send for CpuBuffer {}
unsafe impl Sync for CpuBuffer {}

impl CpuBuffer {
    pub(crate) fn new(len: usize) -> Result<Self> {
        if len == 0 {
            return Ok(CpuBuffer {
                ptr: std::ptr::NonNull::<u64>::dangling().as_ptr() as *mut u8,
                len: 0,
                keep: None,
            });
        }
        let layout = Layout::from_size_align(len, ALIGN).map_err(|e| Error::OutOfMemory {
            device: "cpu".into(),
            bytes: len,
            what: format!("tensor ({e})"),
        })?;
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(Error::OutOfMemory {
                device: "cpu".into(),
                bytes: len,
                what: "tensor".into(),
            });
        }
        Ok(CpuBuffer {
            ptr,
            len,
            keep: None,
        })
    }

    /// A view of `len` bytes of mapped memory at `ptr`, alive as long as `keep` is.
    /// The memory must be mapped read/write wherever a tensor of this buffer is used.
    pub(crate) fn mapped(ptr: *mut u8, len: usize, keep: Arc<dyn Send + Sync>) -> Self {
        CpuBuffer {
            ptr,
            len,
            keep: Some(keep),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for CpuBuffer {
    fn drop(&mut self) {
        if self.len > 0 && self.keep.is_none() {
            // SAFETY: allocated in `new` with this exact layout.
            unsafe {
                std::alloc::dealloc(self.ptr, Layout::from_size_align_unchecked(self.len, ALIGN))
            }
        }
    }
}
