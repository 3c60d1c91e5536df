//! The model families encore runs, one module each, behind one registry ([`FAMILIES`])
//! keyed by the names a checkpoint gives: the HF `architectures` class, its
//! `model_type`, and llama.cpp's `general.architecture` for GGUF files.
//!
//! A family is data: its names, its HF defaults, and the variants of the one layer recipe
//! (`model/llama/`) it runs — activation, norm placement, q/k norms, biases, windows,
//! rotary, soft-capping, experts, norm kind, checkpoint names. The config parsers (`model/config/`,
//! `model/gguf/config.rs`), the tensor declaration (`model/decl/`) and the GGUF writer read
//! these fields; none of them matches on a family. Adding one whose variants all exist is
//! its file here, its [`Arch`] and its registry line; a new variant adds a field (and a
//! kernel only for a new op).

use crate::backend::Activation;

mod gemma2;
mod gemma3;
mod gpt_oss;
mod llama;
mod mistral;
mod mixtral;
mod olmo2;
mod phi3;
mod qwen2;
mod qwen2_moe;
mod qwen3;
mod qwen3_moe;
mod smollm3;
mod stablelm;

/// The supported model families (each documented in its module).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    /// Qwen2's attention with a mixture-of-experts MLP and a gated shared expert.
    Qwen2Moe,
    /// Qwen3's attention with a mixture-of-experts MLP.
    Qwen3Moe,
    /// Mistral's attention with a mixture-of-experts MLP.
    Mixtral,
    /// Llama's layer without rotary embeddings in some layers.
    SmolLM3,
    /// Phi-3, Phi-3.5 and Phi-4.
    Phi3,
    /// Gemma 3's language model.
    Gemma3,
    /// Gemma 2.
    Gemma2,
    /// OLMo 2.
    Olmo2,
    /// StableLM 2 (and StableLM 3B 4E1T): LayerNorms with a bias, partial rotary.
    StableLm,
    /// gpt-oss: attention sinks, alternating windows, biased experts with a clamped SwiGLU.
    GptOss,
}

/// Every family encore runs, in [`Arch`]'s order (a family's row is its index).
pub const FAMILIES: [Family; 14] = [
    llama::FAMILY,
    mistral::FAMILY,
    qwen2::FAMILY,
    qwen3::FAMILY,
    qwen2_moe::FAMILY,
    qwen3_moe::FAMILY,
    mixtral::FAMILY,
    smollm3::FAMILY,
    phi3::FAMILY,
    gemma3::FAMILY,
    gemma2::FAMILY,
    olmo2::FAMILY,
    stablelm::FAMILY,
    gpt_oss::FAMILY,
];

/// One family: its names, its defaults and its layer's variants.
#[derive(Clone, Copy, Debug)]
pub struct Family {
    pub arch: Arch,
    /// The HF `architectures` entry, e.g. `LlamaForCausalLM`.
    pub hf_name: &'static str,
    /// The HF `model_type`, e.g. `llama`.
    pub model_type: &'static str,
    /// llama.cpp's `general.architecture` a GGUF file of it carries (`None`: llama.cpp
    /// writes it as another family's, as Mistral and Mixtral are written as `llama`).
    pub gguf: Option<&'static str>,
    /// What llama.cpp's converter writes for it (`gguf`, or the family it is written as).
    pub gguf_written: &'static str,
    /// The dense family whose attention and norms it shares (itself for the dense ones).
    pub base: Arch,
    /// HF's default `max_position_embeddings`.
    pub default_max_positions: usize,
    /// HF's `rope_theta` when the config gives none (gpt-oss's 150000; 10000 otherwise).
    pub default_theta: f64,
    /// A config without `rope_parameters` / `rope_scaling` is refused (gpt-oss's default
    /// is a YaRN encore does not fill in).
    pub rope_required: bool,
    /// The gated MLP's activation when the config names none.
    pub act: Activation,
    /// The config key naming the activation (Gemma's `hidden_activation`; `hidden_act`
    /// is read when it is absent).
    pub act_key: &'static str,
    /// `tie_word_embeddings` when the config leaves it out.
    pub tie: bool,
    /// The norms' epsilon when the config leaves it out (`rms_norm_eps`, or
    /// `layer_norm_eps` for LayerNorms: [`NormKind::eps_key`]).
    pub rms_norm_eps: f64,
    /// RMSNorm, or LayerNorm with a bias (StableLM), for the input, post-attention and
    /// final norms.
    pub norm_kind: NormKind,
    pub qkv_bias: QkvBias,
    pub qk_norm: QkNorm,
    pub norms: NormPlacement,
    /// The checkpoint's RMSNorm weights are offsets from 1 (`x * (1 + w)`).
    pub norm_plus_one: bool,
    /// The embedding is multiplied by `sqrt(hidden_size)`.
    pub embed_scale: bool,
    pub window: WindowRule,
    /// transformers 5's `layer_types` picks the windowed layers.
    pub layer_types: bool,
    /// Without `layer_types` (and outside Gemma's rules): every n-th layer attends fully,
    /// the others slide (gpt-oss's 2); `None`: the window's layers all slide.
    pub full_every: Option<usize>,
    /// One learned attention sink per head (`self_attn.sinks`, gpt-oss): an extra logit
    /// in every softmax ([`crate::backend::Attention::sinks`]).
    pub sinks: bool,
    /// `partial_rotary_factor` below 1 is the family's, with its HF default (Phi-3's 1,
    /// StableLM's 0.25); `None`: refused (full rotary).
    pub partial_rotary: Option<f64>,
    /// Config flags whose `true` encore does not run, each with what it would need
    /// (StableLM's `qk_layernorm`, `use_parallel_residual`): refused by name.
    pub refused_flags: &'static [(&'static str, &'static str)],
    /// NoPE layers (SmolLM3): `no_rope_layers`, else every n-th layer (the default n).
    pub no_rope_interval: Option<usize>,
    /// Gemma's query scalar, soft-capping, window pattern and local rotary.
    pub gemma: Option<GemmaRules>,
    /// The mixture-of-experts MLP (`None`: dense).
    pub experts: Option<ExpertRules>,
    /// q/k/v stored as one `qkv_proj` and gate/up as one `gate_up_proj` (Phi-3).
    pub fused_projections: bool,
    /// llama.cpp's converter permutes the rows of q and k (Llama's rotary layout).
    pub gguf_permuted_qk: bool,
    /// A multimodal checkpoint's vision tower and projector are skipped (Gemma 3).
    pub skips_vision_tower: bool,
}

