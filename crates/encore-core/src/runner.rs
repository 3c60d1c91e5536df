//! The model runner: one forward step for a batch of sequences, eagerly. It owns the
//! model, the KV cache and its block manager, and the arena; it packs the step's
//! metadata on the host, uploads it, runs the forward and samples on the device.
//! In graph mode, pure decode steps pad the batch to a bucket and replay that bucket's
//! captured graph (captured on first use); everything per-step is in the input buffers.

use std::collections::HashMap;
use std::time::Instant;

use crate::backend::{Backend, Graph, Sampling};
use crate::error::{Error, Result};
use crate::graph::BucketPolicy;
use crate::kv::{BlockManager, KvCache, KvCacheConfig, SeqId, NULL_BLOCK};
use crate::memory::Arena;
use crate::model::llama::{Model, StepInputs};
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
pub struct SeqStep<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
    pub sampling: SamplingParams,
    /// Mixed into the sampling seed so every step draws fresh randomness.
    pub step: u64,
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

/// The step's metadata buffers, allocated once at the maximum shape; a step uses
/// prefixes of them.
struct StepBuffers {
    token_ids: Tensor,
    positions: Tensor,
    slot_mapping: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    cu_seqlens_q: Tensor,
    logits_indices: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    seeds: Tensor,
    sampled: Tensor,
}

impl StepBuffers {
    fn new(
        be: &dyn Backend,
        max_tokens: usize,
        max_seqs: usize,
        table_width: usize,
    ) -> Result<Self> {
        let i32s = |shape: &[usize]| be.alloc(DType::I32, shape);
        Ok(StepBuffers {
            token_ids: i32s(&[max_tokens])?,
            positions: i32s(&[max_tokens])?,
            slot_mapping: i32s(&[max_tokens])?,
            block_tables: i32s(&[max_seqs, table_width])?,
            seq_lens: i32s(&[max_seqs])?,
            cu_seqlens_q: i32s(&[max_seqs + 1])?,
            logits_indices: i32s(&[max_seqs])?,
            temperature: be.alloc(DType::F32, &[max_seqs])?,
            top_k: i32s(&[max_seqs])?,
            top_p: be.alloc(DType::F32, &[max_seqs])?,
            seeds: be.alloc(DType::I64, &[max_seqs])?,
            sampled: i32s(&[max_seqs])?,
        })
    }
}

