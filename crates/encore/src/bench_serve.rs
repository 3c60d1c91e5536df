//! `encore bench serve`: a serving benchmark. By default a load generator against a
//! running OpenAI-compatible server (`--url`, see `bench_client`); with `--in-process`,
//! against the engine loop in this process (the code a server runs, minus HTTP). Requests
//! with prompt and output lengths drawn uniformly from ranges (or read from a JSONL trace)
//! arrive as a Poisson process, at a fixed rate or all at once, at most
//! `--max-concurrency` in flight; per request, the time to first token (TTFT), the time
//! per output token after the first (TPOT) and every inter-token latency (ITL). Both modes
//! report request and token throughput, failed requests and mean/p50/p90/p99 of each
//! latency, as vLLM's and SGLang's serving benchmarks do, through the same code
//! ([`Record`], [`report`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use encore_core::engine::{EngineConfig, KvSizing};
use encore_core::memory::GraphMemory;
use encore_core::request::{Event, Request, RequestParams};
use encore_core::scheduler::SchedulerConfig;
use encore_core::serve::EngineHandle;
use encore_core::DType;
use serde_json::{json, Map, Value};

use crate::offload_arg::{self, OffloadArg};
use crate::out::{errln, outln};
use crate::{parse, DeviceArg};

#[derive(Args)]
pub struct BenchServeArgs {
    /// The server to load (`http://HOST:PORT`, plain HTTP): the default mode.
    #[arg(long, default_value = "http://127.0.0.1:8000", value_parser = crate::bench_client::url, conflicts_with = "in_process")]
    url: String,
    /// Run the engine in this process instead of loading a server.
    #[arg(long)]
    in_process: bool,
    /// The model: with --url, the name the server serves (default: the first of its
    /// /v1/models); with --in-process, a Hugging Face directory, a `.gguf` file or
    /// `dummy:NAME` (default dummy:tiny).
    #[arg(long)]
    model: Option<String>,
    /// Bearer key for the server (--url; also from ENCORE_API_KEY).
    #[arg(long, env = "ENCORE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Vocabulary size to draw random prompt ids from (--url; default: from --model when it
    /// names a model on this machine, e.g. `dummy:NAME`).
    #[arg(long, value_parser = parse::count::<1, { u32::MAX as usize }>, allow_negative_numbers = true)]
    vocab_size: Option<usize>,
    #[command(flatten)]
    device: DeviceArg,
    #[command(flatten)]
    offload: OffloadArg,
    /// Run every engine step eagerly, no graphs (--in-process; needed by
    /// --offload-policy lru).
    #[arg(long)]
    eager: bool,
    /// Run dtype (--in-process).
    #[arg(long, default_value = "bf16", value_parser = parse::dtype)]
    dtype: DType,
    /// Requests to send (default 200; with --trace, the first N lines, default all).
    #[arg(long, value_parser = parse::count::<1, 10_000_000>, allow_negative_numbers = true)]
    num_prompts: Option<usize>,
    /// Prompt lengths in tokens: N, or LO:HI (uniform).
    #[arg(long, default_value = "128:1024", value_parser = range)]
    input_len: (usize, usize),
    /// Start every generated prompt with the same N random tokens (counted in its
    /// --input-len; a prompt shorter than N is all prefix): a shared system prompt, for
    /// measuring the prefix cache.
    #[arg(long, default_value = "0", value_parser = parse::count::<0, { 1 << 24 }>, allow_negative_numbers = true, conflicts_with = "trace")]
    shared_prefix_len: usize,
    /// Output lengths in tokens (end-of-sequence ignored): N, or LO:HI.
    #[arg(long, default_value = "64:512", value_parser = range)]
    output_len: (usize, usize),
    /// Requests from a JSONL file instead of the length ranges: one object per line with
    /// `prompt_len` (tokens, random ids) or `prompt` (token ids), `output_len`, and
    /// optionally `timestamp` (seconds from the start: the arrival times).
    #[arg(long, value_name = "FILE.jsonl")]
    trace: Option<PathBuf>,
    /// Requests per second; `inf` sends all at once (the default).
    #[arg(long, value_parser = rate)]
    request_rate: Option<f64>,
    /// How arrivals are spaced at --request-rate: poisson (exponential gaps) or fixed.
    #[arg(long, value_enum)]
    arrival: Option<Arrival>,
    /// Most requests in flight at once (0: no limit).
    #[arg(long, default_value = "0", value_parser = parse::count::<0, 1_000_000>, allow_negative_numbers = true)]
    max_concurrency: usize,
    /// The engine's sequences per step (--in-process).
    #[arg(long, default_value = "256", value_parser = parse::count::<1, 4096>, allow_negative_numbers = true)]
    max_num_seqs: usize,
    /// The engine's tokens per step (--in-process).
    #[arg(long, default_value = "2048", value_parser = parse::count::<1, { 1 << 20 }>, allow_negative_numbers = true)]
    max_num_batched_tokens: usize,
    /// Fraction of free device memory for the KV cache after warm-up (--in-process, CUDA).
    #[arg(long, default_value = "0.8", value_parser = parse::fraction, allow_negative_numbers = true)]
    kv_fraction: f64,
    /// Compute every request's whole prompt: no reuse of cached KV blocks of earlier
    /// requests with the same prefix (--in-process; a server takes its own flag).
    #[arg(long)]
    no_prefix_cache: bool,
    /// Seed of the lengths, prompts and arrivals.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// One JSON object instead of an indented one.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Arrival {
    /// Exponential gaps of mean 1 / rate.
    Poisson,
    /// Gaps of exactly 1 / rate.
    Fixed,
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
    fn ids(&mut self, n: usize, vocab: usize) -> Vec<u32> {
        (0..n)
            .map(|_| (self.next() % vocab as u64) as u32)
            .collect()
    }
}

