//! The OpenAI response bodies as serde types: completions' and chat completions' whole
//! responses and stream chunks, their log-probabilities and usage, the model objects and
//! the error body. They derive `Serialize` (what goes on the wire) and `ToSchema` (what
//! `/openapi.json` says of it), so the two cannot disagree. Fields are declared in the
//! order they go out.

use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// OpenAI's usage object.
#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
pub(crate) struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    /// The usage of a prompt of `prompt` tokens and `completion` output tokens.
    pub fn new(prompt: usize, completion: usize) -> Self {
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
        }
    }
}

/// Completions' `logprobs`: one entry a token (an echoed prompt's first has `null`s).
#[derive(Clone, Debug, Default, Serialize, ToSchema)]
pub(crate) struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f64>>,
    /// Each token's top log-probabilities keyed by their text (of tokens with the same
    /// text the likelier stays).
    #[schema(value_type = Vec<Option<std::collections::HashMap<String, f64>>>)]
    pub top_logprobs: Vec<Option<Map<String, Value>>>,
    pub text_offset: Vec<usize>,
}

/// One token of chat's log-probabilities (also the responses API's).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct TopLogprob {
    pub token: String,
    pub logprob: f64,
    pub bytes: Vec<u8>,
}

/// One output token of chat's log-probabilities, with its top ones.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f64,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

/// Chat's `logprobs`.
#[derive(Clone, Debug, Default, Serialize, ToSchema)]
pub(crate) struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

/// The `logprobs` of a choice: completions' or chat's, by the endpoint.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub(crate) enum Logprobs {
    Completion(CompletionLogprobs),
    Chat(ChatLogprobs),
}

/// A tool call of a whole chat message.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    #[schema(inline, value_type = String)]
    pub kind: &'static str,
    pub function: FunctionCall,
}

/// A called function: its name and its arguments (a JSON text as the model wrote it).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// A piece of a streamed tool call: `id`, `type` and `function.name` on its first.
#[derive(Clone, Debug, PartialEq, Serialize, ToSchema)]
pub(crate) struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

/// A piece of a streamed call's function: its name on the first, more arguments.
#[derive(Clone, Debug, PartialEq, Serialize, ToSchema)]
pub(crate) struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

/// The assistant message of a whole chat choice.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct ChatMessageOut {
    #[schema(value_type = String)]
    pub role: &'static str,
    /// `null` when the output is only tool calls.
    pub content: Option<String>,
    /// With a reasoning parser: the reasoning (`null` when there was none).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub reasoning_content: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

impl ChatMessageOut {
    /// The assistant's plain `text`.
    pub fn text(text: &str) -> Self {
        ChatMessageOut {
            role: "assistant",
            content: Some(text.to_string()),
            reasoning_content: None,
            tool_calls: None,
        }
    }
}

/// A choice of a whole completion.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct CompletionChoice {
    pub index: usize,
    pub text: String,
    #[schema(value_type = Option<CompletionLogprobs>)]
    pub logprobs: Option<Logprobs>,
    pub finish_reason: String,
    /// The output's token ids (vLLM's `return_token_ids`).
    pub token_ids: Vec<u32>,
}

/// A choice of a whole chat completion.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct ChatChoice {
    pub index: usize,
    pub message: ChatMessageOut,
    #[schema(value_type = Option<ChatLogprobs>)]
    pub logprobs: Option<Logprobs>,
    pub finish_reason: String,
    pub token_ids: Vec<u32>,
}

/// A whole `/v1/completions` response (`object`: `text_completion`).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct CompletionResponse {
    pub id: String,
    #[schema(value_type = String)]
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    pub usage: Usage,
}

/// A whole `/v1/chat/completions` response (`object`: `chat.completion`).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct ChatCompletionResponse {
    pub id: String,
    #[schema(value_type = String)]
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

/// The choice of a streamed completion token.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct CompletionChunkChoice {
    pub index: usize,
    pub text: String,
    #[schema(value_type = Option<CompletionLogprobs>)]
    pub logprobs: Option<Logprobs>,
    pub finish_reason: Option<String>,
}

