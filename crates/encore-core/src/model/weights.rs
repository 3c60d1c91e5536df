//! Model weights on a backend, loaded from an HF safetensors checkpoint (one file or
//! sharded through an index), from a GGUF file (dequantized, see [`super::gguf`]) or
//! generated as seeded dummy weights.
//!
//! What loads is the declaration of the config's tensors ([`super::decl::Decl`]): each
//! device tensor and the HF tensors it is made of. Loading is two passes. First every HF
//! tensor the declaration names is checked by name, shape and dtype ([`Error::Weights`] naming the first bad one), before anything is allocated.
//! Then tensors are uploaded one HF tensor at a time: q/k/v (and gate/up) are merged by
//! writing each part into its rows of the merged device tensor, so the host holds at most
//! one converted HF tensor (nothing at all when the file already has the run dtype).

mod act_order;
mod checkpoint;
mod fused_experts;
mod host;
mod host_side;
mod packed_int;
mod quantized;

use std::path::PathBuf;
use std::time::Instant;

pub(crate) use self::checkpoint::natural_key;
pub use self::checkpoint::read_kv_scales;
use self::checkpoint::Checkpoint;
use self::host::Staging;
use self::host_side::HostSide;
use super::arch::QkvBias;
use super::config::ModelConfig;
use super::decl::{Decl, Role, TensorDecl};
pub use super::decl::{Slice, TensorSpec};
use super::gguf::{GgufFile, GgufWeights};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::offload::{HostWeights, Place, Prepared};
use crate::progress::{Progress, Unit};
use crate::tensor::{DType, Tensor};

/// One decoder layer's weights, in the run dtype: one slot a per-layer [`Role`] of the
/// declaration (`model/decl/`), filled by the loader. The accessors name what the forward
/// reads; a role they do not name is read with [`LayerWeights::get`]. A layer holds its
/// q/k/v and o projections and a whole MLP (dense, or a router with the experts' stacks);
/// the rest is as the family declares it.
#[derive(Clone)]
pub struct LayerWeights {
    slots: Vec<Option<Tensor>>,
}

/// Qwen2-MoE's shared expert (see [`LayerWeights::shared`]).
#[derive(Clone)]
pub struct SharedExpert {
    pub gate_up: Tensor,
    pub gate: Tensor,
    pub down: Tensor,
}

impl LayerWeights {
    /// A layer from its slots (one a role, [`Role::ALL`]'s order), checked whole: q/k/v,
    /// o and a dense MLP or a router with both expert stacks, a shared expert whole or
    /// absent.
    fn from_slots(slots: Vec<Option<Tensor>>) -> Result<LayerWeights> {
        let l = LayerWeights { slots };
        let has = |r: Role| l.get(r).is_some();
        let mlp = match has(Role::Router) {
            true => [Role::ExpertsGateUp, Role::ExpertsDown],
            false => [Role::GateUp, Role::Down],
        };
        let shared = [Role::SharedGateUp, Role::SharedGate, Role::SharedDown];
        let shared_ok = shared.iter().all(|&r| has(r)) || !shared.iter().any(|&r| has(r));
        let missing = [Role::Qkv, Role::OProj]
            .into_iter()
            .chain(mlp)
            .find(|&r| !has(r));
        match (missing, shared_ok) {
            (Some(r), _) => Err(Error::invalid(
                "weights",
                format!("no {r:?} tensor is declared"),
            )),
            (None, false) => Err(Error::invalid(
                "weights",
                "a shared expert needs its gate/up, gate and down",
            )),
            (None, true) => Ok(l),
        }
    }

    /// The tensor of role `role`, if the layer has one.
    pub fn get(&self, role: Role) -> Option<&Tensor> {
        self.slots.get(slot(role)).and_then(Option::as_ref)
    }

    /// A role [`LayerWeights::from_slots`] checked is there.
    fn held(&self, role: Role) -> &Tensor {
        self.get(role).expect("checked when the layer was built")
    }

    /// The same layer with every tensor passed through `f`.
    pub fn try_map(&self, mut f: impl FnMut(Role, &Tensor) -> Result<Tensor>) -> Result<Self> {
        let slots = Role::ALL
            .iter()
            .zip(&self.slots)
            .map(|(&r, t)| t.as_ref().map(|t| f(r, t)).transpose())
            .collect::<Result<Vec<_>>>()?;
        Ok(LayerWeights { slots })
    }

