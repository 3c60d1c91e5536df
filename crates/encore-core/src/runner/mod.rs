//! The model runner: one forward step for a batch of sequences. It owns the model, the KV
//! cache, the step inputs, the sampling buffers and the graph executor; the caller (the
//! scheduler) owns the sequences' KV blocks and penalty slots ([`Seqs`]) and hands them
//! to each step, which reads their block tables. A step packs its metadata on the host
//! (one upload), picks how it runs, and samples on the device:
//! - a pure decode step within the largest decode bucket pads its batch to the bucket
//!   and replays that bucket's full graph;
//! - any other step within the largest token bucket (prefill, chunked prefill, decode
//!   rows mixed in) pads its tokens to the bucket and replays that bucket's pieces, with
//!   attention and the LM head eager between and after them;
//! - everything else, and every step in eager mode, runs the same ops eagerly.
//!
//! Graphs are captured on first use or ahead of time ([`Runner::capture_all`]).
//!
//! By job: `pack` (the step inputs and how a batch goes into them), `policy` (which
//! graph a step runs in, capture and warm-up), `sampling` (parameters, outputs, the
//! penalty table), `step` (the forward as the executor's pieces, and the step itself),
//! `seqs` (the blocks and penalty slots the caller owns).

mod deferred;
mod group;
mod overlap;
mod pack;
mod policy;
mod sampling;
mod seqs;
mod step;

use std::cell::Cell;
use std::time::Duration;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::graph::Executor;
use crate::kv::{KvCache, KvCacheConfig, SeqId};
use crate::memory::{GraphMemory, MemoryNeed};
use crate::model::config::ModelConfig;
use crate::model::llama::{Model, StepBuffers};
use crate::model::routing::RouterSkew;
use crate::request::SamplingParams;
use crate::tensor::DType;

pub use group::{panic_message, AbortFn, Cmd, FollowerRank, Followers, GroupAbort};
pub use overlap::Launched;
pub use pack::{StepHost, StepViews};
pub use policy::GraphConfig;
pub use sampling::Sampled;
pub use seqs::Seqs;

use pack::Packer;
use policy::GraphPolicy;
use sampling::SampleBuffers;
use step::{StepOut, StepShape};

/// One sequence's part of a step: the new tokens to run (a whole prompt, a chunk of one,
/// or the one token of a decode step).
#[derive(Clone, Copy, Debug)]
pub struct SeqStep<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
    /// The sampled token's randomness is drawn from `sampling.seed` and the token's index
    /// in its sequence alone: a request's stream does not depend on the batch around it,
    /// its sequence id or when it runs.
    pub sampling: SamplingParams,
    /// Whether the sample is limited to an allowed-token mask, which the step's
    /// [`FillMasks`] writes while the device runs the forward (see
    /// [`Runner::step_constrained`]). Only a row whose sample is kept needs one.
    pub masked: bool,
    /// Added to these tokens' logits before sampling (distinct ids in the vocabulary, at
    /// most [`crate::request::MAX_LOGIT_BIAS`]); empty: none.
    pub logit_bias: &'a [(u32, f32)],
    /// Score `tokens` (a prompt chunk) as well: see [`Score`]; `None`: sample only.
    pub score: Option<Score>,
    /// Speculative decoding's verify step: `tokens` are the last accepted token then the
    /// drafts, and the target samples after each of them, not only after the last. Each
    /// token but the last takes a sampling row of its own (as a scored token does; a step
    /// of verify chunks and decode rows replays its bucket's verify graph), sampled with
    /// this sequence's sampling, its logit bias and the seed of the token it samples (so
    /// its sample is the one decoding token by token would draw there), in
    /// [`Sampled::verified`] (with their log-probabilities where asked). With penalties,
    /// each row samples with the sequence's counts and the drafts before it counted (a
    /// scratch penalty slot per draft, [`Seqs`]), and after the step the sequence's row
    /// is that of its last kept sample (the samples up to the first that differs from
    /// its draft). No score. A masked verify chunk has a mask per row (see
    /// [`FillMasks`]).
    pub verify: bool,
}

