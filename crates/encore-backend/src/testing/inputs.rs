//! Seeded random inputs for every op: realistic values (normal-ish activations, small
//! weights) plus the index data the semantics have rules for (out-of-range ids, padding
//! sequences, slot -1, lengths that cross block boundaries, ties in logits).
//!
//! Everything is host data: f32 for floats (quantise with [`quantize`] to see what a
//! tensor of a narrower dtype holds), i32/i64 for indices.

use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::ops::{Llama3Scaling, RopeConfig, RopeScaling};
use crate::quant::QuantFormat;
use crate::tensor::DType;

/// The generator every input comes from.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// `n` samples of a normal distribution with mean 0 (Box–Muller).
pub fn normal(rng: &mut StdRng, n: usize, std: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u1: f64 = 1.0 - rng.random::<f64>();
            let u2: f64 = rng.random();
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32 * std
        })
        .collect()
}

/// The values a tensor of float dtype `dtype` holds after uploading `data`.
pub fn quantize(dtype: DType, data: &[f32]) -> Vec<f32> {
    match dtype {
        DType::BF16 => data.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
        DType::F16 => data.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
        _ => data.to_vec(),
    }
}

/// `embedding`: ids include -1 and `first + vocab` (both write zero rows) when `n >= 4`;
/// with `first > 0` (a vocabulary shard), ids are drawn from `0..first + vocab + first`, so
/// ids below and above the shard occur too.
pub struct EmbeddingInputs {
    pub ids: Vec<i32>,
    pub table: Vec<f32>,
    pub vocab: usize,
    pub hidden: usize,
    pub first: usize,
}

impl EmbeddingInputs {
    pub fn random(rng: &mut StdRng, n: usize, vocab: usize, hidden: usize, first: usize) -> Self {
        let mut ids: Vec<i32> = (0..n)
            .map(|_| rng.random_range(0..vocab + 2 * first) as i32)
            .collect();
        if n >= 4 {
            ids[1] = -1;
            ids[n - 2] = (first + vocab) as i32;
        }
        EmbeddingInputs {
            first,
            ids,
            table: normal(rng, vocab * hidden, 1.0),
            vocab,
            hidden,
        }
    }
}

/// `rms_norm` (the residual is always generated; cases choose whether to pass it).
pub struct RmsNormInputs {
    pub x: Vec<f32>,
    pub residual: Vec<f32>,
    pub weight: Vec<f32>,
    pub rows: usize,
    pub dim: usize,
    pub eps: f32,
}

impl RmsNormInputs {
    pub fn random(rng: &mut StdRng, rows: usize, dim: usize) -> Self {
        let weight = normal(rng, dim, 0.2).iter().map(|w| 1.0 + w).collect();
        RmsNormInputs {
            x: normal(rng, rows * dim, 1.0),
            residual: normal(rng, rows * dim, 3.0),
            weight,
            rows,
            dim,
            eps: 1e-5,
        }
    }
}

/// The rotary part of `qkv_rope_write`'s inputs: positions include -1 and `max_positions`
/// (heads left unrotated) when `n >= 4`.
pub struct RopeInputs {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub positions: Vec<i32>,
    pub cos_sin: Vec<f32>,
    pub n: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rot: usize,
    pub max_positions: usize,
}

impl RopeInputs {
    #[allow(clippy::too_many_arguments)]
    pub fn random(
        rng: &mut StdRng,
        n: usize,
        num_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
        rot: usize,
        max_positions: usize,
        llama3: bool,
    ) -> Self {
        let config = RopeConfig {
            rot_dim: rot,
            theta: 500_000.0,
            scaling: llama3.then_some(RopeScaling::Llama3(Llama3Scaling {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 64,
            })),
        };
        let mut positions: Vec<i32> = (0..n)
            .map(|_| rng.random_range(0..max_positions) as i32)
            .collect();
        if n >= 4 {
            positions[0] = -1;
            positions[n - 1] = max_positions as i32;
        }
        RopeInputs {
            q: normal(rng, n * num_heads * head_dim, 1.0),
            k: normal(rng, n * num_kv_heads * head_dim, 1.0),
            positions,
            cos_sin: config.cos_sin_table(max_positions),
            n,
            num_heads,
            num_kv_heads,
            head_dim,
            rot,
            max_positions,
        }
    }
}

