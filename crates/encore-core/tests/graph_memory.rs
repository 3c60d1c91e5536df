//! Graph memory strategies (issue #5) through the runner: after capturing any set of
//! buckets in any order, the `arena` strategy's physical bytes equal the largest single
//! bucket's need rounded up to the granularity; `multi-va` has the same physical bytes
//! and more virtual; `private` grows with the sum. Every graph captured before a later
//! growth still replays equal to eager. Dropping graphs and runners releases everything.
//! Runs on the CPU backend (memfd VMM, tape graphs) in CI and on CUDA (cuMem*, real
//! graphs) on the GPU machine.

use std::sync::Mutex;

use encore_core::backend::cpu::CpuBackend;
use encore_core::memory::{Arena, ArenaStats, GraphMemory};
use encore_core::request::SamplingParams;
use encore_core::runner::{Runner, Seqs};
use encore_core::{Backend, DType};

mod common;
const BUCKETS: [usize; 5] = [1, 2, 4, 8, 16];

fn runner<'b>(be: &'b dyn Backend, graph: Option<GraphMemory>) -> Runner<'b> {
    let Some(strategy) = graph else {
        return common::tiny_runner(be);
    };
    let mut graphs = common::tiny_runner_with_memory(be, strategy);
    graphs.set_graph_mode(Some(common::buckets()));
    graphs
}

