//! Gemma 2 (`Gemma2ForCausalLM`, `gemma2`; llama.cpp's `gemma2`): Gemma 3's layer without
//! q/k norms, one rotary, windows on every other layer, and tanh soft-capping of the
//! attention scores and the final logits (50 and 30 by default).

use super::{Arch, Family, GemmaRules, QkNorm};

pub const FAMILY: Family = Family {
    arch: Arch::Gemma2,
    hf_name: "Gemma2ForCausalLM",
    model_type: "gemma2",
    gguf: Some("gemma2"),
    gguf_written: "gemma2",
    base: Arch::Gemma2,
    default_max_positions: 8192,
    qk_norm: QkNorm::None,
    gemma: Some(GemmaRules {
        softcaps: Some((50.0, 30.0)),
        local_rope: false,
        pattern_key: None,
        pattern: 2,
        gguf_big_layers: 46,
        gguf_window: Some(4096),
    }),
    skips_vision_tower: false,
    ..super::gemma3::FAMILY
};
