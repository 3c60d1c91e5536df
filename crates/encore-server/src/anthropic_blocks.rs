//! Anthropic's `messages` and `system` content blocks read into the conversation the
//! chat template renders: `text`, an assistant's `tool_use` (its tool calls) and
//! `thinking` (its reasoning), a user's `tool_result` (a `tool` message), each refusal
//! naming the block's field. A `redacted_thinking` block is opaque (encrypted by the
//! model that wrote it): it is accepted in the history and left out of the prompt.

use std::collections::HashMap;

use encore_core::tokenizer::{ChatMessage, FunctionCall, ToolCall};
use serde_json::{json, Map, Value};

use crate::body::known_keys;
use crate::error::ApiError;

/// The text of a list of text blocks (`system`, a tool result's content).
pub(crate) fn blocks_text(v: &Value, at: &str) -> Result<String, ApiError> {
    let list = v.as_array().ok_or_else(|| {
        ApiError::bad(
            at.to_string(),
            format!("`{at}` must be a list of text blocks"),
        )
    })?;
    let mut text = String::new();
    for (j, b) in list.iter().enumerate() {
        let bat = format!("{at}[{j}]");
        let o = b.as_object().ok_or_else(|| {
            ApiError::bad(
                bat.clone(),
                format!("`{bat}` must be a content block object"),
            )
        })?;
        match o.get("type").and_then(Value::as_str) {
            Some("text") => {}
            other => return Err(unsupported_block(other, &bat)),
        }
        text.push_str(text_block(o, &bat)?);
    }
    Ok(text)
}

fn unsupported_block(kind: Option<&str>, at: &str) -> ApiError {
    let why = match kind {
        Some(k @ ("image" | "document" | "search_result")) => {
            format!("content block type `{k}` is not supported: this model takes text")
        }
        Some(k) => format!("content block type `{k}` is not supported here"),
        None => format!("`{at}` needs a `type`"),
    };
    ApiError::bad(format!("{at}.type"), why)
}

/// A text block's text (`cache_control` is accepted: the prefix cache is automatic).
fn text_block<'a>(o: &'a Map<String, Value>, at: &str) -> Result<&'a str, ApiError> {
    known_keys(o, &["type", "text", "cache_control", "citations"], at)?;
    if o.get("citations")
        .is_some_and(|c| !c.is_null() && c != &json!([]))
    {
        let m = "citations are not supported";
        return Err(ApiError::bad(format!("{at}.citations"), m));
    }
    o.get("text").and_then(Value::as_str).ok_or_else(|| {
        ApiError::bad(
            format!("{at}.text"),
            format!("`{at}.text` must be a string"),
        )
    })
}