    /// `[hidden]` (`None`: no norm before attention, OLMo 2).
    pub fn input_norm(&self) -> Option<&Tensor> {
        self.get(Role::AttnNorm)
    }

    /// An EAGLE-3 head's norm of its input hidden state `[hidden]`.
    pub fn hidden_norm(&self) -> Option<&Tensor> {
        self.get(Role::HiddenNorm)
    }

    /// `[(num_heads + 2 * num_kv_heads) * head_dim, hidden]`: q rows, then k, then v.
    pub fn qkv(&self) -> &Tensor {
        self.held(Role::Qkv)
    }

    /// `[(num_heads + 2 * num_kv_heads) * head_dim]`, same order (Qwen2).
    pub fn qkv_bias(&self) -> Option<&Tensor> {
        self.get(Role::QkvBias)
    }

    /// `[head_dim]` (Qwen3); `[num_heads * head_dim]` across the heads (OLMo 2).
    pub fn q_norm(&self) -> Option<&Tensor> {
        self.get(Role::QNorm)
    }

    /// `[head_dim]` (Qwen3); `[num_kv_heads * head_dim]` (OLMo 2).
    pub fn k_norm(&self) -> Option<&Tensor> {
        self.get(Role::KNorm)
    }

    /// `[hidden, num_heads * head_dim]`.
    pub fn o_proj(&self) -> &Tensor {
        self.held(Role::OProj)
    }

    /// The MLP's input norm `[hidden]` (HF `post_attention_layernorm`; Gemma's
    /// `pre_feedforward_layernorm`). `None`: no norm before the MLP (OLMo 2).
    pub fn post_norm(&self) -> Option<&Tensor> {
        self.get(Role::MlpNorm)
    }

    /// Post norms (`ModelConfig::post_norms`): the attention's output, RMS-normed before
    /// the residual add, `[hidden]`.
    pub fn attn_out_norm(&self) -> Option<&Tensor> {
        self.get(Role::AttnOutNorm)
    }

    /// Post norms: the MLP's output norm `[hidden]`.
    pub fn mlp_out_norm(&self) -> Option<&Tensor> {
        self.get(Role::MlpOutNorm)
    }

    /// A sparse layer's router `[experts, hidden]`.
    pub fn router(&self) -> Option<&Tensor> {
        self.get(Role::Router)
    }

    /// `[2 * intermediate, hidden]`: gate rows, then up rows. In a sparse layer (with a
    /// router), every expert's gate rows then every expert's up rows,
    /// `[2 * experts * expert_intermediate, hidden]`.
    pub fn gate_up(&self) -> &Tensor {
        match self.router() {
            Some(_) => self.held(Role::ExpertsGateUp),
            None => self.held(Role::GateUp),
        }
    }

    /// `[hidden, intermediate]`; in a sparse layer the experts' stacked,
    /// `[experts * hidden, expert_intermediate]`.
    pub fn down(&self) -> &Tensor {
        match self.router() {
            Some(_) => self.held(Role::ExpertsDown),
            None => self.held(Role::Down),
        }
    }

    /// Qwen2-MoE's shared expert of a sparse layer: gate/up `[2 * S, hidden]` (gate rows,
    /// then up rows), its gate `[1, hidden]` and down `[hidden, S]`.
    pub fn shared(&self) -> Option<SharedExpert> {
        Some(SharedExpert {
            gate_up: self.get(Role::SharedGateUp)?.clone(),
            gate: self.get(Role::SharedGate)?.clone(),
            down: self.get(Role::SharedDown)?.clone(),
        })
    }
}

/// All weights of a model, on one backend, in one dtype.
pub struct ModelWeights {
    /// `[vocab, hidden]`.
    pub embed: Tensor,
    pub layers: Vec<LayerWeights>,
    /// `[hidden]`, and its bias for a LayerNorm (`ModelConfig::norm_kind`).
    pub norm: Tensor,
    pub norm_bias: Option<Tensor>,
    /// `[vocab, hidden]`; the same tensor as `embed` (same storage) when tied.
    pub lm_head: Tensor,
    /// An EAGLE-3 head's `fc` `[hidden, 3 * target_hidden]`. A head's `embed` is the
    /// target's, set by [`crate::model::llama::Model::enable_eagle`] (until then a
    /// placeholder the forward refuses).
    pub eagle_fc: Option<Tensor>,
    pub dtype: DType,
}

