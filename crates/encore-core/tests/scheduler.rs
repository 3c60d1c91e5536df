//! Continuous batching through the scheduler, on the CPU backend: requests that share
//! steps (chunked prefill mixed with decodes, queueing, joining mid-flight, preemption
//! when the KV cache runs out) produce exactly the tokens each produces alone; sampling
//! depends only on a request's seed and token index; aborts free their blocks; requests
//! that can never run are refused with the reason. With prefix caching, a request
//! sharing cached blocks computes only the rest and still produces its cold tokens.

use std::collections::HashMap;

use encore_core::backend::cpu::CpuBackend;
use encore_core::request::SamplingParams;
use encore_core::request::{FinishReason, Request};
use encore_core::runner::{Runner, Seqs};
use encore_core::scheduler::{Scheduler, SchedulerConfig};

mod common;

/// The CUDA tests of this file, one at a time: a kernel loaded lazily by one test's thread
/// while another captures a graph invalidates that capture.
fn cuda_serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn request(id: u64, prompt_len: usize, max_tokens: usize, temperature: f32) -> Request {
    let prompt = (0..prompt_len)
        .map(|j| ((id as usize * 37 + j * 11) % 250) as u32)
        .collect();
    let sampling = SamplingParams {
        temperature,
        top_k: 40,
        top_p: 0.9,
        seed: 1000 + id,
        ..Default::default()
    };
    common::request(id, prompt, sampling, max_tokens)
}

/// Run `reqs` (the second of each pair: the step at which it is added) to completion;
/// each request's tokens and finish reason.
fn run(
    r: &mut Runner<'_>,
    cfg: SchedulerConfig,
    reqs: &[(Request, u64)],
) -> (HashMap<u64, (Vec<u32>, FinishReason)>, Scheduler) {
    let seqs = Seqs::for_runner(r).unwrap();
    run_with(r, seqs, cfg, reqs)
}

/// Run `reqs` (each added at its step) to completion through [`Scheduler::step_with`] with
/// `drafter`; each request's tokens, and the scheduler.
fn run_drafted(
    r: &mut Runner<'_>,
    cfg: SchedulerConfig,
    mut drafter: Option<&mut encore_core::spec::draft::Drafter<'_>>,
    reqs: &[(Request, u64)],
) -> (HashMap<u64, Vec<u32>>, Scheduler) {
    let mut s = Scheduler::new(cfg, r).unwrap();
    let mut out: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut step = 0u64;
    while s.has_work() || reqs.iter().any(|(_, at)| *at > step) {
        for (req, at) in reqs {
            if *at == step {
                s.add(req.clone(), r).unwrap();
            }
        }
        for o in s.step_with(r, drafter.as_deref_mut()).unwrap() {
            out.entry(o.id).or_default().push(o.token);
        }
        step += 1;
        assert!(step < 10_000, "no progress");
    }
    (out, s)
}

/// [`run`] over the blocks (and cached prefixes) of an earlier scheduler.
fn run_with(
    r: &mut Runner<'_>,
    seqs: Seqs,
    cfg: SchedulerConfig,
    reqs: &[(Request, u64)],
) -> (HashMap<u64, (Vec<u32>, FinishReason)>, Scheduler) {
    let mut s = Scheduler::with_seqs(cfg, r, seqs).unwrap();
    let mut out: HashMap<u64, (Vec<u32>, FinishReason)> = HashMap::new();
    let mut step = 0u64;
    loop {
        for (req, at) in reqs {
            if *at == step {
                s.add(req.clone(), r).unwrap();
            }
        }
        let pending = reqs.iter().any(|(_, at)| *at > step);
        if !s.has_work() && !pending {
            break;
        }
        for o in s.step(r).unwrap() {
            let e = out
                .entry(o.id)
                .or_insert((Vec::new(), FinishReason::Stopped));
            e.0.push(o.token);
            if let Some(f) = o.finish {
                e.1 = f;
            }
        }
        step += 1;
        assert!(step < 10_000, "no progress");
    }
    assert_eq!(
        s.blocks().num_used_blocks(),
        0,
        "finished requests free their blocks"
    );
    (out, s)
}

/// Each request run alone (cold: prefix caching off), with budgets that fit it whole.
fn alone(reqs: &[(Request, u64)]) -> HashMap<u64, (Vec<u32>, FinishReason)> {
    let cpu = CpuBackend::new();
    let mut out = HashMap::new();
    for (req, _) in reqs {
        let mut r = common::tiny_runner(&cpu);
        let big = SchedulerConfig {
            prefix_cache: false,
            ..SchedulerConfig::new(256, 16)
        };
        out.extend(run(&mut r, big, &[(req.clone(), 0)]).0);
    }
    out
}

fn mix() -> Vec<(Request, u64)> {
    vec![
        (request(0, 70, 12, 0.0), 0),
        (request(1, 5, 30, 0.8), 0),
        (request(2, 33, 20, 0.0), 0),
        (request(3, 1, 25, 1.0), 2),
        (request(4, 90, 8, 0.7), 3),
        (request(5, 12, 40, 0.0), 7),
        (request(6, 50, 16, 0.9), 7),
    ]
}

#[test]
fn shared_steps_give_each_request_its_alone_tokens() {
    let cpu = CpuBackend::new();
    let reqs = mix();
    let reference = alone(&reqs);
    let mut r = common::tiny_runner(&cpu);
    // 16 tokens a step and 3 sequences: prompts are chunked, mixed with decodes, and
    // requests wait for a slot.
    let cfg = SchedulerConfig::new(16, 3);
    let (out, s) = run(&mut r, cfg, &reqs);
    for (req, _) in &reqs {
        assert_eq!(out[&req.id], reference[&req.id], "request {}", req.id);
        assert_eq!(out[&req.id].0.len(), req.params.max_tokens);
        assert_eq!(out[&req.id].1, FinishReason::Length);
    }
    let st = s.stats();
    assert_eq!(st.finished, reqs.len() as u64);
    assert_eq!(st.preemptions, 0);
    let prompt: u64 = reqs.iter().map(|(q, _)| q.prompt.len() as u64).sum();
    let decode: u64 = reqs
        .iter()
        .map(|(q, _)| q.params.max_tokens as u64 - 1)
        .sum();
    assert_eq!(st.tokens_computed, prompt + decode, "nothing recomputed");
}

#[test]
fn graphs_and_piecewise_steps_serve_the_scheduler_alike() {
    let cpu = CpuBackend::new();
    let reqs = mix();
    let cfg = SchedulerConfig::new(24, 4);
    let mut eager = common::tiny_runner(&cpu);
    let (a, _) = run(&mut eager, cfg, &reqs);
    let mut graph = common::tiny_runner(&cpu);
    graph.set_graphs(Some(encore_core::runner::GraphConfig {
        decode: common::buckets(),
        mixed: encore_core::graph::BucketPolicy::SglangLike { max: 256 },
        verify: 0,
    }));
    let (b, _) = run(&mut graph, cfg, &reqs);
    assert_eq!(a, b);
    let g = graph.graph_stats().unwrap();
    assert!(g.hits > 10 && g.captures > 3, "{g:?}");
}

#[test]
fn an_exhausted_cache_preempts_and_recomputes_without_losing_tokens() {
    let cpu = CpuBackend::new();
    let reqs = mix();
    let reference = alone(&reqs);
    // 41 usable blocks of 4 tokens: the longest request (90 + 8) needs 25; together they
    // need far more.
    let mut r = common::tiny_runner_with_blocks(&cpu, 42);
    let cfg = SchedulerConfig::new(64, 8);
    let (out, s) = run(&mut r, cfg, &reqs);
    for (req, _) in &reqs {
        assert_eq!(out[&req.id], reference[&req.id], "request {}", req.id);
    }
    let st = s.stats();
    assert!(st.preemptions > 0, "{st:?}");
    let prompt: u64 = reqs.iter().map(|(q, _)| q.prompt.len() as u64).sum();
    assert!(
        st.tokens_computed > prompt,
        "preempted requests were recomputed: {st:?}"
    );
}

