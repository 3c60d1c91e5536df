//! Memory primitives above the backends: virtual memory management (`vmm`) and the
//! capture arena built on it (and later the KV cache and weight offload).

mod arena;
pub mod vmm;

pub use arena::{Arena, ArenaStats, CaptureMemory, GraphMemory, ARENA_ALIGN};