/// `silu_mul`.
pub struct SiluMulInputs {
    pub gate_up: Vec<f32>,
    pub n: usize,
    pub inter: usize,
    /// The gated activation (`act_mul`; SiLU is `silu_mul`).
    pub act: crate::args::Activation,
}

impl SiluMulInputs {
    pub fn random(rng: &mut StdRng, n: usize, inter: usize) -> Self {
        SiluMulInputs {
            gate_up: normal(rng, n * 2 * inter, 2.0),
            n,
            inter,
            act: crate::args::Activation::Silu,
        }
    }
}

/// `matmul`: activations ~ N(0, 1), weights ~ N(0, 1/k) so outputs stay O(1).
pub struct MatmulInputs {
    pub x: Vec<f32>,
    pub w: Vec<f32>,
    pub bias: Option<Vec<f32>>,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// `w` is stored quantized to this format (its decoded values are the weights).
    pub w_format: Option<QuantFormat>,
}

impl MatmulInputs {
    pub fn random(rng: &mut StdRng, m: usize, k: usize, n: usize, bias: bool) -> Self {
        MatmulInputs {
            x: normal(rng, m * k, 1.0),
            w: normal(rng, n * k, 1.0 / (k.max(1) as f32).sqrt()),
            bias: bias.then(|| normal(rng, n, 0.5)),
            m,
            n,
            k,
            w_format: None,
        }
    }

    /// [`Self::random`] with `w` quantized to `fmt` (`k` a whole number of its blocks).
    pub fn quantized(
        rng: &mut StdRng,
        m: usize,
        k: usize,
        n: usize,
        bias: bool,
        fmt: QuantFormat,
    ) -> Self {
        MatmulInputs {
            w_format: Some(fmt),
            ..Self::random(rng, m, k, n, bias)
        }
    }

    /// The device rows of the quantized `w` ([`crate::quant`]'s layout).
    pub fn w_bytes(&self, fmt: QuantFormat) -> Vec<u8> {
        let rb = fmt.row_bytes(self.k).expect("k is whole blocks");
        let mut out = vec![0u8; self.n * rb];
        crate::quant::quantize_rows(fmt, &self.w, self.k, &mut out);
        out
    }

    /// The weights as the reference sees them: `w` rounded to `dtype`, or the decoded
    /// values of the quantized `w`.
    pub fn w_values(&self, dtype: DType) -> Vec<f64> {
        match self.w_format {
            None => quantize(dtype, &self.w)
                .into_iter()
                .map(f64::from)
                .collect(),
            Some(fmt) => {
                let bytes = self.w_bytes(fmt);
                let rb = bytes.len() / self.n.max(1);
                let mut row = vec![0f32; self.k];
                let mut out = Vec::with_capacity(self.n * self.k);
                for r in 0..self.n {
                    crate::quant::dequantize_row(fmt, &bytes[r * rb..(r + 1) * rb], &mut row);
                    out.extend(row.iter().map(|&v| v as f64));
                }
                out
            }
        }
    }
}

/// The cache part of `qkv_rope_write`'s inputs: distinct valid slots, plus -1 and slots at
/// and far beyond the cache end (all skipped) when `n >= 4`. Caches start with random
/// contents.
pub struct KvWriteInputs {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub k_cache: Vec<f32>,
    pub v_cache: Vec<f32>,
    pub slot_mapping: Vec<i32>,
    pub n: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    /// The caches are FP8 with these scales (`None`: of the case's dtype).
    pub kv8: Option<crate::args::KvScale>,
}

