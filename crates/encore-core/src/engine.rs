//! Start-up in one readable order, so the first request runs as fast as a warm one:
//!
//! 1. sizes: the memory a run of this configuration needs, checked against the device
//!    (or host) before anything is allocated;
//! 2. weights, loaded (with progress) and wrapped in the model;
//! 3. the runner's step inputs, sampling buffers and graph executor (its arena), each at
//!    its final size;
//! 4. KV sizing: a fixed number of blocks, or — measured — a fraction of the device memory
//!    free after the weights and one eager step of the largest shape (which maps the
//!    arena's whole need and creates every lazily allocated workspace; it runs over a
//!    scratch cache of the least blocks, freed before the real one exists);
//! 5. the KV cache, once, at that size, which completes the runner;
//! 6. warm-up and capture: every decode and token bucket is captured now (each capture
//!    runs the step eagerly first, which plans its GEMMs and maps its memory), and the LM
//!    head's row counts are planned, so no GEMM is planned during a request — or, with
//!    on-demand capture, each bucket on its first use.
//!
//! Each part is built once. The sequences' KV blocks and penalty slots belong to the
//! scheduler ([`crate::scheduler::Scheduler::new`] sizes them from the runner).
//! Commands, benchmarks and the server build an [`Engine`] instead of assembling the
//! pieces.

use std::time::Instant;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::memory::{GraphMemory, MemoryLimit, MemoryNeed};
use crate::model::config::ModelConfig;
use crate::model::llama::Model;
use crate::model::weights;
use crate::model::ModelFiles;
use crate::offload::{self, Offload, OffloadConfig, OffloadReport, Policy, Prepared};
use crate::progress::NoProgress;
use crate::progress::{Progress, Unit};
use crate::runner::{
    panic_message, AbortFn, FollowerRank, Followers, GraphConfig, GroupAbort, Runner,
    RunnerBuilder, RunnerConfig,
};
use crate::tensor::DType;
use std::sync::{mpsc, Arc, Condvar, Mutex};

/// How many KV blocks the cache gets.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KvSizing {
    /// Exactly this many (the CPU backend, tests, fixed workloads).
    Blocks(usize),
    /// `fraction` of the device memory free after the weights and a warm-up step of the
    /// largest shape (measured, so activations and workspaces are already taken); at
    /// least `at_least` blocks (an error otherwise). Backends that report no device
    /// memory (the CPU) get `at_least`.
    DeviceFraction { fraction: f64, at_least: usize },
}

/// Everything a start-up needs besides the backend and the model files.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub dtype: DType,
    pub block_size: usize,
    /// Most tokens in one step (the largest token bucket).
    pub max_tokens_per_step: usize,
    /// Most sequences in one step (the largest decode bucket).
    pub max_seqs: usize,
    /// Longest sequence, prompt and output.
    pub max_seq_len: usize,
    pub kv: KvSizing,
    /// `None`: every step eager.
    pub graphs: Option<GraphConfig>,
    pub graph_memory: GraphMemory,
    /// Capture every bucket at start-up (`false`: on first use).
    pub capture_all: bool,
    pub verify_graphs: bool,
    /// Bytes the caller allocates beside the engine, checked with it.
    pub extra_bytes: usize,
    /// What this run is and what to lower when it does not fit, for the memory error
    /// (e.g. "generate (3 prompts)", "lower --max-seq-len").
    pub run_name: String,
    pub fix_hint: String,
    /// A device budget for the weights (`--weight-budget`, `--offload-policy`); `None`:
    /// every weight resident.
    pub offload: Option<OffloadConfig>,
    /// Compiles requests' constraints (structured outputs; built from the model's
    /// tokenizer); `None`: a request with a constraint is refused.
    pub constraints: Option<std::sync::Arc<crate::constraint::ConstraintCompiler>>,
    /// Tensor parallelism: every rank's backend, rank 0's (the one the engine is given)
    /// first, opened together ([`encore_backend::device::open_group`]); empty or one:
    /// one device.
    pub tp: TpBackends,
    /// Synthetic routing for a mixture of experts' benchmarks (`--router-skew`), set
    /// before any graph is captured; `None`: the routers.
    pub router_skew: Option<crate::model::routing::RouterSkew>,
    /// Speculative decoding's draft model (`--draft-model`): the engine loop boots it
    /// after the target, on the same device, with [`EngineConfig::for_draft`]; `None`:
    /// none.
    pub draft: Option<ModelFiles>,
    /// Capture the residual stream at the input of these three layers in every step
    /// (the target of an EAGLE-3 head, [`crate::model::llama::Model::capture_aux`]);
    /// `None`: none.
    pub eagle_aux: Option<[usize; 3]>,
    /// An EAGLE-3 head's boot: the target's embedding it shares
    /// ([`crate::model::llama::Model::enable_eagle`]); `None` for every other model.
    pub eagle_embed: Option<crate::tensor::Tensor>,
    /// What the KV cache stores (`--kv-cache-dtype`): `None` the run dtype, or
    /// [`DType::F8E4M3`] (a draft model keeps the target's choice).
    pub kv_cache_dtype: Option<DType>,
    /// Asynchronous scheduling (`--async-scheduling`): the next step is planned and
    /// queued while the device runs the current one ([`crate::scheduler`]'s overlap;
    /// one device, no constraint, prompt scoring or speculation). Captured graphs take their decode rows' ids from the
    /// step before on the device.
    pub async_scheduling: bool,
}

