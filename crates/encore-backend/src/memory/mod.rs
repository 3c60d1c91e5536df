//! Memory primitives above the backends: virtual memory management (`vmm`) and the
//! capture arena built on it.

mod arena;
pub mod vmm;

pub use arena::{Arena, ArenaStats, CaptureMemory, GraphMemory, ARENA_ALIGN};
