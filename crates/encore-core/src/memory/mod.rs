//! Memory: the backend layer's virtual memory management (`encore_backend::vmm`) and
//! capture arena (`encore_backend::arena`), re-exported here, and the memory budget a run
//! is checked against before it allocates (`budget`).

mod budget;

pub use budget::{host_memory, MemoryLimit, MemoryNeed, HOST_FRACTION};
pub use encore_backend::arena::{Arena, ArenaStats, CaptureMemory, GraphMemory, ARENA_ALIGN};
pub use encore_backend::vmm;