/// One request of the workload.
#[derive(Debug)]
pub struct WorkItem {
    pub prompt: Vec<u32>,
    pub output_len: usize,
}

/// The requests and their arrival times (seconds from the start, non-decreasing), drawn
/// up front so both modes send the same thing for the same flags.
#[derive(Debug)]
pub struct Workload {
    pub items: Vec<WorkItem>,
    pub arrivals: Vec<f64>,
    /// What the report says about the arrivals: `"inf"`, a rate, or `"trace"`.
    pub rate_label: Value,
}

impl Workload {
    /// The longest sequence a request asks for (prompt + output).
    pub fn max_seq_len(&self) -> usize {
        self.items
            .iter()
            .map(|w| w.prompt.len() + w.output_len)
            .max()
            .unwrap_or(0)
    }
}

/// The workload the flags ask for, prompt ids below `vocab`.
fn workload(a: &BenchServeArgs, vocab: usize) -> Result<Workload> {
    let mut rng = Rng(a.seed ^ 0x5eed);
    let (items, timestamps) = match &a.trace {
        None => {
            let n = a.num_prompts.unwrap_or(200);
            let prefix = rng.ids(a.shared_prefix_len, vocab);
            let items: Vec<WorkItem> = (0..n)
                .map(|_| {
                    let len = rng.in_range(a.input_len);
                    let shared = len.min(prefix.len());
                    let mut prompt = prefix[..shared].to_vec();
                    prompt.extend(rng.ids(len - shared, vocab));
                    WorkItem {
                        prompt,
                        output_len: rng.in_range(a.output_len),
                    }
                })
                .collect();
            (items, None)
        }
        Some(path) => read_trace(path, a.num_prompts, vocab, &mut rng)?,
    };
    let (arrivals, rate_label) = match timestamps {
        Some(t) => {
            if a.request_rate.is_some() || a.arrival.is_some() {
                bail!(
                    "--request-rate and --arrival do not apply: the lines of --trace {} have timestamps",
                    a.trace.as_deref().unwrap_or(Path::new("")).display()
                );
            }
            (t, json!("trace"))
        }
        None => {
            let r = a.request_rate.unwrap_or(f64::INFINITY);
            let fixed = a.arrival == Some(Arrival::Fixed);
            let mut t = 0.0f64;
            let arrivals = (0..items.len())
                .map(|i| {
                    if r.is_finite() && i > 0 {
                        t += if fixed {
                            1.0 / r
                        } else {
                            -(1.0 - rng.uniform()).ln() / r
                        };
                    }
                    t
                })
                .collect();
            (
                arrivals,
                if r.is_finite() {
                    json!(r)
                } else {
                    json!("inf")
                },
            )
        }
    };
    Ok(Workload {
        items,
        arrivals,
        rate_label,
    })
}

