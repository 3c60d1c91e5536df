//! Device memory owned by encore (raw `cuMemAlloc`, no cudarc event tracking, so buffers
//! can be used inside stream capture).

use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext};

use crate::error::{Error, Result};

/// One device allocation (freed on drop), or a view of mapped memory it does not own.
pub struct CudaBuffer {
    dptr: u64,
    len: usize,
    ctx: Arc<CudaContext>,
    /// `Some` for mapped memory (`crate::vmm`): what keeps the mapping alive.
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

/// Page-locked host memory for uploads, with the event recorded after the last upload that
/// reads it (`crate::backend::HostStaging` on CUDA).
pub struct PinnedStaging {
    ptr: *mut u8,
    len: usize,
    event: sys::CUevent,
    /// An upload recorded `event` and may still be reading the bytes.
    pending: bool,
    ctx: Arc<CudaContext>,
}

// SAFETY: the pointer is a private page-locked allocation; `&mut self` guards every write
// and the wait for in-flight uploads, `&self` only reads.
unsafe impl Send for PinnedStaging {}
unsafe impl Sync for PinnedStaging {}

impl PinnedStaging {
    pub(crate) fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        ctx.bind_to_thread()
            .map_err(|e| Error::cuda("cuCtxSetCurrent", e))?;
        // SAFETY: plain page-locked allocation on the bound context (1 byte when empty, so
        // the pointer is always valid); zeroed below before any read.
        let ptr = unsafe { result::malloc_host(len.max(1), 0) }.map_err(|e| Error::OutOfMemory {
            device: "host (page-locked)".into(),
            bytes: len,
            what: format!("upload staging ({e:?})"),
        })? as *mut u8;
        // SAFETY: `ptr` holds `len.max(1)` bytes.
        unsafe { std::ptr::write_bytes(ptr, 0, len.max(1)) };
        let event = match result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING) {
            Ok(e) => e,
            Err(e) => {
                // SAFETY: allocated above, not shared.
                unsafe {
                    let _ = result::free_host(ptr as *mut std::ffi::c_void);
                }
                return Err(Error::cuda("cuEventCreate", e));
            }
        };
        Ok(PinnedStaging {
            ptr,
            len,
            event,
            pending: false,
            ctx: ctx.clone(),
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn ptr(&self) -> *const u8 {
        self.ptr
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes owned by self; uploads in flight only read them.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub(crate) fn bytes_mut(&mut self) -> Result<&mut [u8]> {
        self.wait()?;
        // SAFETY: as in `bytes`, and no upload reads them any more.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
    }

    /// Record, on `stream`, that an upload reading these bytes was queued there.
    pub(crate) fn mark_uploaded(&mut self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: our event, a live stream of the same context.
        unsafe { result::event::record(self.event, stream) }
            .map_err(|e| Error::cuda("cuEventRecord", e))?;
        self.pending = true;
        Ok(())
    }

    /// Block until the last upload from these bytes has finished.
    fn wait(&mut self) -> Result<()> {
        if self.pending {
            // SAFETY: our event.
            unsafe { result::event::synchronize(self.event) }
                .map_err(|e| Error::cuda("cuEventSynchronize", e))?;
            self.pending = false;
        }
        Ok(())
    }
}

impl Drop for PinnedStaging {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        let _ = self.wait();
        // SAFETY: allocated in `new`; no upload reads it any more (waited above).
        unsafe {
            let _ = result::event::destroy(self.event);
            let _ = result::free_host(self.ptr as *mut std::ffi::c_void);
        }
    }
}
