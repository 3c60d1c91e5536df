//! `encore bench serve`: a serving benchmark. By default a load generator against a
//! running OpenAI-compatible server (`--url`, see [`client`]); with `--in-process`,
//! against the engine loop in this process (the code a server runs, minus HTTP). Requests
//! with prompt and output lengths drawn uniformly from ranges (or read from a JSONL trace)
//! arrive as a Poisson process, at a fixed rate or all at once, at most
//! `--max-concurrency` in flight; per request, the time to first token (TTFT), the time
//! per output token after the first (TPOT) and every inter-token latency (ITL). Both modes
//! report request and token throughput, failed requests and mean/p50/p90/p99 of each
//! latency, as vLLM's and SGLang's serving benchmarks do, through the same code
//! ([`report::Record`], [`report()`]). The workload is drawn up front by [`workload`].
//!
//! `--dataset-shape trtllm` ([`preset`]) runs a peer's published table instead of one
//! workload: TensorRT-LLM's throughput for Llama-3.1-8B FP8 on one H200 (trtllm-bench;
//! ISL/OSL 128/128, 1000/1000, 500/2000, 2048/128 with 30000, 3000, 3000 and 3000
//! requests, from <https://github.com/NVIDIA/TensorRT-LLM/blob/00f37686aa854010d68bcbd0f4ab000221541ca6/docs/source/performance/perf-overview.md>).
//! Each row sends exactly ISL prompt tokens and OSL output tokens a request (end of
//! sequence ignored), every request at once, after `--warmup` requests of its shape
//! (default 2, as trtllm-bench) left out of its figures; the rows run one after the other
//! through one engine (sized for the longest row, 2500 tokens) or one server. It prints
//! one table, ISL/OSL, requests, failed, output tok/s, TensorRT-LLM's, ours over theirs,
//! total tok/s and mean TPOT (`--json`: an array of the rows' full reports with those
//! fields). `--num-prompts N` sends N requests a row instead of TensorRT-LLM's counts (a
//! short run, which the table notes); the flags that would change the workload
//! (`--input-len`, `--output-len`, `--shared-prefix-len`, `--trace`, `--request-rate`,
//! `--arrival`, `--max-concurrency`) are refused beside it.

use anyhow::{bail, Context, Result};
use clap::Args;
use encore_core::model::ModelFiles;
use serde_json::{json, Map, Value};

use crate::engine_arg::{self, EngineArgs, EngineShape};
use crate::out::{errln, outln};
use crate::{parse, DeviceArg};
use preset::{PeerRow, Run, Table};

/// A preset row's peer: its table and row.
type Peer = (&'static Table, &'static PeerRow);
use report::report;
use workload::{Arrival, WorkItem, Workload, WorkloadArgs};

mod client;
mod in_process;
mod preset;
mod report;
mod workload;