/// Where the weights come from (an owned value: it can be handed to another thread).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WeightSource {
    /// An HF model directory (`model.safetensors`, or `model.safetensors.index.json` and
    /// its shards, or else every `*.safetensors` file in it), or one `.safetensors` file.
    Dir(PathBuf),
    /// A GGUF file (llama.cpp's format): its tensors are dequantized to f32, and q/k rows
    /// of architecture `llama` are put back in HF order.
    Gguf(PathBuf),
    /// Seeded random weights, deterministic for a seed (see [`load`]).
    Dummy { seed: u64 },
}

/// An optional 1-D int64 tensor `name` of the checkpoint at `path` (a directory or a
/// `.safetensors` file, as [`WeightSource::Dir`]); `None` when it has none.
pub fn read_i64_tensor(path: &std::path::Path, name: &str) -> Result<Option<Vec<i64>>> {
    Checkpoint::open(path)?.read_i64(name)
}

/// Every HF tensor `cfg` implies, in load order (`lm_head.weight` only when untied).
pub fn hf_tensors(cfg: &ModelConfig) -> Vec<TensorSpec> {
    cfg.decl().hf_tensors().cloned().collect()
}

/// Load `cfg`'s weights onto `backend` in the float dtype `dtype`.
///
/// Checkpoint tensors may be bf16, f16 or f32; they are converted on the host (rounding
/// to nearest even). Tensors the config does not use (`rotary_emb.inv_freq`, `lm_head`
/// when tied) are ignored. `progress` counts the bytes uploaded.
///
/// Dummy weights are drawn per HF tensor from a hash of `(seed, name, index)`, so they
/// do not depend on the dtype, the backend or the thread count: projections have std
/// `1/sqrt(fan_in)`, the embedding and `lm_head` std `1/sqrt(hidden)` (logits of std ~1),
/// norms `1 ± 0.02`, biases std 0.02.
pub fn load(
    backend: &dyn Backend,
    cfg: &ModelConfig,
    source: WeightSource,
    dtype: DType,
    progress: &dyn Progress,
) -> Result<ModelWeights> {
    load_placed(backend, cfg, source, dtype, None, progress).map(|(w, _)| w)
}

/// [`load`] under a weight budget: the weights `prepared` streams get its device views
/// (ring slots or the LRU pool) and their bytes go to host memory the device copies from
/// — the checkpoint's own mapping, registered read-only in place, where a tensor is
/// stored in the run dtype; a page-locked copy otherwise (dtype conversion, GGUF, dummy
/// weights). Resident weights load as [`load`] loads them.
pub fn load_offloaded(
    backend: &dyn Backend,
    cfg: &ModelConfig,
    source: WeightSource,
    dtype: DType,
    prepared: &Prepared,
    progress: &dyn Progress,
) -> Result<(ModelWeights, HostWeights)> {
    load_placed(backend, cfg, source, dtype, Some(prepared), progress)
}

