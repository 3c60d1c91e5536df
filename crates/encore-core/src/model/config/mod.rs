//! The model configuration: HF `config.json` parsed into [`ModelConfig`] (Llama, Mistral,
//! Qwen2, Qwen3, and the mixtures of experts Qwen2-MoE, Qwen3-MoE and Mixtral), and the
//! built-in configs behind `--model dummy:NAME`.
//!
//! Parsing follows HF transformers: absent optional fields take the defaults of the
//! architecture's `PretrainedConfig` class, and anything the forward pass cannot honour
//! (another rope scaling, an MLP bias, partial rotary) is an
//! [`Error::Config`] naming the field, never a silent change of results.

use std::path::Path;

use serde_json::{Map, Value};

use super::decl::{Role, WeightFormat};
use super::formats::WeightFormats;
use crate::backend::Activation;
use crate::error::{Error, Result};
use crate::ops::{Llama3Scaling, RopeConfig, RopeScaling};

mod rope;
use crate::tensor::DType;
use rope::parse_rope;

/// The supported model families (HF `architectures`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    /// Llama's layer without rotary embeddings in some layers (NoPE: every fourth by
    /// default, `no_rope_layers`).
    SmolLM3,
    /// Phi-3, Phi-3.5 and Phi-4 (`phi3`): Llama's layer with q/k/v in one `qkv_proj` and
    /// gate/up in one `gate_up_proj`, partial rotary (`partial_rotary_factor`), a sliding
    /// window over every layer.
    Phi3,
}

impl Arch {
    const ALL: [Arch; 9] = [
        Arch::Llama,
        Arch::Mistral,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Qwen2Moe,
        Arch::Qwen3Moe,
        Arch::Mixtral,
        Arch::SmolLM3,
        Arch::Phi3,
    ];

    /// The dense architecture whose attention and norms this one shares (itself for the
    /// dense ones).
    pub fn base(self) -> Arch {
        match self {
            Arch::Qwen2Moe => Arch::Qwen2,
            Arch::Qwen3Moe => Arch::Qwen3,
            Arch::Mixtral => Arch::Mistral,
            a => a,
        }
    }

    /// The HF `architectures` entry, e.g. `LlamaForCausalLM`.
    pub fn hf_name(self) -> &'static str {
        match self {
            Arch::Llama => "LlamaForCausalLM",
            Arch::Mistral => "MistralForCausalLM",
            Arch::Qwen2 => "Qwen2ForCausalLM",
            Arch::Qwen3 => "Qwen3ForCausalLM",
            Arch::Qwen2Moe => "Qwen2MoeForCausalLM",
            Arch::Qwen3Moe => "Qwen3MoeForCausalLM",
            Arch::Mixtral => "MixtralForCausalLM",
            Arch::SmolLM3 => "SmolLM3ForCausalLM",
            Arch::Phi3 => "Phi3ForCausalLM",
        }
    }

    /// The HF `model_type`, e.g. `llama`.
    pub fn model_type(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Mistral => "mistral",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen2Moe => "qwen2_moe",
            Arch::Qwen3Moe => "qwen3_moe",
            Arch::Mixtral => "mixtral",
            Arch::SmolLM3 => "smollm3",
            Arch::Phi3 => "phi3",
        }
    }

    /// HF's default `max_position_embeddings` for the architecture.
    fn default_max_positions(self) -> usize {
        match self.base() {
            Arch::Llama => 2048,
            Arch::Mistral => 4096 * 32,
            Arch::Phi3 => 4096,
            _ => 32768,
        }
    }
}

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
    /// Per-head RMSNorm on q and k before rope, weight `[head_dim]` (Qwen3).
    pub qk_norm: bool,
    /// The gated MLP's activation (`hidden_act`; SiLU for every family but Gemma's).
    pub hidden_act: Activation,
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

/// Names accepted by [`ModelConfig::dummy`].
const DUMMY_NAMES: &[&str] = &[
    "tiny",
    "tiny-qwen2",
    "tiny-qwen3",
    "tiny-llama3",
    "tiny-qwen3-moe",
    "tiny-mixtral",
    "tiny-qwen2-moe",
    "qwen3-30b-a3b",
    "mixtral-8x7b",
    "qwen2.5-0.5b",
    "llama-3.2-1b",
    "llama-3-8b",
    "llama-3-70b",
    "smollm2-135m",
    "tiny-smollm3",
    "tiny-phi3",
];