fn orders() -> [(&'static str, Vec<usize>); 3] {
    [
        ("ascending", BUCKETS.to_vec()),
        ("descending", BUCKETS.iter().rev().copied().collect()),
        ("shuffled", vec![4, 16, 1, 8, 2]),
    ]
}

fn round_up(bytes: usize, g: usize) -> usize {
    bytes.next_multiple_of(g)
}

/// Capture `buckets` in this order; returns the stats and each bucket's need.
fn capture(be: &dyn Backend, strategy: GraphMemory, buckets: &[usize]) -> (ArenaStats, Vec<usize>) {
    let mut r = runner(be, Some(strategy));
    let mut virtual_after = Vec::new();
    for &b in buckets {
        r.capture_bucket(b).unwrap();
        virtual_after.push(r.graph_memory_stats().virtual_bytes);
    }
    let stats = r.graph_memory_stats();
    if strategy != GraphMemory::Arena {
        // A new range per capture: virtual grows with every capture.
        assert!(
            virtual_after.windows(2).all(|w| w[1] > w[0]),
            "{strategy}: {virtual_after:?}"
        );
    } else {
        assert!(virtual_after.windows(2).all(|w| w[1] == w[0]));
    }
    let needs = r.captured_buckets().into_iter().map(|(_, n)| n).collect();
    (stats, needs)
}

/// The physical bytes of a runner that captured only `bucket`.
fn single_bucket_physical(be: &dyn Backend, bucket: usize) -> (usize, usize) {
    let mut r = runner(be, Some(GraphMemory::Arena));
    r.capture_bucket(bucket).unwrap();
    let need = r.captured_buckets()[0].1;
    (r.graph_memory_stats().physical_bytes, need)
}

fn check_strategies(be: &dyn Backend) {
    let g = be.vmm().unwrap().granularity();
    let (largest_physical, largest_need) = single_bucket_physical(be, 16);
    assert_eq!(largest_physical, round_up(largest_need, g));
    for (order, buckets) in orders() {
        let (arena, needs) = capture(be, GraphMemory::Arena, &buckets);
        let (multi, multi_needs) = capture(be, GraphMemory::MultiVa, &buckets);
        let (private, private_needs) = capture(be, GraphMemory::Private, &buckets);
        assert_eq!(needs, multi_needs, "{order}");
        assert_eq!(needs, private_needs, "{order}");
        let max_need = *needs.iter().max().unwrap();
        assert_eq!(
            max_need, largest_need,
            "{order}: the largest bucket needs the most"
        );
        assert!(
            needs.windows(2).all(|w| w[0] <= w[1]),
            "{order}: needs grow with the bucket {needs:?}"
        );
        // arena: the largest single bucket's need, rounded up to the granularity.
        assert_eq!(
            arena.physical_bytes,
            round_up(max_need, g),
            "{order}: {arena:?}"
        );
        assert_eq!(arena.physical_bytes, largest_physical, "{order}");
        assert_eq!(arena.ranges, 1, "{order}: {arena:?}");
        // multi-va: the same physical bytes, one more range per capture.
        assert_eq!(
            multi.physical_bytes, arena.physical_bytes,
            "{order}: {multi:?}"
        );
        assert_eq!(multi.ranges, 1 + buckets.len(), "{order}: {multi:?}");
        assert!(multi.virtual_bytes > arena.virtual_bytes, "{order}");
        // private: every capture its own memory, plus the eager steps' range.
        let sum: usize = needs.iter().map(|&n| round_up(n, g)).sum();
        assert_eq!(
            private.physical_bytes,
            round_up(max_need, g) + sum,
            "{order}: {private:?}"
        );
        assert!(private.physical_bytes > arena.physical_bytes, "{order}");
        assert_eq!(private.ranges, 1 + buckets.len(), "{order}");
    }
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

/// Capture every bucket first in `order` (so earlier graphs see the arena grow after
/// them), then decode with batch sizes hitting every bucket, each step a replay, against
/// an eager runner on the same steps.
fn check_replay_after_growth(be: &dyn Backend, strategy: GraphMemory, order: &[usize], tol: f64) {
    let mut eager = runner(be, None);
    let mut eager_seqs = Seqs::for_runner(&eager).unwrap();
    let mut graph = runner(be, Some(strategy));
    let mut graph_seqs = Seqs::for_runner(&graph).unwrap();
    for &b in order {
        graph.capture_bucket(b).unwrap();
    }
    let greedy = SamplingParams::default();
    let n = 13usize;
    let mut last = vec![0u32; n];
    for (i, l) in last.iter_mut().enumerate() {
        let prompt: Vec<u32> = (0..2 + (i * 5) % 11)
            .map(|j| ((i * 31 + j * 7) % 250) as u32)
            .collect();
        *l = common::prefill_both(
            (&mut eager, &mut eager_seqs),
            (&mut graph, &mut graph_seqs),
            i,
            &prompt,
            greedy,
        );
    }
    // Buckets 1, 2, 4, 8, 16 (13 rows padded to 16), then the small ones again.
    let schedule = [1usize, 2, 3, 7, 13, 1, 5, 2];
    for (step_no, &bsz) in schedule.iter().enumerate() {
        let active = common::active_set(bsz, 3, step_no, n);
        let toks: Vec<[u32; 1]> = active.iter().map(|&i| [last[i]]).collect();
        let batch = common::decode_batch(
            &mut [&mut eager_seqs, &mut graph_seqs],
            &active,
            &toks,
            greedy,
        );
        let (ta, la) = eager.step_with_logits(&mut eager_seqs, &batch).unwrap();
        let (_, lb) = graph.step_with_logits(&mut graph_seqs, &batch).unwrap();
        for (k, (x, y)) in la.iter().zip(&lb).enumerate() {
            let e = rel_err(y, x);
            assert!(
                e <= tol,
                "{strategy} {order:?} step {step_no} batch {bsz} row {k}: error {e:.2e}"
            );
        }
        for (&i, &t) in active.iter().zip(&ta) {
            last[i] = t;
        }
    }
    let s = graph.graph_stats().unwrap();
    assert_eq!(
        (s.captures, s.hits),
        (5, schedule.len()),
        "{strategy} {order:?}: {s:?}"
    );
}

/// Capture, drop the graphs, capture again, drop the runner: the pool goes back to what
/// only the eager range holds, then to nothing.
fn check_release(be: &dyn Backend) {
    let usage = be.vmm().unwrap().usage().clone();
    let (chunks0, phys0, ranges0) = (usage.chunks(), usage.physical_bytes(), usage.ranges());
    for strategy in GraphMemory::ALL {
        for _cycle in 0..2 {
            let mut r = runner(be, Some(strategy));
            r.capture_all(&mut |_, _| ()).unwrap();
            let full = r.graph_memory_stats();
            assert!(full.physical_bytes > 0);
            // Dropping the graphs releases what only they held.
            r.set_graph_mode(None);
            let after = r.graph_memory_stats();
            assert_eq!(after.ranges, 1, "{strategy}: {after:?}");
            match strategy {
                GraphMemory::Private => assert!(after.physical_bytes < full.physical_bytes),
                _ => assert_eq!(after.physical_bytes, full.physical_bytes),
            }
            drop(r);
            assert_eq!(usage.chunks(), chunks0, "{strategy}: chunks leaked");
            assert_eq!(
                usage.physical_bytes(),
                phys0,
                "{strategy}: physical bytes leaked"
            );
            assert_eq!(usage.ranges(), ranges0, "{strategy}: ranges leaked");
        }
    }
}

#[test]
fn cpu_physical_bytes_per_strategy_in_any_order() {
    check_strategies(&CpuBackend::new());
}

#[test]
fn cpu_replay_after_growth_equals_eager() {
    let cpu = CpuBackend::new();
    for strategy in GraphMemory::ALL {
        for (_, order) in orders() {
            check_replay_after_growth(&cpu, strategy, &order, 1e-5);
        }
    }
}

#[test]
fn cpu_dropping_graphs_and_runners_releases_everything() {
    let cpu = CpuBackend::new();
    check_release(&cpu);
    let usage = cpu.vmm().unwrap().usage().clone();
    assert_eq!((usage.chunks(), usage.ranges()), (0, 0));
}

/// A capture epoch may allocate past what was mapped before it (nothing is mapped while
/// the stream captures); `end_capture` maps it before the graph replays, and growing the
/// mapping later keeps the graph valid. The kernel is captured with a pointer into a
/// reserved, still unmapped range (on CUDA this checks that a kernel node only records the
/// pointer value).
fn check_kernel_captured_over_unmapped_memory(be: &dyn Backend) {
    let (n, inter) = (64usize, 512usize);
    let data: Vec<f32> = (0..n * 2 * inter)
        .map(|i| ((i % 97) as f32 - 48.0) / 16.0)
        .collect();
    let gate_up = be.upload(&data, &[n, 2 * inter]).unwrap();
    let want = be.alloc(DType::F32, &[n, inter]).unwrap();
    be.silu_mul(&gate_up, &want).unwrap();
    let want = be.download::<f32>(&want).unwrap();
    for strategy in GraphMemory::ALL {
        let mut a = Arena::for_graphs(be, 64 << 20, strategy).unwrap();
        a.begin_capture(0).unwrap();
        assert_eq!(a.stats().physical_bytes, 0, "{strategy}");
        be.begin_capture().unwrap();
        let out = a.alloc(DType::F32, &[n, inter]).unwrap();
        be.silu_mul(&gate_up, &out).unwrap();
        let graph = be.end_capture().unwrap();
        let mem = a.end_capture().unwrap();
        assert_eq!(mem.bytes, n * inter * 4);
        let g = be.vmm().unwrap().granularity();
        assert_eq!(
            a.stats().physical_bytes,
            round_up(n * inter * 4, g),
            "{strategy}"
        );
        graph.replay().unwrap();
        assert_eq!(be.download::<f32>(&out).unwrap(), want, "{strategy}");
        // A later, larger eager epoch grows the mapping; the graph still replays.
        a.reset();
        let big = a.alloc(DType::F32, &[(4 * g) / 4]).unwrap();
        be.write(&big, &vec![7f32; g]).unwrap();
        assert!(a.stats().physical_bytes >= 4 * g);
        graph.replay().unwrap();
        assert_eq!(
            be.download::<f32>(&out).unwrap(),
            want,
            "{strategy} after growth"
        );
        drop((graph, out, mem, big));
    }
}

#[test]
fn cpu_kernel_captured_over_unmapped_memory_replays_after_end_capture() {
    check_kernel_captured_over_unmapped_memory(&CpuBackend::new());
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_kernel_captured_over_unmapped_memory_replays_after_end_capture() {
    let (_g, be) = cuda();
    check_kernel_captured_over_unmapped_memory(&be);
}

#[test]
fn cpu_refused_reservation_names_the_size() {
    let cpu = CpuBackend::new();
    for strategy in GraphMemory::ALL {
        let bytes = 1usize << 60;
        let err = Arena::for_graphs(&cpu, bytes, strategy)
            .err()
            .expect("a 1 EiB reservation fails")
            .to_string();
        assert!(
            err.contains(&bytes.to_string()) && err.contains("reservation"),
            "{err}"
        );
        let err = Arena::for_graphs(&cpu, usize::MAX, strategy)
            .err()
            .expect("overflow")
            .to_string();
        assert!(err.contains(&usize::MAX.to_string()), "{err}");
    }
}

fn cuda() -> (
    std::sync::MutexGuard<'static, ()>,
    encore_core::backend::cuda::CudaBackend,
) {
    static SERIAL: Mutex<()> = Mutex::new(());
    let g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    (g, encore_core::backend::cuda::CudaBackend::new(0).unwrap())
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_physical_bytes_per_strategy_in_any_order() {
    let (_g, be) = cuda();
    check_strategies(&be);
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_replay_after_growth_equals_eager() {
    let (_g, be) = cuda();
    for strategy in GraphMemory::ALL {
        for (_, order) in orders() {
            // Bucket shapes may pick other GEMM algorithms than the eager batch.
            check_replay_after_growth(&be, strategy, &order, 1e-4);
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_dropping_graphs_and_runners_returns_device_memory() {
    let (_g, be) = cuda();
    // One cycle first: lazily loaded library state (cuBLASLt plans) stays.
    check_release(&be);
    be.synchronize().unwrap();
    let start = be.mem_info().unwrap().0;
    for _ in 0..3 {
        check_release(&be);
    }
    be.synchronize().unwrap();
    let end = be.mem_info().unwrap().0;
    assert_eq!(
        end, start,
        "device free memory {start} -> {end} after capture/drop cycles"
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_refused_reservation_names_the_size() {
    let (_g, be) = cuda();
    let bytes = 1usize << 60;
    let err = Arena::for_graphs(&be, bytes, GraphMemory::Arena)
        .err()
        .expect("a 1 EiB reservation fails")
        .to_string();
    assert!(
        err.contains(&bytes.to_string()) && err.contains("cuMemAddressReserve"),
        "{err}"
    );
}
