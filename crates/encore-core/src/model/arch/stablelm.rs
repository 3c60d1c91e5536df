//! StableLM (HF `StableLmForCausalLM`, llama.cpp's `stablelm`): Llama's layer with
//! LayerNorms with a bias for the input, post-attention and final norms
//! (`layer_norm_eps`), partial rotary (`partial_rotary_factor`, 0.25 by default), q/k/v
//! biases with `use_qkv_bias` and an untied LM head. Its per-head q/k LayerNorms
//! (`qk_layernorm`) and the parallel residual of StableLM-Alpha's successors
//! (`use_parallel_residual`) are refused.

use super::{Arch, Family, NormKind, QkvBias};

pub const FAMILY: Family = Family {
    arch: Arch::StableLm,
    hf_name: "StableLmForCausalLM",
    model_type: "stablelm",
    gguf: Some("stablelm"),
    gguf_written: "stablelm",
    base: Arch::StableLm,
    default_max_positions: 4096,
    rms_norm_eps: 1e-5,
    norm_kind: NormKind::LayerBias,
    qkv_bias: QkvBias::Flag {
        key: "use_qkv_bias",
        default: false,
    },
    partial_rotary: Some(0.25),
    refused_flags: &[
        ("qk_layernorm", "per-head LayerNorms of q and k"),
        (
            "use_parallel_residual",
            "the parallel attention and MLP residual",
        ),
    ],
    gguf_permuted_qk: false,
    ..super::llama::FAMILY
};
