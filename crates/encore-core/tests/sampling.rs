//! Per-request sampling knobs end to end, on the CPU backend: penalties counted on the
//! device through chunked prefill, preemption and graphs give the tokens of a host-side
//! reference that applies them to the model's raw logits; log-probabilities come back
//! per token; min-p and penalties are validated at `add`.

use std::collections::{HashMap, HashSet};

use encore_core::backend::cpu::CpuBackend;
use encore_core::graph::BucketPolicy;
use encore_core::kv::SeqId;
use encore_core::request::{Output, Param, Request};
use encore_core::request::{SamplingParams, TokenLogprobs};
use encore_core::runner::{GraphConfig, Runner, SeqStep, Seqs};
use encore_core::scheduler::{Scheduler, SchedulerConfig};

mod common;

fn request(id: u64, prompt_len: usize, max_tokens: usize, sampling: SamplingParams) -> Request {
    let prompt = (0..prompt_len)
        .map(|j| ((id as usize * 53 + j * 7) % 250) as u32)
        .collect();
    common::request(id, prompt, sampling, max_tokens)
}

fn greedy(rep: f32, freq: f32, pres: f32, logprobs: Option<usize>) -> SamplingParams {
    SamplingParams {
        repetition_penalty: rep,
        frequency_penalty: freq,
        presence_penalty: pres,
        logprobs,
        ..Default::default()
    }
}

/// Run `reqs` to completion; each request's outputs in order.
fn run(
    r: &mut Runner<'_>,
    cfg: SchedulerConfig,
    reqs: &[Request],
) -> (HashMap<u64, Vec<Output>>, Scheduler) {
    let mut s = Scheduler::new(cfg, r).unwrap();
    for q in reqs {
        s.add(q.clone(), r).unwrap();
    }
    let mut out: HashMap<u64, Vec<Output>> = HashMap::new();
    let mut steps = 0;
    while s.has_work() {
        for o in s.step(r).unwrap() {
            out.entry(o.id).or_default().push(o);
        }
        steps += 1;
        assert!(steps < 10_000, "no progress");
    }
    assert_eq!(s.blocks().num_used_blocks(), 0);
    (out, s)
}

/// The request's greedy tokens and log-probabilities computed on the host: the model's
/// raw logits of one sequence alone (`step_with_logits`, no penalties on the device),
/// penalised as vLLM does in f32, argmax (smallest index among ties), log-softmax.
fn host_reference(req: &Request) -> Vec<(u32, Option<TokenLogprobs>)> {
    let cpu = CpuBackend::new();
    let mut r = common::tiny_runner(&cpu);
    let mut r_seqs = Seqs::for_runner(&r).unwrap();
    let p = req.params.sampling;
    let seq = SeqId(0);
    r_seqs.blocks.allocate(seq, req.prompt.len()).unwrap();
    let prompt: HashSet<u32> = req.prompt.iter().copied().collect();
    let mut counts: HashMap<u32, u32> = HashMap::new();
    let mut input = req.prompt.clone();
    let mut out = Vec::new();
    for _ in 0..req.params.max_tokens {
        let step = SeqStep {
            seq,
            tokens: &input,
            sampling: SamplingParams::default(),
            masked: false,
            score: None,
            verify: false,
            logit_bias: &[],
        };
        let (_, logits) = r.step_with_logits(&mut r_seqs, &[step]).unwrap();
        let row: Vec<f32> = logits[0]
            .iter()
            .enumerate()
            .map(|(t, &l)| {
                let n = counts.get(&(t as u32)).copied().unwrap_or(0);
                if n == 0 && !prompt.contains(&(t as u32)) {
                    return l;
                }
                let mut v = if l > 0.0 {
                    l / p.repetition_penalty
                } else {
                    l * p.repetition_penalty
                };
                if n > 0 {
                    v -= p.frequency_penalty * n as f32;
                    v -= p.presence_penalty;
                }
                v
            })
            .collect();
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap().then(a.cmp(&b)));
        let token = order[0] as u32;
        let m = row[order[0]] as f64;
        let ln_sum = row.iter().map(|&l| (l as f64 - m).exp()).sum::<f64>().ln();
        let lp = |t: usize| (row[t] as f64 - m - ln_sum) as f32;
        let logprobs = p.logprobs.map(|n| TokenLogprobs {
            logprob: lp(token as usize),
            top: order[..n].iter().map(|&t| (t as u32, lp(t))).collect(),
        });
        out.push((token, logprobs));
        *counts.entry(token).or_default() += 1;
        r_seqs.blocks.append(seq, 1).unwrap();
        input = vec![token];
    }
    out
}

fn assert_matches_reference(got: &[Output], want: &[(u32, Option<TokenLogprobs>)], what: &str) {
    let tokens: Vec<u32> = got.iter().map(|o| o.token).collect();
    let want_tokens: Vec<u32> = want.iter().map(|w| w.0).collect();
    assert_eq!(tokens, want_tokens, "{what}: tokens");
    for (i, (o, (_, w))) in got.iter().zip(want).enumerate() {
        match (&o.logprobs, w) {
            (None, None) => {}
            (Some(g), Some(w)) => {
                assert!(
                    (g.logprob - w.logprob).abs() < 1e-4,
                    "{what} #{i}: {g:?} vs {w:?}"
                );
                let ids = |t: &TokenLogprobs| t.top.iter().map(|e| e.0).collect::<Vec<_>>();
                assert_eq!(ids(g), ids(w), "{what} #{i}: top ids");
                for (a, b) in g.top.iter().zip(&w.top) {
                    assert!((a.1 - b.1).abs() < 1e-4, "{what} #{i}: {g:?} vs {w:?}");
                }
            }
            _ => panic!("{what} #{i}: log-probabilities {:?} vs {w:?}", o.logprobs),
        }
    }
}