impl ModelConfig {
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
        parse(&Fields {
            obj,
            path,
            prefix: "",
        })
    }

    /// Read and parse an HF `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            what: "reading model config",
            path: path.display().to_string(),
            source,
        })?;
        Self::from_json(&text, &path.display().to_string())
    }

    /// A built-in config (`--model dummy:NAME`), see [`ModelConfig::dummy_names`]. The
    /// tiny ones are fast on CPU; the others have the shapes of the real models.
    /// Every dummy uses the dummy byte-level tokenizer's ids: BOS 256, EOS 257.
    pub fn dummy(name: &str) -> Result<Self> {
        let tiny = ModelConfig {
            arch: Arch::Llama,
            vocab_size: 512,
            hidden_size: 128,
            intermediate_size: 352,
            num_layers: 4,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 32,
            rope: RopeConfig {
                rot_dim: 32,
                theta: 10_000.0,
                scaling: None,
            },
            rms_norm_eps: 1e-5,
            tie_word_embeddings: false,
            qkv_bias: false,
            qk_norm: false,
            hidden_act: Activation::Silu,
            no_rope_layers: Vec::new(),
            max_position_embeddings: 2048,
            torch_dtype: DType::BF16,
            bos_token_id: Some(256),
            eos_token_ids: vec![257],
            sliding_window: None,
            weights: WeightFormats::default(),
            moe: None,
            tp: None,
            eagle: None,
        };
        let qwen = |c: ModelConfig| ModelConfig {
            rope: RopeConfig {
                theta: 1_000_000.0,
                ..c.rope
            },
            rms_norm_eps: 1e-6,
            tie_word_embeddings: true,
            ..c
        };
        let llama3_8b = ModelConfig {
            vocab_size: 128_256,
            hidden_size: 4096,
            intermediate_size: 14336,
            num_layers: 32,
            num_heads: 32,
            num_kv_heads: 8,
            head_dim: 128,
            rope: RopeConfig {
                rot_dim: 128,
                theta: 500_000.0,
                scaling: None,
            },
            max_position_embeddings: 8192,
            ..tiny.clone()
        };
        let cfg = match name {
            "tiny" => tiny,
            // Layer 3 without rotary (every fourth: transformers' default interval, and
            // llama.cpp's hard-coded one, so its GGUF twin is the same model).
            "tiny-smollm3" => ModelConfig {
                arch: Arch::SmolLM3,
                no_rope_layers: vec![3],
                tie_word_embeddings: true,
                ..tiny
            },
            // Phi-4-mini's partial rotary (3/4 of a head) and Phi-3-mini's window over
            // every layer, short enough that a short prompt crosses it.
            "tiny-phi3" => ModelConfig {
                arch: Arch::Phi3,
                rope: RopeConfig {
                    rot_dim: 24,
                    theta: 10_000.0,
                    scaling: None,
                },
                sliding_window: Some(SlidingWindow {
                    size: 8,
                    first_layer: 0,
                }),
                ..tiny
            },
            "tiny-qwen2" => qwen(ModelConfig {
                arch: Arch::Qwen2,
                qkv_bias: true,
                ..tiny
            }),
            // Like Qwen3-0.6B, head_dim is explicit and num_heads * head_dim != hidden.
            "tiny-qwen3" => qwen(ModelConfig {
                arch: Arch::Qwen3,
                head_dim: 64,
                rope: RopeConfig {
                    rot_dim: 64,
                    ..tiny.rope
                },
                qk_norm: true,
                ..tiny
            }),
            // Qwen3-MoE in small: 8 experts, top 2, renormalised; layer 0 dense (as
            // `mlp_only_layers: [0]` makes it).
            "tiny-qwen3-moe" => qwen(ModelConfig {
                arch: Arch::Qwen3Moe,
                head_dim: 64,
                rope: RopeConfig {
                    rot_dim: 64,
                    ..tiny.rope
                },
                qk_norm: true,
                moe: Some(MoeConfig {
                    num_experts: 8,
                    top_k: 2,
                    expert_intermediate: 64,
                    norm_topk_prob: true,
                    sparse: vec![false, true, true, true],
                    shared_expert_intermediate: None,
                }),
                ..tiny.clone()
            }),
            // Qwen2-MoE in small: 6 experts, top 2, not renormalised, and the gated shared
            // expert; q/k/v biases.
            "tiny-qwen2-moe" => qwen(ModelConfig {
                arch: Arch::Qwen2Moe,
                qkv_bias: true,
                moe: Some(MoeConfig {
                    num_experts: 6,
                    top_k: 2,
                    expert_intermediate: 64,
                    norm_topk_prob: false,
                    sparse: vec![true; 4],
                    shared_expert_intermediate: Some(96),
                }),
                ..tiny.clone()
            }),
            // Qwen3-30B-A3B's shapes: 128 experts of 768, top 8, 48 layers.
            "qwen3-30b-a3b" => ModelConfig {
                arch: Arch::Qwen3Moe,
                vocab_size: 151_936,
                hidden_size: 2048,
                intermediate_size: 6144,
                num_layers: 48,
                num_heads: 32,
                num_kv_heads: 4,
                head_dim: 128,
                rope: RopeConfig {
                    rot_dim: 128,
                    theta: 1_000_000.0,
                    scaling: None,
                },
                rms_norm_eps: 1e-6,
                qk_norm: true,
                tie_word_embeddings: false,
                max_position_embeddings: 40_960,
                moe: Some(MoeConfig {
                    num_experts: 128,
                    top_k: 8,
                    expert_intermediate: 768,
                    norm_topk_prob: true,
                    sparse: vec![true; 48],
                    shared_expert_intermediate: None,
                }),
                ..tiny.clone()
            },
            // Mixtral-8x7B's shapes: 8 experts of 14,336, top 2, 32 layers (93 GB in bf16:
            // run it quantized on one 80 GB card).
            "mixtral-8x7b" => ModelConfig {
                arch: Arch::Mixtral,
                vocab_size: 32_000,
                hidden_size: 4096,
                intermediate_size: 14_336,
                num_layers: 32,
                num_heads: 32,
                num_kv_heads: 8,
                head_dim: 128,
                rope: RopeConfig {
                    rot_dim: 128,
                    theta: 1_000_000.0,
                    scaling: None,
                },
                rms_norm_eps: 1e-5,
                max_position_embeddings: 32_768,
                moe: Some(MoeConfig {
                    num_experts: 8,
                    top_k: 2,
                    expert_intermediate: 14_336,
                    norm_topk_prob: true,
                    sparse: vec![true; 32],
                    shared_expert_intermediate: None,
                }),
                ..tiny.clone()
            },
            // Mixtral in small: 4 experts of Mistral's MLP width, top 2, every layer sparse.
            "tiny-mixtral" => ModelConfig {
                arch: Arch::Mixtral,
                moe: Some(MoeConfig {
                    num_experts: 4,
                    top_k: 2,
                    expert_intermediate: tiny.intermediate_size,
                    norm_topk_prob: true,
                    sparse: vec![true; 4],
                    shared_expert_intermediate: None,
                }),
                ..tiny.clone()
            },
            // original_max_position_embeddings well inside the head's wavelengths, so the
            // table has unscaled, scaled and interpolated frequencies.
            "tiny-llama3" => ModelConfig {
                rope: RopeConfig {
                    scaling: Some(RopeScaling::Llama3(Llama3Scaling {
                        factor: 4.0,
                        low_freq_factor: 1.0,
                        high_freq_factor: 4.0,
                        original_max_position_embeddings: 512,
                    })),
                    ..tiny.rope
                },
                ..tiny
            },
            "qwen2.5-0.5b" => ModelConfig {
                arch: Arch::Qwen2,
                vocab_size: 151_936,
                hidden_size: 896,
                intermediate_size: 4864,
                num_layers: 24,
                num_heads: 14,
                num_kv_heads: 2,
                head_dim: 64,
                rope: RopeConfig {
                    rot_dim: 64,
                    theta: 1_000_000.0,
                    scaling: None,
                },
                rms_norm_eps: 1e-6,
                tie_word_embeddings: true,
                qkv_bias: true,
                max_position_embeddings: 32768,
                ..tiny
            },
            "llama-3.2-1b" => ModelConfig {
                vocab_size: 128_256,
                hidden_size: 2048,
                intermediate_size: 8192,
                num_layers: 16,
                num_heads: 32,
                num_kv_heads: 8,
                head_dim: 64,
                rope: RopeConfig {
                    rot_dim: 64,
                    theta: 500_000.0,
                    scaling: Some(RopeScaling::Llama3(Llama3Scaling {
                        factor: 32.0,
                        low_freq_factor: 1.0,
                        high_freq_factor: 4.0,
                        original_max_position_embeddings: 8192,
                    })),
                },
                tie_word_embeddings: true,
                max_position_embeddings: 131_072,
                ..tiny
            },
            "llama-3-8b" => llama3_8b,
            // For tensor parallelism over 4 or more GPUs (141 GB of bf16 weights).
            "llama-3-70b" => ModelConfig {
                hidden_size: 8192,
                intermediate_size: 28672,
                num_layers: 80,
                num_heads: 64,
                ..llama3_8b
            },
            "smollm2-135m" => ModelConfig {
                vocab_size: 49_152,
                hidden_size: 576,
                intermediate_size: 1536,
                num_layers: 30,
                num_heads: 9,
                num_kv_heads: 3,
                head_dim: 64,
                rope: RopeConfig {
                    rot_dim: 64,
                    theta: 100_000.0,
                    scaling: None,
                },
                rms_norm_eps: 1e-5,
                tie_word_embeddings: true,
                max_position_embeddings: 8192,
                ..tiny
            },
            _ => {
                return Err(Error::Config {
                    path: format!("dummy:{name}"),
                    what: format!("unknown dummy model; known: {}", DUMMY_NAMES.join(", ")),
                })
            }
        };
        Ok(cfg)
    }

    /// The names [`ModelConfig::dummy`] accepts.
    pub fn dummy_names() -> &'static [&'static str] {
        DUMMY_NAMES
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

    /// Rank `rank`'s config of this model split over `size` ranks (Megatron's split):
    /// its share of the attention heads (KV heads split too, or replicated when there
    /// are fewer KV heads than ranks) and of the MLP width, and a vocabulary shard of
    /// `ceil(vocab_size / size)` rows of the embedding and LM head (padded with zero rows
    /// past the vocabulary, as vLLM pads it). A size the model's heads do not divide is
    /// refused naming both numbers. Size 1 is the model.
    pub fn shard(&self, rank: usize, size: usize) -> Result<ModelConfig> {
        if size <= 1 {
            return Ok(self.clone());
        }
        if self.tp.is_some() {
            return Err(Error::invalid(
                "tensor parallel",
                "the config is already a shard",
            ));
        }
        if rank >= size {
            return Err(Error::invalid(
                "tensor parallel",
                format!("rank {rank} of {size}"),
            ));
        }
        let refuse = |what: String| {
            Err(Error::Config {
                path: "tensor parallel".into(),
                what,
            })
        };
        if self.arch == Arch::Phi3 {
            return refuse(format!(
                "phi3 over --tensor-parallel-size {size}: its fused qkv_proj and gate_up_proj \
                 do not split over ranks yet"
            ));
        }
        let kv = self.num_kv_heads;
        if !self.num_heads.is_multiple_of(size) {
            return refuse(format!(
                "the model's {} attention heads do not divide by --tensor-parallel-size {size}",
                self.num_heads
            ));
        }
        if !(kv.is_multiple_of(size) || size.is_multiple_of(kv)) {
            return refuse(format!(
                "the model's {kv} KV heads neither divide by --tensor-parallel-size {size} \
                 nor divide it (to be replicated)"
            ));
        }
        // Every MLP (a dense layer's, each expert, the shared expert) splits its gate/up
        // rows and its down columns over the ranks in units of a block of its down
        // projection's format (1 when dense), so every share of a down row is whole
        // blocks; where the units do not divide, shares differ by one unit.
        let decl = self.decl();
        let unit = |role: Role| {
            decl.tensors()
                .iter()
                .filter(|t| t.role == role)
                .map(|t| match t.format {
                    WeightFormat::Quant(f) => (f.block_elems(), Some(f)),
                    WeightFormat::Dense => (1, None),
                })
                .max_by_key(|&(u, _)| u)
                .unwrap_or((1, None))
        };
        let (expert_width, shared_width) = self.moe.as_ref().map_or((0, None), |m| {
            (m.expert_intermediate, m.shared_expert_intermediate)
        });
        let dense = (0..self.num_layers).any(|l| self.moe.as_ref().is_none_or(|m| !m.is_sparse(l)));
        let (mlp, experts, shared) = (
            unit(Role::Down),
            unit(Role::ExpertsDown),
            unit(Role::SharedDown),
        );
        let mut widths = Vec::new();
        if dense {
            widths.push(("intermediate_size", self.intermediate_size, mlp));
        }
        if self.moe.is_some() {
            widths.push(("expert MLP width", expert_width, experts));
        }
        if let Some(s) = shared_width {
            widths.push(("shared_expert_intermediate_size", s, shared));
        }
        for (what, n, (u, format)) in widths {
            let blocks = match format {
                Some(f) if !n.is_multiple_of(u) => {
                    return refuse(format!(
                        "the model's {what} {n} is not whole blocks of {u} values ({f})"
                    ))
                }
                Some(f) => format!(" ({} blocks of {u} values in {f})", n / u),
                None => String::new(),
            };
            if n / u < size {
                return refuse(format!(
                    "the model's {what} {n}{blocks} cannot give each of \
                     --tensor-parallel-size {size} ranks a share"
                ));
            }
        }
        let (mlp_unit, expert_unit, shared_unit) = (mlp.0, experts.0, shared.0);
        let mine = |n: usize, unit: usize| crate::model::decl::share(rank, size, n, unit).1;
        let shard = ModelConfig {
            num_heads: self.num_heads / size,
            num_kv_heads: kv.div_ceil(size),
            intermediate_size: mine(self.intermediate_size, mlp_unit),
            moe: self.moe.as_ref().map(|m| MoeConfig {
                expert_intermediate: mine(m.expert_intermediate, expert_unit),
                shared_expert_intermediate: m
                    .shared_expert_intermediate
                    .map(|s| mine(s, shared_unit)),
                ..m.clone()
            }),
            tp: Some(TpShard {
                rank,
                size,
                num_heads: self.num_heads,
                num_kv_heads: kv,
                intermediate_size: self.intermediate_size,
                expert_intermediate: expert_width,
                shared_expert_intermediate: shared_width,
                mlp_unit,
                expert_unit,
                shared_unit,
            }),
            ..self.clone()
        };
        // A quantized tensor split by heads (o_proj's columns) must still be whole blocks:
        // refused here, before any rank starts, as the load would.
        shard.check_formats()?;
        Ok(shard)
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
            qkv_bias: false,
            qk_norm: false,
            sliding_window: None,
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

    /// The attention window of layer `layer`: `Some(size)` when it attends to the `size`
    /// most recent positions only, `None` for full attention.
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        self.sliding_window
            .filter(|w| layer >= w.first_layer)
            .map(|w| w.size)
    }
}

