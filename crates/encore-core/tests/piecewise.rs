//! Piecewise graphs for prefill and mixed steps against eager, through the runner: random
//! mixes of new prompts, prompt chunks and decode rows in every token bucket; two steps of
//! the same token count split differently into sequences; a long prompt chunked across
//! steps against the same prompt in one step; capture ahead of time. Bit-identical on the
//! CPU backend (tape graphs) in CI; on CUDA (real graphs) within f32 rounding.

use std::sync::Mutex;

use encore_core::backend::cpu::CpuBackend;
use encore_core::graph::{BucketPolicy, Key, Phase};
use encore_core::kv::SeqId;
use encore_core::request::SamplingParams;
use encore_core::runner::{GraphConfig, Runner, SeqStep, Seqs};
use encore_core::Backend;

mod common;

/// The CUDA tests of this file run one at a time: one's allocations (a KV resize, an
/// arena growth) must not land inside another's stream capture.
static CUDA: Mutex<()> = Mutex::new(());

fn cuda_lock() -> std::sync::MutexGuard<'static, ()> {
    CUDA.lock().unwrap_or_else(|e| e.into_inner())
}

/// Token buckets of the test runner (its max_tokens_per_step is 256).
fn graphs() -> GraphConfig {
    GraphConfig {
        decode: common::buckets(),
        mixed: BucketPolicy::SglangLike { max: 256 },
        verify: 0,
    }
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
    }
}

/// Logits agree within `tol` (normalised error), or exactly when `tol` is 0.
fn assert_close(a: &[Vec<f32>], b: &[Vec<f32>], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: row counts");
    for (k, (x, y)) in a.iter().zip(b).enumerate() {
        if tol == 0.0 {
            assert!(x == y, "{what} row {k}: logits differ");
        } else {
            let num: f64 = x.iter().zip(y).map(|(p, q)| ((p - q) as f64).powi(2)).sum();
            let den: f64 = y.iter().map(|q| (*q as f64).powi(2)).sum();
            let e = (num / den).sqrt();
            assert!(e <= tol, "{what} row {k}: logits error {e:.2e} > {tol:.0e}");
        }
    }
}

/// One sequence of the scenario: its whole prompt and how much of it ran.
struct Seq {
    id: SeqId,
    prompt: Vec<u32>,
    done: usize,
}

/// The live sequences of [`check_piecewise_matches_eager`] and the random source of its
/// steps.
struct Scenario {
    rng: Rng,
    live: Vec<Seq>,
    next_id: u64,
}

impl Scenario {
    /// The next step, within a random token budget (anywhere in 1..=256, so every bucket
    /// size range is met) and 16 sequences: live sequences continue first (a decode
    /// token once their prompt is done, else the next prompt chunk), then new ones start
    /// with what is left. Also the sequences that finished (to free).
    fn next_batch(&mut self) -> (Vec<(SeqId, Vec<u32>)>, Vec<SeqId>) {
        let rng = &mut self.rng;
        let budget = 1 + rng.below(256);
        let mut batch: Vec<(SeqId, Vec<u32>)> = Vec::new();
        let mut used = 0;
        let mut finished = Vec::new();
        for (i, s) in self.live.iter_mut().enumerate() {
            if batch.len() == 16 || used >= budget {
                break;
            }
            let len = if s.done >= s.prompt.len() {
                if s.done >= 120 {
                    finished.push(i);
                    continue;
                }
                1
            } else {
                (1 + rng.below(48))
                    .min(s.prompt.len() - s.done)
                    .min(budget - used)
            };
            let toks: Vec<u32> = if s.done >= s.prompt.len() {
                vec![(rng.below(250)) as u32]
            } else {
                s.prompt[s.done..s.done + len].to_vec()
            };
            if s.done >= s.prompt.len() {
                s.prompt.push(toks[0]);
            }
            s.done += len;
            used += len;
            batch.push((s.id, toks));
        }
        let finished: Vec<SeqId> = finished
            .iter()
            .rev()
            .map(|&i| self.live.remove(i).id)
            .collect();
        while batch.len() < 16 && used < budget && self.live.len() < 16 {
            let prompt: Vec<u32> = (0..2 + rng.below(100))
                .map(|_| rng.below(250) as u32)
                .collect();
            let len = (1 + rng.below(64)).min(prompt.len()).min(budget - used);
            let id = SeqId(self.next_id);
            self.next_id += 1;
            batch.push((id, prompt[..len].to_vec()));
            used += len;
            self.live.push(Seq {
                id,
                prompt,
                done: len,
            });
        }
        (batch, finished)
    }
}

