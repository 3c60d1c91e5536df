//! `encore serve`: the OpenAI-compatible server (encore-server) over the engine loop.

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use encore_core::engine::{EngineConfig, KvSizing};
use encore_core::memory::GraphMemory;
use encore_core::scheduler::SchedulerConfig;
use encore_core::serve::EngineHandle;
use encore_core::DType;
use encore_server::ServerConfig;

use crate::offload_arg::{self, OffloadArg};
use crate::out::errln;
use crate::{parse, DeviceArg};

#[derive(Args)]
pub struct ServeArgs {
    /// A Hugging Face model directory, a `.gguf` file, or `dummy:NAME`.
    #[arg(long, default_value = "dummy:tiny")]
    model: String,
    #[command(flatten)]
    device: DeviceArg,
    #[command(flatten)]
    offload: OffloadArg,
    /// Run dtype: bf16, f16 or f32 (aliases as for generate).
    #[arg(long, default_value = "bf16", value_parser = parse::dtype)]
    dtype: DType,
    /// Address to bind (loopback by default; 0.0.0.0 to listen on every interface).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed on stderr).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on /v1 requests (also from ENCORE_API_KEY).
    #[arg(long, env = "ENCORE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The model name clients use (default: the --model value).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Longest sequence, prompt and output (default: the model's positions, at most 4096).
    #[arg(long, value_parser = parse::count::<1, { 1 << 24 }>, allow_negative_numbers = true)]
    max_seq_len: Option<usize>,
    /// Most tokens in one engine step (chunked prefill beyond).
    #[arg(long, default_value = "2048", value_parser = parse::count::<1, { 1 << 20 }>, allow_negative_numbers = true)]
    max_num_batched_tokens: usize,
    /// Most sequences in one engine step.
    #[arg(long, default_value = "64", value_parser = parse::count::<1, 4096>, allow_negative_numbers = true)]
    max_num_seqs: usize,
    /// Tokens per KV-cache block.
    #[arg(long, default_value = "16", value_parser = parse::count::<1, 1024>, allow_negative_numbers = true)]
    block_size: usize,
    /// Fraction of device memory free after start-up's warm-up for the KV cache (CUDA).
    #[arg(long, default_value = "0.8", value_parser = parse::fraction, allow_negative_numbers = true)]
    kv_fraction: f64,
    /// KV blocks on the CPU backend (which reports no device memory).
    #[arg(long, default_value = "1024", value_parser = parse::count::<2, { 1 << 30 }>, allow_negative_numbers = true)]
    cpu_kv_blocks: usize,
    /// Run every step eagerly (no graphs).
    #[arg(long)]
    eager: bool,
    /// Decode batch-size buckets (as for generate), up to --max-num-seqs.
    #[arg(long, default_value = "vllm")]
    buckets: String,
    /// Prefill token buckets (as for generate), up to --max-num-batched-tokens.
    #[arg(long, default_value = "auto")]
    prefill_buckets: String,
    /// Capture graphs on first use instead of all at start-up.
    #[arg(long)]
    lazy_capture: bool,
    /// Compute every request's whole prompt: no reuse of cached KV blocks of earlier
    /// requests with the same prefix.
    #[arg(long)]
    no_prefix_cache: bool,
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
    let opened = crate::model_arg::open_device(a.device.device)?;
    let be = opened.backend();
    let (cfg, source) = crate::model_arg::resolve(&a.model)?;
    let tokenizer = Arc::new(encore_core::model::open_tokenizer(&source)?);
    let max_seq_len = a
        .max_seq_len
        .unwrap_or(cfg.max_position_embeddings.min(4096));
    if max_seq_len > cfg.max_position_embeddings {
        bail!(
            "--max-seq-len {max_seq_len} exceeds the model's max_position_embeddings {}",
            cfg.max_position_embeddings
        );
    }
    let graphs = if a.eager {
        None
    } else {
        Some(crate::graphs::config(
            be.as_ref(),
            &a.buckets,
            a.max_num_seqs,
            &a.prefill_buckets,
            a.max_num_batched_tokens,
        )?)
    };
    // At least one longest sequence's blocks, plus the null block.
    let at_least = 1 + max_seq_len.div_ceil(a.block_size);
    let kv = if be.memory_info().is_some() {
        KvSizing::DeviceFraction {
            fraction: a.kv_fraction,
            at_least,
        }
    } else {
        KvSizing::Blocks(a.cpu_kv_blocks.max(at_least))
    };
    let offload = a.offload.config();
    let engine_cfg = EngineConfig {
        offload,
        dtype: a.dtype,
        block_size: a.block_size,
        max_tokens_per_step: a.max_num_batched_tokens,
        max_seqs: a.max_num_seqs,
        max_seq_len,
        kv,
        graphs,
        graph_memory: GraphMemory::Arena,
        capture_all: !a.lazy_capture,
        verify_graphs: false,
        extra_bytes: 0,
        run_name: format!(
            "serve (--max-num-seqs {}, --max-num-batched-tokens {}, --max-seq-len {max_seq_len})",
            a.max_num_seqs, a.max_num_batched_tokens
        ),
        fix_hint: "lower --max-num-seqs, --max-num-batched-tokens or --max-seq-len".into(),
    };
    let sched = SchedulerConfig {
        max_num_batched_tokens: a.max_num_batched_tokens,
        max_num_seqs: a.max_num_seqs,
        prefix_cache: !a.no_prefix_cache,
    };
    let t = std::time::Instant::now();
    let engine = Arc::new(EngineHandle::start(
        be,
        a.model.clone(),
        engine_cfg,
        sched,
        Box::new(crate::progress::Bars::new(true)),
    )?);
    if let Some(line) = offload_arg::summary(
        offload.as_ref(),
        engine.boot.offload.as_ref(),
        cfg.weight_bytes(a.dtype),
    ) {
        errln!("{line}");
    }
    let server_cfg = ServerConfig {
        served_model_name: a.served_model_name.unwrap_or_else(|| a.model.clone()),
        api_key: a.api_key.filter(|k| !k.is_empty()),
        max_body_bytes: a.max_body_bytes,
        default_max_tokens: 16,
        max_waiting: a.max_waiting,
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
