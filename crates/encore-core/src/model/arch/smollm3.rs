//! SmolLM3 (`SmolLM3ForCausalLM`, `smollm3`; llama.cpp's `smollm3`): Llama's layer
//! without rotary embeddings in some layers (NoPE: `no_rope_layers`, else every fourth).
//! Its window (on the NoPE layers only) is off in every released checkpoint: refused.

use super::{Arch, Family, WindowRule};

pub const FAMILY: Family = Family {
    arch: Arch::SmolLM3,
    hf_name: "SmolLM3ForCausalLM",
    model_type: "smollm3",
    gguf: Some("smollm3"),
    gguf_written: "smollm3",
    base: Arch::SmolLM3,
    default_max_positions: 32768,
    window: WindowRule::Refused { needs_size: true },
    no_rope_interval: Some(4),
    tie: true,
    ..super::llama::FAMILY
};
