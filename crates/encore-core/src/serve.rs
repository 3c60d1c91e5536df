//! The engine loop: one thread that owns the backend's engine (runner, KV cache, block
//! manager) and the scheduler, fed by a closed set of messages (add a request, abort one,
//! shut down) and streaming each request's tokens back to its sink. It steps while there
//! is work and blocks on its queue when there is none. A sink that reports its reader gone
//! aborts the request, which frees its KV blocks before the next step.
//!
//! Nothing here knows HTTP: the server (encore-server), `encore generate` and `encore
//! bench serve --in-process` all submit through an [`EngineHandle`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::backend::BackendRef;
use crate::engine::{BootReport, Engine, EngineConfig};
use crate::error::{Error, Result};
use crate::graph::{GraphStats, Phase};
use crate::histogram::{Histogram, ItlBuckets, TtftBuckets};
use crate::memory::ArenaStats;
use crate::model::config::ModelConfig;
use crate::model::ModelFiles;
use crate::progress::Progress;
use crate::request::{Event, Limits, Output, Param, Refusal, Request};
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::spec::draft::Drafter;

/// Where a request's tokens go. Returns `false` when nobody reads them any more (the
/// request is then aborted).
pub type Sink = Box<dyn FnMut(Event) -> bool + Send>;

/// Told once whether the loop admitted a request ([`EngineHandle::submit_with_verdict`]),
/// before any of its events.
pub type Verdict = Box<dyn FnOnce(Result<(), Refusal>) + Send>;

/// The messages the engine loop takes.
enum Message {
    /// A request, its sink, when it was submitted, and who to tell whether it was
    /// admitted (without one, a refusal goes to the sink).
    Add(Box<Request>, Sink, Instant, Option<Verdict>),
    Abort(u64),
    /// End a request early as finished (a stop string matched in its text).
    Finish(u64),
    /// Answer with the runner's graph figures (between two steps).
    Stats(Sender<RunnerStats>),
    Shutdown,
}

/// The runner's graph figures at one moment, for reports (`encore generate`'s summary).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunnerStats {
    /// Captures, replays, padding and verification over every graph (none when graphs
    /// are off).
    pub graphs: Option<GraphStats>,
    /// The graph memory's strategy and bytes.
    pub memory: ArenaStats,
}

/// Live figures of the engine, for metrics endpoints (relaxed atomics; a snapshot may mix
/// two steps).
#[derive(Debug, Default)]
pub struct EngineMetrics {
    pub requests_running: AtomicU64,
    pub requests_waiting: AtomicU64,
    pub kv_blocks_used: AtomicU64,
    pub kv_blocks_total: AtomicU64,
    pub preemptions_total: AtomicU64,
    pub steps_total: AtomicU64,
    /// Steps launched while the one before still ran (`--async-scheduling`).
    pub steps_overlapped_total: AtomicU64,
    /// Wall time of the engine's steps (scheduling, the runner step, outputs to their
    /// sinks), and the part of it spent waiting for the device, in microseconds.
    pub step_micros_total: AtomicU64,
    pub device_wait_micros_total: AtomicU64,
    pub tokens_computed_total: AtomicU64,
    pub requests_finished_total: AtomicU64,
    pub requests_aborted_total: AtomicU64,
    /// Prompt tokens looked up in the prefix cache, and those found there (not computed).
    pub prefix_cache_queries_total: AtomicU64,
    pub prefix_cache_hits_total: AtomicU64,
    /// Graph replays of decode, mixed (prefill) and verify (speculative decoding) steps.
    pub graph_replays_decode: AtomicU64,
    pub graph_replays_mixed: AtomicU64,
    pub graph_replays_verify: AtomicU64,
    /// The expert cache's totals (the experts offload policy; 0 otherwise), read from the
    /// device every [`EXPERT_STATS_EVERY`] steps and when idle: distinct experts the
    /// layers needed, summed over layers and steps; hits; misses (fills); bytes streamed;
    /// experts prefetched.
    pub expert_needed_total: AtomicU64,
    pub expert_hits_total: AtomicU64,
    pub expert_misses_total: AtomicU64,
    pub expert_bytes_streamed_total: AtomicU64,
    pub expert_prefetched_total: AtomicU64,
    /// Speculative decoding: drafts verified, and of those kept.
    pub spec_drafts_total: AtomicU64,
    pub spec_accepted_total: AtomicU64,
    pub spec_verifications_total: AtomicU64,
    /// Times a sequence stopped speculating for a while (too few drafts kept).
    pub spec_pauses_total: AtomicU64,
    /// The draft model's (or EAGLE head's) steps, and the wall time spent proposing.
    pub spec_draft_steps_total: AtomicU64,
    pub spec_draft_micros_total: AtomicU64,
    /// Why the engine runs no more steps (its tensor-parallel group failed); unset while
    /// it runs.
    pub broken: std::sync::OnceLock<String>,
    /// Time from a request's submission to its first token (queueing and prefill).
    pub time_to_first_token: Histogram<TtftBuckets>,
    /// Time between consecutive tokens of a request, taken when the step that sampled
    /// each one returned.
    pub inter_token_latency: Histogram<ItlBuckets>,
}

