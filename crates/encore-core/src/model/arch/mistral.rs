//! Mistral (`MistralForCausalLM`, `mistral`): Llama's layer without biases, with
//! `sliding_window` over every layer. llama.cpp writes it as `llama`.

use super::{Arch, Family, QkvBias, WindowRule};

pub const FAMILY: Family = Family {
    arch: Arch::Mistral,
    hf_name: "MistralForCausalLM",
    model_type: "mistral",
    gguf: None,
    base: Arch::Mistral,
    default_max_positions: 131_072,
    qkv_bias: QkvBias::Never,
    window: WindowRule::Every { default: None },
    ..super::llama::FAMILY
};
