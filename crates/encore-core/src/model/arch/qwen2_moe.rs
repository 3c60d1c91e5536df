//! Qwen2-MoE (`Qwen2MoeForCausalLM`, `qwen2_moe`; llama.cpp's `qwen2moe`): Qwen2's
//! attention (biases per `qkv_bias`) with a mixture-of-experts MLP (60 experts, top 4,
//! width 1408 by default) and a sigmoid-gated shared expert.

use super::{Activation, Arch, ExpertRules, Family, QkvBias, WindowRule};

pub const FAMILY: Family = Family {
    arch: Arch::Qwen2Moe,
    hf_name: "Qwen2MoeForCausalLM",
    model_type: "qwen2_moe",
    gguf: Some("qwen2moe"),
    gguf_written: "qwen2moe",
    base: Arch::Qwen2,
    qkv_bias: QkvBias::Flag {
        key: "qkv_bias",
        default: true,
    },
    window: WindowRule::Refused { needs_size: false },
    layer_types: false,
    experts: Some(ExpertRules {
        count_key: "num_experts",
        count: 60,
        top_k: 4,
        width: Some(1408),
        fixed_norm_topk: None,
        gguf_norm_topk: false,
        shared: Some(5632),
        dense_layers: true,
        names: ("mlp", "gate_proj", "up_proj", "down_proj"),
        router: "gate",
        act: Activation::Silu,
        biases: false,
        fused_interleaved: false,
    }),
    ..super::qwen2::FAMILY
};
