//! The graph runtime: the executor (capture and replay of pieces per (phase, bucket), with
//! the shared arena and per-key statistics), the capture protocol it drives
//! ([`StepHooks`]: it calls a step's hooks; no forward has to remember them), bucket
//! policies, and the persistent input table.
//!
//! Invariant: this module imports neither the model nor any feature (no offload, no LoRA,
//! no speculative decoding); a step reaches it through [`Pieces`] and its hooks.

pub mod buckets;
pub mod executor;
pub mod hooks;
pub mod inputs;

pub use buckets::BucketPolicy;
pub use executor::{Executor, GraphStats, Key, Phase, Pieces};
pub use hooks::StepHooks;
pub use inputs::{Field, InputTable, Layout, Rows, Width};
