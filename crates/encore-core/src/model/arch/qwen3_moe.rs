//! Qwen3-MoE (`Qwen3MoeForCausalLM`, `qwen3_moe`; llama.cpp's `qwen3moe`): Qwen3's
//! attention with a mixture-of-experts MLP (128 experts, top 8, width 768 by default).

use super::{Activation, Arch, ExpertRules, Family, WindowRule};

pub const FAMILY: Family = Family {
    arch: Arch::Qwen3Moe,
    hf_name: "Qwen3MoeForCausalLM",
    model_type: "qwen3_moe",
    gguf: Some("qwen3moe"),
    gguf_written: "qwen3moe",
    base: Arch::Qwen3,
    window: WindowRule::Refused { needs_size: false },
    layer_types: false,
    experts: Some(ExpertRules {
        count_key: "num_experts",
        count: 128,
        top_k: 8,
        width: Some(768),
        fixed_norm_topk: None,
        gguf_norm_topk: true,
        shared: None,
        dense_layers: true,
        names: ("mlp", "gate_proj", "up_proj", "down_proj"),
        router: "gate",
        act: Activation::Silu,
        biases: false,
        fused_interleaved: false,
    }),
    ..super::qwen3::FAMILY
};
