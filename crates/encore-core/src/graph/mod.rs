//! The graph runtime (issue #4, in progress): bucket policies so far. The executor and
//! persistent inputs follow. Invariant: this module imports no feature (no offload, no
//! LoRA, no speculative decoding); features plug in through the model and backends.

pub mod buckets;

pub use buckets::BucketPolicy;
