//! Offline generation for a fixed batch of prompts (what `encore generate` runs): prefill
//! every prompt (in chunks when they exceed the step's token budget), then decode all
//! sequences together until each hits EOS, its token limit or the context limit.
//! Continuous batching with a scheduler replaces this loop in the engine.

use std::ops::ControlFlow;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::kv::SeqId;
use crate::progress::{Guard, Progress, Unit};
use crate::runner::{Runner, SamplingParams, SeqStep};

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Keep generating past EOS (for benchmarks).
    pub ignore_eos: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// Produced an end-of-sequence token.
    Eos,
    /// Reached `max_tokens`.
    Length,
    /// Reached the runner's `max_seq_len`.
    Context,
    /// The caller's `on_token` asked to stop.
    Stopped,
}

impl FinishReason {
    /// The lower-case name used in output (`eos`, `length`, `context`, `stopped`).
    pub fn name(self) -> &'static str {
        match self {
            FinishReason::Eos => "eos",
            FinishReason::Length => "length",
            FinishReason::Context => "context",
            FinishReason::Stopped => "stopped",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Generation {
    pub prompt_ids: Vec<u32>,
    pub output_ids: Vec<u32>,
    pub finish: FinishReason,
    /// Wall time of the prefill phase (shared by the batch).
    pub prefill_secs: f64,
    /// Wall time of the decode steps this sequence took part in.
    pub decode_secs: f64,
}

/// Generate for every prompt; `progress` sees the prompt tokens prefilled (a `prefill`
/// piece of work in tokens); `on_token(i, id)` sees each new token of prompt `i` as it
/// is sampled. When it returns `ControlFlow::Break`, generation stops at once: every
/// unfinished sequence ends with [`FinishReason::Stopped`] (e.g. its output's reader went
/// away).
pub fn generate(
    runner: &mut Runner<'_>,
    prompts: &[Vec<u32>],
    eos: &[u32],
    opts: &GenerateOptions,
    progress: &dyn Progress,
    mut on_token: impl FnMut(usize, u32) -> ControlFlow<()>,
) -> Result<Vec<Generation>> {
    let cfg = *runner.config();
    for (i, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(Error::invalid("generate", format!("prompt {i} is empty")));
        }
        if p.len() >= cfg.max_seq_len {
            return Err(Error::invalid(
                "generate",
                format!(
                    "prompt {i} has {} tokens; the context limit (max_seq_len) is {}",
                    p.len(),
                    cfg.max_seq_len
                ),
            ));
        }
    }
    if prompts.len() > cfg.max_seqs {
        return Err(Error::invalid(
            "generate",
            format!(
                "{} prompts exceed the runner's {} sequences (max_seqs)",
                prompts.len(),
                cfg.max_seqs
            ),
        ));
    }
    // Reserve every sequence's whole budget up front so decode can never run out.
    let budget = |p: &Vec<u32>| p.len().saturating_add(opts.max_tokens).min(cfg.max_seq_len);
    let needed: usize = prompts
        .iter()
        .map(|p| budget(p).div_ceil(cfg.block_size))
        .sum();
    if needed > runner.blocks.num_free_blocks() {
        return Err(Error::OutOfBlocks {
            what: format!(
                "{} prompts with up to {} new tokens each",
                prompts.len(),
                opts.max_tokens
            ),
            needed,
            free: runner.blocks.num_free_blocks(),
        });
    }
    let ids: Vec<SeqId> = (0..prompts.len()).map(|i| SeqId(i as u64)).collect();
    let mut out: Vec<Generation> = prompts
        .iter()
        .map(|p| Generation {
            prompt_ids: p.clone(),
            output_ids: Vec::new(),
            finish: FinishReason::Length,
            prefill_secs: 0.0,
            decode_secs: 0.0,
        })
        .collect();
    let result = run(
        runner,
        prompts,
        &ids,
        eos,
        opts,
        progress,
        &mut out,
        &mut on_token,
    );
    for &id in &ids {
        let _ = runner.blocks.free(id);
    }
    result.map(|_| out)
}

#[allow(clippy::too_many_arguments)] // private: the loop state of `generate`
fn run(
    runner: &mut Runner<'_>,
    prompts: &[Vec<u32>],
    ids: &[SeqId],
    eos: &[u32],
    opts: &GenerateOptions,
    progress: &dyn Progress,
    out: &mut [Generation],
    on_token: &mut impl FnMut(usize, u32) -> ControlFlow<()>,
) -> Result<()> {
    let cfg = *runner.config();
    let mut active: Vec<usize> = Vec::new();
    let mut last_token = vec![0u32; prompts.len()];
    let mut stopped = false;

    // Returns whether sequence i goes on after taking token t.
    let mut accept = |i: usize, t: u32, out: &mut [Generation], stopped: &mut bool| -> bool {
        out[i].output_ids.push(t);
        if on_token(i, t).is_break() {
            *stopped = true;
        }
        let total = out[i].prompt_ids.len() + out[i].output_ids.len();
        if !opts.ignore_eos && eos.contains(&t) {
            out[i].finish = FinishReason::Eos;
            false
        } else if out[i].output_ids.len() >= opts.max_tokens {
            out[i].finish = FinishReason::Length;
            false
        } else if total >= cfg.max_seq_len {
            out[i].finish = FinishReason::Context;
            false
        } else {
            true
        }
    };

    // Prefill, chunked to the step's token budget.
    let t0 = Instant::now();
    let mut done = vec![0usize; prompts.len()];
    let total_tokens: usize = prompts.iter().map(Vec::len).sum();
    let bar = Guard::start(progress, "prefill", total_tokens as u64, Unit::Tokens);
    while let Some(first) = (0..prompts.len()).find(|&i| done[i] < prompts[i].len()) {
        if stopped {
            break;
        }
        let mut batch: Vec<(usize, usize, usize)> = Vec::new(); // (seq, start, len)
        let mut room = cfg.max_tokens_per_step;
        for i in first..prompts.len() {
            let left = prompts[i].len() - done[i];
            if left == 0 || room == 0 || batch.len() == cfg.max_seqs {
                continue;
            }
            let take = left.min(room);
            batch.push((i, done[i], take));
            room -= take;
        }
        for &(i, start, len) in &batch {
            if start == 0 {
                runner.blocks.allocate(ids[i], len)?;
            } else {
                runner.blocks.append(ids[i], len)?;
            }
        }
        let steps: Vec<SeqStep<'_>> = batch
            .iter()
            .map(|&(i, start, len)| SeqStep {
                seq: ids[i],
                tokens: &prompts[i][start..start + len],
                sampling: opts.sampling,
            })
            .collect();
        let sampled = runner.step(&steps)?;
        for (&(i, start, len), &t) in batch.iter().zip(&sampled) {
            done[i] = start + len;
            if done[i] == prompts[i].len() && opts.max_tokens > 0 && accept(i, t, out, &mut stopped)
            {
                active.push(i);
                last_token[i] = t;
            }
        }
        bar.0.set(done.iter().sum::<usize>() as u64);
    }
    drop(bar);
    let prefill_secs = t0.elapsed().as_secs_f64();
    for g in out.iter_mut() {
        g.prefill_secs = prefill_secs;
    }

    // Decode all active sequences together.
    while !active.is_empty() && !stopped {
        let t = Instant::now();
        for &i in &active {
            runner.blocks.append(ids[i], 1)?;
        }
        let tokens: Vec<[u32; 1]> = active.iter().map(|&i| [last_token[i]]).collect();
        let steps: Vec<SeqStep<'_>> = active
            .iter()
            .zip(&tokens)
            .map(|(&i, tok)| SeqStep {
                seq: ids[i],
                tokens: tok,
                sampling: opts.sampling,
            })
            .collect();
        let sampled = runner.step(&steps)?;
        let secs = t.elapsed().as_secs_f64();
        let mut still = Vec::with_capacity(active.len());
        for (&i, &tok) in active.iter().zip(&sampled) {
            out[i].decode_secs += secs;
            if accept(i, tok, out, &mut stopped) {
                still.push(i);
                last_token[i] = tok;
            }
        }
        active = still;
    }
    if stopped {
        // Sequences still decoding, and those whose prefill never finished.
        let unfinished = (0..prompts.len()).filter(|&i| done[i] < prompts[i].len());
        for i in active.iter().copied().chain(unfinished) {
            out[i].finish = FinishReason::Stopped;
        }
    }
    Ok(())
}
