//! The responses API's response object as serde types: its output items (reasoning, the
//! message, function calls), their content parts, and its usage. They derive `Serialize`
//! (what goes on the wire) and `ToSchema` (what `/openapi.json` says of it). A streamed
//! response's events carry these too (the response's snapshots, items and parts).

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::wire::ChatTokenLogprob;

/// A content part of an output item.
#[derive(Clone, Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum ContentPart {
    /// A reasoning item's text, whole.
    ReasoningText { text: String },
    /// A message's text, with its log-probabilities when asked for.
    OutputText {
        text: String,
        /// Always empty: no citations.
        annotations: Vec<Value>,
        logprobs: Vec<ChatTokenLogprob>,
    },
}

/// An output item.
#[derive(Clone, Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum OutputItem {
    Reasoning {
        id: String,
        /// Always empty: there is no summarizer.
        summary: Vec<Value>,
        content: Vec<ContentPart>,
        #[schema(value_type = String)]
        status: &'static str,
        /// The text again, to send back (`include: ["reasoning.encrypted_content"]`).
        #[serde(skip_serializing_if = "Option::is_none")]
        encrypted_content: Option<String>,
    },
    Message {
        id: String,
        #[schema(value_type = String)]
        status: &'static str,
        #[schema(value_type = String)]
        role: &'static str,
        content: Vec<ContentPart>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        #[schema(value_type = String)]
        status: &'static str,
    },
}

/// Why a response is incomplete.
#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
pub(crate) struct IncompleteDetails {
    #[schema(value_type = String)]
    pub reason: &'static str,
}

/// The input tokens served from a cache (not reported: 0).
#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
pub(crate) struct InputTokensDetails {
    pub cached_tokens: usize,
}

/// The output tokens that were reasoning.
#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
pub(crate) struct OutputTokensDetails {
    pub reasoning_tokens: usize,
}

/// A response's usage.
#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
pub(crate) struct ResponseUsage {
    pub input_tokens: usize,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: usize,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: usize,
}

/// The response object (`object`: `response`; stateless: never stored).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct ResponseObject {
    pub id: String,
    #[schema(value_type = String)]
    pub object: &'static str,
    pub created_at: u64,
    /// `in_progress`, `completed`, `incomplete` or `cancelled`.
    #[schema(value_type = String)]
    pub status: &'static str,
    pub background: bool,
    pub error: Option<Value>,
    pub incomplete_details: Option<IncompleteDetails>,
    /// The request's, repeated (as are the fields below it gave).
    pub instructions: Value,
    pub max_output_tokens: Value,
    pub max_tool_calls: Option<u64>,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub reasoning: Value,
    #[schema(value_type = String)]
    pub service_tier: &'static str,
    pub store: bool,
    pub temperature: f64,
    pub text: Value,
    pub tool_choice: Value,
    pub tools: Value,
    pub top_logprobs: usize,
    pub top_p: f64,
    #[schema(value_type = String)]
    pub truncation: &'static str,
    /// `null` until the response ends.
    pub usage: Option<ResponseUsage>,
    pub user: Option<String>,
    pub metadata: Value,
}
