//! The model runner: one forward step for a batch of sequences, eagerly. It owns the
//! model, the KV cache and its block manager, and the arena; it packs the step's
//! metadata on the host, uploads it, runs the forward and samples on the device.
//! In graph mode, pure decode steps pad the batch to a bucket and replay that bucket's
//! captured graph (captured on first use); everything per-step is in the input buffers.

use std::collections::HashMap;
use std::time::Instant;

use crate::backend::{Backend, Graph, Sampling};
use crate::error::{Error, Result};
use crate::graph::{BucketPolicy, Field, InputTable, Layout, Rows, Width};
use crate::kv::{BlockManager, KvCache, KvCacheConfig, SeqId, NULL_BLOCK};
use crate::memory::{Arena, ArenaStats, CaptureMemory, GraphMemory, MemoryNeed};
use crate::model::config::ModelConfig;
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
        let token_rows = self.max_tokens_per_step.max(self.max_seqs);
        let inputs = STEP_INPUTS
            .iter()
            .map(|f| {
                let rows = match f.rows {
                    Rows::Tokens => token_rows,
                    Rows::Seqs => self.max_seqs,
                    Rows::SeqsPlusOne => self.max_seqs.saturating_add(1),
                };
                let width = match f.width {
                    Width::One => 1,
                    Width::Table => table_width,
                };
                rows.saturating_mul(width).saturating_mul(f.dtype.size())
            })
            .fold(0usize, usize::saturating_add)
            .saturating_mul(2);
        MemoryNeed {
            weights: model.weight_bytes(dtype),
            kv_cache: self.num_blocks.saturating_mul(kv_cfg.bytes_per_block()),
            kv_blocks: self.num_blocks,
            activations: arena.saturating_add(inputs),
        }
    }
}

/// Every per-step input, declared once (see `graph::inputs`).
const STEP_INPUTS: &[Field] = &[
    Field {
        name: "token_ids",
        dtype: DType::I32,
        rows: Rows::Tokens,
        width: Width::One,
    },
    Field {
        name: "positions",
        dtype: DType::I32,
        rows: Rows::Tokens,
        width: Width::One,
    },
    Field {
        name: "slot_mapping",
        dtype: DType::I32,
        rows: Rows::Tokens,
        width: Width::One,
    },
    Field {
        name: "block_tables",
        dtype: DType::I32,
        rows: Rows::Seqs,
        width: Width::Table,
    },
    Field {
        name: "seq_lens",
        dtype: DType::I32,
        rows: Rows::Seqs,
        width: Width::One,
    },
    Field {
        name: "cu_seqlens_q",
        dtype: DType::I32,
        rows: Rows::SeqsPlusOne,
        width: Width::One,
    },
    Field {
        name: "logits_indices",
        dtype: DType::I32,
        rows: Rows::Seqs,
        width: Width::One,
    },
    Field {
        name: "temperature",
        dtype: DType::F32,
        rows: Rows::Seqs,
        width: Width::One,
    },
    Field {
        name: "top_k",
        dtype: DType::I32,
        rows: Rows::Seqs,
        width: Width::One,
    },
    Field {
        name: "top_p",
        dtype: DType::F32,
        rows: Rows::Seqs,
        width: Width::One,
    },
    Field {
        name: "seeds",
        dtype: DType::I64,
        rows: Rows::Seqs,
        width: Width::One,
    },
];

/// One step's metadata on the host, `rows` sequence rows (padding included).
#[derive(Default)]
struct HostStep {
    ids: Vec<i32>,
    pos: Vec<i32>,
    slots: Vec<i32>,
    tables: Vec<i32>,
    lens: Vec<i32>,
    cu: Vec<i32>,
    last: Vec<i32>,
    temp: Vec<f32>,
    top_k: Vec<i32>,
    top_p: Vec<f32>,
    seeds: Vec<i64>,
}

