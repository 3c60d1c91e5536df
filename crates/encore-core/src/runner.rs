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

use std::collections::HashMap;

use crate::backend::{Backend, Penalties, SampleLogprobs, Sampling, MAX_TOP_LOGPROBS, PROMPT_BIT};
use crate::error::{Error, Result};
use crate::graph::{BucketPolicy, Executor, GraphStats, InputTable, Key, Layout, Phase, Pieces};
use crate::kv::{BlockManager, KvCache, KvCacheConfig, SeqId, NULL_BLOCK};
use crate::memory::{Arena, ArenaStats, GraphMemory, MemoryNeed};
use crate::model::config::ModelConfig;
use crate::model::llama::{Model, StepBuffers, StepInputs};
use crate::tensor::{DType, Tensor};

/// Per-sequence sampling parameters (semantics: [`Sampling`], [`Penalties`],
/// [`SampleLogprobs`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// <= 0: greedy.
    pub temperature: f32,
    /// <= 0: off.
    pub top_k: i32,
    /// >= 1: off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; <= 0: off.
    pub min_p: f32,
    pub seed: u64,
    /// Subtracted from the logit of every token the output holds; 0: off.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per occurrence in the output; 0: off.
    pub frequency_penalty: f32,
    /// Divides positive (multiplies negative) logits of tokens in the prompt or the
    /// output; 1: off.
    pub repetition_penalty: f32,
    /// Log-probabilities of each sampled token and of the `n` most likely ones
    /// (`n <= MAX_TOP_LOGPROBS`), over the logits after penalties and before temperature
    /// and truncation; `None`: off.
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logprobs: None,
        }
    }
}

impl SamplingParams {
    /// Whether any penalty is on: the sequence then needs a penalty slot
    /// ([`Runner::begin_penalties`]).
    pub fn has_penalties(&self) -> bool {
        self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || self.repetition_penalty != 1.0
    }
}

/// The log-probabilities of one sampled token: its own and the most likely tokens'
/// (largest first), over the logits after penalties and before temperature (vLLM's
/// "raw" log-probabilities when no penalty is on).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// What a step produced for one sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// When the sequence's sampling asked for them.
    pub logprobs: Option<TokenLogprobs>,
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
    /// Sequences that may use penalties at once: each holds a row of a device table of
    /// `vocab` i32 (its tokens' prompt flags and output counts), `penalty_slots * vocab *
    /// 4` bytes in all (128 slots of a 128k vocabulary: 64 MiB). 0: no table, and
    /// requests with penalties are refused.
    pub penalty_slots: usize,
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
        // Sampled tokens and log-probabilities, the penalty table.
        let sampling = self.max_seqs.saturating_mul(2 + 2 * MAX_TOP_LOGPROBS) * 4
            + self
                .penalty_slots
                .saturating_mul(model.vocab_size)
                .saturating_mul(4);
        MemoryNeed {
            weights: model.weight_bytes(dtype),
            kv_cache: self.num_blocks.saturating_mul(kv_cfg.bytes_per_block()),
            kv_blocks: self.num_blocks,
            activations: arena.saturating_add(inputs).saturating_add(sampling),
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
        min_p: f32 [Seqs, One] = 0.0,
        seeds: i64 [Seqs, One] = 0,
        /// The row's penalty slot; -1: no penalties (padding, a prompt chunk short of
        /// the end, a sequence without penalties).
        pen_slot: i32 [Seqs, One] = -1,
        repetition: f32 [Seqs, One] = 1.0,
        frequency: f32 [Seqs, One] = 0.0,
        presence: f32 [Seqs, One] = 0.0,
        /// Top log-probabilities per row; -1: none.
        num_logprobs: i32 [Seqs, One] = -1,
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
            lp: &$r.lp,
            pen_counts: $r.pen.counts.as_ref(),
            table_width: $r.table_width,
            block_size: $r.cfg.block_size,
        }
    };
}

/// The log-probability outputs of sampling: the token's `[max_seqs]`, the top ids and
/// log-probabilities `[max_seqs, MAX_TOP_LOGPROBS]`.
struct LogprobBuffers {
    token: Tensor,
    top_ids: Tensor,
    top: Tensor,
}

/// The penalty table and who holds which row.
struct PenaltyState {
    /// i32 `[penalty_slots, vocab]` (see [`Penalties`]); `None` with 0 slots.
    counts: Option<Tensor>,
    free: Vec<usize>,
    held: HashMap<SeqId, PenaltySeq>,
}

/// A sequence's penalty row, and the length the sequence has when a step samples the
/// token it keeps (a step ending short of it is a prompt chunk whose sample is dropped).
struct PenaltySeq {
    slot: usize,
    len: usize,
}

