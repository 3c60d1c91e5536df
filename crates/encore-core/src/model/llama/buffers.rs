//! The step's intermediates: their shapes for a token and sequence capacity, the arena
//! bytes they take, and their allocation from the arena in a fixed order
//! ([`StepBuffers`]).

use super::{Model, StepBuffers};
use crate::backend::Backend;
use crate::error::Result;
use crate::memory::{Arena, ARENA_ALIGN};
use crate::model::config::ModelConfig;
use crate::tensor::DType;

impl Model {
    /// Shapes of the step's intermediates for `n` tokens and `b` sequences.
    fn buffer_shapes(
        c: &ModelConfig,
        t: DType,
        n: usize,
        b: usize,
        scratch_len: usize,
        moe_work: usize,
    ) -> [(DType, Vec<usize>); 28] {
        let (_, size) = c.tp_rank();
        let (shard, gathered) = match size {
            1 => (vec![1, 1], vec![1]),
            _ => (vec![b, c.vocab_rows()], vec![b * size * c.vocab_rows()]),
        };
        let (experts, top_k, ei) = c.moe.as_ref().map_or((1, 1, 1), |m| {
            (m.num_experts, m.top_k, m.expert_intermediate)
        });
        let moe_rows = if c.moe.is_some() { n } else { 1 };
        let shared = c.moe.as_ref().and_then(|m| m.shared_expert_intermediate);
        let (srows, s, sh) = shared.map_or((1, 1, 1), |s| (n, s, c.hidden_size));
        // An EAGLE-3 head's two normed inputs, then the pair side by side.
        let (erows, eh) = match c.eagle {
            Some(_) => (n, c.hidden_size),
            None => (1, 1),
        };
        [
            (t, vec![n, c.hidden_size]),
            (t, vec![n, c.hidden_size]),
            (t, vec![n, c.hidden_size]),
            (t, vec![n, (c.num_heads + 2 * c.num_kv_heads) * c.head_dim]),
            (t, vec![n, c.num_heads * c.head_dim]),
            (t, vec![n, c.num_heads * c.head_dim]),
            (t, vec![n, 2 * c.intermediate_size]),
            (t, vec![n, c.intermediate_size]),
            (DType::F32, vec![scratch_len.max(1)]),
            (t, vec![b, c.hidden_size]),
            (DType::F32, vec![b, c.vocab_size]),
            (DType::F32, shard),
            (DType::F32, gathered),
            (t, vec![moe_rows, experts]),
            (DType::I32, vec![moe_rows, top_k]),
            (DType::F32, vec![moe_rows, top_k]),
            (t, vec![moe_rows, experts]),
            (DType::I32, vec![moe_rows, top_k]),
            (DType::F32, vec![moe_rows, top_k]),
            (t, vec![moe_rows * top_k, ei]),
            (DType::I32, vec![moe_work.div_ceil(4).max(1)]),
            (t, vec![srows, 2 * s]),
            (t, vec![srows, s]),
            (t, vec![srows, sh]),
            (t, vec![srows, 1]),
            (t, vec![2, erows, eh]),
            (t, vec![erows, 2 * eh]),
            (t, vec![n * perm_width(c)]),
        ]
    }

    /// Arena bytes one step of `n` tokens, `b` sequences and block tables of
    /// `table_width` blocks of `block_size` needs.
    pub fn arena_bytes(
        &self,
        backend: &dyn Backend,
        n: usize,
        b: usize,
        table_width: usize,
        block_size: usize,
    ) -> usize {
        Self::arena_bytes_for(
            &self.cfg,
            self.dtype(),
            backend,
            n,
            b,
            table_width,
            block_size,
        )
    }

