//! The capture arena: a bump allocator over one backend buffer. Intermediates of a
//! forward step (eager or captured) are views into it; `reset` starts a new epoch. It is
//! the one allocator allowed during capture, since handing out a view touches no device
//! API. (Issue #5 replaces the fixed buffer with a growable VMM range.)

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

/// Alignment of every arena allocation (enough for 16-byte vector loads and cuBLASLt).
pub const ARENA_ALIGN: usize = 256;

pub struct Arena {
    buf: Tensor,
    top: usize,
    peak: usize,
}

impl Arena {
    /// Reserve `bytes` of backend memory for intermediates.
    pub fn new(backend: &dyn Backend, bytes: usize) -> Result<Self> {
        let words = bytes.div_ceil(4);
        let buf = backend.alloc(DType::I32, &[words])?;
        Ok(Arena {
            buf,
            top: 0,
            peak: 0,
        })
    }

    /// A view of `shape` elements of `dtype`, valid until the next `reset`.
    pub fn alloc(&mut self, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let bytes = shape.iter().product::<usize>() * dtype.size();
        let start = self.top.next_multiple_of(ARENA_ALIGN);
        if start + bytes > self.capacity() {
            return Err(Error::OutOfMemory {
                device: self.buf.device_name(),
                bytes,
                what: format!(
                    "arena allocation of {shape:?} {dtype} ({} of {} arena bytes in use)",
                    self.top,
                    self.capacity()
                ),
            });
        }
        self.top = start + bytes;
        self.peak = self.peak.max(self.top);
        Tensor::new(
            self.buf.storage().clone(),
            self.buf.offset() + start,
            shape,
            dtype,
        )
    }

    /// Start a new epoch: every earlier view may be reused.
    pub fn reset(&mut self) {
        self.top = 0;
    }

    pub fn capacity(&self) -> usize {
        self.buf.size_bytes()
    }

    /// Bytes in use in this epoch.
    pub fn used(&self) -> usize {
        self.top
    }

    /// Most bytes ever in use at once.
    pub fn peak(&self) -> usize {
        self.peak
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;

    #[test]
    fn bump_align_reset_and_exhaustion() {
        let cpu = CpuBackend::new();
        let mut a = Arena::new(&cpu, 4096).unwrap();
        let x = a.alloc(DType::F32, &[3]).unwrap();
        let y = a.alloc(DType::BF16, &[5]).unwrap();
        assert_eq!(x.offset(), 0);
        assert_eq!(y.offset(), ARENA_ALIGN);
        assert_eq!(a.used(), ARENA_ALIGN + 10);
        let err = a.alloc(DType::F32, &[2000]).unwrap_err().to_string();
        assert!(err.contains("8000 bytes"), "{err}");
        a.reset();
        let z = a.alloc(DType::F32, &[1]).unwrap();
        assert!(z.same_start(&x));
        assert_eq!(a.peak(), ARENA_ALIGN + 10);
    }

    #[test]
    fn arena_allocates_during_capture_backend_does_not() {
        let cpu = CpuBackend::new();
        let mut a = Arena::new(&cpu, 1024).unwrap();
        cpu.begin_capture().unwrap();
        assert!(a.alloc(DType::F32, &[16]).is_ok());
        let err = cpu.alloc(DType::F32, &[16]).unwrap_err();
        assert!(
            err.to_string()
                .contains("`alloc` is not allowed during graph capture"),
            "{err}"
        );
        cpu.end_capture().unwrap();
    }
}
