//! `encore bench decode`: decode-step latency for a model at several batch sizes, eager
//! and replayed from a captured graph, beside the bandwidth floor (weight bytes / measured
//! device copy bandwidth), with the capture time. The prefill and timed-step helpers
//! are shared with `encore bench offload`.

use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use encore_core::bench;
use encore_core::engine::{Engine, EngineConfig, KvSizing};
use encore_core::graph::BucketPolicy;
use encore_core::kv::SeqId;
use encore_core::memory::GraphMemory;
use encore_core::model::config::ModelConfig;
use encore_core::model::routing::RoutingTable;
use encore_core::model::weights::WeightSource;
use encore_core::model::ModelFiles;
use encore_core::request::SamplingParams;
use encore_core::runner::{GraphConfig, Runner, SeqStep, Seqs};
use encore_core::{Backend, DType};

use encore_core::offload::{ExpertStats, OffloadConfig};

use crate::model_arg::ModelArgs;
use crate::offload_arg::{self, OffloadArg};
use crate::out::outln;
use crate::parse;

/// Bytes of each buffer of the copy-bandwidth measurement.
const COPY_BYTES: usize = 256 << 20;

#[derive(Args)]
pub struct BenchDecodeArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    runs: DecodeRuns,
    #[command(flatten)]
    offload: OffloadArg,
    /// One JSON object per batch size.
    #[arg(long)]
    json: bool,
    /// Time eager steps only (no graph capture).
    #[arg(long)]
    eager: bool,
    /// Also time capturing every bucket of the default (vLLM-like) policy up to the
    /// largest batch, largest first, as a warm-up at start-up would.
    #[arg(long)]
    capture_all: bool,
    /// How captured graphs share intermediate memory: private | multi-va | arena.
    #[arg(long, default_value = "arena")]
    graph_memory: GraphMemory,
    /// A mixture of experts: route every sparse layer by a seeded table instead of its
    /// router, each token's experts drawn from a Zipf law of this exponent over the
    /// experts (0: uniform); the floor then counts the experts each batch reaches. Random
    /// weights route as no trained model does.
    #[arg(long, value_parser = parse::router_skew, allow_negative_numbers = true)]
    router_skew: Option<encore_core::model::routing::RouterSkew>,
    /// Under --router-skew with --expert-prefetch: the share of each layer's chosen
    /// experts the prefetch predicts (0..=1; default 0.8, an assumption: the table has no
    /// router to apply a layer early). A model's own routers predict as well as they do.
    #[arg(
        long,
        requires_all = ["router_skew", "expert_prefetch"],
        allow_negative_numbers = true
    )]
    prefetch_accuracy: Option<f64>,
    /// Also time speculative decoding's verify step with this many drafts per sequence
    /// (comma-separated, each 1..=16) after each batch's decode steps: the step that
    /// scores the last token and k drafts (its verify graph, or eager with --eager),
    /// against the decode step.
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true, value_parser = parse::count::<1, 16>)]
    speculative: Vec<usize>,
    /// What the KV cache stores: auto (the run dtype) or fp8 (E4M3, scales 1).
    #[arg(long, default_value = "auto", value_name = "auto|fp8|DTYPE", value_parser = parse::kv_cache_dtype)]
    kv_cache_dtype: parse::KvCacheDtype,
}

/// The largest `--batch`.
pub(crate) const MAX_BATCH: usize = 1 << 24;

/// Untimed decode steps before the timed ones.
pub(crate) const WARMUP: usize = 3;

/// Positions a sequence needs for `context` prefilled tokens then `phases` runs of
/// [`WARMUP`] + `steps` decode steps.
pub(crate) fn positions(context: usize, steps: usize, phases: usize) -> usize {
    context + phases * (WARMUP + steps) + 1
}

