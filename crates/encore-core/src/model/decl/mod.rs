//! The one declaration of a model's tensors, in forward order: for each device tensor its
//! role, layer, shape, the HF tensors it is made of (with their llama.cpp names), its
//! storage format, its shard rule and the op that reads it.
//!
//! Everything else about the weights is derived from [`Decl`]: the loader's plan
//! ([`crate::model::weights`]), the offload access order
//! ([`crate::offload::AccessOrder::from_decl`]) and the streamed weights' shapes, the
//! parameter and byte counts ([`ModelConfig::num_params`], [`ModelConfig::weight_bytes`]),
//! the GGUF name mapping ([`crate::model::gguf::gguf_name`]), and the typed op ids the
//! forward pass announces ([`OpId`]).
//!
//! # How to add a tensor
//! Add a [`Role`] (its module name, per-layer or not, and its HF and GGUF sources), push it
//! in [`Decl::new`] under the op that reads it (a new op is a [`LayerOp`] or an [`OpId`]
//! variant, placed where it runs), give it a field in
//! [`crate::model::weights::ModelWeights`] (the match in `weights.rs` that hands each role
//! its field), and read it in the forward pass. Loading, offload, counts and op ids follow.
//!
//! # How to add an architecture variant
//! A variant is a config flag read in [`Decl::new`]: an optional tensor is pushed only
//! when the flag is set (as `qkv_bias` and `qk_norm` are), a different shape is computed
//! there. The kernels that honour the variant read it from the config.
//!
//! # How to add a weight format
//! Add a [`WeightFormat`] variant with its byte count ([`WeightFormat::bytes`]) and set it
//! on the tensors that use it in [`Decl::new`]; budgets, floors and offload count those
//! bytes. The loader and the matmul kernels then learn to read that format.

use encore_backend::quant::QuantFormat;

use crate::error::{Error, Result};
use crate::model::config::{Arch, ModelConfig, MoeConfig, NormKind};
use crate::model::formats::WeightFormats;
use crate::tensor::DType;

mod builder;
mod gguf_names;
use builder::Builder;
pub use gguf_names::{gguf_name, gguf_source, gguf_source_of};

/// One HF tensor of the checkpoint layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// HF name, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub name: String,
    /// Its shape in the checkpoint.
    pub shape: Vec<usize>,
    /// The part of it this rank holds (tensor parallelism); `None`: all of it.
    pub slice: Option<Slice>,
}

/// The block of an HF tensor one rank holds: `rows` rows from `row`, and `cols` columns
/// from `col` (all columns of a 1-D tensor or a row split), then `pad` rows of zeros (the
/// vocabulary padding of the last ranks, so every rank's shard has the same rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Slice {
    pub row: usize,
    pub rows: usize,
    pub col: usize,
    pub cols: usize,
    pub pad: usize,
}

impl TensorSpec {
    /// Elements of the whole checkpoint tensor.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The shape this rank holds (the checkpoint's shape when unsliced).
    pub fn local_shape(&self) -> Vec<usize> {
        match (self.slice, self.shape.len()) {
            (None, _) => self.shape.clone(),
            (Some(s), 1) => vec![s.rows + s.pad],
            (Some(s), _) => vec![s.rows + s.pad, s.cols],
        }
    }
}

/// One HF source tensor of a [`Role`]: its HF name and its llama.cpp name, both without
/// the layer prefix (`model.layers.N.` and `blk.N.` for per-layer roles).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Source {
    pub hf: &'static str,
    pub gguf: &'static str,
}

/// A [`Source`] literal (a struct expression, so the tables below are promoted statics).
macro_rules! src {
    ($hf:literal, $gguf:literal) => {
        Source {
            hf: $hf,
            gguf: $gguf,
        }
    };
}

// After `src!`, which its tables use.
mod role;
pub use role::Role;

/// Phi-3's fused q/k/v and gate/up projections (HF and llama.cpp names), which hold the
/// rows of [`Role::Qkv`] and [`Role::GateUp`] in one tensor each.
pub const FUSED_QKV: Source = src!("self_attn.qkv_proj.weight", "attn_qkv.weight");
pub const FUSED_GATE_UP: Source = src!("mlp.gate_up_proj.weight", "ffn_up.weight");