#[test]
fn eos_and_context_end_requests() {
    let cpu = CpuBackend::new();
    let mut r = common::tiny_runner(&cpu);
    let cfg = SchedulerConfig::new(64, 4);
    let greedy = request(9, 20, 50, 0.0);
    let tokens = run(&mut r, cfg, &[(greedy.clone(), 0)]).0[&9].0.clone();
    // Stop at the 5th token's id: the request ends there with Eos (the id first occurs
    // at or before index 4).
    let mut eos = greedy.clone();
    eos.params.stop_token_ids = vec![tokens[4]];
    let (out, _) = run(&mut r, cfg, &[(eos.clone(), 0)]);
    let first = tokens.iter().position(|&t| t == tokens[4]).unwrap();
    assert_eq!(out[&9].0, tokens[..=first].to_vec());
    assert_eq!(out[&9].1, FinishReason::Eos);
    // ignore_eos runs on to max_tokens.
    eos.params.ignore_eos = true;
    assert_eq!(run(&mut r, cfg, &[(eos, 0)]).0[&9].0, tokens);
    // A prompt of 120 in a context of 128: 8 tokens, then Context.
    let long = request(10, 120, 50, 0.0);
    let (out, _) = run(&mut r, cfg, &[(long, 0)]);
    assert_eq!(out[&10].0.len(), 8);
    assert_eq!(out[&10].1, FinishReason::Context);
}

#[test]
fn abort_frees_blocks_and_leaves_the_others_alone() {
    let cpu = CpuBackend::new();
    let reqs = mix();
    let reference = alone(&reqs);
    let mut r = common::tiny_runner(&cpu);
    let cfg = SchedulerConfig::new(32, 8);
    let mut s = Scheduler::new(cfg, &r).unwrap();
    for (q, _) in &reqs {
        s.add(q.clone(), &r).unwrap();
    }
    let mut out: HashMap<u64, Vec<u32>> = HashMap::new();
    for _ in 0..6 {
        for o in s.step(&mut r).unwrap() {
            out.entry(o.id).or_default().push(o.token);
        }
    }
    let used = s.blocks().num_used_blocks();
    assert!(used > 0);
    assert!(s.abort(0).unwrap());
    assert!(s.blocks().num_used_blocks() < used);
    assert!(!s.abort(0).unwrap(), "already gone");
    assert!(s.abort(6).unwrap());
    while s.has_work() {
        for o in s.step(&mut r).unwrap() {
            out.entry(o.id).or_default().push(o.token);
        }
    }
    assert_eq!(s.blocks().num_used_blocks(), 0);
    for id in 1..6u64 {
        assert_eq!(out[&id], reference[&id].0, "request {id}");
    }
    assert_eq!(s.stats().aborted, 2);
}

#[test]
fn requests_that_can_never_run_are_refused() {
    let cpu = CpuBackend::new();
    let r = common::tiny_runner_with_blocks(&cpu, 10);
    let cfg = SchedulerConfig::new(64, 4);
    let mut s = Scheduler::new(cfg, &r).unwrap();
    let refuse = |s: &mut Scheduler, q: Request, what: &str| {
        let e = s.add(q, &r).unwrap_err().to_string();
        assert!(e.contains(what), "{e}");
    };
    refuse(&mut s, request(1, 0, 5, 0.0), "empty");
    refuse(&mut s, request(1, 5, 0, 0.0), "max_tokens");
    refuse(&mut s, request(1, 128, 5, 0.0), "context");
    refuse(&mut s, request(1, 30, 20, 0.0), "KV blocks");
    let mut bad = request(1, 5, 5, 0.0);
    bad.prompt[2] = 1 << 20;
    refuse(&mut s, bad, "vocabulary");
    s.add(request(1, 5, 5, 0.0), &r).unwrap();
    refuse(&mut s, request(1, 5, 5, 0.0), "already live");
    let too_big = SchedulerConfig::new(1 << 20, 4);
    assert!(Scheduler::new(too_big, &r).is_err());
}

/// The prefix-cache scenario on `r` (one runner, so the cache carries over): A runs, then
/// B sharing A's first 3 blocks, C with A's whole prompt (seeded sampling), D continuing
/// A's prompt and output (blocks filled by decode). Per request: its tokens and the
/// tokens computed for it, with its prefix statistics (queried, hit).
fn prefix_scenario(r: &mut Runner<'_>, prefix_cache: bool) -> Vec<(Vec<u32>, u64, (u64, u64))> {
    let cfg = SchedulerConfig {
        prefix_cache,
        ..SchedulerConfig::new(64, 4)
    };
    let shared: Vec<u32> = (0..12).map(|j| (j * 13 + 5) % 250).collect();
    let with = |id: u64, tail: &[u32], max_tokens: usize, temperature: f32| {
        let mut q = request(id, 0, max_tokens, temperature);
        q.prompt = [&shared[..], tail].concat();
        q
    };
    let a = with(0, &[7, 8, 9, 10, 11], 6, 0.0);
    let b = with(1, &[100, 101, 102, 103, 104, 105, 106], 8, 0.0);
    let mut c = with(2, &a.prompt[12..], 9, 0.8);
    c.params.sampling.seed = 77;
    let mut res = Vec::new();
    let mut a_out = Vec::new();
    // One scheduler per request, each taking over the blocks (and cached prefixes) of the
    // one before.
    let mut seqs = Seqs::for_runner(r).unwrap();
    for q in [a, b, c] {
        let (out, s) = run_with(r, seqs, cfg, &[(q.clone(), 0)]);
        let st = s.stats();
        seqs = s.into_seqs().unwrap();
        if q.id == 0 {
            a_out = out[&0].0.clone();
        }
        res.push((
            out[&q.id].0.clone(),
            st.tokens_computed,
            (st.prefix_queried_tokens, st.prefix_hit_tokens),
        ));
    }
    // D: A's prompt, A's output, then 3 more tokens.
    let mut d = request(3, 0, 5, 0.0);
    d.prompt = [&shared[..], &[7, 8, 9, 10, 11], &a_out[..], &[1, 2, 3]].concat();
    let (out, s) = run_with(r, seqs, cfg, &[(d, 0)]);
    let st = s.stats();
    res.push((
        out[&3].0.clone(),
        st.tokens_computed,
        (st.prefix_queried_tokens, st.prefix_hit_tokens),
    ));
    res
}

/// What [`prefix_scenario`] computes with the cache on (block size 4): B hits A's 3
/// shared blocks (12 tokens); C's 17-token prompt hits 4 blocks (16: the last token is
/// always computed); D's 26 tokens hit the 5 blocks A filled (20: 17 prompt + 5 computed
/// output tokens, the last sampled one never computed).
fn check_prefix_scenario(
    hot: &[(Vec<u32>, u64, (u64, u64))],
    cold: &[(Vec<u32>, u64, (u64, u64))],
) {
    let lens = [(17u64, 6u64), (19, 8), (17, 9), (26, 5)];
    let hits = [0u64, 12, 16, 20];
    for (i, ((h, c), (&(prompt, max), &hit))) in
        hot.iter().zip(cold).zip(lens.iter().zip(&hits)).enumerate()
    {
        assert_eq!(
            h.0, c.0,
            "request {i}: tokens with the cache equal the cold run's"
        );
        assert_eq!(h.0.len() as u64, max);
        assert_eq!(
            c.1,
            prompt + max - 1,
            "request {i}: cold computes everything"
        );
        assert_eq!(c.2, (0, 0), "request {i}: no lookups with the cache off");
        assert_eq!(
            h.1,
            prompt - hit + max - 1,
            "request {i}: only the rest is computed"
        );
        assert_eq!(h.2, (prompt, hit), "request {i}: prefix statistics");
    }
}

