//! Llama-family models: HF config, weights (safetensors or dummy), the forward pass.

pub mod config;
pub mod llama;
pub mod weights;