/// `--batch`, `--context` and `--steps`: the decode runs `bench decode` and `bench offload`
/// time (`bench offload` gives other defaults with `#[command(mut_arg(...))]`).
#[derive(Args)]
pub(crate) struct DecodeRuns {
    /// Batch sizes, comma-separated, each >= 1.
    #[arg(
        long,
        default_value = "1,8,32,128,256",
        value_delimiter = ',',
        value_parser = parse::count::<1, { MAX_BATCH }>,
        allow_negative_numbers = true
    )]
    pub batch: Vec<usize>,
    /// Tokens already in each sequence's cache when the timed steps start (1..=2048: one
    /// prefill step per sequence).
    #[arg(long, default_value = "128", value_parser = parse::count::<1, 2048>, allow_negative_numbers = true)]
    pub context: usize,
    /// Timed decode steps per row (after 3 warm-up steps); the median is reported.
    #[arg(long, default_value = "20", value_parser = parse::count::<1, 100_000>, allow_negative_numbers = true)]
    pub steps: usize,
}

impl DecodeRuns {
    /// The largest `--batch`; refused when none is given.
    pub(crate) fn max_batch(&self) -> Result<usize> {
        if self.batch.is_empty() {
            bail!("--batch: give at least one batch size");
        }
        Ok(self.batch.iter().copied().max().unwrap_or(1))
    }

    /// The positions of `--context` then an eager and a graph phase of `--steps` (each
    /// appends warm-up + steps tokens), refused beyond the model's positions.
    pub(crate) fn eager_and_graph_positions(&self, cfg: &ModelConfig) -> Result<usize> {
        let (context, steps) = (self.context, self.steps);
        let max_seq_len = positions(context, steps, 2);
        if max_seq_len > cfg.max_position_embeddings {
            bail!(
                "--context {context} with --steps {steps} needs {max_seq_len} positions; the model has {}",
                cfg.max_position_embeddings
            );
        }
        Ok(max_seq_len)
    }
}

/// An eager-capable engine configuration for decode benchmarks: `max_batch` sequences of
/// `max_seq_len` positions (the KV cache holds exactly them), block size 16, graphs off
/// (switched per phase with [`Runner::set_graph_mode`]).
pub(crate) fn engine_config(
    dtype: DType,
    max_batch: usize,
    max_seq_len: usize,
    offload: Option<OffloadConfig>,
    run_name: String,
    fix_hint: &str,
) -> EngineConfig {
    let block_size = 16;
    let per_seq = max_seq_len.div_ceil(block_size);
    EngineConfig {
        offload,
        run_name,
        fix_hint: fix_hint.into(),
        ..EngineConfig::new(
            dtype,
            block_size,
            max_tokens(max_batch),
            max_batch,
            max_seq_len,
            KvSizing::Blocks(max_batch.saturating_mul(per_seq).saturating_add(1)),
        )
    }
}

/// Most tokens of a step of the benches' engines (prefill chunks of 2,048 tokens).
pub(crate) fn max_tokens(max_batch: usize) -> usize {
    2048.max(max_batch)
}

/// Start an engine on `be` for the model `cfg` with weights from `source`, showing
/// progress bars unless `json`.
pub(crate) fn start_engine<'b>(
    be: &'b dyn Backend,
    cfg: &ModelConfig,
    source: WeightSource,
    engine_cfg: &EngineConfig,
    json: bool,
) -> Result<Engine<'b>> {
    let files = ModelFiles {
        config: cfg.clone(),
        source,
    };
    let bars = crate::progress::Bars::new(!json);
    Ok(Engine::new(be, files, engine_cfg, &bars)?)
}

/// Allocate sequences `0..batch` and prefill `context` tokens in each (one step per
/// sequence, in the runner's current mode).
pub(crate) fn prefill(
    runner: &mut Runner<'_>,
    held: &mut Seqs,
    batch: usize,
    context: usize,
) -> Result<Vec<SeqId>> {
    let vocab = runner.model().cfg.vocab_size;
    let seqs: Vec<SeqId> = (0..batch).map(|i| SeqId(i as u64)).collect();
    let prompt: Vec<u32> = (0..context)
        .map(|i| (i * 7 + 1) as u32 % vocab as u32)
        .collect();
    for &s in &seqs {
        held.blocks.allocate(s, context)?;
        runner.step(
            held,
            &[SeqStep {
                seq: s,
                tokens: &prompt,
                sampling: SamplingParams::default(),
                masked: false,
                score: None,
                verify: false,
                logit_bias: &[],
            }],
        )?;
    }
    Ok(seqs)
}

