//! `encore bench serve --in-process`: the workload sent to the engine loop in this
//! process on its schedule, every token's arrival recorded, and the engine's own figures
//! (steps, preemptions, where a step's time goes, the weight budget) for the report.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use encore_core::offload::OffloadConfig;
use encore_core::request::{Event, Request, RequestParams};
use encore_core::serve::EngineHandle;
use serde_json::{json, Map, Value};

use super::report::Record;
use super::workload::Workload;

/// What a request's sink saw.
enum Seen {
    Token { last: bool },
    Failed(String),
}

/// The result of sending a workload.
pub struct Run {
    /// One per request, in workload order.
    pub records: Vec<Record>,
    /// From the start to the last request's end.
    pub duration_s: f64,
    /// The most requests running at once (sampled between events).
    pub max_running: u64,
}

/// Submit request `i` of `w`; its tokens' times (or its error) go to `tx`.
fn submit(
    engine: &EngineHandle,
    w: &Workload,
    i: usize,
    tx: mpsc::Sender<(usize, Instant, Seen)>,
) -> Result<()> {
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
                constraint: None,
                share_prompt: None,
                logit_bias: Vec::new(),
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
    Ok(())
}

/// Submit every request on schedule (at most `max_concurrency` in flight, 0 = no limit)
/// and record every token's time (or the request's error) until all finished.
pub fn drive(engine: &EngineHandle, w: &Workload, max_concurrency: usize) -> Result<Run> {
    let n = w.items.len();
    let (tx, rx) = mpsc::channel::<(usize, Instant, Seen)>();
    let limit = if max_concurrency == 0 {
        usize::MAX
    } else {
        max_concurrency
    };
    let start = Instant::now();
    let mut records = vec![Record::default(); n];
    let (mut next, mut in_flight, mut finished) = (0usize, 0usize, 0usize);
    let mut max_running = 0u64;
    while finished < n {
        while next < n && in_flight < limit && start.elapsed().as_secs_f64() >= w.arrivals[next] {
            records[next].sent = Some(Instant::now());
            submit(engine, w, next, tx.clone())?;
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
    Ok(Run {
        records,
        duration_s: start.elapsed().as_secs_f64(),
        max_running,
    })
}

/// The engine's counters the report reads, at one moment: a run's figures are those of
/// its end less those of its start (the engine serves every row of a preset).
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    preemptions: u64,
    steps: u64,
    overlapped: u64,
    step_micros: u64,
    wait_micros: u64,
    prefix_queries: u64,
    prefix_hits: u64,
    spec_drafts: u64,
    spec_accepted: u64,
    spec_verifications: u64,
}

impl Counters {
    pub fn read(engine: &EngineHandle) -> Counters {
        let m = &engine.metrics;
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counters {
            preemptions: load(&m.preemptions_total),
            steps: load(&m.steps_total),
            overlapped: load(&m.steps_overlapped_total),
            step_micros: load(&m.step_micros_total),
            wait_micros: load(&m.device_wait_micros_total),
            prefix_queries: load(&m.prefix_cache_queries_total),
            prefix_hits: load(&m.prefix_cache_hits_total),
            spec_drafts: load(&m.spec_drafts_total),
            spec_accepted: load(&m.spec_accepted_total),
            spec_verifications: load(&m.spec_verifications_total),
        }
    }
}

/// The engine's figures of the run since `since` into `row`: preemptions, steps, where a
/// step's time goes, the prefix cache's hit ratio and the weight budget (`offload`: its
/// configuration; null without one, or when it holds every weight). The engine publishes
/// a step's counts after the step, so the last step of the run before `since` may count.
pub fn engine_figures(
    engine: &EngineHandle,
    offload: Option<&OffloadConfig>,
    since: &Counters,
    row: &mut Map<String, Value>,
) {
    let (now, s) = (Counters::read(engine), since);
    row.insert("preemptions".into(), json!(now.preemptions - s.preemptions));
    let steps = now.steps - s.steps;
    row.insert("steps".into(), json!(steps));
    row.insert(
        "overlapped_steps".into(),
        json!(now.overlapped - s.overlapped),
    );
    // Where a step's time goes: waiting for the device, and the rest (the host's
    // scheduling, packing and launching, and handing tokens to their sinks).
    let per_step = |micros: u64| micros as f64 / 1e3 / steps.max(1) as f64;
    let step_ms = per_step(now.step_micros - s.step_micros);
    let wait_ms = per_step(now.wait_micros - s.wait_micros);
    row.insert("step_ms".into(), json!(step_ms));
    row.insert("device_wait_ms".into(), json!(wait_ms));
    row.insert("host_ms".into(), json!(step_ms - wait_ms));
    let (q, h) = (
        now.prefix_queries - s.prefix_queries,
        now.prefix_hits - s.prefix_hits,
    );
    row.insert(
        "prefix_cache_hit_ratio".into(),
        json!(if q == 0 { 0.0 } else { h as f64 / q as f64 }),
    );
    let (rate, length) = super::spec_figures(
        Some((now.spec_drafts - s.spec_drafts) as f64),
        Some((now.spec_accepted - s.spec_accepted) as f64),
        Some((now.spec_verifications - s.spec_verifications) as f64),
    );
    row.insert("spec_acceptance_rate".into(), rate);
    row.insert("spec_mean_accepted_length".into(), length);
    // The weight budget (null: every weight on the device).
    row.insert(
        "offload".into(),
        match (offload, &engine.boot.offload) {
            (Some(c), Some(r)) => json!({
                "policy": c.policy.name(), "budget_bytes": r.budget_bytes,
                "resident_bytes": r.resident_bytes, "streaming_bytes": r.streaming_bytes,
                "streamed_bytes_per_step": r.streamed_bytes_per_step,
            }),
            _ => Value::Null,
        },
    );
}