/// Drive an eager and a piecewise runner through random mixed steps with the same
/// (teacher-forced) tokens; compare logits and sampled tokens of every step.
fn check_piecewise_matches_eager(be: &dyn Backend, tol: f64) {
    let mut eager = common::tiny_runner(be);
    let mut eager_seqs = Seqs::for_runner(&eager).unwrap();
    let mut graph = common::tiny_runner(be);
    let mut graph_seqs = Seqs::for_runner(&graph).unwrap();
    graph.set_graphs(Some(graphs()));
    let sampling = SamplingParams {
        temperature: 0.7,
        top_k: 30,
        top_p: 0.95,
        seed: 11,
        ..Default::default()
    };
    let mut scenario = Scenario {
        rng: Rng(0x9e37_79b9_7f4a_7c15),
        live: Vec::new(),
        next_id: 0,
    };
    let mut buckets_hit = std::collections::BTreeSet::new();
    let mut mixed_steps = 0;
    for step_no in 0..40u64 {
        let (batch, finished) = scenario.next_batch();
        for id in finished {
            for r_seqs in [&mut eager_seqs, &mut graph_seqs] {
                r_seqs.blocks.free(id).unwrap();
            }
        }
        if batch.is_empty() {
            continue;
        }
        for r_seqs in [&mut eager_seqs, &mut graph_seqs] {
            for (id, toks) in &batch {
                if r_seqs.blocks.contains(*id) {
                    r_seqs.blocks.append(*id, toks.len()).unwrap();
                } else {
                    r_seqs.blocks.allocate(*id, toks.len()).unwrap();
                }
            }
        }
        let steps: Vec<SeqStep<'_>> = batch
            .iter()
            .map(|(id, toks)| SeqStep {
                seq: *id,
                tokens: toks,
                sampling,
                masked: false,
                score: None,
                verify: false,
                logit_bias: &[],
            })
            .collect();
        let (ta, la) = eager.step_with_logits(&mut eager_seqs, &steps).unwrap();
        let before = graph.phase_stats(Phase::Mixed).unwrap();
        let (tb, lb) = graph.step_with_logits(&mut graph_seqs, &steps).unwrap();
        let after = graph.phase_stats(Phase::Mixed).unwrap();
        let n: usize = batch.iter().map(|(_, t)| t.len()).sum();
        let what = format!("step {step_no} ({n} tokens, {} sequences)", batch.len());
        assert_close(&lb, &la, tol, &what);
        if tol == 0.0 {
            assert_eq!(ta, tb, "{what}: sampled tokens");
        }
        if batch.iter().any(|(_, t)| t.len() > 1) {
            mixed_steps += 1;
            assert_eq!(
                after.rows - before.rows - (after.padded_rows - before.padded_rows),
                n
            );
            buckets_hit.insert(after.rows - before.rows);
        }
    }
    let s = graph.phase_stats(Phase::Mixed).unwrap();
    assert_eq!(s.hits + s.misses, mixed_steps, "{s:?}");
    assert_eq!(
        s.captures,
        buckets_hit.len(),
        "each bucket captured once: {s:?}"
    );
    assert!(buckets_hit.len() >= 10, "buckets met: {buckets_hit:?}");
    assert!(s.padded_rows > 0, "{s:?}");
    assert_eq!(s.pieces, s.captures * graph.model().num_pieces(), "{s:?}");
}