/// What a streamed chat token adds: the role on the first, reasoning, content (`""` when
/// there is nothing else), tool-call pieces.
#[derive(Clone, Debug, Default, Serialize, ToSchema)]
pub(crate) struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// The choice of a streamed chat token.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    #[schema(value_type = Option<ChatLogprobs>)]
    pub logprobs: Option<Logprobs>,
    pub finish_reason: Option<String>,
}

/// A streamed completion chunk (the usage chunk has no choices).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct CompletionChunk {
    pub id: String,
    #[schema(value_type = String)]
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChunkChoice>,
    /// On every chunk with `continuous_usage_stats`, on the last with `include_usage`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A streamed chat chunk (`object`: `chat.completion.chunk`; the usage chunk has no
/// choices).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct ChatCompletionChunk {
    pub id: String,
    #[schema(value_type = String)]
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A chunk of either stream.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub(crate) enum Chunk {
    Completion(CompletionChunk),
    Chat(ChatCompletionChunk),
}

impl Chunk {
    /// Give the chunk a `usage` object.
    pub fn set_usage(&mut self, u: Usage) {
        match self {
            Chunk::Completion(c) => c.usage = Some(u),
            Chunk::Chat(c) => c.usage = Some(u),
        }
    }
}

/// A choice of either whole response.
#[derive(Clone, Debug)]
pub(crate) enum Choice {
    Completion(CompletionChoice),
    Chat(ChatChoice),
}

/// OpenAI's model object (`GET /v1/models/{model}`).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct Model {
    pub id: String,
    #[schema(value_type = String)]
    pub object: &'static str,
    pub created: u64,
    #[schema(value_type = String)]
    pub owned_by: &'static str,
    /// The longest sequence (prompt and output) the server runs (vLLM's).
    pub max_model_len: usize,
}

/// `GET /v1/models`: the served model.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct ModelList {
    #[schema(value_type = String)]
    pub object: &'static str,
    pub data: Vec<Model>,
}

/// OpenAI's error body.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct ErrorBody {
    pub error: ErrorObject,
}

/// The error: what went wrong, its type, the field at fault, a code for some.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct ErrorObject {
    pub message: String,
    #[serde(rename = "type")]
    #[schema(value_type = String)]
    pub kind: &'static str,
    /// The field at fault, as the body spells it (`messages[2].role`).
    pub param: Option<String>,
    #[schema(value_type = Option<String>)]
    pub code: Option<&'static str>,
}

/// Anthropic's error body (`/v1/messages` and under it).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct AnthropicErrorBody {
    /// Always `error`.
    #[serde(rename = "type")]
    #[schema(value_type = String)]
    pub kind: &'static str,
    pub error: AnthropicError,
}

/// Anthropic's error: its type (`invalid_request_error`, `not_found_error`, ...) and
/// message (which starts with the field at fault).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct AnthropicError {
    #[serde(rename = "type")]
    #[schema(value_type = String)]
    pub kind: &'static str,
    pub message: String,
}

/// `POST /tokenize`'s answer (vLLM's).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: usize,
    pub tokens: Vec<u32>,
}

/// `POST /detokenize`'s answer (vLLM's).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct DetokenizeResponse {
    pub prompt: String,
}

#[cfg(test)]
impl ToolCallDelta {
    /// The delta a test writes as JSON (`{"index", "id", "type", "function"}`).
    pub fn from_json(v: &Value) -> Self {
        let s = |v: &Value| v.as_str().map(str::to_string);
        ToolCallDelta {
            index: v["index"].as_u64().expect("index") as usize,
            id: s(&v["id"]),
            kind: v["type"].as_str().map(|_| "function"),
            function: FunctionDelta {
                name: s(&v["function"]["name"]),
                arguments: s(&v["function"]["arguments"]).unwrap_or_default(),
            },
        }
    }
}