pub struct Runner<'b> {
    be: &'b dyn Backend,
    inputs: InputTable,
    /// Sampled token ids, `[max_seqs]`.
    sampled: Tensor,
    graph: Option<GraphState>,
    verify_graphs: bool,
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
        let arena = Arena::for_graphs(be, bytes, GraphMemory::default())?;
        let inputs = InputTable::new(
            be,
            STEP_INPUTS,
            cfg.max_tokens_per_step.max(cfg.max_seqs),
            cfg.max_seqs,
            table_width,
        )?;
        let sampled = be.alloc(DType::I32, &[cfg.max_seqs])?;
        Ok(Runner {
            be,
            inputs,
            sampled,
            graph: None,
            verify_graphs: false,
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

    /// Choose how captured graphs get their intermediate memory (default
    /// [`GraphMemory::Arena`]). Drops every captured graph and the current arena, and
    /// reserves a new one of the same size.
    pub fn set_graph_memory(&mut self, strategy: GraphMemory) -> Result<()> {
        if let Some(g) = self.graph.as_mut() {
            g.graphs.clear();
        }
        let bytes = self.arena.capacity();
        // Release the old arena before reserving the new one.
        self.arena = Arena::for_graphs(self.be, 0, strategy)?;
        self.arena = Arena::for_graphs(self.be, bytes, strategy)?;
        Ok(())
    }

    /// Physical and virtual bytes of the graph memory (the arena's pool, including what
    /// only captured graphs hold), and the time spent mapping.
    pub fn graph_memory_stats(&self) -> ArenaStats {
        self.arena.stats()
    }

    /// Each captured bucket with its capture's arena need in bytes, ascending by bucket.
    pub fn captured_buckets(&self) -> Vec<(usize, usize)> {
        let mut v: Vec<(usize, usize)> = self
            .graph
            .iter()
            .flat_map(|g| g.graphs.iter().map(|(&r, s)| (r, s.memory.bytes)))
            .collect();
        v.sort_unstable();
        v
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
        let mut h = HostStep {
            tables: vec![NULL_BLOCK as i32; rows * w],
            cu: vec![0],
            ..HostStep::default()
        };
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
                h.ids.push(t as i32);
                h.pos.push((start + j) as i32);
                let slot = self.blocks.slot(s.seq, start + j).ok_or_else(|| {
                    Error::invalid(
                        "runner.step",
                        format!("sequence {}: no slot for position {}", s.seq, start + j),
                    )
                })?;
                h.slots.push(slot);
            }
            self.blocks.fill_block_table_row(
                s.seq,
                &mut h.tables[i * w..(i + 1) * w],
                NULL_BLOCK as i32,
            )?;
            h.lens.push(total as i32);
            h.cu.push(h.ids.len() as i32);
            h.last.push(h.ids.len() as i32 - 1);
            h.temp.push(s.sampling.temperature);
            h.top_k.push(s.sampling.top_k);
            h.top_p.push(s.sampling.top_p);
            h.seeds
                .push(mix_seed(mix_seed(s.sampling.seed, s.seq.0), s.step) as i64);
        }
        h.pad_to(rows);
        let layout = if bucket.is_some() {
            self.inputs.layout(rows, rows)
        } else {
            self.inputs.layout(n, b)
        };
        self.write_inputs(&layout, &h)?;
        let be = self.be;

        let download_tokens = |t: &Tensor| -> Result<Vec<u32>> {
            Ok(be
                .download::<i32>(&t.prefix(b)?)?
                .into_iter()
                .map(|t| t as u32)
                .collect())
        };
        let (tokens, logits) = match bucket {
            None => {
                let logits = self.forward_and_sample(&layout, decode_only)?;
                (download_tokens(&self.sampled)?, logits)
            }
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
                let logits = step.logits.clone();
                let tokens = download_tokens(&self.sampled)?;
                if self.verify_graphs {
                    let replayed = be.download::<f32>(&logits.prefix(b)?)?;
                    h.truncate(b, w);
                    let eager_layout = self.inputs.layout(b, b);
                    self.write_inputs(&eager_layout, &h)?;
                    let eager = self.forward_and_sample(&eager_layout, true)?;
                    let reference = be.download::<f32>(&eager)?;
                    self.check_replay(r, &replayed, &reference)?;
                    (tokens, eager)
                } else {
                    (tokens, logits)
                }
            }
        };
        Ok((tokens, keep_logits.then_some(logits)))
    }

    /// Pack `h` into the input table's staging for `layout` and upload it: one copy.
    fn write_inputs(&mut self, layout: &Layout, h: &HostStep) -> Result<()> {
        let t = &mut self.inputs;
        t.host_mut::<i32>(layout, "token_ids")?
            .copy_from_slice(&h.ids);
        t.host_mut::<i32>(layout, "positions")?
            .copy_from_slice(&h.pos);
        t.host_mut::<i32>(layout, "slot_mapping")?
            .copy_from_slice(&h.slots);
        t.host_mut::<i32>(layout, "block_tables")?
            .copy_from_slice(&h.tables);
        t.host_mut::<i32>(layout, "seq_lens")?
            .copy_from_slice(&h.lens);
        t.host_mut::<i32>(layout, "cu_seqlens_q")?
            .copy_from_slice(&h.cu);
        t.host_mut::<i32>(layout, "logits_indices")?
            .copy_from_slice(&h.last);
        t.host_mut::<f32>(layout, "temperature")?
            .copy_from_slice(&h.temp);
        t.host_mut::<i32>(layout, "top_k")?
            .copy_from_slice(&h.top_k);
        t.host_mut::<f32>(layout, "top_p")?
            .copy_from_slice(&h.top_p);
        t.host_mut::<i64>(layout, "seeds")?
            .copy_from_slice(&h.seeds);
        t.upload(self.be, layout)
    }

    /// Forward and sample over the inputs of `layout` in a fresh arena epoch (inside a
    /// capture epoch the reset does nothing, so a capture's pieces never overlap); sampled
    /// ids land in `sampled[..seqs]`. Returns the logits (arena view).
    fn forward_and_sample(&mut self, layout: &Layout, decode_only: bool) -> Result<Tensor> {
        self.arena.reset();
        let be = self.be;
        let v = |name: &str| self.inputs.view(layout, name);
        let (token_ids, positions, slot_mapping) =
            (v("token_ids")?, v("positions")?, v("slot_mapping")?);
        let (block_tables, seq_lens, cu) = (v("block_tables")?, v("seq_lens")?, v("cu_seqlens_q")?);
        let logits_indices = v("logits_indices")?;
        let (temperature, top_k, top_p, seeds) =
            (v("temperature")?, v("top_k")?, v("top_p")?, v("seeds")?);
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
                temperature: &temperature,
                top_k: &top_k,
                top_p: &top_p,
                seeds: &seeds,
            },
            &self.sampled.prefix(layout.seqs)?,
        )?;
        Ok(logits)
    }

    /// Capture the decode graph of bucket `rows` over the inputs already written: one
    /// eager run first (it plans GEMMs and loads any lazily loaded library kernels outside
    /// the capture; padding rows write no KV, real rows write the same values the replay
    /// writes again), then the capture. The warm-up also maps the capture's need (same
    /// shapes, same allocation order); the capture epoch maps it in its own range before
    /// the backend starts capturing (see `memory::arena` on mapping timing).
    fn capture(&mut self, rows: usize) -> Result<()> {
        let layout = self.inputs.layout(rows, rows);
        self.forward_and_sample(&layout, true)?;
        let expect = self.arena.used();
        let t = Instant::now();
        self.arena.begin_capture(expect)?;
        if let Err(e) = self.be.begin_capture() {
            let _ = self.arena.end_capture();
            return Err(e);
        }
        let captured = self.forward_and_sample(&layout, true);
        let graph = self.be.end_capture();
        let memory = self.arena.end_capture();
        let logits = captured?;
        let graph = graph?;
        let memory = memory?;
        let g = self.graph.as_mut().expect("graph mode");
        g.stats.misses += 1;
        g.stats.captures += 1;
        g.stats.capture_secs += t.elapsed().as_secs_f64();
        g.graphs.insert(
            rows,
            CapturedStep {
                graph,
                logits,
                memory,
            },
        );
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
        for rows in buckets {
            self.capture_bucket(rows)?;
            pb.inc(1);
        }
        pb.finish_and_clear();
        Ok(())
    }

    /// Capture the decode graph of bucket `rows` now (all rows padding), unless it is
    /// captured already. `rows` must be one of the policy's buckets, at most `max_seqs`.
    pub fn capture_bucket(&mut self, rows: usize) -> Result<()> {
        let Some(g) = &self.graph else {
            return Err(Error::invalid(
                "capture_bucket",
                "graph mode is off (set_graph_mode)",
            ));
        };
        if !g.policy.buckets().contains(&rows) || rows > self.cfg.max_seqs {
            return Err(Error::invalid(
                "capture_bucket",
                format!(
                    "{rows} is not a bucket of the policy (at most max_seqs {})",
                    self.cfg.max_seqs
                ),
            ));
        }
        if g.graphs.contains_key(&rows) {
            return Ok(());
        }
        let w = self.table_width;
        let mut h = HostStep {
            cu: vec![0],
            ..HostStep::default()
        };
        h.pad_to(rows);
        h.tables = vec![NULL_BLOCK as i32; rows * w];
        let layout = self.inputs.layout(rows, rows);
        self.write_inputs(&layout, &h)?;
        self.capture(rows)
    }

    /// Debug check: after every graph replay, run the same step eagerly (unpadded) and
    /// fail if any row's logits differ by more than the dtype's tolerance (normalised
    /// error; f32 1e-4, bf16/f16 3e-2). The tokens returned are the replay's, the logits
    /// the eager run's. Costs an extra eager step per replay.
    pub fn set_verify_graphs(&mut self, on: bool) {
        self.verify_graphs = on;
    }

    fn check_replay(&mut self, bucket: usize, replayed: &[f32], reference: &[f32]) -> Result<()> {
        let vocab = self.model.cfg.vocab_size;
        let tol = if self.model.weights.dtype == DType::F32 {
            1e-4
        } else {
            3e-2
        };
        let mut worst = 0f64;
        for (row, (a, r)) in replayed
            .chunks(vocab)
            .zip(reference.chunks(vocab))
            .enumerate()
        {
            let num: f64 = a.iter().zip(r).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
            let den: f64 = r
                .iter()
                .map(|y| (*y as f64).powi(2))
                .sum::<f64>()
                .max(f64::MIN_POSITIVE);
            let e = (num / den).sqrt();
            if e.is_nan() || e > tol {
                return Err(Error::invalid(
                    "verify-graphs",
                    format!("bucket {bucket}, row {row}: replayed logits differ from eager by {e:.3e} (tolerance {tol:.0e})"),
                ));
            }
            worst = worst.max(e);
        }
        if let Some(g) = self.graph.as_mut() {
            g.stats.verified += 1;
            g.stats.max_verify_error = g.stats.max_verify_error.max(worst);
        }
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
    /// Replays checked against eager (`set_verify_graphs`), and the largest error seen.
    pub verified: usize,
    pub max_verify_error: f64,
}

