//! vLLM's `/tokenize` and `/detokenize` over the model's tokenizer: a prompt (or a
//! conversation rendered with the chat template, as chat completions render it) to token
//! ids, and token ids back to text.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::body::{read, DetokenizeBody, TokenizeBody, TokenizeInput};
use crate::error::ApiError;
use crate::{fields, AppState};

/// `{"count", "max_model_len", "tokens"}` of a `prompt` or of `messages`.
pub(crate) async fn tokenize(
    State(s): State<Arc<AppState>>,
    body: Result<Json<Value>, JsonRejection>,
) -> Response {
    let ids = read::<TokenizeBody>(body, fields::TOKENIZE)
        .and_then(|b| b.validate(&s.cfg.served_model_name))
        .and_then(|(input, special)| {
            let (text, param) = match input {
                TokenizeInput::Text(p) => (p, "prompt"),
                TokenizeInput::Chat { messages, mut opts } => {
                    // As chat completions render it.
                    let (messages, defs) =
                        crate::generic_tools::for_template(&s, messages, opts.tools.take());
                    opts.tools = defs;
                    let text = s
                        .tokenizer
                        .render_chat(&messages, &opts)
                        .map_err(|e| ApiError::bad("messages", e.to_string()))?;
                    (text, "messages")
                }
            };
            s.tokenizer
                .encode(&text, special)
                .map_err(|e| ApiError::bad(param, e.to_string()))
        });
    match ids {
        Ok(ids) => Json(json!({
            "count": ids.len(), "max_model_len": s.engine.max_seq_len, "tokens": ids,
        }))
        .into_response(),
        Err(e) => e.into_response(),
    }
}

/// `{"prompt": text}` of `tokens` (special tokens written out).
pub(crate) async fn detokenize(
    State(s): State<Arc<AppState>>,
    body: Result<Json<Value>, JsonRejection>,
) -> Response {
    let text = read::<DetokenizeBody>(body, fields::DETOKENIZE)
        .and_then(|b| b.validate(&s.cfg.served_model_name, s.tokenizer.vocab_size()))
        .and_then(|ids| {
            s.tokenizer
                .decode(&ids, false)
                .map_err(|e| ApiError::bad("tokens", e.to_string()))
        });
    match text {
        Ok(text) => Json(json!({ "prompt": text })).into_response(),
        Err(e) => e.into_response(),
    }
}
