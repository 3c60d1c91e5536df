//! The model runner: one forward step for a batch of sequences. It owns the model, the KV
//! cache and its block manager, the step inputs and the graph executor; it packs the
//! step's metadata on the host (one upload), picks how the step runs, and samples on the
//! device:
//! - a pure decode step within the largest decode bucket pads its batch to the bucket
//!   and replays that bucket's full graph;
//! - any other step within the largest token bucket (prefill, chunked prefill, decode
//!   rows mixed in) pads its tokens to the bucket and replays that bucket's pieces, with
//!   attention and the LM head eager between and after them;
//! - everything else, and every step in eager mode, runs the same ops eagerly.
//!
//! Graphs are captured on first use or ahead of time ([`Runner::capture_all`]).

use crate::backend::{Backend, Sampling};
use crate::error::{Error, Result};
use crate::graph::{BucketPolicy, Executor, GraphStats, InputTable, Key, Layout, Phase, Pieces};
use crate::kv::{BlockManager, KvCache, KvCacheConfig, SeqId, NULL_BLOCK};
use crate::memory::{Arena, ArenaStats, GraphMemory, MemoryNeed};
use crate::model::config::ModelConfig;
use crate::model::llama::{Model, StepBuffers, StepInputs};
use crate::tensor::{DType, Tensor};

/// Per-sequence sampling parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// <= 0: greedy.
    pub temperature: f32,
    /// <= 0: off.
    pub top_k: i32,
    /// >= 1: off.
    pub top_p: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

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
}

/// Sizing of the runner's memory.
#[derive(Clone, Copy, Debug)]
pub struct RunnerConfig {
    pub block_size: usize,
    pub num_blocks: usize,
    /// Most tokens in one step.
    pub max_tokens_per_step: usize,
    /// Most sequences in one step.
    pub max_seqs: usize,
    /// Longest sequence (prompt + generated); bounds the block tables.
    pub max_seq_len: usize,
}

impl RunnerConfig {
    /// What a run of this configuration needs for a model of `model` in `dtype`: its
    /// weights, the KV cache and arena [`Runner::new`] allocates, and the step inputs
    /// (device buffers plus their host staging). Computed without allocating, so a
    /// command can refuse a run that cannot fit before loading anything.
    pub fn memory_need(&self, be: &dyn Backend, model: &ModelConfig, dtype: DType) -> MemoryNeed {
        let kv_cfg = KvCacheConfig {
            num_layers: model.num_layers,
            num_kv_heads: model.num_kv_heads,
            head_dim: model.head_dim,
            block_size: self.block_size,
            dtype,
        };
        let table_width = self.max_seq_len.div_ceil(self.block_size.max(1));
        let arena = Model::arena_bytes_for(
            model,
            dtype,
            be,
            self.max_tokens_per_step,
            self.max_seqs,
            table_width,
            self.block_size,
        );
        let inputs = InputTable::bytes_for(
            StepViews::FIELDS,
            self.max_tokens_per_step.max(self.max_seqs),
            self.max_seqs,
            table_width,
        )
        .saturating_mul(2);
        MemoryNeed {
            weights: model.weight_bytes(dtype),
            kv_cache: self.num_blocks.saturating_mul(kv_cfg.bytes_per_block()),
            kv_blocks: self.num_blocks,
            activations: arena.saturating_add(inputs),
        }
    }
}

crate::step_inputs! {
    /// Every per-step input, declared once (see `graph::inputs`). The block tables, the
    /// widest field, come last: a step uploads only the rows it uses of them.
    pub struct StepViews, StepHost {
        /// The step's token ids.
        token_ids: i32 [Tokens, One] = 0,
        /// Each token's position in its sequence.
        positions: i32 [Tokens, One] = 0,
        /// Each token's KV-cache slot; -1 (padding) writes nothing.
        slot_mapping: i32 [Tokens, One] = -1,
        /// Tokens in the cache per sequence after the step; 0 for padding.
        seq_lens: i32 [Seqs, One] = 0,
        /// Row offsets of the sequences' tokens.
        cu_seqlens_q: i32 [SeqsPlusOne, One] = 0,
        /// The row of each sequence's last token; -1 (padding) gathers a zero row.
        logits_indices: i32 [Seqs, One] = -1,
        /// Sampling per sequence; padding samples greedily.
        temperature: f32 [Seqs, One] = 0.0,
        top_k: i32 [Seqs, One] = 0,
        top_p: f32 [Seqs, One] = 1.0,
        seeds: i64 [Seqs, One] = 0,
        /// A mixed step's `cu_seqlens_q` of the sequences after its leading decode rows,
        /// relative to their first row (attention runs the two groups separately).
        cu_rest: i32 [SeqsPlusOne, One] = 0,
        /// Each sequence's blocks; unused entries and padding rows hold the null block.
        block_tables: i32 [Seqs, Table] = NULL_BLOCK,
    }
}

