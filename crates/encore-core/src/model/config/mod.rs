//! The model configuration: HF `config.json` parsed into [`ModelConfig`] (Llama, Mistral,
//! Qwen2, Qwen3, and the mixtures of experts Qwen2-MoE, Qwen3-MoE and Mixtral), and the
//! built-in configs behind `--model dummy:NAME`.
//!
//! Parsing follows HF transformers: absent optional fields take the defaults of the
//! architecture's `PretrainedConfig` class, and anything the forward pass cannot honour
//! (another rope scaling, an MLP bias, partial rotary) is an
//! [`Error::Config`] naming the field, never a silent change of results.

use std::path::Path;

use serde_json::Value;

use super::formats::WeightFormats;
use crate::backend::Activation;
use crate::error::{Error, Result};
use crate::ops::RopeConfig;

mod dummy;
mod parse;
mod quantization;
mod rope;
use crate::tensor::DType;
use parse::{parse, Fields};

pub use crate::model::arch::Arch;
pub use crate::model::arch::NormKind;
use crate::model::arch::{NormPlacement, QkNorm};

/// Everything the loader and the forward pass need to know about a model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Full rotary (`rot_dim == head_dim`), theta and optional Llama-3 scaling.
    pub rope: RopeConfig,
    pub rms_norm_eps: f32,
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry a bias (Qwen2 always; Llama/Qwen3 with `attention_bias`).
    pub qkv_bias: bool,
    /// o_proj carries a bias, applied (gpt-oss's `attention_bias`).
    pub o_bias: bool,
    /// Per-head RMSNorm on q and k before rope, weight `[head_dim]` (Qwen3).
    pub qk_norm: bool,
    /// The gated MLP's activation (`hidden_act`; SiLU for every family but Gemma's).
    pub hidden_act: Activation,
    /// Post norms (Gemma): the attention's and the MLP's outputs are RMS-normed before
    /// each residual add (`post_attention_layernorm`, `post_feedforward_layernorm`; the
    /// MLP's input norm is then `pre_feedforward_layernorm`).
    pub post_norms: bool,
    /// The embedding is multiplied by `sqrt(hidden_size)`, rounded to the run dtype first
    /// (Gemma).
    pub embed_scale: bool,
    /// The rotary of the windowed layers when it differs from `rope` (Gemma 3's local
    /// base, `rope_parameters.sliding_attention`).
    pub rope_local: Option<RopeConfig>,
    /// The checkpoint's RMSNorm weights are offsets from 1 (Gemma's `x * (1 + w)`): the
    /// loader adds 1 to every norm weight of an HF checkpoint.
    pub norm_plus_one: bool,
    /// RMSNorm, or LayerNorm with a bias beside each weight (StableLM), for the input,
    /// post-attention and final norms (the q/k head norms and post norms are RMSNorms;
    /// [`ModelConfig::check_runs`] refuses them beside LayerNorms).
    pub norm_kind: NormKind,
    /// A factor on q before attention's `1 / sqrt(head_dim)`, folded at load into q's head
    /// norm weight (Gemma's `query_pre_attn_scalar`: `sqrt(head_dim / scalar)`); 1 otherwise.
    pub query_scale: f32,
    /// Soft-capping of the attention scores (Gemma 2's `attn_logit_softcapping`): a
    /// scaled score `x` becomes `cap * tanh(x / cap)` before the softmax.
    pub attn_softcap: Option<f32>,
    /// Soft-capping of the final logits (Gemma 2's `final_logit_softcapping`).
    pub final_softcap: Option<f32>,
    /// Layers whose attention applies no rotary embedding (NoPE; SmolLM3's every fourth),
    /// ascending; empty for every other family.
    pub no_rope_layers: Vec<usize>,
    pub max_position_embeddings: usize,
    /// The checkpoint's dtype (`torch_dtype` or `dtype`), bf16 when absent.
    pub torch_dtype: DType,
    pub bos_token_id: Option<u32>,
    /// HF allows one id or a list.
    pub eos_token_ids: Vec<u32>,
    /// Sliding-window attention (Mistral's `sliding_window`; Qwen2/Qwen3's when
    /// `use_sliding_window` is true), or `None` for full attention in every layer.
    pub sliding_window: Option<SlidingWindow>,
    /// Layers at or past the window's first layer that attend fully nonetheless
    /// (transformers 5's `layer_types`: gpt-oss's and Gemma's alternations), ascending.
    pub full_attention_layers: Vec<usize>,
    /// How the weights are stored on the device (dense unless quantized; see
    /// [`crate::model::formats`]).
    pub weights: WeightFormats,
    /// The mixture-of-experts MLP of the MoE architectures (`None` for the dense ones).
    pub moe: Option<MoeConfig>,
    /// This config's share of a tensor-parallel model ([`ModelConfig::shard`]); `None`:
    /// the whole model. A rank's config carries its own heads, KV heads and MLP width;
    /// `vocab_size` stays the whole vocabulary (the logits' width).
    pub tp: Option<TpShard>,
    /// An EAGLE-3 draft head, not a model of its own (`None` for every model).
    pub eagle: Option<EagleConfig>,
}

