//! Llama-family models: HF config, the one declaration of the model's tensors ([`decl`],
//! from which the loader, offload, the byte and parameter counts and the op ids derive),
//! weights (safetensors, GGUF or dummy), the forward pass, and [`open_model`], which
//! resolves a `--model` spec (a path, `dummy:NAME`, or a Hub id through [`hub`]) into
//! [`ModelFiles`] (owned: it can be handed to the engine thread).

pub mod arch;
pub mod config;
pub mod decl;
pub mod formats;
pub mod gguf;
pub mod hub;
pub mod llama;
mod open;
pub mod routing;
mod tp;
pub mod weights;

pub use open::{open_local_model, open_model, open_model_at, open_tokenizer, ModelFiles};