    /// [`Model::arena_bytes`] before the model exists (for a memory estimate ahead of
    /// loading): the same bytes for a model of `cfg` run in `dtype`. Saturates at
    /// `usize::MAX` instead of overflowing.
    pub fn arena_bytes_for(
        cfg: &ModelConfig,
        dtype: DType,
        backend: &dyn Backend,
        n: usize,
        b: usize,
        table_width: usize,
        block_size: usize,
    ) -> usize {
        let scratch = Self::scratch_len(cfg, backend, n, table_width, block_size);
        let work = Self::moe_work_bytes(cfg, backend, dtype, n);
        Self::buffer_shapes(cfg, dtype, n, b, scratch, work)
            .iter()
            .map(|(d, s)| {
                s.iter()
                    .try_fold(d.size(), |acc, &x| acc.checked_mul(x))
                    .and_then(|bytes| bytes.checked_next_multiple_of(ARENA_ALIGN))
                    .unwrap_or(usize::MAX)
            })
            .fold(0usize, usize::saturating_add)
    }

    /// The backend's workspace bytes for a sparse layer of `n` token rows (0 without
    /// experts).
    fn moe_work_bytes(cfg: &ModelConfig, backend: &dyn Backend, dtype: DType, n: usize) -> usize {
        cfg.moe.as_ref().map_or(0, |m| {
            backend.moe_workspace_bytes(n, cfg.hidden_size, m.num_experts, m.top_k, dtype)
        })
    }

    /// Attention scratch (f32 elements) for a step of up to `n` token rows: one launch
    /// over all rows, or (a mixed step) its leading decode rows and the rows after them,
    /// in two launches. The split-K plan uses more splits for fewer rows, so the need is
    /// not monotonic in the row count: the maximum is taken over every count up to `n`.
    /// That also makes it monotonic in `n`, which the arena needs: sized for the largest
    /// step, it must hold every smaller bucket's buffers (a 48-token bucket's scratch
    /// exceeded a 64-token capacity's before, on a model of 8 heads of 64).
    fn scratch_len(
        cfg: &ModelConfig,
        backend: &dyn Backend,
        n: usize,
        w: usize,
        bs: usize,
    ) -> usize {
        let len = |rows| backend.attention_scratch_len(rows, cfg.num_heads, cfg.head_dim, w, bs);
        (1..=n).map(len).fold(0, usize::max)
    }

    /// Allocate one step's intermediates for a capacity of `n` token rows and `b`
    /// sequence rows, block tables `w` wide over blocks of `bs` tokens (always the same
    /// order, so a capture and its warm-up get the same addresses).
    pub fn alloc_step(
        &self,
        backend: &dyn Backend,
        arena: &mut Arena,
        n: usize,
        b: usize,
        w: usize,
        bs: usize,
    ) -> Result<StepBuffers> {
        let scratch = {
            let mut cache = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
            *cache
                .entry([n, w, bs])
                .or_insert_with(|| Self::scratch_len(&self.cfg, backend, n, w, bs))
        };
        let work = Self::moe_work_bytes(&self.cfg, backend, self.dtype(), n);
        let mut it = Self::buffer_shapes(&self.cfg, self.dtype(), n, b, scratch, work)
            .into_iter()
            .map(|(d, s)| arena.alloc(d, &s))
            .collect::<Result<Vec<_>>>()?
            .into_iter();
        let mut next = || it.next().expect("28 buffers");
        Ok(StepBuffers {
            hidden: next(),
            residual: next(),
            normed: next(),
            qkv: next(),
            q: next(),
            attn: next(),
            gate_up: next(),
            act: next(),
            scratch: next(),
            last: next(),
            logits: next(),
            logits_shard: next(),
            gathered: next(),
            router_logits: next(),
            moe_ids: next(),
            moe_weights: next(),
            prefetch_logits: next(),
            prefetch_ids: next(),
            prefetch_weights: next(),
            moe_act: next(),
            moe_work: next(),
            shared_gate_up: next(),
            shared_act: next(),
            shared_out: next(),
            shared_gate: next(),
            eagle_pair: next(),
            eagle_cat: next(),
            perm_x: next(),
        })
    }
}

/// The widest input a GPTQ act-order projection gathers (`StepBuffers::perm_x`'s row): q/k/v's
/// and gate/up's (hidden), o's (this rank's heads) and down's (this rank's MLP share); 1
/// without act order.
fn perm_width(c: &ModelConfig) -> usize {
    match c.weights.int_packing.is_some_and(|p| p.act_order) {
        true => c
            .hidden_size
            .max(c.num_heads * c.head_dim)
            .max(c.intermediate_size),
        false => 1,
    }
}
