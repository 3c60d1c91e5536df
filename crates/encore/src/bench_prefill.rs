//! `encore bench prefill`: prefill latency and throughput for a model at several prompt
//! lengths and batch sizes (every sequence's whole prompt in one step), eager and as a
//! piecewise graph of its token bucket, in the same process, alternating. With
//! `--decode-batch`, each step is a mixed one as chunked prefill makes them: that many
//! sequences with `--decode-context` cached tokens decode a token each beside the prompts.

use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use encore_core::engine::{Engine, EngineConfig, KvSizing};
use encore_core::kv::SeqId;
use encore_core::memory::GraphMemory;
use encore_core::request::SamplingParams;
use encore_core::runner::{Runner, SeqStep, Seqs};
use encore_core::{Backend, DType};
use serde_json::{json, Value};

use crate::model_arg::ModelArgs;
use crate::out::outln;
use crate::parse;

#[derive(Args)]
pub struct BenchPrefillArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt lengths in tokens, comma-separated, each >= 1.
    #[arg(
        long,
        default_value = "128,512,2000",
        value_delimiter = ',',
        value_parser = parse::count::<1, { MAX_TOKENS }>,
        allow_negative_numbers = true
    )]
    tokens: Vec<usize>,
    /// Sequences prefilled together in one step, comma-separated, each >= 1.
    #[arg(
        long,
        default_value = "1",
        value_delimiter = ',',
        value_parser = parse::count::<1, 4096>,
        allow_negative_numbers = true
    )]
    batch: Vec<usize>,
    /// Timed runs per row and mode after one untimed cold run; the median is reported.
    #[arg(long, default_value_t = 3, value_parser = parse::count::<1, 1000>, allow_negative_numbers = true)]
    repeats: usize,
    /// Token buckets for the piecewise runs: auto (sglang on a GPU, none on the CPU),
    /// sglang, pow2, none, or a comma list; capped at the largest tokens x batch.
    #[arg(long, default_value = "auto")]
    prefill_buckets: String,
    /// Capture each bucket on its first use instead of all of them at start-up (then
    /// cold_ms includes the capture).
    #[arg(long)]
    lazy_capture: bool,
    /// One JSON object per row.
    #[arg(long)]
    json: bool,
    /// The KV cache's element type: auto (the model's dtype), fp8 (E4M3), or a float dtype.
    #[arg(long, default_value = "auto", value_name = "auto|fp8|DTYPE", value_parser = parse::kv_cache_dtype)]
    kv_cache_dtype: parse::KvCacheDtype,
    /// Sequences decoding a token each in every timed step beside the prompts (a mixed
    /// step, the decodes first as the scheduler orders them); 0: prompts only.
    #[arg(long, default_value_t = 0, value_parser = parse::count::<0, 16384>, allow_negative_numbers = true)]
    decode_batch: usize,
    /// Tokens cached in each `--decode-batch` sequence before the rows (one prefill step
    /// per sequence, untimed).
    #[arg(long, default_value_t = 2048, value_parser = parse::count::<1, { MAX_TOKENS }>, allow_negative_numbers = true)]
    decode_context: usize,
    /// A mixture of experts: route every sparse layer by a seeded table instead of its
    /// router, each token's experts drawn from a Zipf law of this exponent over the
    /// experts (0: uniform). Random weights route as no trained model does.
    #[arg(long, value_parser = parse::router_skew, allow_negative_numbers = true)]
    router_skew: Option<encore_core::model::routing::RouterSkew>,
}

/// The longest `--tokens`.
const MAX_TOKENS: usize = 1 << 20;

/// One measured row. New columns go here, in [`PrefillRow::json`] and in [`COLUMNS`] /
/// [`PrefillRow::cells`].
struct PrefillRow {
    tokens: usize,
    batch: usize,
    /// Decoding sequences in each step (`--decode-batch`).
    decode: usize,
    /// The token bucket the step pads to, or `None` (eager: above the largest bucket, or
    /// no buckets).
    bucket: Option<usize>,
    /// Medians over the timed runs of each mode.
    eager_ms: f64,
    piecewise_ms: Option<f64>,
    /// The row's first run in the process (piecewise where there is a bucket).
    cold_ms: f64,
    /// Whether every piecewise run sampled the eager run's tokens (greedy).
    matches_eager: Option<bool>,
    /// Median CPU time of the process (all threads; the host's side on CUDA) per timed
    /// run of the faster mode, where the OS reports it (Linux): on a shared machine it
    /// moves less than wall time with other load.
    cpu_ms: Option<f64>,
}

