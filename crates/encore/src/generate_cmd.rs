//! `encore generate`: load a model (HF directory or `dummy:NAME`), run a batch of prompts
//! eagerly, stream the tokens of a single prompt, print a summary or JSON.

use std::io::Write;

use anyhow::{bail, Context, Result};
use clap::Args;
use encore_core::device::DeviceSpec;
use encore_core::generate::{generate, FinishReason, GenerateOptions};
use encore_core::graph::BucketPolicy;
use encore_core::kv::{KvCache, KvCacheConfig};
use encore_core::memory::GraphMemory;
use encore_core::model::llama::Model;
use encore_core::model::weights;
use encore_core::runner::{Runner, RunnerConfig, SamplingParams};
use encore_core::tokenizer::{ChatMessage, StreamDecoder};
use encore_core::DType;

#[derive(Args)]
pub struct GenerateArgs {
    /// A Hugging Face model directory, or `dummy:NAME` for seeded random weights
    /// (tiny, tiny-llama3, tiny-qwen2, tiny-qwen3, qwen2.5-0.5b, llama-3.2-1b, llama-3-8b).
    #[arg(long, default_value = "dummy:tiny")]
    model: String,
    /// A prompt; repeat for a batch.
    #[arg(long = "prompt", default_value = "The capital of France is")]
    prompts: Vec<String>,
    /// Wrap each prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 0)]
    top_k: i32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// auto | cpu | cuda | cuda:N.
    #[arg(long, default_value = "auto")]
    device: String,
    /// Run dtype: bf16 | f16 | f32.
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// Longest sequence (prompt + output); default min(4096, the model's limit).
    #[arg(long)]
    max_seq_len: Option<usize>,
    /// Tokens per prefill step (longer prompts are prefilled in chunks).
    #[arg(long, default_value_t = 2048)]
    max_tokens_per_step: usize,
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Fraction of free device memory (after weights) for the KV cache, on CUDA.
    #[arg(long, default_value_t = 0.5)]
    kv_fraction: f64,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Print one JSON object per prompt (ids, text, timings) instead of text.
    #[arg(long)]
    json: bool,
    /// Run every step eagerly (no graph capture): the reference mode.
    #[arg(long)]
    eager: bool,
    /// Debug: after each graph replay, run the step eagerly too and fail on a mismatch.
    #[arg(long)]
    verify_graphs: bool,
    /// Decode batch-size buckets for graph mode: vllm ([1,2,4] + 8..256 step 8 + 256..
    /// step 16), pow2, or a comma list; capped at the batch (the number of prompts).
    #[arg(long, default_value = "vllm")]
    buckets: String,
    /// Capture every bucket's decode graph at start-up, largest first (a warm-up), instead
    /// of on first use.
    #[arg(long)]
    capture_all: bool,
    /// How captured graphs share intermediate memory: private (each its own), multi-va
    /// (a virtual range per graph over shared chunks), arena (one growable range).
    #[arg(long, default_value = "arena")]
    graph_memory: GraphMemory,
}

