//! The Llama-family forward pass (Llama, Mistral, Qwen2, Qwen3), written once against the
//! backend ops: the CPU backend runs the same code as CUDA.
//!
//! One call runs one step over a batch that mixes prefill sequences (several tokens,
//! `cu_seqlens_q`) and decode sequences (one token), and returns f32 logits for the last
//! token of each sequence. Every per-step quantity arrives in device tensors
//! ([`StepInputs`]); intermediates come from the arena in a fixed order, so the same call
//! can be captured into a graph.

mod act_order;
mod buffers;
mod eagle;
mod op_weights;
mod skew;
mod sparse;

use crate::backend::{Attention, Backend, Mlp, Norm, NormMatmul, PreNorm, QkvRope};
use crate::error::{Error, Result};
use crate::graph::StepHooks;
use crate::kv::KvCache;
use crate::memory::Arena;
use crate::model::config::ModelConfig;
use crate::model::decl::{LayerOp, OpId, Role};
use crate::model::routing::RoutingTable;
use crate::model::weights::ModelWeights;
use crate::offload::Offload;
use crate::tensor::{DType, Tensor};
use op_weights::{with_second, NormWeights};

/// One step's inputs, all device tensors (views of persistent buffers in graph mode).
///
/// `n` tokens from `b` sequences. Sequence `s` contributes rows `cu[s]..cu[s+1]` (or row
/// `s` when `cu_seqlens_q` is `None`: pure decode, `n == b`).
pub struct StepInputs<'a> {
    /// i32 `[n]`.
    pub token_ids: &'a Tensor,
    /// i32 `[n]`: the position of each token in its sequence.
    pub positions: &'a Tensor,
    /// i32 `[n]`: KV-cache slot of each token (-1: padding, not written).
    pub slot_mapping: &'a Tensor,
    /// i32 `[b, table_width]`.
    pub block_tables: &'a Tensor,
    /// i32 `[b]`: tokens in the cache per sequence after this step.
    pub seq_lens: &'a Tensor,
    /// i32 `[b + 1]`, or `None` for pure decode.
    pub cu_seqlens_q: Option<&'a Tensor>,
    /// i32 `[b]`: the row of each sequence's last token (an out-of-range row yields a
    /// zero hidden state, e.g. for padding).
    pub logits_indices: &'a Tensor,
    /// A mixed step whose first `decode_rows` sequences are one-token decode rows (rows
    /// `0..decode_rows`), with `cu_seqlens_q` of the other sequences relative to their
    /// first row (i32 `[b - decode_rows + 1]`): attention runs as two launches, the decode
    /// rows through the decode path and the rest through the prefill path. `None`: one
    /// launch over the whole step.
    pub split: Option<(usize, &'a Tensor)>,
}

/// A model ready to run: config, weights on the backend, and the rotary table.
pub struct Model {
    pub cfg: ModelConfig,
    pub weights: ModelWeights,
    cos_sin: Tensor,
    /// The identity rotation (cos 1, sin 0) for the layers without rotary embeddings
    /// (`cfg.no_rope_layers`); `None` when every layer rotates.
    cos_sin_none: Option<Tensor>,
    /// The windowed layers' own rotary (`cfg.rope_local`: Gemma 3's local base).
    cos_sin_local: Option<Tensor>,
    max_positions: usize,
    /// [`Model::scratch_len`] per step capacity `(n, w, bs)`: it evaluates the split-K
    /// plan for every row count up to `n`, too much to repeat on every eager step.
    scratch: std::sync::Mutex<std::collections::HashMap<[usize; 3], usize>>,
    /// Weights under a device budget: what streams them (`None`: all resident).
    offload: Option<Offload>,
    /// Whether some rank of the tensor-parallel group streams weights (this one's
    /// `offload`, or a peer's: [`Model::set_group_offloads`]). The fused row-parallel
    /// projections need every rank on the same path.
    group_offloads: bool,
    /// Synthetic routing for benchmarks ([`Model::set_router_skew`]): the table's logits
    /// in the run dtype and the window of `rows + layers` rows a step reads.
    router_table: Option<RouterTable>,
    /// A target's capture of the hidden states an EAGLE-3 head reads
    /// ([`Model::capture_aux`]).
    aux: Option<AuxCapture>,
    /// An EAGLE-3 head's persistent input and output rows ([`Model::enable_eagle`]).
    eagle: Option<EagleRows>,
}