/// Table header: (title, width).
const COLUMNS: &[(&str, usize)] = &[
    ("tokens", 7),
    ("batch", 6),
    ("decode", 7),
    ("bucket", 7),
    ("eager ms", 10),
    ("piece ms", 10),
    ("cold ms", 10),
    ("tok/s", 11),
    ("match", 6),
    ("cpu ms", 9),
];

impl PrefillRow {
    /// The time of the mode a user gets (piecewise where there is a bucket).
    fn prefill_ms(&self) -> f64 {
        self.piecewise_ms.unwrap_or(self.eager_ms)
    }

    /// Prompt tokens processed per second (all sequences of the batch).
    fn tokens_per_s(&self) -> f64 {
        (self.tokens * self.batch) as f64 / (self.prefill_ms() / 1e3)
    }

    fn cells(&self) -> Vec<String> {
        let opt = |v: Option<f64>| v.map_or("-".into(), |c| format!("{c:.2}"));
        vec![
            self.tokens.to_string(),
            self.batch.to_string(),
            self.decode.to_string(),
            self.bucket.map_or("-".into(), |b| b.to_string()),
            format!("{:.2}", self.eager_ms),
            opt(self.piecewise_ms),
            format!("{:.2}", self.cold_ms),
            format!("{:.1}", self.tokens_per_s()),
            self.matches_eager
                .map_or("-".into(), |m| if m { "yes" } else { "NO" }.into()),
            opt(self.cpu_ms),
        ]
    }

    fn json(&self, model: &str, device: &str, dtype: DType, decode_context: usize) -> Value {
        json!({
            "model": model, "device": device, "dtype": dtype.to_string(),
            "tokens": self.tokens, "batch": self.batch, "decode_batch": self.decode,
            "decode_context": (self.decode > 0).then_some(decode_context),
            "bucket": self.bucket,
            "eager_ms": self.eager_ms, "piecewise_ms": self.piecewise_ms,
            "cold_ms": self.cold_ms, "prefill_ms": self.prefill_ms(),
            "tokens_per_s": self.tokens_per_s(), "matches_eager": self.matches_eager,
            "cpu_ms": self.cpu_ms,
        })
    }
}

/// CPU time of every thread of this process so far, in ns (Linux `schedstat`), or `None`.
fn process_cpu_ns() -> Option<u64> {
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// The median of `v` (not empty).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|x, y| x.total_cmp(y));
    v[v.len() / 2]
}

fn print_cells(cells: &[String]) -> Result<()> {
    let line: Vec<String> = cells
        .iter()
        .zip(COLUMNS)
        .map(|(c, (_, w))| format!("{c:>w$}"))
        .collect();
    outln!("{}", line.join(" "))?;
    Ok(())
}

/// The engine the rows run in: `max_batch` sequences of `max_tokens` positions prefilled
/// in one step beside `--decode-batch` sequences of `decode_positions` (the KV cache holds
/// exactly them), with the token buckets of `--prefill-buckets` captured at start-up unless
/// `--lazy-capture`.
fn engine_config(
    a: &BenchPrefillArgs,
    be: &dyn Backend,
    max_tokens: usize,
    max_batch: usize,
    decode_positions: usize,
) -> Result<EngineConfig> {
    let block_size = 16;
    let (seqs, step_tokens) = (
        max_batch + a.decode_batch,
        max_tokens * max_batch + a.decode_batch,
    );
    let graphs = crate::graphs::config(be, "none", seqs, &a.prefill_buckets, step_tokens)?;
    let blocks = max_batch * max_tokens.div_ceil(block_size)
        + a.decode_batch * decode_positions.div_ceil(block_size);
    Ok(EngineConfig {
        offload: None,
        dtype: a.model.dtype,
        block_size,
        max_tokens_per_step: step_tokens,
        max_seqs: seqs,
        max_seq_len: max_tokens.max(decode_positions),
        kv: KvSizing::Blocks(1 + blocks),
        graphs: Some(graphs),
        graph_memory: GraphMemory::default(),
        capture_all: !a.lazy_capture,
        verify_graphs: false,
        extra_bytes: 0,
        run_name: format!("bench prefill --tokens {max_tokens} --batch {max_batch}"),
        fix_hint: "lower --tokens or --batch".into(),
        constraints: None,
        tp: Default::default(),
        router_skew: a.router_skew,
        draft: None,
        eagle_aux: None,
        eagle_embed: None,
        kv_cache_dtype: crate::engine_arg::kv_cache_dtype(a.kv_cache_dtype, a.model.dtype)?,
        async_scheduling: false,
    })
}