/// Gemma's MLP input norm (the [`Role::MlpNorm`] of a model with post norms), which
/// llama.cpp calls `ffn_norm` as it does Llama's `post_attention_layernorm`.
pub const PRE_FFN_NORM: Source = src!("pre_feedforward_layernorm.weight", "ffn_norm.weight");

/// How a tensor's values are stored on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WeightFormat {
    /// Dense, in the run dtype (bf16, f16 or f32).
    #[default]
    Dense,
    /// Block-quantized along its rows (GGUF's Q8_0 .. Q6_K, FP8 with block scales), in the
    /// device layout of [`encore_backend::quant`].
    Quant(QuantFormat),
    /// i32 indices, whatever the run dtype (a GPTQ act-order layer's column permutations,
    /// [`Role::QkvPerm`] ..).
    Index,
}

impl WeightFormat {
    /// The device dtype of a tensor in this format for a run in `dtype`.
    pub fn dtype(self, dtype: DType) -> DType {
        match self {
            WeightFormat::Dense => dtype,
            WeightFormat::Quant(f) => DType::Q(f),
            WeightFormat::Index => DType::I32,
        }
    }

    /// Device bytes of a `shape` tensor in this format for a run in `dtype` (0 for a
    /// quantized shape that is not whole blocks, which [`ModelConfig::check_formats`]
    /// refuses before anything loads).
    pub fn bytes(self, shape: &[usize], dtype: DType) -> usize {
        self.dtype(dtype).bytes(shape).unwrap_or(0)
    }
}

impl std::fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WeightFormat::Dense => f.write_str("dense"),
            WeightFormat::Quant(q) => f.write_str(q.name()),
            WeightFormat::Index => f.write_str("i32"),
        }
    }
}

/// How a tensor is split over the ranks of a tensor-parallel group (Megatron's rules).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Shard {
    /// Every rank holds all of it (norms; every tensor on one device).
    #[default]
    Replicated,
    /// Column-parallel (qkv, gate/up): each part's output rows split in units of `unit`
    /// rows (a head's rows for q/k/v, a block of the down projection's format for
    /// gate/up), rank `r` taking units `r * units / size..(r + 1) * units / size` (shares
    /// differ by at most one unit where the units do not divide); a part of fewer units
    /// than ranks (KV heads) gives rank `r` unit `r * units / size`, replicated over the
    /// ranks that share it.
    Column { unit: usize },
    /// Row-parallel (o, down): the input columns split in units of `unit` columns (a
    /// head's for o, a block of the format for down), as `Column` splits rows; the
    /// outputs are partial sums the forward all-reduces.
    Row { unit: usize },
    /// Vocabulary-parallel (embedding, LM head): rank `r` holds rows `r * v..(r + 1) * v`
    /// of the vocabulary, `v = ceil(vocab / size)`, the rows past the vocabulary zeros
    /// (vLLM's padding: any vocabulary shards).
    Vocab,
    /// A row-parallel projection's bias (gpt-oss's o_proj and experts' down biases): rank
    /// 0 holds it, every other rank zeros of its shape, so the partial sums' all-reduce
    /// adds it once (each rank's forward is the same: a bias add).
    FirstRank,
}

impl Shard {
    /// The block of a `rows x cols` part rank `rank` of `size` holds.
    fn slice(self, rank: usize, size: usize, rows: usize, cols: usize) -> Slice {
        let (row, rows, col, cols) = match self {
            Shard::Replicated => (0, rows, 0, cols),
            Shard::Vocab => {
                let v = rows.div_ceil(size);
                let row = (rank * v).min(rows);
                let n = v.min(rows - row);
                return Slice {
                    row,
                    rows: n,
                    col: 0,
                    cols,
                    pad: v - n,
                };
            }
            Shard::Row { unit } => {
                let (c, n) = share(rank, size, cols, unit);
                (0, rows, c, n)
            }
            Shard::FirstRank if rank > 0 => {
                return Slice {
                    row: 0,
                    rows: 0,
                    col: 0,
                    cols,
                    pad: rows,
                };
            }
            Shard::FirstRank => (0, rows, 0, cols),
            Shard::Column { unit } => {
                let units = rows / unit.max(1);
                if units >= size {
                    let (r, n) = share(rank, size, rows, unit);
                    (r, n, 0, cols)
                } else {
                    (rank * units / size * unit, unit, 0, cols)
                }
            }
        };
        Slice {
            row,
            rows,
            col,
            cols,
            pad: 0,
        }
    }
}

