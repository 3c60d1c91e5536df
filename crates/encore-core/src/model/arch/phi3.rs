//! Phi-3, Phi-3.5 and Phi-4 (`Phi3ForCausalLM`, `phi3`; llama.cpp's `phi3`): Llama's
//! layer with q/k/v in one `qkv_proj` and gate/up in one `gate_up_proj` (split at load),
//! partial rotary (`partial_rotary_factor`; LongRoPE for the 128k models), a sliding
//! window over every layer, no biases.

use super::{Arch, Family, QkvBias, WindowRule};

pub const FAMILY: Family = Family {
    arch: Arch::Phi3,
    hf_name: "Phi3ForCausalLM",
    model_type: "phi3",
    gguf: Some("phi3"),
    gguf_written: "phi3",
    base: Arch::Phi3,
    default_max_positions: 4096,
    qkv_bias: QkvBias::Never,
    window: WindowRule::Every { default: None },
    partial_rotary: Some(1.0),
    fused_projections: true,
    gguf_permuted_qk: false,
    rms_norm_eps: 1e-5,
    ..super::llama::FAMILY
};