fn load_placed(
    backend: &dyn Backend,
    cfg: &ModelConfig,
    source: WeightSource,
    dtype: DType,
    prepared: Option<&Prepared>,
    progress: &dyn Progress,
) -> Result<(ModelWeights, HostWeights)> {
    if !dtype.is_float() {
        return Err(Error::invalid(
            "weights::load",
            format!("run dtype {dtype} is not a float dtype (bf16, f16 or f32)"),
        ));
    }
    let (source, what, decl) = match source {
        WeightSource::Dir(path) => {
            let mut ck = Checkpoint::open(&path)?;
            ck.int_packing = cfg.weights.int_packing;
            if cfg
                .arch
                .family()
                .experts
                .is_some_and(|e| e.fused_interleaved)
            {
                ck.fused = fused_experts::FusedExperts::of(&ck, cfg)?;
            }
            // Before the declaration, which holds every layer's names: a corrupt layer
            // count must not make the loader build millions of them (an EAGLE head has
            // one, `midlayer`).
            if cfg.eagle.is_none() {
                ck.check_layer_count(cfg.num_layers)?;
            }
            let decl = cfg.decl();
            let specs: Vec<&TensorSpec> = decl.hf_tensors().collect();
            ck.validate(&specs, |name| ignored_tensor(cfg, name))?;
            check_o_proj_bias(&ck, cfg)?;
            (Source::Checkpoint(ck), "loading weights", decl)
        }
        WeightSource::Gguf(path) => {
            let weights = GgufWeights::new(GgufFile::open(&path)?, cfg)?;
            let decl = cfg.decl();
            let specs: Vec<&TensorSpec> = decl.hf_tensors().collect();
            weights.validate(&specs)?;
            (Source::Gguf(weights), "dequantizing GGUF weights", decl)
        }
        WeightSource::Dummy { seed } => (
            Source::Dummy { seed },
            "generating dummy weights",
            cfg.decl(),
        ),
    };

    cfg.check_formats()?;
    cfg.check_runs(backend.runs_moe())?;
    // GPTQ act order's permutations are made at load, never streamed.
    if prepared.is_some() && cfg.weights.int_packing.is_some_and(|p| p.act_order) {
        return Err(Error::Config {
            path: cfg.arch.model_type().to_string(),
            what: "weight offload (--weight-budget) of GPTQ activation order (desc_act with \
                   groups) is not supported yet"
                .into(),
        });
    }
    if let (Some(p), Some(what)) = (prepared, cfg.unstreamed()) {
        if p.policy == crate::offload::Policy::Lru {
            return Err(Error::Config {
                path: cfg.arch.model_type().to_string(),
                what: format!(
                    "weight offload (--weight-budget) of {what} under --offload-policy lru \
                     is not supported yet (use `experts` or `planned`)"
                ),
            });
        }
    }
    let total = decl.bytes(dtype);
    let mut host = match prepared {
        Some(p) => HostSide::new(backend, &decl, &source, dtype, p, progress)?,
        None => HostSide::default(),
    };
    let bar = crate::progress::Guard::start(progress, what, total as u64, Unit::Bytes);
    let mut done = 0u64;
    let start = Instant::now();
    let mut staging = Staging::default();
    let weights = build(&decl, dtype, |i, m| {
        if m.role.permutes().is_some() {
            // GPTQ act order's permutation, from the g_idx (offload refuses act order).
            let perm = act_order::perm(&source, &decl, m)?;
            return backend.upload(&perm, &m.shape);
        }
        let place = prepared.map_or(Place::Device, |p| p.place[i].clone());
        let mdt = m.dtype(dtype);
        // llama.cpp's converter stores Gemma's norms as 1 + w already; the query scale
        // goes into q's norm from either.
        let plus_one = cfg.norm_plus_one && m.role.is_norm() && !matches!(source, Source::Gguf(_));
        let query = match m.role {
            Role::QNorm if cfg.query_scale != 1.0 => cfg.query_scale,
            _ => 1.0,
        };
        let offset = plus_one || query != 1.0;
        if offset && !matches!(place, Place::Device) {
            return Err(Error::invalid(
                "weights",
                format!("{}: a (1 + w) norm must stay on the device", m.name()),
            ));
        }
        if let Place::Host = place {
            for (k, part) in m.parts.iter().enumerate() {
                host.fill(&source, cfg, i, k, part, mdt, &mut staging)?;
                done += m.part_bytes(k, dtype) as u64;
                bar.0.set(done);
            }
            return host.view(backend, i, &m.shape, mdt);
        }
        let t = match &place {
            Place::Slot(view) => view.clone(),
            _ => backend.alloc(mdt, &m.shape)?,
        };
        let mut row = 0;
        // Whether every part's rows hold one scale (FP8 on the device; a slot's tensor is
        // refilled from the host and stays unmarked).
        let mut row_scale = !matches!(place, Place::Slot(_));
        for (k, part) in m.parts.iter().enumerate() {
            let rows = part.local_shape()[0];
            let dst = t.narrow(row, rows)?;
            if let Place::Slot(_) = place {
                host.fill(&source, cfg, i, k, part, mdt, &mut staging)?;
            } else {
                row_scale &= source.write(backend, cfg, part, &dst, &mut staging)?;
            }
            done += dst.size_bytes() as u64;
            bar.0.set(done);
            row += rows;
        }
        // Gemma's norms are offsets from 1 (q's also carries the query scale).
        if offset {
            offset_norm(backend, &t, if plus_one { 1.0 } else { 0.0 }, query)?;
        }
        let t = if row_scale { t.with_row_scale() } else { t };
        // What else the backend's matmul reads for a resident weight (CUDA: the repacked
        // copy of a 4-/8-bit integer weight for its mixed-input GEMM); not under an
        // offload plan, whose budget counts each weight's bytes once.
        if prepared.is_none() && matches!(place, Place::Device) {
            return backend.prepare_weight(t);
        }
        Ok(t)
    })?;
    backend.synchronize()?;
    drop(bar);
    tracing::info!(
        "{what}: {} tensors, {:.2} GB {dtype} on {} in {:.2} s",
        decl.tensors().len(),
        total as f64 / 1e9,
        backend.device_name(),
        start.elapsed().as_secs_f64()
    );
    Ok((weights, host.finish()))
}