/// Rank `rank`'s share of `n` split over `size` ranks in units of `unit`: its first index
/// and its length, units `rank * units / size..(rank + 1) * units / size` (`n / size`
/// each where the units divide; at most one unit apart where they do not).
pub fn share(rank: usize, size: usize, n: usize, unit: usize) -> (usize, usize) {
    let unit = unit.max(1);
    let units = n / unit;
    let (a, b) = (rank * units / size, (rank + 1) * units / size);
    (a * unit, (b - a) * unit)
}

/// One op of a decoder layer that reads weights, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerOp {
    InputNorm,
    Qkv,
    OProj,
    PostNorm,
    GateUp,
    Down,
}

impl LayerOp {
    pub const ALL: [LayerOp; 6] = [
        LayerOp::InputNorm,
        LayerOp::Qkv,
        LayerOp::OProj,
        LayerOp::PostNorm,
        LayerOp::GateUp,
        LayerOp::Down,
    ];

    pub fn name(self) -> &'static str {
        match self {
            LayerOp::InputNorm => "input_norm",
            LayerOp::Qkv => "qkv",
            LayerOp::OProj => "o_proj",
            LayerOp::PostNorm => "post_norm",
            LayerOp::GateUp => "gate_up",
            LayerOp::Down => "down",
        }
    }
}

/// A weight-reading op of the forward step, which the forward announces to the offload
/// executor before it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpId {
    Embed,
    Layer(usize, LayerOp),
    FinalNorm,
    LmHead,
}

impl OpId {
    /// The op's position in the step ([`Decl::ops`], the offload access order) for a
    /// model of `num_layers` layers.
    pub fn index(self, num_layers: usize) -> usize {
        let per_layer = LayerOp::ALL.len();
        match self {
            OpId::Embed => 0,
            OpId::Layer(layer, op) => 1 + per_layer * layer + op as usize,
            OpId::FinalNorm => 1 + per_layer * num_layers,
            OpId::LmHead => 2 + per_layer * num_layers,
        }
    }

    /// The op's name in offload reports and errors, e.g. `layers.3.qkv`.
    pub fn name(self) -> String {
        match self {
            OpId::Embed => "embed".into(),
            OpId::Layer(layer, op) => format!("layers.{layer}.{}", op.name()),
            OpId::FinalNorm => "norm".into(),
            OpId::LmHead => "lm_head".into(),
        }
    }
}

/// One declared device tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorDecl {
    pub role: Role,
    /// The decoder layer of a per-layer role.
    pub layer: Option<usize>,
    pub shape: Vec<usize>,
    /// The HF tensors stacked along the first dimension into it, in row order.
    pub parts: Vec<TensorSpec>,
    pub format: WeightFormat,
    pub shard: Shard,
    /// The first op that reads it.
    pub op: OpId,
}

impl TensorDecl {
    /// The device tensor's name, e.g. `model.layers.0.self_attn.qkv_proj`.
    pub fn name(&self) -> String {
        match self.layer {
            Some(l) => format!("model.layers.{l}.{}", self.role.module()),
            None => self.role.module().to_string(),
        }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Device bytes in the run dtype `dtype`.
    pub fn bytes(&self, dtype: DType) -> usize {
        self.format.bytes(&self.shape, dtype)
    }

    /// The device dtype for a run in `dtype` (the run dtype, or the quantized format).
    pub fn dtype(&self, dtype: DType) -> DType {
        self.format.dtype(dtype)
    }

    /// Device bytes of part `k` (its rows of the tensor).
    pub fn part_bytes(&self, k: usize, dtype: DType) -> usize {
        self.format.bytes(&self.parts[k].local_shape(), dtype)
    }
}

/// One declared op and the tensors it reads (indices into [`Decl::tensors`]), in the
/// order the forward pass reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpDecl {
    pub op: OpId,
    pub reads: Vec<usize>,
}

/// A model's tensors and the ops reading them, both in forward order (see the module
/// docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decl {
    tensors: Vec<TensorDecl>,
    ops: Vec<OpDecl>,
}