/// A JSON object being parsed, with the file path and the key prefix for messages.
/// JSON `null` counts as absent everywhere (HF writes `"head_dim": null` and the like).
struct Fields<'a> {
    obj: &'a Map<String, Value>,
    path: &'a str,
    prefix: &'a str,
}

impl<'a> Fields<'a> {
    fn err(&self, what: impl Into<String>) -> Error {
        Error::Config {
            path: self.path.to_string(),
            what: what.into(),
        }
    }

    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn wrong_type(&self, key: &str, expected: &str, found: &Value) -> Error {
        self.err(format!(
            "field `{}` must be {expected}, found {found}",
            self.name(key)
        ))
    }

    /// The value of `key` through `conv`, or a wrong-type error expecting `expected`.
    fn opt<T>(
        &self,
        key: &str,
        expected: &str,
        conv: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<Option<T>> {
        self.get(key)
            .map(|v| conv(v).ok_or_else(|| self.wrong_type(key, expected, v)))
            .transpose()
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        self.opt(key, "a non-negative integer", |v| {
            v.as_u64().and_then(|n| usize::try_from(n).ok())
        })
    }

    /// A required integer that must be at least 1.
    fn positive(&self, key: &str) -> Result<usize> {
        match self.opt_usize(key)? {
            None => Err(self.err(format!("required field `{}` is missing", self.name(key)))),
            Some(0) => Err(self.err(format!("field `{}` must be positive", self.name(key)))),
            Some(n) => Ok(n),
        }
    }

    fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        self.opt(key, "a number", Value::as_f64)
    }