/// Scoring a prompt chunk: the log-probability of each of its tokens after the first
/// given the tokens before it, and of `next` after its last when the prompt goes on,
/// each with the `num` most likely tokens there, over the model's logits (no penalties,
/// biases or mask), in [`Sampled::prompt`]. A step with scored chunks runs eagerly, one
/// sampling row per scored token beside the sequences' own: its sequences plus its
/// scored tokens must fit the runner's `max_seqs`. With `next`, the sequence's own row
/// scores it and its sample is meaningless (the chunk does not end the prompt).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Score {
    pub num: usize,
    pub next: Option<u32>,
}

/// Writes a step's allowed-token masks: called once in a step with masked rows, after the
/// step's forward is queued on the device and before its sampling, so the host computes
/// the masks while the device runs the layers. It gets one `(batch index, row)` per masked
/// row, each row [`Runner::mask_words`] words holding stale bits, and writes every word:
/// bit `t % 32` of word `t / 32` set allows token `t`. A row with no bit set is sampled
/// anyhow (the caller drops that sample); bits past the vocabulary are ignored. A masked
/// verify chunk has a row per token, given consecutively in the chunk's order: the row
/// sampling after its first token first, its own row (after its last token) last.
pub type FillMasks<'f> = dyn FnMut(&mut [(usize, &mut [u32])]) + 'f;

/// Sizing of the runner's memory.
#[derive(Clone, Copy, Debug)]
pub struct RunnerConfig {
    pub block_size: usize,
    /// KV blocks, the null block included: the cache [`Runner::new`] allocates (and what
    /// [`RunnerConfig::memory_need`] counts); [`RunnerBuilder::build`] takes its own.
    pub num_blocks: usize,
    /// Most tokens in one step.
    pub max_tokens_per_step: usize,
    /// Most sequences in one step.
    pub max_seqs: usize,
    /// Longest sequence (prompt + generated); bounds the block tables.
    pub max_seq_len: usize,
    /// Sequences that may use penalties at once: each holds a row of a device table of
    /// `vocab` i32 (its tokens' prompt flags and output counts), `penalty_slots * vocab *
    /// 4` bytes in all (128 slots of a 128k vocabulary: 64 MiB). 0: no table, and
    /// requests with penalties are refused.
    pub penalty_slots: usize,
    /// What the KV cache stores (`--kv-cache-dtype`): `None` the run dtype, or
    /// [`DType::F8E4M3`] (half the bytes of bf16: twice the blocks for the same memory),
    /// or another float dtype.
    pub kv_dtype: Option<DType>,
}

impl RunnerConfig {
    /// What a run of this configuration needs for a model of `model` in `dtype`: its
    /// weights, the KV cache and arena [`Runner::new`] allocates, and the step inputs
    /// (device buffers plus their host staging). Computed without allocating, so a
    /// command can refuse a run that cannot fit before loading anything.
    pub fn memory_need(&self, be: &dyn Backend, model: &ModelConfig, dtype: DType) -> MemoryNeed {
        let kv_cfg = self.kv_config(model, dtype);
        let table_width = self.table_width();
        let arena = Model::arena_bytes_for(
            model,
            dtype,
            be,
            self.max_tokens_per_step,
            self.max_seqs,
            table_width,
            self.block_size,
        );
        let inputs = Packer::bytes_for(self.token_rows(), self.max_seqs, table_width);
        let sampling =
            SampleBuffers::bytes_for(self.max_seqs, self.penalty_slots, model.vocab_size);
        MemoryNeed {
            weights: model.weight_bytes(dtype),
            kv_cache: self.num_blocks.saturating_mul(kv_cfg.bytes_per_block()),
            kv_blocks: self.num_blocks,
            // A quantized model's large matmuls may decode a weight into scratch first
            // (`Backend::reserve_dequant_scratch`; backends without the need ignore it).
            activations: arena
                .saturating_add(inputs)
                .saturating_add(sampling)
                .saturating_add(crate::model::llama::dequant_scratch_bytes(model, dtype)),
        }
    }

    /// The KV cache's layout for a model of `model` run in `dtype`.
    pub fn kv_config(&self, model: &ModelConfig, dtype: DType) -> KvCacheConfig {
        KvCacheConfig {
            num_layers: model.num_layers,
            num_kv_heads: model.num_kv_heads,
            head_dim: model.head_dim,
            block_size: self.block_size,
            dtype: self.kv_dtype.unwrap_or(dtype),
        }
    }