impl KvWriteInputs {
    pub fn random(
        rng: &mut StdRng,
        n: usize,
        num_kv_heads: usize,
        head_dim: usize,
        num_blocks: usize,
        block_size: usize,
    ) -> Self {
        let slots = num_blocks * block_size;
        let mut all: Vec<i32> = (0..slots as i32).collect();
        all.shuffle(rng);
        let mut slot_mapping: Vec<i32> = all.into_iter().cycle().take(n).collect();
        if n >= 4 {
            slot_mapping[0] = -1;
            slot_mapping[2] = slots as i32;
            slot_mapping[n - 1] = i32::MAX;
        }
        let row = num_kv_heads * head_dim;
        KvWriteInputs {
            k: normal(rng, n * row, 1.0),
            v: normal(rng, n * row, 1.0),
            k_cache: normal(rng, slots * row, 1.0),
            v_cache: normal(rng, slots * row, 1.0),
            slot_mapping,
            n,
            num_kv_heads,
            head_dim,
            num_blocks,
            block_size,
            kv8: None,
        }
    }
}

/// The launch shape of an attention case.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub num_seqs: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub table_width: usize,
    /// Several query rows per sequence (`cu_seqlens_q`) instead of one.
    pub prefill: bool,
    /// With `prefill`: the most query rows a sequence takes (6 in most cases; more to
    /// cross the CPU kernel's query tiles and key chunks).
    pub max_q_len: usize,
    /// Sliding window of the launch.
    pub window: Option<usize>,
    /// Logit soft-capping of the launch (Gemma 2).
    pub softcap: Option<f32>,
    /// Per-head attention sinks (gpt-oss), drawn N(0, 2) after everything else.
    pub sinks: bool,
}

/// `attention` over a random paged cache.
///
/// Sequence lengths include 0 (padding), 1, lengths just past a block boundary, the full
/// table capacity and one beyond it (clamped); block tables hold distinct block ids with
/// -1 or garbage past each sequence's blocks, and one sequence has an out-of-range block
/// id inside its context (that block contributes nothing). Prefill takes 1 to
/// `max_q_len` query rows per sequence, plus: none for one sequence, two for a sequence of length 1 (the
/// first row's position is negative), and two padding rows beyond `cu[num_seqs]`.
pub struct AttentionInputs {
    pub shape: AttentionShape,
    pub q: Vec<f32>,
    pub k_cache: Vec<f32>,
    pub v_cache: Vec<f32>,
    pub block_tables: Vec<i32>,
    pub seq_lens: Vec<i32>,
    pub cu_seqlens_q: Option<Vec<i32>>,
    pub scale: f32,
    pub rows: usize,
    pub num_blocks: usize,
    /// The caches are FP8 with these scales (`None`: of the case's dtype).
    pub kv8: Option<crate::args::KvScale>,
    /// Per-head sink logits `[num_heads]` (with [`AttentionShape::sinks`]).
    pub sinks: Option<Vec<f32>>,
}