pub struct Runner<'b> {
    be: &'b dyn Backend,
    inputs: StepBuffers,
    graph: Option<GraphState>,
    pub model: Model,
    pub kv: KvCache,
    pub blocks: BlockManager,
    arena: Arena,
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
            cfg.max_tokens_per_step,
            cfg.max_seqs,
            table_width,
            cfg.block_size,
        );
        let arena = Arena::new(be, bytes)?;
        let inputs = StepBuffers::new(
            be,
            cfg.max_tokens_per_step.max(cfg.max_seqs),
            cfg.max_seqs,
            table_width,
        )?;
        Ok(Runner {
            be,
            inputs,
            graph: None,
            model,
            kv,
            blocks,
            arena,
            cfg,
            table_width,
        })
    }

    pub fn config(&self) -> &RunnerConfig {
        &self.cfg
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
            Some(l) => self
                .be
                .download::<f32>(&l)?
                .chunks(vocab)
                .map(|r| r.to_vec())
                .collect(),
            None => Vec::new(),
        };
        Ok((tokens, rows))
    }

    fn run(
        &mut self,
        batch: &[SeqStep<'_>],
        keep_logits: bool,
    ) -> Result<(Vec<u32>, Option<Tensor>)> {
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
        // Pure decode steps within the largest bucket replay a graph of `rows` rows.
        let bucket = match &self.graph {
            Some(g) if decode_only => g.policy.bucket_for(b).filter(|&r| r <= self.cfg.max_seqs),
            _ => None,
        };
        let rows = bucket.unwrap_or(b);
        let w = self.table_width;
        let mut ids = Vec::with_capacity(n.max(rows));
        let mut pos = Vec::with_capacity(n.max(rows));
        let mut slots = Vec::with_capacity(n.max(rows));
        let mut tables = vec![NULL_BLOCK as i32; rows * w];
        let mut lens = Vec::with_capacity(rows);
        let mut cu = Vec::with_capacity(rows + 1);
        let mut last = Vec::with_capacity(rows);
        let (mut temp, mut top_k, mut top_p, mut seeds) = (
            Vec::with_capacity(rows),
            Vec::with_capacity(rows),
            Vec::with_capacity(rows),
            Vec::with_capacity(rows),
        );
        cu.push(0i32);
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
            for (j, &t) in s.tokens.iter().enumerate() {
                ids.push(t as i32);
                pos.push((start + j) as i32);
                let slot = self.blocks.slot(s.seq, start + j).ok_or_else(|| {
                    Error::invalid(
                        "runner.step",
                        format!("sequence {}: no slot for position {}", s.seq, start + j),
                    )
                })?;
                slots.push(slot);
            }
            self.blocks.fill_block_table_row(
                s.seq,
                &mut tables[i * w..(i + 1) * w],
                NULL_BLOCK as i32,
            )?;
            lens.push(total as i32);
            cu.push(ids.len() as i32);
            last.push(ids.len() as i32 - 1);
            temp.push(s.sampling.temperature);
            top_k.push(s.sampling.top_k);
            top_p.push(s.sampling.top_p);
            seeds.push(mix_seed(mix_seed(s.sampling.seed, s.seq.0), s.step) as i64);
        }
        // Padding rows are empty sequences: seq_len 0, slot -1 (no KV write), a block-table
        // row of the null block, greedy sampling.
        for r in b..rows {
            ids.push(0);
            pos.push(0);
            slots.push(-1);
            lens.push(0);
            cu.push(r as i32 + 1);
            last.push(r as i32);
            temp.push(0.0);
            top_k.push(0);
            top_p.push(1.0);
            seeds.push(0);
        }
        let (n_rows, b_rows) = if bucket.is_some() {
            (rows, rows)
        } else {
            (n, b)
        };
        let be = self.be;
        let m = &self.inputs;
        // Write each input's prefix into its max-shape buffer (no per-step allocation).
        let put = |t: &Tensor, data: &[i32]| be.write(&t.prefix(data.len())?, data);
        put(&m.token_ids, &ids)?;
        put(&m.positions, &pos)?;
        put(&m.slot_mapping, &slots)?;
        be.write(&m.block_tables.prefix(tables.len() / w)?, &tables)?;
        put(&m.seq_lens, &lens)?;
        put(&m.cu_seqlens_q, &cu)?;
        put(&m.logits_indices, &last)?;
        put(&m.top_k, &top_k)?;
        be.write(&m.temperature.prefix(b_rows)?, &temp)?;
        be.write(&m.top_p.prefix(b_rows)?, &top_p)?;
        be.write(&m.seeds.prefix(b_rows)?, &seeds)?;

        let logits = match bucket {
            None => self.forward_and_sample(n_rows, b_rows, decode_only)?,
            Some(r) => {
                if !self
                    .graph
                    .as_ref()
                    .is_some_and(|g| g.graphs.contains_key(&r))
                {
                    self.capture(r)?;
                } else if let Some(g) = self.graph.as_mut() {
                    g.stats.hits += 1;
                }
                let g = self.graph.as_mut().expect("graph mode");
                g.stats.padded_rows += r - b;
                g.stats.rows += r;
                let step = &g.graphs[&r];
                step.graph.replay()?;
                step.logits.clone()
            }
        };
        let tokens = be
            .download::<i32>(&self.inputs.sampled.prefix(b)?)?
            .into_iter()
            .map(|t| t as u32)
            .collect();
        Ok((tokens, keep_logits.then_some(logits)))
    }

    /// Forward and sample over the first `n` token rows and `b` sequence rows of the input
    /// buffers; sampled ids land in `sampled[..b]`. Returns the logits (arena view).
    fn forward_and_sample(&mut self, n: usize, b: usize, decode_only: bool) -> Result<Tensor> {
        let be = self.be;
        let m = &self.inputs;
        let token_ids = m.token_ids.prefix(n)?;
        let positions = m.positions.prefix(n)?;
        let slot_mapping = m.slot_mapping.prefix(n)?;
        let block_tables = m.block_tables.prefix(b)?;
        let seq_lens = m.seq_lens.prefix(b)?;
        let cu = m.cu_seqlens_q.prefix(b + 1)?;
        let logits_indices = m.logits_indices.prefix(b)?;
        self.arena.reset();
        let logits = self.model.forward(
            be,
            &mut self.arena,
            &self.kv,
            &StepInputs {
                token_ids: &token_ids,
                positions: &positions,
                slot_mapping: &slot_mapping,
                block_tables: &block_tables,
                seq_lens: &seq_lens,
                cu_seqlens_q: if decode_only { None } else { Some(&cu) },
                logits_indices: &logits_indices,
            },
        )?;
        be.sample(
            &logits,
            &Sampling {
                temperature: &m.temperature.prefix(b)?,
                top_k: &m.top_k.prefix(b)?,
                top_p: &m.top_p.prefix(b)?,
                seeds: &m.seeds.prefix(b)?,
            },
            &m.sampled.prefix(b)?,
        )?;
        Ok(logits)
    }

    /// Capture the decode graph of bucket `rows` over the inputs already written: one
    /// eager run first (it plans GEMMs and loads any lazily loaded library kernels outside
    /// the capture; padding rows write no KV, real rows write the same values the replay
    /// writes again), then the capture.
    fn capture(&mut self, rows: usize) -> Result<()> {
        self.forward_and_sample(rows, rows, true)?;
        let t = Instant::now();
        self.be.begin_capture()?;
        let captured = self.forward_and_sample(rows, rows, true);
        let graph = self.be.end_capture();
        let logits = captured?;
        let graph = graph?;
        let g = self.graph.as_mut().expect("graph mode");
        g.stats.misses += 1;
        g.stats.captures += 1;
        g.stats.capture_secs += t.elapsed().as_secs_f64();
        g.graphs.insert(rows, CapturedStep { graph, logits });
        Ok(())
    }

    /// Turn graph mode on (decode steps replay a graph per bucket) or off (`None`: eager).
    /// Turning it off or changing the policy drops the captured graphs.
    pub fn set_graph_mode(&mut self, policy: Option<BucketPolicy>) {
        self.graph = policy.map(|policy| GraphState {
            policy,
            graphs: HashMap::new(),
            stats: GraphStats::default(),
        });
    }

    /// Capture every bucket now, largest first, with all rows padding.
    pub fn capture_all(&mut self, progress: bool) -> Result<()> {
        let Some(g) = &self.graph else {
            return Ok(());
        };
        let mut buckets: Vec<usize> = g
            .policy
            .buckets()
            .into_iter()
            .filter(|&r| r <= self.cfg.max_seqs)
            .collect();
        buckets.reverse();
        let pb = if progress {
            indicatif::ProgressBar::new(buckets.len() as u64)
        } else {
            indicatif::ProgressBar::hidden()
        };
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "capturing decode graphs {bar:30} {pos}/{len} {elapsed}",
            )
            .expect("valid template"),
        );
        let w = self.table_width;
        for rows in buckets {
            if self
                .graph
                .as_ref()
                .is_some_and(|g| g.graphs.contains_key(&rows))
            {
                pb.inc(1);
                continue;
            }
            let be = self.be;
            let m = &self.inputs;
            let pad = |t: &Tensor, v: i32, len: usize| be.write(&t.prefix(len)?, &vec![v; len]);
            pad(&m.token_ids, 0, rows)?;
            pad(&m.positions, 0, rows)?;
            pad(&m.slot_mapping, -1, rows)?;
            be.write(
                &m.block_tables.prefix(rows)?,
                &vec![NULL_BLOCK as i32; rows * w],
            )?;
            pad(&m.seq_lens, 0, rows)?;
            be.write(
                &m.logits_indices.prefix(rows)?,
                &(0..rows as i32).collect::<Vec<_>>(),
            )?;
            pad(&m.top_k, 0, rows)?;
            be.write(&m.temperature.prefix(rows)?, &vec![0f32; rows])?;
            be.write(&m.top_p.prefix(rows)?, &vec![1f32; rows])?;
            be.write(&m.seeds.prefix(rows)?, &vec![0i64; rows])?;
            self.capture(rows)?;
            pb.inc(1);
        }
        pb.finish_and_clear();
        Ok(())
    }

    /// Graph statistics, when graph mode is on.
    pub fn graph_stats(&self) -> Option<&GraphStats> {
        self.graph.as_ref().map(|g| &g.stats)
    }
}

/// What graph mode did so far.
#[derive(Clone, Debug, Default)]
pub struct GraphStats {
    /// Steps that replayed an existing graph.
    pub hits: usize,
    /// Steps that had to capture first.
    pub misses: usize,
    pub captures: usize,
    pub capture_secs: f64,
    /// Rows run in graphs, and how many of them were padding.
    pub rows: usize,
    pub padded_rows: usize,
}

struct CapturedStep {
    graph: Box<dyn Graph>,
    /// Where the graph writes its logits (an arena view, valid after each replay).
    logits: Tensor,
}

struct GraphState {
    policy: BucketPolicy,
    graphs: HashMap<usize, CapturedStep>,
    stats: GraphStats,
}

/// splitmix64 of the request seed and the step: a fresh, reproducible seed per step.
fn mix_seed(seed: u64, step: u64) -> u64 {
    let mut z = seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