#[test]
fn a_shared_prefix_is_computed_once_and_gives_the_cold_tokens() {
    let cpu = CpuBackend::new();
    let hot = prefix_scenario(&mut common::tiny_runner(&cpu), true);
    let cold = prefix_scenario(&mut common::tiny_runner(&cpu), false);
    check_prefix_scenario(&hot, &cold);
}

#[test]
fn prefix_hits_through_decode_graphs_and_piecewise_steps_give_the_cold_tokens() {
    let cpu = CpuBackend::new();
    let graphs = || {
        let mut r = common::tiny_runner(&cpu);
        r.set_graphs(Some(encore_core::runner::GraphConfig {
            decode: common::buckets(),
            mixed: encore_core::graph::BucketPolicy::SglangLike { max: 256 },
            verify: 0,
        }));
        r
    };
    let mut r = graphs();
    let hot = prefix_scenario(&mut r, true);
    let g = r.graph_stats().unwrap();
    assert!(g.hits > 10, "{g:?}");
    let cold = prefix_scenario(&mut common::tiny_runner(&cpu), false);
    check_prefix_scenario(&hot, &cold);
}

#[test]
fn prefix_hits_over_two_tensor_parallel_ranks_give_one_ranks_cold_tokens() {
    // The leader's scheduler finds the cached blocks; every rank holds the same blocks of
    // its KV heads, so the followers skip the same tokens.
    use encore_core::engine::{Engine, EngineConfig, KvSizing};
    use encore_core::model::open_model;
    use encore_core::progress::NoProgress;
    use encore_core::DType;
    let engine = |size: usize, graphs: bool, f: &mut dyn FnMut(&mut Runner<'_>)| {
        let (leader, tp) = common::cpu_group(size);
        let cfg = EngineConfig {
            tp,
            graphs: graphs.then(|| encore_core::runner::GraphConfig {
                decode: common::buckets(),
                mixed: encore_core::graph::BucketPolicy::SglangLike { max: 256 },
                verify: 0,
            }),
            ..EngineConfig::new(DType::F32, 4, 256, 16, 128, KvSizing::Blocks(1 + 16 * 32))
        };
        let files = open_model("dummy:tiny-qwen2").unwrap();
        let Engine { mut runner, .. } =
            Engine::new(leader.as_ref(), files, &cfg, &NoProgress).unwrap();
        assert_eq!(runner.tp_size(), size);
        f(&mut runner);
    };
    let mut cold = Vec::new();
    engine(1, false, &mut |r| cold = prefix_scenario(r, false));
    for graphs in [false, true] {
        let mut hot = Vec::new();
        engine(2, graphs, &mut |r| hot = prefix_scenario(r, true));
        check_prefix_scenario(&hot, &cold);
    }
}

/// `mix()` with a 3-block prefix shared by every prompt, and two requests repeating
/// others' prompts (with other seeds or lengths).
fn shared_mix() -> Vec<(Request, u64)> {
    let shared: Vec<u32> = (0..12).map(|j| (j * 29 + 3) % 250).collect();
    let mut reqs = mix();
    for (q, _) in &mut reqs {
        q.prompt = [&shared[..], &q.prompt].concat();
    }
    let mut again = reqs[2].0.clone();
    again.id = 7;
    again.params.max_tokens = 11;
    let mut sampled = reqs[4].0.clone();
    sampled.id = 8;
    sampled.params.sampling.seed = 4242;
    reqs.push((again, 9));
    reqs.push((sampled, 12));
    reqs
}

#[test]
fn prefix_caching_off_computes_every_token_and_on_only_the_uncached() {
    let cpu = CpuBackend::new();
    let reqs = shared_mix();
    let reference = alone(&reqs);
    let prompt: u64 = reqs.iter().map(|(q, _)| q.prompt.len() as u64).sum();
    let decode: u64 = reqs
        .iter()
        .map(|(q, _)| q.params.max_tokens as u64 - 1)
        .sum();
    let off = SchedulerConfig {
        prefix_cache: false,
        ..SchedulerConfig::new(16, 3)
    };
    let (out, s) = run(&mut common::tiny_runner(&cpu), off, &reqs);
    let st = s.stats();
    assert_eq!(
        st.tokens_computed,
        prompt + decode,
        "the old counts: {st:?}"
    );
    assert_eq!((st.prefix_queried_tokens, st.prefix_hit_tokens), (0, 0));
    assert_eq!(st.preemptions, 0);
    for (q, _) in &reqs {
        assert_eq!(out[&q.id], reference[&q.id], "request {}", q.id);
    }
    let on = SchedulerConfig::new(16, 3);
    let mut r = common::tiny_runner(&cpu);
    let (out, s) = run(&mut r, on, &reqs);
    let st = s.stats();
    for (q, _) in &reqs {
        assert_eq!(out[&q.id], reference[&q.id], "request {}", q.id);
    }
    assert_eq!(st.preemptions, 0);
    assert_eq!(st.prefix_queried_tokens, prompt);
    assert!(st.prefix_hit_tokens >= 12 * 3, "{st:?}");
    assert_eq!(
        st.tokens_computed,
        prompt - st.prefix_hit_tokens + decode,
        "exactly the hit tokens are saved: {st:?}"
    );
    assert!(s.blocks().num_cached_blocks() > 0);
    assert_eq!(s.blocks().num_used_blocks(), 0);
}

#[test]
fn a_cache_too_small_evicts_cached_blocks_and_preempts_and_every_request_gets_its_cold_tokens() {
    let cpu = CpuBackend::new();
    let reqs = shared_mix();
    let reference = alone(&reqs);
    // 41 usable blocks of 4 tokens, as in the preemption test, with 12 more prompt
    // tokens per request.
    let mut r = common::tiny_runner_with_blocks(&cpu, 42);
    let (out, s) = run(&mut r, SchedulerConfig::new(64, 8), &reqs);
    for (q, _) in &reqs {
        assert_eq!(out[&q.id], reference[&q.id], "request {}", q.id);
    }
    let st = s.stats();
    assert!(st.preemptions > 0, "{st:?}");
    assert!(st.prefix_hit_tokens > 0, "{st:?}");
    assert!(s.blocks().num_evictions() > 0, "cached blocks were evicted");
    s.blocks().check_consistency().unwrap();
}

/// `n` samples of one prompt (`share_prompt`): the prompt's full blocks are computed once
/// (the others wait for them, then find them cached), with a small chunk budget (the
/// prompt takes several steps) and with a cache small enough to preempt; every sample gets
/// its cold tokens.
#[test]
fn samples_sharing_a_prompt_compute_it_once_and_get_their_cold_tokens() {
    let cpu = CpuBackend::new();
    let group = |n: u64, at: u64| -> Vec<(Request, u64)> {
        let base = request(40, 61, 14, 0.9);
        (0..n)
            .map(|i| {
                let mut q = base.clone();
                q.id = 40 + i;
                q.params.sampling.seed += i;
                q.params.share_prompt = Some(40);
                (q, at)
            })
            .collect()
    };
    let reqs = group(4, 0);
    let reference = alone(&reqs);
    for (blocks, preempts) in [(1 + 16 * 32, false), (24, true)] {
        let mut r = common::tiny_runner_with_blocks(&cpu, blocks);
        let (out, s) = run(&mut r, SchedulerConfig::new(16, 8), &reqs);
        for (q, _) in &reqs {
            assert_eq!(
                out[&q.id], reference[&q.id],
                "request {} ({blocks} blocks)",
                q.id
            );
        }
        let st = s.stats();
        assert_eq!(st.preemptions > 0, preempts, "{st:?}");
        if !preempts {
            // 61 prompt tokens: 15 full blocks of 4, found cached by the 3 others.
            assert_eq!(st.prefix_hit_tokens, 3 * 60, "{st:?}");
        }
    }
}

