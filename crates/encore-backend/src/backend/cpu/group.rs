//! The CPU twin of a tensor-parallel group: N CPU backends whose ranks run in threads of
//! one process and meet in shared memory for their collectives, so the sharded model
//! runs (and is tested) with no GPU.
//!
//! A collective publishes each rank's buffer address, waits for every rank (a barrier),
//! does its share of the work reading the other ranks' buffers, and waits again before
//! any rank may touch its buffer. An all-reduce splits the elements into one chunk per
//! rank; rank `r` sums chunk `r` over the ranks in rank order (f32, rounded once) and
//! writes the sum into every rank's buffer, so all ranks end bit-identical. A failed rank
//! aborts the group: every waiting and later collective returns at once, its output
//! undefined, and the error travels by the engine's own channel.

use std::sync::{Condvar, Mutex};

use half::{bf16, f16};

use crate::tensor::DType;

struct State {
    generation: u64,
    arrived: usize,
    /// Each rank's buffer address for the collective in flight.
    ptrs: Vec<usize>,
    aborted: Option<String>,
}

/// The shared memory of one group of CPU ranks.
pub struct CpuGroup {
    size: usize,
    state: Mutex<State>,
    cv: Condvar,
}

impl CpuGroup {
    pub fn new(size: usize) -> Self {
        CpuGroup {
            size,
            state: Mutex::new(State {
                generation: 0,
                arrived: 0,
                ptrs: vec![0; size],
                aborted: None,
            }),
            cv: Condvar::new(),
        }
    }

    pub fn size(&self) -> usize {
        self.size
    }

    pub fn abort(&self, why: &str) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.aborted.is_none() {
            tracing::warn!("tensor-parallel group aborted: {why}");
            s.aborted = Some(why.to_string());
        }
        self.cv.notify_all();
    }

    pub fn is_aborted(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .aborted
            .is_some()
    }

    /// Publish `ptr` as rank `rank`'s buffer (when given) and wait for every rank;
    /// returns every rank's published address, or `None` once the group is aborted.
    fn meet(&self, rank: usize, ptr: Option<usize>) -> Option<Vec<usize>> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.aborted.is_some() {
            return None;
        }
        if let Some(p) = ptr {
            s.ptrs[rank] = p;
        }
        s.arrived += 1;
        if s.arrived == self.size {
            s.arrived = 0;
            s.generation += 1;
            self.cv.notify_all();
        } else {
            let g = s.generation;
            while s.generation == g && s.aborted.is_none() {
                s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            if s.aborted.is_some() {
                return None;
            }
        }
        Some(s.ptrs.clone())
    }

    /// Sum the `n` elements of dtype `dtype` at `ptr` over the ranks, in place.
    pub(super) fn all_reduce(&self, rank: usize, ptr: usize, n: usize, dtype: DType) {
        let Some(ptrs) = self.meet(rank, Some(ptr)) else {
            return;
        };
        let (lo, hi) = (rank * n / self.size, (rank + 1) * n / self.size);
        match dtype {
            DType::BF16 => reduce_chunk::<bf16>(&ptrs, lo, hi, |v| v.to_f32(), bf16::from_f32),
            DType::F16 => reduce_chunk::<f16>(&ptrs, lo, hi, |v| v.to_f32(), f16::from_f32),
            _ => reduce_chunk::<f32>(&ptrs, lo, hi, |v| v, |v| v),
        }
        self.meet(rank, None);
    }

    /// Copy every rank's `bytes` bytes at `src` into `dst` (rank k at `k * bytes`).
    pub(super) fn all_gather(&self, rank: usize, src: usize, dst: usize, bytes: usize) {
        let Some(ptrs) = self.meet(rank, Some(src)) else {
            return;
        };
        for (k, &p) in ptrs.iter().enumerate() {
            // SAFETY: every rank published a live buffer of `bytes` bytes and holds it
            // until the second meeting; `dst` spans `size * bytes` bytes of this rank's
            // own, distinct from every source.
            unsafe {
                std::ptr::copy_nonoverlapping(p as *const u8, (dst + k * bytes) as *mut u8, bytes)
            };
        }
        self.meet(rank, None);
    }
}

/// Elements `lo..hi` of every rank's buffer: summed in rank order in f32, rounded once and
/// written back to every buffer.
fn reduce_chunk<T: Copy>(
    ptrs: &[usize],
    lo: usize,
    hi: usize,
    to: impl Fn(T) -> f32,
    from: impl Fn(f32) -> T,
) {
    for i in lo..hi {
        // SAFETY: each rank's buffer holds at least `hi` elements of T and is not
        // written by anyone else in this chunk until the second meeting; chunks of
        // different ranks are disjoint.
        unsafe {
            let sum = ptrs
                .iter()
                .map(|&p| to(*(p as *const T).add(i)))
                .fold(0.0f32, |a, v| a + v);
            let v = from(sum);
            for &p in ptrs {
                *(p as *mut T).add(i) = v;
            }
        }
    }
}
