//! The runner's check, for any backend: captured decode graphs replayed against eager
//! steps (the kernel checks live in `encore_backend::testing`).

use rand::Rng;

use crate::backend::Backend;
use crate::error::Result;
use crate::graph::BucketPolicy;
use crate::kv::SeqId;
use crate::model::llama::Model;
use crate::model::open_model;
use crate::model::weights::{self, WeightSource};
use crate::request::SamplingParams;
use crate::runner::{Runner, RunnerConfig, SeqStep, Seqs};
use crate::tensor::DType;
use crate::testing::compare::{
    allowed_sample_mismatches, normalized_error, token_mismatches, CheckResult,
};
use crate::testing::inputs::rng;

/// The model [`check_capture_replay`] runs, its KV block size, and its runners' sizes.
const REPLAY_MODEL: &str = "dummy:tiny";
const REPLAY_BLOCK: usize = 4;
const REPLAY_MAX_SEQS: usize = 4;
const REPLAY_MAX_LEN: usize = 64;
/// Sequences of the replay check: greedy, top-k + top-p, plain temperature.
const REPLAY_SEQS: usize = 3;
/// Sequences per decode step. Buckets 1, 2, 4: 4 (capture, one padding row), 4 (replay),
/// 2 (capture), 4 (replay), 1 (capture), 2 (replay).
const REPLAY_DECODE: [usize; 6] = [3, 3, 2, 3, 1, 2];

/// The real runner on the `dummy:tiny` model (random weights from `seed`), f32 and bf16
/// (and bf16 over an FP8 KV cache: its shapes read `kv=fp8`), eagerly and in graph mode (buckets 1, 2, 4) side by side: one prefill step of three
/// prompts of random lengths, then decode steps of 3, 3, 2, 3, 1 and 2 sequences, so each
/// bucket is captured on its first step and replayed after that, with padding rows. Both
/// runners are fed the eager runner's tokens. One sequence samples greedily with a
/// repetition penalty, one with min-p, top-k, top-p and all three penalties (counted
/// inside the graphs), one at temperature 1. Compared at every step: the logits (normalised
/// error over the batch) and the greedy and sampled tokens; and at the end, that every
/// decode step ran a graph.
///
/// On the CPU the two runs must be bit-identical. Elsewhere a bucket's GEMMs may pick
/// other algorithms than the unpadded batch's: logits agree within the tolerance of
/// `Runner::set_verify_graphs` (f32 1e-4, bf16 3e-2), and tokens exactly when the logits
/// are bit-identical, else within [`allowed_sample_mismatches`].
pub fn check_capture_replay(backend: &dyn Backend, seed: u64) -> Result<Vec<CheckResult>> {
    let mut rng = rng(seed);
    let mut results = Vec::new();
    for (dtype, kv) in [
        (DType::F32, None),
        (DType::BF16, None),
        (DType::BF16, Some(DType::F8E4M3)),
    ] {
        results.extend(check_replay_dtype(backend, dtype, kv, seed, &mut rng)?);
    }
    Ok(results)
}

/// A runner of the replay check with the blocks and penalty slots its steps read.
struct Side<'b> {
    runner: Runner<'b>,
    seqs: Seqs,
}

impl Side<'_> {
    fn step(&mut self, batch: &[SeqStep<'_>]) -> Result<(Vec<u32>, Vec<Vec<f32>>)> {
        self.runner.step_with_logits(&mut self.seqs, batch)
    }
}

/// The replay check's sampling per sequence: greedy with a repetition penalty; min-p,
/// top-k, top-p and all three penalties; temperature 1. Seeds drawn from `rng`.
fn replay_sampling(rng: &mut impl Rng) -> Vec<SamplingParams> {
    [
        (0.0, 0, 1.0, 0.0, [1.5, 0.0, 0.0]),
        (0.8, 20, 0.9, 0.05, [1.3, 0.2, 0.3]),
        (1.0, 0, 1.0, 0.0, [1.0, 0.0, 0.0]),
    ]
    .into_iter()
    .map(
        |(temperature, top_k, top_p, min_p, [rep, freq, pres])| SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            seed: rng.random(),
            repetition_penalty: rep,
            frequency_penalty: freq,
            presence_penalty: pres,
            logprobs: None,
            prompt_logprobs: None,
        },
    )
    .collect()
}

