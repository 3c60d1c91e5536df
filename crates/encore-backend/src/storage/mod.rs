//! The memory a tensor points into: a host buffer or a device buffer, each either owned
//! or a view of mapped memory kept alive by its owner.

pub mod cpu;
pub mod cuda;

use std::sync::Arc;

pub use cpu::CpuBuffer;
pub use cuda::CudaBuffer;

/// The memory a tensor points into. Cloning shares the buffer.
#[derive(Clone)]
pub enum Storage {
    Cpu(Arc<CpuBuffer>),
    Cuda(Arc<CudaBuffer>),
}

impl Storage {
    pub fn len_bytes(&self) -> usize {
        match self {
            Storage::Cpu(b) => b.len(),
            Storage::Cuda(b) => b.len(),
        }
    }

    pub fn device_name(&self) -> String {
        match self {
            Storage::Cpu(_) => "cpu".to_string(),
            Storage::Cuda(b) => format!("cuda:{}", b.ordinal()),
        }
    }
}