    fn req_f64(&self, key: &str) -> Result<f64> {
        self.opt_f64(key)?
            .ok_or_else(|| self.err(format!("required field `{}` is missing", self.name(key))))
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.opt(key, "true or false", Value::as_bool)
    }

    fn opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        self.opt(key, "a string", Value::as_str)
    }

    fn opt_object(&self, key: &str) -> Result<Option<&'a Map<String, Value>>> {
        self.opt(key, "an object", Value::as_object)
    }

    /// One token id, or a list of them.
    fn token_ids(&self, key: &str) -> Result<Vec<u32>> {
        let as_id = |v: &Value| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| self.wrong_type(key, "a token id or a list of token ids", v))
        };
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items.iter().map(as_id).collect(),
            Some(v) => Ok(vec![as_id(v)?]),
        }
    }
}

fn parse(f: &Fields<'_>) -> Result<ModelConfig> {
    let arch = parse_arch(f)?;
    let vocab_size = f.positive("vocab_size")?;
    let hidden_size = f.positive("hidden_size")?;
    let intermediate_size = f.positive("intermediate_size")?;
    let num_layers = f.positive("num_hidden_layers")?;
    let heads = parse_heads(f, hidden_size)?;
    let hidden_act = match f.opt_str("hidden_act")? {
        None => Activation::Silu,
        Some(name) => Activation::from_hf(name).ok_or_else(|| {
            f.err(format!(
                "hidden_act = \"{name}\" is not supported (supported: {})",
                Activation::ALL.map(Activation::hf_name).join(", ")
            ))
        })?,
    };

    let max_position_embeddings = f
        .opt_usize("max_position_embeddings")?
        .unwrap_or(arch.default_max_positions());
    let rope = parse_rope(f, arch, heads.head_dim, max_position_embeddings)?;
    let rms_norm_eps = f.opt_f64("rms_norm_eps")?.unwrap_or(1e-6) as f32;
    if rms_norm_eps.is_nan() || rms_norm_eps < 0.0 {
        return Err(f.err(format!("rms_norm_eps = {rms_norm_eps} must be >= 0")));
    }
    let tie_word_embeddings = f.opt_bool("tie_word_embeddings")?.unwrap_or(false);
    let qkv_bias = parse_bias(f, arch)?;
    let sliding_window = parse_sliding_window(f, arch, num_layers)?;
    let torch_dtype = parse_torch_dtype(f)?;
    let weights = parse_quantization(f)?;
    let moe = parse_moe(f, arch, num_layers, intermediate_size)?;
    if moe.is_some() && hidden_act != Activation::Silu {
        return Err(f.err(format!(
            "hidden_act = \"{}\" with experts is not supported (the experts run SiLU)",
            hidden_act.hf_name()
        )));
    }
    let bos_token_id = f.token_ids("bos_token_id")?.first().copied();
    let eos_token_ids = f.token_ids("eos_token_id")?;

    let cfg = ModelConfig {
        arch,
        vocab_size,
        hidden_size,
        intermediate_size,
        num_layers,
        num_heads: heads.num_heads,
        num_kv_heads: heads.num_kv_heads,
        head_dim: heads.head_dim,
        rope,
        rms_norm_eps,
        tie_word_embeddings,
        qkv_bias,
        qk_norm: arch.base() == Arch::Qwen3,
        hidden_act,
        no_rope_layers: parse_no_rope_layers(f, arch, num_layers)?,
        max_position_embeddings,
        torch_dtype,
        bos_token_id,
        eos_token_ids,
        sliding_window,
        weights,
        moe,
        tp: None,
        eagle: None,
    };
    let cfg = match parse_eagle(f)? {
        None => cfg,
        Some(eagle) => cfg.into_eagle(eagle).map_err(|what| f.err(what))?,
    };
    cfg.check_sizes([
        "hidden_size",
        "intermediate_size",
        "vocab_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
    ])
    .map_err(|what| f.err(what))?;
    Ok(cfg)
}