/// [`check_capture_replay`] in one dtype, over a KV cache of `kv` (`None`: the dtype).
fn check_replay_dtype(
    backend: &dyn Backend,
    dtype: DType,
    kv: Option<DType>,
    seed: u64,
    rng: &mut impl Rng,
) -> Result<Vec<CheckResult>> {
    let exact = backend.device_name() == "cpu";
    let mut eager = replay_runner(backend, dtype, kv, seed, false)?;
    let mut graph = replay_runner(backend, dtype, kv, seed, true)?;
    let kv_tag = kv.map_or(String::new(), |k| format!("kv={} ", kv_name(k)));
    let vocab = eager.runner.model().cfg.vocab_size as u32;
    let logits_tol = match (exact, dtype) {
        (true, _) => 0.0,
        (false, DType::F32) => 1e-4,
        (false, _) => 3e-2,
    };
    let sampling = replay_sampling(rng);
    // Prompts of at least 2 tokens (a 1-token prompt would be a decode step).
    let prompts: Vec<Vec<u32>> = (0..REPLAY_SEQS)
        .map(|_| {
            let len = rng.random_range(2..=12);
            (0..len).map(|_| rng.random_range(0..vocab)).collect()
        })
        .collect();
    for side in [&mut eager, &mut graph] {
        for (s, p) in prompts.iter().enumerate() {
            side.seqs.blocks.allocate(SeqId(s as u64), p.len())?;
            if sampling[s].has_penalties() {
                side.seqs
                    .begin_penalties(&side.runner, SeqId(s as u64), p, &[])?;
            }
        }
    }
    let prefill: Vec<SeqStep<'_>> = prompts
        .iter()
        .enumerate()
        .map(|(s, p)| SeqStep {
            masked: false,
            score: None,
            verify: false,
            logit_bias: &[],
            seq: SeqId(s as u64),
            tokens: p,
            sampling: sampling[s],
        })
        .collect();
    let (mut last, want) = eager.step(&prefill)?;
    let (_, got) = graph.step(&prefill)?;
    let tokens: usize = prompts.iter().map(Vec::len).sum();
    let mut results = vec![CheckResult::new(
        "capture replay prefill: logits",
        format!("{kv_tag}{REPLAY_SEQS} prompts, {tokens} tokens"),
        dtype,
        logits_error(&got, &want, REPLAY_SEQS),
        logits_tol,
    )];
    for round in 0..REPLAY_DECODE.len() {
        let round = ReplayRound {
            round,
            dtype,
            exact,
            logits_tol,
            sampling: &sampling,
            kv_tag: &kv_tag,
        };
        results.extend(round.run(&mut eager, &mut graph, &mut last)?);
    }
    results.push(graph_steps_result(&graph.runner, dtype, &kv_tag));
    Ok(results)
}

/// A KV cache dtype as `--kv-cache-dtype` names it.
fn kv_name(kv: DType) -> String {
    match kv {
        DType::F8E4M3 => "fp8".into(),
        other => other.to_string(),
    }
}

/// One decode step of the replay check on both sides.
struct ReplayRound<'a> {
    round: usize,
    dtype: DType,
    exact: bool,
    logits_tol: f64,
    sampling: &'a [SamplingParams],
    /// `kv=fp8 ` over an FP8 cache, else empty: the start of every shape.
    kv_tag: &'a str,
}

impl ReplayRound<'_> {
    /// Decode `REPLAY_DECODE[round]` sequences from `last` (the eager side's tokens, which
    /// it advances) on both sides; compare logits and tokens.
    fn run<'b>(
        &self,
        eager: &mut Side<'b>,
        graph: &mut Side<'b>,
        last: &mut [u32],
    ) -> Result<Vec<CheckResult>> {
        let (round, dtype) = (self.round, self.dtype);
        let b = REPLAY_DECODE[round];
        let active: Vec<usize> = (0..b).map(|k| (k + round) % REPLAY_SEQS).collect();
        for side in [&mut *eager, &mut *graph] {
            for &s in &active {
                side.seqs.blocks.append(SeqId(s as u64), 1)?;
            }
        }
        let inputs: Vec<[u32; 1]> = active.iter().map(|&s| [last[s]]).collect();
        let batch: Vec<SeqStep<'_>> = active
            .iter()
            .zip(&inputs)
            .map(|(&s, t)| SeqStep {
                masked: false,
                score: None,
                verify: false,
                logit_bias: &[],
                seq: SeqId(s as u64),
                tokens: t,
                sampling: self.sampling[s],
            })
            .collect();
        let (want_tokens, want) = eager.step(&batch)?;
        let (got_tokens, got) = graph.step(&batch)?;

        let buckets = BucketPolicy::PowersOfTwo {
            max: REPLAY_MAX_SEQS,
        };
        let shape = format!(
            "{}b={b} bucket={}",
            self.kv_tag,
            buckets.bucket_for(b).unwrap_or(b)
        );
        let label = |what: &str| format!("capture replay #{round}: {what}");
        let mut results = vec![CheckResult::new(
            label("logits"),
            shape.clone(),
            dtype,
            logits_error(&got, &want, b),
            self.logits_tol,
        )];
        let ids = |t: &[u32]| t.iter().map(|&t| t as i32).collect::<Vec<i32>>();
        let rows_greedy: Vec<bool> = active
            .iter()
            .map(|&s| self.sampling[s].temperature <= 0.0)
            .collect();
        let (random, exact_rows) =
            token_mismatches(&ids(&got_tokens), &ids(&want_tokens), &rows_greedy);
        let allowed = if self.exact || got.get(..b) == want.get(..b) {
            0
        } else {
            allowed_sample_mismatches(b)
        };
        for (what, differ) in [("greedy tokens", exact_rows), ("sampled tokens", random)] {
            results.push(CheckResult::new(
                label(what),
                shape.clone(),
                dtype,
                differ as f64,
                allowed as f64,
            ));
        }
        for (&s, &t) in active.iter().zip(&want_tokens) {
            last[s] = t;
        }
        Ok(results)
    }
}

