//! `encore serve`: the OpenAI-compatible server (encore-server) over the engine loop.

use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use encore_core::constraint::ConstraintCompiler;
use encore_core::model::ModelFiles;
use encore_server::{ReasoningFormat, ServerConfig, ToolFormat};

use crate::engine_arg::{self, EngineArgs, EngineShape};
use crate::model_arg::ModelArgs;
use crate::out::errln;
use crate::parse;

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
    /// Most sequences in one engine step (default: 1024 on a GPU of 70 GiB or more, 256 on
    /// a smaller one, 64 on the CPU).
    #[arg(long, value_parser = parse::count::<1, 4096>, allow_negative_numbers = true)]
    max_num_seqs: Option<usize>,
    /// KV blocks on the CPU backend (which reports no device memory).
    #[arg(long, default_value = "1024", value_parser = parse::count::<2, { 1 << 30 }>, allow_negative_numbers = true)]
    cpu_kv_blocks: usize,
    /// Capture graphs on first use instead of all at start-up.
    #[arg(long)]
    lazy_capture: bool,
    /// Address to bind (loopback by default; 0.0.0.0 to listen on every interface).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed on stderr).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on /v1 requests (also from ENCORE_API_KEY).
    #[arg(long, env = "ENCORE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// How the model writes tool calls: hermes (`<tool_call>` tags: Hermes, Qwen2.5, Qwen3),
    /// llama3_json (Llama 3.x), mistral (`[TOOL_CALLS]`), harmony (gpt-oss's chat format,
    /// prompt and output). Default: read from the chat template; harmony for gpt-oss.
    #[arg(long, value_name = "FORMAT", value_parser = parse_tool_format)]
    tool_call_parser: Option<ToolFormat>,
    /// Split `<think>` reasoning out of chat answers into `reasoning_content`: qwen3 or
    /// deepseek_r1; harmony (gpt-oss's chat format, prompt and output; the default for
    /// gpt-oss and a tokenizer with harmony's special tokens).
    #[arg(long, value_name = "FORMAT", value_parser = parse_reasoning_format)]
    reasoning_parser: Option<ReasoningFormat>,
    /// The model name clients use (default: the --model value).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Refuse new requests with 503 and `Retry-After` while this many wait in the queue.
    #[arg(long, value_parser = parse::count::<0, { 1 << 30 }>, allow_negative_numbers = true)]
    max_waiting: Option<usize>,
    /// Largest request body in bytes.
    #[arg(long, default_value = "4194304", value_parser = parse::count::<1024, { 1 << 30 }>, allow_negative_numbers = true)]
    max_body_bytes: usize,
    /// Seconds requests in flight get to finish after SIGINT/SIGTERM; the rest are then cut
    /// off (streams end with an error event, whole responses get a 503).
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = parse::count::<0, 86400>, allow_negative_numbers = true)]
    shutdown_timeout: usize,
}

pub fn run(a: ServeArgs) -> Result<()> {
    let (opened, cfg, source, tp) = a.model.open()?;
    let be = opened.backend();
    let tokenizer = Arc::new(encore_core::model::open_tokenizer(&source)?);
    let max_seq_len = a.engine.max_seq_len(&cfg)?;
    let e = &a.engine;
    let max_num_seqs = a.max_num_seqs.unwrap_or_else(|| {
        crate::engine_arg::default_max_num_seqs(be.memory_info().map(|(_, total)| total), 64)
    });
    let shape = EngineShape {
        max_seqs: max_num_seqs,
        max_seq_len,
        // At least one longest sequence's blocks, plus the null block.
        kv_at_least: 1 + max_seq_len.div_ceil(e.block_size),
        cpu_kv_blocks: Some(a.cpu_kv_blocks),
        capture_all: !a.lazy_capture,
        run_name: format!(
            "serve (--max-num-seqs {}, --max-num-batched-tokens {}, --max-seq-len {max_seq_len})",
            max_num_seqs, e.max_num_batched_tokens
        ),
        fix_hint: "lower --max-num-seqs, --max-num-batched-tokens or --max-seq-len".into(),
    };
    let mut configs = e.config(be.as_ref(), a.model.dtype, shape)?;
    configs.0.tp = tp;
    configs.0.constraints = Some(Arc::new(
        ConstraintCompiler::new(&tokenizer, cfg.vocab_size)
            .map_err(|e| anyhow::anyhow!("indexing the tokenizer for structured outputs: {e}"))?,
    ));
    let t = std::time::Instant::now();
    let engine = Arc::new(engine_arg::start_engine(
        be,
        ModelFiles {
            config: cfg.clone(),
            source: source.clone(),
        },
        configs,
        Box::new(crate::progress::Bars::new(true)),
        true,
    )?);
    let server_cfg = ServerConfig {
        served_model_name: a.served_model_name.unwrap_or_else(|| a.model.model.clone()),
        api_key: a.api_key.filter(|k| !k.is_empty()),
        max_body_bytes: a.max_body_bytes,
        default_max_tokens: 16,
        max_waiting: a.max_waiting,
        tool_call_parser: a.tool_call_parser,
        // gpt-oss speaks harmony, whatever its tokenizer (a dummy's bytes included).
        reasoning_parser: a
            .reasoning_parser
            .or((cfg.arch == encore_core::model::config::Arch::GptOss)
                .then_some(ReasoningFormat::Harmony)),
    };
    let name = server_cfg.served_model_name.clone();
    let app = encore_server::app(Arc::clone(&engine), tokenizer, server_cfg);
    let grace = std::time::Duration::from_secs(a.shutdown_timeout as u64);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
            .await
            .with_context(|| format!("binding {}:{}", a.host, a.port))?;
        let addr = listener.local_addr()?;
        errln!(
            "serving `{name}` on http://{addr} (engine up in {:.1} s; Ctrl-C to stop)",
            t.elapsed().as_secs_f64()
        );
        let signal = async move {
            let name = shutdown_signal().await;
            errln!(
                "{name}: shutting down (no new connections; requests in flight get up to {} s)",
                grace.as_secs()
            );
        };
        encore_server::serve(listener, app, signal, grace).await?;
        anyhow::Ok(())
    })?;
    // Requests in flight finished or were cut off; stop the engine.
    drop(engine);
    errln!("stopped");
    Ok(())
}

/// SIGINT or SIGTERM; returns the signal's name.
async fn shutdown_signal() -> &'static str {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => "SIGINT",
        _ = term => "SIGTERM",
    }
}

/// A `--tool-call-parser` name.
fn parse_tool_format(s: &str) -> Result<ToolFormat, String> {
    named(s, &ToolFormat::ALL)
}

/// A `--reasoning-parser` name.
fn parse_reasoning_format(s: &str) -> Result<ReasoningFormat, String> {
    named(s, &ReasoningFormat::ALL)
}

fn named<T: Copy>(s: &str, all: &[(&str, T)]) -> Result<T, String> {
    all.iter()
        .find(|(n, _)| *n == s)
        .map(|&(_, f)| f)
        .ok_or_else(|| {
            let names: Vec<&str> = all.iter().map(|(n, _)| *n).collect();
            format!("`{s}` is not one of {}", names.join(", "))
        })
}