/// Which graphs the runner captures: decode batch-size buckets and token-count buckets
/// for prefill and mixed steps ([`BucketPolicy::None`] for either keeps it eager).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphConfig {
    pub decode: BucketPolicy,
    pub mixed: BucketPolicy,
}

/// How a step runs, fixed by its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    Eager,
    Graph(Key),
}

/// The runner's fields a step borrows, leaving `exec` free for the executor call.
macro_rules! parts {
    ($r:expr) => {
        StepParts {
            be: $r.be,
            model: &$r.model,
            kv: &$r.kv,
            inputs: &$r.inputs,
            sampled: &$r.sampled,
            table_width: $r.table_width,
            block_size: $r.cfg.block_size,
        }
    };
}

pub struct Runner<'b> {
    be: &'b dyn Backend,
    inputs: InputTable,
    /// Sampled token ids, `[max_seqs]`.
    sampled: Tensor,
    exec: Executor<StepBuffers>,
    graphs: Option<GraphConfig>,
    /// Run every step eagerly, keeping the captured graphs (for comparisons).
    force_eager: bool,
    verify_graphs: bool,
    pub model: Model,
    pub kv: KvCache,
    pub blocks: BlockManager,
    cfg: RunnerConfig,
    table_width: usize,
}

impl<'b> Runner<'b> {
    pub fn new(be: &'b dyn Backend, model: Model, cfg: RunnerConfig) -> Result<Self> {
        if cfg.block_size == 0
            || cfg.max_tokens_per_step == 0
            || cfg.max_seqs == 0
            || cfg.max_seq_len == 0
        {
            return Err(Error::invalid(
                "runner",
                format!("block_size, max_tokens_per_step, max_seqs and max_seq_len must all be >= 1: {cfg:?}"),
            ));
        }
        if cfg.max_seq_len > model.max_positions() {
            return Err(Error::invalid(
                "runner",
                format!(
                    "max_seq_len {} exceeds the model's {} positions",
                    cfg.max_seq_len,
                    model.max_positions()
                ),
            ));
        }
        let kv_cfg = KvCacheConfig {
            num_layers: model.cfg.num_layers,
            num_kv_heads: model.cfg.num_kv_heads,
            head_dim: model.cfg.head_dim,
            block_size: cfg.block_size,
            dtype: model.weights.dtype,
        };
        let kv = KvCache::new(be, kv_cfg, cfg.num_blocks)?;
        let blocks = BlockManager::new(cfg.num_blocks, cfg.block_size)?;
        let table_width = cfg.max_seq_len.div_ceil(cfg.block_size);
        let bytes = model.arena_bytes(
            be,
            cfg.max_tokens_per_step.max(cfg.max_seqs),
            cfg.max_seqs,
            table_width,
            cfg.block_size,
        );
        let exec = Executor::new(be, bytes, GraphMemory::default())?;
        let inputs = InputTable::new(
            be,
            StepViews::FIELDS,
            cfg.max_tokens_per_step.max(cfg.max_seqs),
            cfg.max_seqs,
            table_width,
        )?;
        let sampled = be.alloc(DType::I32, &[cfg.max_seqs])?;
        Ok(Runner {
            be,
            inputs,
            sampled,
            exec,
            graphs: None,
            force_eager: false,
            verify_graphs: false,
            model,
            kv,
            blocks,
            cfg,
            table_width,
        })
    }

    pub fn config(&self) -> &RunnerConfig {
        &self.cfg
    }