/// The attention heads: query and KV head counts and the head dimension.
struct Heads {
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

/// `num_attention_heads`, `num_key_value_heads` (default: as many as the query heads, of
/// which they must divide the count) and `head_dim` (default: `hidden_size` over the
/// heads), which must be even.
fn parse_heads(f: &Fields<'_>, hidden_size: usize) -> Result<Heads> {
    let num_heads = f.positive("num_attention_heads")?;
    let num_kv_heads = match f.opt_usize("num_key_value_heads")? {
        None => num_heads,
        Some(_) => f.positive("num_key_value_heads")?,
    };
    if num_heads % num_kv_heads != 0 {
        return Err(f.err(format!(
            "num_attention_heads = {num_heads} is not a multiple of \
             num_key_value_heads = {num_kv_heads}"
        )));
    }
    let head_dim = match f.opt_usize("head_dim")? {
        Some(_) => f.positive("head_dim")?,
        None if hidden_size.is_multiple_of(num_heads) => hidden_size / num_heads,
        None => {
            return Err(f.err(format!(
                "hidden_size = {hidden_size} is not a multiple of num_attention_heads = \
                 {num_heads} and there is no `head_dim`"
            )))
        }
    };
    if head_dim % 2 != 0 {
        return Err(f.err(format!(
            "head_dim = {head_dim} must be even (rotary embedding)"
        )));
    }
    Ok(Heads {
        num_heads,
        num_kv_heads,
        head_dim,
    })
}

/// Attention bias as the HF modeling code builds it: Qwen2 always has q/k/v biases,
/// Mistral never; Llama and Qwen3 follow `attention_bias` (which also gives o_proj a
/// bias: the loader accepts it only when it is all zeros). Llama's `mlp_bias` is refused.
fn parse_bias(f: &Fields<'_>, arch: Arch) -> Result<bool> {
    let attention_bias = f.opt_bool("attention_bias")?.unwrap_or(false);
    let qkv_bias = match arch {
        Arch::Qwen2 => true,
        // Qwen2-MoE's q/k/v biases follow `qkv_bias` (default true).
        Arch::Qwen2Moe => f.opt_bool("qkv_bias")?.unwrap_or(true),
        Arch::Mistral | Arch::Mixtral => false,
        Arch::Llama | Arch::Qwen3 | Arch::Qwen3Moe | Arch::SmolLM3 => attention_bias,
        // Its qkv_proj has no bias.
        Arch::Phi3 => false,
    };
    if matches!(arch, Arch::Llama | Arch::SmolLM3) && f.opt_bool("mlp_bias")? == Some(true) {
        return Err(f.err("mlp_bias = true is not supported (the MLP has no bias in encore)"));
    }
    Ok(qkv_bias)
}

/// `quantization_config`: FP8 checkpoints (`quant_method: "fp8"`, weights in E4M3 with
/// per-tensor scales or 128x128 blocks of `weight_scale_inv`) keep their projections in
/// FP8; any other method is refused naming it (encore would read its packed tensors as
/// garbage).
fn parse_quantization(f: &Fields<'_>) -> Result<WeightFormats> {
    let Some(obj) = f.opt_object("quantization_config")? else {
        return Ok(WeightFormats::default());
    };
    let q = Fields {
        obj,
        path: f.path,
        prefix: "quantization_config.",
    };
    let method = q.opt_str("quant_method")?.unwrap_or("");
    if method != "fp8" {
        return Err(q.err(format!(
            "quantization_config.quant_method = \"{method}\" is not supported (encore loads \"fp8\" \
             checkpoints; GGUF files carry their own block formats)"
        )));
    }
    if let Some(fmt) = q.opt_str("fmt")? {
        if fmt != "e4m3" {
            return Err(q.err(format!(
                "quantization_config.fmt = \"{fmt}\" is not supported (only e4m3)"
            )));
        }
    }
    match q.get("weight_block_size") {
        None | Some(Value::Null) => {}
        Some(Value::Array(b)) if b.len() == 2 && b.iter().all(|x| x.as_u64() == Some(128)) => {}
        Some(v) => {
            return Err(q.err(format!(
                "quantization_config.weight_block_size = {v} is not supported (per-tensor \
                 scales or [128, 128])"
            )))
        }
    }
    Ok(WeightFormats {
        projections: Some(encore_backend::quant::QuantFormat::F8E4M3),
        per_tensor: Default::default(),
    })
}

/// The experts of the MoE architectures, with transformers' defaults for absent fields
/// (Qwen2-MoE: 60 experts, top 4, width 1408, shared expert 5632; Qwen3-MoE: 128, top 8,
/// width 768; Mixtral: 8, top 2, its `intermediate_size`); `None` for the dense ones.
/// Sizes no model has, a top-k above the expert count, or a dense layer of a Mixtral are
/// refused naming the field.
fn parse_moe(
    f: &Fields<'_>,
    arch: Arch,
    num_layers: usize,
    intermediate_size: usize,
) -> Result<Option<MoeConfig>> {
    let (experts_key, experts, top_k, width) = match arch {
        Arch::Qwen2Moe => ("num_experts", 60, 4, 1408),
        Arch::Qwen3Moe => ("num_experts", 128, 8, 768),
        Arch::Mixtral => ("num_local_experts", 8, 2, intermediate_size),
        _ => return Ok(None),
    };
    let positive = |key: &str, default: usize| -> Result<usize> {
        match f.opt_usize(key)? {
            None => Ok(default),
            Some(_) => f.positive(key),
        }
    };
    // transformers 5 writes either name (its configs alias one to the other).
    let alias = match experts_key {
        "num_experts" => "num_local_experts",
        _ => "num_experts",
    };
    let experts_key = match f.get(experts_key) {
        None if f.get(alias).is_some() => alias,
        _ => experts_key,
    };
    let num_experts = positive(experts_key, experts)?;
    let top_k = positive("num_experts_per_tok", top_k)?;
    if top_k > num_experts {
        return Err(f.err(format!(
            "num_experts_per_tok = {top_k} is more than the {num_experts} experts"
        )));
    }
    let expert_intermediate = match arch {
        Arch::Mixtral => width,
        _ => positive("moe_intermediate_size", width)?,
    };
    let norm_topk_prob = match arch {
        Arch::Mixtral => true,
        _ => f.opt_bool("norm_topk_prob")?.unwrap_or(false),
    };
    let step = positive("decoder_sparse_step", 1)?;
    let dense: Vec<usize> = match f.get("mlp_only_layers") {
        None => Vec::new(),
        Some(v) => v
            .as_array()
            .and_then(|a| {
                a.iter()
                    .map(|x| x.as_u64().and_then(|n| usize::try_from(n).ok()))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| f.wrong_type("mlp_only_layers", "a list of layer indices", v))?,
    };
    if arch == Arch::Mixtral && (step != 1 || !dense.is_empty()) {
        return Err(f.err(
            "decoder_sparse_step / mlp_only_layers are not Mixtral fields (every layer is sparse)",
        ));
    }
    let sparse = (0..num_layers)
        .map(|l| !dense.contains(&l) && (l + 1) % step == 0)
        .collect();
    let shared_expert_intermediate = match arch {
        Arch::Qwen2Moe => match f.opt_usize("shared_expert_intermediate_size")? {
            Some(0) => None,
            None => Some(5632),
            Some(n) => Some(n),
        },
        _ => None,
    };
    let moe = MoeConfig {
        num_experts,
        top_k,
        expert_intermediate,
        norm_topk_prob,
        sparse,
        shared_expert_intermediate,
    };
    moe.check_sizes([
        experts_key,
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
    ])
    .map_err(|what| f.err(what))?;
    Ok(Some(moe))
}

/// The checkpoint's dtype: `torch_dtype`, else `dtype` (transformers 5), else bf16.
fn parse_torch_dtype(f: &Fields<'_>) -> Result<DType> {
    Ok(match f.opt_str("torch_dtype")?.or(f.opt_str("dtype")?) {
        None => DType::BF16,
        Some(s) => DType::parse_float(s).ok_or_else(|| {
            f.err(format!(
                "torch_dtype = \"{s}\" is not supported (expected {})",
                DType::FLOAT_NAMES
            ))
        })?,
    })
}

/// An EAGLE-3 head's fields, when `architectures` names one (a class name with
/// `Eagle3` in it, e.g. `LlamaForCausalLMEagle3`).
fn parse_eagle(f: &Fields<'_>) -> Result<Option<(EagleConfig, usize)>> {
    let Some(names) = f.get("architectures").and_then(Value::as_array) else {
        return Ok(None);
    };
    if !names
        .iter()
        .filter_map(Value::as_str)
        .any(|n| n.contains("Eagle3"))
    {
        return Ok(None);
    }
    let target_vocab = f.positive("vocab_size")?;
    let draft_vocab = f.opt_usize("draft_vocab_size")?.unwrap_or(target_vocab);
    if draft_vocab == 0 || draft_vocab > target_vocab {
        return Err(f.err(format!(
            "draft_vocab_size = {draft_vocab} must be 1 to vocab_size ({target_vocab})"
        )));
    }
    let hidden = f.positive("hidden_size")?;
    let target_hidden = f.opt_usize("target_hidden_size")?.unwrap_or(hidden);
    // Pinned layers. vLLM's (speculators) top-level field names the layers whose input
    // the head reads; SGLang's `eagle_config` field names the layers whose output it
    // reads, the input of the next.
    let three = |f: &Fields<'_>| -> Result<Option<[usize; 3]>> {
        const KEY: &str = "eagle_aux_hidden_state_layer_ids";
        let Some(v) = f.get(KEY) else {
            return Ok(None);
        };
        let ids: Option<Vec<usize>> = v.as_array().and_then(|a| {
            a.iter()
                .map(|x| x.as_u64().and_then(|n| usize::try_from(n).ok()))
                .collect()
        });
        match ids.as_deref() {
            Some(&[a, b, c]) => Ok(Some([a, b, c])),
            _ => Err(f.wrong_type(KEY, "a list of three layer indices", v)),
        }
    };
    let aux_layers = match three(f)? {
        Some(l) => Some(l),
        None => match f.opt_object("eagle_config")? {
            None => None,
            Some(obj) => three(&Fields {
                obj,
                path: f.path,
                prefix: "eagle_config.",
            })?
            .map(|l| l.map(|x| x.saturating_add(1))),
        },
    };
    let norm_before_residual = f.opt_bool("norm_before_residual")?.unwrap_or(false);
    Ok(Some((
        EagleConfig {
            target_vocab,
            target_hidden,
            aux_layers,
            norm_before_residual,
        },
        draft_vocab,
    )))
}

/// `architectures` (the first one encore knows), else `model_type`. An EAGLE-3 head
/// (`LlamaForCausalLMEagle3`) is a Llama layer.
fn parse_arch(f: &Fields<'_>) -> Result<Arch> {
    if let Some(v) = f.get("architectures") {
        let eagle = v.as_array().is_some_and(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .any(|n| n.contains("Eagle3"))
        });
        if eagle {
            return Ok(Arch::Llama);
        }
        let names: Vec<&str> = v
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if names.is_empty() {
            return Err(f.wrong_type("architectures", "a list of class names", v));
        }
        return names
            .iter()
            .find_map(|n| Arch::ALL.into_iter().find(|a| a.hf_name() == *n))
            .ok_or_else(|| {
                f.err(format!(
                    "unsupported architecture {names:?} (supported: {})",
                    Arch::ALL.map(Arch::hf_name).join(", ")
                ))
            });
    }
    match f.opt_str("model_type")? {
        Some(t) => Arch::ALL
            .into_iter()
            .find(|a| a.model_type() == t)
            .ok_or_else(|| {
                f.err(format!(
                    "unsupported model_type \"{t}\" (supported: {})",
                    Arch::ALL.map(Arch::model_type).join(", ")
                ))
            }),
        None => Err(f.err("required field `architectures` (or `model_type`) is missing")),
    }
}

