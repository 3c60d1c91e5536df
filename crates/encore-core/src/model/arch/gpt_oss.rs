//! gpt-oss (`GptOssForCausalLM`, transformers' `gpt_oss`; llama.cpp's `gpt-oss`): Llama's
//! pre-norm layer with q/k/v and o biases (`attention_bias`, true by default), one learned
//! attention sink per head (`self_attn.sinks`: an extra logit in every softmax), sliding-
//! window layers (`sliding_window`, 128) alternating with full ones (`layer_types`; without
//! it layer 0 slides, layer 1 attends fully, ...), YaRN rotary, and a mixture of experts
//! in every layer: a router with a bias (`mlp.router`) whose top-k logits are softmaxed
//! (the renormalised softmax of them all), and experts with biases running the clamped
//! SwiGLU ([`Activation::SwigluOai`]), stored as fused 3-D tensors
//! (`mlp.experts.gate_up_proj` `[E, hidden, 2 I]`, gate and up interleaved, with
//! `gate_up_proj_bias` `[E, 2 I]`; `down_proj` `[E, I, hidden]`, `down_proj_bias`
//! `[E, hidden]`), which the loader transposes and de-interleaves into the stacks
//! (`model/weights/fused_experts.rs`).

use super::{Activation, Arch, ExpertRules, Family, QkvBias, WindowRule};

pub const FAMILY: Family = Family {
    arch: Arch::GptOss,
    hf_name: "GptOssForCausalLM",
    model_type: "gpt_oss",
    gguf: Some("gpt-oss"),
    gguf_written: "gpt-oss",
    base: Arch::GptOss,
    default_max_positions: 131_072,
    default_theta: 150_000.0,
    rope_required: true,
    rms_norm_eps: 1e-5,
    qkv_bias: QkvBias::WithOutput { default: true },
    window: WindowRule::Every { default: Some(128) },
    layer_types: true,
    full_every: Some(2),
    sinks: true,
    experts: Some(ExpertRules {
        count_key: "num_local_experts",
        count: 128,
        top_k: 4,
        width: None,
        fixed_norm_topk: Some(true),
        gguf_norm_topk: true,
        shared: None,
        dense_layers: false,
        names: ("mlp", "gate_proj", "up_proj", "down_proj"),
        router: "router",
        act: Activation::SwigluOai,
        biases: true,
        fused_interleaved: true,
    }),
    gguf_permuted_qk: false,
    ..super::llama::FAMILY
};