    /// Choose how captured graphs get their intermediate memory (default
    /// [`GraphMemory::Arena`]). Drops every captured graph and the current arena, and
    /// reserves a new one of the same size.
    pub fn set_graph_memory(&mut self, strategy: GraphMemory) -> Result<()> {
        self.exec.set_memory(self.be, strategy)
    }

    /// Physical and virtual bytes of the graph memory (the arena's pool, including what
    /// only captured graphs hold), and the time spent mapping.
    pub fn graph_memory_stats(&self) -> ArenaStats {
        self.exec.memory_stats()
    }

    /// Each captured (phase, bucket) with its capture's arena need in bytes, ascending.
    pub fn captured(&self) -> Vec<(Key, usize)> {
        self.exec.captured()
    }

    /// Each captured decode bucket with its capture's arena need in bytes, ascending.
    pub fn captured_buckets(&self) -> Vec<(usize, usize)> {
        self.exec
            .captured()
            .into_iter()
            .filter(|(k, _)| k.phase == Phase::Decode)
            .map(|(k, b)| (k.bucket, b))
            .collect()
    }

    /// Run one step and sample one token per sequence. The block manager must already
    /// hold room for each sequence's new tokens (`BlockManager::allocate`/`append`):
    /// the step writes them at positions `num_tokens(seq) - tokens.len() ..`.
    pub fn step(&mut self, batch: &[SeqStep<'_>]) -> Result<Vec<u32>> {
        Ok(self.run(batch, false)?.0)
    }

    /// Like [`Runner::step`], and also return each sequence's f32 logits (for parity
    /// checks against a reference implementation).
    pub fn step_with_logits(&mut self, batch: &[SeqStep<'_>]) -> Result<(Vec<u32>, Vec<Vec<f32>>)> {
        let (tokens, logits) = self.run(batch, true)?;
        let vocab = self.model.cfg.vocab_size;
        let rows = match logits {
            Some(l) => l.chunks(vocab).map(|r| r.to_vec()).collect(),
            None => Vec::new(),
        };
        Ok((tokens, rows))
    }

    /// The plan and input layout of a step of `n` tokens from `b` sequences.
    fn plan(&self, n: usize, b: usize, decode_only: bool) -> (Plan, Layout) {
        let Some(g) = self.graphs.as_ref().filter(|_| !self.force_eager) else {
            return (Plan::Eager, self.inputs.layout(n, b));
        };
        if decode_only {
            if let Some(r) = g.decode.bucket_for(b).filter(|&r| r <= self.cfg.max_seqs) {
                let key = Key {
                    phase: Phase::Decode,
                    bucket: r,
                };
                return (Plan::Graph(key), self.layout_of(key));
            }
        }
        match g
            .mixed
            .bucket_for(n)
            .filter(|&t| t <= self.cfg.max_tokens_per_step)
        {
            Some(t) => {
                let key = Key {
                    phase: Phase::Mixed,
                    bucket: t,
                };
                (Plan::Graph(key), self.layout_of(key))
            }
            None => (Plan::Eager, self.inputs.layout(n, b)),
        }
    }

    /// The fixed input layout of a captured key: decode buckets have one token per
    /// sequence row; a token bucket has room for as many sequences as it can hold.
    fn layout_of(&self, key: Key) -> Layout {
        match key.phase {
            Phase::Decode => self.inputs.layout(key.bucket, key.bucket),
            Phase::Mixed => self
                .inputs
                .layout(key.bucket, key.bucket.min(self.cfg.max_seqs)),
        }
    }

    fn run(
        &mut self,
        batch: &[SeqStep<'_>],
        keep_logits: bool,
    ) -> Result<(Vec<u32>, Option<Vec<f32>>)> {
        let n: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let b = batch.len();
        if b == 0 {
            return Ok((Vec::new(), None));
        }
        if n > self.cfg.max_tokens_per_step || b > self.cfg.max_seqs {
            return Err(Error::invalid(
                "runner.step",
                format!(
                    "{n} tokens / {b} sequences exceed the configured {} / {}",
                    self.cfg.max_tokens_per_step, self.cfg.max_seqs
                ),
            ));
        }
        let decode_only = batch.iter().all(|s| s.tokens.len() == 1);
        // A mixed step runs its decode rows first, so attention can take them through the
        // decode path and the rest through the prefill path (two launches); results go
        // back in the caller's order.
        let d = if decode_only {
            0
        } else {
            batch.iter().filter(|s| s.tokens.len() == 1).count()
        };
        if d > 0 {
            let order: Vec<usize> = (0..b)
                .filter(|&i| batch[i].tokens.len() == 1)
                .chain((0..b).filter(|&i| batch[i].tokens.len() != 1))
                .collect();
            let sorted: Vec<SeqStep<'_>> = order.iter().map(|&i| batch[i]).collect();
            let (tokens, logits) = self.run_sorted(&sorted, keep_logits, false, d)?;
            let vocab = self.model.cfg.vocab_size;
            let mut out_tokens = vec![0u32; b];
            let mut out_logits = logits.as_ref().map(|l| vec![0f32; l.len()]);
            for (k, &i) in order.iter().enumerate() {
                out_tokens[i] = tokens[k];
                if let (Some(src), Some(dst)) = (&logits, out_logits.as_mut()) {
                    dst[i * vocab..(i + 1) * vocab]
                        .copy_from_slice(&src[k * vocab..(k + 1) * vocab]);
                }
            }
            return Ok((out_tokens, out_logits));
        }
        self.run_sorted(batch, keep_logits, decode_only, 0)
    }

    /// [`Runner::run`] over a batch whose first `d` sequences are the decode rows of a
    /// mixed step (0: no split).
    fn run_sorted(
        &mut self,
        batch: &[SeqStep<'_>],
        keep_logits: bool,
        decode_only: bool,
        d: usize,
    ) -> Result<(Vec<u32>, Option<Vec<f32>>)> {
        let n: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let b = batch.len();
        let (plan, layout) = self.plan(n, b, decode_only);
        let be = self.be;
        match plan {
            Plan::Eager => {
                self.pack(batch, &layout, b, d)?;
                let step = forward_step(parts!(self), &layout, decode_only, Shape::Whole, b, d)?;
                let buf = self.exec.eager(&step)?;
                let tokens = self.download_tokens(b)?;
                let logits = if keep_logits {
                    Some(be.download::<f32>(&buf.logits(b)?)?)
                } else {
                    None
                };
                Ok((tokens, logits))
            }
            Plan::Graph(key) => {
                let read = match key.phase {
                    Phase::Decode => key.bucket,
                    Phase::Mixed => b,
                };
                self.pack(batch, &layout, read, d)?;
                let (shape, decode, seqs) = match key.phase {
                    Phase::Decode => (Shape::Whole, true, key.bucket),
                    Phase::Mixed => (Shape::Split, false, b),
                };
                let real = if decode { b } else { n };
                let step = forward_step(parts!(self), &layout, decode, shape, seqs, d)?;
                let buf = self.exec.replay(be, key, real, &step)?;
                let replayed = if keep_logits || self.verify_graphs {
                    Some(be.download::<f32>(&buf.logits(b)?)?)
                } else {
                    None
                };
                let tokens = self.download_tokens(b)?;
                if !self.verify_graphs {
                    return Ok((tokens, replayed));
                }
                // Debug check: the same step eagerly and unpadded.
                let eager_layout = self.inputs.layout(n, b);
                self.pack(batch, &eager_layout, b, d)?;
                let step =
                    forward_step(parts!(self), &eager_layout, decode_only, Shape::Whole, b, d)?;
                let buf = self.exec.eager(&step)?;
                let eager = be.download::<f32>(&buf.logits(b)?)?;
                let tol = if self.model.weights.dtype == DType::F32 {
                    1e-4
                } else {
                    3e-2
                };
                let vocab = self.model.cfg.vocab_size;
                self.exec
                    .verify(key, replayed.as_deref().unwrap_or(&[]), &eager, vocab, tol)?;
                Ok((tokens, Some(eager)))
            }
        }
    }

    fn download_tokens(&self, b: usize) -> Result<Vec<u32>> {
        Ok(self
            .be
            .download::<i32>(&self.sampled.prefix(b)?)?
            .into_iter()
            .map(|t| t as u32)
            .collect())
    }

    /// Pack the step's metadata into the host staging of `layout` (rows beyond the
    /// step's padded), and upload what the step reads (`read_seqs` sequence rows): one
    /// copy.
    fn pack(
        &mut self,
        batch: &[SeqStep<'_>],
        layout: &Layout,
        read_seqs: usize,
        d: usize,
    ) -> Result<()> {
        let w = self.table_width;
        let h = StepHost::of(&mut self.inputs, layout)?;
        h.cu_seqlens_q[0] = 0;
        let mut t = 0usize;
        for (i, s) in batch.iter().enumerate() {
            let total = self.blocks.num_tokens(s.seq)?;
            if s.tokens.is_empty() || s.tokens.len() > total {
                return Err(Error::invalid(
                    "runner.step",
                    format!(
                        "sequence {}: {} new tokens but {total} in the cache",
                        s.seq,
                        s.tokens.len()
                    ),
                ));
            }
            let start = total - s.tokens.len();
            for (j, &tok) in s.tokens.iter().enumerate() {
                h.token_ids[t] = tok as i32;
                h.positions[t] = (start + j) as i32;
                h.slot_mapping[t] = self.blocks.slot(s.seq, start + j).ok_or_else(|| {
                    Error::invalid(
                        "runner.step",
                        format!("sequence {}: no slot for position {}", s.seq, start + j),
                    )
                })?;
                t += 1;
            }
            self.blocks.fill_block_table_row(
                s.seq,
                &mut h.block_tables[i * w..(i + 1) * w],
                NULL_BLOCK as i32,
            )?;
            h.seq_lens[i] = total as i32;
            h.cu_seqlens_q[i + 1] = t as i32;
            h.logits_indices[i] = t as i32 - 1;
            h.temperature[i] = s.sampling.temperature;
            h.top_k[i] = s.sampling.top_k;
            h.top_p[i] = s.sampling.top_p;
            h.seeds[i] = mix_seed(s.sampling.seed, total as u64) as i64;
        }
        // The sequences after the `d` decode rows, relative to their first row.
        if d > 0 {
            for k in 0..=batch.len() - d {
                h.cu_rest[k] = h.cu_seqlens_q[d + k] - d as i32;
            }
        }
        self.finish_pack(layout, t, batch.len(), read_seqs)
    }

    /// Pad the rows a step of `tokens` / `seqs` leaves unused, and upload what a step
    /// reading `read_seqs` rows of the block tables needs.
    fn finish_pack(
        &mut self,
        layout: &Layout,
        tokens: usize,
        seqs: usize,
        read_seqs: usize,
    ) -> Result<()> {
        self.inputs.pad(layout, tokens, seqs)?;
        self.inputs
            .upload(self.be, layout, layout.tokens, read_seqs)
    }

    /// Turn graph mode on with decode buckets only (prefill and mixed steps eager), or
    /// off (`None`). Drops the captured graphs.
    pub fn set_graph_mode(&mut self, policy: Option<BucketPolicy>) {
        self.set_graphs(policy.map(|decode| GraphConfig {
            decode,
            mixed: BucketPolicy::None,
        }));
    }

    /// Turn graph mode on with decode and token buckets, or off (`None`: every step
    /// eager). Drops the captured graphs and their statistics.
    pub fn set_graphs(&mut self, graphs: Option<GraphConfig>) {
        self.exec.clear();
        self.graphs = graphs;
    }

    /// Run every step eagerly while `on`, keeping the captured graphs and the graph
    /// configuration (to compare both modes in one process).
    pub fn set_force_eager(&mut self, on: bool) {
        self.force_eager = on;
    }

    /// The key a step of `n` tokens from `b` sequences runs in, or `None` (eager).
    pub fn key_for(&self, n: usize, b: usize, decode_only: bool) -> Option<Key> {
        match self.plan(n, b, decode_only).0 {
            Plan::Graph(k) => Some(k),
            Plan::Eager => None,
        }
    }

    /// Every key the graph configuration captures (decode buckets up to `max_seqs`,
    /// token buckets up to `max_tokens_per_step`), largest first within each phase.
    pub fn graph_keys(&self) -> Vec<Key> {
        let Some(g) = &self.graphs else {
            return Vec::new();
        };
        let mut keys: Vec<Key> = g
            .decode
            .buckets()
            .into_iter()
            .filter(|&r| r <= self.cfg.max_seqs)
            .rev()
            .map(|bucket| Key {
                phase: Phase::Decode,
                bucket,
            })
            .collect();
        keys.extend(
            g.mixed
                .buckets()
                .into_iter()
                .filter(|&t| t <= self.cfg.max_tokens_per_step)
                .rev()
                .map(|bucket| Key {
                    phase: Phase::Mixed,
                    bucket,
                }),
        );
        keys
    }

    /// Capture every key now (all rows padding), largest first, then plan the LM head's
    /// GEMM for every row count a piecewise step may use; `progress(done, total)` after
    /// each capture.
    pub fn capture_all(&mut self, progress: &mut dyn FnMut(usize, usize)) -> Result<()> {
        let keys = self.graph_keys();
        for (i, &key) in keys.iter().enumerate() {
            self.capture_key(key)?;
            progress(i + 1, keys.len());
        }
        if keys.iter().any(|k| k.phase == Phase::Mixed) {
            self.warm_head()?;
        }
        Ok(())
    }

    /// Capture the decode graph of bucket `rows` now; see [`Runner::capture_key`].
    pub fn capture_bucket(&mut self, rows: usize) -> Result<()> {
        self.capture_key(Key {
            phase: Phase::Decode,
            bucket: rows,
        })
    }

    /// Capture `key` now (all rows padding), unless it is captured already. It must be
    /// one of [`Runner::graph_keys`].
    pub fn capture_key(&mut self, key: Key) -> Result<()> {
        if !self.graph_keys().contains(&key) {
            return Err(Error::invalid(
                "capture",
                format!(
                    "{key} is not a bucket of the graph configuration (graph mode {}; decode buckets up to max_seqs {}, token buckets up to max_tokens_per_step {})",
                    if self.graphs.is_some() { "on" } else { "off" },
                    self.cfg.max_seqs,
                    self.cfg.max_tokens_per_step
                ),
            ));
        }
        if self.exec.contains(key) {
            return Ok(());
        }
        let layout = self.layout_of(key);
        let step = match key.phase {
            Phase::Decode => {
                self.pad_only(&layout, layout.seqs)?;
                forward_step(parts!(self), &layout, true, Shape::Whole, layout.seqs, 0)?
            }
            Phase::Mixed => {
                // One empty sequence: every token row is padding.
                self.pad_only(&layout, 1)?;
                forward_step(parts!(self), &layout, false, Shape::Split, 1, 0)?
            }
        };
        self.exec.capture(self.be, key, &step)
    }

    /// Inputs of `seqs` empty sequences and no tokens: every row padding, `cu` all zero.
    fn pad_only(&mut self, layout: &Layout, seqs: usize) -> Result<()> {
        StepHost::of(&mut self.inputs, layout)?.cu_seqlens_q[0] = 0;
        self.finish_pack(layout, 0, 0, seqs)
    }

    /// Run the LM head (and sampling) eagerly once for every row count a piecewise step's
    /// head may have (a power of two, capped at a token bucket's sequence rows), so no
    /// GEMM is planned during a request.
    fn warm_head(&mut self) -> Result<()> {
        let mut rows = std::collections::BTreeSet::new();
        for k in self.graph_keys() {
            if k.phase != Phase::Mixed {
                continue;
            }
            let cap = self.layout_of(k).seqs;
            let mut p = 1usize;
            while p < 2 * cap {
                rows.insert(p.min(cap));
                p *= 2;
            }
        }
        for rows in rows {
            let layout = self.inputs.layout(rows, rows);
            self.pad_only(&layout, rows)?;
            let step = forward_step(parts!(self), &layout, true, Shape::HeadOnly, rows, 0)?;
            self.exec.eager(&step)?;
        }
        Ok(())
    }

    /// Run one all-padding step of the largest shape eagerly: it maps the arena's whole
    /// need and creates whatever a step allocates on first use, so the device memory
    /// free after it is what the KV cache may take (see [`Runner::resize_kv`]).
    pub fn warm_largest(&mut self) -> Result<()> {
        let layout = self.inputs.layout(
            self.cfg.max_tokens_per_step.max(self.cfg.max_seqs),
            self.cfg.max_seqs,
        );
        self.pad_only(&layout, 1)?;
        let step = forward_step(parts!(self), &layout, false, Shape::Whole, 1, 0)?;
        self.exec.eager(&step)?;
        self.be.synchronize()
    }

    /// Replace the KV cache (and its block manager) with one of `num_blocks` blocks. Only
    /// before any sequence holds blocks; drops every captured graph (they write the old
    /// cache).
    pub fn resize_kv(&mut self, num_blocks: usize) -> Result<()> {
        if self.blocks.num_seqs() > 0 {
            return Err(Error::invalid(
                "runner.resize_kv",
                format!("{} sequences still hold KV blocks", self.blocks.num_seqs()),
            ));
        }
        let blocks = BlockManager::new(num_blocks, self.cfg.block_size)?;
        self.exec.clear();
        let kv_cfg = *self.kv.config();
        // Free the old cache before allocating the new one (the smallest valid cache in
        // between); when the new one cannot be had, the old size is restored.
        let old = self.kv.num_blocks();
        self.kv = KvCache::new(self.be, kv_cfg, 2)?;
        match KvCache::new(self.be, kv_cfg, num_blocks) {
            Ok(kv) => self.kv = kv,
            Err(e) => {
                self.kv = KvCache::new(self.be, kv_cfg, old)?;
                return Err(e);
            }
        }
        self.blocks = blocks;
        self.cfg.num_blocks = num_blocks;
        Ok(())
    }

    /// Debug check: after every graph replay, run the same step eagerly (unpadded) and
    /// fail if any row's logits differ by more than the dtype's tolerance (normalised
    /// error; f32 1e-4, bf16/f16 3e-2). The tokens returned are the replay's, the logits
    /// the eager run's. Costs an extra eager step per replay.
    pub fn set_verify_graphs(&mut self, on: bool) {
        self.verify_graphs = on;
    }

    /// Graph statistics summed over every key, when graph mode is on.
    pub fn graph_stats(&self) -> Option<GraphStats> {
        self.graphs.as_ref().map(|_| self.exec.total(None))
    }

    /// Graph statistics of one phase, when graph mode is on.
    pub fn phase_stats(&self, phase: Phase) -> Option<GraphStats> {
        self.graphs.as_ref().map(|_| self.exec.total(Some(phase)))
    }
}

/// How a step's ops are grouped into pieces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// One piece: the whole forward, LM head and sampling (eager steps, decode graphs).
    Whole,
    /// A piece before each attention and one after the last; attention, the LM head and
    /// sampling are the seams (prefill and mixed graphs).
    Split,
    /// Only the LM head and sampling (warm-up).
    HeadOnly,
}

/// One forward step over the runner's inputs, as [`Pieces`] for the executor.
struct ForwardStep<'a> {
    be: &'a dyn Backend,
    model: &'a Model,
    kv: &'a KvCache,
    /// The inputs: token fields at the layout's capacity, sequence fields cut to `seqs`.
    v: StepViews,
    /// The layout's capacity.
    tokens: usize,
    seq_rows: usize,
    seqs: usize,
    head_rows: usize,
    /// Pure decode (attention without `cu_seqlens_q`).
    decode: bool,
    /// Leading decode rows of a mixed step, attended separately (0: one launch).
    decode_rows: usize,
    shape: Shape,
    sampled: Tensor,
    table_width: usize,
    block_size: usize,
}

impl ForwardStep<'_> {
    fn inputs(&self) -> StepInputs<'_> {
        StepInputs {
            token_ids: &self.v.token_ids,
            positions: &self.v.positions,
            slot_mapping: &self.v.slot_mapping,
            block_tables: &self.v.block_tables,
            seq_lens: &self.v.seq_lens,
            cu_seqlens_q: (!self.decode).then_some(&self.v.cu_seqlens_q),
            logits_indices: &self.v.logits_indices,
            split: (self.decode_rows > 0).then_some((self.decode_rows, &self.v.cu_rest)),
        }
    }

    fn head_and_sample(&self, buf: &StepBuffers) -> Result<()> {
        let logits = self
            .model
            .head(self.be, &self.inputs(), buf, self.head_rows)?;
        self.be.sample(
            &logits.prefix(self.seqs)?,
            &Sampling {
                temperature: &self.v.temperature,
                top_k: &self.v.top_k,
                top_p: &self.v.top_p,
                seeds: &self.v.seeds,
            },
            &self.sampled,
        )
    }
}

impl Pieces for ForwardStep<'_> {
    type State = StepBuffers;