/// How the q/k/v biases are read from the HF config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkvBias {
    Always,
    Never,
    /// `attention_bias` (which gives o_proj a bias too: accepted only when all zeros).
    AttentionBias,
    /// Its own key and default (Qwen2-MoE's `qkv_bias`, default true).
    Flag {
        key: &'static str,
        default: bool,
    },
    /// `attention_bias = true` is refused (it would bias o_proj as well).
    Refused,
    /// `attention_bias` (its default given) biases q/k/v and o_proj, all applied
    /// (gpt-oss).
    WithOutput {
        default: bool,
    },
}

impl QkvBias {
    /// Whether a config that says nothing gives q/k/v biases.
    pub fn by_default(self) -> bool {
        matches!(
            self,
            QkvBias::Always
                | QkvBias::Flag { default: true, .. }
                | QkvBias::WithOutput { default: true }
        )
    }
}

/// RMSNorm of q and k before the rotary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// Each head normed alone, weight `[head_dim]` (Qwen3, Gemma 3).
    PerHead,
    /// q across all its heads and k across all its heads, weights `[heads * head_dim]`
    /// and `[kv_heads * head_dim]` (OLMo 2).
    Whole,
}

/// What a family's norms compute: an argument of the backend's norm ops
/// ([`crate::backend::Norm`]), not a family's own code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    /// `x / sqrt(mean(x^2) + eps) * w` (Gemma's `1 + w` is [`Family::norm_plus_one`]).
    Rms,
    /// `(x - mean) / sqrt(var + eps) * w + b`: a bias beside each norm weight.
    LayerBias,
}

impl NormKind {
    /// The HF config's epsilon key.
    pub fn eps_key(self) -> &'static str {
        match self {
            NormKind::Rms => "rms_norm_eps",
            NormKind::LayerBias => "layer_norm_eps",
        }
    }

    /// The GGUF key of the epsilon, less its `<arch>.` prefix (llama.cpp's).
    pub fn gguf_eps_key(self) -> &'static str {
        match self {
            NormKind::Rms => "attention.layer_norm_rms_epsilon",
            NormKind::LayerBias => "attention.layer_norm_epsilon",
        }
    }
}

/// Where a layer's norms sit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormPlacement {
    /// Before attention and before the MLP (Llama).
    Pre,
    /// Before, and after each block's output before the residual add (Gemma).
    PreAndPost,
    /// After each block's output only (OLMo 2): a block reads the residual stream itself.
    Post,
}

/// Where the sliding window applies, as transformers builds the family's layer types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowRule {
    /// Full attention everywhere (Llama).
    None,
    /// `sliding_window` (or the default) on every layer, or on those `layer_types` or the
    /// Gemma pattern names.
    Every { default: Option<usize> },
    /// Only with `use_sliding_window`, from `max_window_layers` on (Qwen2, Qwen3).
    OptIn,
    /// `use_sliding_window = true` is refused (with a `sliding_window` size only, where
    /// `needs_size`); no released checkpoint turns it on.
    Refused { needs_size: bool },
}