/// The requests of a JSONL trace (see `--trace`), the first `limit` of them, and their
/// timestamps when every line has one.
fn read_trace(
    path: &Path,
    limit: Option<usize>,
    vocab: usize,
    rng: &mut Rng,
) -> Result<(Vec<WorkItem>, Option<Vec<f64>>)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("--trace {}", path.display()))?;
    let mut items = Vec::new();
    let mut stamps: Vec<Option<f64>> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if limit.is_some_and(|l| items.len() == l) {
            break;
        }
        let at = || format!("--trace {} line {}", path.display(), n + 1);
        let v: Value = serde_json::from_str(line).with_context(at)?;
        let whole = |name: &str| -> Result<Option<usize>> {
            match v.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => match x.as_u64().filter(|&x| x >= 1) {
                    Some(x) => Ok(Some(x as usize)),
                    None => bail!("{}: `{name}` must be a whole number >= 1, not {x}", at()),
                },
            }
        };
        let prompt = match (v.get("prompt"), whole("prompt_len")?) {
            (Some(Value::Array(ids)), None) => {
                if ids.is_empty() {
                    bail!("{}: `prompt` is empty", at());
                }
                ids.iter()
                    .map(|x| match x.as_u64() {
                        Some(id) if (id as usize) < vocab => Ok(id as u32),
                        _ => bail!(
                            "{}: `prompt` holds {x}, not a token id below the vocabulary size {vocab}",
                            at()
                        ),
                    })
                    .collect::<Result<Vec<u32>>>()?
            }
            (None, Some(len)) => rng.ids(len, vocab),
            (Some(Value::Array(_)), Some(_)) => {
                bail!("{}: give `prompt` or `prompt_len`, not both", at())
            }
            (Some(x), _) => bail!("{}: `prompt` must be an array of token ids, not {x}", at()),
            (None, None) => bail!(
                "{}: needs `prompt_len` (tokens) or `prompt` (token ids)",
                at()
            ),
        };
        let Some(output_len) = whole("output_len")? else {
            bail!("{}: needs `output_len`", at());
        };
        let stamp = match v.get("timestamp") {
            None | Some(Value::Null) => None,
            Some(x) => match x.as_f64().filter(|t| t.is_finite() && *t >= 0.0) {
                Some(t) => Some(t),
                None => bail!("{}: `timestamp` must be seconds >= 0, not {x}", at()),
            },
        };
        items.push(WorkItem { prompt, output_len });
        stamps.push(stamp);
    }
    if items.is_empty() {
        bail!("--trace {} holds no requests", path.display());
    }
    if let Some(l) = limit.filter(|&l| l > items.len()) {
        bail!(
            "--num-prompts {l}: --trace {} holds {} requests",
            path.display(),
            items.len()
        );
    }
    let timestamps = match stamps.iter().filter(|s| s.is_some()).count() {
        0 => None,
        k if k == stamps.len() => {
            let t: Vec<f64> = stamps.into_iter().flatten().collect();
            if let Some(i) = t.windows(2).position(|w| w[1] < w[0]) {
                bail!(
                    "--trace {}: timestamps must not decrease (request {} at {} s follows {} s)",
                    path.display(),
                    i + 2,
                    t[i + 1],
                    t[i]
                );
            }
            Some(t)
        }
        _ => bail!(
            "--trace {}: some lines have a `timestamp` and some do not (all or none)",
            path.display()
        ),
    };
    Ok((items, timestamps))
}

