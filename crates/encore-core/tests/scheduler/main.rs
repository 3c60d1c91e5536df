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

#[path = "../common/mod.rs"]
mod common;
mod gpt_oss;
mod overlap;
mod speculation;
mod speculation_options;

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
    let out = drive(r, &mut s, reqs, &[]);
    let tokens = out
        .into_iter()
        .map(|(id, (o, f))| (id, (o.into_iter().map(|o| o.token).collect(), f)))
        .collect();
    (tokens, s)
}

/// Every output of a request, and how it finished.
type Outputs = HashMap<u64, (Vec<encore_core::request::Output>, FinishReason)>;

/// Step `s` on `r` until `reqs` (each added at its step) are done, aborting each of
/// `aborts` (request, step) at its step; every output of each request. Every block is
/// free at the end.
fn drive(
    r: &mut Runner<'_>,
    s: &mut Scheduler,
    reqs: &[(Request, u64)],
    aborts: &[(u64, u64)],
) -> Outputs {
    let mut out: Outputs = HashMap::new();
    let mut step = 0u64;
    loop {
        for (req, at) in reqs {
            if *at == step {
                s.add(req.clone(), r).unwrap();
            }
        }
        for &(id, at) in aborts {
            if at == step {
                s.abort(id).unwrap();
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
            if let Some(f) = o.finish {
                e.1 = f;
            }
            e.0.push(o);
        }
        step += 1;
        assert!(step < 10_000, "no progress");
    }
    assert_eq!(
        s.blocks().num_used_blocks(),
        0,
        "finished requests free their blocks"
    );
    out
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
/// A `dummy:qwen2.5-0.5b` bf16 engine's runner on `be`: 64 sequences, 1,024 tokens a step
/// and a sequence, every decode and token bucket captured at boot.
fn cuda_runner(be: &dyn encore_core::backend::Backend, async_scheduling: bool) -> Runner<'_> {
    use encore_core::engine::{Engine, EngineConfig, KvSizing};
    use encore_core::graph::BucketPolicy;
    use encore_core::runner::GraphConfig;
    let cfg = EngineConfig {
        graphs: Some(GraphConfig {
            decode: BucketPolicy::VllmLike { max: 64 },
            mixed: BucketPolicy::SglangLike { max: 1024 },
            verify: 0,
        }),
        capture_all: true,
        async_scheduling,
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
    Engine::new(be, files, &cfg, &encore_core::progress::NoProgress)
        .unwrap()
        .runner
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_mixed_steps_at_a_real_shape_complete() {
    let _serial = cuda_serial();
    let be = encore_core::backend::cuda::CudaBackend::new(0).unwrap();
    let mut runner = cuda_runner(&be, false);
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
