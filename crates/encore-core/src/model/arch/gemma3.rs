//! Gemma 3's language model (`Gemma3ForCausalLM`, `gemma3_text`, and the language model
//! of `Gemma3ForConditionalGeneration` checkpoints, whose vision tower is skipped;
//! llama.cpp's `gemma3`): GELU-tanh, (1 + w) RMSNorms before and after attention and the
//! MLP, per-head q/k norms, the embedding times sqrt(hidden), the query scaled by
//! `query_pre_attn_scalar`, windowed layers (five in six, `sliding_window_pattern` or
//! `layer_types`) rotating with their own base, tied embeddings.

use super::{Activation, Arch, Family, GemmaRules, NormPlacement, QkNorm, QkvBias, WindowRule};

pub const FAMILY: Family = Family {
    arch: Arch::Gemma3,
    hf_name: "Gemma3ForCausalLM",
    model_type: "gemma3_text",
    // llama.cpp's gemma3 files hold the norms as 1 + w and name the post norms apart.
    gguf: Some("gemma3"),
    gguf_written: "gemma3",
    base: Arch::Gemma3,
    default_max_positions: 131_072,
    act: Activation::GeluTanh,
    act_key: "hidden_activation",
    tie: true,
    qkv_bias: QkvBias::Refused,
    qk_norm: QkNorm::PerHead,
    norms: NormPlacement::PreAndPost,
    norm_plus_one: true,
    embed_scale: true,
    window: WindowRule::Every {
        default: Some(4096),
    },
    layer_types: true,
    gemma: Some(GemmaRules {
        softcaps: None,
        local_rope: true,
        pattern_key: Some("sliding_window_pattern"),
        pattern: 6,
        gguf_big_layers: 62,
        gguf_window: None,
    }),
    gguf_permuted_qk: false,
    skips_vision_tower: true,
    ..super::llama::FAMILY
};
