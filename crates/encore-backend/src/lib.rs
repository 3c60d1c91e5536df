//! encore-backend: the layer every model runs on, and nothing above it.
//!
//! The tensor view, the `Backend` trait (every op with its exact semantics) and its CPU and
//! CUDA implementations with their kernels (`kernels/*.cu`, compiled by NVRTC at start-up),
//! virtual memory and the capture arena, op validation, the device selector, kernel
//! micro-benchmarks and the kernel-level test support. It knows no model, no KV cache and
//! no request: `encore-core` builds the engine on top of it (and re-exports these modules
//! under the same names), so a change above this crate never recompiles it.
//!
//! Its modules import only those before them: `quant` < `dtype` < `error` < `storage` < `tensor` <
//! `args` < `ops` < `vmm` < `backend` < `arena`; `bench`, `device` and `testing` sit on
//! top. CUDA kernels are resolved into typed handles when the backend loads
//! (`backend/cuda/handles.rs`), never looked up by name per launch. See ARCHITECTURE.md.

pub mod arena;
pub mod args;
pub mod backend;
pub mod bench;
pub mod device;
pub mod dtype;
pub mod error;
pub mod ops;
pub mod quant;
pub mod storage;
pub mod tensor;
pub mod testing;
pub mod vmm;

pub use backend::{
    Attention, Backend, BackendRef, ExpertCache, ExpertPrefetch, ExpertSlots, Graph, KvScale,
    LogitBias, Moe, MoeBias, Norm, Penalties, QkvRope, SampleLogprobs, Sampling, TokenMask,
    MAX_TOP_LOGPROBS, PROMPT_BIT,
};
pub use error::{Error, Result};
pub use tensor::{DType, Element, Tensor};
