//! `encore bench prefill`: prefill latency and throughput for a model at several prompt
//! lengths and batch sizes (eager; every sequence's whole prompt in one step).

use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use encore_core::kv::SeqId;
use encore_core::model::llama::Model;
use encore_core::model::weights;
use encore_core::runner::{Runner, RunnerConfig, SamplingParams, SeqStep};
use encore_core::DType;
use serde_json::{json, Value};

use crate::out::outln;
use crate::{parse, DeviceArg};

#[derive(Args)]
pub struct BenchPrefillArgs {
    /// A Hugging Face model directory, a `.gguf` file, or `dummy:NAME`.
    #[arg(long, default_value = "dummy:tiny")]
    model: String,
    #[command(flatten)]
    device: DeviceArg,
    /// Run dtype: bf16, f16 or f32 (also bfloat16, fp16, float16, half, fp32, float32;
    /// any case).
    #[arg(long, default_value = "bf16", value_parser = parse::dtype)]
    dtype: DType,
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
    /// Timed runs per row after one untimed cold run; the median is reported.
    #[arg(long, default_value_t = 3, value_parser = parse::count::<1, 1000>, allow_negative_numbers = true)]
    repeats: usize,
    /// One JSON object per row.
    #[arg(long)]
    json: bool,
}

/// The longest `--tokens`.
const MAX_TOKENS: usize = 1 << 20;

/// One measured row. New columns (e.g. piecewise-graph timings) go here, in
/// [`PrefillRow::json`] and in [`COLUMNS`] / [`PrefillRow::cells`].
struct PrefillRow {
    tokens: usize,
    batch: usize,
    /// The first (untimed for the median) run.
    cold_ms: f64,
    /// Median over the timed runs.
    prefill_ms: f64,
    /// Median CPU time of the process (all threads; the host's side on CUDA) per timed
    /// run, where the OS reports it (Linux): on a shared machine it moves less than wall
    /// time with other load.
    cpu_ms: Option<f64>,
}

/// Table header: (title, width).
const COLUMNS: &[(&str, usize)] = &[
    ("tokens", 7),
    ("batch", 6),
    ("cold ms", 11),
    ("prefill ms", 11),
    ("tok/s", 11),
    ("cpu ms", 11),
];

impl PrefillRow {
    /// Prompt tokens processed per second (all sequences of the batch).
    fn tokens_per_s(&self) -> f64 {
        (self.tokens * self.batch) as f64 / (self.prefill_ms / 1e3)
    }

    fn cells(&self) -> Vec<String> {
        vec![
            self.tokens.to_string(),
            self.batch.to_string(),
            format!("{:.1}", self.cold_ms),
            format!("{:.1}", self.prefill_ms),
            format!("{:.1}", self.tokens_per_s()),
            self.cpu_ms.map_or("-".into(), |c| format!("{c:.1}")),
        ]
    }

    fn json(&self, model: &str, device: &str, dtype: DType) -> Value {
        json!({
            "model": model, "device": device, "dtype": dtype.to_string(), "mode": "eager",
            "tokens": self.tokens, "batch": self.batch, "cold_ms": self.cold_ms,
            "prefill_ms": self.prefill_ms, "tokens_per_s": self.tokens_per_s(),
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

pub fn run(a: BenchPrefillArgs) -> Result<()> {
    let dtype = a.dtype;
    if a.tokens.is_empty() || a.batch.is_empty() {
        bail!("--tokens and --batch: give at least one value each");
    }
    let opened = crate::model_arg::open_device(a.device.device)?;
    let be = opened.backend();
    let be = be.as_ref();
    let (cfg, source) = crate::model_arg::resolve(&a.model)?;
    let max_tokens = a.tokens.iter().copied().max().unwrap_or(1);
    let max_batch = a.batch.iter().copied().max().unwrap_or(1);
    if max_tokens > cfg.max_position_embeddings {
        bail!(
            "--tokens {max_tokens} exceeds the model's {} positions",
            cfg.max_position_embeddings
        );
    }
    let block_size = 16;
    let runner_cfg = RunnerConfig {
        block_size,
        num_blocks: 1 + max_batch * max_tokens.div_ceil(block_size),
        max_tokens_per_step: max_tokens * max_batch,
        max_seqs: max_batch,
        max_seq_len: max_tokens,
    };
    crate::model_arg::check_memory(
        be,
        &runner_cfg.memory_need(be, &cfg, dtype),
        &format!("bench prefill --tokens {max_tokens} --batch {max_batch}"),
        "lower --tokens or --batch",
    )?;
    let t = Instant::now();
    let w = weights::load(be, &cfg, source, dtype, !a.json)?;
    be.synchronize()?;
    let load_secs = t.elapsed().as_secs_f64();
    let model = Model::new(be, cfg.clone(), w, max_tokens)?;
    let mut runner = Runner::new(be, model, runner_cfg)?;
    let device = be.device_name();
    if !a.json {
        outln!(
            "{} on {device} ({dtype}, eager), weights loaded in {load_secs:.2} s; median of {} runs after one cold run",
            a.model, a.repeats
        )?;
        print_cells(
            &COLUMNS
                .iter()
                .map(|(t, _)| t.to_string())
                .collect::<Vec<_>>(),
        )?;
    }
    let greedy = SamplingParams::default();
    for &b in &a.batch {
        for &n in &a.tokens {
            let prompts: Vec<Vec<u32>> = (0..b)
                .map(|s| {
                    (0..n)
                        .map(|i| ((i * 7 + s * 13 + 1) % cfg.vocab_size) as u32)
                        .collect()
                })
                .collect();
            let mut times = Vec::with_capacity(a.repeats + 1);
            let mut cpu = Vec::with_capacity(a.repeats + 1);
            for run in 0..=a.repeats {
                // Fresh sequences each run: the whole prompt is new to the cache.
                let seqs: Vec<SeqId> = (0..b).map(|i| SeqId((run * b + i) as u64)).collect();
                for &s in &seqs {
                    runner.blocks.allocate(s, n)?;
                }
                let batch: Vec<SeqStep<'_>> = seqs
                    .iter()
                    .zip(&prompts)
                    .map(|(&seq, p)| SeqStep {
                        seq,
                        tokens: p,
                        sampling: greedy,
                        step: 0,
                    })
                    .collect();
                let (t, c) = (Instant::now(), process_cpu_ns());
                runner.step(&batch)?; // reads the sampled tokens back: waits for the device
                times.push(t.elapsed().as_secs_f64() * 1e3);
                cpu.push(
                    c.zip(process_cpu_ns())
                        .and_then(|(c0, c1)| c1.checked_sub(c0))
                        .map(|ns| ns as f64 / 1e6),
                );
                for &s in &seqs {
                    runner.blocks.free(s)?;
                }
            }
            let warm_cpu: Option<Vec<f64>> = cpu[1..].iter().copied().collect();
            let row = PrefillRow {
                tokens: n,
                batch: b,
                cold_ms: times[0],
                prefill_ms: median(&times[1..]),
                cpu_ms: warm_cpu.map(|c| median(&c)),
            };
            if a.json {
                outln!("{}", row.json(&a.model, &device, dtype))?;
            } else {
                print_cells(&row.cells())?;
            }
        }
    }
    Ok(())
}
