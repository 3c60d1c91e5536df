//! A [`Tokenizer`] built from the `tokenizer.*` metadata of a GGUF file.
//!
//! The GGUF reader (`model::gguf`) fills a [`GgufVocab`]; this module turns it into a
//! tokenizer that encodes like the Hugging Face tokenizer the file was converted from.

use super::Tokenizer;
use crate::error::{Error, Result};

/// The `tokenizer.ggml.*` and `tokenizer.chat_template` values of a GGUF file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE) or `llama` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer name llama.cpp gives (`llama-bpe`,
    /// `qwen2`, `smollm`, `default`, ...), when present.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, indexed by token id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores` (SentencePiece vocabularies).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type`: 1 normal, 2 unknown, 3 control, 4 user-defined,
    /// 5 unused, 6 byte.
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges` (BPE), `"left right"` per entry, highest priority first.
    pub merges: Option<Vec<String>>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub unknown_token_id: Option<u32>,
    pub padding_token_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token` / `add_eos_token` / `add_space_prefix`.
    pub add_bos_token: Option<bool>,
    pub add_eos_token: Option<bool>,
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}

impl Tokenizer {
    /// The tokenizer a GGUF file describes; `origin` (the file path) names it in errors.
    pub fn from_gguf_vocab(vocab: &GgufVocab, origin: &str) -> Result<Tokenizer> {
        let _ = vocab;
        Err(Error::Tokenizer(format!(
            "`{origin}`: building a tokenizer from GGUF metadata is not implemented yet"
        )))
    }
}
