//! The model runner: one forward step for a batch of sequences, eagerly. It owns the
//! model, the KV cache and its block manager, and the arena; it packs the step's
//! metadata on the host, uploads it, runs the forward and samples on the device.
//! (Issue #4 adds graph capture/replay here, with persistent input buffers.)

use crate::backend::{Backend, Sampling};
use crate::error::{Error, Result};
use crate::kv::{BlockManager, KvCache, KvCacheConfig, SeqId};
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
        let inputs = StepBuffers::new(be, cfg.max_tokens_per_step, cfg.max_seqs, table_width)?;
        Ok(Runner {
            be,
            inputs,
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
        let mut ids = Vec::with_capacity(n);
        let mut pos = Vec::with_capacity(n);
        let mut slots = Vec::with_capacity(n);
        let mut tables = vec![0i32; b * self.table_width];
        let mut lens = Vec::with_capacity(b);
        let mut cu = Vec::with_capacity(b + 1);
        let mut last = Vec::with_capacity(b);
        let (mut temp, mut top_k, mut top_p, mut seeds) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
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
                &mut tables[i * self.table_width..(i + 1) * self.table_width],
                0,
            )?;
            lens.push(total as i32);
            cu.push(ids.len() as i32);
            last.push(ids.len() as i32 - 1);
            temp.push(s.sampling.temperature);
            top_k.push(s.sampling.top_k);
            top_p.push(s.sampling.top_p);
            seeds.push(mix_seed(mix_seed(s.sampling.seed, s.seq.0), s.step) as i64);
        }
        let be = self.be;
        let m = &self.inputs;
        // Write each input's prefix into its max-shape buffer (no per-step allocation).
        let put = |t: &Tensor, len: usize, data: &[i32]| -> Result<Tensor> {
            let v = t.prefix(len)?;
            be.write(&v, data)?;
            Ok(v)
        };
        let t_ids = put(&m.token_ids, n, &ids)?;
        let t_pos = put(&m.positions, n, &pos)?;
        let t_slots = put(&m.slot_mapping, n, &slots)?;
        let t_tables = put(&m.block_tables, b, &tables)?;
        let t_lens = put(&m.seq_lens, b, &lens)?;
        let t_cu = put(&m.cu_seqlens_q, b + 1, &cu)?;
        let t_last = put(&m.logits_indices, b, &last)?;
        let t_topk = put(&m.top_k, b, &top_k)?;
        let t_temp = m.temperature.prefix(b)?;
        be.write(&t_temp, &temp)?;
        let t_topp = m.top_p.prefix(b)?;
        be.write(&t_topp, &top_p)?;
        let t_seeds = m.seeds.prefix(b)?;
        be.write(&t_seeds, &seeds)?;
        let out = m.sampled.prefix(b)?;
        self.arena.reset();
        let logits = self.model.forward(
            be,
            &mut self.arena,
            &self.kv,
            &StepInputs {
                token_ids: &t_ids,
                positions: &t_pos,
                slot_mapping: &t_slots,
                block_tables: &t_tables,
                seq_lens: &t_lens,
                cu_seqlens_q: if decode_only { None } else { Some(&t_cu) },
                logits_indices: &t_last,
            },
        )?;
        be.sample(
            &logits,
            &Sampling {
                temperature: &t_temp,
                top_k: &t_topk,
                top_p: &t_topp,
                seeds: &t_seeds,
            },
            &out,
        )?;
        let tokens = be
            .download::<i32>(&out)?
            .into_iter()
            .map(|t| t as u32)
            .collect();
        Ok((tokens, keep_logits.then_some(logits)))
    }
}

/// splitmix64 of the request seed and the step: a fresh, reproducible seed per step.
fn mix_seed(seed: u64, step: u64) -> u64 {
    let mut z = seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