    fn alloc(&self, arena: &mut Arena) -> Result<StepBuffers> {
        self.model.alloc_step(
            self.be,
            arena,
            self.tokens,
            self.seq_rows,
            self.table_width,
            self.block_size,
        )
    }

    fn count(&self) -> usize {
        match self.shape {
            Shape::Split => self.model.num_pieces(),
            Shape::Whole | Shape::HeadOnly => 1,
        }
    }

    fn piece(&self, buf: &StepBuffers, i: usize) -> Result<()> {
        let inp = self.inputs();
        match self.shape {
            Shape::Split => self.model.piece(self.be, self.kv, &inp, buf, i),
            Shape::HeadOnly => self.head_and_sample(buf),
            Shape::Whole => {
                let layers = self.model.num_pieces() - 1;
                for k in 0..=layers {
                    self.model.piece(self.be, self.kv, &inp, buf, k)?;
                    if k < layers {
                        self.model.attention(self.be, self.kv, &inp, buf, k)?;
                    }
                }
                self.head_and_sample(buf)
            }
        }
    }

    fn seam(&self, buf: &StepBuffers, i: usize) -> Result<()> {
        if self.shape != Shape::Split {
            return Ok(());
        }
        let layers = self.model.num_pieces() - 1;
        if i < layers {
            self.model
                .attention(self.be, self.kv, &self.inputs(), buf, i)
        } else {
            self.head_and_sample(buf)
        }
    }
}