/// Fields drop in order: the graph goes before the memory it points into.
struct CapturedStep {
    graph: Box<dyn Graph>,
    /// Where the graph writes its logits (an arena view, valid after each replay).
    logits: Tensor,
    /// The graph's intermediates stay mapped while this lives.
    memory: CaptureMemory,
}

struct GraphState {
    policy: BucketPolicy,
    graphs: HashMap<usize, CapturedStep>,
    stats: GraphStats,
}

impl HostStep {
    /// Keep the first `seqs` rows (one token each: decode), dropping padding.
    fn truncate(&mut self, seqs: usize, table_width: usize) {
        self.ids.truncate(seqs);
        self.pos.truncate(seqs);
        self.slots.truncate(seqs);
        self.tables.truncate(seqs * table_width);
        self.lens.truncate(seqs);
        self.cu.truncate(seqs + 1);
        self.last.truncate(seqs);
        self.temp.truncate(seqs);
        self.top_k.truncate(seqs);
        self.top_p.truncate(seqs);
        self.seeds.truncate(seqs);
    }

    /// Pad to `rows` sequence rows of one token each. Padding rows are empty sequences:
    /// seq_len 0, slot -1 (no KV write), the null block in the table (already filled by
    /// the caller), greedy sampling.
    fn pad_to(&mut self, rows: usize) {
        for r in self.lens.len()..rows {
            self.ids.push(0);
            self.pos.push(0);
            self.slots.push(-1);
            self.lens.push(0);
            self.cu.push(self.ids.len() as i32);
            self.last.push(r as i32);
            self.temp.push(0.0);
            self.top_k.push(0);
            self.top_p.push(1.0);
            self.seeds.push(0);
        }
    }
}

/// The request seed mixed with the step: a fresh, reproducible seed per step.
fn mix_seed(seed: u64, step: u64) -> u64 {
    crate::ops::mix64(seed ^ step.wrapping_mul(crate::ops::GOLDEN))
}