/// SmolLM3's NoPE layers: `no_rope_layers` (one entry a layer at least, 1 = rotary, 0 =
/// none), else every `no_rope_layer_interval`-th layer (default 4: layers 3, 7, ...), as
/// transformers builds them. Empty for the other families.
fn parse_no_rope_layers(f: &Fields<'_>, arch: Arch, num_layers: usize) -> Result<Vec<usize>> {
    if arch != Arch::SmolLM3 {
        return Ok(Vec::new());
    }
    if let Some(v) = f.get("no_rope_layers").filter(|v| !v.is_null()) {
        let flags: Option<Vec<u64>> = v
            .as_array()
            .map(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>())
            .unwrap_or(None);
        let flags = flags
            .filter(|l| l.iter().all(|&x| x <= 1))
            .ok_or_else(|| f.wrong_type("no_rope_layers", "a list of 0 and 1", v))?;
        if flags.len() < num_layers {
            return Err(f.err(format!(
                "no_rope_layers has {} entries for {num_layers} layers",
                flags.len()
            )));
        }
        return Ok((0..num_layers).filter(|&i| flags[i] == 0).collect());
    }
    let step = f.opt_usize("no_rope_layer_interval")?.unwrap_or(4);
    if step == 0 {
        return Err(f.err(format!(
            "field `{}` must be positive",
            f.name("no_rope_layer_interval")
        )));
    }
    Ok((0..num_layers).filter(|i| (i + 1) % step == 0).collect())
}

