//! `encore generate`: load a model (HF directory, GGUF file or `dummy:NAME`), run a batch
//! of prompts, stream the text of a single prompt (a header per prompt for a batch), print
//! summary lines on stderr, or JSON. The prompts go to the engine loop `encore serve`
//! runs (`EngineHandle`, its own thread): every CLI path that generates is the served
//! path.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use encore_core::constraint::ConstraintCompiler;
use encore_core::model::config::ModelConfig;
use encore_core::model::ModelFiles;
use encore_core::progress::{Progress, Unit};
use encore_core::request::SamplingParams;
use encore_core::request::{Constraint, Event, FinishReason, Request, RequestParams};
use encore_core::serve::{EngineHandle, RunnerStats};
use encore_core::tokenizer::{ChatMessage, StopMatcher, StopStream, Tokenizer};

use crate::engine_arg::{self, EngineArgs, EngineShape};
use crate::model_arg::ModelArgs;
use crate::out::{errln, out, outln};
use crate::progress::Bars;
use crate::{parse, prompts};

#[derive(Args)]
#[command(mut_arg("kv_fraction", |a| a.default_value("0.5")))]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
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
    /// Constrain every output to JSON matching the JSON schema in FILE (structured
    /// outputs, as the server's `response_format` json_schema).
    #[arg(long, value_name = "FILE", conflicts_with = "regex")]
    json_schema: Option<PathBuf>,
    /// Constrain every output to text matching this regular expression, whole.
    #[arg(long, value_name = "REGEX")]
    regex: Option<String>,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Print one JSON object per prompt (ids, text, timings) instead of text.
    #[arg(long)]
    json: bool,
    /// Capture every decode, prefill and verify bucket at start-up, largest first (a
    /// warm-up), instead of on first use.
    #[arg(long)]
    capture_all: bool,
}

pub fn run(a: GenerateArgs) -> Result<()> {
    let texts = if a.prompts.is_empty() && a.prompt_file.is_none() {
        vec![DEFAULT_PROMPT.to_string()]
    } else {
        prompts::collect(&a.prompts, a.prompt_file.as_deref(), prompts::read_stdin)?
    };
    let (opened, cfg, source, tp) = a.model.open()?;
    let backend = opened.backend();
    let be = backend.as_ref();
    let tokenizer = encore_core::model::open_tokenizer(&source)?;
    let max_seq_len = a.engine.max_seq_len(&cfg)?;
    let prompts = encode(&a, &tokenizer, &texts, &cfg, max_seq_len)?;
    let mut configs =
        a.engine
            .config(be, a.model.dtype, engine_shape(&a, &prompts, max_seq_len))?;
    configs.0.tp = tp;
    let mut constrained = None;
    if a.json_schema.is_some() || a.regex.is_some() {
        let compiler = ConstraintCompiler::new(&tokenizer, cfg.vocab_size)
            .map_err(|e| anyhow!("indexing the tokenizer for --json-schema / --regex: {e}"))?;
        constrained = constraint(&a, &compiler)?;
        configs.0.constraints = Some(std::sync::Arc::new(compiler));
    }
    let engine = engine_arg::start_engine(
        backend.clone(),
        ModelFiles {
            config: cfg.clone(),
            source: source.clone(),
        },
        configs,
        Box::new(Bars::new(!a.json)),
        !a.json,
    )?;
    let load_secs = engine.boot.load_secs;
    if a.capture_all {
        report_capture(&engine, a.json)?;
    }
    let params = request_params(&a, &tokenizer, constrained);
    if prompts.is_empty() {
        bail!("no prompts to run");
    }
    let stream = prompts.len() == 1 && !a.json;
    let metrics = engine.metrics.clone();
    let (gens, released, stats) = run_prompts(&a, engine, &tokenizer, &prompts, &params, stream)?;
    if let (Ok(stats), false) = (stats, a.json) {
        print_graph_stats(&stats);
    }
    let run = Run {
        device: be.device_name(),
        load_secs,
        stream,
    };
    for (i, (g, prompt)) in gens.iter().zip(&texts).enumerate() {
        let text = if a.stop.is_empty() {
            tokenizer.decode(&g.output_ids, true)?
        } else {
            released[i].clone()
        };
        print_generation(&a, &run, (i, gens.len()), g, prompt, &text)?;
    }
    if !a.json && !stream {
        print_batch_summary(&run, &gens);
    }
    if a.engine.speculative_method.is_some() && !a.json {
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        let m = &metrics;
        let (drafts, kept, verifies) = (
            load(&m.spec_drafts_total),
            load(&m.spec_accepted_total),
            load(&m.spec_verifications_total),
        );
        errln!(
            "speculative decoding: {verifies} verify steps, {drafts} drafts, {kept} kept ({:.1}%), {:.2} tokens a verify step",
            100.0 * kept as f64 / drafts.max(1) as f64,
            1.0 + kept as f64 / verifies.max(1) as f64
        );
        let (steps, micros) = (
            load(&m.spec_draft_steps_total),
            load(&m.spec_draft_micros_total),
        );
        if steps > 0 {
            errln!(
                "drafting: {steps} draft steps in {:.1} ms ({:.3} ms a verify step)",
                micros as f64 / 1e3,
                micros as f64 / 1e3 / verifies.max(1) as f64
            );
        }
    }
    Ok(())
}

