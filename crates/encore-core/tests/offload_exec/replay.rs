//! Graph replay against eager under offload, and KV pressure with chunked prefill.

use super::*;

/// The dummies with tied embeddings and a qkv bias (tiny-qwen2), tied embeddings and q/k
/// norms (tiny-qwen3), untied Llama 3 rope (tiny-llama3), and LayerNorms whose biases the
/// norm ops read beside their weights (tiny-stablelm).
const MODELS: [&str; 4] = [
    "dummy:tiny-qwen2",
    "dummy:tiny-qwen3",
    "dummy:tiny-llama3",
    "dummy:tiny-stablelm",
];

#[test]
fn verified_graph_replays_under_offload_give_the_resident_tokens() {
    let cpu = slow_cpu();
    for spec in MODELS {
        let files = open_model(spec).unwrap();
        let (want, _) = run_files(&cpu, &files, &config(false, None)).unwrap();
        // Graphs captured on first use (the other tests capture all at start-up).
        let cfg = EngineConfig {
            verify_graphs: true,
            capture_all: false,
            ..config(true, budget(50.0, Policy::Planned))
        };
        let Engine { mut runner, report } =
            Engine::new(&cpu, files.clone(), &cfg, &NoProgress).unwrap();
        assert!(report.offload.is_some());
        let got = greedy(&mut runner, &prompts()).unwrap();
        assert_eq!(got, want, "{spec}");
        let s = runner.graph_stats().unwrap();
        assert!(s.hits > 0, "{spec}: no step replayed a graph: {s:?}");
    }
}

/// Under the LRU policy each op's weights come from its announcement: a LayerNorm's
/// weight and bias, in that order (tiny-stablelm), give the resident tokens.
#[test]
fn lru_budgets_hand_layer_norms_their_biases() {
    let cpu = slow_cpu();
    let files = open_model("dummy:tiny-stablelm").unwrap();
    let (want, _) = run_files(&cpu, &files, &config(false, None)).unwrap();
    for p in [75.0, 30.0] {
        let (got, _) = run_files(&cpu, &files, &config(false, budget(p, Policy::Lru))).unwrap();
        assert_eq!(got, want, "LRU, {p}% budget");
    }
}

