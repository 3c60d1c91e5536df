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

/// An event of a streamed response (its `data`; the SSE event's name is its `type`); each
/// also carries its `sequence_number` (see [`ResponseEvent`]).
#[derive(Clone, Debug, Serialize, ToSchema)]
#[serde(tag = "type")]
pub(crate) enum ResponseEventKind {
    #[serde(rename = "response.created")]
    Created { response: Box<ResponseObject> },
    #[serde(rename = "response.in_progress")]
    InProgress { response: Box<ResponseObject> },
    #[serde(rename = "response.completed")]
    Completed { response: Box<ResponseObject> },
    #[serde(rename = "response.incomplete")]
    Incomplete { response: Box<ResponseObject> },
    #[serde(rename = "response.failed")]
    Failed { response: Box<ResponseObject> },
    #[serde(rename = "response.output_item.added")]
    OutputItemAdded {
        output_index: usize,
        item: OutputItem,
    },
    #[serde(rename = "response.output_item.done")]
    OutputItemDone {
        output_index: usize,
        item: OutputItem,
    },
    #[serde(rename = "response.content_part.added")]
    ContentPartAdded {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: ContentPart,
    },
    #[serde(rename = "response.content_part.done")]
    ContentPartDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: ContentPart,
    },
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta {
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
        logprobs: Vec<ChatTokenLogprob>,
    },
    #[serde(rename = "response.output_text.done")]
    OutputTextDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
        logprobs: Vec<ChatTokenLogprob>,
    },
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningTextDelta {
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
    },
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningTextDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
    },
    #[serde(rename = "response.function_call_arguments.delta")]
    FunctionCallArgumentsDelta {
        item_id: String,
        output_index: usize,
        delta: String,
    },
    #[serde(rename = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone {
        item_id: String,
        output_index: usize,
        name: Option<String>,
        arguments: String,
    },
    /// An error that ends the stream.
    #[serde(rename = "error")]
    Error {
        #[schema(value_type = Option<String>)]
        code: Option<&'static str>,
        message: String,
        param: Option<String>,
    },
}

impl ResponseEventKind {
    /// The event's name (its `type`).
    pub fn name(&self) -> &'static str {
        use ResponseEventKind as E;
        match self {
            E::Created { .. } => "response.created",
            E::InProgress { .. } => "response.in_progress",
            E::Completed { .. } => "response.completed",
            E::Incomplete { .. } => "response.incomplete",
            E::Failed { .. } => "response.failed",
            E::OutputItemAdded { .. } => "response.output_item.added",
            E::OutputItemDone { .. } => "response.output_item.done",
            E::ContentPartAdded { .. } => "response.content_part.added",
            E::ContentPartDone { .. } => "response.content_part.done",
            E::OutputTextDelta { .. } => "response.output_text.delta",
            E::OutputTextDone { .. } => "response.output_text.done",
            E::ReasoningTextDelta { .. } => "response.reasoning_text.delta",
            E::ReasoningTextDone { .. } => "response.reasoning_text.done",
            E::FunctionCallArgumentsDelta { .. } => "response.function_call_arguments.delta",
            E::FunctionCallArgumentsDone { .. } => "response.function_call_arguments.done",
            E::Error { .. } => "error",
        }
    }
}

/// A streamed response's event with its place in the stream.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ResponseEvent {
    #[serde(flatten)]
    pub event: ResponseEventKind,
    pub sequence_number: u64,
}
