//! Memory primitives above the backends: the capture arena (and later the KV cache and
//! weight offload).

mod arena;

pub use arena::{Arena, ARENA_ALIGN};