impl EngineMetrics {
    /// Prompt tokens found in the prefix cache per prompt token looked up (0 before any
    /// lookup).
    pub fn prefix_cache_hit_ratio(&self) -> f64 {
        let q = self.prefix_cache_queries_total.load(Ordering::Relaxed);
        let h = self.prefix_cache_hits_total.load(Ordering::Relaxed);
        if q == 0 {
            0.0
        } else {
            h as f64 / q as f64
        }
    }
}

/// A running engine loop: submit requests, abort them, shut it down (also on drop).
pub struct EngineHandle {
    tx: Sender<Message>,
    thread: Option<JoinHandle<()>>,
    pub metrics: Arc<EngineMetrics>,
    /// The model's vocabulary size and context length.
    pub vocab_size: usize,
    pub max_seq_len: usize,
    /// Tokens the whole KV cache holds: a request whose prompt and output (within the
    /// context) need more can never run.
    pub kv_capacity_tokens: usize,
    /// The rules admission checks requests against (the scheduler's).
    pub limits: Limits,
    /// Sequences the scheduler runs at once at most (`max_num_seqs`); the rest wait.
    pub max_num_seqs: usize,
    /// What start-up did and how long it took.
    pub boot: BootReport,
}

impl EngineHandle {
    /// Start the loop on its own thread: boot an [`Engine`] of `model` (opened by
    /// [`crate::model::open_model`]; its files are read on that thread) on `backend` (the
    /// caller waits for it: an error comes back here), then serve.
    pub fn start(
        backend: BackendRef,
        model: ModelFiles,
        cfg: EngineConfig,
        sched: SchedulerConfig,
        progress: Box<dyn Progress + Send>,
    ) -> Result<EngineHandle> {
        let mut cfg = cfg;
        // An EAGLE-3 head: a random one takes the target's shape; the target captures
        // the hidden states it reads.
        let tp = cfg.tp.0.len() > 1;
        if let Some(d) = cfg.draft.as_mut().filter(|d| d.config.eagle.is_some()) {
            // Under tensor parallelism a draft model runs on rank 0's device alone (the
            // target's leader); an EAGLE-3 head would need the whole embedding, which the
            // ranks split.
            if tp {
                return Err(Error::invalid(
                    "--draft-model",
                    "an EAGLE-3 head shares the target's embedding, which tensor parallelism splits over the ranks: run it on one device",
                ));
            }
            if let crate::model::weights::WeightSource::Dummy { .. } = d.source {
                let vocab = model.config.vocab_size.min(DUMMY_DRAFT_VOCAB);
                d.config = ModelConfig::eagle_head_for(&model.config, vocab);
            }
            let e = d.config.eagle.as_ref().expect("filtered");
            crate::spec::draft::check_pair(&model.config, &d.config)?;
            cfg.eagle_aux = Some(e.aux_layers_for(model.config.num_layers)?);
        }
        let max_num_seqs = sched.max_num_seqs;
        let (tx, rx) = mpsc::channel::<Message>();
        let (boot_tx, boot_rx) = mpsc::channel::<Result<(Limits, BootReport)>>();
        let metrics = Arc::new(EngineMetrics::default());
        let m = Arc::clone(&metrics);
        let thread = std::thread::Builder::new()
            .name("encore-engine".into())
            .spawn(move || {
                let be = &*backend;
                let booted = Engine::new(be, model, &cfg, &*progress).and_then(|e| {
                    let mut s = Scheduler::new(sched, &e.runner)?;
                    if let Some(c) = &cfg.constraints {
                        s.set_constraint_compiler(Arc::clone(c));
                    }
                    let drafter = match cfg.draft.clone() {
                        Some(files) => Some(boot_draft(be, files, &cfg, &e, &*progress)?),
                        None => None,
                    };
                    Ok((e, s, drafter))
                });
                let (engine, scheduler, drafter) = match booted {
                    Ok(x) => x,
                    Err(e) => {
                        let _ = boot_tx.send(Err(e));
                        return;
                    }
                };
                let limits = scheduler.limits(&engine.runner);
                let _ = boot_tx.send(Ok((limits, engine.report.clone())));
                run_loop(engine, scheduler, drafter, rx, &m);
            })
            .map_err(|e| Error::invalid("engine", format!("cannot start its thread: {e}")))?;
        match boot_rx.recv() {
            Ok(Ok((limits, boot))) => Ok(EngineHandle {
                tx,
                thread: Some(thread),
                metrics,
                vocab_size: limits.vocab_size,
                max_seq_len: limits.max_seq_len,
                kv_capacity_tokens: limits.kv_capacity_tokens(),
                limits,
                max_num_seqs,
                boot,
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(Error::invalid("engine", "its thread ended during start-up"))
            }
        }
    }

    /// Queue a request; its tokens (or its refusal) go to `sink`.
    pub fn submit(&self, req: Request, sink: Sink) -> Result<()> {
        self.send_add(req, sink, None)
    }

    /// Queue a request; `verdict` is told whether admission took it (a refusal goes
    /// there, not to `sink`), then its tokens go to `sink`. For callers that must answer
    /// before the first token, such as an HTTP server choosing its status code.
    pub fn submit_with_verdict(&self, req: Request, sink: Sink, verdict: Verdict) -> Result<()> {
        self.send_add(req, sink, Some(verdict))
    }

    fn send_add(&self, req: Request, sink: Sink, verdict: Option<Verdict>) -> Result<()> {
        self.tx
            .send(Message::Add(Box::new(req), sink, Instant::now(), verdict))
            .map_err(|_| Error::invalid("engine", "the engine loop has stopped"))
    }

    /// Abort request `id` (nothing happens when it already ended).
    pub fn abort(&self, id: u64) {
        let _ = self.tx.send(Message::Abort(id));
    }

    /// End request `id` now as finished, not aborted: its reader found the end (a stop
    /// string in its text). Its KV blocks are freed before the next step; nothing happens
    /// when it already ended.
    pub fn finish(&self, id: u64) {
        let _ = self.tx.send(Message::Finish(id));
    }

    /// The runner's graph figures, taken by the loop between two steps (this waits for
    /// the step in flight).
    pub fn runner_stats(&self) -> Result<RunnerStats> {
        let stopped = || Error::invalid("engine", "the engine loop has stopped");
        let (tx, rx) = mpsc::channel();
        self.tx.send(Message::Stats(tx)).map_err(|_| stopped())?;
        rx.recv().map_err(|_| stopped())
    }

    /// Why the engine serves no more requests: its tensor-parallel group failed
    /// ([`EngineMetrics::broken`]), or its loop has ended (a panic); `None` while it
    /// serves.
    pub fn unhealthy(&self) -> Option<String> {
        if let Some(why) = self.metrics.broken.get() {
            return Some(why.clone());
        }
        let ended = self.thread.as_ref().is_none_or(|t| t.is_finished());
        ended.then(|| "the engine loop has stopped".to_string())
    }

    /// Stop the loop after the step in flight; requests still live are dropped.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.tx.send(Message::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A live request in the loop: where its tokens go, and its timing for the latency
/// histograms.
struct Live {
    sink: Sink,
    submitted: Instant,
    last_token: Option<Instant>,
}

impl Live {
    /// Record a token that came out at `now`, then hand it to the sink.
    fn token(&mut self, o: Output, now: Instant, m: &EngineMetrics) -> bool {
        match self.last_token.replace(now) {
            None => m.time_to_first_token.observe(now - self.submitted),
            Some(last) => m.inter_token_latency.observe(now - last),
        }
        (self.sink)(Event::Token(o))
    }
}

/// The draft model's engine of `cfg` (booted after the target's `target`, of the memory
/// it left), as a [`Drafter`] checked against the target.
fn boot_draft<'b>(
    be: &'b dyn crate::backend::Backend,
    files: ModelFiles,
    cfg: &EngineConfig,
    target: &Engine<'_>,
    progress: &dyn Progress,
) -> Result<Drafter<'b>> {
    crate::spec::draft::check_pair(&target.runner.model().cfg, &files.config)?;
    if files.config.max_position_embeddings < cfg.max_seq_len {
        return Err(Error::invalid(
            "--draft-model",
            format!(
                "the draft model holds {} positions, fewer than the run's max_seq_len {}: lower --max-seq-len",
                files.config.max_position_embeddings, cfg.max_seq_len
            ),
        ));
    }
    if files.config.eagle.is_none() {
        let draft = Engine::new(be, files, &cfg.for_draft(), progress)?;
        tracing::info!(
            "draft model up: {} KV blocks, weights in {:.2} s",
            draft.report.kv_blocks,
            draft.report.load_secs
        );
        return Drafter::new(draft.runner, &target.runner);
    }
    // An EAGLE-3 head: the target's embedding (under a weight budget only where it stays
    // put: read in place from host memory, resident, or beside streamed experts only),
    // its vocabulary map.
    if let Some(o) = target.runner.model().offload() {
        use crate::offload::Policy;
        let model = target.runner.model();
        let decl = model.cfg.decl();
        // The access order is the declaration's.
        let embed = decl
            .tensors()
            .iter()
            .position(|t| t.role == crate::model::decl::Role::Embedding);
        let from_host = embed
            .and_then(|w| o.order().weights().get(w))
            .is_some_and(|w| w.bytes == 0);
        let resident = o
            .plan()
            .is_some_and(|p| embed.is_some_and(|w| p.resident.contains(&w)));
        if !(from_host || resident || o.policy() == Policy::Experts) {
            return Err(Error::invalid(
                "--draft-model",
                "an EAGLE-3 head shares the target's embedding, which this --weight-budget streams: raise the budget so that it stays resident",
            ));
        }
    }
    let d2t = match &files.source {
        crate::model::weights::WeightSource::Dir(path) => {
            let d2t = crate::spec::eagle::read_d2t(path)?;
            let e = files.config.eagle.as_ref().expect("an EAGLE head");
            if d2t.is_empty() && files.config.vocab_size != e.target_vocab {
                return Err(Error::invalid(
                    "--draft-model",
                    format!(
                        "the EAGLE-3 head drafts over {} of the target's {} tokens but its checkpoint has no d2t map",
                        files.config.vocab_size, e.target_vocab
                    ),
                ));
            }
            d2t
        }
        _ => Vec::new(),
    };
    // Its catch-up chunks (the tokens a verify step kept) hold at most k + 1 tokens:
    // they replay verify graphs of the target's k.
    let head_cfg = EngineConfig {
        eagle_embed: Some(target.runner.model().weights.embed.clone()),
        graphs: cfg.graphs.clone(),
        ..cfg.for_draft()
    };
    let head = Engine::new(be, files, &head_cfg, progress)?;
    tracing::info!(
        "EAGLE-3 head up: {} KV blocks, weights in {:.2} s",
        head.report.kv_blocks,
        head.report.load_secs
    );
    Drafter::eagle(head.runner, &target.runner, d2t)
}

