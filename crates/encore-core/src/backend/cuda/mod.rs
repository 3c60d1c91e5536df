//! The CUDA backend (placeholder while being written).

mod buffer;

pub use buffer::CudaBuffer;