fn mix() -> Vec<Request> {
    vec![
        request(0, 70, 20, greedy(1.8, 0.0, 0.0, None)),
        request(1, 5, 30, greedy(1.0, 0.7, 0.0, Some(3))),
        request(2, 33, 24, greedy(1.0, 0.0, 1.5, None)),
        request(3, 1, 25, greedy(1.3, 0.4, 0.5, Some(20))),
        request(4, 90, 12, greedy(1.0, 0.0, 0.0, Some(0))),
        request(5, 12, 40, greedy(0.7, -0.3, 0.2, None)),
    ]
}

#[test]
fn a_strong_repetition_penalty_stops_greedy_repeats() {
    let cpu = CpuBackend::new();
    let cfg = SchedulerConfig::new(64, 4);
    let plain = request(7, 6, 40, greedy(1.0, 0.0, 0.0, None));
    let penalised = request(8, 6, 40, greedy(50.0, 0.0, 0.0, None));
    let penalised = Request {
        prompt: plain.prompt.clone(),
        ..penalised
    };
    let mut r = common::tiny_runner(&cpu);
    let (out, _) = run(&mut r, cfg, &[plain, penalised.clone()]);
    let distinct = |o: &[Output]| o.iter().map(|o| o.token).collect::<HashSet<_>>().len();
    assert!(
        distinct(&out[&7]) < 40,
        "dummy:tiny repeats itself unpenalised"
    );
    assert_eq!(distinct(&out[&8]), 40, "{:?}", out[&8]);
    let prompt: HashSet<u32> = penalised.prompt.iter().copied().collect();
    assert!(out[&8].iter().all(|o| !prompt.contains(&o.token)));
}

#[test]
fn penalties_and_logprobs_match_the_host_reference_through_chunks_and_preemption() {
    let cpu = CpuBackend::new();
    let reqs = mix();
    let want: HashMap<u64, _> = reqs.iter().map(|q| (q.id, host_reference(q))).collect();
    // 16 tokens a step: prompts are chunked (their dropped chunk samples must not count)
    // and mixed with decodes; 30 usable blocks of 4 tokens force preemptions (a
    // recomputed request's slot is rebuilt from its prompt and the tokens it produced).
    let cfg = SchedulerConfig::new(16, 5);
    let mut r = common::tiny_runner_with_blocks(&cpu, 31);
    let (out, s) = run(&mut r, cfg, &reqs);
    assert!(s.stats().preemptions > 0, "{:?}", s.stats());
    for q in &reqs {
        assert_matches_reference(&out[&q.id], &want[&q.id], &format!("request {}", q.id));
    }
    assert_eq!(s.seqs().free_penalty_slots(), 16, "every slot is back");

    // Graphs (decode buckets, piecewise token buckets) count inside the replays alike.
    let mut g = common::tiny_runner(&cpu);
    g.set_graphs(Some(GraphConfig {
        decode: common::buckets(),
        mixed: BucketPolicy::SglangLike { max: 256 },
        verify: 0,
    }));
    let (out, _) = run(&mut g, cfg, &reqs);
    for q in &reqs {
        assert_matches_reference(
            &out[&q.id],
            &want[&q.id],
            &format!("graphs, request {}", q.id),
        );
    }
    let st = g.graph_stats().unwrap();
    assert!(st.hits > 10, "{st:?}");
}

#[test]
fn sampling_values_that_cannot_work_are_refused() {
    let cpu = CpuBackend::new();
    let r = common::tiny_runner(&cpu);
    let cfg = SchedulerConfig::new(16, 4);
    let mut s = Scheduler::new(cfg, &r).unwrap();
    for (sampling, needle, param) in [
        (
            greedy(0.0, 0.0, 0.0, None),
            "`repetition_penalty` must be finite and > 0",
            Param::RepetitionPenalty,
        ),
        (
            greedy(1.0, f32::NAN, 0.0, None),
            "finite",
            Param::FrequencyPenalty,
        ),
        (
            greedy(1.0, 0.0, 0.0, Some(21)),
            "limited to 20",
            Param::Logprobs,
        ),
    ] {
        let err = s.add(request(1, 4, 4, sampling), &r).unwrap_err();
        assert!(err.to_string().contains(needle), "{err}");
        assert_eq!(err.param, param, "{err}");
    }
    // A runner without penalty slots refuses penalties, not the rest.
    let be = CpuBackend::new();
    let mut cfg0 = *r.config();
    cfg0.penalty_slots = 0;
    let model = common::tiny_model(&be);
    let r0 = Runner::new(&be, model, cfg0).unwrap();
    let mut s0 = Scheduler::new(cfg, &r0).unwrap();
    let err = s0
        .add(request(1, 4, 4, greedy(1.2, 0.0, 0.0, None)), &r0)
        .unwrap_err();
    assert!(err.to_string().contains("no penalty slots"), "{err}");
    s0.add(request(2, 4, 4, greedy(1.0, 0.0, 0.0, Some(2))), &r0)
        .unwrap();
}

#[test]
fn prompt_logprobs_match_teacher_forcing() {
    common::check_prompt_logprobs(&CpuBackend::new(), 1e-4);
}
