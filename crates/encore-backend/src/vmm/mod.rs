//! Virtual memory management: address ranges reserved without memory behind them,
//! physical chunks created on their own, and mappings of chunks into ranges. The same
//! physical chunk may be mapped into several ranges (they alias), and a range can grow its
//! mapped prefix in place without any address moving.
//!
//! Three layers, as cudarc is built:
//! 1. raw calls: `cudarc::driver::sys::cuMem*` on CUDA, `libc` (memfd, mmap, mprotect)
//!    on the CPU;
//! 2. `Result`-returning functions per backend (`cuda::result`, `cpu::result`), and the
//!    object-safe [`Vmm`] trait each backend implements over them;
//! 3. RAII types here, backend-neutral: [`VirtualRange`] (freed on drop),
//!    [`PhysicalChunk`] (released on drop), [`Mapping`] (unmapped on drop; it holds its
//!    range and chunk, so they outlive it), and [`MappedRange`] — a range with its
//!    mappings whose memory tensors can view ([`MappedRange::storage`]).
//!
//! A backend hands out its VMM with [`crate::Backend::vmm`]. Usage (live chunks, bytes,
//! reservations) is counted per device in [`VmmUsage`], and optionally per pool.

pub mod cpu;
pub mod cuda;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::tensor::Storage;

/// Live VMM objects: physical chunks and reserved ranges, counted and in bytes.
#[derive(Debug, Default)]
pub struct VmmUsage {
    chunks: AtomicUsize,
    physical_bytes: AtomicUsize,
    ranges: AtomicUsize,
    virtual_bytes: AtomicUsize,
}

impl VmmUsage {
    pub fn chunks(&self) -> usize {
        self.chunks.load(Ordering::Acquire)
    }
    pub fn physical_bytes(&self) -> usize {
        self.physical_bytes.load(Ordering::Acquire)
    }
    pub fn ranges(&self) -> usize {
        self.ranges.load(Ordering::Acquire)
    }
    pub fn virtual_bytes(&self) -> usize {
        self.virtual_bytes.load(Ordering::Acquire)
    }
    fn add_chunk(&self, bytes: usize, sign: bool) {
        if sign {
            self.chunks.fetch_add(1, Ordering::AcqRel);
            self.physical_bytes.fetch_add(bytes, Ordering::AcqRel);
        } else {
            self.chunks.fetch_sub(1, Ordering::AcqRel);
            self.physical_bytes.fetch_sub(bytes, Ordering::AcqRel);
        }
    }
    fn add_range(&self, bytes: usize, sign: bool) {
        if sign {
            self.ranges.fetch_add(1, Ordering::AcqRel);
            self.virtual_bytes.fetch_add(bytes, Ordering::AcqRel);
        } else {
            self.ranges.fetch_sub(1, Ordering::AcqRel);
            self.virtual_bytes.fetch_sub(bytes, Ordering::AcqRel);
        }
    }
}

/// One device's virtual memory calls (the `Result` layer, object-safe). Sizes and
/// addresses passed in are multiples of [`Vmm::granularity`]; the RAII types ensure it.
pub trait Vmm: Send + Sync {
    /// `cpu` or `cuda:N`.
    fn device_name(&self) -> String;
    /// Size and alignment unit of reservations, chunks and mappings.
    fn granularity(&self) -> usize;
    /// Reserve `bytes` of address space with nothing behind it.
    fn reserve(&self, bytes: usize) -> Result<u64>;
    /// Give a reservation back.
    ///
    /// # Safety
    /// `addr`/`bytes` come from one `reserve` and nothing is mapped into them.
    unsafe fn free(&self, addr: u64, bytes: usize) -> Result<()>;
    /// Create a physical chunk of `bytes`; returns its handle.
    fn create(&self, bytes: usize) -> Result<u64>;
    /// Release a chunk (its memory goes once no mapping uses it).
    ///
    /// # Safety
    /// `handle` comes from `create` and is released once.
    unsafe fn release(&self, handle: u64) -> Result<()>;
    /// Map all `bytes` of chunk `handle` at `addr`, not yet accessible.
    ///
    /// # Safety
    /// `addr..addr+bytes` lies in a live reservation and is not mapped.
    unsafe fn map(&self, addr: u64, bytes: usize, handle: u64) -> Result<()>;
    /// Make `addr..addr+bytes` (mapped) readable and writable by the device.
    ///
    /// # Safety
    /// The span is mapped.
    unsafe fn set_access(&self, addr: u64, bytes: usize) -> Result<()>;
    /// Unmap a span mapped by `map`; the reservation stays.
    ///
    /// # Safety
    /// No queued or future work touches the span (call [`Vmm::quiesce`] first).
    unsafe fn unmap(&self, addr: u64, bytes: usize) -> Result<()>;
    /// Wait until no queued device work can still touch memory (before unmapping).
    fn quiesce(&self);
    /// A storage of `len` bytes at `addr` that frees nothing itself; `keep` holds the
    /// memory alive for as long as any tensor (or graph holding a tensor) uses it.
    fn storage(&self, addr: u64, len: usize, keep: Arc<dyn Send + Sync>) -> Storage;
    /// Live chunks and ranges of this device.
    fn usage(&self) -> &Arc<VmmUsage>;
}