/// A norm weight `w` of an HF checkpoint that stores offsets from 1 (Gemma's RMSNorm
/// computes `x * (1 + w)`): `(add + w) * scale` in place (`add` 1, or 0 where the file
/// holds `1 + w` already), in f32, rounded to its dtype once.
fn offset_norm(backend: &dyn Backend, t: &Tensor, add: f32, scale: f32) -> Result<()> {
    if !matches!(t.dtype(), DType::F32 | DType::BF16 | DType::F16) {
        return Err(Error::invalid(
            "weights",
            format!("a norm weight in {} cannot take (1 + w)", t.dtype()),
        ));
    }
    let mut bytes = vec![0u8; t.size_bytes()];
    backend.read_bytes(t, &mut bytes)?;
    let values: Vec<f32> = host::to_f32(&bytes, t.dtype())
        .into_iter()
        .map(|v| (add + v) * scale)
        .collect();
    let mut staging = Staging::default();
    backend.write_bytes(
        t,
        staging.convert(bytemuck::cast_slice(&values), DType::F32, t.dtype()),
    )
}

/// The same weights with every quantized tensor decoded ([`encore_backend::quant`]'s
/// reference decode) into the run dtype: the dense twin a quantized model is checked
/// against. Dense tensors are shared, not copied.
pub fn dequantized(backend: &dyn Backend, w: &ModelWeights) -> Result<ModelWeights> {
    let dense = |t: &Tensor| -> Result<Tensor> {
        let DType::Q(fmt) = t.dtype() else {
            return Ok(t.clone());
        };
        let mut bytes = vec![0u8; t.size_bytes()];
        backend.read_bytes(t, &mut bytes)?;
        let (n, k) = (t.dim(0), t.dim(1));
        let rb = bytes.len() / n.max(1);
        let mut values = vec![0f32; n * k];
        for (r, row) in values.chunks_exact_mut(k).enumerate() {
            encore_backend::quant::dequantize_row(fmt, &bytes[r * rb..(r + 1) * rb], row);
        }
        backend.upload_f32_as(&values, &[n, k], w.dtype)
    };
    // Every quantized tensor (the projections, the experts' stacks) is a matrix.
    let layers = w
        .layers
        .iter()
        .map(|l| l.try_map(|_, t| dense(t)))
        .collect::<Result<Vec<_>>>()?;
    Ok(ModelWeights {
        embed: w.embed.clone(),
        layers,
        norm: w.norm.clone(),
        norm_bias: w.norm_bias.clone(),
        lm_head: dense(&w.lm_head)?,
        eagle_fc: w.eagle_fc.as_ref().map(dense).transpose()?,
        dtype: w.dtype,
    })
}

/// Checkpoint tensors the config does not use but a valid checkpoint may hold: rotary
/// tables (`rotary_emb.inv_freq`), `lm_head.weight` beside tied embeddings, and the
/// `o_proj` bias [`check_o_proj_bias`] checks.
fn ignored_tensor(cfg: &ModelConfig, name: &str) -> bool {
    // FP8 scales are read with their weights ([`Checkpoint::fp8`]); activation scales of
    // static FP8 schemes do not apply (activations run in the run dtype).
    // KV cache scales are read by `read_kv_scales` (used with an FP8 cache only).
    let fp8_scale = [
        ".weight_scale_inv",
        ".weight_scale",
        ".input_scale",
        ".k_scale",
        ".v_scale",
    ];
    // A multimodal Gemma 3's vision tower and projector (its language model runs alone).
    let vision = cfg.arch.family().skips_vision_tower
        && [
            "vision_tower.",
            "multi_modal_projector.",
            "model.vision_tower.",
            "model.multi_modal_projector.",
        ]
        .iter()
        .any(|p| name.starts_with(p));
    vision
        || fp8_scale.iter().any(|s| name.ends_with(s))
        || name.ends_with("rotary_emb.inv_freq")
        || (cfg.tie_word_embeddings && name == "lm_head.weight")
        // An EAGLE-3 head's vocabulary maps (read by the drafter) and an embedding of
        // its own (it shares the target's, as SGLang and vLLM run it).
        || (cfg.eagle.is_some() && matches!(name, "d2t" | "t2d" | "embed_tokens.weight"))
        || (o_proj_bias_if_zero(cfg) && name.ends_with("self_attn.o_proj.bias"))
}

