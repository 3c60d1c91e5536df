//! The capture arena: a bump allocator over reserved virtual memory whose physical
//! backing is mapped on demand. Intermediates of a forward step (eager or captured) are
//! views into it; [`Arena::reset`] starts a new epoch. It is the one allocator allowed
//! during capture, since handing out a view touches no device API.
//!
//! Captured graphs bake in the addresses of their intermediates and keep them for as long
//! as they may replay. How graphs of different buckets share memory is the
//! [`GraphMemory`] strategy:
//! - `arena` (the default): one reserved range for everything. Each epoch (eager step or
//!   capture) bumps from offset 0; chunks are mapped at the end of the mapped prefix when
//!   an epoch needs more. A later, larger bucket grows the mapping in place: no address
//!   moves, every earlier graph stays valid, physical = the largest epoch's need rounded
//!   up to the granularity. Graphs never run concurrently (DESIGN invariant 5), so they
//!   may share it.
//! - `private`: each capture reserves its own range and maps its own chunks, held by that
//!   graph (physical = the sum over graphs, plus the eager steps' range).
//! - `multi-va` (xLLM's design): each capture reserves a new range onto which every
//!   existing chunk is mapped (the remap cost is timed); growth creates one chunk and maps
//!   it into every live range. Physical = the largest need; virtual grows per capture.
//!
//! Mapping timing. Nothing is created or mapped between [`Arena::begin_capture`] and
//! [`Arena::end_capture`]: `cuMemCreate`/`cuMemMap` are not stream work and the backend
//! captures in thread-local mode. The runner runs each bucket eagerly right before
//! capturing it (same shapes, same allocation order), which maps the capture's need in
//! its range; `begin_capture(expect)` maps `expect` bytes in the capture's range before
//! the stream starts capturing, so kernels and copies are recorded over mapped memory.
//! Should a capture allocate beyond that, the view is still handed out and `end_capture`
//! maps it before the graph can replay: a kernel node records pointer values only
//! (`cuda_kernel_captured_over_unmapped_memory_replays_after_end_capture` checks it on the
//! GPU), whereas the driver may resolve a copy node's pointers at capture, which is why
//! the runner maps first rather than relying on this.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Weak};
use std::time::Instant;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::tensor::{DType, Storage, Tensor};
use crate::vmm::{MappedRange, PhysicalChunk, Vmm, VmmUsage};

/// Alignment of every arena allocation (enough for 16-byte vector loads and cuBLASLt).
pub const ARENA_ALIGN: usize = 256;

/// How captured graphs of different buckets get their intermediate memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GraphMemory {
    /// Every capture gets fresh memory: physical grows with the sum of the buckets.
    Private,
    /// A new virtual range per capture, all sharing one set of physical chunks (xLLM).
    MultiVa,
    /// One growable range shared by every capture and eager step (ours).
    #[default]
    Arena,
}

impl GraphMemory {
    pub const ALL: [GraphMemory; 3] = [
        GraphMemory::Private,
        GraphMemory::MultiVa,
        GraphMemory::Arena,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            GraphMemory::Private => "private",
            GraphMemory::MultiVa => "multi-va",
            GraphMemory::Arena => "arena",
        }
    }
}

impl fmt::Display for GraphMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl FromStr for GraphMemory {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        GraphMemory::ALL
            .into_iter()
            .find(|g| g.name() == s)
            .ok_or_else(|| {
                Error::invalid(
                    "graph memory strategy",
                    format!("`{s}` is not one of private, multi-va, arena"),
                )
            })
    }
}

