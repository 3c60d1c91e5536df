//! The `input` of OpenAI's `/v1/responses`, typed, read into the conversation the chat
//! template renders: a string (one user message) or a list of items: messages,
//! `function_call`, `function_call_output` and `reasoning` items, each refusal naming
//! the item's field (`input[3].arguments`). An item is one object of every item type's
//! fields ([`InputItem`]): its `type` says which it may have (any other is refused
//! naming it), as each refusal did before.

use std::collections::HashMap;

use encore_core::tokenizer::{ChatMessage, FunctionCall, ToolCall};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::body::Field;
use crate::chat_messages::call_arguments;
use crate::error::ApiError;
use crate::request_tools::Extra;

/// `input`: a string (one user message) or a list of items.
#[derive(Deserialize, Serialize)]
#[serde(untagged)]
pub(crate) enum Input {
    Text(String),
    Items(Vec<Field<InputItem>>),
}

impl utoipa::PartialSchema for Input {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        text_or_list(
            "InputItem",
            "One user message's text, or a list of input items.",
        )
    }
}

impl ToSchema for Input {}

/// The schema of a string or a list of the schema named `item`.
pub(crate) fn text_or_list(
    item: &str,
    description: &str,
) -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Type};
    use utoipa::openapi::{Ref, RefOr};
    OneOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(Type::String))
        .item(ArrayBuilder::new().items(RefOr::Ref(Ref::from_schema_name(item))))
        .description(Some(description))
        .into()
}

/// An input item's `type`.
#[derive(ToSchema)]
#[allow(dead_code)]
#[schema(rename_all = "snake_case")]
pub(crate) enum InputItemType {
    Message,
    FunctionCall,
    FunctionCallOutput,
    Reasoning,
}

/// An input item: a `message` (`role`, `content`; its `type` may be left out),
/// `function_call` (`call_id`, `name`, `arguments`), `function_call_output` (`call_id`,
/// `output`) or `reasoning` (`content`, `summary`, `encrypted_content`); any with `id`
/// and `status`.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct InputItem {
    #[serde(rename = "type")]
    #[schema(value_type = Option<InputItemType>)]
    kind: Field<String>,
    /// `user`, `assistant`, `system` or `developer`.
    #[schema(value_type = Option<String>)]
    role: Field<String>,
    #[schema(value_type = Option<Parts>)]
    content: Field<Parts>,
    #[schema(value_type = Option<String>)]
    id: Field<Value>,
    #[schema(value_type = Option<String>)]
    status: Field<Value>,
    #[schema(value_type = Option<String>)]
    call_id: Field<String>,
    #[schema(value_type = Option<String>)]
    name: Field<String>,
    /// The call's arguments, as JSON text.
    #[schema(value_type = Option<String>)]
    arguments: Field<String>,
    #[schema(value_type = Option<Parts>)]
    output: Field<Parts>,
    #[schema(value_type = Option<Parts>)]
    summary: Field<Parts>,
    #[schema(value_type = Option<String>)]
    encrypted_content: Field<String>,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Extra,
}

/// Text, or a list of parts.
#[derive(Deserialize, Serialize)]
#[serde(untagged)]
pub(crate) enum Parts {
    Text(String),
    Parts(Vec<Field<Part>>),
}

impl utoipa::PartialSchema for Parts {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        text_or_list("Part", "Text, or a list of parts.")
    }
}

impl ToSchema for Parts {}

/// A part: `{"type", "text"}` (`input_text`, `output_text`, `reasoning_text`,
/// `summary_text`) or `{"type": "refusal", "refusal"}`; `annotations` and `logprobs` are
/// accepted.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct Part {
    #[serde(rename = "type")]
    #[schema(value_type = String, required)]
    kind: Field<String>,
    #[schema(value_type = Option<String>)]
    text: Field<String>,
    #[schema(value_type = Option<String>)]
    refusal: Field<String>,
    #[schema(value_type = Option<Vec<Object>>)]
    annotations: Field<Value>,
    #[schema(value_type = Option<Vec<Object>>)]
    logprobs: Field<Value>,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Extra,
}

/// The objects of this module, whose schemas `/openapi.json` closes.
pub(crate) const CLOSED: [&str; 2] = ["InputItem", "Part"];

/// Refuse, as an unknown field of `at`, the first of `extra` and of `given` (field
/// names, whether given) outside `keys`.
fn only(extra: &Extra, given: &[(&str, bool)], keys: &[&str], at: &str) -> Result<(), ApiError> {
    let other = extra.keys().map(String::as_str).chain(
        given
            .iter()
            .filter(|(k, g)| *g && !keys.contains(k))
            .map(|(k, _)| *k),
    );
    match other.into_iter().next() {
        Some(k) => Err(ApiError::bad(
            format!("{at}.{k}"),
            format!("unknown field `{k}` in `{at}`"),
        )),
        None => Ok(()),
    }
}