/// Norm weights multiply every activation: a NaN or infinity there poisons every token,
/// so it is an error naming the tensor rather than garbage output.
pub(crate) fn check_finite_norm(name: &str, bytes: &[u8], dtype: DType) -> Result<()> {
    if !name.ends_with("norm.weight") {
        return Ok(());
    }
    let values = host::to_f32(bytes, dtype);
    match values.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(i) => Err(Error::Weights {
            tensor: name.to_string(),
            what: format!(
                "element {i} is {} (a norm weight must be finite)",
                values[i]
            ),
        }),
    }
}

/// Whether the checkpoint may hold an o_proj bias that must be all zeros (a q/k/v bias
/// from `attention_bias`, which biases o_proj too).
fn o_proj_bias_if_zero(cfg: &ModelConfig) -> bool {
    cfg.qkv_bias && !cfg.o_bias && cfg.arch.family().qkv_bias == QkvBias::AttentionBias
}

/// Llama and Qwen3 with `attention_bias` also give `o_proj` a bias, which encore does not
/// apply: accept it only when it is all zeros (as in "llamafied" Qwen checkpoints).
fn check_o_proj_bias(ck: &Checkpoint, cfg: &ModelConfig) -> Result<()> {
    if !o_proj_bias_if_zero(cfg) {
        return Ok(());
    }
    for i in 0..cfg.num_layers {
        let name = format!("model.layers.{i}.self_attn.o_proj.bias");
        if let Some(values) = ck.read_f32(&name)? {
            if values.iter().any(|&x| x != 0.0) {
                return Err(Error::Weights {
                    tensor: name,
                    what: "is not all zeros, and encore does not apply an o_proj bias".into(),
                });
            }
        }
    }
    Ok(())
}

/// Fills one HF tensor's rows of a device tensor.
enum Source {
    Checkpoint(Checkpoint),
    Gguf(GgufWeights),
    Dummy { seed: u64 },
}

impl Source {
    /// Write one HF tensor's rows into `dst`; returns whether they hold one scale a row
    /// ([`encore_backend::quant::rows_share_one_scale`]: FP8 quantized at load or from a
    /// per-tensor or per-channel checkpoint).
    fn write(
        &self,
        backend: &dyn Backend,
        cfg: &ModelConfig,
        spec: &TensorSpec,
        dst: &Tensor,
        staging: &mut Staging,
    ) -> Result<bool> {
        // A vocabulary shard past the vocabulary: its real rows, then zeros.
        let pad = spec.slice.map_or(0, |s| s.pad);
        let real = dst.narrow(0, dst.dim(0) - pad)?;
        if pad > 0 {
            let zeros = dst.narrow(dst.dim(0) - pad, pad)?;
            backend.write_bytes(&zeros, &vec![0u8; zeros.size_bytes()])?;
        }
        // A row-parallel bias past rank 0 (`Shard::FirstRank`): zeros alone.
        if real.dim(0) == 0 {
            return Ok(false);
        }
        let dst = &real;
        self.with_bytes(cfg, spec, dst.dtype(), staging, |bytes| {
            backend.write_bytes(dst, bytes)?;
            Ok(match dst.dtype() {
                DType::Q(fmt) => encore_backend::quant::rows_share_one_scale(
                    fmt,
                    *dst.shape().last().unwrap_or(&0),
                    bytes,
                ),
                _ => false,
            })
        })
    }