/// What an arena holds and has done (its pool: every chunk and range it created that is
/// still alive, including those only captured graphs hold now).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ArenaStats {
    pub strategy: GraphMemory,
    pub granularity: usize,
    /// Bytes of live physical chunks.
    pub physical_bytes: usize,
    pub chunks: usize,
    /// Bytes of live reserved ranges.
    pub virtual_bytes: usize,
    pub ranges: usize,
    /// The largest epoch's need (bytes in use at once), over all epochs.
    pub peak_bytes: usize,
    /// Chunk mappings made, and the time spent creating and mapping chunks.
    pub mappings: usize,
    pub map_secs: f64,
    /// `multi-va`: existing chunks mapped into a fresh range at capture, and that time.
    pub remaps: usize,
    pub remap_secs: f64,
}

/// What a captured graph must hold for its memory to stay mapped; dropping it releases
/// what only that graph held (its range under `private` and `multi-va`).
pub struct CaptureMemory {
    _range: Arc<MappedRange>,
    /// The capture epoch's need in bytes.
    pub bytes: usize,
}

/// A reserved range and the storage tensors view it through.
struct Region {
    range: Arc<MappedRange>,
    storage: Storage,
}

impl Region {
    fn new(vmm: &Arc<dyn Vmm>, bytes: usize, pool: &Arc<VmmUsage>) -> Result<Self> {
        let range = MappedRange::reserve(vmm, bytes, Some(pool))?;
        let storage = range.storage();
        Ok(Region { range, storage })
    }
}

pub struct Arena {
    vmm: Arc<dyn Vmm>,
    strategy: GraphMemory,
    pool: Arc<VmmUsage>,
    /// Bytes one epoch may use (what the caller asked for; the ranges are rounded up).
    capacity: usize,
    eager: Region,
    /// The region of the capture in progress (`private`, `multi-va`).
    capture: Option<Region>,
    capturing: bool,
    /// `arena`, `multi-va`: the shared chunks, mapped in this order from offset 0.
    shared: Vec<Arc<PhysicalChunk>>,
    /// `multi-va`: every range the shared chunks must be mapped into (eager first).
    ranges: Vec<Weak<MappedRange>>,
    top: usize,
    peak: usize,
    epoch_peak: usize,
    stats: ArenaStats,
}

impl Arena {
    /// A fixed arena of `bytes`, mapped in full now (for tests and tools that capture
    /// without the runner's epochs). The `arena` strategy.
    pub fn new(backend: &dyn Backend, bytes: usize) -> Result<Self> {
        let mut a = Self::for_graphs(backend, bytes, GraphMemory::Arena)?;
        a.ensure(a.eager.range.bytes())?;
        Ok(a)
    }

    /// An arena whose epochs may use up to `bytes`, with nothing mapped yet: physical
    /// chunks are mapped as epochs need them, shared between captures per `strategy`.
    pub fn for_graphs(backend: &dyn Backend, bytes: usize, strategy: GraphMemory) -> Result<Self> {
        let vmm = backend.vmm()?;
        let pool = Arc::new(VmmUsage::default());
        let eager = Region::new(&vmm, bytes, &pool)?;
        let ranges = vec![Arc::downgrade(&eager.range)];
        Ok(Arena {
            stats: ArenaStats {
                strategy,
                granularity: vmm.granularity(),
                ..ArenaStats::default()
            },
            vmm,
            strategy,
            pool,
            capacity: bytes,
            eager,
            capture: None,
            capturing: false,
            shared: Vec::new(),
            ranges,
            top: 0,
            peak: 0,
            epoch_peak: 0,
        })
    }

    fn region(&self) -> &Region {
        self.capture.as_ref().unwrap_or(&self.eager)
    }

    /// A view of `shape` elements of `dtype`, valid until the next `reset`. Outside a
    /// capture the memory is mapped before this returns.
    pub fn alloc(&mut self, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let bytes = crate::tensor::shape_bytes("alloc", shape, dtype)?;
        let start = self.top.next_multiple_of(ARENA_ALIGN);
        if start + bytes > self.capacity {
            return Err(Error::OutOfMemory {
                device: self.vmm.device_name(),
                bytes,
                what: format!(
                    "arena allocation of {shape:?} {dtype} ({} of {} arena bytes in use)",
                    self.top, self.capacity
                ),
            });
        }
        if !self.capturing {
            self.ensure(start + bytes)?;
        }
        self.top = start + bytes;
        self.peak = self.peak.max(self.top);
        self.epoch_peak = self.epoch_peak.max(self.top);
        Tensor::new(self.region().storage.clone(), start, shape, dtype)
    }

