//! Speculative decoding through the scheduler (n-gram, a draft model, an EAGLE head;
//! verify steps eager and in graphs): the tokens of decoding one at a time.

use super::*;

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