/// On CUDA, at a real model's shape in bf16 (tensor-core prefill, split-K decode, mixed
/// steps attended in two launches, every bucket captured): 96 requests of random lengths
/// under tight budgets all complete with their token counts, with no step failing.
#[test]
#[ignore = "needs a CUDA device"]
fn cuda_mixed_steps_at_a_real_shape_complete() {
    let _serial = cuda_serial();
    use encore_core::engine::{Engine, EngineConfig, KvSizing};
    use encore_core::graph::BucketPolicy;
    use encore_core::runner::GraphConfig;
    let be = encore_core::backend::cuda::CudaBackend::new(0).unwrap();
    let cfg = EngineConfig {
        graphs: Some(GraphConfig {
            decode: BucketPolicy::VllmLike { max: 64 },
            mixed: BucketPolicy::SglangLike { max: 1024 },
            verify: 0,
        }),
        capture_all: true,
        ..EngineConfig::new(
            encore_core::DType::BF16,
            16,
            1024,
            64,
            1024,
            KvSizing::Blocks(1 + 64 * 40),
        )
    };
    let files = encore_core::model::open_model("dummy:qwen2.5-0.5b").unwrap();
    let Engine { mut runner, .. } =
        Engine::new(&be, files, &cfg, &encore_core::progress::NoProgress).unwrap();
    let reqs: Vec<(Request, u64)> = (0..96u64)
        .map(|i| {
            let mut r = request(
                i,
                1 + (i as usize * 97) % 600,
                1 + (i as usize * 31) % 100,
                0.0,
            );
            r.params.sampling.temperature = 0.7;
            (r, i / 8)
        })
        .collect();
    let sched = SchedulerConfig::new(512, 64);
    let (out, s) = run(&mut runner, sched, &reqs);
    for (q, _) in &reqs {
        assert_eq!(out[&q.id].0.len(), q.params.max_tokens, "request {}", q.id);
    }
    assert_eq!(s.stats().finished, 96);
    let g = runner.graph_stats().unwrap();
    assert!(g.hits > 50, "{g:?}");
}

/// Speculative decoding by n-gram lookup gives each request the tokens it gets decoding
/// one at a time, greedy and sampled (each position's sample uses that token's seed):
/// beside plain sequences (a penalty keeps one out of it), with chunked prompts, an EOS
/// or max_tokens inside a run of kept drafts, and preemption; drafts are verified and
/// some kept (random weights fall into loops, which n-grams predict).
#[test]
fn speculative_decoding_gives_the_tokens_of_decoding_one_at_a_time() {
    use encore_core::spec::ngram::NgramConfig;
    use encore_core::spec::Proposer;
    let cpu = CpuBackend::new();
    let mut reqs = mix();
    // Prompts that repeat themselves, greedy and sampled, and one with a penalty.
    let pattern = |id: u64, temperature: f32, max_tokens: usize| {
        let mut r = request(id, 0, max_tokens, temperature);
        r.prompt = [7u32, 9, 11, 13, 15].repeat(8);
        r
    };
    reqs.push((pattern(20, 0.0, 40), 1));
    reqs.push((pattern(21, 0.9, 40), 1));
    let mut penalized = pattern(22, 0.0, 30);
    penalized.params.sampling.presence_penalty = 0.5;
    reqs.push((penalized, 2));
    let reference = alone(&reqs);
    let spec = Some(Proposer::Ngram(NgramConfig::new(1, 4, 4).unwrap()));
    for (name, blocks, cfg) in [
        ("chunked", None, SchedulerConfig::new(16, 3)),
        ("roomy", None, SchedulerConfig::new(64, 16)),
        ("preempting", Some(42), SchedulerConfig::new(64, 8)),
    ] {
        let mut r = match blocks {
            Some(n) => common::tiny_runner_with_blocks(&cpu, n),
            None => common::tiny_runner(&cpu),
        };
        let cfg = SchedulerConfig {
            speculative: spec,
            ..cfg
        };
        let (out, s) = run(&mut r, cfg, &reqs);
        for (req, _) in &reqs {
            assert_eq!(
                out[&req.id], reference[&req.id],
                "{name}: request {}",
                req.id
            );
        }
        let st = s.stats();
        assert!(
            st.drafts_accepted > 10 && st.drafts_proposed > st.drafts_accepted,
            "{name}: {st:?}"
        );
        if blocks.is_some() {
            assert!(st.preemptions > 0, "{name}: {st:?}");
        }
    }
    // An EOS inside a run of kept drafts ends the request there.
    let greedy = pattern(23, 0.0, 40);
    let mut r = common::tiny_runner(&cpu);
    let plain = run(&mut r, SchedulerConfig::new(64, 4), &[(greedy.clone(), 0)]).0[&23]
        .0
        .clone();
    let mut eos = greedy;
    eos.params.stop_token_ids = vec![plain[9]];
    let first = plain.iter().position(|&t| t == plain[9]).unwrap();
    let cfg = SchedulerConfig {
        speculative: spec,
        ..SchedulerConfig::new(64, 4)
    };
    let (out, _) = run(&mut r, cfg, &[(eos, 0)]);
    assert_eq!(out[&23].0, plain[..=first].to_vec());
    assert_eq!(out[&23].1, FinishReason::Eos);
}

/// Log-probabilities under speculation: each emitted token's, from the verify row that
/// sampled it, equal those of decoding one token at a time (bit for bit on the CPU).
#[test]
fn speculative_decoding_reports_each_tokens_logprobs() {
    use encore_core::spec::ngram::NgramConfig;
    use encore_core::spec::Proposer;
    let cpu = CpuBackend::new();
    let mut reqs = Vec::new();
    for (id, temperature) in [(30u64, 0.0f32), (31, 0.8)] {
        let mut r = request(id, 0, 30, temperature);
        r.prompt = [3u32, 5, 8, 13].repeat(10);
        r.params.sampling.logprobs = Some(3);
        reqs.push(r);
    }
    let collect = |speculative: Option<Proposer>| {
        let mut r = common::tiny_runner(&cpu);
        let cfg = SchedulerConfig {
            speculative,
            ..SchedulerConfig::new(64, 4)
        };
        let mut s = Scheduler::new(cfg, &r).unwrap();
        for q in &reqs {
            s.add(q.clone(), &r).unwrap();
        }
        let mut out: HashMap<u64, Vec<(u32, Option<encore_core::request::TokenLogprobs>)>> =
            HashMap::new();
        while s.has_work() {
            for o in s.step(&mut r).unwrap() {
                out.entry(o.id).or_default().push((o.token, o.logprobs));
            }
        }
        (out, s.stats())
    };
    let (plain, _) = collect(None);
    let (spec, st) = collect(Some(Proposer::Ngram(NgramConfig::new(1, 4, 4).unwrap())));
    assert!(st.drafts_accepted > 0, "{st:?}");
    for q in &reqs {
        let (a, b) = (&plain[&q.id], &spec[&q.id]);
        assert_eq!(a.len(), 30);
        assert!(b
            .iter()
            .all(|(_, lp)| lp.as_ref().is_some_and(|l| l.top.len() == 3)));
        assert_eq!(a, b, "request {}", q.id);
    }
}

