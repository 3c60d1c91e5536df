//! The `input` of OpenAI's `/v1/responses` read into the conversation the chat template
//! renders: a string (one user message) or a list of items: messages, `function_call`,
//! `function_call_output` and `reasoning` items, each refusal naming the item's field
//! (`input[3].arguments`).

use std::collections::HashMap;

use encore_core::tokenizer::{ChatMessage, FunctionCall, ToolCall};
use serde_json::Value;

use crate::body::{known_keys, Field};
use crate::chat_messages::call_arguments;
use crate::error::ApiError;

/// `input`: a string (one user message) or a list of items, as the conversation.
pub(crate) fn input(f: Field<Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let rule = || "`input` must be a string or a non-empty list of input items".to_string();
    let items = match f.get("input", rule)? {
        None => return Err(ApiError::bad("input", "`input` is required")),
        Some(Value::String(s)) => return Ok(vec![ChatMessage::new("user", s)]),
        Some(Value::Array(items)) if !items.is_empty() => items,
        Some(_) => return Err(ApiError::bad("input", rule())),
    };
    let mut out: Vec<ChatMessage> = Vec::new();
    // Reasoning waits for the assistant turn it belongs to.
    let mut reasoning: Option<String> = None;
    // The function of each call id, for the outputs that answer them.
    let mut called: HashMap<String, String> = HashMap::new();
    // The last item was part of an assistant turn (a message or a call).
    let mut in_turn = false;
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let o = item.as_object().ok_or_else(|| {
            ApiError::bad(at.clone(), format!("`{at}` must be an input item object"))
        })?;
        let kind = match o.get("type").and_then(Value::as_str) {
            Some(t) => t,
            None if o.contains_key("role") => "message",
            None => {
                return Err(ApiError::bad(
                    format!("{at}.type"),
                    format!("`{at}` needs a `type` (or a `role`, for a message)"),
                ))
            }
        };
        let str_of = |k: &str| -> Result<String, ApiError> {
            o.get(k)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| {
                    ApiError::bad(format!("{at}.{k}"), format!("`{at}.{k}` must be a string"))
                })
        };
        match kind {
            "message" => {
                known_keys(o, &["type", "role", "content", "id", "status"], &at)?;
                let role = match o.get("role").and_then(Value::as_str) {
                    Some("system" | "developer") => "system",
                    Some(r @ ("user" | "assistant")) => r,
                    _ => {
                        return Err(ApiError::bad(
                            format!("{at}.role"),
                            format!(
                                "`{at}.role` must be one of `user`, `assistant`, `system`, \
                                 `developer`"
                            ),
                        ))
                    }
                };
                let content = message_content(o.get("content"), &format!("{at}.content"))?;
                let mut m = ChatMessage::new(role, content);
                if role == "assistant" {
                    m.reasoning_content = reasoning.take();
                    in_turn = true;
                } else {
                    in_turn = false;
                }
                out.push(m);
            }
            "function_call" => {
                known_keys(
                    o,
                    &["type", "id", "call_id", "name", "arguments", "status"],
                    &at,
                )?;
                let call_id = str_of("call_id")?;
                let name = str_of("name")?;
                let args = str_of("arguments")?;
                let arguments = call_arguments(&args);
                called.insert(call_id.clone(), name.clone());
                let call = ToolCall {
                    id: call_id,
                    kind: "function".into(),
                    function: FunctionCall { name, arguments },
                };
                match out.last_mut() {
                    Some(m) if in_turn && m.role == "assistant" => {
                        if m.reasoning_content.is_none() {
                            m.reasoning_content = reasoning.take();
                        }
                        m.tool_calls.push(call);
                    }
                    _ => {
                        let mut m = ChatMessage::new("assistant", "");
                        m.reasoning_content = reasoning.take();
                        m.tool_calls.push(call);
                        out.push(m);
                    }
                }
                in_turn = true;
            }
            "function_call_output" => {
                known_keys(o, &["type", "id", "call_id", "output", "status"], &at)?;
                let call_id = str_of("call_id")?;
                let output = message_content(o.get("output"), &format!("{at}.output"))?;
                let mut m = ChatMessage::new("tool", output);
                m.name = called.get(&call_id).cloned();
                m.tool_call_id = Some(call_id);
                out.push(m);
                in_turn = false;
            }
            "reasoning" => {
                known_keys(
                    o,
                    &[
                        "type",
                        "id",
                        "summary",
                        "content",
                        "encrypted_content",
                        "status",
                    ],
                    &at,
                )?;
                let mut text = String::new();
                if let Some(parts) = o.get("content").filter(|c| !c.is_null()) {
                    text = parts_text(parts, &format!("{at}.content"), &["reasoning_text"])?;
                }
                if text.is_empty() {
                    // Its text sent back as this server wrote it.
                    if let Some(e) = o.get("encrypted_content").filter(|c| !c.is_null()) {
                        text = e
                            .as_str()
                            .ok_or_else(|| {
                                ApiError::bad(
                                    format!("{at}.encrypted_content"),
                                    format!("`{at}.encrypted_content` must be a string"),
                                )
                            })?
                            .to_string();
                    }
                }
                if let Some(parts) = o.get("summary").filter(|c| !c.is_null()) {
                    let summary = parts_text(parts, &format!("{at}.summary"), &["summary_text"])?;
                    if text.is_empty() {
                        text = summary;
                    }
                }
                reasoning = Some(text);
            }
            other => {
                return Err(ApiError::bad(
                    format!("{at}.type"),
                    format!(
                        "input item type `{other}` is not supported: `message`, \
                         `function_call`, `function_call_output` and `reasoning` are"
                    ),
                ))
            }
        }
    }
    Ok(out)
}

