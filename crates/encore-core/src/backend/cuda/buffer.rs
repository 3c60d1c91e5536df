//! Device memory owned by encore (raw `cuMemAlloc`, no cudarc event tracking, so buffers
//! can be used inside stream capture).

use std::sync::Arc;

use cudarc::driver::{result, CudaContext};

use crate::error::{Error, Result};

/// One device allocation (freed on drop), or a view of mapped memory it does not own.
pub struct CudaBuffer {
    dptr: u64,
    len: usize,
    ctx: Arc<CudaContext>,
    /// `Some` for mapped memory (`crate::memory::vmm`): what keeps the mapping alive.
    /// Such a buffer frees nothing on drop.
    keep: Option<Arc<dyn Send + Sync>>,
}

impl CudaBuffer {
    pub(crate) fn new(ctx: &Arc<CudaContext>, len: usize, what: &str) -> Result<Self> {
        ctx.bind_to_thread()
            .map_err(|e| Error::cuda("cuCtxSetCurrent", e))?;
        // Zero-length allocations get a 1-byte buffer so every tensor has a valid pointer.
        // SAFETY: plain allocation on the bound context.
        let dptr = unsafe { result::malloc_sync(len.max(1)) }.map_err(|e| Error::OutOfMemory {
            device: format!("cuda:{}", ctx.ordinal()),
            bytes: len,
            what: format!("{what} ({e:?})"),
        })?;
        Ok(CudaBuffer {
            dptr,
            len,
            ctx: ctx.clone(),
            keep: None,
        })
    }

    /// A view of `len` bytes of mapped device memory at `dptr`, alive as long as `keep`.
    pub(crate) fn mapped(
        ctx: &Arc<CudaContext>,
        dptr: u64,
        len: usize,
        keep: Arc<dyn Send + Sync>,
    ) -> Self {
        CudaBuffer {
            dptr,
            len,
            ctx: ctx.clone(),
            keep: Some(keep),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    pub(crate) fn dptr(&self) -> u64 {
        self.dptr
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        if self.keep.is_some() {
            return;
        }
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by malloc_sync on this context; no graph or stream work may use
        // it after the last Tensor referencing it is dropped (graphs hold their tensors).
        unsafe {
            let _ = result::free_sync(self.dptr);
        }
    }
}
