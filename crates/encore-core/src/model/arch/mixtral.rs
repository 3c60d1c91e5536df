//! Mixtral (`MixtralForCausalLM`, `mixtral`): Mistral's attention with a
//! mixture-of-experts MLP in every layer (8 experts, top 2, renormalised, the config's
//! `intermediate_size` wide), named `block_sparse_moe.experts.N.w1/w3/w2`. llama.cpp
//! writes it as `llama` with experts.

use super::{Activation, Arch, ExpertRules, Family};

pub const FAMILY: Family = Family {
    arch: Arch::Mixtral,
    hf_name: "MixtralForCausalLM",
    model_type: "mixtral",
    experts: Some(ExpertRules {
        count_key: "num_local_experts",
        count: 8,
        top_k: 2,
        width: None,
        fixed_norm_topk: Some(true),
        gguf_norm_topk: true,
        shared: None,
        dense_layers: false,
        names: ("block_sparse_moe", "w1", "w3", "w2"),
        router: "gate",
        act: Activation::Silu,
        biases: false,
        fused_interleaved: false,
    }),
    rms_norm_eps: 1e-5,
    ..super::mistral::FAMILY
};
