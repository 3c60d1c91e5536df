//! Weight offload on CUDA: page-locked host memory (allocated, or a mapped file registered
//! read-only) and the copy queue, a second non-blocking stream whose copies are ordered
//! against the compute stream by events. Inside a capture, recording an event on the
//! capturing stream and waiting for it on the copy stream brings the copy stream into
//! the capture (a fork); its copies become memcpy nodes and the join edges back.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result as drv, sys as drv_sys, CudaContext, CudaStream};

use super::dptr;
use crate::backend::{check_host_copy, CopyQueue, HostMemory};
use crate::error::{Error, Result};
use crate::tensor::{Storage, Tensor};

/// Frees a `cuMemHostAlloc` allocation on drop.
struct PinnedAlloc {
    ptr: *mut c_void,
    ctx: Arc<CudaContext>,
}

// SAFETY: a private page-locked allocation, freed once.
unsafe impl Send for PinnedAlloc {}
unsafe impl Sync for PinnedAlloc {}

impl Drop for PinnedAlloc {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by `malloc_host`; copies from it are finished (the model, whose
        // queue joins every copy, is dropped first).
        unsafe {
            let _ = drv::free_host(self.ptr);
        }
    }
}

/// Unregisters a registered range on drop, then releases what it belongs to.
struct Registered {
    ptr: *mut c_void,
    ctx: Arc<CudaContext>,
    _mem: Arc<dyn AsRef<[u8]> + Send + Sync>,
}

// SAFETY: the registration is released once; the bytes are only read.
unsafe impl Send for Registered {}
unsafe impl Sync for Registered {}

impl Drop for Registered {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: registered by `register`; no copy reads it any more.
        unsafe {
            let _ = drv_sys::cuMemHostUnregister(self.ptr);
        }
    }
}

/// `bytes` zeroed page-locked bytes.
pub(super) fn alloc(ctx: &Arc<CudaContext>, bytes: usize) -> Result<HostMemory> {
    ctx.bind_to_thread()
        .map_err(|e| Error::cuda("cuCtxSetCurrent", e))?;
    // SAFETY: plain page-locked allocation on the bound context (1 byte when empty),
    // mapped into the device's address space (ops may read it in place: `host_view`).
    let flags = drv_sys::CU_MEMHOSTALLOC_DEVICEMAP | drv_sys::CU_MEMHOSTALLOC_PORTABLE;
    let ptr = unsafe { drv::malloc_host(bytes.max(1), flags) }.map_err(|e| Error::OutOfMemory {
        device: "host (page-locked)".into(),
        bytes,
        what: format!("page-locked host memory: cuMemHostAlloc refused ({e:?})"),
    })?;
    // SAFETY: `ptr` holds `bytes.max(1)` bytes.
    unsafe { std::ptr::write_bytes(ptr as *mut u8, 0, bytes.max(1)) };
    let owner = PinnedAlloc {
        ptr,
        ctx: ctx.clone(),
    };
    // SAFETY: the allocation lives until `owner` drops, and only this memory writes it.
    Ok(unsafe { HostMemory::from_raw(ptr as *mut u8, bytes, true, true, Box::new(owner)) })
}

/// Register `mem` page-locked and read-only in place.
pub(super) fn register(
    ctx: &Arc<CudaContext>,
    mem: Arc<dyn AsRef<[u8]> + Send + Sync>,
) -> Result<HostMemory> {
    ctx.bind_to_thread()
        .map_err(|e| Error::cuda("cuCtxSetCurrent", e))?;
    let (ptr, len) = {
        let b = (*mem).as_ref();
        (b.as_ptr() as *mut c_void, b.len())
    };
    if len == 0 {
        return Ok(HostMemory::borrowed(mem));
    }
    // SAFETY: `mem` owns `len` mapped bytes and outlives the registration (the owner
    // holds it and unregisters first).
    let flags = drv_sys::CU_MEMHOSTREGISTER_READ_ONLY | drv_sys::CU_MEMHOSTREGISTER_DEVICEMAP;
    unsafe { drv_sys::cuMemHostRegister_v2(ptr, len, flags) }
        .result()
        .map_err(|e| Error::Cuda {
            call: "cuMemHostRegister (read-only)".into(),
            message: format!(
                "the driver refused to page-lock {len} bytes of mapped memory: {e:?} \
                 (the locked-memory limit, `ulimit -l`, or a file system that cannot be \
                 pinned)"
            ),
        })?;
    let owner = Registered {
        ptr,
        ctx: ctx.clone(),
        _mem: mem,
    };
    // SAFETY: as above; registered read-only, never written.
    Ok(unsafe { HostMemory::from_raw(ptr as *mut u8, len, false, true, Box::new(owner)) })
}

/// The device address of page-locked `mem` (allocated or registered with the device
/// mapping), for kernels that read it in place.
pub(super) fn device_pointer(ctx: &Arc<CudaContext>, mem: &HostMemory) -> Result<u64> {
    if !mem.is_page_locked() {
        return Err(Error::invalid(
            "host_view",
            "host memory that is not page-locked cannot be read by the device in place",
        ));
    }
    ctx.bind_to_thread()
        .map_err(|e| Error::cuda("cuCtxSetCurrent", e))?;
    let mut dptr: drv_sys::CUdeviceptr = 0;
    // SAFETY: `mem` is a live page-locked range of this context, mapped at allocation or
    // registration.
    unsafe { drv_sys::cuMemHostGetDevicePointer_v2(&mut dptr, mem.as_ptr() as *mut c_void, 0) }
        .result()
        .map_err(|e| Error::cuda("cuMemHostGetDevicePointer", e))?;
    Ok(dptr)
}

