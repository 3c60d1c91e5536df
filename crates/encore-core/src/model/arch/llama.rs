//! Llama (`LlamaForCausalLM`, `llama`; llama.cpp's `llama`): the layer every other family
//! varies — RMSNorm before attention and before the MLP, SwiGLU, full rotary (scaling
//! `linear`, `llama3`, `yarn`, `dynamic`), q/k/v biases with `attention_bias`.

use super::{Activation, Arch, Family, NormKind, NormPlacement, QkNorm, QkvBias, WindowRule};

pub const FAMILY: Family = Family {
    arch: Arch::Llama,
    hf_name: "LlamaForCausalLM",
    model_type: "llama",
    gguf: Some("llama"),
    gguf_written: "llama",
    base: Arch::Llama,
    default_max_positions: 2048,
    default_theta: 10_000.0,
    rope_required: false,
    act: Activation::Silu,
    act_key: "hidden_act",
    tie: false,
    rms_norm_eps: 1e-6,
    norm_kind: NormKind::Rms,
    qkv_bias: QkvBias::AttentionBias,
    qk_norm: QkNorm::None,
    norms: NormPlacement::Pre,
    norm_plus_one: false,
    embed_scale: false,
    window: WindowRule::None,
    layer_types: false,
    full_every: None,
    sinks: false,
    partial_rotary: None,
    refused_flags: &[],
    no_rope_interval: None,
    gemma: None,
    experts: None,
    fused_projections: false,
    gguf_permuted_qk: true,
    skips_vision_tower: false,
};