impl AttentionInputs {
    pub fn random(rng: &mut StdRng, shape: AttentionShape) -> Self {
        let AttentionShape {
            num_seqs,
            num_heads,
            num_kv_heads,
            head_dim,
            block_size,
            table_width,
            prefill,
            max_q_len,
            ..
        } = shape;
        let capacity = table_width * block_size;
        let special = [
            0,
            block_size + 1,
            capacity + 3,
            1,
            capacity,
            2 * block_size - 1,
        ];
        let mut seq_lens: Vec<i32> = (0..num_seqs)
            .map(|s| match special.get(s) {
                Some(&len) => len as i32,
                None => rng.random_range(1..=capacity) as i32,
            })
            .collect();
        seq_lens.shuffle(rng);

        let num_blocks = num_seqs * table_width + 3;
        let mut pool: Vec<i32> = (0..num_blocks as i32).collect();
        pool.shuffle(rng);
        let mut block_tables = vec![-1; num_seqs * table_width];
        for s in 0..num_seqs {
            let used = (seq_lens[s] as usize).div_ceil(block_size).min(table_width);
            for j in 0..table_width {
                block_tables[s * table_width + j] = if j < used {
                    pool[s * table_width + j]
                } else if s % 2 == 0 {
                    -1
                } else {
                    rng.random_range(0..i32::MAX)
                };
            }
        }
        // One sequence with a block id outside the cache inside its context.
        if let Some(s) = (0..num_seqs).find(|&s| seq_lens[s] as usize > block_size) {
            block_tables[s * table_width] = num_blocks as i32 + 5;
        }

        let (rows, cu_seqlens_q) = if prefill {
            let mut cu = vec![0i32];
            let mut skipped = false;
            for (s, &len) in seq_lens.iter().enumerate() {
                let q_len = if len == 1 {
                    2 // the first row's position is -1
                } else if len > 1 && !skipped {
                    skipped = true;
                    0 // a sequence with no query this step
                } else {
                    rng.random_range(1..=len.clamp(1, max_q_len as i32))
                };
                cu.push(cu[s] + q_len);
            }
            (cu[num_seqs] as usize + 2, Some(cu))
        } else {
            (num_seqs, None)
        };
        let row = num_kv_heads * head_dim;
        let q = normal(rng, rows * num_heads * head_dim, 1.0);
        let k_cache = normal(rng, num_blocks * block_size * row, 1.0);
        let v_cache = normal(rng, num_blocks * block_size * row, 1.0);
        AttentionInputs {
            shape,
            q,
            k_cache,
            v_cache,
            sinks: shape.sinks.then(|| normal(rng, num_heads, 2.0)),
            block_tables,
            seq_lens,
            cu_seqlens_q,
            scale: 1.0 / (head_dim as f32).sqrt(),
            rows,
            num_blocks,
            kv8: None,
        }
    }
}

/// `sample`: f32 logits plus per-row sampling parameters.
///
/// Logits are N(0, 2); every third row is rounded to multiples of 0.5 so rows have ties
/// (at the maximum, at top-k and top-p thresholds). Parameters mix greedy rows
/// (temperature 0), top-k 0 (off), 1, small, `vocab` and beyond, top-p 1 (off), 0 (off),
/// tiny and typical values.
///
/// The knobs beyond those are off unless a `with_*` method sets them: min-p 0, no
/// penalty tensors, no log-probability tensors.
pub struct SampleInputs {
    pub logits: Vec<f32>,
    pub temperature: Vec<f32>,
    pub top_k: Vec<i32>,
    pub top_p: Vec<f32>,
    pub min_p: Vec<f32>,
    pub seeds: Vec<i64>,
    pub penalties: Option<PenaltyInputs>,
    /// Per row how many top log-probabilities (-1: none), and the top width `N`.
    pub logprobs: Option<(Vec<i32>, usize)>,
    /// Per-row tokens whose log-probability is reported instead of the sampled one's
    /// (`SampleLogprobs::target`; -1 and ids past the vocabulary: the sampled one's).
    pub target: Option<Vec<i32>>,
    /// Allowed-token masks: `[batch, words]` bits, per-row on flags, and `words`.
    pub mask: Option<(Vec<i32>, Vec<i32>, usize)>,
    pub batch: usize,
    pub vocab: usize,
}

/// The penalty tensors of [`SampleInputs`]: a count table and per-row slots and factors.
pub struct PenaltyInputs {
    /// `[slots, vocab]`: the prompt bit and output counts.
    pub counts: Vec<i32>,
    pub slots: usize,
    pub slot: Vec<i32>,
    pub repetition: Vec<f32>,
    pub frequency: Vec<f32>,
    pub presence: Vec<f32>,
}

impl SampleInputs {
    pub fn random(rng: &mut StdRng, batch: usize, vocab: usize) -> Self {
        let mut logits = normal(rng, batch * vocab, 2.0);
        for (r, row) in logits.chunks_mut(vocab).enumerate() {
            if r % 3 == 1 {
                row.iter_mut().for_each(|l| *l = (*l * 2.0).round() / 2.0);
            }
        }
        let temps = [0.0, 0.7, 1.0, 1.3, -1.0];
        let ks = [0, 1, 5, 40, vocab as i32, vocab as i32 + 3, -2];
        let ps = [1.0, 0.9, 0.5, 0.0, 1e-6, 0.95];
        SampleInputs {
            logits,
            temperature: (0..batch)
                .map(|_| temps[rng.random_range(0..temps.len())])
                .collect(),
            top_k: (0..batch)
                .map(|_| ks[rng.random_range(0..ks.len())])
                .collect(),
            top_p: (0..batch)
                .map(|_| ps[rng.random_range(0..ps.len())])
                .collect(),
            min_p: vec![0.0; batch],
            seeds: (0..batch).map(|_| rng.random()).collect(),
            penalties: None,
            logprobs: None,
            target: None,
            mask: None,
            batch,
            vocab,
        }
    }

