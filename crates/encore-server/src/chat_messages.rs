//! Chat completions' `messages` read into the conversation the chat template renders:
//! roles (`developer` read as `system`), text content parts, an assistant's tool calls
//! and reasoning, a tool message's call id; every refusal names the field
//! (`messages[2].tool_calls[0].function.arguments`).

use encore_core::tokenizer::{ChatMessage, FunctionCall, ToolCall};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::body::Field;
use crate::error::ApiError;
use crate::fields;

/// `messages`: a non-empty list of messages.
pub(crate) fn messages(f: Field<Vec<Value>>) -> Result<Vec<ChatMessage>, ApiError> {
    let list = || "`messages` must be a non-empty list".to_string();
    match f.get("messages", list)? {
        Some(m) if !m.is_empty() => m.into_iter().enumerate().map(message).collect(),
        _ => Err(ApiError::bad("messages", list())),
    }
}

/// One message of `messages` as the client sent it (its keys checked against the
/// message table first: this reads the honored ones).
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct MessageBody {
    /// `system`, `developer` (read as `system`), `user`, `assistant` or `tool`.
    #[schema(value_type = Option<String>)]
    role: Field<String>,
    #[schema(value_type = Option<Content>)]
    content: Field<Content>,
    #[schema(value_type = Option<String>)]
    name: Field<String>,
    /// Each checked for unknown keys, then read as a [`ToolCallBody`].
    #[schema(value_type = Option<Vec<ToolCallBody>>)]
    tool_calls: Field<Vec<Value>>,
    #[schema(value_type = Option<String>)]
    tool_call_id: Field<String>,
    #[schema(value_type = Option<String>)]
    reasoning_content: Field<String>,
    #[schema(value_type = Option<String>)]
    refusal: Field<String>,
}

/// A message's `content`: a string, or text parts (concatenated).
#[derive(Deserialize, Serialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum Content {
    Text(String),
    /// `{"type": "text", "text": ...}` each.
    Parts(Vec<Value>),
}

/// The value of field `at` of a message, or a 400 naming it saying `rule`.
fn field<T>(f: Field<T>, at: String, rule: impl FnOnce() -> String) -> Result<Option<T>, ApiError> {
    match f {
        Field::Absent => Ok(None),
        Field::Given(x) => Ok(Some(x)),
        Field::Wrong => Err(ApiError::bad(at, rule())),
    }
}

/// Message `i` as the chat template takes it: its role (`developer` read as `system`),
/// its content as one text, and the fields of tool calling and reasoning.
fn message((i, m): (usize, Value)) -> Result<ChatMessage, ApiError> {
    let at = |key: &str| format!("messages[{i}]{key}");
    let Value::Object(map) = &m else {
        return Err(ApiError::bad(
            at(""),
            format!("`messages[{i}]` must be an object with `role` and `content`"),
        ));
    };
    fields::check(fields::MESSAGE, map, &at("."))?;
    let m: MessageBody = serde_json::from_value(m)
        .map_err(|e| ApiError::bad(at(""), format!("invalid `messages[{i}]`: {e}")))?;
    let roles = "`system`, `developer`, `user`, `assistant`, `tool`";
    let role = field(m.role, at(".role"), || {
        format!("`messages[{i}].role` must be one of {roles}")
    })?;
    let role = match role.as_deref() {
        Some("system" | "developer") => "system",
        Some("user") => "user",
        Some("assistant") => "assistant",
        Some("tool") => "tool",
        None => {
            return Err(ApiError::bad(
                at(".role"),
                format!("`messages[{i}].role` is required"),
            ))
        }
        Some(other) => {
            let why = format!("`messages[{i}].role` must be one of {roles}, not {other:?}");
            return Err(ApiError::bad(at(".role"), why));
        }
    };
    // Fields that only some roles carry.
    for (key, given, owner) in [
        ("tool_calls", m.tool_calls.is_given(), "assistant"),
        (
            "reasoning_content",
            m.reasoning_content.is_given(),
            "assistant",
        ),
        ("refusal", m.refusal.is_given(), "assistant"),
        ("tool_call_id", m.tool_call_id.is_given(), "tool"),
    ] {
        if given && role != owner {
            return Err(ApiError::bad(
                at(&format!(".{key}")),
                format!("`{key}` belongs to `{owner}` messages, not `{role}`"),
            ));
        }
    }
    let string = |f: Field<String>, key: &str| {
        field(f, at(&format!(".{key}")), || {
            format!("`messages[{i}].{key}` must be a string")
        })
    };
    // An assistant's missing content reads as empty: templates such as Qwen3's search
    // the text of every assistant message.
    let content = field(m.content, at(".content"), || {
        format!("`messages[{i}].content` must be a string or a list of content parts")
    })?;
    let content = match content {
        None if role == "assistant" => Some(String::new()),
        None => {
            return Err(ApiError::bad(
                at(".content"),
                format!("`messages[{i}].content` is required"),
            ))
        }
        Some(Content::Text(s)) => Some(s),
        Some(Content::Parts(parts)) => Some(
            parts
                .iter()
                .enumerate()
                .map(|(j, p)| text_part(p, &at(&format!(".content[{j}]"))))
                .collect::<Result<String, _>>()?,
        ),
    };
    // A refusal the model wrote (the openai client sends `refusal: null` back with
    // every assistant message it got) is what the assistant said when it said nothing
    // else.
    let content = match (string(m.refusal, "refusal")?, content) {
        (Some(r), Some(c)) if c.is_empty() => Some(r),
        (_, c) => c,
    };
    let tool_call_id = string(m.tool_call_id, "tool_call_id")?;
    if role == "tool" && tool_call_id.is_none() {
        return Err(ApiError::bad(
            at(".tool_call_id"),
            format!("`messages[{i}].tool_call_id` is required: the call this answers"),
        ));
    }
    let calls = field(m.tool_calls, at(".tool_calls"), || {
        format!("`messages[{i}].tool_calls` must be a list of tool calls")
    })?;
    let tool_calls = calls
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(j, c)| tool_call(c, &at(&format!(".tool_calls[{j}]"))))
        .collect::<Result<_, _>>()?;
    Ok(ChatMessage {
        role: role.to_string(),
        content,
        name: string(m.name, "name")?,
        tool_calls,
        tool_call_id,
        reasoning_content: string(m.reasoning_content, "reasoning_content")?,
    })
}