/// Verify steps replayed from verify graphs (one per decode bucket, padded sequences and
/// rows, speculating and plain sequences in one graph) give the tokens of decoding one at
/// a time, greedy and sampled, with log-probabilities; a step with a prompt chunk runs
/// eagerly. Every bucket whose rows fit is captured, and replays count.
#[test]
fn verify_graphs_give_the_tokens_of_decoding_one_at_a_time() {
    use encore_core::graph::{BucketPolicy, Phase};
    use encore_core::runner::{GraphConfig, RunnerConfig};
    use encore_core::spec::ngram::NgramConfig;
    use encore_core::spec::Proposer;
    let cpu = CpuBackend::new();
    let mut reqs = mix();
    for (id, temperature) in [(40u64, 0.0f32), (41, 0.9), (42, 0.0)] {
        let mut r = request(id, 0, 36, temperature);
        r.prompt = [4u32, 6, 8, 10, 12, 14].repeat(6);
        r.params.sampling.logprobs = (id == 42).then_some(2);
        reqs.push((r, id - 39));
    }
    let mut penalized = request(43, 0, 20, 0.0);
    penalized.prompt = [5u32, 7, 9].repeat(8);
    penalized.params.sampling.repetition_penalty = 1.3;
    reqs.push((penalized, 2));
    let reference = alone(&reqs);
    let k = 4;
    // Room for 8 sequences' drafts: verify graphs for buckets 1, 2, 4 and 8.
    let cfg = RunnerConfig {
        max_seqs: 40,
        ..common::tiny_config(1 + 16 * (128 / common::BLOCK))
    };
    let mut r = Runner::new(&cpu, common::tiny_model(&cpu), cfg).unwrap();
    r.set_graphs(Some(GraphConfig {
        decode: common::buckets(),
        mixed: BucketPolicy::SglangLike { max: 256 },
        verify: k,
    }));
    let verify_keys: Vec<usize> = r
        .graph_keys()
        .into_iter()
        .filter(|key| key.phase == Phase::Verify)
        .map(|key| key.bucket)
        .collect();
    assert_eq!(verify_keys, vec![8, 4, 2, 1]);
    let sched = SchedulerConfig {
        speculative: Some(Proposer::Ngram(NgramConfig::new(1, 4, k).unwrap())),
        ..SchedulerConfig::new(64, 8)
    };
    let (out, s) = run(&mut r, sched, &reqs);
    for (req, _) in &reqs {
        assert_eq!(out[&req.id], reference[&req.id], "request {}", req.id);
    }
    let st = s.stats();
    assert!(st.drafts_accepted > 10, "{st:?}");
    let v = r.phase_stats(Phase::Verify).unwrap();
    assert!(v.hits > 5 && v.captures >= 2, "{v:?}");
    assert!(v.padded_rows > 0, "{v:?}");
}

/// Speculative decoding with a draft model gives each request the tokens it gets decoding
/// one at a time (greedy and sampled, beside plain and penalized sequences, with chunked
/// prompts and preemption), through verify graphs and eagerly. A draft that is the target
/// itself has every greedy draft kept; the target in bf16 most, another model of the
/// same vocabulary few or none. The draft's KV follows the kept tokens: what it was fed
/// and the target rejected is cut, and finished sequences leave it.
#[test]
fn draft_model_speculation_gives_the_tokens_of_decoding_one_at_a_time() {
    check_draft_speculation(&CpuBackend::new(), false);
    check_draft_speculation(&CpuBackend::new(), true);
}

/// [`draft_model_speculation_gives_the_tokens_of_decoding_one_at_a_time`] on CUDA, greedy
/// requests only (a sample may move with the rounding differences between a verify step
/// and a decode step).
#[test]
#[ignore = "needs a CUDA device"]
fn cuda_draft_model_speculation_gives_the_tokens_of_decoding_one_at_a_time() {
    let _serial = cuda_serial();
    let be = encore_core::backend::cuda::CudaBackend::new(0).unwrap();
    check_draft_speculation(&be, true);
}

/// EAGLE-3 speculation (a random head shaped for the tiny target, reading its layers 0,
/// 2 and 3) gives the tokens of decoding one at a time: greedy and sampled requests,
/// eagerly, in graphs and while preempting. The head's drafts are proposed from the
/// target's hidden states every step (its catch-up covers prompts as they are
/// prefilled), and finished sequences leave its cache.
#[test]
fn eagle_speculation_gives_the_tokens_of_decoding_one_at_a_time() {
    check_eagle_speculation(&CpuBackend::new());
}

/// [`eagle_speculation_gives_the_tokens_of_decoding_one_at_a_time`] on CUDA.
#[test]
#[ignore = "needs a CUDA device"]
fn cuda_eagle_speculation_gives_the_tokens_of_decoding_one_at_a_time() {
    let _serial = cuda_serial();
    let be = encore_core::backend::cuda::CudaBackend::new(0).unwrap();
    check_eagle_speculation(&be);
}

/// [`mix`] and two greedy / sampled requests of a repeating prompt (drafts that get kept):
/// the requests of the draft-model and EAGLE checks.
fn repeating_mix() -> Vec<(Request, u64)> {
    let mut reqs = mix();
    for (id, temperature) in [(50u64, 0.0f32), (51, 0.7)] {
        let mut r = request(id, 0, 30, temperature);
        r.prompt = [3u32, 1, 4, 1, 5, 9, 2, 6].repeat(3);
        reqs.push((r, id - 49));
    }
    reqs
}

/// The graphs of the drafted checks (verify graphs of `k`) and the reference: the tokens of
/// decoding `reqs` one at a time with them, on a cache of `cfg`.
fn drafted_reference(
    be: &dyn encore_core::Backend,
    k: usize,
    cfg: encore_core::runner::RunnerConfig,
    reqs: &[(Request, u64)],
) -> (
    encore_core::runner::GraphConfig,
    HashMap<u64, (Vec<u32>, FinishReason)>,
) {
    let graphs = encore_core::runner::GraphConfig {
        decode: common::buckets(),
        mixed: encore_core::graph::BucketPolicy::SglangLike { max: 256 },
        verify: k,
    };
    let mut r = Runner::new(be, common::tiny_model(be), cfg).unwrap();
    r.set_graphs(Some(graphs.clone()));
    let reference = run(&mut r, SchedulerConfig::new(48, 8), reqs).0;
    (graphs, reference)
}

/// Every request of `reqs` gave the reference's tokens.
fn assert_reference_tokens(
    name: &str,
    reqs: &[(Request, u64)],
    out: &HashMap<u64, Vec<u32>>,
    reference: &HashMap<u64, (Vec<u32>, FinishReason)>,
) {
    for (req, _) in reqs {
        assert_eq!(
            out[&req.id], reference[&req.id].0,
            "{name}: request {}",
            req.id
        );
    }
}

/// Finished sequences leave the drafter's cache at its next proposal: one more request run
/// to the end leaves at most itself there.
fn assert_drafter_releases(
    name: &str,
    s: &mut Scheduler,
    target: &mut Runner<'_>,
    drafter: &mut encore_core::spec::draft::Drafter<'_>,
) {
    s.add(request(99, 4, 2, 0.0), target).unwrap();
    while s.has_work() {
        s.step_with(target, Some(&mut *drafter)).unwrap();
    }
    assert!(drafter.live() <= 1, "{name}: {} live", drafter.live());
}