/// `messages` as the chat template's conversation, after `out`'s system message: a
/// user's `tool_result` blocks become `tool` messages (before its text), an assistant's
/// `tool_use` blocks its tool calls and its `thinking` its reasoning.
pub(crate) fn conversation(list: &[Value], out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    // The function of each tool-use id, for the results that answer them.
    let mut called: HashMap<String, String> = HashMap::new();
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let o = m.as_object().ok_or_else(|| {
            ApiError::bad(
                at.clone(),
                format!("`{at}` must be an object with `role` and `content`"),
            )
        })?;
        known_keys(o, &["role", "content"], &at)?;
        let role = match o.get("role").and_then(Value::as_str) {
            Some(r @ ("user" | "assistant")) => r,
            _ => {
                return Err(ApiError::bad(
                    format!("{at}.role"),
                    format!("`{at}.role` must be `user` or `assistant`"),
                ))
            }
        };
        let blocks = match o.get("content") {
            Some(Value::String(t)) => {
                out.push(ChatMessage::new(role, t.clone()));
                continue;
            }
            Some(Value::Array(b)) => b,
            _ => {
                return Err(ApiError::bad(
                    format!("{at}.content"),
                    format!("`{at}.content` must be a string or a list of content blocks"),
                ))
            }
        };
        let mut msg = ChatMessage::new(role, "");
        let mut had_results = false;
        for (j, b) in blocks.iter().enumerate() {
            let bat = format!("{at}.content[{j}]");
            let bo = b.as_object().ok_or_else(|| {
                ApiError::bad(
                    bat.clone(),
                    format!("`{bat}` must be a content block object"),
                )
            })?;
            let kind = bo.get("type").and_then(Value::as_str);
            let wrong_role = |owner: &str| {
                ApiError::bad(
                    format!("{bat}.type"),
                    format!(
                        "`{}` blocks belong to `{owner}` messages",
                        kind.unwrap_or("")
                    ),
                )
            };
            match kind {
                Some("text") => {
                    let t = text_block(bo, &bat)?;
                    msg.content.get_or_insert_with(String::new).push_str(t);
                }
                Some("tool_use") => {
                    if role != "assistant" {
                        return Err(wrong_role("assistant"));
                    }
                    known_keys(
                        bo,
                        &[
                            "type",
                            "id",
                            "name",
                            "input",
                            "cache_control",
                            "caller",
                            "toolset_name",
                        ],
                        &bat,
                    )?;
                    sdk_echo(bo, &bat)?;
                    let str_of = |k: &str| {
                        bo.get(k)
                            .and_then(Value::as_str)
                            .map(str::to_string)
                            .ok_or_else(|| {
                                ApiError::bad(
                                    format!("{bat}.{k}"),
                                    format!("`{bat}.{k}` must be a string"),
                                )
                            })
                    };
                    let (id, name) = (str_of("id")?, str_of("name")?);
                    let input = bo.get("input").filter(|x| x.is_object()).ok_or_else(|| {
                        ApiError::bad(
                            format!("{bat}.input"),
                            format!("`{bat}.input` must be an object"),
                        )
                    })?;
                    called.insert(id.clone(), name.clone());
                    msg.tool_calls.push(ToolCall {
                        id,
                        kind: "function".into(),
                        function: FunctionCall {
                            name,
                            arguments: input.clone(),
                        },
                    });
                }
                // Thinking another model redacted is opaque: nothing to render, so it is
                // left out of the prompt.
                Some("redacted_thinking") => {
                    if role != "assistant" {
                        return Err(wrong_role("assistant"));
                    }
                    known_keys(bo, &["type", "data"], &bat)?;
                    if !bo.get("data").is_some_and(Value::is_string) {
                        return Err(ApiError::bad(
                            format!("{bat}.data"),
                            format!("`{bat}.data` must be a string"),
                        ));
                    }
                }
                Some("thinking") => {
                    if role != "assistant" {
                        return Err(wrong_role("assistant"));
                    }
                    known_keys(bo, &["type", "thinking", "signature"], &bat)?;
                    let t = bo.get("thinking").and_then(Value::as_str).ok_or_else(|| {
                        ApiError::bad(
                            format!("{bat}.thinking"),
                            format!("`{bat}.thinking` must be a string"),
                        )
                    })?;
                    msg.reasoning_content
                        .get_or_insert_with(String::new)
                        .push_str(t);
                }
                Some("tool_result") => {
                    if role != "user" {
                        return Err(wrong_role("user"));
                    }
                    had_results = true;
                    known_keys(
                        bo,
                        &[
                            "type",
                            "tool_use_id",
                            "content",
                            "is_error",
                            "cache_control",
                        ],
                        &bat,
                    )?;
                    let id = bo
                        .get("tool_use_id")
                        .and_then(Value::as_str)
                        .ok_or_else(|| {
                            ApiError::bad(
                                format!("{bat}.tool_use_id"),
                                format!("`{bat}.tool_use_id` must be a string"),
                            )
                        })?;
                    let mut text = match bo.get("content") {
                        None | Some(Value::Null) => String::new(),
                        Some(Value::String(t)) => t.clone(),
                        Some(v @ Value::Array(_)) => blocks_text(v, &format!("{bat}.content"))?,
                        Some(_) => {
                            return Err(ApiError::bad(
                                format!("{bat}.content"),
                                format!(
                                    "`{bat}.content` must be a string or a list of text blocks"
                                ),
                            ))
                        }
                    };
                    match bo.get("is_error") {
                        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
                        // The template has no error flag: the text says it.
                        Some(Value::Bool(true)) => text = format!("Error: {text}"),
                        Some(_) => {
                            return Err(ApiError::bad(
                                format!("{bat}.is_error"),
                                format!("`{bat}.is_error` must be a boolean"),
                            ))
                        }
                    }
                    let mut tm = ChatMessage::new("tool", text);
                    tm.name = called.get(id).cloned();
                    tm.tool_call_id = Some(id.to_string());
                    out.push(tm);
                }
                other => return Err(unsupported_block(other, &bat)),
            }
        }
        // A user turn of tool results only is those results.
        let empty = msg.content.as_deref() == Some("");
        if role == "assistant" || !empty || !had_results {
            out.push(msg);
        }
    }
    Ok(())
}

/// The fields the Anthropic SDK writes on a `tool_use` block it got back
/// (`block.model_dump()` sends them as `null`): `caller` (who called the tool; the
/// model itself, `{"type": "direct"}`, is the only caller here) and `toolset_name` (MCP
/// toolsets, which the server has none of). Other values are refused naming them.
fn sdk_echo(bo: &Map<String, Value>, at: &str) -> Result<(), ApiError> {
    match bo.get("caller") {
        None | Some(Value::Null) => {}
        Some(c) if c == &json!({"type": "direct"}) => {}
        Some(_) => {
            return Err(ApiError::bad(
                format!("{at}.caller"),
                format!("`{at}.caller` other than `{{\"type\": \"direct\"}}` is not supported: the model calls the client's tools itself"),
            ))
        }
    }
    match bo.get("toolset_name") {
        None | Some(Value::Null) => Ok(()),
        Some(_) => Err(ApiError::bad(
            format!("{at}.toolset_name"),
            format!("`{at}.toolset_name` is not supported: the server has no MCP toolsets"),
        )),
    }
}