    /// Call `f` with one HF tensor's bytes in `dtype` (converted on the host when needed),
    /// cut to the block this rank holds when the spec is sliced (tensor parallelism:
    /// the whole tensor is read, then cut, so every rank's block is the whole model's;
    /// dummy values, which depend on the element's index alone, are drawn for the block
    /// only: a 70B shape's ranks would each draw 141 GB).
    fn with_bytes<R>(
        &self,
        cfg: &ModelConfig,
        spec: &TensorSpec,
        dtype: DType,
        staging: &mut Staging,
        f: impl FnOnce(&[u8]) -> Result<R>,
    ) -> Result<R> {
        match (spec.slice, self) {
            (None, _) => self.with_whole(cfg, spec, dtype, staging, f),
            (Some(s), Source::Dummy { seed }) if !matches!(dtype, DType::Q(_)) => {
                let (mean, std) = dummy_init(cfg, spec);
                let k = row_len(spec);
                f(staging.dummy_block(*seed, &spec.name, k, s, mean, std, dtype))
            }
            (Some(s), _) => self.with_whole(cfg, spec, dtype, staging, |bytes| {
                f(&slice_part(spec, s, dtype, bytes)?)
            }),
        }
    }

    /// [`Source::with_bytes`] of the whole HF tensor.
    fn with_whole<R>(
        &self,
        cfg: &ModelConfig,
        spec: &TensorSpec,
        dtype: DType,
        staging: &mut Staging,
        f: impl FnOnce(&[u8]) -> Result<R>,
    ) -> Result<R> {
        if let DType::Q(fmt) = dtype {
            return self.with_quantized(cfg, spec, fmt, staging, f);
        }
        match self {
            Source::Checkpoint(ck) if ck.fp8(&spec.name)?.is_some() => {
                let values = ck.fp8(&spec.name)?.expect("checked").to_f32();
                f(staging.convert(bytemuck::cast_slice(&values), DType::F32, dtype))
            }
            Source::Checkpoint(ck) => {
                if let Some(values) = ck.fused.read_f32(ck, &spec.name)? {
                    return f(staging.convert(bytemuck::cast_slice(&values), DType::F32, dtype));
                }
                if let Some(w) = ck.packed_int(spec)? {
                    let values = w.to_f32();
                    return f(staging.convert(bytemuck::cast_slice(&values), DType::F32, dtype));
                }
                let (src_dtype, bytes) = ck.data(&spec.name)?;
                check_finite_norm(&spec.name, bytes, src_dtype)?;
                if src_dtype == dtype {
                    f(bytes)
                } else {
                    f(staging.convert(bytes, src_dtype, dtype))
                }
            }
            Source::Gguf(g) => {
                let values = g.tensor_f32(spec)?;
                let bytes: &[u8] = bytemuck::cast_slice(&values);
                check_finite_norm(&spec.name, bytes, DType::F32)?;
                if dtype == DType::F32 {
                    f(bytes)
                } else {
                    f(staging.convert(bytes, DType::F32, dtype))
                }
            }
            Source::Dummy { seed } => {
                let (mean, std) = dummy_init(cfg, spec);
                f(staging.dummy(*seed, &spec.name, spec.numel(), mean, std, dtype))
            }
        }
    }
}

/// The block `s` of the whole tensor `spec` whose device bytes in `dtype` are `bytes`: a
/// range of rows, and of each row's columns (for a quantized format, whole blocks: a
/// row's quant bytes and scale bytes of those blocks, padded as the device layout pads).
fn slice_part(spec: &TensorSpec, s: Slice, dtype: DType, bytes: &[u8]) -> Result<Vec<u8>> {
    let k = row_len(spec);
    // A source row's bytes, the byte ranges (from, to) of it kept, an output row's bytes.
    let (row_bytes, kept, out_row) = match dtype {
        DType::Q(fmt) => {
            let blk = fmt.block_elems();
            let rb = fmt.row_bytes(k).unwrap_or(0);
            if !s.col.is_multiple_of(blk) || !s.cols.is_multiple_of(blk) || rb == 0 {
                return Err(Error::Weights {
                    tensor: spec.name.clone(),
                    what: format!(
                        "its columns {}..{} (this rank's share) are not whole {fmt} blocks of {blk}",
                        s.col,
                        s.col + s.cols
                    ),
                });
            }
            let (nb, b0, n) = (k / blk, s.col / blk, s.cols / blk);
            let (qb, sb) = (fmt.quant_bytes(), fmt.scale_bytes());
            let scales = nb * qb;
            let kept = vec![
                (b0 * qb, (b0 + n) * qb),
                (scales + b0 * sb, scales + (b0 + n) * sb),
            ];
            (rb, kept, fmt.row_bytes(s.cols).unwrap_or(0))
        }
        _ => {
            let e = dtype.size();
            (k * e, vec![(s.col * e, (s.col + s.cols) * e)], s.cols * e)
        }
    };
    if row_bytes == 0 {
        return Ok(Vec::new());
    }
    if bytes.len() < (s.row + s.rows) * row_bytes {
        return Err(Error::Weights {
            tensor: spec.name.clone(),
            what: format!(
                "{} bytes cannot hold rows {}..{} of {row_bytes} bytes",
                bytes.len(),
                s.row,
                s.row + s.rows
            ),
        });
    }
    let mut out = Vec::with_capacity(s.rows * out_row);
    for row in bytes[s.row * row_bytes..(s.row + s.rows) * row_bytes].chunks(row_bytes) {
        let start = out.len();
        for &(from, to) in &kept {
            out.extend_from_slice(&row[from..to]);
        }
        out.resize(start + out_row, 0);
    }
    Ok(out)
}

