//! The built-in configs `dummy:NAME` names: small ones of every family for the tests and
//! the CPU, and real models' shapes (with seeded random weights) for the benchmarks.

use super::{Arch, ModelConfig, MoeConfig, NormKind, SlidingWindow};
use crate::backend::Activation;
use crate::error::{Error, Result};
use crate::model::formats::WeightFormats;
use crate::ops::{Llama3Scaling, RopeConfig, RopeScaling, YarnScaling};
use crate::tensor::DType;

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
    "tiny-gemma3",
    "tiny-gemma2",
    "tiny-olmo2",
    "tiny-stablelm",
    "tiny-gpt-oss",
    "gpt-oss-20b",
    "gpt-oss-120b",
    "gemma-3-4b",
    "phi-4-mini",
];

impl ModelConfig {
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
            o_bias: false,
            qk_norm: false,
            hidden_act: Activation::Silu,
            post_norms: false,
            embed_scale: false,
            rope_local: None,
            norm_plus_one: false,
            norm_kind: NormKind::Rms,
            query_scale: 1.0,
            attn_softcap: None,
            final_softcap: None,
            no_rope_layers: Vec::new(),
            max_position_embeddings: 2048,
            torch_dtype: DType::BF16,
            bos_token_id: Some(256),
            eos_token_ids: vec![257],
            sliding_window: None,
            full_attention_layers: Vec::new(),
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
        // Gemma 3's recipe: GELU-tanh, (1 + w) norms before and after attention and the
        // MLP, q/k head norms, the embedding times sqrt(hidden), a query scalar other than
        // the head dim, windows of 6 on layers 0-2 with their own rotary base.
        let gemma3 = ModelConfig {
            arch: Arch::Gemma3,
            hidden_act: Activation::GeluTanh,
            qk_norm: true,
            post_norms: true,
            embed_scale: true,
            norm_plus_one: true,
            query_scale: (32.0f32 / 24.0).sqrt(),
            tie_word_embeddings: true,
            sliding_window: Some(SlidingWindow {
                size: 6,
                first_layer: 0,
            }),
            full_attention_layers: vec![3],
            rope: RopeConfig {
                rot_dim: 32,
                theta: 1_000_000.0,
                scaling: None,
            },
            rope_local: Some(RopeConfig {
                rot_dim: 32,
                theta: 10_000.0,
                scaling: None,
            }),
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
            "tiny-gemma3" => gemma3,
            // Gemma 2's recipe: Gemma 3's without q/k norms or a local rotary base, with
            // windows of 6 on every other layer and attention and final logit soft-capping
            // at caps low enough to bend the tiny model's scores.
            "tiny-gemma2" => ModelConfig {
                arch: Arch::Gemma2,
                qk_norm: false,
                rope: tiny.rope,
                rope_local: None,
                attn_softcap: Some(5.0),
                final_softcap: Some(3.0),
                full_attention_layers: vec![1, 3],
                ..gemma3
            },
            // OLMo 2's recipe: norms after attention and the MLP only, q and k normed
            // across all their heads.
            "tiny-olmo2" => ModelConfig {
                arch: Arch::Olmo2,
                qk_norm: true,
                post_norms: true,
                ..tiny
            },
            // StableLM 2's recipe at widths that are not powers of two: LayerNorms with a
            // bias, a quarter of each head rotating (6 of 24 dims), q/k/v biases, 4 heads
            // over 2 KV heads (so it splits over 2 and 4 ranks) in a hidden of 96.
            "tiny-stablelm" => ModelConfig {
                arch: Arch::StableLm,
                norm_kind: NormKind::LayerBias,
                hidden_size: 96,
                intermediate_size: 200,
                head_dim: 24,
                rope: RopeConfig {
                    rot_dim: 6,
                    ..tiny.rope
                },
                qkv_bias: true,
                ..tiny
            },
            // gpt-oss's recipe at odd sizes: 3 heads of 40 over 1 KV head, q/k/v and o
            // biases, attention sinks, windows of 6 on layers 0 and 2, YaRN (factor 4 over
            // 64 positions), and 5 biased experts of 72, top 3, with the clamped SwiGLU.
            "tiny-gpt-oss" => ModelConfig {
                arch: Arch::GptOss,
                hidden_size: 120,
                intermediate_size: 72,
                num_layers: 3,
                num_heads: 3,
                num_kv_heads: 1,
                head_dim: 40,
                rope: RopeConfig {
                    rot_dim: 40,
                    theta: 150_000.0,
                    scaling: Some(RopeScaling::Yarn(YarnScaling {
                        factor: 4.0,
                        original_max_position_embeddings: 64,
                        beta_fast: 32.0,
                        beta_slow: 1.0,
                        attention_factor: YarnScaling::mscale(4.0, 1.0) as f32,
                        truncate: false,
                    })),
                },
                qkv_bias: true,
                o_bias: true,
                sliding_window: Some(SlidingWindow {
                    size: 6,
                    first_layer: 0,
                }),
                full_attention_layers: vec![1],
                moe: Some(MoeConfig {
                    num_experts: 5,
                    top_k: 3,
                    expert_intermediate: 72,
                    norm_topk_prob: true,
                    sparse: vec![true; 3],
                    shared_expert_intermediate: None,
                }),
                ..tiny.clone()
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
            // gpt-oss-20b's shapes (openai/gpt-oss-20b's config): 24 layers of 2,880, 64
            // query heads of 64 over 8 KV heads, windows of 128 on the even layers, YaRN
            // (factor 32 over 4,096 positions), 32 experts of 2,880, top 4, an untied
            // 201,088-token vocabulary. Its experts are MXFP4 as published with
            // `--quantization mxfp4`.
            "gpt-oss-20b" => ModelConfig {
                arch: Arch::GptOss,
                vocab_size: 201_088,
                hidden_size: 2880,
                intermediate_size: 2880,
                num_layers: 24,
                num_heads: 64,
                num_kv_heads: 8,
                head_dim: 64,
                rope: RopeConfig {
                    rot_dim: 64,
                    theta: 150_000.0,
                    scaling: Some(RopeScaling::Yarn(YarnScaling {
                        factor: 32.0,
                        original_max_position_embeddings: 4096,
                        beta_fast: 32.0,
                        beta_slow: 1.0,
                        attention_factor: YarnScaling::mscale(32.0, 1.0) as f32,
                        truncate: false,
                    })),
                },
                rms_norm_eps: 1e-5,
                qkv_bias: true,
                o_bias: true,
                tie_word_embeddings: false,
                max_position_embeddings: 131_072,
                sliding_window: Some(SlidingWindow {
                    size: 128,
                    first_layer: 0,
                }),
                full_attention_layers: (1..24).step_by(2).collect(),
                moe: Some(MoeConfig {
                    num_experts: 32,
                    top_k: 4,
                    expert_intermediate: 2880,
                    norm_topk_prob: true,
                    sparse: vec![true; 24],
                    shared_expert_intermediate: None,
                }),
                ..tiny.clone()
            },
            // gpt-oss-120b's shapes (openai/gpt-oss-120b's config): gpt-oss-20b's layer
            // over 36 layers with 128 experts, top 4; windows of 128 on the even layers.
            // MXFP4 experts (`--quantization mxfp4`, as published) make it ~61 GB (bf16
            // dense weights): it fits one 141 GB GPU.
            "gpt-oss-120b" => {
                let mut c = ModelConfig::dummy("gpt-oss-20b")?;
                c.num_layers = 36;
                c.full_attention_layers = (1..36).step_by(2).collect();
                if let Some(m) = c.moe.as_mut() {
                    m.num_experts = 128;
                    m.sparse = vec![true; 36];
                }
                c
            }
            // Gemma 3 4B's language model (google/gemma-3-4b-it's text config): head dim
            // 256, windows of 1,024 on five layers in six with the local base, the global
            // rotary scaled linearly by 8, a 262k vocabulary tied to the LM head.
            "gemma-3-4b" => ModelConfig {
                vocab_size: 262_208,
                hidden_size: 2560,
                intermediate_size: 10240,
                num_layers: 34,
                num_heads: 8,
                num_kv_heads: 4,
                head_dim: 256,
                query_scale: 1.0,
                rms_norm_eps: 1e-6,
                sliding_window: Some(SlidingWindow {
                    size: 1024,
                    first_layer: 0,
                }),
                full_attention_layers: (0..34).filter(|l| (l + 1) % 6 == 0).collect(),
                rope: RopeConfig {
                    rot_dim: 256,
                    theta: 1_000_000.0,
                    scaling: Some(RopeScaling::Linear { factor: 8.0 }),
                },
                rope_local: Some(RopeConfig {
                    rot_dim: 256,
                    theta: 10_000.0,
                    scaling: None,
                }),
                max_position_embeddings: 8192,
                ..gemma3.clone()
            },
            // Phi-4-mini (microsoft/Phi-4-mini-instruct): 3/4 of a head rotates, a 200k
            // vocabulary tied to the LM head (its LongRoPE left out: the same bytes).
            "phi-4-mini" => ModelConfig {
                arch: Arch::Phi3,
                vocab_size: 200_064,
                hidden_size: 3072,
                intermediate_size: 8192,
                num_layers: 32,
                num_heads: 24,
                num_kv_heads: 8,
                head_dim: 128,
                rope: RopeConfig {
                    rot_dim: 96,
                    theta: 10_000.0,
                    scaling: None,
                },
                tie_word_embeddings: true,
                max_position_embeddings: 8192,
                ..tiny.clone()
            },
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
}
