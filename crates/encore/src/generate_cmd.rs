//! `encore generate`: load a model (HF directory, GGUF file or `dummy:NAME`), run a batch
//! of prompts, stream the text of a single prompt (a header per prompt for a batch), print
//! summary lines on stderr, or JSON. The prompts go to the engine loop `encore serve`
//! runs (`EngineHandle`, its own thread): every CLI path that generates is the served
//! path.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use clap::Args;
use encore_core::engine::{EngineConfig, KvSizing};
use encore_core::memory::GraphMemory;
use encore_core::progress::{Progress, Unit};
use encore_core::request::{Event, FinishReason, Request, RequestParams};
use encore_core::runner::SamplingParams;
use encore_core::scheduler::SchedulerConfig;
use encore_core::serve::EngineHandle;
use encore_core::tokenizer::{ChatMessage, StopMatcher, StopStream};
use encore_core::DType;

use crate::offload_arg::{self, OffloadArg};
use crate::out::{errln, out, outln};
use crate::progress::Bars;
use crate::{parse, prompts, DeviceArg};

#[derive(Args)]
pub struct GenerateArgs {
    /// A Hugging Face model directory, a `.gguf` file, or `dummy:NAME` for seeded random weights
    /// (tiny, tiny-llama3, tiny-qwen2, tiny-qwen3, smollm2-135m, qwen2.5-0.5b, llama-3.2-1b,
    /// llama-3-8b).
    #[arg(long, default_value = "dummy:tiny")]
    model: String,
    /// A prompt; repeat for a batch. `-` reads one prompt from standard input. Default
    /// (when neither --prompt nor --prompt-file is given): "The capital of France is".
    #[arg(long = "prompt", value_name = "TEXT", allow_hyphen_values = true)]
    prompts: Vec<String>,
    /// A file of prompts, one per line (blank lines skipped; a line starting with `{` is
    /// JSON with a string field "prompt", so JSONL works); added after any --prompt.
    #[arg(long, value_name = "FILE")]
    prompt_file: Option<PathBuf>,
    /// Wrap each prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Most new tokens per prompt.
    #[arg(long, default_value = "32", value_parser = parse::count::<1, { usize::MAX }>, allow_negative_numbers = true)]
    max_tokens: usize,
    /// Sampling temperature, >= 0 (0 = greedy).
    #[arg(long, default_value = "0", value_parser = parse::temperature, allow_negative_numbers = true)]
    temperature: f32,
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches P, in
    /// (0, 1] (1 = off).
    #[arg(long, default_value = "1", value_parser = parse::top_p, allow_negative_numbers = true)]
    top_p: f32,
    /// Keep the K most likely tokens, >= 0 (0 = off).
    #[arg(long, default_value = "0", value_parser = parse::top_k, allow_negative_numbers = true)]
    top_k: i32,
    /// Drop tokens less likely than P times the likeliest, in [0, 1] (0 = off).
    #[arg(long, default_value = "0", value_parser = parse::min_p, allow_negative_numbers = true)]
    min_p: f32,
    /// Subtract this from the logit of every token already generated, in [-2, 2] (0 = off).
    #[arg(long, default_value = "0", value_parser = parse::penalty, allow_negative_numbers = true)]
    presence_penalty: f32,
    /// Subtract this times its count from the logit of every token generated, in [-2, 2]
    /// (0 = off).
    #[arg(long, default_value = "0", value_parser = parse::penalty, allow_negative_numbers = true)]
    frequency_penalty: f32,
    /// Divide positive logits (multiply negative ones) of tokens in the prompt or the
    /// output by this, > 0 (1 = off).
    #[arg(long, default_value = "1", value_parser = parse::repetition_penalty, allow_negative_numbers = true)]
    repetition_penalty: f32,
    /// End a prompt's output where its text reaches TEXT (the text ends before it;
    /// finish reason `stop`). Repeat for several.
    #[arg(long = "stop", value_name = "TEXT", value_parser = parse::stop)]
    stop: Vec<String>,
    /// Sampling seed (the same seed gives the same output).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    seed: u64,
    #[command(flatten)]
    device: DeviceArg,
    #[command(flatten)]
    offload: OffloadArg,
    /// Run dtype: bf16, f16 or f32 (also bfloat16, fp16, float16, half, fp32, float32;
    /// any case).
    #[arg(long, default_value = "bf16", value_parser = parse::dtype)]
    dtype: DType,
    /// Longest sequence (prompt + output); default min(4096, the model's limit).
    #[arg(long, value_parser = parse::count::<1, { usize::MAX }>, allow_negative_numbers = true)]
    max_seq_len: Option<usize>,
    /// Most tokens in one step (longer prompts are prefilled in chunks of this size);
    /// formerly --max-tokens-per-step.
    #[arg(
        long,
        alias = "max-tokens-per-step",
        default_value = "2048",
        value_parser = parse::count::<1, { MAX_BATCHED_TOKENS }>,
        allow_negative_numbers = true
    )]
    max_num_batched_tokens: usize,
    /// Tokens per KV-cache block.
    #[arg(long, default_value = "16", value_parser = parse::count::<1, 1024>, allow_negative_numbers = true)]
    block_size: usize,
    /// Fraction of free device memory (after weights) for the KV cache, in (0, 1]; CUDA
    /// only (on the CPU the cache holds exactly what the batch needs).
    #[arg(long, default_value = "0.5", value_parser = parse::fraction, allow_negative_numbers = true)]
    kv_fraction: f64,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Compute every prompt whole: no reuse of cached KV blocks of prompts with the same
    /// prefix.
    #[arg(long)]
    no_prefix_cache: bool,
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
    /// Token-count buckets for prefill and mixed steps, captured piecewise (attention
    /// eager between the pieces): auto (sglang on a GPU, none on the CPU), sglang (4..32
    /// step 4, ..256 step 16, ..512 step 32, ..1024 step 64, ..4096 step 256, then 512),
    /// pow2, none, or a comma list; capped at --max-num-batched-tokens.
    #[arg(long, default_value = "auto")]
    prefill_buckets: String,
    /// Capture every decode and prefill bucket at start-up, largest first (a warm-up),
    /// instead of on first use.
    #[arg(long)]
    capture_all: bool,
    /// How captured graphs share intermediate memory: private (each its own), multi-va
    /// (a virtual range per graph over shared chunks), arena (one growable range).
    #[arg(long, default_value = "arena")]
    graph_memory: GraphMemory,
}

