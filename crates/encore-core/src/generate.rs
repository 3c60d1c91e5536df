//! Offline generation for a batch of prompts on the caller's thread, through the same
//! scheduler a server uses (`scheduler`): continuous batching with chunked prefill mixed
//! with decodes, and preemption by recompute when KV blocks run out, until every sequence
//! hits EOS, its token limit or the context limit. `encore generate` submits to the
//! engine loop (`serve::EngineHandle`) instead; this synchronous path stays as the
//! reference the tests compare the engine loop, the server and the CLI against (and for
//! library use without a thread). Both end requests with a
//! [`FinishReason`](crate::request::FinishReason).

use std::ops::ControlFlow;
use std::time::Instant;

use crate::error::Result;
use crate::progress::{Guard, Progress, Unit};
use crate::request::{FinishReason, Request, RequestParams, SamplingParams};
use crate::runner::Runner;
use crate::scheduler::{Scheduler, SchedulerConfig};

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Keep generating past EOS (for benchmarks).
    pub ignore_eos: bool,
}

#[derive(Clone, Debug)]
pub struct Generation {
    pub prompt_ids: Vec<u32>,
    pub output_ids: Vec<u32>,
    pub finish: FinishReason,
    /// Wall time from the start until this sequence's first token (its prefill, and
    /// whatever ran before it).
    pub prefill_secs: f64,
    /// Wall time from its first token to its last.
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
    let mut sched = Scheduler::new(
        SchedulerConfig::new(cfg.max_tokens_per_step, cfg.max_seqs),
        runner,
    )?;
    for (i, p) in prompts.iter().enumerate() {
        sched.add(
            Request {
                id: i as u64,
                prompt: p.clone(),
                params: RequestParams {
                    sampling: opts.sampling,
                    max_tokens: opts.max_tokens,
                    stop_token_ids: eos.to_vec(),
                    ignore_eos: opts.ignore_eos,
                    fit_context: false,
                    constraint: None,
                    share_prompt: None,
                    logit_bias: Vec::new(),
                },
            },
            runner,
        )?;
    }
    let mut out: Vec<Generation> = prompts
        .iter()
        .map(|p| Generation {
            prompt_ids: p.clone(),
            output_ids: Vec::new(),
            finish: FinishReason::Stopped,
            prefill_secs: 0.0,
            decode_secs: 0.0,
        })
        .collect();
    let result = run(
        runner,
        &mut sched,
        prompts,
        progress,
        &mut out,
        &mut on_token,
    );
    // However the run ended, no sequence keeps KV blocks.
    for i in 0..prompts.len() {
        let _ = sched.abort(i as u64);
    }
    result.map(|_| out)
}

/// Step the scheduler until every request finished or `on_token` stopped the run.
fn run(
    runner: &mut Runner<'_>,
    sched: &mut Scheduler,
    prompts: &[Vec<u32>],
    progress: &dyn Progress,
    out: &mut [Generation],
    on_token: &mut impl FnMut(usize, u32) -> ControlFlow<()>,
) -> Result<()> {
    let t0 = Instant::now();
    let total_prompt: usize = prompts.iter().map(Vec::len).sum();
    let mut bar = Some(Guard::start(
        progress,
        "prefill",
        total_prompt as u64,
        Unit::Tokens,
    ));
    let mut first_token: Vec<Option<f64>> = vec![None; prompts.len()];
    while sched.has_work() {
        let outputs = sched.step(runner)?;
        let now = t0.elapsed().as_secs_f64();
        if let Some(b) = &bar {
            let prefilled = (sched.stats().tokens_computed as usize).min(total_prompt);
            b.0.set(prefilled as u64);
            if first_token.iter().all(Option::is_some) || prefilled == total_prompt {
                bar = None; // prefill is over: the bar ends
            }
        }
        let mut stop = false;
        for o in outputs {
            let i = o.id as usize;
            let g = &mut out[i];
            g.output_ids.push(o.token);
            let first = *first_token[i].get_or_insert(now);
            g.prefill_secs = first;
            g.decode_secs = now - first;
            if let Some(f) = o.finish {
                g.finish = f;
            }
            stop |= on_token(i, o.token).is_break();
        }
        if stop {
            break; // unfinished requests keep FinishReason::Stopped
        }
    }
    Ok(())
}