#[derive(Args)]
#[command(mut_arg("max_seq_len", |a| a.help(
    "Longest sequence, prompt and output (default: the longest request, rounded up to a \
     KV block)"
)))]
pub struct BenchServeArgs {
    /// The server to load (`http://HOST:PORT`, plain HTTP): the default mode.
    #[arg(long, default_value = "http://127.0.0.1:8000", value_parser = client::url, conflicts_with = "in_process")]
    url: String,
    /// Run the engine in this process instead of loading a server.
    #[arg(long)]
    in_process: bool,
    /// The model: with --url, the name the server serves (default: the first of its
    /// /v1/models); with --in-process, a Hugging Face directory, a `.gguf` file, a Hub id
    /// or `dummy:NAME` (default dummy:tiny).
    #[arg(long)]
    model: Option<String>,
    /// The revision of a Hub id --model (--in-process).
    #[arg(long, default_value = "main")]
    revision: String,
    /// Bearer key for the server (--url; also from ENCORE_API_KEY).
    #[arg(long, env = "ENCORE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Vocabulary size to draw random prompt ids from (--url; default: from --model when it
    /// names a model on this machine, e.g. `dummy:NAME`).
    #[arg(long, value_parser = parse::count::<1, { u32::MAX as usize }>, allow_negative_numbers = true)]
    vocab_size: Option<usize>,
    #[command(flatten)]
    device: DeviceArg,
    /// Run dtype (--in-process).
    #[arg(long, default_value = "bf16", value_parser = parse::dtype)]
    dtype: encore_core::DType,
    /// Weight storage (--in-process): auto, none or a format (see `generate --help`).
    #[arg(long, default_value = "auto", value_parser = parse::quantization)]
    quantization: encore_core::model::formats::Quantization,
    #[command(flatten)]
    pub(crate) workload: WorkloadArgs,
    /// Most requests in flight at once (0: no limit).
    #[arg(long, default_value = "0", value_parser = parse::count::<0, 1_000_000>, allow_negative_numbers = true)]
    max_concurrency: usize,
    /// One JSON object instead of an indented one (--dataset-shape: one JSON array of its
    /// rows instead of the table).
    #[arg(long)]
    json: bool,
    // The engine's flags (--in-process; a server takes its own).
    #[command(
        flatten,
        next_help_heading = "Engine options (--in-process; a server takes its own)"
    )]
    engine: EngineArgs,
    /// The engine's sequences per step (default: 1024 on a GPU of 70 GiB or more, 256
    /// elsewhere).
    #[arg(long, value_parser = parse::count::<1, 4096>, allow_negative_numbers = true)]
    max_num_seqs: Option<usize>,
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
    if let Some(t) = &a.workload.trace {
        m.insert("trace".into(), json!(t.display().to_string()));
    }
    m.insert("request_rate".into(), w.rate_label.clone());
    m.insert(
        "arrival".into(),
        json!(if w.rate_label.is_number() {
            match a.workload.arrival.unwrap_or(Arrival::Poisson) {
                Arrival::Poisson => "poisson",
                Arrival::Fixed => "fixed",
            }
        } else {
            w.rate_label.as_str().unwrap_or("inf")
        }),
    );
    m.insert("max_concurrency".into(), json!(a.max_concurrency));
    m.insert(
        "shared_prefix_len".into(),
        json!(a.workload.shared_prefix_len),
    );
    m
}

/// Print the failures of a report to stderr.
fn print_errors(row: &Map<String, Value>) {
    if let Some(errors) = row.get("errors").and_then(Value::as_array) {
        for e in errors {
            errln!(
                "failed: {} request(s): {}",
                e["count"],
                e["message"].as_str().unwrap_or("")
            );
        }
    }
}

/// Print the reports of the runs: a preset's table (see [`preset::print`]), or the one
/// report, one line with `--json`, indented otherwise; failures also go to stderr.
fn print(a: &BenchServeArgs, rows: Vec<(Option<Peer>, Map<String, Value>)>) -> Result<()> {
    if rows.iter().any(|(peer, _)| peer.is_some()) {
        let rows: Vec<Map<String, Value>> = rows
            .into_iter()
            .map(|(peer, row)| match peer {
                Some((t, p)) => preset::with_peer(t, p, row),
                None => row,
            })
            .collect();
        return preset::print(&rows, a.json);
    }
    for (_, row) in rows {
        let row = Value::Object(row);
        if a.json {
            outln!("{row}")?;
        } else {
            outln!("{}", serde_json::to_string_pretty(&row)?)?;
        }
    }
    Ok(())
}

/// Say how many of a run's warm-up requests failed (stderr); their figures are dropped.
fn warmup_failures(records: &[report::Record]) {
    let failed: Vec<&str> = records.iter().filter_map(|r| r.error.as_deref()).collect();
    if let Some(first) = failed.first() {
        errln!("warm-up: {} request(s) failed: {first}", failed.len());
    }
}