#[test]
fn cpu_piecewise_matches_eager_bit_for_bit() {
    let cpu = CpuBackend::new();
    check_piecewise_matches_eager(&cpu, 0.0);
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_piecewise_matches_eager() {
    let _g = cuda_lock();
    let be = encore_core::backend::cuda::CudaBackend::new(0).unwrap();
    check_piecewise_matches_eager(&be, 1e-4);
}

/// Run `splits` (lists of (sequence, token count)) as steps of one runner; return each
/// step's logits.
fn run_splits(
    r: &mut Runner<'_>,
    r_seqs: &mut Seqs,
    prompts: &[Vec<u32>],
    splits: &[&[(usize, usize)]],
) -> Vec<Vec<Vec<f32>>> {
    let mut done = vec![0usize; prompts.len()];
    let mut out = Vec::new();
    for split in splits {
        for &(s, len) in split.iter() {
            let id = SeqId(s as u64);
            if r_seqs.blocks.contains(id) {
                r_seqs.blocks.append(id, len).unwrap();
            } else {
                r_seqs.blocks.allocate(id, len).unwrap();
            }
        }
        let steps: Vec<SeqStep<'_>> = split
            .iter()
            .map(|&(s, len)| {
                let toks = &prompts[s][done[s]..done[s] + len];
                done[s] += len;
                SeqStep {
                    seq: SeqId(s as u64),
                    tokens: toks,
                    sampling: SamplingParams::default(),
                    masked: false,
                    score: None,
                    verify: false,
                    logit_bias: &[],
                }
            })
            .collect();
        out.push(r.step_with_logits(r_seqs, &steps).unwrap().1);
    }
    out
}

#[test]
fn same_token_count_split_differently_replays_one_bucket() {
    let cpu = CpuBackend::new();
    let prompts: Vec<Vec<u32>> = (0..6u32)
        .map(|i| (0..40).map(|j| (i * 31 + j * 7) % 250).collect())
        .collect();
    // Three steps of 16 tokens each (bucket 16), split 10+6, 1+15, 4x4, over fresh sequences.
    let splits: &[&[(usize, usize)]] = &[
        &[(0, 10), (1, 6)],
        &[(2, 1), (3, 15)],
        &[(0, 4), (1, 4), (4, 4), (5, 4)],
    ];
    let mut eager = common::tiny_runner(&cpu);
    let mut eager_seqs = Seqs::for_runner(&eager).unwrap();
    let mut graph = common::tiny_runner(&cpu);
    let mut graph_seqs = Seqs::for_runner(&graph).unwrap();
    graph.set_graphs(Some(graphs()));
    let a = run_splits(&mut eager, &mut eager_seqs, &prompts, splits);
    let b = run_splits(&mut graph, &mut graph_seqs, &prompts, splits);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_close(y, x, 0.0, &format!("split {i}"));
    }
    let s = graph.phase_stats(Phase::Mixed).unwrap();
    assert_eq!((s.captures, s.hits, s.padded_rows), (1, 2, 0), "{s:?}");
    assert_eq!(
        graph.captured().iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        vec![Key {
            phase: Phase::Mixed,
            bucket: 16
        }]
    );
}

