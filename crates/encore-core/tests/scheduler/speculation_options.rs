//! Speculative decoding with sampling, penalties, a logit bias and its limits (a full draft
//! cache, the batch limit): the target's distribution and one-at-a-time tokens.

use super::*;

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