/// A message's `content` (or a call output's `output`): a string, or a list of text
/// parts (`input_text`, `output_text`) concatenated.
fn message_content(v: Option<&Value>, at: &str) -> Result<String, ApiError> {
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(parts @ Value::Array(_)) => {
            parts_text(parts, at, &["input_text", "output_text", "refusal"])
        }
        None | Some(Value::Null) => {
            Err(ApiError::bad(at.to_string(), format!("`{at}` is required")))
        }
        Some(_) => Err(ApiError::bad(
            at.to_string(),
            format!("`{at}` must be a string or a list of text parts"),
        )),
    }
}

/// The text of a list of parts of the `kinds` given (`{"type", "text"}`; a `refusal`
/// part's text is its `refusal`), concatenated.
fn parts_text(parts: &Value, at: &str, kinds: &[&str]) -> Result<String, ApiError> {
    let list = parts
        .as_array()
        .ok_or_else(|| ApiError::bad(at.to_string(), format!("`{at}` must be a list of parts")))?;
    let mut text = String::new();
    for (j, p) in list.iter().enumerate() {
        let pat = format!("{at}[{j}]");
        let o = p
            .as_object()
            .ok_or_else(|| ApiError::bad(pat.clone(), format!("`{pat}` must be a part object")))?;
        let kind = o.get("type").and_then(Value::as_str).unwrap_or("");
        if !kinds.contains(&kind) {
            let why = match kind {
                "input_image" | "input_file" | "input_audio" => {
                    format!("part type `{kind}` is not supported: this model takes text")
                }
                "" => format!("`{pat}` needs a `type`"),
                _ => format!("part type `{kind}` is not one of {}", kinds.join(", ")),
            };
            return Err(ApiError::bad(format!("{pat}.type"), why));
        }
        let key = if kind == "refusal" { "refusal" } else { "text" };
        known_keys(o, &["type", key, "annotations", "logprobs"], &pat)?;
        let t = o.get(key).and_then(Value::as_str).ok_or_else(|| {
            ApiError::bad(
                format!("{pat}.{key}"),
                format!("`{pat}.{key}` must be a string"),
            )
        })?;
        text.push_str(t);
    }
    Ok(text)
}
