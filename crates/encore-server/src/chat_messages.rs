//! Chat completions' `messages` read into the conversation the chat template renders:
//! roles (`developer` read as `system`), text content parts, an assistant's tool calls
//! and reasoning, a tool message's call id; every refusal names the field
//! (`messages[2].tool_calls[0].function.arguments`).

use encore_core::tokenizer::{ChatMessage, FunctionCall, ToolCall};
use serde_json::Value;

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

/// Message `i` as the chat template takes it: its role (`developer` read as `system`),
/// its content as one text, and the fields of tool calling and reasoning.
fn message((i, m): (usize, Value)) -> Result<ChatMessage, ApiError> {
    let at = |key: &str| format!("messages[{i}]{key}");
    let Value::Object(m) = m else {
        return Err(ApiError::bad(
            at(""),
            format!("`messages[{i}]` must be an object with `role` and `content`"),
        ));
    };
    fields::check(fields::MESSAGE, &m, &at("."))?;
    let get = |k: &str| m.get(k).filter(|v| !v.is_null());
    let role = get("role").unwrap_or(&Value::Null);
    let role = match role.as_str() {
        Some("system" | "developer") => "system",
        Some("user") => "user",
        Some("assistant") => "assistant",
        Some("tool") => "tool",
        _ if role.is_null() => {
            return Err(ApiError::bad(
                at(".role"),
                format!("`messages[{i}].role` is required"),
            ))
        }
        _ => {
            let why = format!(
                "`messages[{i}].role` must be one of `system`, `developer`, `user`, \
                 `assistant`, `tool`, not {role}"
            );
            return Err(ApiError::bad(at(".role"), why));
        }
    };
    // Fields that only some roles carry.
    for (key, owner) in [
        ("tool_calls", "assistant"),
        ("reasoning_content", "assistant"),
        ("refusal", "assistant"),
        ("tool_call_id", "tool"),
    ] {
        if get(key).is_some() && role != owner {
            return Err(ApiError::bad(
                at(&format!(".{key}")),
                format!("`{key}` belongs to `{owner}` messages, not `{role}`"),
            ));
        }
    }
    // An assistant's missing content reads as empty: templates such as Qwen3's search
    // the text of every assistant message.
    let content = match get("content") {
        None if role == "assistant" => Some(String::new()),
        None => {
            return Err(ApiError::bad(
                at(".content"),
                format!("`messages[{i}].content` is required"),
            ))
        }
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(parts)) => Some(
            parts
                .iter()
                .enumerate()
                .map(|(j, p)| text_part(p, &at(&format!(".content[{j}]"))))
                .collect::<Result<String, _>>()?,
        ),
        Some(_) => {
            return Err(ApiError::bad(
                at(".content"),
                format!("`messages[{i}].content` must be a string or a list of content parts"),
            ))
        }
    };
    let string = |key: &str| -> Result<Option<String>, ApiError> {
        match get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(ApiError::bad(
                at(&format!(".{key}")),
                format!("`messages[{i}].{key}` must be a string"),
            )),
        }
    };
    // A refusal the model wrote (the openai client sends `refusal: null` back with
    // every assistant message it got) is what the assistant said when it said nothing
    // else.
    let content = match (string("refusal")?, content) {
        (Some(r), Some(c)) if c.is_empty() => Some(r),
        (_, c) => c,
    };
    let tool_call_id = string("tool_call_id")?;
    if role == "tool" && tool_call_id.is_none() {
        return Err(ApiError::bad(
            at(".tool_call_id"),
            format!("`messages[{i}].tool_call_id` is required: the call this answers"),
        ));
    }
    let tool_calls = match get("tool_calls") {
        None => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .enumerate()
            .map(|(j, c)| tool_call(c, &at(&format!(".tool_calls[{j}]"))))
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::bad(
                at(".tool_calls"),
                format!("`messages[{i}].tool_calls` must be a list of tool calls"),
            ))
        }
    };
    Ok(ChatMessage {
        role: role.to_string(),
        content,
        name: string("name")?,
        tool_calls,
        tool_call_id,
        reasoning_content: string("reasoning_content")?,
    })
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
    let f = o
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(shape)?;
    let unknown = o
        .keys()
        .find(|k| !matches!(k.as_str(), "id" | "type" | "function"))
        .map(|k| format!("{at}.{k}"))
        .or_else(|| {
            f.keys()
                .find(|k| !matches!(k.as_str(), "name" | "arguments"))
                .map(|k| format!("{at}.function.{k}"))
        });
    if let Some(k) = unknown {
        return Err(ApiError::bad(k.clone(), format!("unknown field `{k}`")));
    }
    if o.get("type").and_then(Value::as_str) != Some("function") {
        return Err(shape());
    }
    let id = o.get("id").and_then(Value::as_str).ok_or_else(shape)?;
    let name = f.get("name").and_then(Value::as_str).ok_or_else(shape)?;
    let args = f
        .get("arguments")
        .and_then(Value::as_str)
        .ok_or_else(shape)?;
    let arguments = call_arguments(args);
    Ok(ToolCall {
        id: id.to_string(),
        kind: "function".into(),
        function: FunctionCall {
            name: name.to_string(),
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