fn check_eagle_speculation(be: &dyn encore_core::Backend) {
    use encore_core::model::config::ModelConfig;
    use encore_core::runner::{GraphConfig, RunnerConfig};
    use encore_core::spec::draft::Drafter;
    use encore_core::spec::Proposer;
    let reqs = repeating_mix();
    let k = 3;
    let cfg = |blocks: usize| RunnerConfig {
        max_seqs: 16 + 8 * k,
        ..common::tiny_config(blocks)
    };
    let roomy = 1 + 16 * (128 / common::BLOCK);
    let (graphs, reference) = drafted_reference(be, k, cfg(roomy), &reqs);
    for (name, blocks, with_graphs) in [
        ("graphs", roomy, true),
        ("eager", roomy, false),
        ("preempting", 60, true),
    ] {
        let mut target = common::tiny_model(be);
        let head_cfg = ModelConfig::eagle_head_for(&target.cfg, 300);
        let layers = head_cfg
            .eagle
            .as_ref()
            .unwrap()
            .aux_layers_for(target.cfg.num_layers)
            .unwrap();
        assert_eq!(layers, [0, 2, 3]);
        let rows = cfg(blocks).token_rows();
        target.capture_aux(be, layers, rows).unwrap();
        let embed = target.weights.embed.clone();
        let mut target = Runner::new(be, target, cfg(blocks)).unwrap();
        let mut head = common::dummy_model(be, head_cfg, 128);
        head.enable_eagle(be, &embed, rows, cfg(roomy).max_seqs)
            .unwrap();
        let mut head = Runner::new(be, head, cfg(roomy)).unwrap();
        if with_graphs {
            target.set_graphs(Some(graphs.clone()));
            head.set_graphs(Some(GraphConfig {
                verify: 1,
                ..graphs.clone()
            }));
        }
        let mut drafter = Drafter::eagle(head, &target, Vec::new()).unwrap();
        let sched = SchedulerConfig {
            speculative: Some(Proposer::Draft { k }),
            ..SchedulerConfig::new(48, 8)
        };
        let (out, mut s) = run_drafted(&mut target, sched, Some(&mut drafter), &reqs);
        assert_reference_tokens(name, &reqs, &out, &reference);
        let st = s.stats();
        assert!(st.drafts_proposed > 20, "{name}: {st:?}");
        assert!(drafter.stats.drafts >= st.drafts_proposed, "{name}");
        // The head catches up on every prompt token as it is prefilled.
        let prompts: usize = reqs.iter().map(|(r, _)| r.prompt.len()).sum();
        assert!(
            drafter.stats.tokens as usize >= prompts,
            "{name}: {:?}",
            drafter.stats
        );
        if blocks < roomy {
            assert!(st.preemptions > 0, "{name}: {st:?}");
        }
        assert_drafter_releases(name, &mut s, &mut target, &mut drafter);
    }
}

/// An EAGLE-3 head made for another target is refused, naming the flag: another
/// vocabulary, another hidden size, a layer the target does not have.
#[test]
fn an_eagle_head_for_another_target_is_refused() {
    use encore_core::model::config::ModelConfig;
    use encore_core::spec::draft::check_pair;
    let target = ModelConfig::dummy("tiny-qwen2").unwrap();
    let head = ModelConfig::eagle_head_for(&target, 300);
    assert!(check_pair(&target, &head).is_ok());
    let mut other = target.clone();
    other.vocab_size = 600;
    let e = check_pair(&other, &head).unwrap_err().to_string();
    assert!(e.contains("--draft-model") && e.contains("600"), "{e}");
    other = target.clone();
    other.hidden_size = 256;
    let e = check_pair(&other, &head).unwrap_err().to_string();
    assert!(e.contains("--draft-model") && e.contains("256"), "{e}");
    let mut far = head.clone();
    far.eagle.as_mut().unwrap().aux_layers = Some([1, 2, 9]);
    let e = check_pair(&target, &far).unwrap_err().to_string();
    assert!(e.contains("--draft-model") && e.contains("layer 9"), "{e}");
}

/// The draft-model speculation check on `be`: the tokens of a plain scheduler on `be`
/// (of greedy requests only with `greedy_only`) for each draft and mode.
fn check_draft_speculation(be: &dyn encore_core::Backend, greedy_only: bool) {
    use encore_core::graph::Phase;
    use encore_core::model::config::ModelConfig;
    use encore_core::runner::{GraphConfig, RunnerConfig};
    use encore_core::spec::draft::Drafter;
    use encore_core::spec::Proposer;
    use encore_core::DType;
    let mut reqs = repeating_mix();
    let mut penalized = request(52, 9, 20, 0.0);
    penalized.params.sampling.frequency_penalty = 0.4;
    reqs.push((penalized, 1));
    let greedy: Vec<(Request, u64)> = reqs
        .iter()
        .filter(|(r, _)| r.params.sampling.temperature == 0.0)
        .cloned()
        .collect();
    if greedy_only {
        reqs = greedy.clone();
    }
    let k = 3;
    let cfg = |blocks: usize| RunnerConfig {
        max_seqs: 16 + 8 * k,
        ..common::tiny_config(blocks)
    };
    let roomy = 1 + 16 * (128 / common::BLOCK);
    // Few enough blocks that the requests preempt one another.
    let tight = if greedy_only { 24 } else { 60 };
    let (graphs, reference) = drafted_reference(be, k, cfg(roomy), &reqs);
    let (f32, bf16) = (DType::F32, DType::BF16);
    for (name, all, draft_arch, dtype, blocks, with_graphs) in [
        ("itself, greedy", false, "tiny-qwen2", f32, roomy, true),
        ("itself in bf16", true, "tiny-qwen2", bf16, roomy, true),
        (
            "itself in bf16, eager",
            true,
            "tiny-qwen2",
            bf16,
            roomy,
            false,
        ),
        ("another model", true, "tiny-llama3", f32, roomy, true),
        ("preempting", true, "tiny-qwen2", bf16, tight, true),
    ] {
        let reqs = if all { &reqs } else { &greedy };
        let mut target = Runner::new(be, common::tiny_model(be), cfg(blocks)).unwrap();
        let arch = ModelConfig::dummy(draft_arch).unwrap();
        let draft_model = common::dummy_model_in(be, arch, 128, dtype);
        let mut draft = Runner::new(be, draft_model, cfg(roomy)).unwrap();
        if with_graphs {
            target.set_graphs(Some(graphs.clone()));
            // As the engine boots a draft (`EngineConfig::for_draft`): 2-token catch-ups
            // replay verify graphs.
            draft.set_graphs(Some(GraphConfig {
                verify: 1,
                ..graphs.clone()
            }));
        }
        let mut drafter = Drafter::new(draft, &target).unwrap();
        let sched = SchedulerConfig {
            speculative: Some(Proposer::Draft { k }),
            ..SchedulerConfig::new(48, 8)
        };
        let (out, mut s) = run_drafted(&mut target, sched, Some(&mut drafter), reqs);
        assert_reference_tokens(name, reqs, &out, &reference);
        let st = s.stats();
        assert!(st.drafts_proposed > 50, "{name}: {st:?}");
        // A step may verify fewer drafts than proposed (its budgets, a preemption).
        assert!(drafter.stats.drafts >= st.drafts_proposed, "{name}");
        match name {
            "itself, greedy" => {
                // Every draft kept but some of the penalized request's: the draft proposes
                // without its penalties.
                assert!(
                    st.drafts_accepted < st.drafts_proposed
                        && st.drafts_accepted * 5 >= st.drafts_proposed * 4,
                    "{st:?}"
                );
                // Every draft kept: each catch-up feeds the last draft and the target's
                // token, a 2-token chunk that replays the draft's verify graph.
                let v = drafter.runner().phase_stats(Phase::Verify).unwrap();
                assert!(v.hits + v.misses > 10, "{v:?}");
            }
            "another model" => {
                assert!(st.drafts_accepted * 4 < st.drafts_proposed, "{st:?}");
                // Drafts that are not kept stop speculation for a while: fewer than half
                // the tokens come out of verify steps.
                let emitted: usize = out.values().map(Vec::len).sum();
                assert!(st.spec_pauses > 0, "{st:?}");
                assert!(
                    (st.verifications as usize) * 2 < emitted,
                    "{st:?}: {emitted}"
                );
            }
            _ => assert!(
                st.drafts_accepted * 4 > st.drafts_proposed,
                "{name}: {st:?}"
            ),
        }
        if blocks < roomy {
            assert!(st.preemptions > 0, "{name}: {st:?}");
        }
        assert_drafter_releases(name, &mut s, &mut target, &mut drafter);
    }
}

