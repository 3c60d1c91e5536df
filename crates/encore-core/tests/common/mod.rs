//! Set-up shared by encore-core's test files; not every file uses every helper. Here:
//! the tiny runner of the runner-level tests (`graph.rs`, `graph_memory.rs`,
//! `piecewise.rs`, `engine.rs`, ...); in [`checkpoint`], seeded values and safetensors
//! checkpoints, and in [`packed`] those packed in integers; in [`gpt_oss`], small gpt-oss configs; in [`temp_dir`], a directory removed on drop; in [`hooked`], a CPU backend
//! whose ops a test can break.
#![allow(dead_code)]

pub mod checkpoint;
pub mod gpt_oss;
pub mod hooked;
pub mod packed;
pub mod temp_dir;

use encore_core::graph::BucketPolicy;
use encore_core::kv::SeqId;
use encore_core::memory::GraphMemory;
use encore_core::model::config::ModelConfig;
use encore_core::model::llama::Model;
use encore_core::model::weights::{self, WeightSource};
use encore_core::request::{Request, RequestParams, SamplingParams};
use encore_core::runner::{Runner, RunnerConfig, SeqStep, Seqs};
use encore_core::{Backend, DType};

/// `size` CPU ranks of one tensor-parallel group: rank 0's backend (the engine's) and
/// the group for `EngineConfig::tp` (empty for one rank, which runs alone).
pub fn cpu_group(
    size: usize,
) -> (
    encore_core::backend::BackendRef,
    encore_core::engine::TpBackends,
) {
    let ranks: Vec<encore_core::backend::BackendRef> =
        encore_core::backend::cpu::CpuBackend::group(size)
            .into_iter()
            .map(|b| std::sync::Arc::new(b) as encore_core::backend::BackendRef)
            .collect();
    let leader = ranks[0].clone();
    let tp = encore_core::engine::TpBackends(if size > 1 { ranks } else { vec![] });
    (leader, tp)
}

/// KV block size of the test runner.
pub const BLOCK: usize = 4;

/// A `tiny-qwen2` f32 runner: 16 sequences of up to 128 tokens, eager.
pub fn tiny_runner(be: &dyn Backend) -> Runner<'_> {
    tiny_runner_with_blocks(be, 1 + 16 * (128 / BLOCK))
}

/// [`tiny_runner`] with a KV cache of `num_blocks` blocks (one is the null block).
pub fn tiny_runner_with_blocks(be: &dyn Backend, num_blocks: usize) -> Runner<'_> {
    Runner::new(be, tiny_model(be), tiny_config(num_blocks)).unwrap()
}

/// [`tiny_runner`] with captured graphs' memory held per `strategy`.
pub fn tiny_runner_with_memory(be: &dyn Backend, strategy: GraphMemory) -> Runner<'_> {
    let cfg = tiny_config(1 + 16 * (128 / BLOCK));
    Runner::with_graph_memory(be, tiny_model(be), cfg, strategy).unwrap()
}

/// The sizes of [`tiny_runner`], with `num_blocks` KV blocks.
pub fn tiny_config(num_blocks: usize) -> RunnerConfig {
    RunnerConfig {
        block_size: BLOCK,
        num_blocks,
        max_tokens_per_step: 256,
        max_seqs: 16,
        max_seq_len: 128,
        penalty_slots: 16,
        kv_dtype: None,
    }
}

/// The bucket policy both test files capture with.
pub fn buckets() -> BucketPolicy {
    BucketPolicy::parse("buckets", "1,2,4,8,16", 16, BucketPolicy::None).unwrap()
}

/// One decode step of sequences `SeqId(0)..SeqId(last.len())` of `seqs`, each fed its
/// last token (one slot appended first); returns the sampled tokens.
pub fn decode_step(
    r: &mut Runner<'_>,
    seqs: &mut Seqs,
    last: &[u32],
    sampling: SamplingParams,
) -> Vec<u32> {
    let toks: Vec<[u32; 1]> = last.iter().map(|&t| [t]).collect();
    let active: Vec<usize> = (0..last.len()).collect();
    let batch = decode_batch(&mut [seqs], &active, &toks, sampling);
    r.step(seqs, &batch).unwrap()
}