/// The draft vocabulary of a random EAGLE-3 head (`--draft-model dummy:eagle3`): the
/// published heads' 32k tokens, or the target's whole vocabulary when smaller.
pub const DUMMY_DRAFT_VOCAB: usize = 32_000;

fn run_loop(
    mut engine: Engine<'_>,
    mut sched: Scheduler,
    mut drafter: Option<Drafter<'_>>,
    rx: Receiver<Message>,
    m: &EngineMetrics,
) {
    let runner = &mut engine.runner;
    let mut sinks: HashMap<u64, Live> = HashMap::new();
    m.kv_blocks_total
        .store(sched.blocks().num_usable_blocks() as u64, Ordering::Relaxed);
    loop {
        // Take every queued message; block for one only when idle.
        let mut next = if sched.has_work() {
            rx.try_recv().ok()
        } else {
            match rx.recv_timeout(Duration::from_secs(3600)) {
                Ok(msg) => Some(msg),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return quiesce(runner),
            }
        };
        while let Some(msg) = next {
            match msg {
                Message::Add(req, mut sink, submitted, verdict) => {
                    if let Some(why) = m.broken.get() {
                        // Nothing can run: the request fails at once, as a step would.
                        if let Some(v) = verdict {
                            v(Ok(()));
                        }
                        sink(Event::Failed(why.clone()));
                    } else {
                        add(
                            &mut sched, runner, &mut sinks, *req, sink, submitted, verdict,
                        );
                    }
                }
                Message::Abort(id) => {
                    if sinks.remove(&id).is_some() {
                        let _ = sched.abort(id);
                    }
                }
                Message::Finish(id) => {
                    if sinks.remove(&id).is_some() {
                        let _ = sched.finish(id);
                    }
                }
                Message::Stats(reply) => {
                    let _ = reply.send(RunnerStats {
                        graphs: runner.graph_stats(),
                        memory: runner.graph_memory_stats(),
                    });
                }
                Message::Shutdown => return quiesce(runner),
            }
            next = rx.try_recv().ok();
        }
        if !sched.has_work() {
            publish(m, &sched, runner);
            continue;
        }
        let step_start = Instant::now();
        let stepped = sched.step_with(runner, drafter.as_mut());
        let step_end = Instant::now();
        if let Some(d) = &drafter {
            m.spec_draft_steps_total
                .store(d.stats.steps, Ordering::Relaxed);
            m.spec_draft_micros_total
                .store(d.stats.micros, Ordering::Relaxed);
        }
        match stepped {
            Ok(outputs) => {
                // Requests a constraint ended (it allowed no token, or failed).
                for (id, msg) in sched.take_failed() {
                    if let Some(mut live) = sinks.remove(&id) {
                        (live.sink)(Event::Failed(msg));
                    }
                }
                let now = step_end;
                for o in outputs {
                    let (id, finished) = (o.id, o.finish.is_some());
                    let alive = sinks.get_mut(&id).is_some_and(|l| l.token(o, now, m));
                    if finished {
                        sinks.remove(&id);
                    } else if !alive {
                        // The reader went away: free the request's blocks now.
                        sinks.remove(&id);
                        let _ = sched.abort(id);
                    }
                }
            }
            Err(e) => {
                // A failed step fails every live request; the engine stays up, unless
                // the failure broke its tensor-parallel group: then every later request
                // fails at once with the cause, and /health says so.
                let msg = format!("engine step failed: {e}");
                tracing::error!("{msg}");
                for (id, mut live) in sinks.drain() {
                    (live.sink)(Event::Failed(msg.clone()));
                    let _ = sched.abort(id);
                }
                if let Some(why) = runner.group_broken() {
                    let _ = m.broken.set(format!(
                        "the engine's tensor-parallel group failed and runs no more steps \
                         (restart it): {why}"
                    ));
                }
            }
        }
        m.step_micros_total
            .fetch_add(step_start.elapsed().as_micros() as u64, Ordering::Relaxed);
        publish(m, &sched, runner);
    }
}

