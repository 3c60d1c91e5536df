//! Qwen2 (`Qwen2ForCausalLM`, `qwen2`; llama.cpp's `qwen2`): Llama's layer with q/k/v
//! biases always, a window only with `use_sliding_window` (from `max_window_layers` on,
//! or on the layers `layer_types` names).

use super::{Arch, Family, QkvBias, WindowRule};

pub const FAMILY: Family = Family {
    arch: Arch::Qwen2,
    hf_name: "Qwen2ForCausalLM",
    model_type: "qwen2",
    gguf: Some("qwen2"),
    gguf_written: "qwen2",
    base: Arch::Qwen2,
    default_max_positions: 32768,
    qkv_bias: QkvBias::Always,
    window: WindowRule::OptIn,
    layer_types: true,
    gguf_permuted_qk: false,
    ..super::llama::FAMILY
};