    /// Blocks per block-table row: enough for `max_seq_len` tokens.
    fn table_width(&self) -> usize {
        self.max_seq_len.div_ceil(self.block_size.max(1))
    }

    /// Token rows of the largest step (a decode step of `max_seqs` rows may exceed
    /// `max_tokens_per_step`).
    pub fn token_rows(&self) -> usize {
        self.max_tokens_per_step.max(self.max_seqs)
    }

    fn validate(&self, model: &Model) -> Result<()> {
        if self.block_size == 0
            || self.max_tokens_per_step == 0
            || self.max_seqs == 0
            || self.max_seq_len == 0
        {
            return Err(Error::invalid(
                "runner",
                format!("block_size, max_tokens_per_step, max_seqs and max_seq_len must all be >= 1: {self:?}"),
            ));
        }
        if self.max_seq_len > model.max_positions() {
            return Err(Error::invalid(
                "runner",
                format!(
                    "max_seq_len {} exceeds the model's {} positions",
                    self.max_seq_len,
                    model.max_positions()
                ),
            ));
        }
        Ok(())
    }
}

/// What a step reads and writes besides the executor: the model, the KV cache, the step
/// inputs and the sampling buffers.
struct Parts<'b> {
    be: &'b dyn Backend,
    model: Model,
    kv: KvCache,
    inputs: Packer<'b>,
    sampling: SampleBuffers,
    /// Whether steps sample (a tensor-parallel follower's do not: rank 0 samples).
    sample: bool,
    /// Asynchronous scheduling ([`Runner::set_overlap`]): every step (and graph) first
    /// takes the ids of rows with a `prev_row` from the samples of the step before.
    overlap: bool,
}

/// Runs one step at a time over the caller's sequences (see the module docs); built by
/// [`Runner::new`] or, in boot order, by a [`RunnerBuilder`].
pub struct Runner<'b> {
    parts: Parts<'b>,
    exec: Executor<StepBuffers>,
    policy: GraphPolicy,
    cfg: RunnerConfig,
    /// Time spent waiting for the device at the end of steps (the sampled tokens'
    /// download), summed: a step's wall time minus this is host work.
    device_wait: Cell<Duration>,
    /// The other ranks of a tensor-parallel group this runner leads (`None`: alone, or
    /// a follower).
    group: Option<Followers>,
    /// Where each sequence's tokens sat in the last step's token rows.
    last_rows: Vec<TokenRows>,
    /// Under a routing table (`--router-skew`), where this step's window began and the
    /// step's rows, until the step's command takes them to the followers.
    routed: Option<(usize, usize)>,
    /// A step being launched ([`Runner::launch`]): its samples stay on the device; its
    /// sequences' order in the sample rows, and the slot their copies go to.
    deferred: Option<(Vec<usize>, usize)>,
}

/// One sequence's tokens in a step's token rows: positions `position..position + len`
/// at rows `row..row + len` (the rows of [`crate::model::llama::Model::aux_hidden`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenRows {
    pub seq: SeqId,
    pub position: usize,
    pub row: usize,
    pub len: usize,
}

/// A runner being built, in boot order: first everything but the KV cache (the step
/// inputs, the sampling buffers and the executor with its arena, each at its final
/// size), so that one eager step of the largest shape can measure what the KV cache may
/// take before it is allocated ([`RunnerBuilder::measure_free`]); then the KV cache
/// ([`RunnerBuilder::build`]).
pub struct RunnerBuilder<'b> {
    be: &'b dyn Backend,
    model: Model,
    inputs: Packer<'b>,
    sampling: SampleBuffers,
    exec: Executor<StepBuffers>,
    cfg: RunnerConfig,
}

impl<'b> RunnerBuilder<'b> {
    /// Allocate everything of a runner of `cfg` but its KV cache; captured graphs get
    /// their intermediate memory per `graph_memory`.
    pub fn new(
        be: &'b dyn Backend,
        model: Model,
        cfg: RunnerConfig,
        graph_memory: GraphMemory,
    ) -> Result<Self> {
        cfg.validate(&model)?;
        let table_width = cfg.table_width();
        let bytes = model.arena_bytes(
            be,
            cfg.token_rows(),
            cfg.max_seqs,
            table_width,
            cfg.block_size,
        );
        let exec = Executor::new(be, bytes, graph_memory)?;
        let mut inputs = Packer::new(be, cfg.token_rows(), cfg.max_seqs, table_width)?;
        inputs.long_rope = model.long_rope();
        let sampling =
            SampleBuffers::new(be, cfg.max_seqs, cfg.penalty_slots, model.cfg.vocab_size)?;
        Ok(RunnerBuilder {
            be,
            model,
            inputs,
            sampling,
            exec,
            cfg,
        })
    }