impl Decl {
    /// The Llama family (Llama, Mistral, Qwen2, Qwen3) as `model/llama.rs` runs it:
    /// embedding; per layer input norm, qkv (with its bias and q/k head norms when the
    /// config has them), o, post norm, gate/up, down; final norm; lm_head, which reads
    /// the embedding again when the embeddings are tied.
    ///
    /// An EAGLE-3 head ([`ModelConfig::eagle`]) declares `fc` where the embedding would be
    /// (it shares the target's), `hidden_norm` beside its one layer's input norm, q/k/v
    /// of `2 * hidden` columns, and the checkpoint's names (`midlayer.*`, `norm.weight`,
    /// `fc.weight`, `lm_head.weight` over the draft vocabulary).
    pub fn new(cfg: &ModelConfig) -> Decl {
        // The whole model's shapes (a tensor-parallel rank's parts are blocks of them).
        let (heads, kv_heads) = cfg.whole_heads();
        let (h, hd, vocab) = (cfg.hidden_size, cfg.head_dim, cfg.vocab_size);
        let inter = cfg
            .tp
            .map_or(cfg.intermediate_size, |t| t.intermediate_size);
        let (q, kv) = (heads * hd, kv_heads * hd);
        let mut d = Builder::new(cfg.num_layers, &cfg.weights, cfg.tp_rank());
        // The MLP splits in blocks of the down projection's format (1 when dense), so
        // that every rank's share of a down row is whole blocks.
        let mlp_unit = cfg.tp.map_or(1, |t| t.mlp_unit);
        let (col, head_col) = (Shard::Column { unit: mlp_unit }, Shard::Column { unit: hd });
        let (row, head_row) = (Shard::Row { unit: mlp_unit }, Shard::Row { unit: hd });
        use Shard::{Replicated as Rep, Vocab};
        let eagle = cfg.eagle.as_ref();
        d.op(OpId::Embed);
        let embed = match eagle {
            None => Some(d.tensor(Role::Embedding, None, &[vocab], Some(h), Vocab)),
            Some(e) => {
                d.tensor(Role::EagleFc, None, &[h], Some(3 * e.target_hidden), Rep);
                None
            }
        };
        let qkv_cols = if eagle.is_some() { 2 * h } else { h };
        // LayerNorms: each norm's bias, read with its weight.
        let norm_bias = cfg.norm_kind == NormKind::LayerBias;
        for l in 0..cfg.num_layers {
            let (at, layer) = (|op| OpId::Layer(l, op), Some(l));
            d.op(at(LayerOp::InputNorm));
            if cfg.pre_norms() {
                d.tensor(Role::AttnNorm, layer, &[h], None, Rep);
                if norm_bias {
                    d.tensor(Role::AttnNormBias, layer, &[h], None, Rep);
                }
            }
            if eagle.is_some() {
                d.tensor(Role::HiddenNorm, layer, &[h], None, Rep);
            }
            d.op(at(LayerOp::Qkv));
            if cfg.arch.family().fused_projections {
                // One fused `qkv_proj` (q, k, v rows in our order; a rank's shares cut out).
                d.tensor_fused(
                    Role::Qkv,
                    layer,
                    FUSED_QKV.hf,
                    &[q, kv, kv],
                    Some(qkv_cols),
                    head_col,
                );
            } else {
                d.tensor(Role::Qkv, layer, &[q, kv, kv], Some(qkv_cols), head_col);
            }
            if cfg.qkv_bias {
                d.tensor(Role::QkvBias, layer, &[q, kv, kv], None, head_col);
            }
            if cfg.arch.family().sinks {
                // Read by attention, announced with q/k/v; a rank holds its heads' sinks.
                d.tensor(
                    Role::Sinks,
                    layer,
                    &[heads],
                    None,
                    Shard::Column { unit: 1 },
                );
            }
            // GPTQ act order: each projection's input permutation, read last by its op.
            let act_order = cfg.weights.int_packing.is_some_and(|p| p.act_order);
            if act_order {
                d.perm(Role::QkvPerm, l, qkv_cols);
            }
            if cfg.qk_norm_whole() {
                // Across every head: a rank would need the others' (TP refuses it).
                d.tensor(Role::QNorm, layer, &[q], None, Rep);
                d.tensor(Role::KNorm, layer, &[kv], None, Rep);
            } else if cfg.qk_norm {
                d.tensor(Role::QNorm, layer, &[hd], None, Rep);
                d.tensor(Role::KNorm, layer, &[hd], None, Rep);
            }
            d.op(at(LayerOp::OProj));
            d.tensor(Role::OProj, layer, &[h], Some(q), head_row);
            if cfg.o_bias {
                d.tensor(Role::OProjBias, layer, &[h], None, Shard::FirstRank);
            }
            // Post norms (Gemma): the attention's output normed, read with o_proj; the MLP's
            // input norm is then HF's `pre_feedforward_layernorm`.
            if cfg.post_norms {
                let name = [("post_attention_layernorm.weight".to_string(), h)];
                d.tensor_from(Role::AttnOutNorm, layer, &name, None, Rep);
            }
            if act_order {
                let o = d.cols_of(Role::OProj, l);
                d.perm(Role::OProjPerm, l, o);
            }
            d.op(at(LayerOp::PostNorm));
            if !cfg.pre_norms() {
                // No norm before the MLP (OLMo 2).
            } else if cfg.post_norms {
                let name = [(PRE_FFN_NORM.hf.to_string(), h)];
                d.tensor_from(Role::MlpNorm, layer, &name, None, Rep);
            } else {
                d.tensor(Role::MlpNorm, layer, &[h], None, Rep);
                if norm_bias {
                    d.tensor(Role::MlpNormBias, layer, &[h], None, Rep);
                }
            }
            match &cfg.moe {
                Some(moe) if moe.is_sparse(l) => {
                    let widths = cfg.whole_expert_widths().expect("a model with experts");
                    let units = cfg.tp.map_or((1, 1), |t| (t.expert_unit, t.shared_unit));
                    d.experts(cfg.arch, moe, widths, units, l, h)
                }
                _ => {
                    d.op(at(LayerOp::GateUp));
                    if cfg.arch.family().fused_projections {
                        // One fused `gate_up_proj`: gate rows, then up rows.
                        let gu = [inter, inter];
                        d.tensor_fused(Role::GateUp, layer, FUSED_GATE_UP.hf, &gu, Some(h), col);
                    } else {
                        d.tensor(Role::GateUp, layer, &[inter, inter], Some(h), col);
                    }
                    if act_order {
                        d.perm(Role::GateUpPerm, l, h);
                    }
                    d.op(at(LayerOp::Down));
                    d.tensor(Role::Down, layer, &[h], Some(inter), row);
                    if cfg.post_norms {
                        let name = [("post_feedforward_layernorm.weight".to_string(), h)];
                        d.tensor_from(Role::MlpOutNorm, layer, &name, None, Rep);
                    }
                    if act_order {
                        let k = d.cols_of(Role::Down, l);
                        d.perm(Role::DownPerm, l, k);
                    }
                }
            }
        }
        d.op(OpId::FinalNorm);
        d.tensor(Role::FinalNorm, None, &[h], None, Rep);
        if norm_bias {
            d.tensor(Role::FinalNormBias, None, &[h], None, Rep);
        }
        d.op(OpId::LmHead);
        match embed {
            Some(embed) if cfg.tie_word_embeddings => d.read_again(embed),
            _ => {
                d.tensor(Role::LmHead, None, &[vocab], Some(h), Vocab);
            }
        }
        let mut decl = d.decl;
        if eagle.is_some() {
            // The published heads' names: the layer is `midlayer`, the norm top-level.
            for part in decl.tensors.iter_mut().flat_map(|t| t.parts.iter_mut()) {
                if let Some(rest) = part.name.strip_prefix("model.layers.0.") {
                    part.name = format!("midlayer.{rest}");
                } else if let Some(rest) = part.name.strip_prefix("model.") {
                    part.name = rest.to_string();
                }
            }
        }
        decl
    }

