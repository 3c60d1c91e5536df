//! OLMo 2 (`Olmo2ForCausalLM`, `olmo2`; llama.cpp's `olmo2`): Llama's layer with its
//! norms after attention and after the MLP instead of before (each block reads the
//! residual stream itself and its output is RMS-normed before the residual add), and
//! q and k RMS-normed each across all its heads before the rotary (weights `[heads *
//! head_dim]`, `[kv_heads * head_dim]`). No biases; RMSNorm epsilon 1e-5 by default.

use super::{Arch, Family, NormPlacement, QkNorm, QkvBias};

pub const FAMILY: Family = Family {
    arch: Arch::Olmo2,
    hf_name: "Olmo2ForCausalLM",
    model_type: "olmo2",
    gguf: Some("olmo2"),
    gguf_written: "olmo2",
    base: Arch::Olmo2,
    qkv_bias: QkvBias::Refused,
    qk_norm: QkNorm::Whole,
    norms: NormPlacement::Post,
    gguf_permuted_qk: false,
    rms_norm_eps: 1e-5,
    ..super::llama::FAMILY
};
