//! vLLM's `/tokenize` and `/detokenize` over the model's tokenizer: a prompt (or a
//! conversation rendered with the chat template, as chat completions render it) to token
//! ids, and token ids back to text; their bodies, read and validated as `body` reads the
//! generation endpoints'.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;
use utoipa::ToSchema;

use encore_core::tokenizer::{ChatMessage, ChatOptions};
use serde::{Deserialize, Serialize};

use crate::body::{check_model, read, template_kwargs, Field};
use crate::chat_messages::messages;
use crate::error::ApiError;
use crate::request_tools::ChatTool;
use crate::tools::Tools;
use crate::wire::{DetokenizeResponse, TokenizeResponse};
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
                    let text = crate::generate::render(&s, &messages, &opts)?;
                    (text, "messages")
                }
            };
            s.tokenizer
                .encode(&text, special)
                .map_err(|e| ApiError::bad(param, e.to_string()))
        });
    match ids {
        Ok(ids) => Json(TokenizeResponse {
            count: ids.len(),
            max_model_len: s.engine.max_seq_len,
            tokens: ids,
        })
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
        Ok(text) => Json(DetokenizeResponse { prompt: text }).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The body of `/tokenize` (vLLM's): a `prompt`, or `messages` rendered with the chat
/// template.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct TokenizeBody {
    #[schema(value_type = Option<String>)]
    model: Field<String>,
    #[schema(value_type = Option<String>)]
    prompt: Field<String>,
    #[schema(value_type = Option<Vec<Object>>)]
    messages: Field<Vec<Value>>,
    #[schema(value_type = Option<bool>)]
    add_special_tokens: Field<bool>,
    #[schema(value_type = Option<bool>)]
    add_generation_prompt: Field<bool>,
    #[schema(value_type = Option<Vec<ChatTool>>)]
    tools: Field<Vec<Value>>,
    #[schema(value_type = Option<std::collections::HashMap<String, serde_json::Value>>)]
    chat_template_kwargs: Field<serde_json::Map<String, Value>>,
}

/// What `/tokenize` encodes.
pub(crate) enum TokenizeInput {
    Text(String),
    Chat {
        messages: Vec<ChatMessage>,
        opts: ChatOptions,
    },
}

impl TokenizeBody {
    /// The input and whether to add the tokenizer's special tokens.
    pub fn validate(self, served: &str) -> Result<(TokenizeInput, bool), ApiError> {
        check_model(self.model, served, false)?;
        let special = self.add_special_tokens.get("add_special_tokens", || {
            "`add_special_tokens` must be a boolean".into()
        })?;
        let gen = self
            .add_generation_prompt
            .get("add_generation_prompt", || {
                "`add_generation_prompt` must be a boolean".into()
            })?;
        let prompt = self
            .prompt
            .get("prompt", || "`prompt` must be a string".into())?;
        let kwargs = template_kwargs(self.chat_template_kwargs)?;
        let tools = Tools::read(self.tools, Field::Absent, Field::Absent)?;
        if prompt.is_some() && (tools.is_some() || !kwargs.is_empty()) {
            let p = if tools.is_some() {
                "tools"
            } else {
                "chat_template_kwargs"
            };
            return Err(ApiError::bad(p, format!("`{p}` goes with `messages`")));
        }
        match (prompt, self.messages) {
            (Some(_), Field::Given(_) | Field::Wrong) => Err(ApiError::bad(
                "messages",
                "give `prompt` or `messages`, not both",
            )),
            (Some(_), Field::Absent) if gen.is_some() => Err(ApiError::bad(
                "add_generation_prompt",
                "`add_generation_prompt` goes with `messages`",
            )),
            (Some(p), Field::Absent) => Ok((TokenizeInput::Text(p), special.unwrap_or(true))),
            (None, Field::Absent) => Err(ApiError::bad(
                "prompt",
                "`prompt` (a string) or `messages` is required",
            )),
            (None, m) => Ok((
                TokenizeInput::Chat {
                    messages: messages(m)?,
                    opts: ChatOptions {
                        add_generation_prompt: gen.unwrap_or(true),
                        tools: tools.map(|t| t.defs),
                        kwargs,
                    },
                },
                special.unwrap_or(false),
            )),
        }
    }
}

/// The body of `/detokenize` (vLLM's).
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct DetokenizeBody {
    #[schema(value_type = Option<String>)]
    model: Field<String>,
    #[schema(value_type = Option<Vec<u64>>)]
    tokens: Field<Vec<u64>>,
}

impl DetokenizeBody {
    /// The token ids, each below `vocab_size`.
    pub fn validate(self, served: &str, vocab_size: usize) -> Result<Vec<u32>, ApiError> {
        check_model(self.model, served, false)?;
        let ids = self
            .tokens
            .get("tokens", || "`tokens` must be a list of token ids".into())?
            .ok_or_else(|| ApiError::bad("tokens", "`tokens` is required"))?;
        ids.into_iter()
            .map(|t| match u32::try_from(t) {
                Ok(id) if (id as usize) < vocab_size => Ok(id),
                _ => Err(ApiError::bad(
                    "tokens",
                    format!("token id {t} is outside the vocabulary (size {vocab_size})"),
                )),
            })
            .collect()
    }
}
