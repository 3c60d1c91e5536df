//! Asynchronous scheduling: with the runner's overlap on, each step is planned and
//! launched before the one ahead of it is read, its decode rows' ids taken on the device
//! from that step's samples. The tokens, log-probabilities and finishes are those of the
//! synchronous loop in every case: chunked prompts mixed with decodes, requests joining
//! mid-flight, stop tokens (the extra step computed for a stopped sequence is dropped),
//! penalties (counted on the device), log-probabilities (read with the samples), a full
//! cache (which hands over to synchronous steps that preempt), requests that need the
//! synchronous path (prompt scoring) coming and going, aborts, prefix caching, and
//! captured graphs.

use std::collections::HashMap;

use encore_core::backend::cpu::CpuBackend;
use encore_core::request::{FinishReason, Request};
use encore_core::runner::{GraphConfig, Runner};
use encore_core::scheduler::{Scheduler, SchedulerConfig};

use super::{alone, common, drive, mix, request, run, Outputs};

/// Run `reqs` (each added at its step; `aborts`: (request, step)) to completion; every
/// output of each request, and the scheduler.
fn run_all(
    r: &mut Runner<'_>,
    cfg: SchedulerConfig,
    reqs: &[(Request, u64)],
    aborts: &[(u64, u64)],
) -> (Outputs, Scheduler) {
    let mut s = Scheduler::new(cfg, r).unwrap();
    let out = drive(r, &mut s, reqs, aborts);
    (out, s)
}

fn overlapped(be: &dyn encore_core::backend::Backend) -> Runner<'_> {
    let mut r = common::tiny_runner(be);
    assert!(r.set_overlap(true));
    r
}

/// Tokens and finishes only.
fn tokens(out: &Outputs) -> HashMap<u64, (Vec<u32>, FinishReason)> {
    out.iter()
        .map(|(&id, (o, f))| (id, (o.iter().map(|o| o.token).collect(), *f)))
        .collect()
}

#[test]
fn overlapped_steps_give_the_synchronous_tokens() {
    let cpu = CpuBackend::new();
    let reqs = mix();
    let reference = alone(&reqs);
    for (budget, seqs) in [(16, 3), (64, 8), (256, 16)] {
        let cfg = SchedulerConfig::new(budget, seqs);
        let mut sync = common::tiny_runner(&cpu);
        let (a, sa) = run(&mut sync, cfg, &reqs);
        let mut r = overlapped(&cpu);
        let (b, sb) = run_all(&mut r, cfg, &reqs, &[]);
        assert_eq!(tokens(&b), a, "budget {budget}, {seqs} sequences");
        for (q, _) in &reqs {
            assert_eq!(a[&q.id], reference[&q.id], "request {}", q.id);
        }
        // Lengths are known at launch: nothing is computed that the sync loop does not.
        assert_eq!(sb.stats().tokens_computed, sa.stats().tokens_computed);
        assert_eq!(sb.stats().finished, reqs.len() as u64);
        assert!(
            sb.stats().overlapped * 10 > sb.stats().steps * 8,
            "{:?}",
            sb.stats()
        );
    }
}

#[test]
fn a_stop_token_ends_a_request_and_drops_the_step_planned_after_it() {
    let cpu = CpuBackend::new();
    let cfg = SchedulerConfig::new(64, 4);
    let mut reqs = mix();
    // Stop tokens from each request's own greedy or seeded run, a few tokens in.
    let reference = alone(&reqs);
    for (q, _) in reqs.iter_mut() {
        let t = &reference[&q.id].0;
        q.params.stop_token_ids = vec![t[t.len().min(5) - 1]];
    }
    let mut sync = common::tiny_runner(&cpu);
    let (a, _) = run(&mut sync, cfg, &reqs);
    assert!(a.values().any(|(_, f)| *f == FinishReason::Eos));
    let mut r = overlapped(&cpu);
    let (b, _) = run_all(&mut r, cfg, &reqs, &[]);
    assert_eq!(tokens(&b), a);
}