    /// Start a new epoch: every earlier view may be reused. Inside a capture epoch this
    /// does nothing: all pieces of one capture are live together, so they must not
    /// overlap (the epoch ends with [`Arena::end_capture`]).
    pub fn reset(&mut self) {
        if !self.capturing {
            self.top = 0;
        }
    }

    /// Start a capture epoch. `private`, `multi-va`: switch to a fresh range (`multi-va`
    /// maps every shared chunk into it); then map `expect` bytes, all before the backend
    /// begins capturing. Every allocation until [`Arena::end_capture`] belongs to this one
    /// epoch (all pieces of one capture are live together).
    pub fn begin_capture(&mut self, expect: usize) -> Result<()> {
        if self.capturing {
            return Err(Error::Capture(
                "arena: begin_capture while a capture epoch is open".into(),
            ));
        }
        match self.strategy {
            GraphMemory::Arena => {}
            GraphMemory::Private => {
                self.capture = Some(Region::new(&self.vmm, self.capacity, &self.pool)?);
            }
            GraphMemory::MultiVa => {
                let region = Region::new(&self.vmm, self.capacity, &self.pool)?;
                let t = Instant::now();
                for c in &self.shared {
                    region.range.push(c)?;
                }
                self.stats.remap_secs += t.elapsed().as_secs_f64();
                self.stats.remaps += self.shared.len();
                self.ranges.push(Arc::downgrade(&region.range));
                self.capture = Some(region);
            }
        }
        self.top = 0;
        self.epoch_peak = 0;
        self.ensure(expect.min(self.capacity))?;
        self.capturing = true;
        Ok(())
    }

    /// End the capture epoch (after the backend stopped capturing): map whatever the
    /// epoch allocated beyond what was mapped, and hand the graph its memory to hold.
    /// Later epochs run in the eager region again.
    pub fn end_capture(&mut self) -> Result<CaptureMemory> {
        if !self.capturing {
            return Err(Error::Capture(
                "arena: end_capture without begin_capture".into(),
            ));
        }
        self.capturing = false;
        let mapped = self.ensure(self.epoch_peak);
        let region = self.capture.take();
        mapped?;
        let range = region.map_or_else(|| self.eager.range.clone(), |r| r.range);
        self.top = 0;
        Ok(CaptureMemory {
            _range: range,
            bytes: self.epoch_peak,
        })
    }

    /// Map physical memory so the current region covers `need` bytes from offset 0.
    fn ensure(&mut self, need: usize) -> Result<()> {
        let region = self.capture.as_ref().unwrap_or(&self.eager);
        if need == 0 || region.range.mapped() >= need {
            return Ok(());
        }
        let t = Instant::now();
        match self.strategy {
            GraphMemory::Private => {
                let range = &region.range;
                let chunk =
                    PhysicalChunk::create(&self.vmm, need - range.mapped(), Some(&self.pool))
                        .map_err(|e| self.grow_error(need, e))?;
                range.push(&Arc::new(chunk))?;
                self.stats.mappings += 1;
            }
            GraphMemory::Arena | GraphMemory::MultiVa => {
                let have: usize = self.shared.iter().map(|c| c.bytes()).sum();
                if need > have {
                    let chunk = PhysicalChunk::create(&self.vmm, need - have, Some(&self.pool))
                        .map_err(|e| self.grow_error(need, e))?;
                    self.shared.push(Arc::new(chunk));
                }
                // Map the chunks each live range lacks (every range of `multi-va`; the one
                // range of `arena`).
                self.ranges.retain(|r| r.strong_count() > 0);
                for range in self.ranges.iter().filter_map(Weak::upgrade) {
                    for c in &self.shared[range.num_mappings()..] {
                        range.push(c)?;
                        self.stats.mappings += 1;
                    }
                }
            }
        }
        self.stats.map_secs += t.elapsed().as_secs_f64();
        Ok(())
    }

