//! Anthropic's message API bodies as serde types: the message (a whole answer), its
//! content blocks, the stream's events and `count_tokens`' answer. They derive
//! `Serialize` (what goes on the wire) and `ToSchema` (what `/openapi.json` says of it).

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::wire::AnthropicError;

/// A content block of an answer.
#[derive(Clone, Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum ContentBlock {
    /// The model's reasoning (empty with `display: "omitted"`); no signature.
    Thinking {
        thinking: String,
        signature: String,
    },
    Text {
        text: String,
    },
    /// A call of a client tool: its arguments as a JSON object (a string when the model
    /// wrote no JSON).
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

/// The tokens a message used.
#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
pub(crate) struct MessageUsage {
    pub input_tokens: usize,
    pub output_tokens: usize,
}

/// A message (`type`: `message`, `role`: `assistant`).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct Message {
    pub id: String,
    #[serde(rename = "type")]
    #[schema(value_type = String)]
    pub kind: &'static str,
    #[schema(value_type = String)]
    pub role: &'static str,
    pub model: String,
    pub content: Vec<ContentBlock>,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use`; `null` while streaming.
    #[schema(value_type = Option<String>)]
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<String>,
    pub usage: MessageUsage,
}

/// What a streamed content block adds (the variants are named as the wire's types).
#[allow(clippy::enum_variant_names)]
#[derive(Clone, Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum BlockDelta {
    ThinkingDelta { thinking: String },
    TextDelta { text: String },
    InputJsonDelta { partial_json: String },
}

/// How a streamed message ended.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct MessageDelta {
    #[schema(value_type = Option<String>)]
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<String>,
}

/// The output tokens of a streamed message.
#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
pub(crate) struct OutputUsage {
    pub output_tokens: usize,
}

/// An event of a streamed message (its `data`; the SSE event's name is its `type`).
#[derive(Clone, Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum MessageEvent {
    MessageStart {
        message: Message,
    },
    ContentBlockStart {
        index: usize,
        content_block: ContentBlock,
    },
    ContentBlockDelta {
        index: usize,
        delta: BlockDelta,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: MessageDelta,
        usage: OutputUsage,
    },
    MessageStop,
    /// An error that ends the stream.
    Error {
        error: AnthropicError,
    },
}

impl MessageEvent {
    /// The event's name (its `type`).
    pub fn name(&self) -> &'static str {
        match self {
            MessageEvent::MessageStart { .. } => "message_start",
            MessageEvent::ContentBlockStart { .. } => "content_block_start",
            MessageEvent::ContentBlockDelta { .. } => "content_block_delta",
            MessageEvent::ContentBlockStop { .. } => "content_block_stop",
            MessageEvent::MessageDelta { .. } => "message_delta",
            MessageEvent::MessageStop => "message_stop",
            MessageEvent::Error { .. } => "error",
        }
    }
}

/// `POST /v1/messages/count_tokens`' answer.
#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
pub(crate) struct CountTokensResponse {
    pub input_tokens: usize,
}
