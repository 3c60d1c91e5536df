//! Llama-family models: HF config, the declaration of the model's tensors ([`decl`]),
//! weights (safetensors, GGUF or dummy), the forward pass, and [`open_model`], which resolves a `--model` spec.

pub mod config;
pub mod decl;
pub mod gguf;
pub mod llama;
mod open;
pub mod weights;

pub use open::{open_model, open_tokenizer, ModelFiles};
