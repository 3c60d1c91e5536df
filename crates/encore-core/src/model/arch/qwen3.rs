//! Qwen3 (`Qwen3ForCausalLM`, `qwen3`; llama.cpp's `qwen3`): Qwen2's layer with per-head
//! q/k RMSNorms and biases only with `attention_bias`.

use super::{Arch, Family, QkNorm, QkvBias};

pub const FAMILY: Family = Family {
    arch: Arch::Qwen3,
    hf_name: "Qwen3ForCausalLM",
    model_type: "qwen3",
    gguf: Some("qwen3"),
    gguf_written: "qwen3",
    base: Arch::Qwen3,
    qkv_bias: QkvBias::AttentionBias,
    qk_norm: QkNorm::PerHead,
    ..super::qwen2::FAMILY
};