/// The residual stream at the input of three layers, per token row of the last step:
/// `buf` is `[3 * rows, hidden]`, layer `layers[k]`'s rows at `k * rows..`.
struct AuxCapture {
    layers: [usize; 3],
    buf: Tensor,
    rows: usize,
}

/// An EAGLE-3 head's rows outside the arena, so that graphs read and write them in place:
/// `input` `[rows, hidden]`, the hidden state of each token row of the next step (the
/// drafter writes it before the step), and `next` `[seqs, hidden]`, each sampled row's
/// pre-norm output (the hidden state of the draft after it). Set with the target's
/// embedding ([`Model::enable_eagle`]).
struct EagleRows {
    input: Tensor,
    next: Tensor,
}

/// `--router-skew`'s logits on the device: the whole table, and the window the forward
/// reads (layer `l` of a step of `n` rows reads its rows `l..l + n`), moved before each step.
struct RouterTable {
    all: Tensor,
    window: Tensor,
    /// The prefetch's predictions of the same rows ([`RoutingTable::predicted`]): the
    /// whole table and the window, only when the expert cache prefetches.
    predicted: Option<(Tensor, Tensor)>,
    table: std::sync::Arc<RoutingTable>,
    /// The first row of the whole table the next step's window copies.
    next: std::sync::atomic::AtomicUsize,
}

/// The intermediates of one step (arena views), allocated from the arena in this order.
/// Pieces captured for a bucket keep pointing at the buffers of their capture.
pub struct StepBuffers {
    hidden: Tensor,
    residual: Tensor,
    normed: Tensor,
    qkv: Tensor,
    q: Tensor,
    attn: Tensor,
    gate_up: Tensor,
    act: Tensor,
    scratch: Tensor,
    last: Tensor,
    logits: Tensor,
    /// Tensor parallelism: this rank's logits (`[b, vocab / size]`) and every rank's,
    /// gathered (`[size * b * vocab / size]`); one element each alone.
    logits_shard: Tensor,
    gathered: Tensor,
    /// Sparse layers: the router's logits `[n, experts]`, the chosen experts (i32) and
    /// their weights (f32) `[n, top_k]`; one element each without experts.
    router_logits: Tensor,
    moe_ids: Tensor,
    moe_weights: Tensor,
    /// The same for the next sparse layer's experts predicted by an expert prefetch.
    prefetch_logits: Tensor,
    prefetch_ids: Tensor,
    prefetch_weights: Tensor,
    /// The chosen experts' activations `[n * top_k, expert_intermediate]`.
    moe_act: Tensor,
    /// The backend's workspace for a sparse layer (`Backend::moe_workspace_bytes`, as i32).
    moe_work: Tensor,
    /// Qwen2-MoE's shared expert: its gate/up product and activation, output, and gate
    /// (`[n, 2 S]`, `[n, S]`, `[n, hidden]`, `[n, 1]`); one element each without it.
    shared_gate_up: Tensor,
    shared_act: Tensor,
    shared_out: Tensor,
    shared_gate: Tensor,
    /// An EAGLE-3 head's normed embedding and normed hidden state `[2, n, hidden]`, and
    /// the two side by side `[n, 2 * hidden]`; one element each for other models.
    eagle_pair: Tensor,
    eagle_cat: Tensor,
    /// A GPTQ act-order projection's input with its columns in the weight's order
    /// (`[n * width]`, viewed `[n, k]` per projection; `[1]` without act order).
    perm_x: Tensor,
}

impl StepBuffers {
    /// The f32 logits of the first `rows` sequence rows (written by [`Model::head`]).
    pub fn logits(&self, rows: usize) -> Result<Tensor> {
        self.logits.prefix(rows)
    }
}

/// Gemma's embedding scale: `sqrt(hidden)` rounded to the run dtype, as transformers
/// multiplies by it in that dtype.
fn embed_scale(hidden: usize, dtype: DType) -> f32 {
    let s = (hidden as f32).sqrt();
    match dtype {
        DType::BF16 => half::bf16::from_f32(s).to_f32(),
        DType::F16 => half::f16::from_f32(s).to_f32(),
        _ => s,
    }
}

