//! The CPU twin of CUDA's VMM, so the pool logic runs for real in CI: a reservation is an
//! anonymous `PROT_NONE`, `MAP_NORESERVE` mapping (address space, no memory); a physical
//! chunk is a memfd of its size; mapping is `mmap(MAP_SHARED | MAP_FIXED)` of the memfd
//! over the reservation (`PROT_NONE`), and setting access is `mprotect(READ | WRITE)`;
//! unmapping puts a `PROT_NONE` reservation back (never `munmap` inside a range, which
//! would leave a hole another mapping could take). The same memfd mapped into two ranges
//! aliases, exactly like one CUDA chunk mapped into two ranges.
//!
//! Granularity: [`CPU_GRANULARITY`] (64 KiB, or the page size where that is larger). It
//! is smaller than CUDA's 2 MiB so that a small test model's buckets need different
//! numbers of granules and the "physical == largest need rounded up" checks discriminate,
//! and a multiple of every common page size (4, 16, 64 KiB) so offsets stay mappable.

use std::sync::{Arc, OnceLock};

use super::{Vmm, VmmUsage};
use crate::error::{Error, Result};
use crate::storage::CpuBuffer;
use crate::tensor::Storage;

/// Size unit of CPU reservations, chunks and mappings.
pub const CPU_GRANULARITY: usize = 64 << 10;

/// The `Result` layer over `libc`.
pub mod result {
    use crate::error::{Error, Result};

    fn err(call: &'static str, bytes: usize) -> Error {
        Error::Vmm {
            device: "cpu".into(),
            call,
            bytes,
            message: std::io::Error::last_os_error().to_string(),
        }
    }

