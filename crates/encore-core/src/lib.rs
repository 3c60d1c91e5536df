//! encore-core: everything from the engine down (no HTTP, no CLI).
//!
//! Today: the tensor view, the backend abstraction with its CPU and CUDA backends and
//! their kernels, the capture primitives and the capture arena. See ARCHITECTURE.md.

pub mod backend;
pub mod bench;
pub mod device;
pub mod engine;
pub mod error;
pub mod generate;
pub mod graph;
pub mod histogram;
pub mod kv;
pub mod memory;
pub mod model;
pub mod offload;
pub mod ops;
pub mod progress;
pub mod request;
pub mod runner;
pub mod scheduler;
pub mod serve;
pub mod tensor;
pub mod testing;
pub mod tokenizer;

pub use backend::{
    Attention, Backend, BackendRef, Graph, Penalties, QkvRope, SampleLogprobs, Sampling,
    MAX_TOP_LOGPROBS, PROMPT_BIT,
};
pub use error::{Error, Result};
pub use tensor::{DType, Element, Tensor};