/// A step over the runner's inputs in `layout`: `seqs` sequences (attention and sampling
/// rows), ops grouped per `shape`.
fn forward_step<'a>(
    r: StepParts<'a>,
    layout: &Layout,
    decode: bool,
    shape: Shape,
    seqs: usize,
    decode_rows: usize,
) -> Result<ForwardStep<'a>> {
    let mut v = StepViews::of(r.inputs, layout)?;
    v.seq_lens = v.seq_lens.prefix(seqs)?;
    v.cu_seqlens_q = v.cu_seqlens_q.prefix(seqs + 1)?;
    let decode_rows = if decode_rows < seqs { decode_rows } else { 0 };
    v.cu_rest = v.cu_rest.prefix(seqs - decode_rows + 1)?;
    v.block_tables = v.block_tables.prefix(seqs)?;
    v.temperature = v.temperature.prefix(seqs)?;
    v.top_k = v.top_k.prefix(seqs)?;
    v.top_p = v.top_p.prefix(seqs)?;
    v.seeds = v.seeds.prefix(seqs)?;
    // The LM head's rows: padded to a power of two within the layout for pieces, so its
    // GEMM shapes are few (and planned at capture).
    let head_rows = match shape {
        Shape::Split => seqs.next_power_of_two().min(layout.seqs),
        _ => seqs,
    };
    Ok(ForwardStep {
        be: r.be,
        model: r.model,
        kv: r.kv,
        v,
        tokens: layout.tokens,
        seq_rows: layout.seqs,
        seqs,
        head_rows,
        decode,
        decode_rows,
        shape,
        sampled: r.sampled.prefix(seqs)?,
        table_width: r.table_width,
        block_size: r.block_size,
    })
}

/// What a [`ForwardStep`] borrows from the runner (not the executor).
#[derive(Clone, Copy)]
struct StepParts<'a> {
    be: &'a dyn Backend,
    model: &'a Model,
    kv: &'a KvCache,
    inputs: &'a InputTable,
    sampled: &'a Tensor,
    table_width: usize,
    block_size: usize,
}

/// The request seed mixed with the index of the token being sampled: a fresh,
/// reproducible seed per token.
fn mix_seed(seed: u64, index: u64) -> u64 {
    crate::ops::mix64(seed ^ index.wrapping_mul(crate::ops::GOLDEN))
}