#[test]
fn a_chunked_prompt_gives_the_tokens_of_one_step() {
    let cpu = CpuBackend::new();
    let prompt: Vec<Vec<u32>> = vec![(0..100u32).map(|j| (j * 13 + 5) % 250).collect()];
    let mut whole = common::tiny_runner(&cpu);
    let mut whole_seqs = Seqs::for_runner(&whole).unwrap();
    let mut chunked = common::tiny_runner(&cpu);
    let mut chunked_seqs = Seqs::for_runner(&chunked).unwrap();
    for r in [&mut whole, &mut chunked] {
        r.set_graphs(Some(graphs()));
    }
    let one = run_splits(&mut whole, &mut whole_seqs, &prompt, &[&[(0, 100)]]);
    let parts = run_splits(
        &mut chunked,
        &mut chunked_seqs,
        &prompt,
        &[&[(0, 37)], &[(0, 50)], &[(0, 13)]],
    );
    // The last chunk's logits are the whole prompt's last-token logits (f32 rounding:
    // a different number of rows in the GEMMs and attention tiles).
    assert_close(&parts[2], &one[0], 1e-5, "chunked vs whole");
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i)
    };
    assert_eq!(argmax(&parts[2][0]), argmax(&one[0][0]));
    // Then decoding on from both gives the same greedy tokens.
    let mut last = [argmax(&one[0][0]).unwrap() as u32; 2];
    for step in 1..8u64 {
        let pairs = [
            (&mut whole, &mut whole_seqs),
            (&mut chunked, &mut chunked_seqs),
        ];
        for (k, (r, r_seqs)) in pairs.into_iter().enumerate() {
            r_seqs.blocks.append(SeqId(0), 1).unwrap();
            last[k] = r
                .step(
                    r_seqs,
                    &[SeqStep {
                        seq: SeqId(0),
                        tokens: &[last[k]],
                        sampling: SamplingParams::default(),
                        masked: false,
                        score: None,
                        verify: false,
                        logit_bias: &[],
                    }],
                )
                .unwrap()[0];
        }
        assert_eq!(last[0], last[1], "decode step {step}");
    }
}