impl InputItem {
    /// Refuse a key given that an item of its type does not have (`keys`, besides
    /// `type`, `id` and `status`).
    fn only(&self, keys: &[&str], at: &str) -> Result<(), ApiError> {
        let given = [
            ("role", self.role.is_given()),
            ("content", self.content.is_given()),
            ("call_id", self.call_id.is_given()),
            ("name", self.name.is_given()),
            ("arguments", self.arguments.is_given()),
            ("output", self.output.is_given()),
            ("summary", self.summary.is_given()),
            ("encrypted_content", self.encrypted_content.is_given()),
        ];
        only(&self.extra, &given, keys, at)
    }
}

/// A string field of item `at`, or a 400 saying it must be one.
fn string(f: Field<String>, at: &str, k: &str) -> Result<String, ApiError> {
    match f {
        Field::Given(s) => Ok(s),
        _ => Err(ApiError::bad(
            format!("{at}.{k}"),
            format!("`{at}.{k}` must be a string"),
        )),
    }
}

/// `input`: a string (one user message) or a list of items, as the conversation.
pub(crate) fn input(f: Field<Input>) -> Result<Vec<ChatMessage>, ApiError> {
    let rule = || "`input` must be a string or a non-empty list of input items".to_string();
    let items = match f.get("input", rule)? {
        None => return Err(ApiError::bad("input", "`input` is required")),
        Some(Input::Text(s)) => return Ok(vec![ChatMessage::new("user", s)]),
        Some(Input::Items(items)) if !items.is_empty() => items,
        Some(_) => return Err(ApiError::bad("input", rule())),
    };
    let mut out: Vec<ChatMessage> = Vec::new();
    // Reasoning waits for the assistant turn it belongs to.
    let mut reasoning: Option<String> = None;
    // The function of each call id, for the outputs that answer them.
    let mut called: HashMap<String, String> = HashMap::new();
    // The last item was part of an assistant turn (a message or a call).
    let mut in_turn = false;
    for (i, item) in items.into_iter().enumerate() {
        let at = format!("input[{i}]");
        let Field::Given(o) = item else {
            return Err(ApiError::bad(
                at.clone(),
                format!("`{at}` must be an input item object"),
            ));
        };
        let kind = match &o.kind {
            Field::Given(t) => t.clone(),
            _ if o.role.is_given() => "message".to_string(),
            _ => {
                return Err(ApiError::bad(
                    format!("{at}.type"),
                    format!("`{at}` needs a `type` (or a `role`, for a message)"),
                ))
            }
        };
        match kind.as_str() {
            "message" => {
                o.only(&["role", "content"], &at)?;
                let role = match &o.role {
                    Field::Given(r) => match r.as_str() {
                        "system" | "developer" => Some("system"),
                        "user" => Some("user"),
                        "assistant" => Some("assistant"),
                        _ => None,
                    },
                    _ => None,
                };
                let Some(role) = role else {
                    return Err(ApiError::bad(
                        format!("{at}.role"),
                        format!(
                            "`{at}.role` must be one of `user`, `assistant`, `system`, \
                             `developer`"
                        ),
                    ));
                };
                let content = message_content(o.content, &format!("{at}.content"))?;
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
                o.only(&["call_id", "name", "arguments"], &at)?;
                let call_id = string(o.call_id, &at, "call_id")?;
                let name = string(o.name, &at, "name")?;
                let args = string(o.arguments, &at, "arguments")?;
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
                o.only(&["call_id", "output"], &at)?;
                let call_id = string(o.call_id, &at, "call_id")?;
                let output = message_content(o.output, &format!("{at}.output"))?;
                let mut m = ChatMessage::new("tool", output);
                m.name = called.get(&call_id).cloned();
                m.tool_call_id = Some(call_id);
                out.push(m);
                in_turn = false;
            }
            "reasoning" => {
                o.only(&["summary", "content", "encrypted_content"], &at)?;
                let mut text = String::new();
                if o.content.is_given() {
                    text = parts_text(o.content, &format!("{at}.content"), &["reasoning_text"])?;
                }
                if text.is_empty() {
                    // Its text sent back as this server wrote it.
                    if o.encrypted_content.is_given() {
                        text = string(o.encrypted_content, &at, "encrypted_content")?;
                    }
                }
                if o.summary.is_given() {
                    let summary =
                        parts_text(o.summary, &format!("{at}.summary"), &["summary_text"])?;
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
fn message_content(v: Field<Parts>, at: &str) -> Result<String, ApiError> {
    match v {
        Field::Given(Parts::Text(s)) => Ok(s),
        Field::Given(parts) => parts_text(
            Field::Given(parts),
            at,
            &["input_text", "output_text", "refusal"],
        ),
        Field::Absent => Err(ApiError::bad(at.to_string(), format!("`{at}` is required"))),
        Field::Wrong => Err(ApiError::bad(
            at.to_string(),
            format!("`{at}` must be a string or a list of text parts"),
        )),
    }
}

/// The text of a list of parts of the `kinds` given (`{"type", "text"}`; a `refusal`
/// part's text is its `refusal`), concatenated.
fn parts_text(parts: Field<Parts>, at: &str, kinds: &[&str]) -> Result<String, ApiError> {
    let Field::Given(Parts::Parts(list)) = parts else {
        return Err(ApiError::bad(
            at.to_string(),
            format!("`{at}` must be a list of parts"),
        ));
    };
    let mut text = String::new();
    for (j, p) in list.into_iter().enumerate() {
        let pat = format!("{at}[{j}]");
        let Field::Given(p) = p else {
            return Err(ApiError::bad(
                pat.clone(),
                format!("`{pat}` must be a part object"),
            ));
        };
        let kind = match &p.kind {
            Field::Given(k) => k.as_str(),
            _ => "",
        };
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
        let given = [
            ("text", p.text.is_given()),
            ("refusal", p.refusal.is_given()),
        ];
        only(&p.extra, &given, &[key], &pat)?;
        let t = if key == "refusal" { p.refusal } else { p.text };
        text.push_str(&string(t, &pat, key)?);
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn read(v: Value) -> Result<Vec<ChatMessage>, ApiError> {
        input(serde_json::from_value(v).unwrap())
    }

    #[test]
    fn bad_items_are_refused_naming_the_field() {
        for (items, param, words) in [
            (json!([]), "input", "non-empty"),
            (json!(5), "input", "string or"),
            (json!([5]), "input[0]", "input item object"),
            (json!([{"content": "x"}]), "input[0].type", "needs a `type`"),
            (
                json!([{"role": "tool", "content": "x"}]),
                "input[0].role",
                "one of",
            ),
            (json!([{"role": "user"}]), "input[0].content", "required"),
            (
                json!([{"role": "user", "content": 5}]),
                "input[0].content",
                "text parts",
            ),
            (
                json!([{"role": "user", "content": "x", "call_id": "c"}]),
                "input[0].call_id",
                "unknown field",
            ),
            (
                json!([{"role": "user", "content": "x", "weight": 1}]),
                "input[0].weight",
                "unknown field",
            ),
            (
                json!([{"role": "user", "content": [{"type": "input_image"}]}]),
                "input[0].content[0].type",
                "takes text",
            ),
            (
                json!([{"role": "user", "content": [{"text": "a"}]}]),
                "input[0].content[0].type",
                "needs a `type`",
            ),
            (
                json!([{"role": "user", "content": [{"type": "input_text", "text": 5}]}]),
                "input[0].content[0].text",
                "string",
            ),
            (
                json!([{"role": "user", "content": [{"type": "input_text", "text": "a", "refusal": "b"}]}]),
                "input[0].content[0].refusal",
                "unknown field",
            ),
            (
                json!([{"type": "function_call", "call_id": "c", "name": "f"}]),
                "input[0].arguments",
                "string",
            ),
            (
                json!([{"type": "function_call_output", "call_id": "c"}]),
                "input[0].output",
                "required",
            ),
            (
                json!([{"type": "reasoning", "content": "x"}]),
                "input[0].content",
                "list of parts",
            ),
            (
                json!([{"type": "reasoning", "encrypted_content": 5}]),
                "input[0].encrypted_content",
                "string",
            ),
            (
                json!([{"type": "web_search_call"}]),
                "input[0].type",
                "not supported",
            ),
        ] {
            let e = read(items.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{items}: {}", e.message);
            assert!(e.message.contains(words), "{items}: {}", e.message);
        }
    }

    #[test]
    fn items_read_into_the_conversation() {
        let m = read(json!([
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "why"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "status": "completed"},
            {"type": "function_call_output", "call_id": "c1", "output": "22"},
        ]))
        .unwrap();
        assert_eq!(m.len(), 4);
        assert_eq!(m[0].role, "system");
        assert_eq!(m[2].reasoning_content.as_deref(), Some("why"));
        assert_eq!(m[2].tool_calls[0].function.name, "f");
        assert_eq!(
            (m[3].role.as_str(), m[3].name.as_deref()),
            ("tool", Some("f"))
        );
        assert_eq!(read(json!("x")).unwrap(), [ChatMessage::new("user", "x")]);
    }
}