/// What happened to one request, as the client saw it.
#[derive(Clone, Debug, Default)]
pub struct Record {
    /// When it was sent (after any wait for --max-concurrency).
    pub sent: Option<Instant>,
    /// When each piece of output arrived: every token in process, every streamed chunk
    /// over HTTP.
    pub times: Vec<Instant>,
    /// Output tokens (the usage count over HTTP).
    pub output_tokens: usize,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// mean, p50, p90, p99 (ms) of `v`.
fn summary(v: &mut [f64]) -> Value {
    if v.is_empty() {
        return Value::Null;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let p = |q: f64| v[((q * v.len() as f64) as usize).min(v.len() - 1)];
    json!({
        "mean": v.iter().sum::<f64>() / v.len() as f64,
        "p50": p(0.5), "p90": p(0.9), "p99": p(0.99),
    })
}

/// The figures both modes report, from every request's record: completed and failed
/// counts (with up to five distinct error messages), request and token throughput over
/// `duration_s`, and TTFT, TPOT and ITL summaries of the completed requests. TPOT is
/// (last output - first output) / (output tokens - 1), ITL every gap between outputs.
/// Over HTTP an output is a streamed chunk: `output_chunks` below `output_tokens` means
/// the server sent some tokens together (or withheld chunks with no text), and TTFT and
/// ITL are then per chunk, as in vLLM's benchmark.
pub fn report(w: &Workload, records: &[Record], duration_s: f64) -> Map<String, Value> {
    let (mut ttft, mut tpot, mut itl) = (Vec::new(), Vec::new(), Vec::new());
    let (mut completed, mut in_tokens, mut out_tokens, mut chunks) = (0usize, 0, 0, 0);
    let mut errors: Vec<(String, usize)> = Vec::new();
    for (item, r) in w.items.iter().zip(records) {
        if let Some(e) = &r.error {
            match errors.iter_mut().find(|(m, _)| m == e) {
                Some((_, n)) => *n += 1,
                None => errors.push((e.clone(), 1)),
            }
            continue;
        }
        let (Some(sent), Some(first), Some(last)) = (r.sent, r.times.first(), r.times.last())
        else {
            continue;
        };
        completed += 1;
        in_tokens += item.prompt.len();
        out_tokens += r.output_tokens;
        chunks += r.times.len();
        ttft.push((*first - sent).as_secs_f64() * 1e3);
        if r.output_tokens > 1 {
            tpot.push((*last - *first).as_secs_f64() * 1e3 / (r.output_tokens - 1) as f64);
        }
        itl.extend(
            r.times
                .windows(2)
                .map(|p| (p[1] - p[0]).as_secs_f64() * 1e3),
        );
    }
    let failed = records.len() - completed;
    let d = duration_s.max(f64::MIN_POSITIVE);
    let mut m = Map::new();
    m.insert("duration_s".into(), json!(duration_s));
    m.insert("completed".into(), json!(completed));
    m.insert("failed".into(), json!(failed));
    m.insert(
        "errors".into(),
        json!(errors
            .iter()
            .take(5)
            .map(|(msg, n)| json!({"message": msg, "count": n}))
            .collect::<Vec<_>>()),
    );
    m.insert("request_throughput".into(), json!(completed as f64 / d));
    m.insert("output_throughput".into(), json!(out_tokens as f64 / d));
    m.insert(
        "total_token_throughput".into(),
        json!((in_tokens + out_tokens) as f64 / d),
    );
    m.insert("input_tokens".into(), json!(in_tokens));
    m.insert("output_tokens".into(), json!(out_tokens));
    m.insert("output_chunks".into(), json!(chunks));
    m.insert("ttft_ms".into(), summary(&mut ttft));
    m.insert("tpot_ms".into(), summary(&mut tpot));
    m.insert("itl_ms".into(), summary(&mut itl));
    m
}

/// The fields every report starts with: what was asked for.
fn header(a: &BenchServeArgs, w: &Workload, model: &str, mode: &str) -> Map<String, Value> {
    let span = |f: &dyn Fn(&WorkItem) -> usize| {
        let lo = w.items.iter().map(f).min().unwrap_or(0);
        let hi = w.items.iter().map(f).max().unwrap_or(0);
        json!([lo, hi])
    };
    let mut m = Map::new();
    m.insert("model".into(), json!(model));
    m.insert("mode".into(), json!(mode));
    if mode == "url" {
        m.insert("url".into(), json!(a.url));
    }
    m.insert("num_prompts".into(), json!(w.items.len()));
    m.insert("input_len".into(), span(&|i| i.prompt.len()));
    m.insert("output_len".into(), span(&|i| i.output_len));
    if let Some(t) = &a.trace {
        m.insert("trace".into(), json!(t.display().to_string()));
    }
    m.insert("request_rate".into(), w.rate_label.clone());
    m.insert(
        "arrival".into(),
        json!(if w.rate_label.is_number() {
            match a.arrival.unwrap_or(Arrival::Poisson) {
                Arrival::Poisson => "poisson",
                Arrival::Fixed => "fixed",
            }
        } else {
            w.rate_label.as_str().unwrap_or("inf")
        }),
    );
    m.insert("max_concurrency".into(), json!(a.max_concurrency));
    m.insert("shared_prefix_len".into(), json!(a.shared_prefix_len));
    m
}

/// Print the report: one line with `--json`, indented otherwise; failures also go to
/// stderr.
fn print(a: &BenchServeArgs, row: Map<String, Value>) -> Result<()> {
    if let Some(errors) = row.get("errors").and_then(Value::as_array) {
        for e in errors {
            errln!(
                "failed: {} request(s): {}",
                e["count"],
                e["message"].as_str().unwrap_or("")
            );
        }
    }
    let row = Value::Object(row);
    if a.json {
        outln!("{row}")?;
    } else {
        outln!("{}", serde_json::to_string_pretty(&row)?)?;
    }
    Ok(())
}

pub fn run(a: BenchServeArgs) -> Result<()> {
    if a.in_process {
        run_in_process(a)
    } else {
        run_url(a)
    }
}

/// Load the server at `--url`: check it answers and serves the model, draw the workload,
/// send it, and report (with the server's preemption and step counts and its largest
/// running batch when it exposes encore's /metrics).
fn run_url(a: BenchServeArgs) -> Result<()> {
    use crate::bench_client::Client;
    if a.offload.weight_budget.is_some() || a.eager {
        bail!(
            "--weight-budget, --offload-policy and --eager apply to the engine of --in-process; \
             give them to the server (`encore serve`) instead"
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async {
        let client = Client::new(&a.url, a.api_key.as_deref().filter(|k| !k.is_empty()));
        let served = client.models().await?;
        let (model, max_model_len) = match &a.model {
            Some(m) => match served.iter().find(|(id, _)| id == m) {
                Some(s) => s.clone(),
                None => bail!(
                    "--model {m}: the server at {} serves {}",
                    a.url,
                    served
                        .iter()
                        .map(|(id, _)| format!("`{id}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            },
            None => match served.first() {
                Some(s) => s.clone(),
                None => bail!("the server at {} lists no model in /v1/models", a.url),
            },
        };
        let vocab = match a.vocab_size {
            Some(v) => v,
            None => match encore_core::model::open_model(&model) {
                Ok(files) => files.config.vocab_size,
                Err(e) => bail!(
                    "--vocab-size: the served model `{model}` is not a model on this machine ({e}); give the vocabulary size to draw prompt ids from"
                ),
            },
        };
        let w = workload(&a, vocab)?;
        if let Some(limit) = max_model_len {
            let need = w.max_seq_len();
            if need > limit {
                bail!(
                    "the requests reach {need} tokens (--input-len / --output-len / --trace); the server's max_model_len is {limit}"
                );
            }
        }
        let before = client.metrics().await;
        let run = crate::bench_client::drive(&client, &model, &w, a.max_concurrency).await;
        let after = client.metrics().await;
        let mut row = header(&a, &w, &model, "url");
        row.extend(report(&w, &run.records, run.duration_s));
        let delta = |name: &str| match (&before, &after) {
            (Some(b), Some(a)) => match (b.get(name), a.get(name)) {
                (Some(x), Some(y)) => json!((y - x).max(0.0) as u64),
                _ => Value::Null,
            },
            _ => Value::Null,
        };
        row.insert("max_running".into(), json!(run.max_running));
        row.insert("preemptions".into(), delta("encore_preemptions_total"));
        row.insert("steps".into(), delta("encore_steps_total"));
        // Over this run: prompt tokens found cached per prompt token looked up.
        let ratio = match (
            delta("encore_prefix_cache_hits_total").as_f64(),
            delta("encore_prefix_cache_queries_total").as_f64(),
        ) {
            (Some(h), Some(q)) if q > 0.0 => json!(h / q),
            (Some(_), Some(_)) => json!(0.0),
            _ => Value::Null,
        };
        row.insert("prefix_cache_hit_ratio".into(), ratio);
        print(&a, row)
    })
}

fn run_in_process(a: BenchServeArgs) -> Result<()> {
    let model = a.model.clone().unwrap_or_else(|| "dummy:tiny".into());
    let opened = crate::model_arg::open_device(a.device.device)?;
    let be = opened.backend();
    let (cfg, _) = crate::model_arg::resolve(&model)?;
    let w = workload(&a, cfg.vocab_size)?;
    let max_seq_len = w.max_seq_len().next_multiple_of(16);
    if max_seq_len > cfg.max_position_embeddings {
        bail!(
            "the requests reach {max_seq_len} tokens (--input-len / --output-len / --trace); the model has {} positions",
            cfg.max_position_embeddings
        );
    }
    let cuda = be.memory_info().is_some();
    let graphs = if a.eager {
        None
    } else {
        Some(crate::graphs::config(
            be.as_ref(),
            "vllm",
            a.max_num_seqs,
            "auto",
            a.max_num_batched_tokens,
        )?)
    };
    let offload = a.offload.config();
    let at_least = 1 + max_seq_len.div_ceil(16);
    let engine_cfg = EngineConfig {
        offload,
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
        graphs,
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
        prefix_cache: !a.no_prefix_cache,
    };
    let engine = Arc::new(EngineHandle::start(
        be,
        model.clone(),
        engine_cfg,
        sched,
        Box::new(crate::progress::Bars::new(!a.json)),
    )?);
    if let (Some(line), false) = (
        offload_arg::summary(
            offload.as_ref(),
            engine.boot.offload.as_ref(),
            cfg.weight_bytes(a.dtype),
        ),
        a.json,
    ) {
        errln!("{line}");
    }

    // Submit on schedule; every token's time (or the request's error) goes to the
    // collector.
    enum Seen {
        Token { last: bool },
        Failed(String),
    }
    let n = w.items.len();
    let (tx, rx) = mpsc::channel::<(usize, Instant, Seen)>();
    let limit = if a.max_concurrency == 0 {
        usize::MAX
    } else {
        a.max_concurrency
    };
    let start = Instant::now();
    let mut records = vec![Record::default(); n];
    let (mut next, mut in_flight, mut finished) = (0usize, 0usize, 0usize);
    let mut max_running = 0u64;
    while finished < n {
        while next < n && in_flight < limit && start.elapsed().as_secs_f64() >= w.arrivals[next] {
            let tx = tx.clone();
            let i = next;
            records[i].sent = Some(Instant::now());
            engine.submit(
                Request {
                    id: i as u64,
                    prompt: w.items[i].prompt.clone(),
                    params: RequestParams {
                        sampling: Default::default(),
                        max_tokens: w.items[i].output_len,
                        stop_token_ids: Vec::new(),
                        ignore_eos: true,
                        fit_context: false,
                    },
                },
                Box::new(move |e| {
                    let seen = match e {
                        Event::Token(o) => Seen::Token {
                            last: o.finish.is_some(),
                        },
                        Event::Refused(r) => Seen::Failed(r.to_string()),
                        Event::Failed(msg) => Seen::Failed(msg),
                    };
                    tx.send((i, Instant::now(), seen)).is_ok()
                }),
            )?;
            next += 1;
            in_flight += 1;
        }
        let wait = if next < n && in_flight < limit {
            Duration::from_secs_f64((w.arrivals[next] - start.elapsed().as_secs_f64()).max(0.0))
                .min(Duration::from_millis(50))
        } else {
            Duration::from_millis(50)
        };
        match rx.recv_timeout(wait) {
            Ok((i, at, seen)) => {
                let r = &mut records[i];
                let done = match seen {
                    Seen::Token { last } => {
                        r.times.push(at);
                        r.output_tokens += 1;
                        last
                    }
                    Seen::Failed(msg) => {
                        r.error = Some(msg);
                        true
                    }
                };
                if done {
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
    let mut row = header(&a, &w, &model, "in-process");
    row.extend(report(&w, &records, duration));
    row.insert("max_running".into(), json!(max_running));
    row.insert(
        "preemptions".into(),
        json!(m.preemptions_total.load(Ordering::Relaxed)),
    );
    let steps = m.steps_total.load(Ordering::Relaxed);
    row.insert("steps".into(), json!(steps));
    // Where a step's time goes: waiting for the device, and the rest (the host's
    // scheduling, packing and launching, and handing tokens to their sinks).
    let per_step = |micros: &std::sync::atomic::AtomicU64| {
        micros.load(Ordering::Relaxed) as f64 / 1e3 / steps.max(1) as f64
    };
    let step_ms = per_step(&m.step_micros_total);
    let wait_ms = per_step(&m.device_wait_micros_total);
    row.insert("step_ms".into(), json!(step_ms));
    row.insert("device_wait_ms".into(), json!(wait_ms));
    row.insert("host_ms".into(), json!(step_ms - wait_ms));
    row.insert(
        "prefix_cache_hit_ratio".into(),
        json!(m.prefix_cache_hit_ratio()),
    );
    // The weight budget (null: every weight on the device).
    row.insert(
        "offload".into(),
        match (&offload, &engine.boot.offload) {
            (Some(c), Some(r)) => json!({
                "policy": c.policy.name(), "budget_bytes": r.budget_bytes,
                "resident_bytes": r.resident_bytes, "streaming_bytes": r.streaming_bytes,
                "streamed_bytes_per_step": r.streamed_bytes_per_step,
            }),
            _ => Value::Null,
        },
    );
    print(&a, row)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(sent: Instant, at_ms: &[u64], tokens: usize) -> Record {
        Record {
            sent: Some(sent),
            times: at_ms
                .iter()
                .map(|&ms| sent + Duration::from_millis(ms))
                .collect(),
            output_tokens: tokens,
            error: None,
        }
    }

    #[test]
    fn report_counts_only_completed_requests_and_measures_their_gaps() {
        let t = Instant::now();
        let w = Workload {
            items: (0..3)
                .map(|i| WorkItem {
                    prompt: vec![0; 10 + i],
                    output_len: 4,
                })
                .collect(),
            arrivals: vec![0.0; 3],
            rate_label: json!("inf"),
        };
        let failed = Record {
            sent: Some(t),
            error: Some("HTTP 400: too long".into()),
            ..Default::default()
        };
        // Four tokens in three chunks (one chunk carried two tokens).
        let records = [
            rec(t, &[100, 110, 130, 160], 4),
            failed,
            rec(t, &[50, 80, 110], 4),
        ];
        let m = report(&w, &records, 2.0);
        assert_eq!(m["completed"], 2);
        assert_eq!(m["failed"], 1);
        assert_eq!(m["errors"][0]["message"], "HTTP 400: too long");
        assert_eq!(m["input_tokens"], 10 + 12);
        assert_eq!(m["output_tokens"], 8);
        assert_eq!(m["output_chunks"], 7);
        assert_eq!(m["request_throughput"], 1.0);
        let f = |k: &str, q: &str| m[k][q].as_f64().unwrap();
        assert!((f("ttft_ms", "mean") - 75.0).abs() < 1e-6);
        // TPOT: (160 - 100) / 3 and (110 - 50) / 3.
        assert!((f("tpot_ms", "mean") - 20.0).abs() < 1e-6);
        // ITL: 10, 20, 30, 30, 30.
        assert!((f("itl_ms", "mean") - 24.0).abs() < 1e-6);
        assert!((f("itl_ms", "p50") - 30.0).abs() < 1e-6);
        assert!((f("itl_ms", "p99") - 30.0).abs() < 1e-6);
    }

    #[test]
    fn arrivals_are_fixed_poisson_or_at_once() {
        let mut a = <crate::Cli as clap::Parser>::try_parse_from([
            "encore",
            "bench",
            "serve",
            "--num-prompts",
            "1000",
            "--input-len",
            "3",
            "--output-len",
            "2:4",
            "--request-rate",
            "10",
        ])
        .map(|c| match c.command {
            crate::Command::Bench(crate::BenchCommand::Serve(a)) => a,
            _ => unreachable!("parsed bench serve"),
        })
        .unwrap();
        let w = workload(&a, 50).unwrap();
        assert!(w.items.iter().all(|i| i.prompt.len() == 3
            && i.prompt.iter().all(|&t| t < 50)
            && (2..=4).contains(&i.output_len)));
        let mean_gap = w.arrivals[999] / 999.0;
        assert!((mean_gap - 0.1).abs() < 0.01, "{mean_gap}");
        assert!(w.arrivals.windows(2).all(|p| p[1] >= p[0]));
        a.arrival = Some(Arrival::Fixed);
        let w = workload(&a, 50).unwrap();
        assert!(w
            .arrivals
            .iter()
            .enumerate()
            .all(|(i, &t)| (t - i as f64 * 0.1).abs() < 1e-9));
        a.request_rate = None;
        assert!(workload(&a, 50).unwrap().arrivals.iter().all(|&t| t == 0.0));
    }

    #[test]
    fn traces_are_read_and_checked_line_by_line() {
        let dir = std::env::temp_dir().join(format!("encore-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let mut rng = Rng(1);
        let ok = file(
            "ok.jsonl",
            "{\"prompt_len\": 5, \"output_len\": 2, \"timestamp\": 0}\n\n{\"prompt\": [1, 2, 3], \"output_len\": 7, \"timestamp\": 0.5}\n",
        );
        let (items, stamps) = read_trace(&ok, None, 10, &mut rng).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].prompt.len(), 5);
        assert_eq!(items[1].prompt, vec![1, 2, 3]);
        assert_eq!(items[1].output_len, 7);
        assert_eq!(stamps, Some(vec![0.0, 0.5]));
        let (items, _) = read_trace(&ok, Some(1), 10, &mut rng).unwrap();
        assert_eq!(items.len(), 1);
        let err = read_trace(&ok, Some(3), 10, &mut rng).unwrap_err();
        assert!(format!("{err:#}").contains("holds 2 requests"), "{err:#}");
        for (text, want) in [
            ("{\"output_len\": 2}", "line 1: needs `prompt_len`"),
            ("{\"prompt_len\": 2}", "line 1: needs `output_len`"),
            ("{\"prompt_len\": 0, \"output_len\": 1}", "`prompt_len` must be"),
            ("{\"prompt\": [1, 99], \"output_len\": 1}", "below the vocabulary size 10"),
            ("{\"prompt\": \"hi\", \"output_len\": 1}", "array of token ids"),
            ("not json", "line 1"),
            (
                "{\"prompt_len\": 1, \"output_len\": 1, \"timestamp\": 1}\n{\"prompt_len\": 1, \"output_len\": 1}",
                "all or none",
            ),
            (
                "{\"prompt_len\": 1, \"output_len\": 1, \"timestamp\": 1}\n{\"prompt_len\": 1, \"output_len\": 1, \"timestamp\": 0.5}",
                "must not decrease",
            ),
            ("\n", "holds no requests"),
        ] {
            let p = file("bad.jsonl", text);
            let err = format!("{:#}", read_trace(&p, None, 10, &mut rng).unwrap_err());
            assert!(err.contains(want), "{text}: {err}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