/// A draft model whose vocabulary is not the target's is refused, naming the flag.
#[test]
fn a_draft_model_of_another_vocabulary_is_refused() {
    use encore_core::model::config::ModelConfig;
    use encore_core::spec::draft::Drafter;
    let cpu = CpuBackend::new();
    let target = common::tiny_runner(&cpu);
    let mut other = ModelConfig::dummy("tiny").unwrap();
    other.vocab_size = 600;
    let draft = Runner::new(
        &cpu,
        common::dummy_model(&cpu, other, 128),
        common::tiny_config(64),
    )
    .unwrap();
    let e = Drafter::new(draft, &target).err().unwrap().to_string();
    assert!(e.contains("--draft-model") && e.contains("600"), "{e}");
}

/// Sampled output under speculation keeps the target's distribution: over 600 seeds of a
/// 16-token vocabulary model at temperature 1, the fifth token's counts with n-gram
/// drafts and with a draft model (another model, so drafts are both kept and rejected)
/// pass a two-sample chi-square test against speculation off (p > 0.001), while the same
/// test tells temperature 0.6 from 1 (a control: it can fail).
#[test]
fn sampled_speculation_keeps_the_target_distribution() {
    use encore_core::model::config::ModelConfig;
    use encore_core::runner::RunnerConfig;
    use encore_core::spec::draft::Drafter;
    use encore_core::spec::ngram::NgramConfig;
    use encore_core::spec::Proposer;
    const VOCAB: usize = 16;
    const SEEDS: u64 = 600;
    const AT: usize = 4;
    let cpu = CpuBackend::new();
    let model = |arch: &str| {
        let mut c = ModelConfig::dummy(arch).unwrap();
        c.vocab_size = VOCAB;
        c.bos_token_id = Some(0);
        c.eos_token_ids = vec![1];
        common::dummy_model(&cpu, c, 128)
    };
    let cfg = RunnerConfig {
        max_seqs: 16 + 8 * 4,
        ..common::tiny_config(1 + 16 * (128 / common::BLOCK))
    };
    let counts = |spec: Option<Proposer>, temperature: f32| -> Vec<u64> {
        let mut r = Runner::new(&cpu, model("tiny-qwen2"), cfg).unwrap();
        let mut drafter = match spec {
            Some(Proposer::Draft { .. }) => {
                let d = Runner::new(&cpu, model("tiny-llama3"), cfg).unwrap();
                Some(Drafter::new(d, &r).unwrap())
            }
            _ => None,
        };
        let sched = SchedulerConfig {
            speculative: spec,
            ..SchedulerConfig::new(64, 16)
        };
        let mut s = Scheduler::new(sched, &r).unwrap();
        for seed in 0..SEEDS {
            let mut q = request(seed, 0, AT + 1, temperature);
            q.prompt = [2u32, 3, 4, 5].repeat(4);
            q.params.sampling.top_k = 0;
            q.params.sampling.top_p = 1.0;
            q.params.sampling.seed = seed;
            q.params.ignore_eos = true;
            s.add(q, &r).unwrap();
        }
        let mut out: HashMap<u64, Vec<u32>> = HashMap::new();
        while s.has_work() {
            for o in s.step_with(&mut r, drafter.as_mut()).unwrap() {
                out.entry(o.id).or_default().push(o.token);
            }
        }
        if spec.is_some() {
            assert!(s.stats().drafts_accepted > 0, "{:?}", s.stats());
        }
        let mut c = vec![0u64; VOCAB];
        for toks in out.values() {
            c[toks[AT] as usize] += 1;
        }
        c
    };
    // Two samples of equal size: sum of (a - b)^2 / (a + b) over the tokens seen; the
    // 0.999 quantile of chi-square with 15 degrees of freedom is 37.70.
    let chi2 = |a: &[u64], b: &[u64]| -> f64 {
        a.iter()
            .zip(b)
            .filter(|(x, y)| **x + **y > 0)
            .map(|(&x, &y)| (x as f64 - y as f64).powi(2) / (x + y) as f64)
            .sum()
    };
    let off = counts(None, 1.0);
    assert!(off.iter().filter(|&&c| c > 0).count() > 4, "{off:?}");
    let ngram = counts(
        Some(Proposer::Ngram(NgramConfig::new(1, 4, 4).unwrap())),
        1.0,
    );
    let draft = counts(Some(Proposer::Draft { k: 3 }), 1.0);
    for (name, c) in [("ngram", &ngram), ("draft", &draft)] {
        let x = chi2(&off, c);
        assert!(
            x < 37.70,
            "{name}: chi-square {x:.1}: {off:?} against {c:?}"
        );
    }
    let colder = counts(None, 0.6);
    let x = chi2(&off, &colder);
    assert!(
        x > 37.70,
        "the control: chi-square {x:.1}: {off:?} against {colder:?}"
    );
}

/// A draft KV with one free block and two sequences at a block boundary: the first takes
/// the block for its next draft, the second stops at the drafts it has (no error); what
/// the draft holds follows what it was fed.
#[test]
fn a_full_draft_cache_cuts_drafts_short() {
    use encore_core::kv::SeqId;
    use encore_core::spec::draft::{DraftRequest, Drafter};
    let cpu = CpuBackend::new();
    let target = common::tiny_runner(&cpu);
    // The null block and 3 of 4 tokens: each 4-token prompt fills one.
    let draft = Runner::new(&cpu, common::tiny_model(&cpu), common::tiny_config(4)).unwrap();
    let mut d = Drafter::new(draft, &target).unwrap();
    let (a, b) = ([5u32, 6, 7, 8], [9u32, 10, 11, 12]);
    let reqs = [
        DraftRequest {
            seq: SeqId(0),
            tokens: &a,
            max_drafts: 3,
        },
        DraftRequest {
            seq: SeqId(1),
            tokens: &b,
            max_drafts: 3,
        },
    ];
    let drafts = d.propose(&reqs, &target).unwrap();
    assert_eq!(
        drafts.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![3, 1],
        "{drafts:?}"
    );
    assert_eq!(d.live(), 2);
    // The first sequence's drafts were all kept but the last: the draft keeps their KV,
    // and the second's tokens moved on; both propose again from there.
    let a2: Vec<u32> = a
        .iter()
        .chain(&drafts[0][..2])
        .copied()
        .chain([1])
        .collect();
    let b2: Vec<u32> = b.iter().copied().chain([2]).collect();
    d.release(SeqId(1)).unwrap();
    let again = d
        .propose(
            &[DraftRequest {
                seq: SeqId(0),
                tokens: &a2,
                max_drafts: 2,
            }],
            &target,
        )
        .unwrap();
    assert!(!again[0].is_empty());
    assert!(d
        .propose(
            &[DraftRequest {
                seq: SeqId(1),
                tokens: &b2,
                max_drafts: 1
            }],
            &target
        )
        .is_ok());
}

/// `speculative_max_batch`: no sequence speculates in a step planned while more run; the
/// tokens are those of decoding one at a time either way.
#[test]
fn speculation_stops_above_its_batch_limit() {
    use encore_core::spec::ngram::NgramConfig;
    use encore_core::spec::Proposer;
    let cpu = CpuBackend::new();
    let reqs: Vec<(Request, u64)> = (0..4u64)
        .map(|id| {
            let mut r = request(60 + id, 0, 10 + 12 * id as usize, 0.0);
            r.prompt = [7u32, 9, 11, 13, 15].repeat(6);
            (r, 0)
        })
        .collect();
    let reference = alone(&reqs);
    let mut r = common::tiny_runner(&cpu);
    let cfg = SchedulerConfig {
        speculative: Some(Proposer::Ngram(NgramConfig::new(1, 4, 3).unwrap())),
        speculative_max_batch: 2,
        ..SchedulerConfig::new(64, 8)
    };
    let mut s = Scheduler::new(cfg, &r).unwrap();
    for (q, _) in &reqs {
        s.add(q.clone(), &r).unwrap();
    }
    let mut out: HashMap<u64, Vec<u32>> = HashMap::new();
    let (mut above, mut below) = (0u64, 0u64);
    while s.has_work() {
        let running = s.num_running().max(s.num_waiting());
        let before = s.stats().verifications;
        for o in s.step(&mut r).unwrap() {
            out.entry(o.id).or_default().push(o.token);
        }
        let verified = s.stats().verifications - before;
        if running > 2 {
            above += verified;
        } else {
            below += verified;
        }
    }
    for (q, _) in &reqs {
        assert_eq!(out[&q.id], reference[&q.id].0, "request {}", q.id);
    }
    assert_eq!(above, 0);
    assert!(below > 0);
}