    /// Allowed-token masks (one word more than the vocabulary needs): rows off, rows
    /// allowing about half the tokens, a few, exactly one (the last token) and every
    /// token; bits past the vocabulary set at random (they must be ignored).
    pub fn with_mask(mut self, rng: &mut StdRng) -> Self {
        let words = self.vocab.div_ceil(32) + 1;
        let mut bits = vec![0i32; self.batch * words];
        let mut on = vec![0i32; self.batch];
        for r in 0..self.batch {
            let row = &mut bits[r * words..(r + 1) * words];
            let allow = |row: &mut [i32], t: usize| row[t / 32] |= (1u32 << (t % 32)) as i32;
            match r % 6 {
                0 => continue,
                1 | 2 => (0..self.vocab)
                    .filter(|_| rng.random_bool(0.5))
                    .for_each(|t| allow(row, t)),
                3 => (0..5).for_each(|_| allow(row, rng.random_range(0..self.vocab))),
                4 => allow(row, self.vocab - 1),
                _ => (0..self.vocab).for_each(|t| allow(row, t)),
            }
            for t in self.vocab..words * 32 {
                if rng.random_bool(0.5) {
                    allow(row, t);
                }
            }
            on[r] = 1;
        }
        self.mask = Some((bits, on, words));
        self
    }

    /// Min-p on most rows: off (0, negative), tiny, typical, large and above 1.
    pub fn with_min_p(mut self, rng: &mut StdRng) -> Self {
        let ps = [0.0, 0.05, 0.1, 0.3, 0.9, 1.5, -0.2, 1e-4];
        self.min_p = (0..self.batch)
            .map(|_| ps[rng.random_range(0..ps.len())])
            .collect();
        self
    }

    /// Penalties: a table of `batch + 2` slots (about a tenth of the tokens flagged as in
    /// the prompt, a tenth with output counts 1..=4, some both); every row a distinct
    /// slot except some without one (-1) or with one out of range (no penalties), and
    /// factors mixing off and on values of both signs.
    pub fn with_penalties(mut self, rng: &mut StdRng) -> Self {
        let slots = self.batch + 2;
        let counts = (0..slots * self.vocab)
            .map(|_| {
                let prompt = if rng.random_bool(0.1) {
                    crate::backend::PROMPT_BIT
                } else {
                    0
                };
                let n = if rng.random_bool(0.1) {
                    rng.random_range(1..=4)
                } else {
                    0
                };
                prompt | n
            })
            .collect();
        let mut order: Vec<i32> = (0..slots as i32).collect();
        order.shuffle(rng);
        let slot = (0..self.batch)
            .map(|r| match r % 7 {
                3 => -1,
                5 => (slots + r) as i32,
                _ => order[r],
            })
            .collect();
        let pick = |rng: &mut StdRng, v: &[f32]| -> Vec<f32> {
            (0..self.batch)
                .map(|_| v[rng.random_range(0..v.len())])
                .collect()
        };
        let repetition = pick(rng, &[1.0, 1.3, 0.8, 2.0, 5.0]);
        let frequency = pick(rng, &[0.0, 0.5, -0.5, 1.5]);
        let presence = pick(rng, &[0.0, 0.7, -1.0, 2.0]);
        self.penalties = Some(PenaltyInputs {
            counts,
            slots,
            slot,
            repetition,
            frequency,
            presence,
        });
        self
    }