/// Values per row of a tensor as [`Slice`] cuts it (a 1-D tensor's rows are its elements).
fn row_len(spec: &TensorSpec) -> usize {
    if spec.shape.len() == 1 {
        1
    } else {
        spec.shape[1]
    }
}

/// `(mean, std)` of a dummy tensor: scales that keep activations near unit size through
/// any number of layers (every sublayer's input is RMS-normalised).
fn dummy_init(cfg: &ModelConfig, spec: &TensorSpec) -> (f32, f32) {
    let n = &spec.name;
    if n.ends_with("norm.weight") {
        (1.0, 0.02)
    } else if n.ends_with(".sinks") {
        (0.0, 0.5)
    } else if n.ends_with(".bias") {
        (0.0, 0.02)
    } else if n == "model.embed_tokens.weight" || n == "lm_head.weight" {
        (0.0, 1.0 / (cfg.hidden_size as f32).sqrt())
    } else {
        (0.0, 1.0 / (spec.shape[1] as f32).sqrt())
    }
}

/// The slot of role `r` in [`build`]'s tables and a [`LayerWeights`] (its position in
/// [`Role::ALL`], which lists the roles in declaration order).
fn slot(r: Role) -> usize {
    r as usize
}

/// Take the tensor of role `r` out of `slots`; an error when the declaration has none.
fn need(slots: &mut [Option<Tensor>], r: Role) -> Result<Tensor> {
    slots[slot(r)]
        .take()
        .ok_or_else(|| Error::invalid("weights", format!("no {r:?} tensor is declared")))
}

/// Create every declared device tensor with `make` (given its index and declaration), in
/// declaration order, and hand each to its field of [`ModelWeights`] by role.
fn build(
    decl: &Decl,
    dtype: DType,
    mut make: impl FnMut(usize, &TensorDecl) -> Result<Tensor>,
) -> Result<ModelWeights> {
    let num_layers = decl.tensors().iter().filter_map(|t| t.layer).max();
    let mut top: Vec<Option<Tensor>> = vec![None; Role::ALL.len()];
    let mut per_layer = vec![top.clone(); num_layers.map_or(0, |l| l + 1)];
    for (i, t) in decl.tensors().iter().enumerate() {
        let x = make(i, t)?;
        let slots = match t.layer {
            Some(l) => &mut per_layer[l],
            None => &mut top,
        };
        slots[slot(t.role)] = Some(x);
    }
    let layers = per_layer
        .into_iter()
        .map(LayerWeights::from_slots)
        .collect::<Result<Vec<_>>>()?;
    let eagle_fc = top[slot(Role::EagleFc)].take();
    let norm = need(&mut top, Role::FinalNorm)?;
    let norm_bias = top[slot(Role::FinalNormBias)].take();
    let (embed, lm_head) = match &eagle_fc {
        // An EAGLE-3 head shares the target's embedding: a placeholder until then.
        Some(_) => {
            let lm_head = need(&mut top, Role::LmHead)?;
            (lm_head.clone(), lm_head)
        }
        None => {
            let embed = need(&mut top, Role::Embedding)?;
            // Tied embeddings: the LM head is the same tensor (same storage).
            let lm_head = top[slot(Role::LmHead)]
                .take()
                .unwrap_or_else(|| embed.clone());
            (embed, lm_head)
        }
    };
    Ok(ModelWeights {
        embed,
        layers,
        norm,
        norm_bias,
        lm_head,
        eagle_fc,
        dtype,
    })
}

#[cfg(test)]
mod tests;