pub fn run(a: BenchPrefillArgs) -> Result<()> {
    let dtype = a.model.dtype;
    if a.tokens.is_empty() || a.batch.is_empty() {
        bail!("--tokens and --batch: give at least one value each");
    }
    let (opened, cfg, source, tp) = a.model.open()?;
    let be = opened.backend();
    let be = be.as_ref();
    let max_tokens = a.tokens.iter().copied().max().unwrap_or(1);
    let max_batch = a.batch.iter().copied().max().unwrap_or(1);
    if max_tokens > cfg.max_position_embeddings {
        bail!(
            "--tokens {max_tokens} exceeds the model's {} positions",
            cfg.max_position_embeddings
        );
    }
    // Each row's steps (a cold run, the eager mode's warm-up, then two per repeat) append
    // a token to every decoding sequence.
    let steps = a.batch.len() * a.tokens.len() * (2 + 2 * a.repeats);
    let decode_positions = if a.decode_batch > 0 {
        a.decode_context + steps + 1
    } else {
        0
    };
    if decode_positions > cfg.max_position_embeddings {
        bail!(
            "--decode-context {} with {steps} steps needs {decode_positions} positions; the model has {}",
            a.decode_context,
            cfg.max_position_embeddings
        );
    }
    if a.decode_batch > 0 && a.decode_context > max_tokens * max_batch + a.decode_batch {
        bail!(
            "--decode-context {} exceeds a step's {} tokens (--tokens x --batch + --decode-batch): \
             each decoding sequence's context is prefilled in one step",
            a.decode_context,
            max_tokens * max_batch + a.decode_batch
        );
    }
    let engine_cfg = EngineConfig {
        tp,
        ..engine_config(&a, be, max_tokens, max_batch, decode_positions)?
    };
    let Engine { mut runner, report } =
        crate::bench_decode::start_engine(be, &cfg, source, &engine_cfg, a.json)?;
    let mut held = Seqs::for_runner(&runner)?;
    let load_secs = report.load_secs;
    let capture_secs = report.capture_secs;
    let stats = runner.graph_stats().unwrap_or_default();
    let mem = runner.graph_memory_stats();
    let device = be.device_name();
    if a.json {
        outln!(
            "{}",
            json!({
                "model": a.model.model, "device": device, "dtype": dtype.to_string(),
                "load_s": load_secs, "captured": stats.captures, "pieces": stats.pieces,
                "capture_s": capture_secs,
                "graph_memory_physical_bytes": mem.physical_bytes,
            })
        )?;
    } else {
        outln!(
            "{} on {device} ({dtype}), weights loaded in {load_secs:.2} s; {} token buckets captured ({} pieces) in {:.2} s, graph memory {:.1} MiB; median of {} runs per mode after one cold run",
            a.model.model,
            stats.captures,
            stats.pieces,
            capture_secs,
            mem.physical_bytes as f64 / (1u64 << 20) as f64,
            a.repeats
        )?;
        print_cells(
            &COLUMNS
                .iter()
                .map(|(t, _)| t.to_string())
                .collect::<Vec<_>>(),
        )?;
    }
    // The decoding sequences are 0..decode_batch; the prompts' ids follow.
    let mut decoding = Decoding {
        seqs: crate::bench_decode::prefill(
            &mut runner,
            &mut held,
            a.decode_batch,
            a.decode_context,
        )?,
        last: vec![1; a.decode_batch],
    };
    let mut next_seq = a.decode_batch as u64;
    for &b in &a.batch {
        for &n in &a.tokens {
            let row = measure(
                &mut runner,
                &mut held,
                (&mut next_seq, &mut decoding),
                (b, n),
                cfg.vocab_size,
                a.repeats,
            )?;
            if a.json {
                outln!(
                    "{}",
                    row.json(&a.model.model, &device, dtype, a.decode_context)
                )?;
            } else {
                print_cells(&row.cells())?;
            }
        }
    }
    Ok(())
}

/// The sequences decoding beside the prompts (`--decode-batch`) and their last tokens.
struct Decoding {
    seqs: Vec<SeqId>,
    last: Vec<u32>,
}