    /// The device tensors, in the order they are first read (the loader's order).
    pub fn tensors(&self) -> &[TensorDecl] {
        &self.tensors
    }

    /// The weight-reading ops, in the order they run ([`OpId::index`] is the position).
    pub fn ops(&self) -> &[OpDecl] {
        &self.ops
    }

    /// Every HF tensor, in load order.
    pub fn hf_tensors(&self) -> impl Iterator<Item = &TensorSpec> {
        self.tensors.iter().flat_map(|t| &t.parts)
    }

    /// Parameters of all tensors (each counted once: a tied embedding once).
    pub fn num_params(&self) -> usize {
        self.tensors.iter().map(TensorDecl::numel).sum()
    }

    /// Device bytes of all tensors for a run in `dtype`.
    pub fn bytes(&self, dtype: DType) -> usize {
        self.tensors.iter().map(|t| t.bytes(dtype)).sum()
    }

    /// Device bytes a decode step reads for a run in `dtype`: every tensor but an
    /// embedding table only the embedding op reads (it gathers a few rows; a tied table
    /// is read whole by the LM head). The weight-bandwidth floor of a step.
    pub fn step_read_bytes(&self, dtype: DType) -> usize {
        let readers = |w: usize| self.ops.iter().filter(|o| o.reads.contains(&w)).count();
        self.tensors
            .iter()
            .enumerate()
            .filter(|&(w, t)| !(t.role == Role::Embedding && readers(w) == 1))
            .map(|(_, t)| t.bytes(dtype))
            .sum()
    }

