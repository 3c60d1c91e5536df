//! The graph runtime (issue #4, in progress): bucket policies and the persistent input
//! table. The runner drives capture/replay for now; the executor moves here. Invariant: this module imports no feature (no offload, no
//! LoRA, no speculative decoding); features plug in through the model and backends.

pub mod buckets;
pub mod inputs;

pub use buckets::BucketPolicy;
pub use inputs::{Field, InputTable, Layout, Rows, Width};