/// The backends of a tensor-parallel group, rank order.
#[derive(Clone, Default)]
pub struct TpBackends(pub Vec<crate::backend::BackendRef>);

impl std::fmt::Debug for TpBackends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.0.iter().map(|b| b.device_name()).collect();
        write!(f, "TpBackends({names:?})")
    }
}

impl EngineConfig {
    /// A configuration of these sizes with everything else at its plain default: eager
    /// (no graphs), the `arena` graph memory, on-demand capture, no verification, nothing
    /// allocated beside the engine. Set fields with struct update syntax.
    pub fn new(
        dtype: DType,
        block_size: usize,
        max_tokens_per_step: usize,
        max_seqs: usize,
        max_seq_len: usize,
        kv: KvSizing,
    ) -> Self {
        EngineConfig {
            dtype,
            block_size,
            max_tokens_per_step,
            max_seqs,
            max_seq_len,
            kv,
            graphs: None,
            graph_memory: GraphMemory::Arena,
            capture_all: false,
            verify_graphs: false,
            extra_bytes: 0,
            run_name: "engine".into(),
            fix_hint: String::new(),
            offload: None,
            constraints: None,
            tp: TpBackends::default(),
            router_skew: None,
            draft: None,
            eagle_aux: None,
            eagle_embed: None,
            kv_cache_dtype: None,
            async_scheduling: false,
        }
    }

    /// The configuration a draft model boots with: the target's sizes, graphs (decode and
    /// token buckets, and the graphs of 2-token chunks: a catch-up after every draft was
    /// kept feeds the last draft and the target's token) and KV sizing (of the memory the
    /// target left), every weight resident, one device.
    pub fn for_draft(&self) -> EngineConfig {
        EngineConfig {
            graphs: self.graphs.clone().map(|g| GraphConfig { verify: 1, ..g }),
            verify_graphs: false,
            extra_bytes: 0,
            run_name: format!("{} (its draft model)", self.run_name),
            fix_hint: format!("{}, or pick a smaller --draft-model", self.fix_hint),
            offload: None,
            constraints: None,
            tp: TpBackends::default(),
            router_skew: None,
            draft: None,
            eagle_aux: None,
            eagle_embed: None,
            async_scheduling: false,
            ..self.clone()
        }
    }
}

/// What start-up did and how long each part took.
#[derive(Clone, Debug, Default)]
pub struct BootReport {
    pub need: MemoryNeed,
    pub load_secs: f64,
    pub kv_blocks: usize,
    /// Warm-up and capture of every bucket (0 with on-demand capture).
    pub capture_secs: f64,
    pub total_secs: f64,
    /// What the weight budget gave (`None`: every weight resident).
    pub offload: Option<OffloadReport>,
}

/// A model ready to serve: the runner with its cache, inputs and graphs.
pub struct Engine<'b> {
    pub runner: Runner<'b>,
    pub report: BootReport,
}