#[test]
fn a_full_cache_hands_over_to_synchronous_steps_that_preempt() {
    let cpu = CpuBackend::new();
    let reqs = mix();
    let reference = alone(&reqs);
    let mut r = common::tiny_runner_with_blocks(&cpu, 42);
    assert!(r.set_overlap(true));
    let (out, s) = run_all(&mut r, SchedulerConfig::new(64, 8), &reqs, &[]);
    assert_eq!(tokens(&out), reference);
    assert!(s.stats().preemptions > 0, "{:?}", s.stats());
    assert!(s.stats().overlapped > 10, "{:?}", s.stats());
}

#[test]
fn requests_of_the_synchronous_path_come_and_go_between_overlapped_steps() {
    let cpu = CpuBackend::new();
    let mut reqs = mix();
    // Log-probabilities and penalties join mid-flight and end; the rest overlap.
    let mut lp = request(20, 9, 14, 0.8);
    lp.params.sampling.logprobs = Some(3);
    let mut pen = request(21, 17, 11, 0.0);
    pen.params.sampling.repetition_penalty = 1.3;
    pen.params.sampling.presence_penalty = 0.4;
    let mut scored = request(22, 6, 5, 0.0);
    scored.params.sampling.prompt_logprobs = Some(2);
    reqs.extend([(lp, 4), (pen, 9), (scored, 30)]);
    let cfg = SchedulerConfig::new(32, 6);
    let mut sync = common::tiny_runner(&cpu);
    let (a, _) = run_all(&mut sync, cfg, &reqs, &[]);
    let mut r = overlapped(&cpu);
    let (b, s) = run_all(&mut r, cfg, &reqs, &[]);
    // The same tokens; log-probabilities within f32 rounding (a row's logits sum in an
    // order that depends on the rows beside it, and the batches now differ by a step).
    assert_eq!(tokens(&b), tokens(&a));
    for (id, (outs, _)) in &a {
        for (x, y) in outs.iter().zip(&b[id].0) {
            let len = |o: &encore_core::request::Output| o.prompt_logprobs.as_ref().map(Vec::len);
            assert_eq!(len(x), len(y), "request {id}");
            close(x.logprobs.as_ref(), y.logprobs.as_ref(), *id);
            let (p, q) = (x.prompt_logprobs.iter(), y.prompt_logprobs.iter());
            for (p, q) in p.flatten().zip(q.flatten()) {
                close(Some(p), Some(q), *id);
            }
        }
    }
    assert!(s.stats().overlapped > 10, "{:?}", s.stats());
    assert!(b[&20].0.iter().all(|o| o.logprobs.is_some()));
}

/// Two log-probability entries alike: the same ids, values within 1e-4.
fn close(
    a: Option<&encore_core::request::TokenLogprobs>,
    b: Option<&encore_core::request::TokenLogprobs>,
    id: u64,
) {
    let (Some(a), Some(b)) = (a, b) else {
        assert_eq!(a.is_some(), b.is_some(), "request {id}");
        return;
    };
    assert!(
        (a.logprob - b.logprob).abs() < 1e-4,
        "request {id}: {a:?} {b:?}"
    );
    assert_eq!(a.top.len(), b.top.len(), "request {id}");
    for ((i, x), (j, y)) in a.top.iter().zip(&b.top) {
        assert!(i == j && (x - y).abs() < 1e-4, "request {id}: {a:?} {b:?}");
    }
}

#[test]
fn penalties_count_the_tokens_of_steps_planned_ahead() {
    let cpu = CpuBackend::new();
    // Every request with penalties, greedy and sampled, joining mid-flight: each step's
    // row counts its sample on the device, so the next (planned before it was read)
    // sees it counted.
    let reqs: Vec<(Request, u64)> = mix()
        .into_iter()
        .map(|(mut q, at)| {
            q.params.sampling.repetition_penalty = 1.4;
            q.params.sampling.frequency_penalty = 0.3;
            q.params.sampling.presence_penalty = 0.2;
            (q, at)
        })
        .collect();
    let cfg = SchedulerConfig::new(32, 5);
    let mut sync = common::tiny_runner(&cpu);
    let (a, _) = run(&mut sync, cfg, &reqs);
    assert_ne!(a, alone(&mix()), "the penalties change the tokens");
    let mut r = overlapped(&cpu);
    let (b, s) = run_all(&mut r, cfg, &reqs, &[]);
    assert_eq!(tokens(&b), a);
    assert!(
        s.stats().overlapped * 10 > s.stats().steps * 8,
        "{:?}",
        s.stats()
    );
    assert_eq!(s.free_penalty_slots(), 16, "every slot back");
}