/// `bytes` rounded up to the granularity, or an error naming the size.
pub fn round_up(vmm: &dyn Vmm, bytes: usize, what: &'static str) -> Result<usize> {
    let g = vmm.granularity();
    bytes
        .max(1)
        .checked_next_multiple_of(g)
        .ok_or_else(|| Error::Vmm {
            device: vmm.device_name(),
            call: what,
            bytes,
            message: format!("size overflows when rounded up to the granularity {g}"),
        })
}

/// A reserved virtual address range; freed on drop.
pub struct VirtualRange {
    vmm: Arc<dyn Vmm>,
    pool: Option<Arc<VmmUsage>>,
    addr: u64,
    bytes: usize,
}

impl VirtualRange {
    /// Reserve at least `bytes` (rounded up to the granularity). `pool`, when given,
    /// counts the reservation too.
    pub fn reserve(vmm: &Arc<dyn Vmm>, bytes: usize, pool: Option<&Arc<VmmUsage>>) -> Result<Self> {
        let bytes = round_up(vmm.as_ref(), bytes, "address reservation")?;
        let addr = vmm.reserve(bytes)?;
        vmm.usage().add_range(bytes, true);
        if let Some(p) = pool {
            p.add_range(bytes, true);
        }
        Ok(VirtualRange {
            vmm: vmm.clone(),
            pool: pool.cloned(),
            addr,
            bytes,
        })
    }
    pub fn addr(&self) -> u64 {
        self.addr
    }
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for VirtualRange {
    fn drop(&mut self) {
        // SAFETY: reserved by `reserve`; every `Mapping` holds an `Arc` of its range, so
        // none is left when this runs.
        if let Err(e) = unsafe { self.vmm.free(self.addr, self.bytes) } {
            tracing::warn!("{e}");
        }
        self.vmm.usage().add_range(self.bytes, false);
        if let Some(p) = &self.pool {
            p.add_range(self.bytes, false);
        }
    }
}

/// A physical memory chunk; released on drop (the memory goes when no mapping is left).
pub struct PhysicalChunk {
    vmm: Arc<dyn Vmm>,
    pool: Option<Arc<VmmUsage>>,
    handle: u64,
    bytes: usize,
}

impl PhysicalChunk {
    /// Create a chunk of at least `bytes` (rounded up to the granularity).
    pub fn create(vmm: &Arc<dyn Vmm>, bytes: usize, pool: Option<&Arc<VmmUsage>>) -> Result<Self> {
        let bytes = round_up(vmm.as_ref(), bytes, "physical chunk creation")?;
        let handle = vmm.create(bytes)?;
        vmm.usage().add_chunk(bytes, true);
        if let Some(p) = pool {
            p.add_chunk(bytes, true);
        }
        Ok(PhysicalChunk {
            vmm: vmm.clone(),
            pool: pool.cloned(),
            handle,
            bytes,
        })
    }
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for PhysicalChunk {
    fn drop(&mut self) {
        // SAFETY: created by `create`, released exactly once here.
        if let Err(e) = unsafe { self.vmm.release(self.handle) } {
            tracing::warn!("{e}");
        }
        self.vmm.usage().add_chunk(self.bytes, false);
        if let Some(p) = &self.pool {
            p.add_chunk(self.bytes, false);
        }
    }
}

/// One chunk mapped (read/write) at an offset of one range; unmapped on drop.
pub struct Mapping {
    range: Arc<VirtualRange>,
    chunk: Arc<PhysicalChunk>,
    offset: usize,
}

impl Mapping {
    /// Map `chunk` at `offset` of `range` and give the device read/write access.
    pub fn new(
        range: &Arc<VirtualRange>,
        offset: usize,
        chunk: &Arc<PhysicalChunk>,
    ) -> Result<Self> {
        let vmm = &range.vmm;
        let bytes = chunk.bytes;
        if !offset.is_multiple_of(vmm.granularity())
            || offset
                .checked_add(bytes)
                .is_none_or(|end| end > range.bytes)
        {
            return Err(Error::Vmm {
                device: vmm.device_name(),
                call: "map",
                bytes,
                message: format!(
                    "offset {offset} is unaligned or the chunk does not fit the {}-byte range",
                    range.bytes
                ),
            });
        }
        let addr = range.addr + offset as u64;
        // SAFETY: the span lies inside the live reservation (checked above); callers map
        // each offset once (`MappedRange` maps only past its mapped prefix).
        unsafe { vmm.map(addr, bytes, chunk.handle)? };
        // SAFETY: just mapped.
        if let Err(e) = unsafe { vmm.set_access(addr, bytes) } {
            // SAFETY: mapped above, never accessible, so nothing can touch it.
            let _ = unsafe { vmm.unmap(addr, bytes) };
            return Err(e);
        }
        Ok(Mapping {
            range: range.clone(),
            chunk: chunk.clone(),
            offset,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let addr = self.range.addr + self.offset as u64;
        // SAFETY: mapped in `new`; owners quiesce the device before dropping mappings
        // (`MappedRange::drop`).
        if let Err(e) = unsafe { self.range.vmm.unmap(addr, self.chunk.bytes) } {
            tracing::warn!("{e}");
        }
    }
}

/// A reserved range and the chunks mapped into it, contiguous from offset 0. Tensors view
/// it through [`MappedRange::storage`], whose buffer keeps the whole thing alive.
pub struct MappedRange {
    range: Arc<VirtualRange>,
    mappings: Mutex<Vec<Mapping>>,
}

impl MappedRange {
    pub fn reserve(
        vmm: &Arc<dyn Vmm>,
        bytes: usize,
        pool: Option<&Arc<VmmUsage>>,
    ) -> Result<Arc<Self>> {
        Ok(Arc::new(MappedRange {
            range: Arc::new(VirtualRange::reserve(vmm, bytes, pool)?),
            mappings: Mutex::new(Vec::new()),
        }))
    }

    /// Reserved bytes.
    pub fn bytes(&self) -> usize {
        self.range.bytes
    }

    pub fn addr(&self) -> u64 {
        self.range.addr
    }

    /// Bytes mapped from offset 0.
    pub fn mapped(&self) -> usize {
        self.lock().iter().map(|m| m.chunk.bytes).sum()
    }

    /// Chunks mapped here.
    pub fn num_mappings(&self) -> usize {
        self.lock().len()
    }

    /// Map `chunk` right after the mapped prefix.
    pub fn push(&self, chunk: &Arc<PhysicalChunk>) -> Result<()> {
        let mut m = self.lock();
        let offset = m.iter().map(|m| m.chunk.bytes).sum();
        m.push(Mapping::new(&self.range, offset, chunk)?);
        Ok(())
    }

    /// A storage over the whole reserved range (only the mapped prefix may be touched).
    pub fn storage(self: &Arc<Self>) -> Storage {
        let keep: Arc<dyn Send + Sync> = self.clone();
        self.range
            .vmm
            .storage(self.range.addr, self.range.bytes, keep)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Mapping>> {
        self.mappings.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for MappedRange {
    fn drop(&mut self) {
        // Nothing may still be reading or writing the memory when it goes.
        let mappings = std::mem::take(&mut *self.lock());
        if !mappings.is_empty() {
            self.range.vmm.quiesce();
        }
        drop(mappings);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::backend::Backend;
    use crate::tensor::{DType, Tensor};

    #[test]
    fn one_chunk_mapped_into_two_ranges_aliases_and_everything_is_released() {
        let cpu = CpuBackend::new();
        let be: &dyn Backend = &cpu;
        let vmm = be.vmm().unwrap();
        let g = vmm.granularity();
        let pool = Arc::new(VmmUsage::default());
        {
            let a = MappedRange::reserve(&vmm, 3 * g, Some(&pool)).unwrap();
            let b = MappedRange::reserve(&vmm, 3 * g, Some(&pool)).unwrap();
            assert_eq!(a.bytes(), 3 * g);
            let c1 = Arc::new(PhysicalChunk::create(&vmm, 1, Some(&pool)).unwrap());
            let c2 = Arc::new(PhysicalChunk::create(&vmm, g + 1, Some(&pool)).unwrap());
            assert_eq!((c1.bytes(), c2.bytes()), (g, 2 * g));
            for r in [&a, &b] {
                r.push(&c1).unwrap();
                r.push(&c2).unwrap();
                assert_eq!(r.mapped(), 3 * g);
            }
            // Full: a fourth granule does not fit.
            let c3 = Arc::new(PhysicalChunk::create(&vmm, g, Some(&pool)).unwrap());
            let err = a.push(&c3).unwrap_err().to_string();
            assert!(err.contains(&format!("{g} bytes")), "{err}");
            drop(c3);
            let n = 3 * g / 4;
            let ta = Tensor::new(a.storage(), 0, &[n], DType::F32).unwrap();
            let tb = Tensor::new(b.storage(), 0, &[n], DType::F32).unwrap();
            let data: Vec<f32> = (0..n).map(|i| i as f32).collect();
            be.write(&ta, &data).unwrap();
            assert_eq!(be.download::<f32>(&tb).unwrap(), data);
            assert_eq!((pool.chunks(), pool.physical_bytes()), (2, 3 * g));
            assert_eq!((pool.ranges(), pool.virtual_bytes()), (2, 6 * g));
            drop((a, b, c1, c2));
            // The tensors keep both ranges (and through their mappings the chunks) alive.
            assert_eq!(pool.chunks(), 2);
            assert_eq!(be.download::<f32>(&ta).unwrap(), data);
        }
        assert_eq!((pool.chunks(), pool.physical_bytes()), (0, 0));
        assert_eq!((pool.ranges(), pool.virtual_bytes()), (0, 0));
        assert_eq!((vmm.usage().chunks(), vmm.usage().ranges()), (0, 0));
    }
}