/// The dense bytes of the largest quantized weight in the run dtype `dtype`: the scratch a
/// backend may decode a quantized weight into for a large matmul
/// ([`Backend::reserve_dequant_scratch`]); 0 when every weight is dense.
pub fn dequant_scratch_bytes(cfg: &ModelConfig, dtype: DType) -> usize {
    cfg.decl()
        .tensors()
        .iter()
        .filter(|t| t.dtype(dtype).is_quantized())
        .map(|t| t.numel() * dtype.size())
        .max()
        .unwrap_or(0)
}

impl Model {
    /// Wrap loaded weights; builds the f32 rotary table for `max_positions` positions.
    pub fn new(
        backend: &dyn Backend,
        cfg: ModelConfig,
        weights: ModelWeights,
        max_positions: usize,
    ) -> Result<Self> {
        if !cfg.head_dim.is_multiple_of(2) {
            return Err(Error::Config {
                path: "model".into(),
                what: format!(
                    "head_dim {} must be even for rotary embeddings",
                    cfg.head_dim
                ),
            });
        }
        let table = cfg.rope.cos_sin_table(max_positions);
        let rows = cfg.rope.table_rows(max_positions);
        let cos_sin = backend.upload(&table, &[rows, cfg.rope.rot_dim])?;
        let cos_sin_none = if cfg.no_rope_layers.is_empty() {
            None
        } else {
            let half = cfg.rope.rot_dim / 2;
            let identity: Vec<f32> = (0..max_positions * cfg.rope.rot_dim)
                .map(|i| {
                    if i % cfg.rope.rot_dim < half {
                        1.0
                    } else {
                        0.0
                    }
                })
                .collect();
            Some(backend.upload(&identity, &[max_positions, cfg.rope.rot_dim])?)
        };
        let cos_sin_local = match &cfg.rope_local {
            None => None,
            Some(local) if local.rot_dim != cfg.rope.rot_dim => {
                return Err(Error::Config {
                    path: "model".into(),
                    what: format!(
                        "the local rotary's {} dims differ from the global's {}",
                        local.rot_dim, cfg.rope.rot_dim
                    ),
                })
            }
            Some(local) => Some(backend.upload(
                &local.cos_sin_table(max_positions),
                &[max_positions, local.rot_dim],
            )?),
        };
        backend.reserve_dequant_scratch(dequant_scratch_bytes(&cfg, weights.dtype))?;
        Ok(Model {
            cfg,
            weights,
            cos_sin,
            cos_sin_none,
            cos_sin_local,
            max_positions,
            scratch: Default::default(),
            offload: None,
            group_offloads: false,
            router_table: None,
            aux: None,
            eagle: None,
        })
    }

    /// [`Model::new`] for weights loaded under a budget
    /// ([`crate::model::weights::load_offloaded`]) with the executor that streams them.
    pub fn with_offload(
        backend: &dyn Backend,
        cfg: ModelConfig,
        weights: ModelWeights,
        max_positions: usize,
        offload: Offload,
    ) -> Result<Self> {
        let mut m = Self::new(backend, cfg, weights, max_positions)?;
        m.offload = Some(offload);
        m.group_offloads = true;
        Ok(m)
    }

    /// Whether some rank of the tensor-parallel group streams weights (this one or a
    /// peer): the row-parallel projections then stay out of the fused all-reduce.
    pub fn group_offloads(&self) -> bool {
        self.group_offloads
    }

    /// A tensor-parallel peer streams weights, though this rank may not (a byte budget
    /// between the ranks' shard sizes, which differ where the MLP shares do): this rank
    /// leaves the row-parallel projections out of the fused all-reduce as that peer does,
    /// for on CUDA the two paths wait for different signals and the group would hang.
    /// Call it before any step.
    pub fn set_group_offloads(&mut self) {
        self.group_offloads = true;
    }

    /// The weight offload executor, when the weights run under a budget.
    pub fn offload(&self) -> Option<&Offload> {
        self.offload.as_ref()
    }

    /// Op `op` is about to be queued: under a budget, queue its weight copies and waits.
    /// `Some(tensors)` (the LRU policy) replaces the op's weights, in the op's read order.
    fn enter(&self, op: OpId) -> Result<Option<Vec<Tensor>>> {
        match &self.offload {
            Some(o) => o.enter(op.index(self.weights.layers.len())),
            None => Ok(None),
        }
    }