/// The loop's end: a step launched ahead may still run on the device; it finishes
/// before the engine's memory goes.
fn quiesce(runner: &crate::runner::Runner<'_>) {
    if let Err(e) = runner.backend().synchronize() {
        tracing::warn!("engine stop: the device did not finish its last step: {e}");
    }
}

/// Admit `req` to the scheduler and keep its sink, or tell it (or its verdict) the
/// refusal.
fn add(
    sched: &mut Scheduler,
    runner: &crate::runner::Runner<'_>,
    sinks: &mut HashMap<u64, Live>,
    req: Request,
    mut sink: Sink,
    submitted: Instant,
    verdict: Option<Verdict>,
) {
    let id = req.id;
    let admitted = if sinks.contains_key(&id) {
        let m = format!("{id} is already live");
        Err(Refusal::new(id, Param::Id, m))
    } else {
        sched.add(req, runner)
    };
    let ok = admitted.is_ok();
    match (verdict, admitted) {
        (Some(v), a) => v(a),
        (None, Err(r)) => {
            sink(Event::Refused(r));
        }
        (None, Ok(())) => {}
    }
    if ok {
        sinks.insert(
            id,
            Live {
                sink,
                submitted,
                last_token: None,
            },
        );
    }
}

/// Steps between reads of the expert cache's totals (each read waits for the device).
pub const EXPERT_STATS_EVERY: u64 = 16;