pub fn run(a: BenchServeArgs) -> Result<()> {
    if a.in_process {
        run_in_process(a)
    } else {
        run_url(a)
    }
}

/// Load the server at `--url`: check it answers and serves the model, draw each run's
/// workload, send it (after its warm-up), and report (with the server's preemption and
/// step counts and its largest running batch when it exposes encore's /metrics).
fn run_url(a: BenchServeArgs) -> Result<()> {
    use client::Client;
    if a.engine.offload.weight_budget.is_some()
        || a.engine.eager
        || a.device.tensor_parallel_size > 1
    {
        bail!(
            "--weight-budget, --offload-policy, --eager and --tensor-parallel-size apply to the \
             engine of --in-process; give them to the server (`encore serve`) instead"
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
            None => match encore_core::model::open_local_model(&model) {
                Ok(files) => files.config.vocab_size,
                Err(e) => bail!(
                    "--vocab-size: the served model `{model}` is not a model on this machine ({e}); give the vocabulary size to draw prompt ids from"
                ),
            },
        };
        let runs = preset::runs(&a.workload)?;
        if let (Some(limit), Some(need)) =
            (max_model_len, runs.iter().filter(|r| r.peer.is_some()).map(Run::max_seq_len).max())
        {
            if need > limit {
                bail!(
                    "the requests reach {need} tokens ({}); the server's max_model_len is {limit}",
                    preset::length_flags(&a.workload)
                );
            }
        }
        let mut rows = Vec::new();
        for (k, run) in runs.iter().enumerate() {
            let w = workload::workload(&run.args, vocab)?;
            if let Some(limit) = max_model_len {
                let need = w.max_seq_len();
                if need > limit {
                    bail!(
                        "the requests reach {need} tokens ({}); the server's max_model_len is {limit}",
                        preset::length_flags(&a.workload)
                    );
                }
            }
            if run.peer.is_some() && !a.json {
                errln!("{}", preset::announce(k, run));
            }
            if let Some(warm) = &run.warmup {
                let warm = workload::workload(warm, vocab)?;
                warmup_failures(&client::drive(&client, &model, &warm, a.max_concurrency).await.records);
            }
            let row = measure_url(&a, &client, &model, &w).await;
            print_errors(&row);
            rows.push((run.peer, row));
        }
        print(&a, rows)
    })
}

/// Send `w` to the server and report, with the server's figures of the run from its
/// /metrics before and after.
async fn measure_url(
    a: &BenchServeArgs,
    client: &client::Client,
    model: &str,
    w: &Workload,
) -> Map<String, Value> {
    let before = client.metrics().await;
    let run = client::drive(client, model, w, a.max_concurrency).await;
    let after = client.metrics().await;
    let mut row = header(a, w, model, "url");
    row.extend(report(w, &run.records, run.duration_s));
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
    // Speculative decoding over this run: drafts kept per draft, tokens per verify.
    let (drafts, kept, verifies) = (
        delta("encore_spec_decode_num_draft_tokens_total").as_f64(),
        delta("encore_spec_decode_num_accepted_tokens_total").as_f64(),
        delta("encore_spec_decode_num_verifications_total").as_f64(),
    );
    let (rate, length) = spec_figures(drafts, kept, verifies);
    row.insert("spec_acceptance_rate".into(), rate);
    row.insert("spec_mean_accepted_length".into(), length);
    row
}

/// Speculative decoding's acceptance rate (drafts kept per draft) and mean accepted length
/// (tokens a verify step emits: 1 + kept per verify); null without drafts.
pub(crate) fn spec_figures(
    drafts: Option<f64>,
    kept: Option<f64>,
    verifies: Option<f64>,
) -> (Value, Value) {
    match (drafts, kept, verifies) {
        (Some(d), Some(k), Some(v)) if d > 0.0 && v > 0.0 => (json!(k / d), json!(1.0 + k / v)),
        _ => (Value::Null, Value::Null),
    }
}