impl<'b> Engine<'b> {
    /// Start up in the order of the module docs; `progress` sees the weight loading and
    /// the graph capture.
    pub fn new(
        be: &'b dyn Backend,
        files: ModelFiles,
        cfg: &EngineConfig,
        progress: &dyn Progress,
    ) -> Result<Self> {
        match cfg.tp.0.len() {
            0 | 1 => Self::boot(be, files, cfg, progress, None),
            _ => Self::new_group(be, files, cfg, progress),
        }
    }

    /// [`Engine::new`] of a tensor-parallel group: ranks 1.. boot in threads of their own
    /// (each its model shard, KV cache, arena and graphs) beside rank 0 here, meeting
    /// between the start-up stages (a failed rank fails every rank, naming it; the KV
    /// cache takes the fewest blocks any rank has room for); then rank 0's runner leads
    /// the others ([`crate::runner::Followers`]).
    fn new_group(
        be: &'b dyn Backend,
        files: ModelFiles,
        cfg: &EngineConfig,
        progress: &dyn Progress,
    ) -> Result<Self> {
        let ranks = cfg.tp.0.clone();
        let size = ranks.len();
        for (r, b) in ranks.iter().enumerate() {
            if b.group() != (r, size) {
                return Err(Error::invalid(
                    "tensor parallel",
                    format!(
                        "{} is rank {:?} of its group, expected rank {r} of {size} (open the ranks together)",
                        b.device_name(),
                        b.group()
                    ),
                ));
            }
        }
        if be.group() != (0, size) {
            return Err(Error::invalid(
                "tensor parallel",
                format!("the engine's backend {} is not rank 0", be.device_name()),
            ));
        }
        // Every rank's config, so a model the group cannot split is refused before any
        // thread starts.
        let mut configs = (0..size)
            .map(|r| files.config.shard(r, size))
            .collect::<Result<Vec<_>>>()?
            .into_iter();
        let config0 = configs.next().expect("size >= 2");
        let abort: AbortFn = {
            let ranks = ranks.clone();
            // Every rank's at once: NCCL's abort of one communicator of a group may wait
            // for its peers' aborts (the group's resources are freed together).
            GroupAbort::new(move |why: &str| {
                std::thread::scope(|s| {
                    for b in ranks.iter() {
                        s.spawn(move || b.abort_group(why));
                    }
                })
            })
        };
        let rv = Arc::new(Rendezvous::new(
            ranks.iter().map(|b| b.device_name()).collect(),
            abort.clone(),
        ));
        let spin = follower_spin(&*ranks[0])?;
        let mut followers = Vec::new();
        for ((rank, fbe), config) in ranks.iter().enumerate().skip(1).zip(configs) {
            let (tx, rx) = mpsc::channel();
            let (done_tx, done) = mpsc::channel();
            let files = ModelFiles {
                config,
                source: files.source.clone(),
            };
            let device = fbe.device_name();
            let (cfg, rank_rv, fbe, abort) = (cfg.clone(), rv.clone(), fbe.clone(), abort.clone());
            let thread = std::thread::Builder::new()
                .name(format!("encore-rank-{rank}"))
                .spawn(move || {
                    let booted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        Engine::boot(&*fbe, files, &cfg, &NoProgress, Some((&rank_rv, rank)))
                    }));
                    match booted {
                        Ok(Ok(mut e)) => {
                            let who = format!("rank {rank} ({})", fbe.device_name());
                            e.runner.follow(&who, rx, done_tx, abort, spin)
                        }
                        Ok(Err(e)) => rank_rv.fail(rank, &e.to_string()),
                        Err(p) => {
                            let why = format!("panicked while starting: {}", panic_message(&*p));
                            rank_rv.fail(rank, &why)
                        }
                    }
                })
                .map_err(|e| {
                    let e = format!("spawning rank {rank}: {e}");
                    // The ranks already started wait at their first meeting: release them.
                    rv.fail(rank, &e);
                    Error::invalid("tensor parallel", e)
                })?;
            followers.push(FollowerRank {
                rank,
                device,
                tx,
                done,
                thread: Some(thread),
            });
        }
        let files = ModelFiles {
            config: config0,
            source: files.source,
        };
        let booted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Self::boot(be, files, cfg, progress, Some((&rv, 0)))
        }));
        let followers = Followers::new(&be.device_name(), followers, abort);
        let mut engine = match booted {
            Ok(Ok(e)) => e,
            Ok(Err(e)) => {
                rv.fail(0, &e.to_string());
                // Dropping the followers closes their channels and joins them.
                drop(followers);
                return Err(e);
            }
            Err(p) => {
                // Release the followers waiting at a meeting, join them, then go on
                // unwinding.
                rv.fail(
                    0,
                    &format!("panicked while starting: {}", panic_message(&*p)),
                );
                drop(followers);
                std::panic::resume_unwind(p);
            }
        };
        engine.runner.set_followers(followers);
        tracing::info!("tensor parallel over {size} ranks: {:?}", cfg.tp);
        Ok(engine)
    }

    /// Start one rank in the order of the module docs (`group`: its rank of a
    /// tensor-parallel group, which it meets between stages).
    fn boot(
        be: &'b dyn Backend,
        files: ModelFiles,
        cfg: &EngineConfig,
        progress: &dyn Progress,
        group: Option<(&Rendezvous, usize)>,
    ) -> Result<Self> {
        let meet = |v: Result<usize>| match group {
            Some((rv, rank)) => rv.agree(rank, v),
            None => v,
        };
        let t0 = Instant::now();
        let mcfg = &files.config.clone();
        if cfg.max_seq_len > mcfg.max_position_embeddings {
            return Err(Error::invalid(
                "engine",
                format!(
                    "max_seq_len {} exceeds the model's {} positions",
                    cfg.max_seq_len, mcfg.max_position_embeddings
                ),
            ));
        }
        let min_blocks = match cfg.kv {
            KvSizing::Blocks(n) => n,
            KvSizing::DeviceFraction { at_least, .. } => at_least,
        };
        let rcfg = RunnerConfig {
            block_size: cfg.block_size,
            num_blocks: min_blocks,
            max_tokens_per_step: cfg.max_tokens_per_step,
            max_seqs: cfg.max_seqs,
            max_seq_len: cfg.max_seq_len,
            // One penalty row per sequence a step may hold (see RunnerConfig).
            penalty_slots: cfg.max_seqs,
            kv_dtype: cfg.kv_cache_dtype,
        };

        let kv_scales = checkpoint_kv_scales(&files, cfg)?;

        // 1-3. Sizes, before anything is allocated; the weights; the runner's step
        // inputs, sampling buffers and executor (its arena).
        let t = Instant::now();
        let loaded = (|| {
            let (need, offload_report) = check_memory(be, mcfg, cfg, &rcfg)?;
            let (mut model, offload_report) =
                load_model(be, files, cfg, rcfg.token_rows(), offload_report, progress)?;
            // EAGLE-3: the target captures what the head reads; the head gets the
            // target's embedding and its rows (both before any step or graph).
            if let Some(layers) = cfg.eagle_aux {
                model.capture_aux(be, layers, rcfg.token_rows())?;
            }
            match (&cfg.eagle_embed, model.cfg.eagle.is_some()) {
                (Some(embed), true) => {
                    model.enable_eagle(be, embed, rcfg.token_rows(), rcfg.max_seqs)?
                }
                (None, false) => {}
                _ => {
                    return Err(Error::invalid(
                        "--draft-model",
                        "an EAGLE-3 head boots as the draft of --speculative-method eagle3",
                    ))
                }
            }
            be.synchronize()?;
            let builder = RunnerBuilder::new(be, model, rcfg, cfg.graph_memory)?;
            Ok((need, offload_report, builder))
        })();
        // The ranks agree on whether any of them streams weights (1: none does).
        let (loaded, ok) = match loaded {
            Ok(l) => {
                let resident = l.2.model().offload().is_none();
                (Some(l), Ok(resident as usize))
            }
            Err(e) => (None, Err(e)),
        };
        let all_resident = meet(ok)? == 1;
        let (mut need, offload_report, mut builder) = loaded.expect("met without an error");
        if !all_resident {
            builder.model_mut().set_group_offloads();
        }
        let load_secs = t.elapsed().as_secs_f64();

        // 4. The KV cache's size: fixed, or measured after one step of the largest shape
        // (a tensor-parallel group takes the fewest blocks of any rank).
        let num_blocks = meet(kv_blocks(be, &mut builder, cfg, min_blocks))?;

        // 5. The KV cache, and the runner.
        let mut runner = builder.build(num_blocks)?;
        if let Some(scales) = kv_scales {
            runner.set_kv_scales(scales)?;
        }
        if cfg.router_skew.is_some() {
            runner.set_router_skew(cfg.router_skew)?;
        }
        runner.set_graphs(cfg.graphs.clone());
        runner.set_verify_graphs(cfg.verify_graphs);
        // One device, every weight resident (a weight budget's streams plan each step
        // after the one before), no debug replays.
        let overlap = cfg.tp.0.len() <= 1 && cfg.offload.is_none() && !cfg.verify_graphs;
        if cfg.async_scheduling && !runner.set_overlap(overlap) {
            tracing::warn!(
                "--async-scheduling is off: it runs on one device with every weight resident (no --weight-budget, no --verify-graphs)"
            );
        }

        // 6. Warm-up and capture.
        let t = Instant::now();
        if cfg.capture_all && cfg.graphs.is_some() {
            let keys = runner.graph_keys().len();
            let bar = crate::progress::Guard::start(
                progress,
                "capturing graphs",
                keys as u64,
                Unit::Graphs,
            );
            let captured = runner
                .capture_all(&mut |done, _| bar.0.set(done as u64))
                .and_then(|_| be.synchronize());
            drop(bar);
            meet(captured.map(|_| 0))?;
        } else {
            meet(Ok(0))?;
        }
        let capture_secs = if cfg.capture_all {
            t.elapsed().as_secs_f64()
        } else {
            0.0
        };
        let kv = runner.kv();
        need.kv_blocks = kv.num_blocks();
        need.kv_cache = need.kv_blocks.saturating_mul(kv.bytes_per_block());
        let report = BootReport {
            need,
            load_secs,
            kv_blocks: kv.num_blocks(),
            capture_secs,
            total_secs: t0.elapsed().as_secs_f64(),
            offload: offload_report,
        };
        tracing::info!(
            "engine up in {:.2} s: weights {:.2} s, {} KV blocks, graphs {:.2} s",
            report.total_secs,
            report.load_secs,
            report.kv_blocks,
            report.capture_secs
        );
        Ok(Engine { runner, report })
    }
}