/// Every prompt's token ids (through the chat template with `--chat`), checked against
/// the vocabulary and `--max-seq-len`.
fn encode(
    a: &GenerateArgs,
    tokenizer: &Tokenizer,
    texts: &[String],
    cfg: &ModelConfig,
    max_seq_len: usize,
) -> Result<Vec<Vec<u32>>> {
    let prompts: Vec<Vec<u32>> = texts
        .iter()
        .map(|p| {
            if a.chat {
                let text =
                    tokenizer.apply_chat_template(&[ChatMessage::new("user", p.clone())], true)?;
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
    Ok(prompts)
}

/// The engine for this batch: one step holds every prompt, and the KV cache holds what
/// the batch needs (on CUDA: a fraction of free memory, at least the need). Weights,
/// cache and activations must fit before anything loads.
fn engine_shape(a: &GenerateArgs, prompts: &[Vec<u32>], max_seq_len: usize) -> EngineShape {
    let e = &a.engine;
    let per_seq = |p: &Vec<u32>| {
        p.len()
            .saturating_add(a.max_tokens)
            .min(max_seq_len)
            .div_ceil(e.block_size)
    };
    let needed = prompts
        .iter()
        .map(per_seq)
        .fold(1usize, usize::saturating_add);
    EngineShape {
        max_seqs: prompts.len(),
        max_seq_len,
        kv_at_least: needed,
        cpu_kv_blocks: None,
        capture_all: a.capture_all,
        run_name: format!(
            "generate ({} prompt{}, --max-tokens {}, --max-seq-len {max_seq_len}, --max-num-batched-tokens {})",
            prompts.len(),
            if prompts.len() == 1 { "" } else { "s" },
            a.max_tokens,
            e.max_num_batched_tokens
        ),
        fix_hint: "use fewer prompts, or lower --max-tokens, --max-seq-len or --max-num-batched-tokens (or raise --kv-fraction)".into(),
    }
}

/// `--capture-all`: one line on what start-up captured (logged, and on stderr unless
/// `json`).
fn report_capture(engine: &EngineHandle, json: bool) -> Result<()> {
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
        if !json {
            errln!("{line}");
        }
    }
    Ok(())
}

/// The sampling and stopping parameters of every prompt.
fn request_params(
    a: &GenerateArgs,
    tokenizer: &Tokenizer,
    constraint: Option<Constraint>,
) -> RequestParams {
    RequestParams {
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
        constraint,
        share_prompt: None,
        logit_bias: Vec::new(),
    }
}

/// The constraint of `--json-schema` / `--regex`, checked by compiling it once (an error
/// names the flag).
fn constraint(a: &GenerateArgs, compiler: &ConstraintCompiler) -> Result<Option<Constraint>> {
    let (c, flag) = match (&a.json_schema, &a.regex) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--json-schema: reading {}", path.display()))?;
            (Constraint::JsonSchema(text), "--json-schema")
        }
        (None, Some(rx)) => (Constraint::Regex(rx.clone()), "--regex"),
        (None, None) => return Ok(None),
    };
    compiler.compile(&c).map_err(|e| anyhow!("{flag}: {e}"))?;
    Ok(Some(c))
}