pub struct Runner<'b> {
    be: &'b dyn Backend,
    inputs: InputTable,
    /// Sampled token ids, `[max_seqs]`.
    sampled: Tensor,
    lp: LogprobBuffers,
    pen: PenaltyState,
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
    /// Time spent waiting for the device at the end of steps (the sampled tokens'
    /// download), summed: a step's wall time minus this is host work.
    device_wait: std::cell::Cell<std::time::Duration>,
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
        let lp = LogprobBuffers {
            token: be.alloc(DType::F32, &[cfg.max_seqs])?,
            top_ids: be.alloc(DType::I32, &[cfg.max_seqs, MAX_TOP_LOGPROBS])?,
            top: be.alloc(DType::F32, &[cfg.max_seqs, MAX_TOP_LOGPROBS])?,
        };
        let counts = match cfg.penalty_slots {
            0 => None,
            n => Some(be.alloc(DType::I32, &[n, model.cfg.vocab_size])?),
        };
        let pen = PenaltyState {
            counts,
            free: (0..cfg.penalty_slots).rev().collect(),
            held: HashMap::new(),
        };
        Ok(Runner {
            be,
            inputs,
            sampled,
            lp,
            pen,
            exec,
            graphs: None,
            force_eager: false,
            verify_graphs: false,
            model,
            kv,
            blocks,
            cfg,
            table_width,
            device_wait: Default::default(),
        })
    }

    /// Seconds spent waiting for the device to finish steps so far (inside the download
    /// of each step's sampled tokens). Against the steps' wall time, the rest is the
    /// host's share: packing inputs, launching, and scheduling around them.
    pub fn device_wait_secs(&self) -> f64 {
        self.device_wait.get().as_secs_f64()
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
        Ok(self.run(batch, false)?.tokens)
    }

    /// Like [`Runner::step`], with each sequence's log-probabilities where its sampling
    /// asks for them.
    pub fn step_sampled(&mut self, batch: &[SeqStep<'_>]) -> Result<Vec<Sampled>> {
        let out = self.run(batch, false)?;
        Ok(out
            .tokens
            .into_iter()
            .zip(out.logprobs)
            .map(|(token, logprobs)| Sampled { token, logprobs })
            .collect())
    }

    /// Like [`Runner::step`], and also return each sequence's f32 logits as the model
    /// produced them, before penalties (for parity checks against a reference
    /// implementation).
    pub fn step_with_logits(&mut self, batch: &[SeqStep<'_>]) -> Result<(Vec<u32>, Vec<Vec<f32>>)> {
        let StepOut { tokens, logits, .. } = self.run(batch, true)?;
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

    fn run(&mut self, batch: &[SeqStep<'_>], keep_logits: bool) -> Result<StepOut> {
        let n: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let b = batch.len();
        if b == 0 {
            return Ok(StepOut::default());
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
            let StepOut {
                tokens,
                logits,
                mut logprobs,
            } = self.run_sorted(&sorted, keep_logits, false, d)?;
            let vocab = self.model.cfg.vocab_size;
            let mut out = StepOut {
                tokens: vec![0u32; b],
                logits: logits.as_ref().map(|l| vec![0f32; l.len()]),
                logprobs: vec![None; b],
            };
            for (k, &i) in order.iter().enumerate() {
                out.tokens[i] = tokens[k];
                out.logprobs[i] = logprobs[k].take();
                if let (Some(src), Some(dst)) = (&logits, out.logits.as_mut()) {
                    dst[i * vocab..(i + 1) * vocab]
                        .copy_from_slice(&src[k * vocab..(k + 1) * vocab]);
                }
            }
            return Ok(out);
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
    ) -> Result<StepOut> {
        let n: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let b = batch.len();
        let (plan, layout) = self.plan(n, b, decode_only);
        let be = self.be;
        self.model.prepare_step(be)?;
        match plan {
            Plan::Eager => {
                self.pack(batch, &layout, b, d, true)?;
                let step = forward_step(parts!(self), &layout, decode_only, Shape::Whole, b, d)?;
                let buf = self.exec.eager(&step)?;
                let tokens = self.download_tokens(b)?;
                let logits = if keep_logits {
                    Some(be.download::<f32>(&buf.logits(b)?)?)
                } else {
                    None
                };
                let logprobs = self.download_logprobs(batch)?;
                Ok(StepOut {
                    tokens,
                    logits,
                    logprobs,
                })
            }
            Plan::Graph(key) => {
                // A miss captures first, on all-padding inputs: capturing runs the step
                // eagerly once, and the real step must sample (and count penalties) once.
                self.capture_key_from_padding(key, true)?;
                let read = match key.phase {
                    Phase::Decode => key.bucket,
                    Phase::Mixed => b,
                };
                self.pack(batch, &layout, read, d, true)?;
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
                let logprobs = self.download_logprobs(batch)?;
                if !self.verify_graphs {
                    return Ok(StepOut {
                        tokens,
                        logits: replayed,
                        logprobs,
                    });
                }
                // Debug check: the same step eagerly and unpadded (its samples are
                // dropped, so it counts no penalties).
                let eager_layout = self.inputs.layout(n, b);
                self.pack(batch, &eager_layout, b, d, false)?;
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
                Ok(StepOut {
                    tokens,
                    logits: Some(eager),
                    logprobs,
                })
            }
        }
    }

    fn download_tokens(&self, b: usize) -> Result<Vec<u32>> {
        let t0 = std::time::Instant::now();
        let ids = self.be.download::<i32>(&self.sampled.prefix(b)?);
        self.device_wait.set(self.device_wait.get() + t0.elapsed());
        Ok(ids?.into_iter().map(|t| t as u32).collect())
    }

    /// Each row's log-probabilities where its sampling asked for them (nothing is read
    /// back when no row did).
    fn download_logprobs(&self, batch: &[SeqStep<'_>]) -> Result<Vec<Option<TokenLogprobs>>> {
        if batch.iter().all(|s| s.sampling.logprobs.is_none()) {
            return Ok(vec![None; batch.len()]);
        }
        let b = batch.len();
        let token = self.be.download::<f32>(&self.lp.token.prefix(b)?)?;
        let ids = self.be.download::<i32>(&self.lp.top_ids.prefix(b)?)?;
        let top = self.be.download::<f32>(&self.lp.top.prefix(b)?)?;
        Ok(batch
            .iter()
            .enumerate()
            .map(|(r, s)| {
                let n = s.sampling.logprobs?.min(MAX_TOP_LOGPROBS);
                let at = r * MAX_TOP_LOGPROBS;
                let top = ids[at..at + n]
                    .iter()
                    .zip(&top[at..at + n])
                    .filter_map(|(&id, &lp)| u32::try_from(id).ok().map(|id| (id, lp)))
                    .collect();
                Some(TokenLogprobs {
                    logprob: token[r],
                    top,
                })
            })
            .collect())
    }

    /// Give sequence `seq` a penalty slot for the tokens it holds: `prompt` (flagged as
    /// prompt tokens) and `output` (counted), written to the device now, outside any
    /// step. Its next token is counted once a step samples at its end (after `prompt`
    /// and `output`), and so on for every token after. `Ok(false)` when every slot is
    /// held; an error with no slots at all, a token outside the vocabulary, or a sequence
    /// that holds one already.
    pub fn begin_penalties(&mut self, seq: SeqId, prompt: &[u32], output: &[u32]) -> Result<bool> {
        const OP: &str = "runner.begin_penalties";
        let Some(counts) = &self.pen.counts else {
            return Err(Error::invalid(
                OP,
                "penalties need a penalty slot; the runner has none (RunnerConfig::penalty_slots 0)",
            ));
        };
        if self.pen.held.contains_key(&seq) {
            return Err(Error::invalid(
                OP,
                format!("sequence {seq} already holds a penalty slot"),
            ));
        }
        let vocab = self.model.cfg.vocab_size;
        let mut row = vec![0i32; vocab];
        let tokens = prompt.iter().map(|&t| (t, true));
        for (t, in_prompt) in tokens.chain(output.iter().map(|&t| (t, false))) {
            let Some(c) = row.get_mut(t as usize) else {
                return Err(Error::invalid(
                    OP,
                    format!("sequence {seq}: token id {t} is outside the vocabulary of {vocab}"),
                ));
            };
            if in_prompt {
                *c |= PROMPT_BIT;
            } else {
                *c += 1;
            }
        }
        let Some(slot) = self.pen.free.pop() else {
            return Ok(false);
        };
        if let Err(e) = self
            .be
            .write_bytes(&counts.narrow(slot, 1)?, bytemuck::cast_slice(&row))
        {
            self.pen.free.push(slot);
            return Err(e);
        }
        self.pen.held.insert(
            seq,
            PenaltySeq {
                slot,
                len: prompt.len() + output.len(),
            },
        );
        Ok(true)
    }

    /// Free `seq`'s penalty slot, if it holds one (when it finishes, is aborted or
    /// preempted).
    pub fn end_penalties(&mut self, seq: SeqId) {
        if let Some(p) = self.pen.held.remove(&seq) {
            self.pen.free.push(p.slot);
        }
    }

    /// Penalty slots free now.
    pub fn free_penalty_slots(&self) -> usize {
        self.pen.free.len()
    }

    /// Pack the step's metadata into the host staging of `layout` (rows beyond the
    /// step's padded), and upload what the step reads (`read_seqs` sequence rows): one
    /// copy. With `penalties`, a row with penalties whose sample is kept gets its slot
    /// (and the slot's sequence advances by the token); otherwise none does.
    fn pack(
        &mut self,
        batch: &[SeqStep<'_>],
        layout: &Layout,
        read_seqs: usize,
        d: usize,
        penalties: bool,
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
            h.min_p[i] = s.sampling.min_p;
            h.seeds[i] = mix_seed(s.sampling.seed, total as u64) as i64;
            h.repetition[i] = s.sampling.repetition_penalty;
            h.frequency[i] = s.sampling.frequency_penalty;
            h.presence[i] = s.sampling.presence_penalty;
            h.num_logprobs[i] = s
                .sampling
                .logprobs
                .map_or(-1, |n| n.min(MAX_TOP_LOGPROBS) as i32);
            h.pen_slot[i] = -1;
            if penalties && s.sampling.has_penalties() {
                let p = self.pen.held.get_mut(&s.seq).ok_or_else(|| {
                    Error::invalid(
                        "runner.step",
                        format!(
                            "sequence {}: its sampling has penalties but it holds no penalty slot (Runner::begin_penalties)",
                            s.seq
                        ),
                    )
                })?;
                if total == p.len {
                    h.pen_slot[i] = p.slot as i32;
                    p.len += 1;
                }
            }
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
        self.capture_key_from_padding(key, false)
    }

    /// [`Runner::capture_key`]; `ahead`: for the step about to replay it (which then
    /// counts as the key's miss).
    fn capture_key_from_padding(&mut self, key: Key, ahead: bool) -> Result<()> {
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
        if ahead {
            self.exec.capture_ahead(self.be, key, &step)
        } else {
            self.exec.capture(self.be, key, &step)
        }
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
    /// The log-probability outputs, cut to `seqs` rows.
    lp: LogprobBuffers,
    pen_counts: Option<&'a Tensor>,
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
                min_p: &self.v.min_p,
                seeds: &self.v.seeds,
                penalties: self.pen_counts.map(|counts| Penalties {
                    counts,
                    slot: &self.v.pen_slot,
                    repetition: &self.v.repetition,
                    frequency: &self.v.frequency,
                    presence: &self.v.presence,
                }),
                logprobs: Some(SampleLogprobs {
                    num: &self.v.num_logprobs,
                    token: &self.lp.token,
                    top_ids: &self.lp.top_ids,
                    top: &self.lp.top,
                }),
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
        self.piece_ops(buf, i)?;
        // A piece is captured alone: its weight copies (offload) join before it ends.
        self.model.end_segment()
    }

    fn seam(&self, buf: &StepBuffers, i: usize) -> Result<()> {
        self.seam_ops(buf, i)?;
        self.model.end_segment()
    }
}

impl ForwardStep<'_> {
    fn piece_ops(&self, buf: &StepBuffers, i: usize) -> Result<()> {
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

    fn seam_ops(&self, buf: &StepBuffers, i: usize) -> Result<()> {
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
    v.min_p = v.min_p.prefix(seqs)?;
    v.pen_slot = v.pen_slot.prefix(seqs)?;
    v.repetition = v.repetition.prefix(seqs)?;
    v.frequency = v.frequency.prefix(seqs)?;
    v.presence = v.presence.prefix(seqs)?;
    v.num_logprobs = v.num_logprobs.prefix(seqs)?;
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
        lp: LogprobBuffers {
            token: r.lp.token.prefix(seqs)?,
            top_ids: r.lp.top_ids.prefix(seqs)?,
            top: r.lp.top.prefix(seqs)?,
        },
        pen_counts: r.pen_counts,
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
    lp: &'a LogprobBuffers,
    pen_counts: Option<&'a Tensor>,
    table_width: usize,
    block_size: usize,
}

/// What [`Runner::run`] returns: tokens, logits when asked, log-probabilities per row.
#[derive(Default)]
struct StepOut {
    tokens: Vec<u32>,
    logits: Option<Vec<f32>>,
    logprobs: Vec<Option<TokenLogprobs>>,
}

/// The request seed mixed with the index of the token being sampled: a fresh,
/// reproducible seed per token.
fn mix_seed(seed: u64, index: u64) -> u64 {
    crate::ops::mix64(seed ^ index.wrapping_mul(crate::ops::GOLDEN))
}