/// The largest `--max-num-batched-tokens`.
const MAX_BATCHED_TOKENS: usize = 1 << 24;

pub fn run(a: GenerateArgs) -> Result<()> {
    let texts = if a.prompts.is_empty() && a.prompt_file.is_none() {
        vec![DEFAULT_PROMPT.to_string()]
    } else {
        prompts::collect(&a.prompts, a.prompt_file.as_deref(), prompts::read_stdin)?
    };
    let dtype = a.dtype;
    let opened = crate::model_arg::open_device(a.device.device)?;
    let backend = opened.backend();
    let be = backend.as_ref();

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

    let prompts: Vec<Vec<u32>> = texts
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

    if let Some((i, p)) = prompts
        .iter()
        .enumerate()
        .find(|(_, p)| p.len() >= max_seq_len)
    {
        bail!(
            "prompt {} has {} tokens; the context limit is --max-seq-len {max_seq_len} (raise it)",
            i + 1,
            p.len()
        );
    }

    // The KV cache holds what the batch needs (on CUDA: a fraction of free memory, at
    // least the need). Weights, cache and activations must fit before anything loads.
    let per_seq = |p: &Vec<u32>| {
        p.len()
            .saturating_add(a.max_tokens)
            .min(max_seq_len)
            .div_ceil(a.block_size)
    };
    let needed = prompts
        .iter()
        .map(per_seq)
        .fold(1usize, usize::saturating_add);
    let graphs = if a.eager {
        None
    } else {
        Some(crate::graphs::config(
            be,
            &a.buckets,
            prompts.len(),
            &a.prefill_buckets,
            a.max_num_batched_tokens,
        )?)
    };
    let offload = a.offload.config();
    let engine_cfg = EngineConfig {
        offload,
        dtype,
        block_size: a.block_size,
        max_tokens_per_step: a.max_num_batched_tokens,
        max_seqs: prompts.len(),
        max_seq_len,
        kv: KvSizing::DeviceFraction {
            fraction: a.kv_fraction,
            at_least: needed,
        },
        graphs,
        graph_memory: a.graph_memory,
        capture_all: a.capture_all,
        verify_graphs: a.verify_graphs,
        extra_bytes: 0,
        run_name: format!(
            "generate ({} prompt{}, --max-tokens {}, --max-seq-len {max_seq_len}, --max-num-batched-tokens {})",
            prompts.len(),
            if prompts.len() == 1 { "" } else { "s" },
            a.max_tokens,
            a.max_num_batched_tokens
        ),
        fix_hint: "use fewer prompts, or lower --max-tokens, --max-seq-len or --max-num-batched-tokens (or raise --kv-fraction)".into(),
    };
    let sched = SchedulerConfig {
        max_num_batched_tokens: a.max_num_batched_tokens,
        max_num_seqs: prompts.len(),
        prefix_cache: !a.no_prefix_cache,
    };
    let engine = EngineHandle::start(
        backend.clone(),
        a.model.clone(),
        engine_cfg,
        sched,
        Box::new(Bars::new(!a.json)),
    )?;
    let load_secs = engine.boot.load_secs;
    if let Some(line) = offload_arg::summary(
        offload.as_ref(),
        engine.boot.offload.as_ref(),
        cfg.weight_bytes(dtype),
    ) {
        tracing::info!("{line}");
        if !a.json {
            errln!("{line}");
        }
    }
    if a.capture_all {
        let st = engine.runner_stats()?;
        if let (Some(s), m) = (st.graphs, st.memory) {
            let line = format!(
                "captured {} graphs ({} pieces) at start-up in {:.1} ms; {} memory {:.1} MiB physical",
                s.captures,
                s.pieces,
                engine.boot.capture_secs * 1e3,
                m.strategy,
                mib(m.physical_bytes)
            );
            tracing::info!("{line}");
            if !a.json {
                errln!("{line}");
            }
        }
    }
    let params = RequestParams {
        sampling: SamplingParams {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            min_p: a.min_p,
            presence_penalty: a.presence_penalty,
            frequency_penalty: a.frequency_penalty,
            repetition_penalty: a.repetition_penalty,
            seed: a.seed,
            ..Default::default()
        },
        max_tokens: a.max_tokens,
        stop_token_ids: tokenizer.eos_token_ids(),
        ignore_eos: a.ignore_eos,
        fit_context: false,
    };
    let stream = prompts.len() == 1 && !a.json;
    if prompts.is_empty() {
        bail!("no prompts to run");
    }
    // Each prompt's text as it streams, through its stop strings (when there are any),
    // and what it released so far.
    let mut texts_out = prompts
        .iter()
        .map(|p| {
            let stop = StopMatcher::new(a.stop.iter().cloned())?;
            Ok((StopStream::new(&tokenizer, p, stop), String::new()))
        })
        .collect::<encore_core::Result<Vec<_>>>()?;
    let bars = Bars::new(!a.json);
    let mut gens: Vec<Generation> = Vec::with_capacity(prompts.len());
    let ran = run_on_engine(&engine, &prompts, &params, &bars, &mut gens, |i, id| {
        let (t, released) = &mut texts_out[i];
        let out = t.push(id);
        released.push_str(&out.text);
        if stream && i == 0 {
            out!("{}", out.text)?;
        }
        Ok(out.stopped)
    });
    // However the run ended (a closed stdout, a failed request), no request stays live.
    if ran.is_err() {
        for (i, g) in gens.iter().enumerate() {
            if g.finish == FinishReason::Stopped {
                engine.abort(i as u64);
            }
        }
    }
    let stats = engine.runner_stats();
    engine.shutdown();
    ran?;
    for (i, (t, released)) in texts_out.iter_mut().enumerate() {
        let rest = t.finish();
        released.push_str(&rest);
        if stream && i == 0 {
            out!("{rest}")?;
            outln!()?;
        }
    }

    if let (
        Ok(encore_core::serve::RunnerStats {
            graphs: Some(s),
            memory: m,
        }),
        false,
    ) = (stats, a.json)
    {
        errln!(
            "graphs: {} captured in {:.1} ms, {} replays, {:.0}% padded rows, {} memory {:.1} MiB physical / {:.1} MiB virtual{}",
            s.captures,
            s.capture_secs * 1e3,
            s.hits + s.misses,
            100.0 * s.padded_rows as f64 / s.rows.max(1) as f64,
            m.strategy,
            mib(m.physical_bytes),
            mib(m.virtual_bytes),
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
    let n = gens.len();
    for (i, (g, prompt)) in gens.iter().zip(&texts).enumerate() {
        let text = if a.stop.is_empty() {
            tokenizer.decode(&g.output_ids, true)?
        } else {
            texts_out[i].1.clone()
        };
        let decode_tps = tokens_per_sec(g.output_ids.len().saturating_sub(1), g.decode_secs);
        let finish = g.finish.name();
        if a.json {
            let v = serde_json::json!({
                "index": i,
                "prompt": prompt,
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
            outln!("{v}")?;
        } else if stream {
            errln!(
                "summary: prompt {} tokens, generated {} ({finish}), prefill {:.1} ms, decode {:.1} tok/s, weights loaded in {:.2} s, on {}",
                g.prompt_ids.len(),
                g.output_ids.len(),
                g.prefill_secs * 1e3,
                decode_tps,
                load_secs,
                be.device_name()
            );
        } else {
            outln!("=== [{}/{n}] prompt: {} ===", i + 1, excerpt(prompt))?;
            outln!("{text}")?;
            errln!(
                "summary [{}/{n}]: prompt {} tokens, generated {} ({finish}), decode {:.1} tok/s (per sequence)",
                i + 1,
                g.prompt_ids.len(),
                g.output_ids.len(),
                decode_tps,
            );
        }
    }
    if !a.json && !stream {
        let decoded: usize = gens
            .iter()
            .map(|g| g.output_ids.len().saturating_sub(1))
            .sum();
        let decode_secs = gens.iter().map(|g| g.decode_secs).fold(0.0, f64::max);
        let prefill_secs = gens.first().map_or(0.0, |g| g.prefill_secs);
        errln!(
            "summary: {n} prompts on {}, weights loaded in {load_secs:.2} s, prefill {:.1} ms (all prompts), decode {:.1} tok/s (all sequences)",
            be.device_name(),
            prefill_secs * 1e3,
            tokens_per_sec(decoded, decode_secs)
        );
    }
    Ok(())
}

const DEFAULT_PROMPT: &str = "The capital of France is";

/// One prompt's run, as the caller saw it.
struct Generation {
    prompt_ids: Vec<u32>,
    output_ids: Vec<u32>,
    /// `Stopped` until its last token arrives.
    finish: FinishReason,
    /// From submission to its first token (its prefill, and whatever ran before it).
    prefill_secs: f64,
    /// From its first token to its last.
    decode_secs: f64,
}

/// Submit every prompt (request id = its index) to the engine loop and collect their
/// tokens into `gens` until every one finished; `on_token(i, id)` sees each token of
/// prompt `i` in arrival order and says whether the prompt's text reached a stop string:
/// the prompt then ends there (`StopString`, and the engine frees it). A failed request
/// or an `on_token` error (stdout's reader went away) ends the run with that error;
/// `gens` then holds what arrived, unfinished prompts at `Stopped`.
/// `progress` sees the prompt tokens prefilled, from the engine's metrics.
fn run_on_engine(
    engine: &EngineHandle,
    prompts: &[Vec<u32>],
    params: &RequestParams,
    progress: &dyn Progress,
    gens: &mut Vec<Generation>,
    mut on_token: impl FnMut(usize, u32) -> std::io::Result<bool>,
) -> Result<()> {
    gens.clear();
    gens.extend(prompts.iter().map(|p| Generation {
        prompt_ids: p.clone(),
        output_ids: Vec::new(),
        finish: FinishReason::Stopped,
        prefill_secs: 0.0,
        decode_secs: 0.0,
    }));
    let computed = || engine.metrics.tokens_computed_total.load(Ordering::Relaxed);
    let computed_before = computed();
    let total_prompt: usize = prompts.iter().map(Vec::len).sum();
    progress.start("prefill", total_prompt as u64, Unit::Tokens);
    let mut prefilling = true;
    let (tx, rx) = mpsc::channel::<(usize, Instant, Event)>();
    let t0 = Instant::now();
    for (i, p) in prompts.iter().enumerate() {
        let tx = tx.clone();
        engine.submit(
            Request {
                id: i as u64,
                prompt: p.clone(),
                params: params.clone(),
            },
            Box::new(move |e| tx.send((i, Instant::now(), e)).is_ok()),
        )?;
    }
    drop(tx);
    let mut first: Vec<Option<Instant>> = vec![None; prompts.len()];
    let mut unfinished = prompts.len();
    let result = loop {
        if unfinished == 0 {
            break Ok(());
        }
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok((i, at, Event::Token(o))) => {
                let g = &mut gens[i];
                if g.finish == FinishReason::StopString {
                    continue; // a step in flight when its stop string matched
                }
                g.output_ids.push(o.token);
                let f = *first[i].get_or_insert(at);
                g.prefill_secs = (f - t0).as_secs_f64();
                g.decode_secs = (at - f).as_secs_f64();
                if let Some(finish) = o.finish {
                    g.finish = finish;
                    unfinished -= 1;
                }
                match on_token(i, o.token) {
                    Ok(false) => {}
                    Ok(true) => {
                        if o.finish.is_none() {
                            engine.finish(i as u64);
                            unfinished -= 1;
                        }
                        gens[i].finish = FinishReason::StopString;
                    }
                    Err(e) => break Err(e.into()),
                }
            }
            Ok((i, _, Event::Refused(r))) => break Err(anyhow!("prompt {}: {r}", i + 1)),
            Ok((i, _, Event::Failed(msg))) => break Err(anyhow!("prompt {}: {msg}", i + 1)),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                break Err(anyhow!(
                    "the engine loop stopped before every prompt finished"
                ))
            }
        }
        if prefilling {
            let prefilled = (computed().saturating_sub(computed_before) as usize).min(total_prompt);
            progress.set(prefilled as u64);
            if prefilled == total_prompt || first.iter().all(Option::is_some) {
                progress.finish(); // prefill is over: the bar ends
                prefilling = false;
            }
        }
    };
    if prefilling {
        progress.finish();
    }
    result
}

fn tokens_per_sec(tokens: usize, secs: f64) -> f64 {
    if secs > 0.0 {
        tokens as f64 / secs
    } else {
        0.0
    }
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// A prompt for a header line: quoted and escaped, cut to 60 characters.
fn excerpt(prompt: &str) -> String {
    const MAX: usize = 60;
    if prompt.chars().count() <= MAX {
        format!("{prompt:?}")
    } else {
        let cut: String = prompt.chars().take(MAX).collect();
        format!("{cut:?}...")
    }
}