/// The window as transformers builds its layer types: Mistral's `sliding_window` applies
/// to every layer; Qwen2/Qwen3's only when `use_sliding_window` is true, and then to the
/// layers from `max_window_layers` on (default: every layer); Phi-3's covers every layer.
/// Llama has none. A window that covers every position the model can reach is kept: it
/// changes nothing.
fn parse_sliding_window(
    f: &Fields<'_>,
    arch: Arch,
    num_layers: usize,
) -> Result<Option<SlidingWindow>> {
    let first_layer = match arch {
        Arch::Llama => return Ok(None),
        // Its window (on the NoPE layers only) is off in every released checkpoint.
        Arch::SmolLM3 => {
            if f.opt_bool("use_sliding_window")? == Some(true)
                && f.opt_usize("sliding_window")?.is_some()
            {
                return Err(f.err(
                    "use_sliding_window = true is not supported for smollm3 (a window on its NoPE layers)",
                ));
            }
            return Ok(None);
        }
        Arch::Mistral | Arch::Mixtral | Arch::Phi3 => 0,
        // Their windows alternate over layers (Qwen2-MoE) or cover every layer (Qwen3-MoE);
        // no released checkpoint turns them on.
        Arch::Qwen2Moe | Arch::Qwen3Moe => {
            if f.opt_bool("use_sliding_window")? == Some(true) {
                return Err(f.err(format!(
                    "use_sliding_window = true is not supported for {}",
                    arch.model_type()
                )));
            }
            return Ok(None);
        }
        Arch::Qwen2 | Arch::Qwen3 => {
            if f.opt_bool("use_sliding_window")? != Some(true) {
                return Ok(None);
            }
            f.opt_usize("max_window_layers")?.unwrap_or(0)
        }
    };
    let size = match f.opt_usize("sliding_window")? {
        None => return Ok(None),
        Some(0) => {
            return Err(f.err(format!(
                "field `{}` must be positive",
                f.name("sliding_window")
            )))
        }
        Some(n) => n,
    };
    if first_layer >= num_layers {
        return Ok(None);
    }
    Ok(Some(SlidingWindow { size, first_layer }))
}