/// The distinct sequences `(k * stride + step_no) % n` for `k < bsz`, in order: the
/// decode batch of step `step_no` of a varying-batch schedule.
pub fn active_set(bsz: usize, stride: usize, step_no: usize, n: usize) -> Vec<usize> {
    (0..bsz)
        .map(|k| (k * stride + step_no) % n)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// A decode step of the sequences `active` (`SeqId(i)`), the k-th fed `toks[k]`, with one
/// slot appended to each in every one of `all`.
pub fn decode_batch<'a>(
    all: &mut [&mut Seqs],
    active: &[usize],
    toks: &'a [[u32; 1]],
    sampling: SamplingParams,
) -> Vec<SeqStep<'a>> {
    for s in all.iter_mut() {
        for &i in active {
            s.blocks.append(SeqId(i as u64), 1).unwrap();
        }
    }
    active
        .iter()
        .zip(toks)
        .map(|(&i, t)| SeqStep {
            seq: SeqId(i as u64),
            tokens: t,
            sampling,
            masked: false,
            score: None,
            verify: false,
            logit_bias: &[],
        })
        .collect()
}

/// Prefill `prompt` as `SeqId(i)` on both runners (each with its sequences); they must
/// sample the same token, which is returned.
pub fn prefill_both(
    (a, a_seqs): (&mut Runner<'_>, &mut Seqs),
    (b, b_seqs): (&mut Runner<'_>, &mut Seqs),
    i: usize,
    prompt: &[u32],
    sampling: SamplingParams,
) -> u32 {
    for s in [&mut *a_seqs, &mut *b_seqs] {
        s.blocks.allocate(SeqId(i as u64), prompt.len()).unwrap();
    }
    let step = [SeqStep {
        seq: SeqId(i as u64),
        tokens: prompt,
        sampling,
        masked: false,
        score: None,
        verify: false,
        logit_bias: &[],
    }];
    let x = a.step(a_seqs, &step).unwrap();
    let y = b.step(b_seqs, &step).unwrap();
    assert_eq!(x, y, "prefill of seq {i}");
    x[0]
}

/// The model of [`tiny_runner`] alone (for runners of another configuration).
pub fn tiny_model(be: &dyn Backend) -> Model {
    dummy_model(be, ModelConfig::dummy("tiny-qwen2").unwrap(), 128)
}

/// The f32 model of `cfg` with the dummy weights of seed 3, for `max_seq_len` tokens.
pub fn dummy_model(be: &dyn Backend, cfg: ModelConfig, max_seq_len: usize) -> Model {
    dummy_model_in(be, cfg, max_seq_len, DType::F32)
}

/// [`dummy_model`] run in `dtype`.
pub fn dummy_model_in(
    be: &dyn Backend,
    cfg: ModelConfig,
    max_seq_len: usize,
    dtype: DType,
) -> Model {
    let w = weights::load(
        be,
        &cfg,
        WeightSource::Dummy { seed: 3 },
        dtype,
        &encore_core::progress::NoProgress,
    )
    .unwrap();
    Model::new(be, cfg, w, max_seq_len).unwrap()
}

/// Greedy tokens (temperature 0, no top-k or top-p) that `generate` gives each of
/// `prompts`: at most `max_tokens` new ones, stopping at `eos` unless `ignore_eos`.
pub fn generate_greedy(
    runner: &mut Runner<'_>,
    prompts: &[Vec<u32>],
    eos: &[u32],
    max_tokens: usize,
    ignore_eos: bool,
) -> Vec<Vec<u32>> {
    let opts = encore_core::generate::GenerateOptions {
        max_tokens,
        sampling: encore_core::request::SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
            ..Default::default()
        },
        ignore_eos,
    };
    encore_core::generate::generate(
        runner,
        prompts,
        eos,
        &opts,
        &encore_core::progress::NoProgress,
        |_, _| std::ops::ControlFlow::Continue(()),
    )
    .unwrap()
    .into_iter()
    .map(|g| g.output_ids)
    .collect()
}

/// Request `id` for `prompt`: `max_tokens` new tokens sampled per `sampling`, ending at EOS,
/// no stop tokens, refused (not fitted) when too long.
pub fn request(id: u64, prompt: Vec<u32>, sampling: SamplingParams, max_tokens: usize) -> Request {
    Request {
        id,
        prompt,
        params: RequestParams {
            sampling,
            max_tokens,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            fit_context: false,
            constraint: None,
            share_prompt: None,
            logit_bias: Vec::new(),
        },
    }
}

/// Run `reqs` through a scheduler on `r` to the end: each request's tokens.
pub fn run_requests(
    r: &mut Runner<'_>,
    reqs: &[Request],
) -> std::collections::HashMap<u64, Vec<u32>> {
    use encore_core::scheduler::{Scheduler, SchedulerConfig};
    let mut s = Scheduler::new(SchedulerConfig::new(64, 8), r).unwrap();
    for q in reqs {
        s.add(q.clone(), r).unwrap();
    }
    let mut out: std::collections::HashMap<u64, Vec<u32>> = Default::default();
    let mut steps = 0;
    while s.has_work() {
        for o in s.step(r).unwrap() {
            out.entry(o.id).or_default().push(o.token);
        }
        assert_eq!(s.take_failed(), Vec::new());
        steps += 1;
        assert!(steps < 10_000, "no progress");
    }
    out
}

/// Logit biases on `be`, eager and replayed from graphs: a +100 bias forces its token, a
/// -100 bias bans the token greedy decoding picked, and requests without biases in the
/// same batches give the tokens they give alone; too many, out-of-vocabulary or
/// non-finite biases are refused at admission naming `logit_bias`.
pub fn check_logit_bias(be: &dyn Backend) {
    use encore_core::graph::BucketPolicy;
    use encore_core::request::{Param, MAX_LOGIT_BIAS};
    use encore_core::runner::GraphConfig;
    let greedy = |id: u64| {
        let prompt = (0..5).map(|j| ((id * 31 + j * 11) % 200) as u32).collect();
        request(id, prompt, SamplingParams::default(), 12)
    };
    for graphs in [false, true] {
        let mut r = tiny_runner(be);
        if graphs {
            r.set_graphs(Some(GraphConfig {
                decode: buckets(),
                mixed: BucketPolicy::SglangLike { max: 256 },
                verify: 0,
            }));
        }
        let plain: Vec<Request> = (10..13).map(greedy).collect();
        let alone = run_requests(&mut r, &plain);
        let mut forced = greedy(1);
        forced.params.logit_bias = vec![(65, 100.0), (3, -5.0)];
        let mut banned = greedy(2);
        let first = alone[&10][0];
        banned.prompt = plain[0].prompt.clone();
        banned.params.logit_bias = vec![(first, -100.0)];
        let mut mixed = plain.clone();
        mixed.extend([forced, banned]);
        let together = run_requests(&mut r, &mixed);
        let what = if graphs { "graphs" } else { "eager" };
        assert_eq!(together[&1], vec![65; 12], "{what}");
        assert!(!together[&2].contains(&first), "{what}: {:?}", together[&2]);
        for q in &plain {
            assert_eq!(together[&q.id], alone[&q.id], "{what}: request {}", q.id);
        }
        if graphs {
            assert!(r.graph_stats().unwrap().hits > 5);
        }
    }
    let r = tiny_runner(be);
    let vocab = r.model().cfg.vocab_size as u32;
    let s = encore_core::scheduler::Scheduler::new(
        encore_core::scheduler::SchedulerConfig::new(64, 8),
        &r,
    )
    .unwrap();
    let limits = s.limits(&r);
    for bias in [
        vec![(vocab, 1.0)],
        vec![(1, f32::NAN)],
        (0..MAX_LOGIT_BIAS as u32 + 1).map(|t| (t, 1.0)).collect(),
    ] {
        let mut q = greedy(3);
        q.params.logit_bias = bias;
        let e = limits.check(&q).unwrap_err();
        assert_eq!(e.param, Param::LogitBias, "{}", e.message);
    }
}

/// The f64 log-softmax of `logits`.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let m = logits
        .iter()
        .fold(f64::NEG_INFINITY, |a, &l| a.max(l as f64));
    let lse = m + logits
        .iter()
        .map(|&l| (l as f64 - m).exp())
        .sum::<f64>()
        .ln();
    logits.iter().map(|&l| l as f64 - lse).collect()
}