/// An assistant's tool call as the client sent it (its keys checked first).
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct ToolCallBody {
    #[schema(value_type = String)]
    id: Field<String>,
    /// `function`.
    #[serde(rename = "type")]
    #[schema(value_type = String)]
    kind: Field<String>,
    #[schema(value_type = FunctionBody)]
    function: Field<FunctionBody>,
}

/// A tool call's function: its name and arguments (any string).
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct FunctionBody {
    #[schema(value_type = String)]
    name: Field<String>,
    #[schema(value_type = String)]
    arguments: Field<String>,
}

/// An assistant's tool call `c` (named `at`): `{"id", "type": "function", "function":
/// {"name", "arguments"}}`, its arguments read by [`call_arguments`].
fn tool_call(c: &Value, at: &str) -> Result<ToolCall, ApiError> {
    let shape = || {
        ApiError::bad(
            at.to_string(),
            format!(
                "`{at}` must be `{{\"id\": ..., \"type\": \"function\", \"function\": \
                 {{\"name\": ..., \"arguments\": ...}}}}`"
            ),
        )
    };
    let o = c.as_object().ok_or_else(shape)?;
    let f = o.get("function").and_then(Value::as_object);
    let unknown = o
        .keys()
        .find(|k| !matches!(k.as_str(), "id" | "type" | "function"))
        .map(|k| format!("{at}.{k}"))
        .or_else(|| {
            f.into_iter()
                .flat_map(|f| f.keys())
                .find(|k| !matches!(k.as_str(), "name" | "arguments"))
                .map(|k| format!("{at}.function.{k}"))
        });
    if let Some(k) = unknown {
        return Err(ApiError::bad(k.clone(), format!("unknown field `{k}`")));
    }
    let c: ToolCallBody = serde_json::from_value(c.clone()).map_err(|_| shape())?;
    let given = |f: Field<String>| match f {
        Field::Given(s) => Ok(s),
        _ => Err(shape()),
    };
    if given(c.kind)? != "function" {
        return Err(shape());
    }
    let Field::Given(f) = c.function else {
        return Err(shape());
    };
    let arguments = call_arguments(&given(f.arguments)?);
    Ok(ToolCall {
        id: given(c.id)?,
        kind: "function".into(),
        function: FunctionCall {
            name: given(f.name)?,
            arguments,
        },
    })
}

/// The text of content part `p` (named `at`): a `{"type": "text", "text": ...}` part.
pub(crate) fn text_part<'a>(p: &'a Value, at: &str) -> Result<&'a str, ApiError> {
    let shape = || {
        ApiError::bad(
            at.to_string(),
            format!("`{at}` must be a content part `{{\"type\": \"text\", \"text\": ...}}`"),
        )
    };
    let part = p.as_object().ok_or_else(shape)?;
    match part.get("type").and_then(Value::as_str) {
        Some("text") => {}
        Some(other) => {
            return Err(ApiError::bad(
                format!("{at}.type"),
                format!("content part type `{other}` is not supported: this model takes text"),
            ))
        }
        None => return Err(shape()),
    }
    if let Some(k) = part.keys().find(|k| !matches!(k.as_str(), "type" | "text")) {
        return Err(ApiError::bad(
            format!("{at}.{k}"),
            format!("unknown field `{at}.{k}` of a text part"),
        ));
    }
    part.get("text").and_then(Value::as_str).ok_or_else(shape)
}

/// A tool call's `arguments` as the chat template gets them: parsed when they are a JSON
/// text, else the string as it is. OpenAI takes any string: a call the model left
/// unterminated (`finish_reason: length`) comes back in the next turn as it was written,
/// and templates that write the arguments out (`| tojson`) then show that text, quoted.
pub(crate) fn call_arguments(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}
