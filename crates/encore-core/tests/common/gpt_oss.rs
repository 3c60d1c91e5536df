//! Small gpt-oss configs for the feature tests (speculation, tensor parallelism, the
//! expert cache): `tiny-gpt-oss`'s recipe (attention sinks, windowed layers 0 and 2 that
//! the tests' prompts and outputs cross, YaRN, q/k/v and o biases, a biased router and
//! biased experts running the clamped SwiGLU) at the shapes each feature needs.

use encore_core::model::config::{ModelConfig, SlidingWindow};
use encore_core::quant::QuantFormat;

/// Odd shapes for speculation: 6 heads of 40 over 3 KV heads, hidden 120, 7 experts of
/// 72, top 3, windows of 5 on layers 0 and 2, a vocabulary of 64.
pub fn odd() -> ModelConfig {
    let mut c = ModelConfig::dummy("tiny-gpt-oss").unwrap();
    (c.num_heads, c.num_kv_heads, c.vocab_size) = (6, 3, 64);
    c.sliding_window = Some(SlidingWindow {
        size: 5,
        first_layer: 0,
    });
    let moe = c.moe.as_mut().unwrap();
    (moe.num_experts, moe.top_k) = (7, 3);
    c
}

/// A gpt-oss the ranks split and whose experts MXFP4 holds: 4 heads of 40 over 2 KV heads
/// (split over 2 ranks, replicated over 4), hidden 128, `experts` experts of 128 (4
/// MXFP4 blocks of 32: one a rank over 4), top 3, windows of 6 on layers 0 and 2; the
/// experts in MXFP4 with `mxfp4` (everything else dense).
pub fn splittable(experts: usize, mxfp4: bool) -> ModelConfig {
    let mut c = ModelConfig::dummy("tiny-gpt-oss").unwrap();
    (c.num_heads, c.num_kv_heads, c.hidden_size) = (4, 2, 128);
    c.intermediate_size = 128;
    let moe = c.moe.as_mut().unwrap();
    (moe.num_experts, moe.expert_intermediate) = (experts, 128);
    if mxfp4 {
        c.weights.experts = Some(QuantFormat::Mxfp4);
    }
    c
}