/// An EAGLE-3 draft head (HF `LlamaForCausalLMEagle3`, the layout of the published
/// heads): one Llama decoder layer whose q/k/v read `2 * hidden` columns, the RMS-normed
/// embedding of the next token beside the RMS-normed (`hidden_norm`) hidden state. The
/// hidden state is `fc` (`[hidden, 3 * target_hidden]`) of the target's residual stream
/// at the input of three of its layers, concatenated, or the head's own pre-norm output
/// for the drafts after the first; the residual stream starts at that hidden state
/// (after its norm with `norm_before_residual`). The head shares the target's embedding
/// and has an LM head over `draft_vocab` tokens (the config's `vocab_size` is the
/// target's): draft token `d` is target token `d + d2t[d]`.
///
/// On a [`ModelConfig`] of a head, `vocab_size` is the draft vocabulary (the logits'
/// width) and `num_layers` 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EagleConfig {
    /// The target's vocabulary: the rows of the embedding the head shares.
    pub target_vocab: usize,
    /// The target's hidden size (`target_hidden_size`, default `hidden_size`).
    pub target_hidden: usize,
    /// The target layers whose input the head reads: the top-level
    /// `eagle_aux_hidden_state_layer_ids` (vLLM's), or each of `eagle_config`'s plus one
    /// (SGLang's names the layer whose output is read); `None`: layers 2, L / 2 and L - 3
    /// of an L-layer target, as the published heads were trained.
    pub aux_layers: Option<[usize; 3]>,
    /// The residual stream starts after `hidden_norm` (`norm_before_residual`).
    pub norm_before_residual: bool,
}

impl EagleConfig {
    /// The target layers the head reads for a target of `target_layers` layers, in the
    /// order `fc` takes them; an error naming `--draft-model` when one is not a layer of
    /// it.
    pub fn aux_layers_for(&self, target_layers: usize) -> Result<[usize; 3]> {
        let layers = match self.aux_layers {
            Some(l) => l,
            None if target_layers >= 6 => [2, target_layers / 2, target_layers - 3],
            None => [0, target_layers / 2, target_layers.saturating_sub(1)],
        };
        if let Some(l) = layers.iter().find(|&&l| l >= target_layers) {
            return Err(Error::invalid(
                "--draft-model",
                format!("the EAGLE head reads layer {l} of a target of {target_layers} layers"),
            ));
        }
        Ok(layers)
    }
}

/// A mixture-of-experts MLP as transformers runs it: in a sparse layer a router
/// (`[num_experts, hidden]`, no bias) scores the experts; the softmax of the scores, in
/// f32, picks the `top_k` most probable (ties to the lower index), renormalised to sum to
/// 1 where `norm_topk_prob`; the MLP's output is those experts' outputs (each a SiLU MLP
/// of width `expert_intermediate`) weighted by their probabilities, plus, for Qwen2-MoE,
/// a shared expert scaled by the sigmoid of its gate (`[1, hidden]`). Layers that are not
/// sparse have a dense MLP of `intermediate_size`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    pub num_experts: usize,
    /// Experts per token (`num_experts_per_tok`).
    pub top_k: usize,
    /// Each expert's MLP width (`moe_intermediate_size`; Mixtral's `intermediate_size`).
    pub expert_intermediate: usize,
    /// Renormalise the top-k probabilities (Mixtral always; Qwen with `norm_topk_prob`).
    pub norm_topk_prob: bool,
    /// Per layer: sparse (experts) or dense (HF's rule: not in `mlp_only_layers`, and
    /// `(layer + 1) % decoder_sparse_step == 0`).
    pub sparse: Vec<bool>,
    /// Qwen2-MoE's shared expert: its MLP width (`shared_expert_intermediate_size`).
    pub shared_expert_intermediate: Option<usize>,
}