/// How long a follower rank polls for its next command before it sleeps
/// (`ENCORE_TP_SPIN_MS`, 0..=1000 milliseconds; default 20 on GPUs, 0 on the CPU, whose
/// ranks compute on the cores a poll would take).
fn follower_spin(be: &dyn Backend) -> Result<std::time::Duration> {
    spin_from(
        std::env::var("ENCORE_TP_SPIN_MS").ok().as_deref(),
        be.device_name() == "cpu",
    )
}

fn spin_from(var: Option<&str>, cpu: bool) -> Result<std::time::Duration> {
    let ms = match var {
        Some(v) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|ms| *ms <= 1000)
            .ok_or_else(|| {
                Error::invalid(
                    "ENCORE_TP_SPIN_MS",
                    format!("{v:?} is not a whole number of milliseconds 0..=1000"),
                )
            })?,
        None if cpu => 0,
        None => 20,
    };
    Ok(std::time::Duration::from_millis(ms))
}

/// Step 1: what the run needs, checked against the device (or host) before anything is
/// allocated. Under a weight budget the weights take the resident set and the ring (or
/// the LRU pool); the budget's figures come back with the need.
fn check_memory(
    be: &dyn Backend,
    mcfg: &ModelConfig,
    cfg: &EngineConfig,
    rcfg: &RunnerConfig,
) -> Result<(MemoryNeed, Option<OffloadReport>)> {
    let offload_report = match &cfg.offload {
        Some(oc) => {
            oc.check_graphs(cfg.graphs.is_some())?;
            offload::device_bytes(mcfg, cfg.dtype, oc, rcfg.token_rows())?
        }
        None => None,
    };
    let mut need = rcfg.memory_need(be, mcfg, cfg.dtype);
    if let Some(r) = &offload_report {
        need.weights = r.resident_bytes.saturating_add(r.streaming_bytes);
        if be.memory_info().is_none() {
            // The CPU twin's "device" is host memory, which holds the streamed
            // weights' host copies too.
            need.weights = need
                .weights
                .saturating_add(r.total_bytes.saturating_sub(r.resident_bytes));
        }
    }
    need.activations = need.activations.saturating_add(cfg.extra_bytes);
    if let Some(limit) = MemoryLimit::of(be) {
        need.check(&cfg.run_name, &limit, &cfg.fix_hint)?;
    }
    Ok((need, offload_report))
}