/// What [`time_decode`] measured.
pub(crate) struct Timed {
    /// Median seconds of one step.
    pub median_s: f64,
    /// Bytes the weight offloader queued for copying during the timed steps (`None`
    /// without a budget; graph replays' copies are not seen by the host).
    pub copied_bytes: Option<u64>,
    /// The expert cache's totals over the timed steps (the experts offload policy).
    pub experts: Option<ExpertStats>,
}

/// Run [`WARMUP`] untimed then `steps` timed greedy decode steps of `seqs` (one token
/// each, starting from `last`, which ends at the last sampled tokens).
pub(crate) fn time_decode(
    runner: &mut Runner<'_>,
    held: &mut Seqs,
    seqs: &[SeqId],
    last: &mut Vec<u32>,
    steps: usize,
) -> Result<Timed> {
    let copied = |r: &Runner<'_>| r.model().offload().map(|o| o.copied_bytes());
    let mut times = Vec::with_capacity(steps);
    let mut before = None;
    let mut experts_before = None;
    for i in 0..WARMUP + steps {
        for &s in seqs {
            held.blocks.append(s, 1)?;
        }
        let toks: Vec<[u32; 1]> = last.iter().map(|&t| [t]).collect();
        let batch = greedy_steps(seqs, &toks, false);
        if i == WARMUP {
            before = copied(runner);
            experts_before = runner.expert_stats()?;
        }
        let t = Instant::now();
        *last = runner.step(held, &batch)?;
        if i >= WARMUP {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(Timed {
        median_s: times[times.len() / 2],
        copied_bytes: copied(runner).zip(before).map(|(a, b)| a.saturating_sub(b)),
        experts: runner
            .expert_stats()?
            .zip(experts_before)
            .map(|(a, b)| a.since(&b)),
    })
}

/// One greedy step per sequence of `seqs` over its `toks` (a verify chunk when `verify`).
fn greedy_steps<'a, T: AsRef<[u32]>>(
    seqs: &[SeqId],
    toks: &'a [T],
    verify: bool,
) -> Vec<SeqStep<'a>> {
    seqs.iter()
        .zip(toks)
        .map(|(&seq, tok)| SeqStep {
            seq,
            tokens: tok.as_ref(),
            sampling: SamplingParams::default(),
            masked: false,
            score: None,
            verify,
            logit_bias: &[],
        })
        .collect()
}