/// Every decode step of the replay check ran a graph, and each bucket was captured once.
fn graph_steps_result(graph: &Runner<'_>, dtype: DType, kv_tag: &str) -> CheckResult {
    let buckets = BucketPolicy::PowersOfTwo {
        max: REPLAY_MAX_SEQS,
    };
    let decode_steps = REPLAY_DECODE.len();
    let mut used: Vec<usize> = REPLAY_DECODE
        .iter()
        .filter_map(|&b| buckets.bucket_for(b))
        .collect();
    used.sort_unstable();
    used.dedup();
    let (graph_steps, captures) = graph
        .graph_stats()
        .map_or((0, 0), |s| (s.hits + s.misses, s.captures));
    CheckResult::new(
        "capture replay: graph steps",
        format!(
            "{kv_tag}{graph_steps}/{decode_steps} steps, {captures}/{} captures",
            used.len()
        ),
        dtype,
        (decode_steps.abs_diff(graph_steps) + used.len().abs_diff(captures)) as f64,
        0.0,
    )
}

/// An eager or graph-mode runner of [`REPLAY_MODEL`] with dummy weights from `seed`, and
/// the blocks and penalty slots its steps read.
fn replay_runner(
    be: &dyn Backend,
    dtype: DType,
    kv_dtype: Option<DType>,
    seed: u64,
    graph: bool,
) -> Result<Side<'_>> {
    let cfg = open_model(REPLAY_MODEL)?.config;
    let weights = weights::load(
        be,
        &cfg,
        WeightSource::Dummy { seed },
        dtype,
        &crate::progress::NoProgress,
    )?;
    let model = Model::new(be, cfg, weights, REPLAY_MAX_LEN)?;
    let mut runner = Runner::new(
        be,
        model,
        RunnerConfig {
            block_size: REPLAY_BLOCK,
            num_blocks: 1 + REPLAY_MAX_SEQS * REPLAY_MAX_LEN.div_ceil(REPLAY_BLOCK),
            max_tokens_per_step: REPLAY_SEQS * 12,
            max_seqs: REPLAY_MAX_SEQS,
            max_seq_len: REPLAY_MAX_LEN,
            penalty_slots: REPLAY_MAX_SEQS,
            kv_dtype,
        },
    )?;
    if graph {
        runner.set_graph_mode(Some(BucketPolicy::PowersOfTwo {
            max: REPLAY_MAX_SEQS,
        }));
    }
    let seqs = Seqs::for_runner(&runner)?;
    Ok(Side { runner, seqs })
}

/// [`normalized_error`] of the first `rows` logits rows of a step, all at once (NaN when
/// either has fewer). A graph step's logits also hold its bucket's padding rows.
fn logits_error(got: &[Vec<f32>], want: &[Vec<f32>], rows: usize) -> f64 {
    if got.len() < rows || want.len() < rows {
        return f64::NAN;
    }
    let flat = |rows: &[Vec<f32>]| -> Vec<f64> {
        rows.iter()
            .flat_map(|r| r.iter().map(|&v| f64::from(v)))
            .collect()
    };
    normalized_error(&flat(&got[..rows]), &flat(&want[..rows]))
}