    /// Log-probabilities of width `n`: rows asking none (-1), the token only (0), a few,
    /// `n`, and more than `n`.
    pub fn with_logprobs(mut self, rng: &mut StdRng, n: usize) -> Self {
        let ns = [-1, 0, 1, 5, n as i32, n as i32 + 3];
        let num = (0..self.batch)
            .map(|_| ns[rng.random_range(0..ns.len())])
            .collect();
        self.logprobs = Some((num, n));
        self
    }

    /// Scored tokens on most rows (`SampleInputs::target`): random ids, the first and
    /// last token, -1, and an id past the vocabulary.
    pub fn with_targets(mut self, rng: &mut StdRng) -> Self {
        let v = self.vocab as i32;
        let target = (0..self.batch)
            .map(|r| match r % 5 {
                0 => -1,
                1 => 0,
                2 => v - 1,
                3 => v + 7,
                _ => rng.random_range(0..v),
            })
            .collect();
        self.target = Some(target);
        self
    }

    /// Greedy inputs (every temperature 0, -1 or NaN): random logits with the NaN /
    /// infinity / tie rows the greedy semantics define (when `batch >= 6`): all NaN, NaN at
    /// the front and next to the max, all -inf, a +inf, and an exact tie for the maximum.
    pub fn greedy(rng: &mut StdRng, batch: usize, vocab: usize) -> Self {
        let mut s = Self::random(rng, batch, vocab);
        for (r, t) in s.temperature.iter_mut().enumerate() {
            *t = [0.0, -1.0, f32::NAN][r % 3];
        }
        if batch >= 6 && vocab >= 4 {
            let row = |r: usize| r * vocab..(r + 1) * vocab;
            s.logits[row(0)].fill(f32::NAN);
            let r1 = &mut s.logits[row(1)];
            r1[0] = f32::NAN;
            r1[vocab - 1] = f32::NAN;
            r1[vocab / 2] = 100.0;
            s.logits[row(2)].fill(f32::NEG_INFINITY);
            s.logits[row(3)][vocab - 2] = f32::INFINITY;
            let r4 = &mut s.logits[row(4)];
            r4[vocab / 3] = 50.0;
            r4[vocab / 2] = 50.0;
        }
        s
    }
}

/// `qkv_rope_write`: q and k (and positions, table) from [`RopeInputs`], v, caches and
/// slots from [`KvWriteInputs`] (its `k` is unused), packed into one merged qkv row per
/// token, and optional Qwen3 head-norm weights.
pub struct QkvRopeInputs {
    pub rope: RopeInputs,
    pub kv: KvWriteInputs,
    pub qkv: Vec<f32>,
    pub norms: Option<(Vec<f32>, Vec<f32>)>,
    pub eps: f32,
}

impl QkvRopeInputs {
    #[allow(clippy::too_many_arguments)]
    pub fn random(
        rng: &mut StdRng,
        n: usize,
        num_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
        rot: usize,
        num_blocks: usize,
        block_size: usize,
        head_norm: bool,
    ) -> Self {
        let rope = RopeInputs::random(rng, n, num_heads, num_kv_heads, head_dim, rot, 80, true);
        let kv = KvWriteInputs::random(rng, n, num_kv_heads, head_dim, num_blocks, block_size);
        let (qr, kr) = (num_heads * head_dim, num_kv_heads * head_dim);
        let mut qkv = Vec::with_capacity(n * (qr + 2 * kr));
        for i in 0..n {
            qkv.extend_from_slice(&rope.q[i * qr..(i + 1) * qr]);
            qkv.extend_from_slice(&rope.k[i * kr..(i + 1) * kr]);
            qkv.extend_from_slice(&kv.v[i * kr..(i + 1) * kr]);
        }
        let mut weight = || -> Vec<f32> {
            normal(rng, head_dim, 0.2)
                .into_iter()
                .map(|v| 1.0 + v)
                .collect()
        };
        let norms = head_norm.then(|| (weight(), weight()));
        QkvRopeInputs {
            rope,
            kv,
            qkv,
            norms,
            eps: 1e-6,
        }
    }
}