/// Run the engine in this process: one engine, sized for the longest request of every
/// run, serves the runs one after the other (each after its warm-up).
fn run_in_process(a: BenchServeArgs) -> Result<()> {
    let model = a.model.clone().unwrap_or_else(|| "dummy:tiny".into());
    let (opened, tp) =
        crate::model_arg::open_devices(a.device.device, a.device.tensor_parallel_size)?;
    let be = opened.backend();
    let (cfg, source) = crate::model_arg::resolve(&model, &a.revision, a.quantization)?;
    let vocab = cfg.vocab_size;
    let runs = preset::runs(&a.workload)?;
    // The first run's workload is drawn now (its longest request sizes the engine without
    // a preset); a preset's rows have exact lengths.
    let mut first = Some(workload::workload(&runs[0].args, vocab)?);
    let longest = match runs[0].peer {
        None => first.as_ref().map_or(0, Workload::max_seq_len),
        Some(_) => runs.iter().map(Run::max_seq_len).max().unwrap_or(0),
    };
    let flags = preset::length_flags(&a.workload);
    let e = &a.engine;
    let max_seq_len = match e.max_seq_len {
        None => longest.next_multiple_of(e.block_size),
        Some(l) if l < longest => {
            bail!("the requests reach {longest} tokens ({flags}); --max-seq-len is {l}")
        }
        Some(l) => l,
    };
    if max_seq_len > cfg.max_position_embeddings {
        bail!(
            "the requests reach {max_seq_len} tokens ({flags}); the model has {} positions",
            cfg.max_position_embeddings
        );
    }
    let at_least = 1 + max_seq_len.div_ceil(e.block_size);
    let max_num_seqs = a.max_num_seqs.unwrap_or_else(|| {
        crate::engine_arg::default_max_num_seqs(be.memory_info().map(|(_, total)| total), 256)
    });
    let shape = EngineShape {
        max_seqs: max_num_seqs,
        max_seq_len,
        kv_at_least: at_least,
        cpu_kv_blocks: Some(at_least * max_num_seqs.min(64)),
        capture_all: true,
        run_name: format!(
            "bench serve (--max-num-seqs {}, --max-num-batched-tokens {}, {max_seq_len} tokens per sequence)",
            max_num_seqs, e.max_num_batched_tokens
        ),
        fix_hint: match runs[0].peer {
            None => "lower --max-num-seqs, --max-num-batched-tokens, --input-len or --output-len",
            Some(_) => "lower --max-num-seqs or --max-num-batched-tokens",
        }
        .into(),
    };
    let mut configs = e.config(be.as_ref(), a.dtype, shape)?;
    configs.0.tp = tp;
    let engine = engine_arg::start_engine(
        be,
        ModelFiles {
            config: cfg,
            source,
        },
        configs,
        Box::new(crate::progress::Bars::new(!a.json)),
        !a.json,
    )?;
    let mut rows = Vec::new();
    for (k, run) in runs.iter().enumerate() {
        let w = match first.take() {
            Some(w) => w,
            None => workload::workload(&run.args, vocab)?,
        };
        if run.peer.is_some() && !a.json {
            errln!("{}", preset::announce(k, run));
        }
        if let Some(warm) = &run.warmup {
            let warm = workload::workload(warm, vocab)?;
            warmup_failures(&in_process::drive(&engine, &warm, a.max_concurrency)?.records);
        }
        let since = in_process::Counters::read(&engine);
        let r = in_process::drive(&engine, &w, a.max_concurrency)?;
        let mut row = header(&a, &w, &model, "in-process");
        row.extend(report(&w, &r.records, r.duration_s));
        row.insert("max_running".into(), json!(r.max_running));
        in_process::engine_figures(&engine, e.offload.config().as_ref(), &since, &mut row);
        print_errors(&row);
        rows.push((run.peer, row));
    }
    print(&a, rows)
}
