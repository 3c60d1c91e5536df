//! `encore bench serve --in-process`: a serving benchmark against the engine loop in this
//! process (the code a server runs, minus HTTP): requests with prompt and output lengths
//! drawn uniformly from ranges arrive as a Poisson process (or all at once), at most
//! `--max-concurrency` in flight; per request, the time to first token (TTFT), the time per
//! output token after the first (TPOT) and every inter-token latency (ITL). Reports request
//! and token throughput and mean/p50/p90/p99 of each latency, as vLLM's and SGLang's
//! serving benchmarks do.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Args;
use encore_core::engine::{EngineConfig, KvSizing};
use encore_core::memory::GraphMemory;
use encore_core::scheduler::{Request, RequestParams, SchedulerConfig};
use encore_core::serve::{EngineHandle, Event};
use encore_core::DType;
use serde_json::json;

use crate::out::outln;
use crate::{parse, DeviceArg};

#[derive(Args)]
pub struct BenchServeArgs {
    /// A Hugging Face model directory, a `.gguf` file, or `dummy:NAME`.
    #[arg(long, default_value = "dummy:tiny")]
    model: String,
    #[command(flatten)]
    device: DeviceArg,
    #[arg(long, default_value = "bf16", value_parser = parse::dtype)]
    dtype: DType,
    /// Run the engine in this process (the only mode so far; a client for a running
    /// server comes later).
    #[arg(long, required = true)]
    in_process: bool,
    /// Requests to send.
    #[arg(long, default_value = "200", value_parser = parse::count::<1, 10_000_000>, allow_negative_numbers = true)]
    num_prompts: usize,
    /// Prompt lengths in tokens: N, or LO:HI (uniform).
    #[arg(long, default_value = "128:1024", value_parser = range)]
    input_len: (usize, usize),
    /// Output lengths in tokens (end-of-sequence ignored): N, or LO:HI.
    #[arg(long, default_value = "64:512", value_parser = range)]
    output_len: (usize, usize),
    /// Requests per second of the Poisson arrivals; `inf` sends all at once.
    #[arg(long, default_value = "inf", value_parser = rate)]
    request_rate: f64,
    /// Most requests in flight at once (0: no limit).
    #[arg(long, default_value = "0", value_parser = parse::count::<0, 1_000_000>, allow_negative_numbers = true)]
    max_concurrency: usize,
    /// The engine's sequences per step.
    #[arg(long, default_value = "256", value_parser = parse::count::<1, 4096>, allow_negative_numbers = true)]
    max_num_seqs: usize,
    /// The engine's tokens per step.
    #[arg(long, default_value = "2048", value_parser = parse::count::<1, { 1 << 20 }>, allow_negative_numbers = true)]
    max_num_batched_tokens: usize,
    /// Fraction of free device memory for the KV cache after warm-up (CUDA).
    #[arg(long, default_value = "0.8", value_parser = parse::fraction, allow_negative_numbers = true)]
    kv_fraction: f64,
    /// Seed of the lengths, prompts and arrivals.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

fn range(s: &str) -> Result<(usize, usize), String> {
    let p = |x: &str| {
        x.trim()
            .parse::<usize>()
            .ok()
            .filter(|&v| v >= 1)
            .ok_or_else(|| format!("`{x}` is not a whole number >= 1"))
    };
    match s.split_once(':') {
        None => p(s).map(|v| (v, v)),
        Some((a, b)) => {
            let (lo, hi) = (p(a)?, p(b)?);
            if lo > hi {
                return Err(format!("{lo}:{hi} is empty (LO must be <= HI)"));
            }
            Ok((lo, hi))
        }
    }
}

fn rate(s: &str) -> Result<f64, String> {
    if s.trim() == "inf" {
        return Ok(f64::INFINITY);
    }
    match s.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err("must be a number of requests per second > 0, or inf".into()),
    }
}

/// A deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn in_range(&mut self, (lo, hi): (usize, usize)) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
}