    /// The model the runner will run.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The model, to change before the runner is built.
    pub fn model_mut(&mut self) -> &mut Model {
        &mut self.model
    }

    /// The KV cache layout the runner will have.
    pub fn kv_config(&self) -> KvCacheConfig {
        self.cfg
            .kv_config(&self.model.cfg, self.model.weights.dtype)
    }

    /// Run one all-padding step of the largest shape eagerly, over a scratch KV cache of
    /// `scratch_blocks` blocks: it maps the arena's whole need and creates whatever a step
    /// allocates on first use. Returns the device memory free while all of that, the
    /// scratch cache included, is still held (`None` where the backend reports none);
    /// the scratch cache is freed before this returns.
    pub fn measure_free(&mut self, scratch_blocks: usize) -> Result<Option<usize>> {
        let be = self.be;
        let kv = KvCache::new(be, self.kv_config(), scratch_blocks)?;
        let layout = self.inputs.layout(self.cfg.token_rows(), self.cfg.max_seqs);
        self.inputs.pad_only(&layout, 1)?;
        let step = step::ForwardStep::new(
            be,
            &self.model,
            &kv,
            &self.inputs,
            &self.sampling,
            &layout,
            StepShape::whole(1, false, 0),
            true,
        )?;
        self.exec.eager(be, &step)?;
        be.synchronize()?;
        Ok(be.memory_info().map(|(free, _)| free))
    }

    /// The runner, with a KV cache of `num_blocks` blocks (the null block included).
    pub fn build(self, num_blocks: usize) -> Result<Runner<'b>> {
        let kv = KvCache::new(self.be, self.kv_config(), num_blocks)?;
        let cfg = RunnerConfig {
            num_blocks,
            ..self.cfg
        };
        Ok(Runner {
            parts: Parts {
                be: self.be,
                model: self.model,
                kv,
                inputs: self.inputs,
                sampling: self.sampling,
                sample: true,
                overlap: false,
            },
            exec: self.exec,
            policy: GraphPolicy {
                graphs: None,
                force_eager: false,
                verify: false,
                max_tokens: cfg.max_tokens_per_step,
                max_seqs: cfg.max_seqs,
            },
            cfg,
            device_wait: Default::default(),
            group: None,
            last_rows: Vec::new(),
            routed: None,
            deferred: None,
        })
    }
}

impl<'b> Runner<'b> {
    /// A runner of `cfg` (a KV cache of `cfg.num_blocks` blocks, the `arena` graph
    /// memory), eager until graphs are set ([`Runner::set_graphs`]).
    pub fn new(be: &'b dyn Backend, model: Model, cfg: RunnerConfig) -> Result<Self> {
        Self::with_graph_memory(be, model, cfg, GraphMemory::default())
    }

    /// [`Runner::new`] with captured graphs' intermediates held per `graph_memory`.
    pub fn with_graph_memory(
        be: &'b dyn Backend,
        model: Model,
        cfg: RunnerConfig,
        graph_memory: GraphMemory,
    ) -> Result<Self> {
        RunnerBuilder::new(be, model, cfg, graph_memory)?.build(cfg.num_blocks)
    }

    pub fn config(&self) -> &RunnerConfig {
        &self.cfg
    }

    /// Where each sequence's tokens sat in the last step's token rows, recorded when the
    /// model captures hidden states ([`Model::captures_aux`]; empty otherwise, before the
    /// first step and after a failed one).
    pub fn last_rows(&self) -> &[TokenRows] {
        &self.last_rows
    }

