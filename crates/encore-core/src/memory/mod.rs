//! Memory primitives above the backends: virtual memory management (`vmm`) and the
//! capture arena built on it (and later the KV cache and weight offload), and the memory
//! budget a run is checked against before it allocates (`budget`).

mod arena;
mod budget;
pub mod vmm;

pub use arena::{Arena, ArenaStats, CaptureMemory, GraphMemory, ARENA_ALIGN};
pub use budget::{host_memory, MemoryLimit, MemoryNeed, HOST_FRACTION};