/// mean, p50, p90, p99 (ms) of `v`.
fn summary(v: &mut [f64]) -> serde_json::Value {
    if v.is_empty() {
        return serde_json::Value::Null;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let p = |q: f64| v[((q * v.len() as f64) as usize).min(v.len() - 1)];
    json!({
        "mean": v.iter().sum::<f64>() / v.len() as f64,
        "p50": p(0.5), "p90": p(0.9), "p99": p(0.99),
    })
}

pub fn run(a: BenchServeArgs) -> Result<()> {
    if !a.in_process {
        bail!("--in-process: only the in-process mode exists so far");
    }
    let opened = crate::model_arg::open_device(a.device.device)?;
    let be = opened.backend();
    let (cfg, _) = crate::model_arg::resolve(&a.model)?;
    let max_seq_len = (a.input_len.1 + a.output_len.1).next_multiple_of(16);
    if max_seq_len > cfg.max_position_embeddings {
        bail!(
            "--input-len and --output-len reach {max_seq_len} tokens; the model has {} positions",
            cfg.max_position_embeddings
        );
    }
    let cuda = be.memory_info().is_some();
    let graphs = crate::graphs::config(
        be.as_ref(),
        "vllm",
        a.max_num_seqs,
        "auto",
        a.max_num_batched_tokens,
    )?;
    let at_least = 1 + max_seq_len.div_ceil(16);
    let engine_cfg = EngineConfig {
        dtype: a.dtype,
        block_size: 16,
        max_tokens_per_step: a.max_num_batched_tokens,
        max_seqs: a.max_num_seqs,
        max_seq_len,
        kv: if cuda {
            KvSizing::DeviceFraction {
                fraction: a.kv_fraction,
                at_least,
            }
        } else {
            KvSizing::Blocks(at_least * a.max_num_seqs.min(64))
        },
        graphs: Some(graphs),
        graph_memory: GraphMemory::Arena,
        capture_all: true,
        verify_graphs: false,
        extra_bytes: 0,
        run_name: format!(
            "bench serve (--max-num-seqs {}, --max-num-batched-tokens {}, {max_seq_len} tokens per sequence)",
            a.max_num_seqs, a.max_num_batched_tokens
        ),
        fix_hint: "lower --max-num-seqs, --max-num-batched-tokens, --input-len or --output-len"
            .into(),
    };
    let sched = SchedulerConfig {
        max_num_batched_tokens: a.max_num_batched_tokens,
        max_num_seqs: a.max_num_seqs,
    };
    let engine = Arc::new(EngineHandle::start(
        be,
        a.model.clone(),
        engine_cfg,
        sched,
        Box::new(crate::progress::Bars::new(!a.json)),
    )?);
    let vocab = engine.vocab_size;

    // The workload, drawn up front.
    let mut rng = Rng(a.seed ^ 0x5eed);
    let reqs: Vec<(Vec<u32>, usize)> = (0..a.num_prompts)
        .map(|_| {
            let n = rng.in_range(a.input_len);
            let prompt = (0..n).map(|_| (rng.next() % vocab as u64) as u32).collect();
            (prompt, rng.in_range(a.output_len))
        })
        .collect();
    let mut t = 0.0f64;
    let arrivals: Vec<f64> = (0..a.num_prompts)
        .map(|_| {
            if a.request_rate.is_finite() {
                t += -(1.0 - rng.uniform()).ln() / a.request_rate;
            }
            t
        })
        .collect();

    // Submit on schedule; every token's time goes to the collector.
    let (tx, rx) = mpsc::channel::<(usize, Instant, bool)>();
    let limit = if a.max_concurrency == 0 {
        usize::MAX
    } else {
        a.max_concurrency
    };
    let start = Instant::now();
    let mut submitted_at = vec![start; a.num_prompts];
    let mut tokens: Vec<Vec<Instant>> = vec![Vec::new(); a.num_prompts];
    let (mut next, mut in_flight, mut finished) = (0usize, 0usize, 0usize);
    let mut max_running = 0u64;
    while finished < a.num_prompts {
        while next < a.num_prompts
            && in_flight < limit
            && start.elapsed().as_secs_f64() >= arrivals[next]
        {
            let (prompt, out_len) = reqs[next].clone();
            let tx = tx.clone();
            let i = next;
            submitted_at[i] = Instant::now();
            engine.submit(
                Request {
                    id: i as u64,
                    prompt,
                    params: RequestParams {
                        sampling: Default::default(),
                        max_tokens: out_len,
                        stop_token_ids: Vec::new(),
                        ignore_eos: true,
                    },
                },
                Box::new(move |e| match e {
                    Event::Token(o) => tx.send((i, Instant::now(), o.finish.is_some())).is_ok(),
                    Event::Error(msg) => {
                        tracing::error!("request {i}: {msg}");
                        tx.send((i, Instant::now(), true)).is_ok()
                    }
                }),
            )?;
            next += 1;
            in_flight += 1;
        }
        let wait = if next < a.num_prompts && in_flight < limit {
            Duration::from_secs_f64((arrivals[next] - start.elapsed().as_secs_f64()).max(0.0))
                .min(Duration::from_millis(50))
        } else {
            Duration::from_millis(50)
        };
        match rx.recv_timeout(wait) {
            Ok((i, at, last)) => {
                tokens[i].push(at);
                if last {
                    finished += 1;
                    in_flight -= 1;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!("the engine loop stopped"),
        }
        max_running = max_running.max(engine.metrics.requests_running.load(Ordering::Relaxed));
    }
    let duration = start.elapsed().as_secs_f64();
    let m = &engine.metrics;
    let (mut ttft, mut tpot, mut itl) = (Vec::new(), Vec::new(), Vec::new());
    let mut out_tokens = 0usize;
    for (i, t) in tokens.iter().enumerate() {
        out_tokens += t.len();
        if let Some(first) = t.first() {
            ttft.push((*first - submitted_at[i]).as_secs_f64() * 1e3);
        }
        if t.len() > 1 {
            let span = (*t.last().expect("non-empty") - t[0]).as_secs_f64() * 1e3;
            tpot.push(span / (t.len() - 1) as f64);
            itl.extend(t.windows(2).map(|w| (w[1] - w[0]).as_secs_f64() * 1e3));
        }
    }
    let in_tokens: usize = reqs.iter().map(|(p, _)| p.len()).sum();
    let row = json!({
        "model": a.model, "mode": "in-process", "num_prompts": a.num_prompts,
        "input_len": [a.input_len.0, a.input_len.1], "output_len": [a.output_len.0, a.output_len.1],
        "request_rate": if a.request_rate.is_finite() { json!(a.request_rate) } else { json!("inf") },
        "max_concurrency": a.max_concurrency, "duration_s": duration,
        "request_throughput": a.num_prompts as f64 / duration,
        "output_throughput": out_tokens as f64 / duration,
        "total_token_throughput": (in_tokens + out_tokens) as f64 / duration,
        "input_tokens": in_tokens, "output_tokens": out_tokens,
        "max_running": max_running,
        "preemptions": m.preemptions_total.load(Ordering::Relaxed),
        "steps": m.steps_total.load(Ordering::Relaxed),
        "ttft_ms": summary(&mut ttft), "tpot_ms": summary(&mut tpot), "itl_ms": summary(&mut itl),
    });
    if a.json {
        outln!("{row}")?;
    } else {
        outln!("{}", serde_json::to_string_pretty(&row)?)?;
    }
    Ok(())
}
