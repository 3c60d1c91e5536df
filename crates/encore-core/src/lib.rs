//! encore-core: the engine on top of the backend layer (no HTTP, no CLI).
//!
//! The model (the one declaration of its tensors, config, weights, the forward), the KV
//! cache, the graph executor and its capture protocol, the runner, the request types and
//! admission rules, the scheduler, start-up (`engine`), the engine loop (`serve`), weight
//! offload and the tokenizer. The engine sees token ids only: tokenizing and stop strings
//! are its callers'.
//!
//! The backend layer (`encore-backend`) is re-exported under its own module names
//! (`backend`, `bench`, `device`, `error`, `ops`, `tensor`), so `encore_core::backend` and
//! `encore_backend::backend` are one module; `memory` re-exports its `arena` and `vmm`
//! beside the memory budget, and `testing` its kernel-level test support beside the
//! runner's capture/replay check. See ARCHITECTURE.md.

pub mod constraint;
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
pub mod spec;
pub mod testing;
pub mod tokenizer;

pub use encore_backend::{backend, bench, device, error, ops, quant, tensor};

pub use backend::{
    Attention, Backend, BackendRef, Graph, KvScale, LogitBias, Penalties, QkvRope, SampleLogprobs,
    Sampling, MAX_TOP_LOGPROBS, PROMPT_BIT,
};
pub use error::{Error, Result};
pub use tensor::{DType, Element, Tensor};