    /// Device bytes of the routed experts' stacks for a run in `dtype` (of which a decode
    /// step reads only the experts its rows are routed to).
    pub fn expert_bytes(&self, dtype: DType) -> usize {
        self.tensors
            .iter()
            .filter(|t| matches!(t.role, Role::ExpertsGateUp | Role::ExpertsDown))
            .map(|t| t.bytes(dtype))
            .sum()
    }

    /// One line of the weights by storage format for a run in `dtype`, e.g.
    /// `1.21 GB: q4_k 0.95 GB (128 tensors), q6_k 0.07 GB (2), bf16 0.19 GB (67)`.
    pub fn format_summary(&self, dtype: DType) -> String {
        let gb = |b: usize| b as f64 / 1e9;
        let parts: Vec<String> = self
            .bytes_by_format(dtype)
            .iter()
            .map(|(f, n, b)| {
                let name = match f {
                    WeightFormat::Dense => dtype.to_string(),
                    WeightFormat::Quant(q) => q.to_string(),
                    WeightFormat::Index => "i32".to_string(),
                };
                format!("{name} {:.2} GB ({n} tensors)", gb(*b))
            })
            .collect();
        format!("{:.2} GB: {}", gb(self.bytes(dtype)), parts.join(", "))
    }

    /// `(format, tensors, bytes)` per storage format, dense first (the start-up line and
    /// `encore info` show it).
    pub fn bytes_by_format(&self, dtype: DType) -> Vec<(WeightFormat, usize, usize)> {
        let mut out: Vec<(WeightFormat, usize, usize)> = Vec::new();
        for t in &self.tensors {
            match out.iter_mut().find(|(f, _, _)| *f == t.format) {
                Some(e) => {
                    e.1 += 1;
                    e.2 += t.bytes(dtype);
                }
                None => out.push((t.format, 1, t.bytes(dtype))),
            }
        }
        out.sort_by_key(|(f, _, _)| !matches!(f, WeightFormat::Dense));
        out
    }
}

impl ModelConfig {
    /// The declaration of this config's tensors ([`Decl::new`]).
    pub fn decl(&self) -> Decl {
        Decl::new(self)
    }

    /// Total parameters, the embedding counted once when tied.
    pub fn num_params(&self) -> usize {
        self.decl().num_params()
    }

    /// Bytes of all weights for a run in `dtype` (quantized tensors in their format).
    pub fn weight_bytes(&self, dtype: DType) -> usize {
        self.decl().bytes(dtype)
    }

    /// Every quantized tensor's rows must be whole blocks of its format: an error naming
    /// the first tensor that is not.
    pub fn check_formats(&self) -> Result<()> {
        for t in self.decl().tensors() {
            if let WeightFormat::Quant(f) = t.format {
                let k = t.shape.last().copied().unwrap_or(0);
                if f.row_bytes(k).is_none() {
                    let share = match self.tp {
                        Some(tp) => format!(" (its share over {} tensor-parallel ranks)", tp.size),
                        None => String::new(),
                    };
                    return Err(Error::Weights {
                        tensor: t.name(),
                        what: format!(
                            "has rows of {k} values{share}, which {f} (blocks of {}) cannot hold",
                            f.block_elems()
                        ),
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