    /// The OS page size.
    pub fn page_size() -> usize {
        // SAFETY: sysconf has no preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 {
            p as usize
        } else {
            4096
        }
    }

    /// Reserve `bytes` of address space (no memory, no access).
    pub fn reserve(bytes: usize) -> Result<u64> {
        // SAFETY: a fresh anonymous mapping at an address the kernel picks.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(err("address reservation (mmap PROT_NONE)", bytes));
        }
        Ok(p as u64)
    }

    /// Give a reservation (and anything still mapped in it) back.
    ///
    /// # Safety
    /// `addr`/`bytes` is one reservation that nothing uses any more.
    pub unsafe fn free(addr: u64, bytes: usize) -> Result<()> {
        if libc::munmap(addr as *mut libc::c_void, bytes) != 0 {
            return Err(err("address free (munmap)", bytes));
        }
        Ok(())
    }

    /// A memfd of `bytes`: the physical chunk. Returns the file descriptor.
    #[cfg(target_os = "linux")]
    pub fn create(bytes: usize) -> Result<u64> {
        // SAFETY: the name is a valid C string; the fd is checked.
        let fd = unsafe { libc::memfd_create(c"encore-vmm".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(err("chunk creation (memfd_create)", bytes));
        }
        let Ok(len) = libc::off_t::try_from(bytes) else {
            // SAFETY: fd was just opened.
            unsafe { libc::close(fd) };
            return Err(Error::Vmm {
                device: "cpu".into(),
                call: "chunk creation (ftruncate)",
                bytes,
                message: "size does not fit off_t".into(),
            });
        };
        // SAFETY: fd is a memfd we own.
        if unsafe { libc::ftruncate(fd, len) } != 0 {
            let e = err("chunk creation (ftruncate)", bytes);
            // SAFETY: fd was just opened.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        Ok(fd as u64)
    }

    #[cfg(not(target_os = "linux"))]
    pub fn create(bytes: usize) -> Result<u64> {
        Err(Error::Vmm {
            device: "cpu".into(),
            call: "chunk creation (memfd_create)",
            bytes,
            message: "memfd is Linux-only".into(),
        })
    }

    /// Close a chunk's fd; its memory goes once no mapping uses it.
    ///
    /// # Safety
    /// `fd` comes from `create` and is closed once.
    pub unsafe fn release(fd: u64) -> Result<()> {
        if libc::close(fd as libc::c_int) != 0 {
            return Err(err("chunk release (close)", 0));
        }
        Ok(())
    }

    /// Map all `bytes` of memfd `fd` at `addr` (inside a reservation), without access.
    ///
    /// # Safety
    /// `addr..addr+bytes` lies in a live reservation and is not in use.
    pub unsafe fn map(addr: u64, bytes: usize, fd: u64) -> Result<()> {
        let p = libc::mmap(
            addr as *mut libc::c_void,
            bytes,
            libc::PROT_NONE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd as libc::c_int,
            0,
        );
        if p == libc::MAP_FAILED || p as u64 != addr {
            return Err(err("map (mmap MAP_FIXED of a memfd)", bytes));
        }
        Ok(())
    }

    /// Make a mapped span readable and writable.
    ///
    /// # Safety
    /// The span is mapped by `map`.
    pub unsafe fn set_access(addr: u64, bytes: usize) -> Result<()> {
        if libc::mprotect(
            addr as *mut libc::c_void,
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
        ) != 0
        {
            return Err(err("set access (mprotect)", bytes));
        }
        Ok(())
    }

    /// Unmap a span, leaving it reserved (`PROT_NONE`, no memory).
    ///
    /// # Safety
    /// Nothing touches the span any more.
    pub unsafe fn unmap(addr: u64, bytes: usize) -> Result<()> {
        let p = libc::mmap(
            addr as *mut libc::c_void,
            bytes,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return Err(err("unmap (mmap PROT_NONE over the span)", bytes));
        }
        Ok(())
    }
}

/// The CPU backend's VMM (one per backend, so its usage counts that backend's objects).
pub struct CpuVmm {
    granularity: usize,
    usage: Arc<VmmUsage>,
}

impl Default for CpuVmm {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuVmm {
    pub fn new() -> Self {
        CpuVmm {
            granularity: CPU_GRANULARITY.max(result::page_size()),
            usage: Arc::new(VmmUsage::default()),
        }
    }

    /// The process-wide page size check, once.
    fn page() -> usize {
        static PAGE: OnceLock<usize> = OnceLock::new();
        *PAGE.get_or_init(result::page_size)
    }
}

impl Vmm for CpuVmm {
    fn device_name(&self) -> String {
        "cpu".into()
    }
    fn granularity(&self) -> usize {
        self.granularity
    }
    fn reserve(&self, bytes: usize) -> Result<u64> {
        result::reserve(bytes)
    }
    unsafe fn free(&self, addr: u64, bytes: usize) -> Result<()> {
        result::free(addr, bytes)
    }
    fn create(&self, bytes: usize) -> Result<u64> {
        result::create(bytes)
    }
    unsafe fn release(&self, handle: u64) -> Result<()> {
        result::release(handle)
    }
    unsafe fn map(&self, addr: u64, bytes: usize, handle: u64) -> Result<()> {
        if !(addr as usize).is_multiple_of(Self::page()) {
            return Err(Error::Vmm {
                device: "cpu".into(),
                call: "map",
                bytes,
                message: format!("address {addr:#x} is not page-aligned"),
            });
        }
        result::map(addr, bytes, handle)
    }
    unsafe fn set_access(&self, addr: u64, bytes: usize) -> Result<()> {
        result::set_access(addr, bytes)
    }
    unsafe fn unmap(&self, addr: u64, bytes: usize) -> Result<()> {
        result::unmap(addr, bytes)
    }
    fn quiesce(&self) {
        // CPU ops run synchronously on the calling thread: nothing is in flight.
    }
    fn storage(&self, addr: u64, len: usize, keep: Arc<dyn Send + Sync>) -> Storage {
        Storage::Cpu(Arc::new(CpuBuffer::mapped(addr as *mut u8, len, keep)))
    }
    fn usage(&self) -> &Arc<VmmUsage> {
        &self.usage
    }
}