/// Run every prompt on `engine` (streaming the first prompt's text to stdout when
/// `stream`), then stop the engine. Returns each prompt's run, the text it released
/// through its stop strings, and the engine's statistics as the run ended.
fn run_prompts(
    a: &GenerateArgs,
    engine: EngineHandle,
    tokenizer: &Tokenizer,
    prompts: &[Vec<u32>],
    params: &RequestParams,
    stream: bool,
) -> Result<(
    Vec<Generation>,
    Vec<String>,
    encore_core::Result<RunnerStats>,
)> {
    // Each prompt's text as it streams, through its stop strings (when there are any),
    // and what it released so far.
    let mut texts_out = prompts
        .iter()
        .map(|p| {
            let stop = StopMatcher::new(a.stop.iter().cloned())?;
            Ok((StopStream::new(tokenizer, p, stop), String::new()))
        })
        .collect::<encore_core::Result<Vec<_>>>()?;
    let bars = Bars::new(!a.json);
    let mut gens: Vec<Generation> = Vec::with_capacity(prompts.len());
    let ran = run_on_engine(&engine, prompts, params, &bars, &mut gens, |i, id| {
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
    let mut released = Vec::with_capacity(texts_out.len());
    for (i, (mut t, mut text)) in texts_out.into_iter().enumerate() {
        let rest = t.finish();
        text.push_str(&rest);
        if stream && i == 0 {
            out!("{rest}")?;
            outln!()?;
        }
        released.push(text);
    }
    Ok((gens, released, stats))
}

/// The graph line on stderr: captures, replays, padding, memory and verification.
fn print_graph_stats(stats: &RunnerStats) {
    let (Some(s), m) = (&stats.graphs, &stats.memory) else {
        return;
    };
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

/// What every prompt's report shares.
struct Run {
    device: String,
    load_secs: f64,
    /// The single prompt's text went to stdout as it came.
    stream: bool,
}

/// One prompt's result: a JSON line with `--json`, else its summary on stderr (after its
/// header and text on stdout in a batch). `(i, n)`: its index and the batch size.
fn print_generation(
    a: &GenerateArgs,
    run: &Run,
    (i, n): (usize, usize),
    g: &Generation,
    prompt: &str,
    text: &str,
) -> Result<()> {
    let decode_tps = tokens_per_sec(g.output_ids.len().saturating_sub(1), g.decode_secs);
    let finish = g.finish.name();
    let load_secs = run.load_secs;
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
            "device": run.device,
        });
        outln!("{v}")?;
    } else if run.stream {
        errln!(
            "summary: prompt {} tokens, generated {} ({finish}), prefill {:.1} ms, decode {:.1} tok/s, weights loaded in {:.2} s, on {}",
            g.prompt_ids.len(),
            g.output_ids.len(),
            g.prefill_secs * 1e3,
            decode_tps,
            load_secs,
            run.device
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
    Ok(())
}

/// The batch's summary line on stderr.
fn print_batch_summary(run: &Run, gens: &[Generation]) {
    let decoded: usize = gens
        .iter()
        .map(|g| g.output_ids.len().saturating_sub(1))
        .sum();
    let decode_secs = gens.iter().map(|g| g.decode_secs).fold(0.0, f64::max);
    let prefill_secs = gens.first().map_or(0.0, |g| g.prefill_secs);
    errln!(
        "summary: {} prompts on {}, weights loaded in {:.2} s, prefill {:.1} ms (all prompts), decode {:.1} tok/s (all sequences)",
        gens.len(),
        run.device,
        run.load_secs,
        prefill_secs * 1e3,
        tokens_per_sec(decoded, decode_secs)
    );
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