#[test]
fn capture_all_covers_decode_and_token_buckets() {
    let cpu = CpuBackend::new();
    let mut r = common::tiny_runner(&cpu);
    let mut r_seqs = Seqs::for_runner(&r).unwrap();
    r.set_graphs(Some(graphs()));
    let keys = r.graph_keys();
    let mut seen = Vec::new();
    r.capture_all(&mut |done, total| seen.push((done, total)))
        .unwrap();
    assert_eq!(seen.len(), keys.len());
    assert_eq!(seen.last(), Some(&(keys.len(), keys.len())));
    let decode = r.phase_stats(Phase::Decode).unwrap();
    let mixed = r.phase_stats(Phase::Mixed).unwrap();
    assert_eq!(decode.captures, 5);
    // 4..32 step 4, 48..256 step 16: 8 + 14.
    assert_eq!(mixed.captures, 22);
    assert_eq!(r.captured().len(), 27);
    // A prefill of 30 tokens then hits bucket 32 with no capture.
    r_seqs.blocks.allocate(SeqId(0), 30).unwrap();
    r.step(
        &mut r_seqs,
        &[SeqStep {
            seq: SeqId(0),
            tokens: &[3; 30],
            sampling: SamplingParams::default(),
            masked: false,
            score: None,
            verify: false,
            logit_bias: &[],
        }],
    )
    .unwrap();
    let mixed = r.phase_stats(Phase::Mixed).unwrap();
    assert_eq!((mixed.captures, mixed.hits, mixed.padded_rows), (22, 1, 2));
    // Not a key of the configuration: refused, naming it.
    let e = r
        .capture_key(Key {
            phase: Phase::Mixed,
            bucket: 40,
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("mixed 40"), "{e}");
}

#[test]
fn verify_graphs_checks_piecewise_replays() {
    let cpu = CpuBackend::new();
    let mut r = common::tiny_runner(&cpu);
    let mut r_seqs = Seqs::for_runner(&r).unwrap();
    r.set_graphs(Some(graphs()));
    r.set_verify_graphs(true);
    let prompts: Vec<Vec<u32>> = vec![vec![5; 21], vec![7; 9]];
    run_splits(&mut r, &mut r_seqs, &prompts, &[&[(0, 21), (1, 9)]]);
    let s = r.phase_stats(Phase::Mixed).unwrap();
    assert_eq!(s.verified, 1, "{s:?}");
    assert!(s.max_verify_error == 0.0, "{s:?}");
}

/// Capture decode and token buckets in `order` with the `arena` strategy; returns the
/// physical bytes and the largest capture need.
fn arena_after(be: &dyn Backend, order: &[Key]) -> (usize, usize) {
    let mut r = common::tiny_runner(be);
    r.set_graphs(Some(graphs()));
    for &k in order {
        r.capture_key(k).unwrap();
    }
    let need = r.captured().iter().map(|&(_, n)| n).max().unwrap();
    (r.graph_memory_stats().physical_bytes, need)
}

fn check_graph_memory_is_max_over_phases(be: &dyn Backend) {
    let g = be.vmm().unwrap().granularity();
    let mut r = common::tiny_runner(be);
    r.set_graphs(Some(graphs()));
    let keys = r.graph_keys();
    drop(r);
    let mut shuffled = keys.clone();
    let mut rng = Rng(7);
    for i in (1..shuffled.len()).rev() {
        shuffled.swap(i, rng.below(i + 1));
    }
    let ascending: Vec<Key> = keys.iter().rev().copied().collect();
    let (largest, need) = arena_after(
        be,
        &[Key {
            phase: Phase::Mixed,
            bucket: 256,
        }],
    );
    assert_eq!(largest, need.next_multiple_of(g));
    for (name, order) in [
        ("descending", &keys),
        ("ascending", &ascending),
        ("shuffled", &shuffled),
    ] {
        let (physical, max_need) = arena_after(be, order);
        assert_eq!(
            max_need, need,
            "{name}: the largest token bucket needs the most"
        );
        assert_eq!(
            physical, largest,
            "{name}: graph memory is the largest entry's"
        );
    }
}

#[test]
fn cpu_graph_memory_is_max_over_decode_and_token_buckets() {
    check_graph_memory_is_max_over_phases(&CpuBackend::new());
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_graph_memory_is_max_over_decode_and_token_buckets() {
    let _g = cuda_lock();
    let be = encore_core::backend::cuda::CudaBackend::new(0).unwrap();
    check_graph_memory_is_max_over_phases(&be);
}

/// After an engine start-up with every bucket captured, a first request (a prefill, a
/// mixed step, decode steps) plans no GEMM: everything it runs was warmed.
#[test]
#[ignore = "needs a CUDA device"]
fn cuda_engine_start_up_leaves_nothing_to_plan() {
    use encore_core::engine::{Engine, EngineConfig, KvSizing};
    use encore_core::model::open_model;
    use encore_core::DType;
    let _g = cuda_lock();
    let be = encore_core::backend::cuda::CudaBackend::new(0).unwrap();
    // KV sized from the memory left after a warm-up step of the largest shape.
    let kv = KvSizing::DeviceFraction {
        fraction: 0.05,
        at_least: 1 + 8 * 32,
    };
    let cfg = EngineConfig {
        graphs: Some(GraphConfig {
            decode: BucketPolicy::VllmLike { max: 8 },
            mixed: BucketPolicy::SglangLike { max: 512 },
            verify: 0,
        }),
        capture_all: true,
        ..EngineConfig::new(DType::BF16, 16, 512, 8, 512, kv)
    };
    let files = open_model("dummy:tiny").unwrap();
    let Engine { mut runner, report } =
        Engine::new(&be, files, &cfg, &encore_core::progress::NoProgress).unwrap();
    assert!(report.capture_secs > 0.0);
    assert!(report.kv_blocks > 1 + 8 * 32, "{report:?}");
    assert_eq!(runner.kv().num_blocks(), report.kv_blocks);
    let mut seqs = Seqs::for_runner(&runner).unwrap();
    let plans = be.gemm_plans();
    assert!(plans > 0);
    let prompts: Vec<Vec<u32>> = vec![vec![5; 300], vec![7; 3], vec![9; 12]];
    run_splits(
        &mut runner,
        &mut seqs,
        &prompts,
        &[&[(0, 200), (1, 3)], &[(0, 100), (2, 12)]],
    );
    let mut last = vec![1u32; 3];
    for _ in 0..5 {
        last = common::decode_step(&mut runner, &mut seqs, &last, SamplingParams::default());
    }
    assert_eq!(
        be.gemm_plans(),
        plans,
        "GEMMs planned during the first requests"
    );
    let s = runner.graph_stats().unwrap();
    assert_eq!(s.misses, 0, "{s:?}");
}