    /// What the executor tells this model's step-long state (the capture protocol, see
    /// [`StepHooks`]): the weight offload's, under a budget.
    pub fn hooks(&self) -> Option<&dyn StepHooks> {
        self.offload.as_ref().map(|o| o as &dyn StepHooks)
    }

    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// LongRoPE's rows: `(original_max_position_embeddings, offset)`: a sequence longer
    /// than the first (after the step) rotates from the long factors' half of the table,
    /// its positions plus the offset (see [`crate::ops::RopeConfig::cos_sin_table`]), as
    /// transformers switches the whole forward to the long factors past it. `None`
    /// without LongRoPE.
    pub fn long_rope(&self) -> Option<(usize, usize)> {
        self.cfg
            .rope
            .long_rope()
            .map(|orig| (orig, self.max_positions))
    }

    fn dtype(&self) -> DType {
        self.weights.dtype
    }

    /// How many pieces a step splits into at its attention calls: one before each
    /// layer's attention, and one after the last.
    pub fn num_pieces(&self) -> usize {
        self.weights.layers.len() + 1
    }

    /// Piece `k` of a step: everything between attention `k - 1` and attention `k`
    /// (the embedding and layer 0's prologue for `k == 0`; the last layer's MLP and the
    /// final norm for `k == num_layers`). Reads only per-token inputs (ids, positions,
    /// slots), so a piece captured for a token bucket serves any split of its tokens into
    /// sequences.
    pub fn piece(
        &self,
        be: &dyn Backend,
        kv: &KvCache,
        inp: &StepInputs<'_>,
        buf: &StepBuffers,
        k: usize,
    ) -> Result<()> {
        let c = &self.cfg;
        let layers = &self.weights.layers;
        if k > layers.len() {
            return Err(Error::invalid(
                "forward",
                format!("piece {k} of {}", layers.len() + 1),
            ));
        }
        let eps = c.rms_norm_eps;
        // Each weight-reading op is announced first (weight offload); under the LRU
        // policy its weights come back from the announcement.
        let one = |op: OpId, w: &Tensor| -> Result<Tensor> {
            Ok(match self.enter(op)? {
                Some(mut v) => v.swap_remove(0),
                None => w.clone(),
            })
        };
        // A norm op the model may lack (OLMo 2's missing pre-norms), with its bias when
        // the norms are LayerNorms.
        let maybe = |op: OpId, w: Option<&Tensor>, b: Option<&Tensor>| {
            Ok::<_, Error>(NormWeights::take(self.enter(op)?, w, b))
        };
        // Tensor parallelism: the embedding (vocabulary shards), o-proj and down (row
        // shards) give partial sums, summed over the ranks; after o-proj and down the sum
        // is fused with the residual RMSNorm that follows (one kernel where the backend
        // can).
        let (rank, size) = c.tp_rank();
        // Post norms (Gemma) norm each projection's whole output before the residual add:
        // its sum over the ranks comes first, right after the projection (`reduce`).
        let reduce_early = size > 1 && c.post_norms;
        let reduce = || match reduce_early {
            true => be.all_reduce(&buf.hidden),
            false => Ok(()),
        };
        // The sum a norm-less residual add needs first, where no early one was made.
        let reduce_late = || match size > 1 && !reduce_early {
            true => be.all_reduce(&buf.hidden),
            false => Ok(()),
        };
        // residual += hidden, then normed = its norm by w (no w: the sum itself).
        let add_norm = |w: Option<Norm<'_>>| match w {
            None => {
                reduce_late()?;
                be.residual_add(&buf.hidden, &buf.residual, &buf.normed)
            }
            Some(w) if size > 1 && !reduce_early => {
                be.all_reduce_rms_norm(&buf.hidden, &buf.residual, w, eps, &buf.normed)
            }
            Some(w) => be.rms_norm(&buf.hidden, Some(&buf.residual), w, eps, &buf.normed),
        };
        // Without weight offload (no announcement between the two ops), a row-parallel
        // projection and the norm after it go to the backend as one op, which may sum
        // over the ranks inside the matmul.
        // (An o_proj bias, which the fused op lacks, keeps o_proj a matmul with its bias.)
        let fused = size > 1 && !self.group_offloads && !reduce_early && !c.o_bias;
        // The down projection too, where every rank's share of the MLP is the same.
        let fused_down = fused && c.mlp_shares_even();
        let project_add_norm = |x: &Tensor, w: &Tensor, norm: Norm<'_>| {
            be.matmul_all_reduce_rms_norm(x, w, &buf.hidden, &buf.residual, norm, eps, &buf.normed)
        };
        if k == 0 && c.eagle.is_some() {
            return self.eagle_prologue(be, kv, inp, buf);
        }
        // A dense layer's down projection waiting for the norm after it (`fused`).
        let mut down_pending = None;
        // A dense layer's MLP output norm, waiting for the residual add and norm after it.
        let mut out_norm_pending = None;
        if k == 0 {
            let embed = one(OpId::Embed, &self.weights.embed)?;
            be.embedding_rows(inp.token_ids, &embed, rank * c.vocab_rows(), &buf.hidden)?;
            if size > 1 {
                be.all_reduce(&buf.hidden)?;
            }
            if c.embed_scale {
                be.scale(&buf.hidden, embed_scale(c.hidden_size, self.weights.dtype))?;
            }
        } else {
            // The rest of layer k - 1: o-proj, residual + post-norm, MLP (whose down
            // projection the next norm adds to the residual).
            let (l, at) = (&layers[k - 1], |op| OpId::Layer(k - 1, op));
            // o_proj, then (post norms) the norm of its output, read in that order.
            // The op reads o_proj, then its bias, then its output's norm (each when the
            // model has it).
            let (o_proj, o_bias, out_norm) = match self.enter(at(LayerOp::OProj))? {
                None => (
                    l.o_proj().clone(),
                    l.get(Role::OProjBias).cloned(),
                    l.attn_out_norm().cloned(),
                ),
                Some(v) => {
                    let mut it = v.into_iter();
                    let o_proj = it.next().expect("o_proj is read first");
                    let o_bias = l.get(Role::OProjBias).and_then(|_| it.next());
                    (o_proj, o_bias, l.attn_out_norm().and_then(|_| it.next()))
                }
            };
            let post_bias = l.get(Role::MlpNormBias);
            let dense = !matches!((l.router(), &c.moe), (Some(_), Some(_)));
            // The residual add and norm before a dense MLP go into the MLP op (which may
            // fuse them into its gate/up projection) on one rank without offload.
            let mut mlp_norm = None;
            // (gpt-oss's o_proj bias: over ranks, rank 0's; the others hold zeros.)
            // GPTQ act order: the input's columns in the weight's order.
            let o_x = self.in_order(be, buf, &buf.attn, l.get(Role::OProjPerm))?;
            // ... and the MLP's, which then runs op by op (its fused ops take no order).
            let permuted = l.get(Role::GateUpPerm).is_some() || l.get(Role::DownPerm).is_some();
            match (l.post_norm(), fused) {
                (Some(w), true) => project_add_norm(&o_x, &o_proj, Norm::new(w, post_bias))?,
                _ => {
                    be.matmul(&o_x, &o_proj, o_bias.as_ref(), &buf.hidden)?;
                    reduce()?;
                    let post_norm = maybe(at(LayerOp::PostNorm), l.post_norm(), post_bias)?;
                    match &out_norm {
                        // The output's norm, the residual add and the MLP's norm: one op.
                        Some(n) => {
                            let (h, r) = (&buf.hidden, &buf.residual);
                            let w = post_norm.as_ref().map(NormWeights::arg);
                            be.norm_add_norm(h, n.into(), r, w, eps, &buf.normed)?
                        }
                        None if size == 1 && dense && self.offload.is_none() && !permuted => {
                            match post_norm {
                                Some(w) => mlp_norm = Some(w),
                                None => add_norm(None)?,
                            }
                        }
                        None => add_norm(post_norm.as_ref().map(NormWeights::arg))?,
                    }
                }
            }
            match (l.router(), &c.moe) {
                (Some(router), Some(moe)) => {
                    self.sparse_mlp(be, buf, k - 1, router, moe)?;
                    reduce()?;
                }
                _ => {
                    let gate_up = one(at(LayerOp::GateUp), l.gate_up())?;
                    let (act, normed) = (c.hidden_act, &buf.normed);
                    // The whole MLP as one backend op (CUDA fuses the activation into the
                    // down projection's FP8 operand), unless the down projection waits
                    // for the norm after it or offload announces it after the gate/up.
                    let whole = !fused_down && self.offload.is_none() && !permuted;
                    let mut down_x = buf.act.clone();
                    if !whole {
                        let x = self.in_order(be, buf, normed, l.get(Role::GateUpPerm))?;
                        be.matmul_act_mul(act, &x, &gate_up, &buf.gate_up, &buf.act)?;
                        down_x = self.in_order(be, buf, &buf.act, l.get(Role::DownPerm))?;
                    }
                    let (down, out_norm) =
                        with_second(self.enter(at(LayerOp::Down))?, l.down(), l.mlp_out_norm());
                    if fused_down {
                        down_pending = Some((down_x, down));
                    } else {
                        if whole {
                            let norm = mlp_norm.as_ref().map(|w| PreNorm {
                                residual: &buf.residual,
                                norm: w.arg(),
                                eps,
                                normed,
                            });
                            be.mlp(&Mlp {
                                act,
                                x: if norm.is_some() { &buf.hidden } else { normed },
                                norm,
                                gate_up: &gate_up,
                                down: &down,
                                gate_up_out: &buf.gate_up,
                                act_out: &buf.act,
                                out: &buf.hidden,
                            })?;
                        } else {
                            be.matmul(&down_x, &down, None, &buf.hidden)?;
                        }
                        reduce()?;
                        out_norm_pending = out_norm;
                    }
                }
            }
        }
        let add_norm = |norm: Option<Norm<'_>>| match (&down_pending, norm) {
            (Some((x, down)), Some(norm)) => project_add_norm(x, down, norm),
            (Some((x, down)), None) => {
                be.matmul(x, down, None, &buf.hidden)?;
                add_norm(None)
            }
            (None, norm) => match &out_norm_pending {
                Some(n) => {
                    let (h, r) = (&buf.hidden, &buf.residual);
                    be.norm_add_norm(h, n.into(), r, norm, eps, &buf.normed)
                }
                None => add_norm(norm),
            },
        };
        let Some(l) = layers.get(k) else {
            let w = &self.weights;
            let norm = maybe(OpId::FinalNorm, Some(&w.norm), w.norm_bias.as_ref())?;
            return add_norm(norm.as_ref().map(NormWeights::arg));
        };
        let (w, b) = (l.input_norm(), l.get(Role::AttnNormBias));
        let input_norm = maybe(OpId::Layer(k, LayerOp::InputNorm), w, b)?;
        let input_norm = input_norm.as_ref().map(NormWeights::arg);
        // The residual add and the input norm go into the q/k/v projection's op (which may
        // fuse them into its x), on one rank without offload where nothing reads the
        // residual or the normed rows between them (an EAGLE head's taps, its own input).
        let fuse_norm = k > 0
            && size == 1
            && self.offload.is_none()
            && self.aux.is_none()
            && c.eagle.is_none()
            && down_pending.is_none()
            && out_norm_pending.is_none()
            && input_norm.is_some()
            && l.get(Role::QkvPerm).is_none();
        // residual = residual + hidden (the first layer starts the residual stream).
        if k == 0 {
            be.copy(&buf.hidden, &buf.residual)?;
            match input_norm {
                Some(n) => be.rms_norm(&buf.hidden, None, n, eps, &buf.normed)?,
                None => be.copy(&buf.hidden, &buf.normed)?,
            }
        } else if !fuse_norm {
            add_norm(input_norm)?;
        }
        // The residual stream entering this layer, where an EAGLE head reads it.
        if let Some(a) = &self.aux {
            for (j, _) in a.layers.iter().enumerate().filter(|&(_, &l)| l == k) {
                let n = buf.residual.dim(0);
                be.copy(&buf.residual, &a.buf.narrow(j * a.rows, n)?)?;
            }
        }
        let pre_norm = input_norm.filter(|_| fuse_norm);
        self.qkv_write(be, kv, inp, buf, k, pre_norm)
    }

    /// Layer `k`'s q/k/v from `buf.normed` (an EAGLE head's from its pair of inputs), or
    /// with `pre_norm` from `buf.hidden` added to the residual and normed by it in the
    /// projection's op: one projection by the merged weight, then split / head norm /
    /// rope / KV write.
    fn qkv_write(
        &self,
        be: &dyn Backend,
        kv: &KvCache,
        inp: &StepInputs<'_>,
        buf: &StepBuffers,
        k: usize,
        pre_norm: Option<Norm<'_>>,
    ) -> Result<()> {
        let c = &self.cfg;
        let l = &self.weights.layers[k];
        let eps = c.rms_norm_eps;
        let x = if c.eagle.is_some() {
            &buf.eagle_cat
        } else {
            &buf.normed
        };
        // The op reads qkv, then its bias and head norms when the model has them.
        let (qkv, bias, q_norm, k_norm) = match self.enter(OpId::Layer(k, LayerOp::Qkv))? {
            None => (
                l.qkv().clone(),
                l.qkv_bias().cloned(),
                l.q_norm().cloned(),
                l.k_norm().cloned(),
            ),
            Some(v) => {
                let mut it = v.into_iter();
                let qkv = it.next().expect("qkv is read first");
                let bias = l.qkv_bias().and_then(|_| it.next());
                let q_norm = l.q_norm().and_then(|_| it.next());
                let k_norm = l.k_norm().and_then(|_| it.next());
                (qkv, bias, q_norm, k_norm)
            }
        };
        match pre_norm {
            Some(w) => be.add_norm_matmul(&NormMatmul {
                x: &buf.hidden,
                norm: PreNorm {
                    residual: &buf.residual,
                    norm: w,
                    eps,
                    normed: &buf.normed,
                },
                w: &qkv,
                bias: bias.as_ref(),
                out: &buf.qkv,
            })?,
            None => {
                let x = self.in_order(be, buf, x, l.get(Role::QkvPerm))?;
                be.matmul(&x, &qkv, bias.as_ref(), &buf.qkv)?
            }
        }
        // OLMo 2: q across its heads, then k across its heads, on the fused rows.
        let whole = c.qk_norm_whole();
        if let (true, Some(qn), Some(kn)) = (whole, &q_norm, &k_norm) {
            be.rms_norm_columns(&buf.qkv, 0, qn, eps)?;
            be.rms_norm_columns(&buf.qkv, c.num_heads * c.head_dim, kn, eps)?;
        }
        let n = buf.q.dim(0);
        be.qkv_rope_write(&QkvRope {
            qkv: &buf.qkv,
            head_norm: q_norm.as_ref().zip(k_norm.as_ref()).filter(|_| !whole),
            eps,
            positions: inp.positions,
            cos_sin: match (&self.cos_sin_none, &self.cos_sin_local) {
                (Some(none), _) if c.no_rope_layers.contains(&k) => none,
                (_, Some(local)) if c.layer_window(k).is_some() => local,
                _ => &self.cos_sin,
            },
            slot_mapping: inp.slot_mapping,
            q_out: &buf.q.reshape(&[n, c.num_heads, c.head_dim])?,
            k_cache: kv.k(k),
            v_cache: kv.v(k),
            kv_scale: kv.scale(k),
        })
    }

    /// The seam after piece `layer`: that layer's paged attention, reading the step's
    /// per-sequence metadata (block tables, lengths, `cu_seqlens_q`). With
    /// [`StepInputs::split`], the decode rows and the prefill rows go to two launches.
    pub fn attention(
        &self,
        be: &dyn Backend,
        kv: &KvCache,
        inp: &StepInputs<'_>,
        buf: &StepBuffers,
        layer: usize,
    ) -> Result<()> {
        let c = &self.cfg;
        let (n, nh, hd) = (buf.q.dim(0), c.num_heads, c.head_dim);
        let q = buf.q.reshape(&[n, nh, hd])?;
        let out = buf.attn.reshape(&[n, nh, hd])?;
        let call =
            |q: &Tensor, out: &Tensor, tables: &Tensor, lens: &Tensor, cu: Option<&Tensor>| {
                be.attention(&Attention {
                    q,
                    k_cache: kv.k(layer),
                    v_cache: kv.v(layer),
                    kv_scale: kv.scale(layer),
                    block_tables: tables,
                    seq_lens: lens,
                    cu_seqlens_q: cu,
                    scale: c.attention_scale(),
                    softcap: c.attn_softcap,
                    window: c.layer_window(layer),
                    sinks: self.weights.layers[layer].get(Role::Sinks),
                    out,
                    scratch: &buf.scratch,
                })
            };
        let b = inp.seq_lens.numel();
        match (inp.split, inp.cu_seqlens_q) {
            (Some((d, cu_rest)), Some(_)) if d > 0 && d < b => {
                call(
                    &q.narrow(0, d)?,
                    &out.narrow(0, d)?,
                    &inp.block_tables.narrow(0, d)?,
                    &inp.seq_lens.narrow(0, d)?,
                    None,
                )?;
                call(
                    &q.narrow(d, n - d)?,
                    &out.narrow(d, n - d)?,
                    &inp.block_tables.narrow(d, b - d)?,
                    &inp.seq_lens.narrow(d, b - d)?,
                    Some(cu_rest),
                )
            }
            _ => call(&q, &out, inp.block_tables, inp.seq_lens, inp.cu_seqlens_q),
        }
    }

    /// After the last piece: gather the hidden row of each of the first `rows` entries of
    /// `logits_indices` and project them to f32 logits `[rows, vocab]` (an arena view).
    pub fn head(
        &self,
        be: &dyn Backend,
        inp: &StepInputs<'_>,
        buf: &StepBuffers,
        rows: usize,
    ) -> Result<Tensor> {
        let last = buf.last.prefix(rows)?;
        let logits = buf.logits.prefix(rows)?;
        // The embedding op is a row gather.
        be.embedding(&inp.logits_indices.prefix(rows)?, &buf.normed, &last)?;
        // An EAGLE head: the pre-norm output of each sampled row, the next draft's input.
        if let Some(e) = &self.eagle {
            let next = e.next.prefix(rows)?;
            be.embedding(&inp.logits_indices.prefix(rows)?, &buf.residual, &next)?;
        }
        let lm_head = match self.enter(OpId::LmHead)? {
            Some(mut v) => v.swap_remove(0),
            None => self.weights.lm_head.clone(),
        };
        let size = self.cfg.tp_rank().1;
        if size == 1 {
            be.matmul(&last, &lm_head, None, &logits)?;
            if let Some(cap) = self.cfg.final_softcap {
                be.softcap(&logits, cap)?;
            }
            return Ok(logits);
        }
        // Vocabulary-parallel: this rank's columns, every rank's gathered, interleaved
        // (the padding past the vocabulary dropped).
        let cols = self.cfg.vocab_rows();
        let shard = buf.logits_shard.prefix(rows)?;
        be.matmul(&last, &lm_head, None, &shard)?;
        // Elementwise: each rank caps its own columns.
        if let Some(cap) = self.cfg.final_softcap {
            be.softcap(&shard, cap)?;
        }
        if rows == 1 && size * cols == self.cfg.vocab_size {
            // One row: the shards side by side are already the row's logits.
            be.all_gather(&shard, &logits.reshape(&[size, rows, cols])?)?;
            return Ok(logits);
        }
        let gathered = buf
            .gathered
            .narrow(0, size * rows * cols)?
            .reshape(&[size, rows, cols])?;
        be.all_gather(&shard, &gathered)?;
        be.unshard_columns(&gathered, &logits)?;
        Ok(logits)
    }

    /// Every piece of a step in order, each followed by its attention (all but the
    /// last): the step's whole forward up to the final norm, eagerly or inside one
    /// capture. The one loop over the model's layers; [`Model::head`] follows it.
    pub fn layers(
        &self,
        be: &dyn Backend,
        kv: &KvCache,
        inp: &StepInputs<'_>,
        buf: &StepBuffers,
    ) -> Result<()> {
        let layers = self.weights.layers.len();
        for k in 0..=layers {
            self.piece(be, kv, inp, buf, k)?;
            if k < layers {
                self.attention(be, kv, inp, buf, k)?;
            }
        }
        Ok(())
    }

    /// Run one step eagerly: [`Model::layers`], then the head. Returns f32 logits
    /// `[b, vocab]` (a view into the arena, valid until its next reset).
    pub fn forward(
        &self,
        be: &dyn Backend,
        arena: &mut Arena,
        kv: &KvCache,
        inp: &StepInputs<'_>,
    ) -> Result<Tensor> {
        let n = inp.token_ids.numel();
        let b = inp.seq_lens.numel();
        if inp.block_tables.rank() != 2 {
            return Err(Error::invalid(
                "forward",
                "block_tables must be [b, table_width]",
            ));
        }
        let w = inp.block_tables.dim(1);
        let bs = kv.k(0).dim(1);
        let buf = self.alloc_step(be, arena, n, b, w, bs)?;
        self.layers(be, kv, inp, &buf)?;
        let logits = self.head(be, inp, &buf, b)?;
        // One eager segment: the offload joins the copies it queued.
        if let Some(h) = self.hooks() {
            h.end_segment(be)?;
        }
        Ok(logits)
    }
}