impl MoeConfig {
    /// The sizes no supported model exceeds; an error text naming the key, `keys` being
    /// the names the source gives the expert count, the expert width and the shared
    /// expert's width.
    pub fn check_sizes(&self, keys: [&str; 3]) -> std::result::Result<(), String> {
        let sizes = [
            (self.num_experts, 1 << 12),
            (self.expert_intermediate, 1 << 20),
            (self.shared_expert_intermediate.unwrap_or(0), 1 << 20),
        ];
        for (key, (n, max)) in keys.iter().zip(sizes) {
            if n > max {
                return Err(format!(
                    "`{key}` = {n} is beyond any supported model (at most {max})"
                ));
            }
        }
        Ok(())
    }

    /// Whether layer `layer` runs experts (else a dense MLP).
    pub fn is_sparse(&self, layer: usize) -> bool {
        self.sparse.get(layer).copied().unwrap_or(false)
    }
}

/// A rank's share of a tensor-parallel model: its place in the group and the whole
/// model's sizes that its config divides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TpShard {
    pub rank: usize,
    pub size: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub intermediate_size: usize,
    /// Each routed expert's MLP width (0 without experts).
    pub expert_intermediate: usize,
    /// The shared expert's MLP width (Qwen2-MoE).
    pub shared_expert_intermediate: Option<usize>,
    /// The units the dense MLP, each expert and the shared expert split in over the ranks
    /// (a block of their down projection's format; 1 when dense).
    pub mlp_unit: usize,
    pub expert_unit: usize,
    pub shared_unit: usize,
}

/// Sliding-window attention as transformers applies it: in layers `first_layer..`, the
/// query at position `p` attends to the keys at positions `k` with `p - size < k <= p`
/// (the `size` most recent positions, itself included); earlier layers attend fully.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingWindow {
    /// Positions attended to, at least 1.
    pub size: usize,
    /// The first layer that uses the window (Mistral: 0; Qwen: `max_window_layers`).
    pub first_layer: usize,
}

impl ModelConfig {
    /// A layer norms its input before attention and before the MLP (every family but
    /// OLMo 2, whose blocks read the residual stream and norm only their outputs).
    pub fn pre_norms(&self) -> bool {
        self.arch.family().norms != NormPlacement::Post
    }

    /// q and k are each RMS-normed across all their heads (OLMo 2), not per head.
    pub fn qk_norm_whole(&self) -> bool {
        self.qk_norm && self.arch.family().qk_norm == QkNorm::Whole
    }

    /// Attention's softmax scale: `1 / sqrt(head_dim)`, times [`ModelConfig::query_scale`]
    /// where no q head norm holds it (Gemma 2; Gemma 3's is folded into its q norm).
    pub fn attention_scale(&self) -> f32 {
        let s = 1.0 / (self.head_dim as f32).sqrt();
        if self.qk_norm {
            s
        } else {
            s * self.query_scale
        }
    }

    /// Parse the text of an HF `config.json`; errors name `path`.
    pub fn from_json(text: &str, path: &str) -> Result<Self> {
        let value: Value = serde_json::from_str(text).map_err(|e| Error::Config {
            path: path.to_string(),
            what: format!("not valid JSON: {e}"),
        })?;
        let obj = value.as_object().ok_or_else(|| Error::Config {
            path: path.to_string(),
            what: "the top level is not a JSON object".into(),
        })?;
        // A multimodal Gemma 3 (`Gemma3ForConditionalGeneration`, `model_type` gemma3): its
        // language model, from `text_config`; the vision tower is skipped.
        let multimodal = obj.get("model_type").and_then(Value::as_str) == Some("gemma3")
            || obj
                .get("architectures")
                .and_then(Value::as_array)
                .is_some_and(|a| {
                    a.iter()
                        .any(|n| n.as_str() == Some("Gemma3ForConditionalGeneration"))
                });
        if multimodal {
            let text = obj
                .get("text_config")
                .and_then(Value::as_object)
                .ok_or_else(|| Error::Config {
                    path: path.to_string(),
                    what: "a Gemma3ForConditionalGeneration config without `text_config`".into(),
                })?;
            let mut text = text.clone();
            text.insert("model_type".into(), Value::from("gemma3_text"));
            text.remove("architectures");
            // Token ids and the dtype may live at the top level only.
            for key in ["bos_token_id", "eos_token_id", "torch_dtype", "dtype"] {
                if let (false, Some(v)) = (text.contains_key(key), obj.get(key)) {
                    text.insert(key.into(), v.clone());
                }
            }
            tracing::warn!(
                "{path}: Gemma3ForConditionalGeneration: running its language model; the \
                 vision tower is skipped (images are not supported)"
            );
            return parse(&Fields {
                obj: &text,
                path,
                prefix: "text_config.",
            });
        }
        parse(&Fields {
            obj,
            path,
            prefix: "",
        })
    }