#[test]
fn an_abort_in_flight_leaves_the_others_alone() {
    let cpu = CpuBackend::new();
    let reqs = mix();
    let reference = alone(&reqs);
    let cfg = SchedulerConfig::new(32, 8);
    let mut r = overlapped(&cpu);
    let (out, s) = run_all(&mut r, cfg, &reqs, &[(0, 3), (6, 11), (1, 12)]);
    for id in 2..6u64 {
        assert_eq!(tokens(&out)[&id], reference[&id], "request {id}");
    }
    assert_eq!(s.stats().aborted, 3);
}

#[test]
fn prefix_caching_works_under_overlap() {
    let cpu = CpuBackend::new();
    let shared: Vec<u32> = (0..24).map(|j| (j * 13 + 5) % 250).collect();
    // The second wave shares the first's prompts and their outputs' first blocks.
    let mut reqs: Vec<(Request, u64)> = Vec::new();
    for i in 0..4u64 {
        let mut q = request(i, 0, 10, 0.0);
        q.prompt = [&shared[..], &[i as u32 + 1][..]].concat();
        reqs.push((q, 0));
    }
    for i in 4..8u64 {
        let mut q = request(i, 0, 12, 0.6);
        q.prompt = [&shared[..], &[i as u32 - 3, 9, 8][..]].concat();
        reqs.push((q, 30));
    }
    let cfg = SchedulerConfig::new(64, 4);
    let cold = SchedulerConfig {
        prefix_cache: false,
        ..cfg
    };
    let mut sync = common::tiny_runner(&cpu);
    let (a, _) = run(&mut sync, cold, &reqs);
    let mut r = overlapped(&cpu);
    let (b, s) = run_all(&mut r, cfg, &reqs, &[]);
    assert_eq!(tokens(&b), a);
    let st = s.stats();
    assert!(st.prefix_hit_tokens >= 4 * 24, "{st:?}");
}

#[test]
fn captured_graphs_take_their_ids_from_the_step_before() {
    let cpu = CpuBackend::new();
    let reqs = mix();
    let cfg = SchedulerConfig::new(24, 4);
    let mut eager = common::tiny_runner(&cpu);
    let (a, _) = run(&mut eager, cfg, &reqs);
    let mut graph = overlapped(&cpu);
    graph.set_graphs(Some(GraphConfig {
        decode: common::buckets(),
        mixed: encore_core::graph::BucketPolicy::SglangLike { max: 256 },
        verify: 0,
    }));
    let (b, _) = run_all(&mut graph, cfg, &reqs, &[]);
    assert_eq!(tokens(&b), a);
    let g = graph.graph_stats().unwrap();
    assert!(g.hits > 10 && g.captures > 3, "{g:?}");
}