/// The log-softmax after each prefix `prompt[..=p]`, one token a step (teacher forcing).
fn teacher_forced(be: &dyn Backend, prompt: &[u32]) -> Vec<Vec<f64>> {
    teacher_forced_on(&mut tiny_runner(be), prompt, 1)
}

/// Teacher forcing on `r` (a fresh runner): `tokens[..first]` in one step, then one token
/// a step; the log-softmax of the next-token logits after each prefix `tokens[..first]`,
/// `tokens[..=first]`, ..., the whole of `tokens`.
pub fn teacher_forced_on(r: &mut Runner<'_>, tokens: &[u32], first: usize) -> Vec<Vec<f64>> {
    let mut seqs = Seqs::for_runner(r).unwrap();
    let seq = SeqId(0);
    seqs.blocks.allocate(seq, first).unwrap();
    let mut rows = Vec::new();
    let mut chunk = &tokens[..first];
    for p in first..=tokens.len() {
        let step = [SeqStep {
            seq,
            tokens: chunk,
            sampling: SamplingParams::default(),
            masked: false,
            score: None,
            verify: false,
            logit_bias: &[],
        }];
        let (_, logits) = r.step_with_logits(&mut seqs, &step).unwrap();
        rows.push(log_softmax(&logits[0]));
        if p < tokens.len() {
            seqs.blocks.append(seq, 1).unwrap();
            chunk = &tokens[p..=p];
        }
    }
    rows
}

