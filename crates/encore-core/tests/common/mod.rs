//! Set-up shared by encore-core's test files; not every file uses every helper. Here:
//! the tiny runner of the runner-level tests (`graph.rs`, `graph_memory.rs`,
//! `piecewise.rs`, `engine.rs`, ...); in [`checkpoint`], seeded values and safetensors
//! checkpoints; in [`temp_dir`], a directory removed on drop.
#![allow(dead_code)]

pub mod checkpoint;
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
    let w = weights::load(
        be,
        &cfg,
        WeightSource::Dummy { seed: 3 },
        DType::F32,
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