/// Run the same steps on every runner (prompts prefilled in chunks beside decodes, then
/// decodes of all three), feeding each the first runner's greedy tokens; returns each
/// runner's logits per step.
fn lockstep(runners: &mut [Runner<'_>]) -> Vec<Vec<Vec<Vec<f32>>>> {
    let prompts = prompts();
    // Prompt chunks (sequence, tokens) per step, beside the decodes of finished prompts.
    let chunks: [&[(usize, usize)]; 3] = [&[(0, 45), (1, 9)], &[(2, 40)], &[(2, 30)]];
    let mut fed = [0usize; 3];
    let mut last: Vec<Option<u32>> = vec![None; 3];
    let mut out = vec![Vec::new(); runners.len()];
    let mut seqs: Vec<Seqs> = runners
        .iter()
        .map(|r| Seqs::for_runner(r).unwrap())
        .collect();
    for k in 0..8 {
        let mut batch: Vec<(usize, Vec<u32>)> = (0..3)
            .filter_map(|s| last[s].map(|t| (s, vec![t])))
            .collect();
        for &(s, n) in chunks.get(k).copied().unwrap_or_default() {
            batch.push((s, prompts[s][fed[s]..fed[s] + n].to_vec()));
            fed[s] += n;
        }
        let mut tokens = Vec::new();
        for (i, (r, seqs)) in runners.iter_mut().zip(&mut seqs).enumerate() {
            for (s, toks) in &batch {
                let id = SeqId(*s as u64);
                if seqs.blocks.contains(id) {
                    seqs.blocks.append(id, toks.len()).unwrap();
                } else {
                    seqs.blocks.allocate(id, toks.len()).unwrap();
                }
            }
            let steps: Vec<SeqStep<'_>> = batch
                .iter()
                .map(|(s, toks)| SeqStep {
                    seq: SeqId(*s as u64),
                    tokens: toks,
                    sampling: SamplingParams::default(),
                    masked: false,
                    score: None,
                    verify: false,
                    logit_bias: &[],
                })
                .collect();
            let (t, logits) = r.step_with_logits(seqs, &steps).unwrap();
            if i == 0 {
                tokens = t;
            } else {
                assert_eq!(t, tokens, "runner {i}, step {k}: sampled tokens");
            }
            out[i].push(logits);
        }
        // A sequence decodes once its whole prompt is in.
        for ((s, _), &t) in batch.iter().zip(&tokens) {
            if fed[*s] == prompts[*s].len() {
                last[*s] = Some(t);
            }
        }
    }
    out
}

#[test]
fn graph_step_logits_equal_eager_ones_under_offload() {
    let cpu = slow_cpu();
    for spec in MODELS {
        let files = open_model(spec).unwrap();
        let mut runners = Vec::new();
        for cfg in [
            config(false, budget(50.0, Policy::Planned)),
            config(true, budget(50.0, Policy::Planned)),
            config(true, budget(30.0, Policy::Planned)),
            config(false, None),
        ] {
            runners.push(
                Engine::new(&cpu, files.clone(), &cfg, &NoProgress)
                    .unwrap()
                    .runner,
            );
        }
        let logits = lockstep(&mut runners);
        // The CPU runs the same kernels per row in graphs and eagerly: bit for bit.
        for (i, name) in [(1, "graphs 50%"), (2, "graphs 30%"), (3, "resident eager")] {
            assert_eq!(logits[i], logits[0], "{spec}: {name} against eager 50%");
        }
        let s = runners[1].graph_stats().unwrap();
        assert!(s.hits >= 8, "{spec}: every step replays: {s:?}");
    }
}

/// Greedy tokens of `prompts` through the scheduler (as `generate` runs it), and the
/// number of preemptions it made.
fn scheduled(runner: &mut Runner<'_>, prompts: &[Vec<u32>]) -> (Vec<Vec<u32>>, u64) {
    let cfg = *runner.config();
    let mut sched = Scheduler::new(
        SchedulerConfig::new(cfg.max_tokens_per_step, cfg.max_seqs),
        runner,
    )
    .unwrap();
    for (i, p) in prompts.iter().enumerate() {
        let mut req = common::request(i as u64, p.clone(), SamplingParams::default(), 12);
        req.params.ignore_eos = true;
        sched.add(req, runner).unwrap();
    }
    let mut out = vec![Vec::new(); prompts.len()];
    while sched.has_work() {
        for o in sched.step(runner).unwrap() {
            out[o.id as usize].push(o.token);
        }
    }
    (out, sched.stats().preemptions)
}

#[test]
fn preemption_and_chunked_prefill_under_offload_give_the_resident_tokens() {
    let cpu = slow_cpu();
    // 32 tokens a step (prompts of 45 and 70 are chunked) and 8 blocks of 16 for 3
    // sequences that need 12: the newest is preempted and recomputed.
    let small = |graphs: bool, offload| EngineConfig {
        max_tokens_per_step: 32,
        kv: KvSizing::Blocks(8),
        graphs: graphs.then_some(GraphConfig {
            decode: BucketPolicy::PowersOfTwo { max: 4 },
            mixed: BucketPolicy::SglangLike { max: 32 },
            verify: 0,
        }),
        ..config(graphs, offload)
    };
    let want = run(&cpu, &config(false, None)).unwrap();
    let files = open_model(MODEL).unwrap();
    for (graphs, oc, what) in [
        (false, budget(50.0, Policy::Planned), "planned eager"),
        (true, budget(30.0, Policy::Planned), "planned graphs"),
        (false, budget(50.0, Policy::Lru), "LRU eager"),
    ] {
        let Engine { mut runner, .. } =
            Engine::new(&cpu, files.clone(), &small(graphs, oc), &NoProgress).unwrap();
        let (got, preemptions) = scheduled(&mut runner, &prompts());
        assert_eq!(got, want, "{what}");
        assert!(preemptions > 0, "{what}: no preemption");
        if graphs {
            // And through `generate` itself, on the same engine.
            assert_eq!(greedy(&mut runner, &prompts()).unwrap(), want, "{what}");
        }
    }
}

/// The same stream of chunked prompts, preempted under KV pressure, through a mixture of
/// experts under the expert cache at its floor (every step evicts), eager and in graphs:
/// the resident tokens.
#[test]
fn preemption_and_chunked_prefill_under_the_expert_cache_give_the_resident_tokens() {
    let cpu = slow_cpu();
    let files = open_model("dummy:tiny-qwen3-moe").unwrap();
    let small = |graphs: bool, offload| EngineConfig {
        max_tokens_per_step: 32,
        kv: KvSizing::Blocks(8),
        graphs: graphs.then_some(GraphConfig {
            decode: BucketPolicy::PowersOfTwo { max: 4 },
            mixed: BucketPolicy::SglangLike { max: 32 },
            verify: 0,
        }),
        ..config(graphs, offload)
    };
    let (want, _) = run_files(&cpu, &files, &config(false, None)).unwrap();
    let bytes: Vec<usize> = order(&files.config)
        .weights()
        .iter()
        .map(|w| w.bytes)
        .collect();
    let floor = offload::experts::layout(&files.config, &bytes, usize::MAX, 32)
        .unwrap()
        .floor_bytes;
    for graphs in [false, true] {
        let oc = Some(OffloadConfig {
            budget: WeightBudget::Bytes(floor),
            policy: Policy::Experts,
            expert_prefetch: false,
        });
        let Engine { mut runner, .. } =
            Engine::new(&cpu, files.clone(), &small(graphs, oc), &NoProgress).unwrap();
        let (got, preemptions) = scheduled(&mut runner, &prompts());
        assert_eq!(got, want, "graphs {graphs}");
        assert!(preemptions > 0, "graphs {graphs}: no preemption");
        let s = runner.expert_stats().unwrap().unwrap();
        assert!(s.misses > 0, "{s:?}");
    }
}