#[test]
fn a_launch_refuses_scores_and_a_runner_without_overlap_and_reads_log_probabilities() {
    let cpu = CpuBackend::new();
    let mut r = common::tiny_runner(&cpu);
    let mut seqs = encore_core::runner::Seqs::for_runner(&r).unwrap();
    let q = request(1, 5, 3, 0.0);
    let seq = encore_core::kv::SeqId(1);
    seqs.blocks.allocate(seq, 5).unwrap();
    let mut step = encore_core::runner::SeqStep {
        seq,
        tokens: &q.prompt,
        sampling: q.params.sampling,
        masked: false,
        logit_bias: &[],
        score: None,
        verify: false,
    };
    let e = r.launch(&mut seqs, &[step], &[]).unwrap_err().to_string();
    assert!(e.contains("set_overlap"), "{e}");
    assert!(r.set_overlap(true));
    step.score = Some(encore_core::runner::Score { num: 2, next: None });
    let e = r.launch(&mut seqs, &[step], &[]).unwrap_err().to_string();
    assert!(e.contains("scores"), "{e}");
    step.score = None;
    step.sampling.logprobs = Some(3);
    let l = r.launch(&mut seqs, &[step], &[]).unwrap();
    assert_eq!(l.len(), 1);
    let t = r.collect(l).unwrap();
    // The same step synchronously samples the same token (same seed, same index), with
    // the same log-probabilities.
    let mut s2 = encore_core::runner::Seqs::for_runner(&r).unwrap();
    s2.blocks.allocate(seq, 5).unwrap();
    let mut sync = common::tiny_runner(&cpu);
    let want = sync.step_sampled(&mut s2, &[step]).unwrap();
    assert_eq!(t, want);
    assert_eq!(t[0].logprobs.as_ref().unwrap().top.len(), 3);
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_overlapped_graph_steps_give_the_synchronous_tokens() {
    let _serial = super::cuda_serial();
    let be = encore_core::backend::cuda::CudaBackend::new(0).unwrap();
    let engine = |async_scheduling| super::cuda_runner(&be, async_scheduling);
    // 64 prompts of 1..600 tokens at once, greedy and sampled: the two loops run the
    // same batches (lengths end sequences at launch), so the same graphs and the same
    // tokens.
    let reqs: Vec<(Request, u64)> = (0..64u64)
        .map(|i| {
            let mut r = request(
                i,
                1 + (i as usize * 97) % 600,
                1 + (i as usize * 31) % 90,
                0.0,
            );
            r.params.sampling.temperature = if i % 3 == 0 { 0.0 } else { 0.8 };
            (r, 0)
        })
        .collect();
    let cfg = SchedulerConfig::new(512, 64);
    let mut sync = engine(false);
    assert!(!sync.overlap());
    let (a, _) = run_all(&mut sync, cfg, &reqs, &[]);
    drop(sync);
    let mut r = engine(true);
    assert!(r.overlap());
    let (b, s) = run_all(&mut r, cfg, &reqs, &[]);
    assert_eq!(tokens(&b), tokens(&a));
    assert!(
        s.stats().overlapped * 10 > s.stats().steps * 8,
        "{:?}",
        s.stats()
    );
    // Waves joining as others end, stop tokens and aborts (batches now differ from the
    // synchronous loop's by a step): each request ends where its own tokens say.
    let reqs: Vec<(Request, u64)> = (0..96u64)
        .map(|i| {
            let mut r = request(
                i,
                1 + (i as usize * 89) % 500,
                1 + (i as usize * 37) % 80,
                0.8,
            );
            if i % 5 == 0 {
                r.params.stop_token_ids = vec![(i as u32 * 13) % 300];
            }
            if i % 6 == 1 {
                r.params.sampling.logprobs = Some(2);
            }
            (r, i / 8)
        })
        .collect();
    let (out, s) = run_all(&mut r, cfg, &reqs, &[(5, 20), (40, 30)]);
    for (q, _) in &reqs {
        if q.id == 5 || q.id == 40 {
            continue;
        }
        let (o, finish) = &out[&q.id];
        let t: Vec<u32> = o.iter().map(|o| o.token).collect();
        // Log-probabilities come with the samples of steps launched ahead: the sampled
        // token's, at most its top entry's, and two top entries.
        for o in o {
            match (&o.logprobs, q.params.sampling.logprobs) {
                (Some(lp), Some(n)) => assert!(
                    lp.top.len() == n && lp.logprob <= lp.top[0].1 + 1e-3 && lp.top[0].1 <= 0.0,
                    "request {}: {lp:?}",
                    q.id
                ),
                (None, None) => {}
                (lp, _) => panic!("request {}: {lp:?}", q.id),
            }
        }
        let stop = t.iter().position(|x| q.params.stop_token_ids.contains(x));
        match stop {
            Some(k) => assert_eq!(
                (k + 1, *finish),
                (t.len(), FinishReason::Eos),
                "request {}",
                q.id
            ),
            None => assert_eq!(
                (t.len(), *finish),
                (q.params.max_tokens, FinishReason::Length),
                "request {}",
                q.id
            ),
        }
    }
    assert!(
        s.stats().overlapped * 10 > s.stats().steps * 7,
        "{:?}",
        s.stats()
    );
    let g = r.graph_stats().unwrap();
    assert!(g.hits > 50, "{g:?}");
}