    fn grow_error(&self, need: usize, e: Error) -> Error {
        Error::OutOfMemory {
            device: self.vmm.device_name(),
            bytes: need,
            what: format!("the {} graph arena's mapping ({e})", self.strategy),
        }
    }

    /// Bytes one epoch may use.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes in use in this epoch.
    pub fn used(&self) -> usize {
        self.top
    }

    /// Most bytes ever in use at once.
    pub fn peak(&self) -> usize {
        self.peak
    }

    pub fn strategy(&self) -> GraphMemory {
        self.strategy
    }

    /// Physical and virtual memory of this arena's pool, and mapping costs.
    pub fn stats(&self) -> ArenaStats {
        ArenaStats {
            physical_bytes: self.pool.physical_bytes(),
            chunks: self.pool.chunks(),
            virtual_bytes: self.pool.virtual_bytes(),
            ranges: self.pool.ranges(),
            peak_bytes: self.peak,
            ..self.stats.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;

    #[test]
    fn bump_align_reset_and_exhaustion() {
        let cpu = CpuBackend::new();
        let mut a = Arena::new(&cpu, 4096).unwrap();
        let x = a.alloc(DType::F32, &[3]).unwrap();
        let y = a.alloc(DType::BF16, &[5]).unwrap();
        assert_eq!(x.offset(), 0);
        assert_eq!(y.offset(), ARENA_ALIGN);
        assert_eq!(a.used(), ARENA_ALIGN + 10);
        let err = a.alloc(DType::F32, &[2000]).unwrap_err().to_string();
        assert!(err.contains("8000 bytes"), "{err}");
        a.reset();
        let z = a.alloc(DType::F32, &[1]).unwrap();
        assert!(z.same_start(&x));
        assert_eq!(a.peak(), ARENA_ALIGN + 10);
    }

    #[test]
    fn arena_allocates_during_capture_backend_does_not() {
        let cpu = CpuBackend::new();
        let mut a = Arena::new(&cpu, 1024).unwrap();
        cpu.begin_capture().unwrap();
        assert!(a.alloc(DType::F32, &[16]).is_ok());
        let err = cpu.alloc(DType::F32, &[16]).unwrap_err();
        assert!(
            err.to_string()
                .contains("`alloc` is not allowed during graph capture"),
            "{err}"
        );
        cpu.end_capture().unwrap();
    }

    #[test]
    fn pieces_of_one_capture_share_one_epoch() {
        let cpu = CpuBackend::new();
        for strategy in GraphMemory::ALL {
            let mut a = Arena::for_graphs(&cpu, 1 << 20, strategy).unwrap();
            let eager = a.alloc(DType::F32, &[4]).unwrap();
            a.begin_capture(a.used()).unwrap();
            let first = a.alloc(DType::F32, &[1000]).unwrap();
            a.reset();
            let second = a.alloc(DType::F32, &[1000]).unwrap();
            assert!(second.offset() >= first.offset() + 4000, "{strategy}");
            let mem = a.end_capture().unwrap();
            assert_eq!(mem.bytes, second.offset() + 4000);
            // Back in the eager region, epochs restart at 0.
            a.reset();
            assert!(a.alloc(DType::F32, &[4]).unwrap().same_start(&eager));
            assert!(a.end_capture().is_err());
        }
    }

    #[test]
    fn graph_memory_names_round_trip() {
        for g in GraphMemory::ALL {
            assert_eq!(g.name().parse::<GraphMemory>().unwrap(), g);
        }
        let err = "shared".parse::<GraphMemory>().unwrap_err().to_string();
        assert!(err.contains("private, multi-va, arena"), "{err}");
    }
}