/// One prefill step of `prompts` in fresh sequences (the whole prompt is new to the
/// cache) after a decode token of each of `decoding`'s sequences, eager or in the runner's
/// graph mode: (wall ms, process CPU ms, the prompts' sampled tokens).
fn prefill_once(
    runner: &mut Runner<'_>,
    held: &mut Seqs,
    (next_seq, decoding): (&mut u64, &mut Decoding),
    prompts: &[Vec<u32>],
    eager: bool,
) -> Result<(f64, Option<f64>, Vec<u32>)> {
    runner.set_force_eager(eager);
    let seqs: Vec<SeqId> = prompts
        .iter()
        .map(|_| {
            *next_seq += 1;
            SeqId(*next_seq)
        })
        .collect();
    for (&s, p) in seqs.iter().zip(prompts) {
        held.blocks.allocate(s, p.len())?;
    }
    for &s in &decoding.seqs {
        held.blocks.append(s, 1)?;
    }
    let last: Vec<[u32; 1]> = decoding.last.iter().map(|&t| [t]).collect();
    let decodes = decoding
        .seqs
        .iter()
        .zip(&last)
        .map(|(&seq, t)| (seq, &t[..]));
    let batch: Vec<SeqStep<'_>> = decodes
        .chain(seqs.iter().zip(prompts).map(|(&seq, p)| (seq, &p[..])))
        .map(|(seq, p)| SeqStep {
            seq,
            tokens: p,
            sampling: SamplingParams::default(),
            masked: false,
            score: None,
            verify: false,
            logit_bias: &[],
        })
        .collect();
    let (t, c) = (Instant::now(), process_cpu_ns());
    // Reads the sampled tokens back: waits for the device.
    let mut tokens = runner.step(held, &batch)?;
    let prompt_tokens = tokens.split_off(decoding.seqs.len().min(tokens.len()));
    decoding.last = tokens;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let cpu = c
        .zip(process_cpu_ns())
        .and_then(|(c0, c1)| c1.checked_sub(c0))
        .map(|ns| ns as f64 / 1e6);
    for &s in &seqs {
        held.blocks.free(s)?;
    }
    Ok((ms, cpu, prompt_tokens))
}

/// The row of `b` sequences of `n` tokens (ids below `vocab`): one cold run, then `repeats` timed runs of
/// each mode, alternating (eager, then piecewise when a token bucket holds the step).
fn measure(
    runner: &mut Runner<'_>,
    held: &mut Seqs,
    (next_seq, decoding): (&mut u64, &mut Decoding),
    (b, n): (usize, usize),
    vocab: usize,
    repeats: usize,
) -> Result<PrefillRow> {
    let prompts: Vec<Vec<u32>> = (0..b)
        .map(|s| {
            (0..n)
                .map(|i| ((i * 7 + s * 13 + 1) % vocab) as u32)
                .collect()
        })
        .collect();
    let d = decoding.seqs.len();
    let bucket = runner
        .key_for(n * b + d, b + d, n == 1 && d == 0)
        .map(|k| k.bucket);
    let piecewise = bucket.is_some();
    let (cold_ms, _, _) = prefill_once(runner, held, (next_seq, decoding), &prompts, !piecewise)?;
    if piecewise {
        prefill_once(runner, held, (next_seq, decoding), &prompts, true)?; // the eager mode's warm-up
    }
    let (mut eager, mut pieces) = (Vec::new(), Vec::new());
    let (mut eager_cpu, mut pieces_cpu) = (Vec::new(), Vec::new());
    let mut matches = true;
    for _ in 0..repeats {
        let (ms, cpu, reference) =
            prefill_once(runner, held, (next_seq, decoding), &prompts, true)?;
        eager.push(ms);
        eager_cpu.push(cpu);
        if piecewise {
            let (ms, cpu, tokens) =
                prefill_once(runner, held, (next_seq, decoding), &prompts, false)?;
            pieces.push(ms);
            pieces_cpu.push(cpu);
            matches &= tokens == reference;
        }
    }
    runner.set_force_eager(false);
    let cpu = if piecewise { pieces_cpu } else { eager_cpu };
    let cpu: Option<Vec<f64>> = cpu.into_iter().collect();
    Ok(PrefillRow {
        tokens: n,
        batch: b,
        decode: d,
        bucket,
        eager_ms: median(&eager),
        piecewise_ms: piecewise.then(|| median(&pieces)),
        cold_ms,
        matches_eager: piecewise.then_some(matches),
        cpu_ms: cpu.map(|c| median(&c)),
    })
}