fn publish(m: &EngineMetrics, sched: &Scheduler, runner: &crate::runner::Runner<'_>) {
    let st = sched.stats();
    if !sched.has_work() || st.steps.is_multiple_of(EXPERT_STATS_EVERY) {
        if let Ok(Some(x)) = runner.expert_stats() {
            m.expert_needed_total.store(x.needed, Ordering::Relaxed);
            m.expert_hits_total.store(x.hits, Ordering::Relaxed);
            m.expert_misses_total.store(x.misses, Ordering::Relaxed);
            m.expert_bytes_streamed_total
                .store(x.bytes, Ordering::Relaxed);
            m.expert_prefetched_total
                .store(x.prefetched, Ordering::Relaxed);
        }
    }
    m.requests_running
        .store(sched.num_running() as u64, Ordering::Relaxed);
    m.requests_waiting
        .store(sched.num_waiting() as u64, Ordering::Relaxed);
    m.kv_blocks_used
        .store(sched.blocks().num_used_blocks() as u64, Ordering::Relaxed);
    m.preemptions_total.store(st.preemptions, Ordering::Relaxed);
    m.device_wait_micros_total
        .store((runner.device_wait_secs() * 1e6) as u64, Ordering::Relaxed);
    m.steps_total.store(st.steps, Ordering::Relaxed);
    m.steps_overlapped_total
        .store(st.overlapped, Ordering::Relaxed);
    m.spec_drafts_total
        .store(st.drafts_proposed, Ordering::Relaxed);
    m.spec_accepted_total
        .store(st.drafts_accepted, Ordering::Relaxed);
    m.spec_verifications_total
        .store(st.verifications, Ordering::Relaxed);
    m.spec_pauses_total.store(st.spec_pauses, Ordering::Relaxed);
    m.tokens_computed_total
        .store(st.tokens_computed, Ordering::Relaxed);
    m.requests_finished_total
        .store(st.finished, Ordering::Relaxed);
    m.requests_aborted_total
        .store(st.aborted, Ordering::Relaxed);
    m.prefix_cache_queries_total
        .store(st.prefix_queried_tokens, Ordering::Relaxed);
    m.prefix_cache_hits_total
        .store(st.prefix_hit_tokens, Ordering::Relaxed);
    // Steps with masks replay their bucket's logits-only graph (counted with the others).
    let replays = |phases: &[Phase], counter: &AtomicU64| {
        let n = phases
            .iter()
            .filter_map(|&phase| runner.phase_stats(phase))
            .map(|p| (p.hits + p.misses) as u64)
            .reduce(|a, b| a + b);
        if let Some(n) = n {
            counter.store(n, Ordering::Relaxed);
        }
    };
    replays(
        &[Phase::Decode, Phase::DecodeLogits],
        &m.graph_replays_decode,
    );
    replays(&[Phase::Mixed], &m.graph_replays_mixed);
    replays(
        &[Phase::Verify, Phase::VerifyLogits],
        &m.graph_replays_verify,
    );
}