    /// The backend the runner steps on.
    pub fn backend(&self) -> &'b dyn Backend {
        self.parts.be
    }

    pub fn model(&self) -> &Model {
        &self.parts.model
    }

    /// The expert cache's running totals under the experts offload policy (synchronises
    /// with the device); `None` otherwise.
    pub fn expert_stats(&self) -> Result<Option<crate::offload::ExpertStats>> {
        match self.parts.model.offload() {
            Some(o) => o.expert_stats(self.parts.be),
            None => Ok(None),
        }
    }

    /// Route the model's sparse layers by a synthetic table (`--router-skew`, see
    /// [`crate::model::routing`]) for steps of up to `max_tokens_per_step` rows, or by
    /// their routers again (`None`). Drops the captured graphs (they hold the routing they
    /// were captured with).
    pub fn set_router_skew(&mut self, skew: Option<RouterSkew>) -> Result<()> {
        if self.tp_size() > 1 {
            return Err(Error::invalid(
                "--router-skew",
                "a routing table set after start-up would not reach the other \
                 tensor-parallel ranks (set `EngineConfig::router_skew`)"
                    .to_string(),
            ));
        }
        self.exec.clear();
        let rows = self.cfg.max_tokens_per_step;
        self.parts.model.set_router_skew(self.parts.be, skew, rows)
    }

    /// Set the FP8 KV cache's per-layer scales ([`KvCache::set_scales`]: before any step
    /// writes the cache). Drops the captured graphs (the scales are launch arguments).
    pub fn set_kv_scales(&mut self, scales: Vec<crate::backend::KvScale>) -> Result<()> {
        self.exec.clear();
        self.parts.kv.set_scales(scales)
    }

    pub fn kv(&self) -> &KvCache {
        &self.parts.kv
    }

    /// Seconds spent waiting for the device to finish steps so far (inside the download
    /// of each step's sampled tokens). Against the steps' wall time, the rest is the
    /// host's share: packing inputs, launching, and scheduling around them.
    pub fn device_wait_secs(&self) -> f64 {
        self.device_wait.get().as_secs_f64()
    }

    /// Run one step and sample one token per sequence. `seqs.blocks` must already hold
    /// room for each sequence's new tokens (`BlockManager::allocate`/`append`): the step
    /// writes them at positions `num_tokens(seq) - tokens.len() ..`.
    pub fn step(&mut self, seqs: &mut Seqs, batch: &[SeqStep<'_>]) -> Result<Vec<u32>> {
        Ok(self.run(seqs, batch, false, None)?.tokens)
    }

    /// Like [`Runner::step`], with each sequence's log-probabilities where its sampling
    /// asks for them.
    pub fn step_sampled(&mut self, seqs: &mut Seqs, batch: &[SeqStep<'_>]) -> Result<Vec<Sampled>> {
        self.run(seqs, batch, false, None).map(StepOut::sampled)
    }

    /// Like [`Runner::step_sampled`], with the masks of the rows marked
    /// [`SeqStep::masked`] written by `fill` while the device runs the step's forward:
    /// such a step's graph stops at the logits (a decode bucket's logits-only graph,
    /// captured on first use; a token bucket's pieces as they are), and its sampling runs
    /// after the masks' upload.
    pub fn step_constrained(
        &mut self,
        seqs: &mut Seqs,
        batch: &[SeqStep<'_>],
        fill: &mut FillMasks<'_>,
    ) -> Result<Vec<Sampled>> {
        self.run(seqs, batch, false, Some(fill))
            .map(StepOut::sampled)
    }

    /// Words of an allowed-token mask row ([`FillMasks`]): the vocabulary / 32, rounded
    /// up.
    pub fn mask_words(&self) -> usize {
        sampling::mask_words(self.parts.model.cfg.vocab_size)
    }

    /// Like [`Runner::step`], and also return each sequence's f32 logits as the model
    /// produced them, before penalties (for parity checks against a reference
    /// implementation).
    pub fn step_with_logits(
        &mut self,
        seqs: &mut Seqs,
        batch: &[SeqStep<'_>],
    ) -> Result<(Vec<u32>, Vec<Vec<f32>>)> {
        let StepOut { tokens, logits, .. } = self.run(seqs, batch, true, None)?;
        let vocab = self.parts.model.cfg.vocab_size;
        let rows = match logits {
            Some(l) => l.chunks(vocab).map(|r| r.to_vec()).collect(),
            None => Vec::new(),
        };
        Ok((tokens, rows))
    }
}