/// Gemma 2's and 3's variants.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmaRules {
    /// The attention and final logit caps when the config leaves them out (Gemma 2's 50
    /// and 30); `None`: no caps unless given.
    pub softcaps: Option<(f32, f32)>,
    /// The windowed layers rotate with their own base (Gemma 3's local rotary).
    pub local_rope: bool,
    /// Without `layer_types`: every n-th layer attends fully, n from this key, else
    /// `pattern` (`None`: fixed).
    pub pattern_key: Option<&'static str>,
    pub pattern: usize,
    /// The layer count of the size whose query scalar is `hidden / heads` in a GGUF file
    /// (27B), not the head dim.
    pub gguf_big_layers: usize,
    /// llama.cpp's window for a file without `attention.sliding_window` (Gemma 2's 4096).
    pub gguf_window: Option<usize>,
}

/// A mixture-of-experts family's HF defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertRules {
    /// The expert-count key (`num_experts`; Mixtral's `num_local_experts`; either is read).
    pub count_key: &'static str,
    pub count: usize,
    pub top_k: usize,
    /// The experts' width when `moe_intermediate_size` is absent; `None`: the config's
    /// `intermediate_size`, fixed (Mixtral).
    pub width: Option<usize>,
    /// Top-k renormalisation fixed by the family (Mixtral's); `None`: `norm_topk_prob`.
    pub fixed_norm_topk: Option<bool>,
    /// llama.cpp's renormalisation when the file has no `expert_weights_norm`.
    pub gguf_norm_topk: bool,
    /// A shared expert and its default width (Qwen2-MoE's 5632).
    pub shared: Option<usize>,
    /// Dense layers through `decoder_sparse_step` / `mlp_only_layers` (refused if not).
    pub dense_layers: bool,
    /// The checkpoint's names: the MLP module, and each expert's gate, up and down.
    pub names: (&'static str, &'static str, &'static str, &'static str),
    /// The router's module under the MLP's (`gate`; gpt-oss's `router`).
    pub router: &'static str,
    /// The experts' activation ([`Activation::Silu`]; gpt-oss's clamped SwiGLU); the
    /// config's `hidden_act` does not reach the experts.
    pub act: Activation,
    /// The router and every expert projection carry a bias (gpt-oss).
    pub biases: bool,
    /// The checkpoint stores each layer's experts as gpt-oss's fused 3-D tensors
    /// (gate and up interleaved, `[E, in, out]`), not one tensor per expert.
    pub fused_interleaved: bool,
}

impl Arch {
    /// Its row of [`FAMILIES`] (read on every step: an index, not a search).
    pub fn family(self) -> &'static Family {
        &FAMILIES[self as usize]
    }

    /// The family of an HF `architectures` entry.
    pub fn from_hf_name(name: &str) -> Option<Arch> {
        FAMILIES.iter().find(|f| f.hf_name == name).map(|f| f.arch)
    }

    /// The family of an HF `model_type`.
    pub fn from_model_type(model_type: &str) -> Option<Arch> {
        FAMILIES
            .iter()
            .find(|f| f.model_type == model_type)
            .map(|f| f.arch)
    }

    /// The family of a GGUF file's `general.architecture` (llama.cpp's Mixtral is `llama`
    /// with experts: the caller tells them apart).
    pub fn from_gguf(name: &str) -> Option<Arch> {
        FAMILIES
            .iter()
            .find(|f| f.gguf == Some(name))
            .map(|f| f.arch)
    }

    /// The dense architecture whose attention and norms this one shares (itself for the
    /// dense ones).
    pub fn base(self) -> Arch {
        self.family().base
    }

    /// The HF `architectures` entry, e.g. `LlamaForCausalLM`.
    pub fn hf_name(self) -> &'static str {
        self.family().hf_name
    }

    /// The HF `model_type`, e.g. `llama`.
    pub fn model_type(self) -> &'static str {
        self.family().model_type
    }

    /// HF's default `max_position_embeddings` for the architecture.
    pub fn default_max_positions(self) -> usize {
        self.family().default_max_positions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_found_by_each_of_its_names() {
        for (i, f) in FAMILIES.into_iter().enumerate() {
            assert_eq!(
                f.arch as usize, i,
                "{}: FAMILIES follows Arch's order",
                f.hf_name
            );
            assert_eq!(f.arch.family().hf_name, f.hf_name);
            assert_eq!(Arch::from_hf_name(f.hf_name), Some(f.arch));
            assert_eq!(Arch::from_model_type(f.model_type), Some(f.arch));
            if let Some(g) = f.gguf {
                assert_eq!(Arch::from_gguf(g), Some(f.arch));
            }
            // What llama.cpp writes for it is a family of ours (Mistral's and Mixtral's
            // `llama`).
            assert!(Arch::from_gguf(f.gguf_written).is_some(), "{}", f.hf_name);
            // A family's base is dense and shares its attention (gpt-oss has no dense
            // twin: its base is itself).
            assert!(
                f.base == f.arch || f.base.family().experts.is_none(),
                "{}",
                f.hf_name
            );
        }
        assert_eq!(Arch::from_hf_name("GPT2LMHeadModel"), None);
        assert_eq!(Arch::from_gguf("mistral"), None);
    }
}
