//! Memory: the backend layer's virtual memory management and capture arena
//! (`encore_backend::memory`), and here the memory budget a run is checked against before
//! it allocates (`budget`).

mod budget;

pub use budget::{host_memory, MemoryLimit, MemoryNeed, HOST_FRACTION};
pub use encore_backend::memory::*;