/// Step 2: the weights, loaded (resident, or under the budget with the executor that
/// streams them) and wrapped in the model.
fn load_model(
    be: &dyn Backend,
    files: ModelFiles,
    cfg: &EngineConfig,
    max_tokens: usize,
    offload_report: Option<OffloadReport>,
    progress: &dyn Progress,
) -> Result<(Model, Option<OffloadReport>)> {
    let mcfg = files.config;
    let prepared = match &cfg.offload {
        Some(oc) => Prepared::new(be, &mcfg, cfg.dtype, oc, max_tokens)?,
        None => None,
    };
    let Some(p) = prepared else {
        let w = weights::load(be, &mcfg, files.source, cfg.dtype, progress)?;
        return Ok((Model::new(be, mcfg, w, cfg.max_seq_len)?, offload_report));
    };
    let (w, host) = weights::load_offloaded(be, &mcfg, files.source, cfg.dtype, &p, progress)?;
    let o = Offload::new(be, &mcfg, p, host)?;
    let r = o.report().clone();
    tracing::info!(
        "weight budget {:.2} GiB ({}): {:.2} GiB resident, {:.2} GiB {}, {:.2} GiB \
         streamed per step",
        crate::error::gib(r.budget_bytes),
        r.policy.map_or("", |p| p.name()),
        crate::error::gib(r.resident_bytes),
        crate::error::gib(r.streaming_bytes),
        match o.policy() {
            Policy::Lru => "LRU pool".to_string(),
            Policy::Experts => format!("in {} expert slots", r.expert_slots),
            _ => "ring".to_string(),
        },
        crate::error::gib(r.streamed_bytes_per_step)
    );
    let model = Model::with_offload(be, mcfg, w, cfg.max_seq_len, o)?;
    Ok((model, Some(r)))
}