/// Requests with penalties speculate: each verify row samples with its sequence's counts
/// and the drafts before it counted (a scratch copy of its penalty row), and the row of the
/// last kept sample becomes the sequence's, so the tokens equal those of decoding one at
/// a time (greedy and sampled; repetition, frequency and presence penalties), eagerly and
/// in graphs, with n-gram drafts and a draft model, and drafts are kept.
#[test]
fn speculation_with_penalties_gives_the_tokens_of_decoding_one_at_a_time() {
    check_penalty_speculation(&CpuBackend::new());
}

/// [`speculation_with_penalties_gives_the_tokens_of_decoding_one_at_a_time`] on CUDA.
#[test]
#[ignore = "needs a CUDA device"]
fn cuda_speculation_with_penalties_gives_the_tokens_of_decoding_one_at_a_time() {
    let _serial = cuda_serial();
    let be = encore_core::backend::cuda::CudaBackend::new(0).unwrap();
    check_penalty_speculation(&be);
}

/// The penalty speculation check on `be`, against a plain scheduler on `be`.
fn check_penalty_speculation(be: &dyn encore_core::Backend) {
    use encore_core::spec::draft::Drafter;
    use encore_core::spec::ngram::NgramConfig;
    use encore_core::spec::Proposer;
    let penalties = [(1.0f32, 0.05f32, 0.0f32), (1.1, 0.0, 0.0), (1.0, 0.0, 0.3)];
    let mut reqs: Vec<(Request, u64)> = Vec::new();
    for (n, &(rep, freq, pres)) in penalties.iter().enumerate() {
        for (j, t) in [0.0f32, 0.8].into_iter().enumerate() {
            let id = 80 + 2 * n as u64 + j as u64;
            let mut r = request(id, 0, 40, t);
            r.prompt = [31u32, 32, 33, 34, 35].repeat(5);
            r.params.sampling.repetition_penalty = rep;
            r.params.sampling.frequency_penalty = freq;
            r.params.sampling.presence_penalty = pres;
            reqs.push((r, id % 3));
        }
    }
    // A plain request beside them.
    reqs.push((request(90, 9, 30, 0.0), 1));
    let k = 4;
    let cfg = encore_core::runner::RunnerConfig {
        max_seqs: 16 + 8 * k,
        penalty_slots: 16 + 8 * k,
        ..common::tiny_config(1 + 16 * (128 / common::BLOCK))
    };
    let reference = {
        let mut r = Runner::new(be, common::tiny_model(be), cfg).unwrap();
        run(&mut r, SchedulerConfig::new(64, 8), &reqs).0
    };
    // The last case checks every replayed step against an eager twin
    // (`--verify-graphs`), which packs the step again without counting penalties.
    for (proposer, graphs, check) in [
        ("ngram", false, false),
        ("ngram", true, false),
        ("draft", true, false),
        ("ngram", true, true),
    ] {
        let mut r = Runner::new(be, common::tiny_model(be), cfg).unwrap();
        r.set_verify_graphs(check);
        let graph_cfg = encore_core::runner::GraphConfig {
            decode: common::buckets(),
            mixed: encore_core::graph::BucketPolicy::SglangLike { max: 256 },
            verify: k,
        };
        if graphs {
            r.set_graphs(Some(graph_cfg.clone()));
        }
        let (spec, mut drafter) = match proposer {
            "ngram" => (Proposer::Ngram(NgramConfig::new(1, 4, k).unwrap()), None),
            _ => {
                let mut d = Runner::new(be, common::tiny_model(be), cfg).unwrap();
                d.set_graphs(Some(encore_core::runner::GraphConfig {
                    verify: 1,
                    ..graph_cfg.clone()
                }));
                (Proposer::Draft { k }, Some(Drafter::new(d, &r).unwrap()))
            }
        };
        let sched = SchedulerConfig {
            speculative: Some(spec),
            ..SchedulerConfig::new(64, 8)
        };
        let (out, s) = run_drafted(&mut r, sched, drafter.as_mut(), &reqs);
        for (q, _) in &reqs {
            assert_eq!(
                out[&q.id], reference[&q.id].0,
                "{proposer}, graphs {graphs}: request {}",
                q.id
            );
        }
        let st = s.stats();
        assert!(st.drafts_accepted > 20, "{proposer} {graphs}: {st:?}");
        // Every penalty slot is back: the scratch rows of each verify step too.
        assert_eq!(
            s.free_penalty_slots(),
            cfg.penalty_slots,
            "{proposer} {graphs}"
        );
    }
}

/// Requests with a logit bias speculate: each verify row applies the bias, so the tokens
/// equal those of decoding one at a time (greedy and sampled), and drafts are kept.
#[test]
fn speculation_with_a_logit_bias_gives_the_tokens_of_decoding_one_at_a_time() {
    check_logit_bias_speculation(&CpuBackend::new());
}

/// [`speculation_with_a_logit_bias_gives_the_tokens_of_decoding_one_at_a_time`] on CUDA
/// (f32: the verify rows round like decode rows but for GEMM shapes).
#[test]
#[ignore = "needs a CUDA device"]
fn cuda_speculation_with_a_logit_bias_gives_the_tokens_of_decoding_one_at_a_time() {
    let _serial = cuda_serial();
    let be = encore_core::backend::cuda::CudaBackend::new(0).unwrap();
    check_logit_bias_speculation(&be);
}

/// The logit-bias speculation check on `be`, against a plain scheduler on `be`.
fn check_logit_bias_speculation(be: &dyn encore_core::Backend) {
    use encore_core::spec::ngram::NgramConfig;
    use encore_core::spec::Proposer;
    let reqs: Vec<(Request, u64)> = [(70u64, 0.0f32), (71, 0.8), (72, 0.0)]
        .into_iter()
        .map(|(id, t)| {
            let mut r = request(id, 0, 30, t);
            r.prompt = [21u32, 22, 23, 24].repeat(6);
            // Push one token up and ban the one the first request repeats.
            r.params.logit_bias = vec![(21, 2.5), (22, -100.0)];
            (r, id - 70)
        })
        .collect();
    let cfg = encore_core::runner::RunnerConfig {
        max_seqs: 16 + 8 * 4,
        ..common::tiny_config(1 + 16 * (128 / common::BLOCK))
    };
    let reference = {
        let mut r = Runner::new(be, common::tiny_model(be), cfg).unwrap();
        run(&mut r, SchedulerConfig::new(64, 8), &reqs).0
    };
    for graphs in [false, true] {
        let mut r = Runner::new(be, common::tiny_model(be), cfg).unwrap();
        if graphs {
            r.set_graphs(Some(encore_core::runner::GraphConfig {
                decode: common::buckets(),
                mixed: encore_core::graph::BucketPolicy::SglangLike { max: 256 },
                verify: 4,
            }));
        }
        let sched = SchedulerConfig {
            speculative: Some(Proposer::Ngram(NgramConfig::new(1, 4, 4).unwrap())),
            ..SchedulerConfig::new(64, 8)
        };
        let (out, s) = run(&mut r, sched, &reqs);
        for (q, _) in &reqs {
            assert_eq!(
                out[&q.id], reference[&q.id],
                "graphs {graphs}: request {}",
                q.id
            );
            assert!(
                !out[&q.id].0.contains(&22),
                "graphs {graphs}: {:?}",
                out[&q.id]
            );
        }
        assert!(s.stats().drafts_accepted > 5, "{:?}", s.stats());
    }
}