    /// Read and parse an HF `config.json` (with an AutoGPTQ `quantize_config.json` beside
    /// it, see [`quantization::with_quantize_config`]).
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            what: "reading model config",
            path: path.display().to_string(),
            source,
        })?;
        let text = quantization::with_quantize_config(path, text)?;
        Self::from_json(&text, &path.display().to_string())
    }

    /// Refuse sizes no real model has (each at least 8x the largest published one), so
    /// a corrupt or hostile config fails here, naming the value, instead of overflowing
    /// the memory estimate or sizing loops before the weights are checked. `names` gives
    /// the file's own names for (hidden, intermediate, vocab, layers, heads, kv heads,
    /// head dim, context).
    pub(crate) fn check_sizes(&self, names: [&str; 8]) -> std::result::Result<(), String> {
        let limits = [
            (self.hidden_size, 1 << 17),
            (self.intermediate_size, 1 << 20),
            (self.vocab_size, 1 << 22),
            (self.num_layers, 1 << 12),
            (self.num_heads, 1 << 12),
            (self.num_kv_heads, 1 << 12),
            (self.head_dim, 1 << 12),
            (self.max_position_embeddings, 1 << 26),
        ];
        for ((value, max), name) in limits.into_iter().zip(names) {
            if value > max {
                return Err(format!(
                    "`{name}` = {value} is beyond any supported model (at most {max})"
                ));
            }
        }
        Ok(())
    }

    /// This parsed config as an EAGLE-3 head (`eagle`, and the draft vocabulary that
    /// becomes `vocab_size`); an error text when its shape is not one encore runs.
    fn into_eagle(
        self,
        (eagle, draft_vocab): (EagleConfig, usize),
    ) -> std::result::Result<Self, String> {
        if self.num_layers != 1 {
            return Err(format!(
                "an EAGLE-3 head of {} layers (num_hidden_layers): encore runs heads of one layer",
                self.num_layers
            ));
        }
        if self.moe.is_some() || self.sliding_window.is_some() || self.tie_word_embeddings {
            return Err("an EAGLE-3 head with experts, a sliding window or tied embeddings".into());
        }
        Ok(ModelConfig {
            vocab_size: draft_vocab,
            eagle: Some(eagle),
            ..self
        })
    }

    /// A random-weight EAGLE-3 head shaped for `target` (`--draft-model dummy:eagle3`):
    /// one layer of the target's attention and MLP sizes, an LM head over `draft_vocab`
    /// tokens (at most the target's), reading the default three layers.
    pub fn eagle_head_for(target: &ModelConfig, draft_vocab: usize) -> ModelConfig {
        let (heads, kv_heads) = target.whole_heads();
        let intermediate = target
            .tp
            .map_or(target.intermediate_size, |t| t.intermediate_size);
        ModelConfig {
            arch: Arch::Llama,
            vocab_size: draft_vocab.clamp(1, target.vocab_size),
            num_layers: 1,
            num_heads: heads,
            num_kv_heads: kv_heads,
            intermediate_size: intermediate,
            tie_word_embeddings: false,
            // A Llama layer: none of a gpt-oss target's o_proj bias or windows.
            qkv_bias: false,
            o_bias: false,
            qk_norm: false,
            sliding_window: None,
            full_attention_layers: Vec::new(),
            weights: WeightFormats::default(),
            moe: None,
            tp: None,
            eagle: Some(EagleConfig {
                target_vocab: target.vocab_size,
                target_hidden: target.hidden_size,
                aux_layers: None,
                norm_before_residual: false,
            }),
            ..target.clone()
        }
    }

    /// Whether the forward pass runs this model where `runs_moe` says whether the backend
    /// runs mixture-of-experts layers (`Backend::runs_moe`): a model with experts runs only
    /// there; an error naming the architecture.
    pub fn check_runs(&self, runs_moe: bool) -> Result<()> {
        // LayerNorms are the block norms' kind only: the other norms are RMSNorms.
        let rms_only = [
            (self.post_norms, "post norms"),
            (self.qk_norm, "q/k norms"),
            (self.eagle.is_some(), "an EAGLE head"),
        ];
        if let Some((_, what)) = rms_only.iter().find(|(on, _)| *on) {
            if self.norm_kind == NormKind::LayerBias {
                return Err(Error::Config {
                    path: self.arch.model_type().to_string(),
                    what: format!("LayerNorms with {what} are not supported (RMSNorm only)"),
                });
            }
        }
        match &self.moe {
            Some(moe) if !runs_moe => Err(Error::Config {
                path: self.arch.model_type().to_string(),
                what: format!(
                    "a mixture of experts ({} experts, top {}): this backend does not run \
                     mixture-of-experts layers",
                    moe.num_experts, moe.top_k
                ),
            }),
            _ => Ok(()),
        }
    }

    /// What of this model the LRU offload policy does not stream yet, named for its
    /// refusal: gpt-oss's attention sinks, which attention reads after q/k/v's op, where
    /// that policy's placements are not kept (the planned policy's slots and the expert
    /// cache's resident weights are); `None` when nothing.
    pub fn unstreamed(&self) -> Option<&'static str> {
        self.arch.family().sinks.then_some("attention sinks")
    }

    /// `(rank, size)` of this config's tensor-parallel group; `(0, 1)` for the model.
    pub fn tp_rank(&self) -> (usize, usize) {
        self.tp.map_or((0, 1), |t| (t.rank, t.size))
    }

    /// Whether every rank holds the same share of the dense MLP (always alone): where it
    /// does not, a rank's down projection has another k than its peers' and could take
    /// another kernel path, so the forward keeps it out of the fused all-reduce, whose
    /// path every rank must take alike.
    pub fn mlp_shares_even(&self) -> bool {
        self.tp
            .is_none_or(|t| (t.intermediate_size / t.mlp_unit.max(1)).is_multiple_of(t.size))
    }

    /// The whole model's expert MLP width and shared expert width (a shard's `moe` holds
    /// its own); `None` without experts.
    pub fn whole_expert_widths(&self) -> Option<(usize, Option<usize>)> {
        let m = self.moe.as_ref()?;
        Some(
            self.tp
                .map_or((m.expert_intermediate, m.shared_expert_intermediate), |t| {
                    (t.expert_intermediate, t.shared_expert_intermediate)
                }),
        )
    }

    /// The whole model's attention heads and KV heads (a shard's config holds its own).
    pub fn whole_heads(&self) -> (usize, usize) {
        self.tp.map_or((self.num_heads, self.num_kv_heads), |t| {
            (t.num_heads, t.num_kv_heads)
        })
    }

    /// Rows of this rank's embedding and LM head: `ceil(vocab_size / size)` (the last
    /// ranks' rows past the vocabulary are zeros, their logits dropped).
    pub fn vocab_rows(&self) -> usize {
        self.vocab_size.div_ceil(self.tp_rank().1)
    }

    /// Rows of the q projection: `num_heads * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Rows of the k (and of the v) projection: `num_kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// The rotary of layer `layer`: `rope_local` in a windowed layer that has one, else
    /// `rope` (a layer in `no_rope_layers` rotates by neither).
    pub fn layer_rope(&self, layer: usize) -> &RopeConfig {
        match &self.rope_local {
            Some(local) if self.layer_window(layer).is_some() => local,
            _ => &self.rope,
        }
    }

    /// The attention window of layer `layer`: `Some(size)` when it attends to the `size`
    /// most recent positions only, `None` for full attention.
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        self.sliding_window
            .filter(|w| layer >= w.first_layer && !self.full_attention_layers.contains(&layer))
            .map(|w| w.size)
    }
}