/// The scales of an FP8 KV cache a checkpoint ships (`k_scale` / `v_scale`,
/// [`weights::read_kv_scales`]): used when the cache is FP8, said and left otherwise.
fn checkpoint_kv_scales(
    files: &ModelFiles,
    cfg: &EngineConfig,
) -> Result<Option<Vec<crate::backend::KvScale>>> {
    let weights::WeightSource::Dir(path) = &files.source else {
        return Ok(None);
    };
    let scales = weights::read_kv_scales(path, files.config.num_layers)?;
    let fp8 = cfg.kv_cache_dtype == Some(DType::F8E4M3);
    match (&scales, fp8) {
        (Some(_), false) => {
            tracing::info!(
                "the checkpoint's KV cache scales (k_scale, v_scale) are not used: the \
                 cache holds the run dtype (--kv-cache-dtype fp8 uses them)"
            );
            Ok(None)
        }
        (Some(s), true) => {
            tracing::info!(
                "FP8 KV cache with the checkpoint's scales ({} layers)",
                s.len()
            );
            Ok(scales)
        }
        (None, true) => {
            tracing::info!("FP8 KV cache with scales 1.0 (the checkpoint ships none)");
            Ok(None)
        }
        (None, false) => Ok(None),
    }
}

/// Step 4: the KV cache's blocks. Measured sizing runs one eager step of the largest
/// shape first (over a scratch cache of the least blocks, freed before the real one is
/// allocated) and gives the cache `fraction` of the memory free after it.
fn kv_blocks(
    be: &dyn Backend,
    builder: &mut RunnerBuilder<'_>,
    cfg: &EngineConfig,
    min_blocks: usize,
) -> Result<usize> {
    let KvSizing::DeviceFraction { fraction, .. } = cfg.kv else {
        return Ok(min_blocks);
    };
    if be.memory_info().is_none() {
        return Ok(min_blocks);
    }
    let kv_cfg = builder.kv_config();
    let free = builder.measure_free(min_blocks)?.unwrap_or(0);
    // The scratch cache was held while measuring: its bytes are the cache's too.
    let have = min_blocks.saturating_mul(kv_cfg.bytes_per_block());
    let budget = (free as f64 * fraction) as usize + have;
    let fit = KvCache::num_blocks_for_budget(&kv_cfg, budget);
    if fit < min_blocks {
        return Err(Error::OutOfMemory {
            device: be.device_name(),
            bytes: min_blocks.saturating_mul(kv_cfg.bytes_per_block()),
            what: format!(
                "the KV cache of {min_blocks} blocks for {}: {fraction} of {:.2} GiB free after warm-up holds {fit}",
                cfg.run_name,
                free as f64 / (1u64 << 30) as f64
            ),
        });
    }
    Ok(fit)
}

