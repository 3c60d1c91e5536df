//! encore-core: the engine on top of the backend layer (no HTTP, no CLI).
//!
//! The model (config, weights, the forward), the KV cache, the graph executor, the runner,
//! the scheduler, the engine loop, weight offload and the tokenizer. The backend layer
//! (`encore-backend`: tensors, ops, backends, kernels, virtual memory) is re-exported
//! under its own module names, so `encore_core::backend` and `encore_backend::backend`
//! are one module. See ARCHITECTURE.md.

pub mod engine;
pub mod generate;
pub mod graph;
pub mod histogram;
pub mod kv;
pub mod memory;
pub mod model;
pub mod offload;
pub mod progress;
pub mod request;
pub mod runner;
pub mod scheduler;
pub mod serve;
pub mod testing;
pub mod tokenizer;

pub use encore_backend::{backend, bench, device, error, ops, tensor};

pub use backend::{
    Attention, Backend, BackendRef, Graph, Penalties, QkvRope, SampleLogprobs, Sampling,
    MAX_TOP_LOGPROBS, PROMPT_BIT,
};
pub use error::{Error, Result};
pub use tensor::{DType, Element, Tensor};