/// Median seconds of speculative decoding's verify step over `seqs`: each sequence's
/// last token and `k` drafts (the next ids after it) scored with a sample after each
/// (`SeqStep::verify`), then its KV cut back to one new token, as if no draft was kept.
fn time_verify(
    runner: &mut Runner<'_>,
    held: &mut Seqs,
    seqs: &[SeqId],
    last: &mut Vec<u32>,
    k: usize,
    steps: usize,
) -> Result<f64> {
    let vocab = runner.model().cfg.vocab_size as u32;
    let mut times = Vec::with_capacity(steps);
    for i in 0..WARMUP + steps {
        let mut held_tokens = Vec::with_capacity(seqs.len());
        for &s in seqs {
            held_tokens.push(held.blocks.num_tokens(s)?);
            held.blocks.append(s, 1 + k)?;
        }
        let toks: Vec<Vec<u32>> = last
            .iter()
            .map(|&t| (0..=k as u32).map(|j| (t + j) % vocab).collect())
            .collect();
        let batch = greedy_steps(seqs, &toks, true);
        let t = Instant::now();
        let out = runner.step_sampled(held, &batch)?;
        if i >= WARMUP {
            times.push(t.elapsed().as_secs_f64());
        }
        for (&s, n) in seqs.iter().zip(held_tokens) {
            held.blocks.truncate(s, n + 1)?;
        }
        *last = out
            .iter()
            .map(|o| o.verified.first().copied().unwrap_or(o.token))
            .collect();
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Free the sequences of [`prefill`].
pub(crate) fn free(held: &mut Seqs, seqs: &[SeqId]) -> Result<()> {
    for &s in seqs {
        held.blocks.free(s)?;
    }
    Ok(())
}

pub fn run(a: BenchDecodeArgs) -> Result<()> {
    let dtype = a.model.dtype;
    let (opened, cfg, source, tp) = a.model.open()?;
    let be = opened.backend();
    let be = be.as_ref();
    let max_batch = a.runs.max_batch()?;
    if let Some(oc) = a.offload.config() {
        oc.check_graphs(!a.eager)?;
    }
    let kmax = a.speculative.iter().copied().max().unwrap_or(0);
    // Each verify phase appends warm-up + steps tokens, k more at its peak.
    let max_seq_len = a.runs.eager_and_graph_positions(&cfg)?
        + a.speculative.len() * (WARMUP + a.runs.steps)
        + kmax;
    if max_seq_len > cfg.max_position_embeddings {
        bail!(
            "--speculative with --context {} and --steps {} needs {max_seq_len} positions; the model has {}",
            a.runs.context,
            a.runs.steps,
            cfg.max_position_embeddings
        );
    }
    let offload = a.offload.config();
    let router_skew = match (a.router_skew, a.prefetch_accuracy) {
        (Some(s), Some(p)) => Some(s.with_prefetch_accuracy(p)?),
        (s, _) => s,
    };
    let engine_cfg = EngineConfig {
        graph_memory: a.graph_memory,
        // The copy-bandwidth measurement's two buffers.
        extra_bytes: 2 * COPY_BYTES,
        tp,
        router_skew,
        kv_cache_dtype: crate::engine_arg::kv_cache_dtype(a.kv_cache_dtype, dtype)?,
        ..engine_config(
            dtype,
            max_batch,
            max_seq_len,
            offload,
            format!(
                "bench decode --batch {max_batch} --context {}",
                a.runs.context
            ),
            "lower --batch or --context",
        )
    };
    // A verify step samples after every draft: a sampling row each.
    let engine_cfg = EngineConfig {
        max_seqs: max_batch * (1 + kmax),
        ..engine_cfg
    };
    let Engine { mut runner, report } = start_engine(be, &cfg, source, &engine_cfg, a.json)?;
    let mut held = Seqs::for_runner(&runner)?;
    let load_secs = report.load_secs;
    let weight_bytes = cfg.weight_bytes(dtype);
    // Over a tensor-parallel group, the last rank's shard: each rank reads its own share
    // of the weights at once, so the floor is one rank's, the largest (an MLP whose blocks
    // the ranks do not divide gives the last ranks one block more).
    let ranks = runner.tp_size();
    let decl = cfg.shard(ranks - 1, ranks)?.decl();
    // The floor: the bytes a step reads (not the untied embedding table, of which a step
    // gathers a few rows) at the measured copy bandwidth.
    let step_bytes = decl.step_read_bytes(dtype);
    let copy = bench::copy_bandwidth(be, COPY_BYTES, 10)?;
    // A mixture of experts: a step reads only the experts its rows are routed to; the
    // floor counts the expected share under uniform routing (per batch, in the rows).
    let expert_bytes = decl.expert_bytes(dtype);
    let routed = cfg.moe.as_ref().map(|m| (m.top_k, m.num_experts));
    let floor_secs = step_bytes as f64 / (copy.value * 1e9);
    if !a.json {
        outln!(
            "{} on {}{}: weights {}, {:.2} GB read per step, loaded in {:.2} s; copy bandwidth {:.0} GB/s -> floor {:.3} ms/step",
            a.model.model,
            be.device_name(),
            match runner.tp_size() {
                1 => String::new(),
                n => format!(" over {n} ranks (figures of the largest shard, rank {}'s)", n - 1),
            },
            decl.format_summary(dtype),
            step_bytes as f64 / 1e9,
            load_secs,
            copy.value,
            floor_secs * 1e3
        )?;
        if let Some(line) =
            offload_arg::summary(offload.as_ref(), report.offload.as_ref(), weight_bytes)
        {
            outln!("{line}")?;
        }
        if routed.is_some() {
            outln!(
                "(experts {:.2} GB of it: each row's floor counts the share its batch is routed to, {})",
                expert_bytes as f64 / 1e9,
                if a.router_skew.is_some() {
                    "the table's"
                } else {
                    "expected under uniform routing"
                }
            )?;
        }
        if let Some(s) = router_skew {
            outln!(
                "(routing: --router-skew {} (seed {}), not the routers; `experts` is the distinct experts a layer reaches at that batch, of {}; an expert cache's prefetch predicts {:.0}% of them)",
                s.exponent,
                s.seed,
                routed.map_or(0, |r| r.1),
                s.prefetch_accuracy * 100.0
            )?;
        }
        outln!(
            "{:>6} {:>10} {:>10} {:>8} {:>12} {:>10} {:>9} {:>10}{}",
            "batch",
            "eager ms",
            "graph ms",
            "speedup",
            "tok/s",
            "floor ms",
            "x floor",
            "capture ms",
            if a.router_skew.is_some() {
                "    experts"
            } else {
                ""
            }
        )?;
    }
    if a.capture_all {
        time_capture_all(&a, &mut runner, be, max_batch)?;
    }
    let table = runner.model().routing_table();
    let floor = Floor {
        weight_bytes,
        step_bytes,
        copy_gbps: copy.value,
        load_secs,
        expert_bytes,
        routed,
        table: table.map(|t| {
            let window = runner.config().max_tokens_per_step + cfg.num_layers;
            (t, cfg.num_layers, window)
        }),
    };
    // The expert cache streams what its misses need: its bound is those bytes at the
    // host-to-device bandwidth.
    let h2d_gbps = match runner.expert_stats()? {
        Some(_) => Some(bench::h2d_bandwidth(be, 256 << 20)?),
        None => None,
    };
    for &b in &a.runs.batch {
        let seqs = prefill(&mut runner, &mut held, b, a.runs.context)?;
        let mut last = vec![1u32; b];
        let eager = time_decode(&mut runner, &mut held, &seqs, &mut last, a.runs.steps)?;
        let (graph, capture_secs) = if a.eager {
            (None, 0.0)
        } else {
            runner.set_graph_mode(Some(BucketPolicy::VllmLike { max: max_batch }));
            let g = time_decode(&mut runner, &mut held, &seqs, &mut last, a.runs.steps)?;
            let stats = runner.graph_stats().unwrap_or_default();
            runner.set_graph_mode(None);
            (Some(g), stats.capture_secs)
        };
        let mut verify = Vec::new();
        for &k in &a.speculative {
            // Graph mode replays the verify graph of the batch's bucket for `k` drafts.
            if !a.eager {
                runner.set_graphs(Some(GraphConfig {
                    decode: BucketPolicy::VllmLike { max: max_batch },
                    mixed: BucketPolicy::None,
                    verify: k,
                }));
            }
            let v = time_verify(&mut runner, &mut held, &seqs, &mut last, k, a.runs.steps)?;
            runner.set_graph_mode(None);
            verify.push((k, v));
        }
        free(&mut held, &seqs)?;
        let timed = graph.as_ref().unwrap_or(&eager);
        let cache = timed.experts.zip(h2d_gbps).map(|(x, h2d)| CacheRow {
            hit_rate: x.hit_rate(),
            bytes_per_step: x.bytes as f64 / a.runs.steps as f64,
            misses_per_step: x.misses as f64 / a.runs.steps as f64,
            prefetched_per_step: x.prefetched as f64 / a.runs.steps as f64,
            h2d_gbps: h2d,
        });
        let graph = graph.map(|g| g.median_s);
        print_row(
            &a,
            be,
            &floor,
            router_skew,
            b,
            eager.median_s,
            graph,
            capture_secs,
            cache,
            &verify,
        )?;
    }
    Ok(())
}

/// The expert cache over one row's timed steps (graph steps where they ran).
struct CacheRow {
    hit_rate: f64,
    bytes_per_step: f64,
    misses_per_step: f64,
    /// Experts copied ahead of their layer (the prefetch), per step.
    prefetched_per_step: f64,
    /// Page-locked host-to-device copy bandwidth, GB/s.
    h2d_gbps: f64,
}

impl CacheRow {
    /// The bytes streamed per step at the host-to-device bandwidth.
    fn bound_ms(&self) -> f64 {
        self.bytes_per_step / (self.h2d_gbps * 1e9) * 1e3
    }
}

/// `--capture-all`: capture every bucket of the default policy up to `max_batch`, largest
/// first, and report the time and the graph memory it took.
fn time_capture_all(
    a: &BenchDecodeArgs,
    runner: &mut Runner<'_>,
    be: &dyn Backend,
    max_batch: usize,
) -> Result<()> {
    let policy = BucketPolicy::VllmLike { max: max_batch };
    let n = policy.buckets().len();
    runner.set_graph_mode(Some(policy));
    let t = Instant::now();
    crate::graphs::capture_all(runner, !a.json)?;
    be.synchronize()?;
    let total = t.elapsed().as_secs_f64();
    let stats = runner.graph_stats().unwrap_or_default();
    let mem = runner.graph_memory_stats();
    runner.set_graph_mode(None);
    if a.json {
        outln!(
            "{}",
            serde_json::json!({"model": a.model.model, "capture_all_buckets": n, "capture_all_s": total,
                               "capture_s": stats.capture_secs, "graph_memory": mem.strategy.name(),
                               "physical_bytes": mem.physical_bytes, "virtual_bytes": mem.virtual_bytes})
        )?;
    } else {
        outln!(
            "captured all {n} default buckets (1..={max_batch}) in {total:.3} s ({:.3} s in capture, the rest in one eager warm-up step per bucket); {} memory {:.1} MiB physical, {:.1} MiB virtual",
            stats.capture_secs,
            mem.strategy,
            mem.physical_bytes as f64 / (1u64 << 20) as f64,
            mem.virtual_bytes as f64 / (1u64 << 20) as f64
        )?;
    }
    Ok(())
}

/// What every row shares: the weights, the measured copy bandwidth and the floor they
/// give, and the load time.
struct Floor {
    weight_bytes: usize,
    step_bytes: usize,
    copy_gbps: f64,
    load_secs: f64,
    /// A mixture of experts: the experts' bytes (within `step_bytes`) and (top k,
    /// experts).
    expert_bytes: usize,
    routed: Option<(usize, usize)>,
    /// The synthetic routing (`--router-skew`) and the layers reading it.
    table: Option<(std::sync::Arc<RoutingTable>, usize, usize)>,
}

impl Floor {
    /// The bytes a step of `b` rows reads: everything but the experts, and of the experts
    /// the share `b` rows reach: under `--router-skew` the table's, else the expected
    /// share under uniform routing, `1 - (1 - k / E)^b`.
    fn step_bytes_at(&self, b: usize) -> f64 {
        match self.routed {
            None => self.step_bytes as f64,
            Some((k, e)) => {
                let touched = match self.experts_at(b) {
                    Some(d) => d / e as f64,
                    None => 1.0 - (1.0 - k as f64 / e as f64).powi(b as i32),
                };
                (self.step_bytes - self.expert_bytes) as f64 + self.expert_bytes as f64 * touched
            }
        }
    }

    /// Under `--router-skew`: the distinct experts a layer reaches at batch `b`, the mean
    /// over the layers (each reads its own rows of the table).
    fn experts_at(&self, b: usize) -> Option<f64> {
        let (t, layers, window) = self.table.as_ref()?;
        Some(t.mean_distinct(b, *layers, *window, 32))
    }

    /// The floor of a step of `b` rows, in seconds.
    fn secs_at(&self, b: usize) -> f64 {
        self.step_bytes_at(b) / (self.copy_gbps * 1e9)
    }
}

/// One batch size's row: the eager and graph step medians (seconds) beside the floor.
#[allow(clippy::too_many_arguments)]
fn print_row(
    a: &BenchDecodeArgs,
    be: &dyn Backend,
    f: &Floor,
    router_skew: Option<encore_core::model::routing::RouterSkew>,
    b: usize,
    eager: f64,
    graph: Option<f64>,
    capture_secs: f64,
    cache: Option<CacheRow>,
    verify: &[(usize, f64)],
) -> Result<()> {
    let step = graph.unwrap_or(eager);
    let dtype = a.model.dtype;
    if a.json {
        outln!(
            "{}",
            serde_json::json!({
                "model": a.model.model, "device": be.device_name(), "dtype": dtype.to_string(),
                "kv_cache_dtype": a.kv_cache_dtype.0.unwrap_or(dtype).to_string(),
                "batch": b, "context": a.runs.context,
                "eager_step_ms": eager * 1e3, "graph_step_ms": graph.map(|g| g * 1e3),
                "speedup": graph.map(|g| eager / g), "capture_s": capture_secs,
                "tokens_per_s": b as f64 / graph.unwrap_or(eager),
                "floor_ms": f.secs_at(b) * 1e3, "weight_bytes": f.weight_bytes,
                "step_bytes": f.step_bytes_at(b), "quantization": a.model.quantization.to_string(),
                "copy_gbps": f.copy_gbps, "load_s": f.load_secs,
                "router_skew": router_skew.map(|s| s.exponent),
                "prefetch_accuracy": router_skew.map(|s| s.prefetch_accuracy),
                "expert_prefetched_per_step": cache.as_ref().map(|c| c.prefetched_per_step),
                "experts_per_layer": f.experts_at(b),
                "expert_hit_rate": cache.as_ref().map(|c| c.hit_rate),
                "expert_misses_per_step": cache.as_ref().map(|c| c.misses_per_step),
                "streamed_bytes_per_step": cache.as_ref().map(|c| c.bytes_per_step),
                "pcie_bound_ms": cache.as_ref().map(|c| c.bound_ms()),
                "h2d_gbps": cache.as_ref().map(|c| c.h2d_gbps),
                "verify_ms": verify.iter().map(|&(k, s)| (k.to_string(), serde_json::json!(s * 1e3))).collect::<serde_json::Map<_, _>>(),
            })
        )?;
    } else {
        let g = graph.unwrap_or(f64::NAN);
        outln!(
            "{:>6} {:>10.3} {:>10.3} {:>8.2} {:>12.1} {:>10.3} {:>9.2} {:>10.1}{}",
            b,
            eager * 1e3,
            g * 1e3,
            eager / g,
            b as f64 / graph.unwrap_or(eager),
            f.secs_at(b) * 1e3,
            graph.unwrap_or(eager) / f.secs_at(b),
            capture_secs * 1e3,
            f.experts_at(b)
                .map_or(String::new(), |d| format!(" {d:>10.1}"))
        )?;
        if let Some(c) = cache {
            let ratio = if c.bytes_per_step > 0.0 {
                format!(
                    ", the step {:.2}x that bound",
                    graph.unwrap_or(eager) * 1e3 / c.bound_ms()
                )
            } else {
                String::new()
            };
            outln!(
                "{:>6} expert cache: {:.1}% hits, {:.1} misses, {:.1} prefetched and {:.1} MB streamed per step; at {:.1} GB/s host-to-device {:.3} ms{ratio}",
                "",
                c.hit_rate * 100.0,
                c.misses_per_step,
                c.prefetched_per_step,
                c.bytes_per_step / 1e6,
                c.h2d_gbps,
                c.bound_ms(),
            )?;
        }
        for &(k, v) in verify {
            outln!(
                "{:>6} verify step, {k} drafts a sequence: {:.3} ms, {:.2}x the decode step ({})",
                "",
                v * 1e3,
                v / step,
                if graph.is_some() {
                    "both graphs"
                } else {
                    "both eager"
                }
            )?;
        }
    }
    Ok(())
}