/// Prompt log-probabilities on `be` (`SamplingParams::prompt_logprobs`) against teacher
/// forcing: each prompt token's after the first, and the top entries there, within `tol`;
/// with the prompt in chunks of at most 8 and 16 scored rows, beside a plain request, after
/// the same prompt was cached (a scored prompt is computed whole), and through
/// preemption (a cache too small for both scored prompts at once).
pub fn check_prompt_logprobs(be: &dyn Backend, tol: f64) {
    use encore_core::scheduler::{Scheduler, SchedulerConfig};
    const TOP: usize = 3;
    let prompt: Vec<u32> = (0..37u32).map(|j| (j * 13 + 5) % 250).collect();
    let want = teacher_forced(be, &prompt);
    let check = |what: &str, got: &[encore_core::request::TokenLogprobs]| {
        assert_eq!(
            got.len(),
            prompt.len() - 1,
            "{what}: one per token after the first"
        );
        for (p, lp) in got.iter().enumerate() {
            let row = &want[p];
            let t = prompt[p + 1] as usize;
            assert!(
                (lp.logprob as f64 - row[t]).abs() < tol,
                "{what}: token {}: {} vs {}",
                p + 1,
                lp.logprob,
                row[t]
            );
            assert_eq!(lp.top.len(), TOP, "{what}");
            let mut sorted = row.clone();
            sorted.sort_by(|a, b| b.partial_cmp(a).unwrap());
            for (k, &(id, v)) in lp.top.iter().enumerate() {
                assert!(
                    (v as f64 - row[id as usize]).abs() < tol,
                    "{what}: top {k} at {}",
                    p + 1
                );
                assert!(
                    (v as f64 - sorted[k]).abs() < tol,
                    "{what}: top {k} at {} is the {k}-th largest",
                    p + 1
                );
            }
        }
    };
    for (max_seqs, blocks) in [
        (8, 1 + 16 * (128 / BLOCK)),
        (16, 1 + 16 * (128 / BLOCK)),
        (8, 1 + 14),
    ] {
        let mut r = tiny_runner_with_blocks(be, blocks);
        let mut s = Scheduler::new(SchedulerConfig::new(64, max_seqs), &r).unwrap();
        let scored = |id: u64| {
            let sampling = SamplingParams {
                prompt_logprobs: Some(TOP),
                ..Default::default()
            };
            request(id, prompt.clone(), sampling, 3)
        };
        // The prompt cached first, by a plain request that runs to the end.
        s.add(request(1, prompt.clone(), SamplingParams::default(), 2), &r)
            .unwrap();
        while s.has_work() {
            s.step(&mut r).unwrap();
        }
        s.add(scored(2), &r).unwrap();
        s.add(
            request(3, (0..9).collect(), SamplingParams::default(), 12),
            &r,
        )
        .unwrap();
        s.add(scored(4), &r).unwrap();
        let mut firsts = std::collections::HashMap::new();
        let mut steps = 0;
        while s.has_work() {
            for o in s.step(&mut r).unwrap() {
                let first = !firsts.contains_key(&o.id);
                if first {
                    firsts.insert(o.id, o.prompt_logprobs.clone());
                } else {
                    assert_eq!(
                        o.prompt_logprobs, None,
                        "only the first output carries them"
                    );
                }
            }
            assert_eq!(s.take_failed(), Vec::new());
            steps += 1;
            assert!(steps < 1_000, "no progress");
        }
        let what = format!("max_seqs {max_seqs}, {blocks} blocks");
        check(
            &format!("{what}, request 2"),
            firsts[&2].as_deref().expect("asked for"),
        );
        check(
            &format!("{what}, request 4"),
            firsts[&4].as_deref().expect("asked for"),
        );
        assert_eq!(firsts[&3], None, "{what}: not asked for");
        if blocks < 20 {
            assert!(
                s.stats().preemptions > 0,
                "{what}: the small cache preempts"
            );
        }
    }
}
