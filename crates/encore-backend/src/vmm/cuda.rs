//! CUDA's virtual memory management (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`,
//! `cuMemSetAccess`, ...). cudarc 0.19 exposes only the raw `sys` calls; [`result`] turns
//! each into a `Result` naming the call and the size, and [`CudaVmm`] implements the
//! backend-neutral [`Vmm`] over them for one device.
//!
//! None of these calls is made while the stream captures: `cuMemCreate`/`cuMemMap` are
//! not stream work, and in thread-local capture mode a call the driver deems unsafe would
//! invalidate the capture. The arena maps before a capture begins and after it ends.

use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};

use super::{Vmm, VmmUsage};
use crate::error::{Error, Result};
use crate::storage::CudaBuffer;
use crate::tensor::Storage;

/// The `Result` layer over `cudarc::driver::sys`. The caller binds the context.
pub mod result {
    use cudarc::driver::sys;

    use crate::error::{Error, Result};

    fn check(r: sys::CUresult, call: &'static str, ordinal: usize, bytes: usize) -> Result<()> {
        if r == sys::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(Error::Vmm {
                device: format!("cuda:{ordinal}"),
                call,
                bytes,
                message: format!("{r:?}"),
            })
        }
    }

    /// Pinned device memory on `ordinal`.
    fn prop(ordinal: usize) -> sys::CUmemAllocationProp {
        // SAFETY: a plain C struct; all-zero is its documented default (no handle types,
        // no flags) and every enum in it has a 0 variant.
        let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        p.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        p.location.id = ordinal as i32;
        p
    }

    /// The minimum granularity of chunk sizes and mapping offsets on `ordinal`.
    pub fn granularity(ordinal: usize) -> Result<usize> {
        let p = prop(ordinal);
        let mut g = 0usize;
        // SAFETY: valid out pointer and property struct.
        let r = unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut g,
                &p,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        };
        check(r, "cuMemGetAllocationGranularity", ordinal, 0)?;
        Ok(g)
    }

    /// Reserve `bytes` of device address space aligned to `align`.
    pub fn address_reserve(ordinal: usize, bytes: usize, align: usize) -> Result<u64> {
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out pointer; no fixed address requested.
        let r = unsafe { sys::cuMemAddressReserve(&mut ptr, bytes, align, 0, 0) };
        check(r, "cuMemAddressReserve", ordinal, bytes)?;
        Ok(ptr)
    }

    /// # Safety
    /// `ptr`/`bytes` is one reservation with nothing mapped in it.
    pub unsafe fn address_free(ordinal: usize, ptr: u64, bytes: usize) -> Result<()> {
        check(
            sys::cuMemAddressFree(ptr, bytes),
            "cuMemAddressFree",
            ordinal,
            bytes,
        )
    }

    /// Create `bytes` of physical memory on `ordinal`; returns the handle.
    pub fn create(ordinal: usize, bytes: usize) -> Result<u64> {
        let p = prop(ordinal);
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out pointer and property struct.
        let r = unsafe { sys::cuMemCreate(&mut h, bytes, &p, 0) };
        check(r, "cuMemCreate", ordinal, bytes)?;
        Ok(h)
    }

    /// # Safety
    /// `h` comes from `create` and is released once.
    pub unsafe fn release(ordinal: usize, h: u64) -> Result<()> {
        check(sys::cuMemRelease(h), "cuMemRelease", ordinal, 0)
    }

    /// # Safety
    /// `ptr..ptr+bytes` lies in a reservation and is not mapped.
    pub unsafe fn map(ordinal: usize, ptr: u64, bytes: usize, h: u64) -> Result<()> {
        check(
            sys::cuMemMap(ptr, bytes, 0, h, 0),
            "cuMemMap",
            ordinal,
            bytes,
        )
    }

    /// # Safety
    /// No queued or future work touches the span.
    pub unsafe fn unmap(ordinal: usize, ptr: u64, bytes: usize) -> Result<()> {
        check(sys::cuMemUnmap(ptr, bytes), "cuMemUnmap", ordinal, bytes)
    }

    /// Read/write access for device `ordinal`.
    ///
    /// # Safety
    /// The span is mapped.
    pub unsafe fn set_access(ordinal: usize, ptr: u64, bytes: usize) -> Result<()> {
        // SAFETY: plain C struct, zero is a valid start.
        let mut d: sys::CUmemAccessDesc = std::mem::zeroed();
        d.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        d.location.id = ordinal as i32;
        d.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        check(
            sys::cuMemSetAccess(ptr, bytes, &d, 1),
            "cuMemSetAccess",
            ordinal,
            bytes,
        )
    }
}

/// One CUDA device's VMM.
pub struct CudaVmm {
    ctx: Arc<CudaContext>,
    granularity: usize,
    usage: Arc<VmmUsage>,
}

impl CudaVmm {
    /// Check the device supports VMM and read its granularity.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        ctx.bind_to_thread()
            .map_err(|e| Error::cuda("cuCtxSetCurrent", e))?;
        let ordinal = ctx.ordinal();
        let supported = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
            )
            .map_err(|e| Error::cuda("cuDeviceGetAttribute", e))?;
        if supported == 0 {
            return Err(Error::DeviceUnavailable {
                device: format!("cuda:{ordinal}"),
                why: "the device does not support virtual memory management (cuMemMap)".into(),
            });
        }
        Ok(CudaVmm {
            ctx: ctx.clone(),
            granularity: result::granularity(ordinal)?,
            usage: Arc::new(VmmUsage::default()),
        })
    }

    fn bind(&self) -> Result<usize> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| Error::cuda("cuCtxSetCurrent", e))?;
        Ok(self.ctx.ordinal())
    }
}

impl Vmm for CudaVmm {
    fn device_name(&self) -> String {
        format!("cuda:{}", self.ctx.ordinal())
    }
    fn granularity(&self) -> usize {
        self.granularity
    }
    fn reserve(&self, bytes: usize) -> Result<u64> {
        let o = self.bind()?;
        result::address_reserve(o, bytes, self.granularity)
    }
    unsafe fn free(&self, addr: u64, bytes: usize) -> Result<()> {
        let o = self.bind()?;
        result::address_free(o, addr, bytes)
    }
    fn create(&self, bytes: usize) -> Result<u64> {
        let o = self.bind()?;
        result::create(o, bytes)
    }
    unsafe fn release(&self, handle: u64) -> Result<()> {
        let o = self.bind()?;
        result::release(o, handle)
    }
    unsafe fn map(&self, addr: u64, bytes: usize, handle: u64) -> Result<()> {
        let o = self.bind()?;
        result::map(o, addr, bytes, handle)
    }
    unsafe fn set_access(&self, addr: u64, bytes: usize) -> Result<()> {
        let o = self.bind()?;
        result::set_access(o, addr, bytes)
    }
    unsafe fn unmap(&self, addr: u64, bytes: usize) -> Result<()> {
        let o = self.bind()?;
        result::unmap(o, addr, bytes)
    }
    fn quiesce(&self) {
        if self.bind().is_ok() {
            if let Err(e) = self.ctx.synchronize() {
                tracing::warn!("cuCtxSynchronize before unmapping: {e:?}");
            }
        }
    }
    fn storage(&self, addr: u64, len: usize, keep: Arc<dyn Send + Sync>) -> Storage {
        Storage::Cuda(Arc::new(CudaBuffer::mapped(&self.ctx, addr, len, keep)))
    }
    fn usage(&self) -> &Arc<VmmUsage> {
        &self.usage
    }
}