/// The copy stream and its events.
pub(super) struct CudaCopyQueue {
    ctx: Arc<CudaContext>,
    compute: Arc<CudaStream>,
    stream: Arc<CudaStream>,
    ordinal: usize,
    fork: drv_sys::CUevent,
    join: drv_sys::CUevent,
    events: Vec<drv_sys::CUevent>,
}

// SAFETY: events and streams are driver handles used from the thread driving the backend.
unsafe impl Send for CudaCopyQueue {}
unsafe impl Sync for CudaCopyQueue {}

fn event() -> Result<drv_sys::CUevent> {
    drv::event::create(drv_sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
        .map_err(|e| Error::cuda("cuEventCreate", e))
}

impl CudaCopyQueue {
    pub(super) fn new(
        ctx: &Arc<CudaContext>,
        compute: &Arc<CudaStream>,
        ordinal: usize,
        events: usize,
    ) -> Result<Self> {
        ctx.bind_to_thread()
            .map_err(|e| Error::cuda("cuCtxSetCurrent", e))?;
        let stream = ctx
            .new_stream()
            .map_err(|e| Error::cuda("cuStreamCreate (copy stream)", e))?;
        let mut q = CudaCopyQueue {
            ctx: ctx.clone(),
            compute: compute.clone(),
            stream,
            ordinal,
            fork: event()?,
            join: std::ptr::null_mut(),
            events: Vec::with_capacity(events),
        };
        q.join = event()?;
        for _ in 0..events {
            q.events.push(event()?);
        }
        Ok(q)
    }

    fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| Error::cuda("cuCtxSetCurrent", e))
    }

    fn event(&self, i: usize) -> Result<drv_sys::CUevent> {
        self.events.get(i).copied().ok_or_else(|| {
            Error::invalid("copy_queue", format!("event {i} of {}", self.events.len()))
        })
    }

    /// `to` waits for the work queued on `from` so far, through `ev`.
    fn order(
        &self,
        ev: drv_sys::CUevent,
        from: &CudaStream,
        to: &CudaStream,
        what: &str,
    ) -> Result<()> {
        self.bind()?;
        order(ev, from, to, what)
    }
}

/// `to` waits for the work queued on `from` so far, through `ev` (recorded on `from`):
/// a fork or a join of two streams, captured as graph edges inside a capture. The
/// context is bound.
pub(super) fn order(
    ev: drv_sys::CUevent,
    from: &CudaStream,
    to: &CudaStream,
    what: &str,
) -> Result<()> {
    // SAFETY: a live event and two live streams of the bound context.
    unsafe {
        drv_sys::cuEventRecord(ev, from.cu_stream())
            .result()
            .map_err(|e| Error::cuda(format!("cuEventRecord ({what})"), e))?;
        drv_sys::cuStreamWaitEvent(to.cu_stream(), ev, 0)
            .result()
            .map_err(|e| Error::cuda(format!("cuStreamWaitEvent ({what})"), e))
    }
}

impl CopyQueue for CudaCopyQueue {
    fn fork(&self) -> Result<()> {
        self.order(self.fork, &self.compute, &self.stream, "fork")
    }

    fn copy(&self, src: &Arc<HostMemory>, offset: usize, dst: &Tensor) -> Result<()> {
        let ok = matches!(dst.storage(), Storage::Cuda(b) if b.ordinal() == self.ordinal);
        if !ok {
            return Err(Error::WrongDevice {
                op: "copy_queue.copy",
                name: "dst",
                found: dst.device_name(),
                expected: format!("cuda:{}", self.ordinal),
            });
        }
        check_host_copy(src, offset, dst)?;
        let n = dst.size_bytes();
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: dst spans n device bytes; src holds offset + n host bytes (checked),
        // page-locked (or pageable on a fallback, which the driver stages), alive as long
        // as the model that queues and captures this copy.
        unsafe {
            drv_sys::cuMemcpyHtoDAsync_v2(
                dptr(dst),
                src.as_ptr().add(offset) as *const c_void,
                n,
                self.stream.cu_stream(),
            )
        }
        .result()
        .map_err(|e| Error::cuda("cuMemcpyHtoDAsync (copy stream)", e))
    }

    fn record(&self, event: usize) -> Result<()> {
        let ev = self.event(event)?;
        self.bind()?;
        // SAFETY: our event, our live stream.
        unsafe { drv_sys::cuEventRecord(ev, self.stream.cu_stream()) }
            .result()
            .map_err(|e| Error::cuda("cuEventRecord (copy stream)", e))
    }

    fn wait(&self, event: usize) -> Result<()> {
        let ev = self.event(event)?;
        self.bind()?;
        // SAFETY: our event, the live compute stream.
        unsafe { drv_sys::cuStreamWaitEvent(self.compute.cu_stream(), ev, 0) }
            .result()
            .map_err(|e| Error::cuda("cuStreamWaitEvent (compute waits for a copy)", e))
    }

    fn join(&self) -> Result<()> {
        self.order(self.join, &self.stream, &self.compute, "join")
    }
}

impl Drop for CudaCopyQueue {
    fn drop(&mut self) {
        let _ = self.bind();
        let _ = self.stream.synchronize();
        for ev in std::iter::once(self.fork)
            .chain(std::iter::once(self.join))
            .chain(self.events.iter().copied())
        {
            if !ev.is_null() {
                // SAFETY: created by us; no stream waits on it after the synchronize.
                unsafe {
                    let _ = drv::event::destroy(ev);
                }
            }
        }
    }
}