pub fn run(a: GenerateArgs) -> Result<()> {
    if a.block_size == 0 || a.max_tokens_per_step == 0 {
        bail!("--block-size and --max-tokens-per-step must be at least 1");
    }
    if !(a.kv_fraction > 0.0 && a.kv_fraction <= 1.0) {
        bail!("--kv-fraction {} must be in (0, 1]", a.kv_fraction);
    }
    let spec: DeviceSpec = a.device.parse()?;
    let dtype = DType::parse_float(&a.dtype)
        .with_context(|| format!("--dtype `{}`: expected bf16, f16 or f32", a.dtype))?;
    let opened = crate::model_arg::open_device(spec)?;
    let be = opened.backend();
    let be = be.as_ref();

    let (cfg, source) = crate::model_arg::resolve(&a.model)?;
    let tokenizer = encore_core::model::open_tokenizer(&source)?;
    let max_seq_len = a
        .max_seq_len
        .unwrap_or(cfg.max_position_embeddings.min(4096));
    if max_seq_len > cfg.max_position_embeddings {
        bail!(
            "--max-seq-len {max_seq_len} exceeds the model's max_position_embeddings {}",
            cfg.max_position_embeddings
        );
    }

    let prompts: Vec<Vec<u32>> = a
        .prompts
        .iter()
        .map(|p| {
            if a.chat {
                let text = tokenizer.apply_chat_template(
                    &[ChatMessage {
                        role: "user".into(),
                        content: p.clone(),
                    }],
                    true,
                )?;
                tokenizer.encode(&text, false)
            } else {
                tokenizer.encode(p, true)
            }
        })
        .collect::<encore_core::Result<_>>()?;
    if let Some(bad) = prompts
        .iter()
        .flatten()
        .find(|&&t| t as usize >= cfg.vocab_size)
    {
        bail!(
            "token id {bad} is outside the model's vocabulary of {}",
            cfg.vocab_size
        );
    }

    let t = std::time::Instant::now();
    let w = weights::load(be, &cfg, source, dtype, !a.json)?;
    let load_secs = t.elapsed().as_secs_f64();
    let model = Model::new(be, cfg.clone(), w, max_seq_len)?;

    // KV cache: what the batch needs, or on CUDA a fraction of free memory (at least the need).
    let kv_cfg = KvCacheConfig {
        num_layers: cfg.num_layers,
        num_kv_heads: cfg.num_kv_heads,
        head_dim: cfg.head_dim,
        block_size: a.block_size,
        dtype,
    };
    let per_seq = |p: &Vec<u32>| {
        (p.len() + a.max_tokens)
            .min(max_seq_len)
            .div_ceil(a.block_size)
    };
    let needed = 1 + prompts.iter().map(per_seq).sum::<usize>();
    let table_width = max_seq_len.div_ceil(a.block_size);
    let arena = model.arena_bytes(
        be,
        a.max_tokens_per_step,
        prompts.len(),
        table_width,
        a.block_size,
    );
    let num_blocks = match be.memory_info() {
        Some((free, _)) => {
            let budget = (free as f64 * a.kv_fraction) as usize;
            let fit = KvCache::num_blocks_for_budget(&kv_cfg, budget.saturating_sub(arena));
            if fit < needed {
                bail!(
                    "the KV cache needs {needed} blocks ({} bytes) but --kv-fraction {} of {} free bytes holds {fit}",
                    needed * kv_cfg.bytes_per_block(),
                    a.kv_fraction,
                    free
                );
            }
            fit
        }
        None => needed,
    };
    let mut runner = Runner::new(
        be,
        model,
        RunnerConfig {
            block_size: a.block_size,
            num_blocks,
            max_tokens_per_step: a.max_tokens_per_step,
            max_seqs: prompts.len(),
            max_seq_len,
        },
    )?;

    if !a.eager {
        runner.set_graph_memory(a.graph_memory)?;
        let policy = BucketPolicy::parse(&a.buckets, prompts.len())
            .with_context(|| format!("--buckets `{}`", a.buckets))?;
        runner.set_graph_mode(Some(policy));
        runner.set_verify_graphs(a.verify_graphs);
        if a.capture_all {
            runner.capture_all(!a.json)?;
            if let Some(s) = runner.graph_stats() {
                let m = runner.graph_memory_stats();
                let line = format!(
                    "captured {} decode graphs at start-up in {:.1} ms; {} memory {:.1} MiB physical",
                    s.captures,
                    s.capture_secs * 1e3,
                    m.strategy,
                    m.physical_bytes as f64 / (1u64 << 20) as f64
                );
                tracing::info!("{line}");
                if !a.json {
                    eprintln!("{line}");
                }
            }
        }
    }
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        sampling: SamplingParams {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            seed: a.seed,
        },
        ignore_eos: a.ignore_eos,
    };
    let eos = tokenizer.eos_token_ids();
    let stream = prompts.len() == 1 && !a.json;
    let mut decoder = StreamDecoder::new(&tokenizer, &prompts[0]);
    let mut stdout = std::io::stdout();
    let gens = generate(&mut runner, &prompts, &eos, &opts, |_, id| {
        if stream {
            if let Ok(Some(text)) = decoder.push(id) {
                let _ = write!(stdout, "{text}");
                let _ = stdout.flush();
            }
        }
    })?;
    if stream {
        if let Ok(Some(text)) = decoder.finish() {
            print!("{text}");
        }
        println!();
    }

    if let (Some(s), false) = (runner.graph_stats(), a.json) {
        let m = runner.graph_memory_stats();
        eprintln!(
            "graphs: {} captured in {:.1} ms, {} replays, {:.0}% padded rows, {} memory {:.1} MiB physical / {:.1} MiB virtual{}",
            s.captures,
            s.capture_secs * 1e3,
            s.hits + s.misses,
            100.0 * s.padded_rows as f64 / s.rows.max(1) as f64,
            m.strategy,
            m.physical_bytes as f64 / (1u64 << 20) as f64,
            m.virtual_bytes as f64 / (1u64 << 20) as f64,
            if s.verified > 0 {
                format!(
                    ", {} verified against eager (max error {:.1e})",
                    s.verified, s.max_verify_error
                )
            } else {
                String::new()
            }
        );
    }
    for (i, g) in gens.iter().enumerate() {
        let text = tokenizer.decode(&g.output_ids, true)?;
        let decode_tps = if g.decode_secs > 0.0 {
            (g.output_ids.len().saturating_sub(1)) as f64 / g.decode_secs
        } else {
            0.0
        };
        let finish = match g.finish {
            FinishReason::Eos => "eos",
            FinishReason::Length => "length",
            FinishReason::Context => "context",
        };
        if a.json {
            let v = serde_json::json!({
                "index": i,
                "prompt": a.prompts[i],
                "prompt_ids": g.prompt_ids,
                "output_ids": g.output_ids,
                "text": text,
                "finish_reason": finish,
                "prefill_ms": g.prefill_secs * 1e3,
                "decode_ms": g.decode_secs * 1e3,
                "decode_tokens_per_s": decode_tps,
                "load_s": load_secs,
                "device": be.device_name(),
            });
            println!("{v}");
        } else {
            if !stream {
                println!("[{i}] {}{text}", a.prompts[i]);
            }
            eprintln!(
                "[{i}] prompt {} tokens, generated {} ({finish}), prefill {:.1} ms, decode {:.1} tok/s, load {:.2} s on {}",
                g.prompt_ids.len(),
                g.output_ids.len(),
                g.prefill_secs * 1e3,
                decode_tps,
                load_secs,
                be.device_name()
            );
        }
    }
    Ok(())
}