/// Where the ranks of a tensor-parallel group meet between start-up stages: each posts
/// its stage's outcome and waits for the others; all get the smallest value posted, or
/// the first failure (which aborts the group's collectives, so no rank stays inside one,
/// and stays: every later meeting fails at once).
struct Rendezvous {
    devices: Vec<String>,
    abort: AbortFn,
    state: Mutex<Meeting>,
    cv: Condvar,
}

struct Meeting {
    generation: u64,
    arrived: usize,
    min: usize,
    last: usize,
    failed: Option<String>,
}

impl Rendezvous {
    fn new(devices: Vec<String>, abort: AbortFn) -> Self {
        Rendezvous {
            devices,
            abort,
            state: Mutex::new(Meeting {
                generation: 0,
                arrived: 0,
                min: usize::MAX,
                last: 0,
                failed: None,
            }),
            cv: Condvar::new(),
        }
    }

    fn failure(why: &str) -> Error {
        Error::invalid("tensor parallel", why.to_string())
    }

    /// Rank `rank` failed: fail every meeting and abort the collectives.
    fn fail(&self, rank: usize, why: &str) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.failed.is_none() {
            let dev = self.devices.get(rank).map_or("?", |d| d.as_str());
            let msg = format!("rank {rank} ({dev}) failed to start: {why}");
            self.abort.abort(&msg);
            s.failed = Some(msg);
        }
        self.cv.notify_all();
    }

    fn agree(&self, rank: usize, v: Result<usize>) -> Result<usize> {
        let x = match v {
            Ok(x) => x,
            Err(e) => {
                self.fail(rank, &e.to_string());
                return Err(e);
            }
        };
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = &s.failed {
            return Err(Self::failure(why));
        }
        s.min = s.min.min(x);
        s.arrived += 1;
        if s.arrived == self.devices.len() {
            s.arrived = 0;
            s.generation += 1;
            s.last = s.min;
            s.min = usize::MAX;
            self.cv.notify_all();
            return Ok(s.last);
        }
        let g = s.generation;
        while s.generation == g && s.failed.is_none() {
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        match &s.failed {
            Some(why) if s.generation == g => Err(Self::failure(why)),
            _ => Ok(s.last),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::spin_from;
    use std::time::Duration;

    #[test]
    fn follower_spin_defaults_by_device_and_refuses_bad_values() {
        assert_eq!(spin_from(None, false).unwrap(), Duration::from_millis(20));
        assert_eq!(spin_from(None, true).unwrap(), Duration::ZERO);
        assert_eq!(
            spin_from(Some(" 5 "), true).unwrap(),
            Duration::from_millis(5)
        );
        assert_eq!(spin_from(Some("0"), false).unwrap(), Duration::ZERO);
        for bad in ["", "-1", "1001", "2.5", "fast"] {
            let e = spin_from(Some(bad), false).unwrap_err().to_string();
            assert!(
                e.contains("ENCORE_TP_SPIN_MS") && e.contains("0..=1000"),
                "{bad}: {e}"
            );
        }
    }
}
