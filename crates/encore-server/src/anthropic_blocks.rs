//! Anthropic's `messages` and `system` content blocks, typed, read into the conversation
//! the chat template renders: `text`, an assistant's `tool_use` (its tool calls) and
//! `thinking` (its reasoning), a user's `tool_result` (a `tool` message), each refusal
//! naming the block's field. A `redacted_thinking` block is opaque (encrypted by the
//! model that wrote it): it is accepted in the history and left out of the prompt.
//! A block is one object of every block type's fields ([`Block`]): its `type` says
//! which it may have (any other is refused naming it), as each refusal did before.

use std::collections::HashMap;

use encore_core::tokenizer::{ChatMessage, FunctionCall, ToolCall};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::field::Field;
use crate::request_tools::Extra;
use crate::responses_input::text_or_list;

/// A message of `messages`: `{"role": "user" | "assistant", "content"}`.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct AnthropicMessage {
    #[schema(value_type = AnthropicRole, required)]
    role: Field<String>,
    #[schema(value_type = Content, required)]
    content: Field<Content>,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Extra,
}

/// A message's role.
#[derive(ToSchema)]
#[allow(dead_code)]
#[schema(rename_all = "lowercase")]
pub(crate) enum AnthropicRole {
    User,
    Assistant,
}

/// Content: text, or a list of content blocks (`system`, a message's `content`, a tool
/// result's `content`).
#[derive(Deserialize, Serialize)]
#[serde(untagged)]
pub(crate) enum Content {
    Text(String),
    Blocks(Vec<BlockField>),
}

impl utoipa::PartialSchema for Content {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        text_or_list("Block", "Text, or a list of content blocks.")
    }
}

impl ToSchema for Content {}

/// A content block as given (of the wrong type: refused naming it).
pub(crate) type BlockField = Field<Block>;

/// A content block's `type`.
#[derive(ToSchema)]
#[allow(dead_code)]
#[schema(rename_all = "snake_case")]
pub(crate) enum BlockType {
    Text,
    ToolUse,
    ToolResult,
    Thinking,
    RedactedThinking,
}

/// A content block: `text` (`text`, `cache_control`, no `citations`), `tool_use` (`id`,
/// `name`, `input`, `cache_control`; `caller` and `toolset_name` as the SDK echoes them),
/// `thinking` (`thinking`, `signature`), `redacted_thinking` (`data`), `tool_result`
/// (`tool_use_id`, `content`, `is_error`, `cache_control`).
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct Block {
    #[serde(rename = "type")]
    #[schema(value_type = BlockType, required)]
    kind: Field<String>,
    #[schema(value_type = Option<String>)]
    text: Field<String>,
    /// Accepted: the prefix cache is automatic.
    #[schema(value_type = Option<Object>)]
    cache_control: Field<Value>,
    /// Only none.
    #[schema(value_type = Option<Vec<Object>>)]
    citations: Field<Value>,
    #[schema(value_type = Option<String>)]
    id: Field<String>,
    #[schema(value_type = Option<String>)]
    name: Field<String>,
    #[schema(value_type = Option<Object>)]
    input: Field<Map<String, Value>>,
    /// Only `{"type": "direct"}`.
    #[schema(value_type = Option<Object>)]
    caller: Field<Value>,
    /// Only none.
    #[schema(value_type = Option<String>)]
    toolset_name: Field<Value>,
    #[schema(value_type = Option<String>)]
    data: Field<String>,
    #[schema(value_type = Option<String>)]
    thinking: Field<String>,
    #[schema(value_type = Option<String>)]
    signature: Field<Value>,
    #[schema(value_type = Option<String>)]
    tool_use_id: Field<String>,
    #[schema(value_type = Option<Content>)]
    content: Field<Content>,
    #[schema(value_type = Option<bool>)]
    is_error: Field<bool>,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Extra,
}

/// The objects of this module, whose schemas `/openapi.json` closes.
pub(crate) const CLOSED: [&str; 2] = ["AnthropicMessage", "Block"];

impl Block {
    /// Refuse, as an unknown field of `at`, the first key given that a block of its type
    /// does not have (`keys`, besides `type`).
    fn only(&self, keys: &[&str], at: &str) -> Result<(), ApiError> {
        let given = [
            ("text", self.text.is_given()),
            ("cache_control", self.cache_control.is_given()),
            ("citations", self.citations.is_given()),
            ("id", self.id.is_given()),
            ("name", self.name.is_given()),
            ("input", self.input.is_given()),
            ("caller", self.caller.is_given()),
            ("toolset_name", self.toolset_name.is_given()),
            ("data", self.data.is_given()),
            ("thinking", self.thinking.is_given()),
            ("signature", self.signature.is_given()),
            ("tool_use_id", self.tool_use_id.is_given()),
            ("content", self.content.is_given()),
            ("is_error", self.is_error.is_given()),
        ];
        let other = self.extra.keys().map(String::as_str).chain(
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

    /// The block's `type` if a string.
    fn kind(&self) -> Option<&str> {
        match &self.kind {
            Field::Given(k) => Some(k.as_str()),
            _ => None,
        }
    }
}

/// A string field of block `at`, or a 400 saying it must be one.
fn string(f: Field<String>, at: &str, k: &str) -> Result<String, ApiError> {
    match f {
        Field::Given(s) => Ok(s),
        _ => Err(ApiError::bad(
            format!("{at}.{k}"),
            format!("`{at}.{k}` must be a string"),
        )),
    }
}

/// Block `at` as given: the block, or a 400 saying it must be one.
fn block(b: BlockField, at: &str) -> Result<Block, ApiError> {
    match b {
        Field::Given(b) => Ok(b),
        _ => Err(ApiError::bad(
            at.to_string(),
            format!("`{at}` must be a content block object"),
        )),
    }
}

/// The text of a list of text blocks (`system`, a tool result's content).
pub(crate) fn blocks_text(list: Vec<BlockField>, at: &str) -> Result<String, ApiError> {
    let mut text = String::new();
    for (j, b) in list.into_iter().enumerate() {
        let bat = format!("{at}[{j}]");
        let b = block(b, &bat)?;
        match b.kind() {
            Some("text") => {}
            other => return Err(unsupported_block(other, &bat)),
        }
        text.push_str(&text_block(b, &bat)?);
    }
    Ok(text)
}

/// `system`: text or a list of text blocks.
pub(crate) fn system(f: Field<Content>) -> Result<Option<String>, ApiError> {
    match f {
        Field::Absent => Ok(None),
        Field::Given(Content::Text(t)) => Ok(Some(t)),
        Field::Given(Content::Blocks(b)) => blocks_text(b, "system").map(Some),
        Field::Wrong => Err(ApiError::bad(
            "system",
            "`system` must be a string or a list of text blocks",
        )),
    }
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
fn text_block(b: Block, at: &str) -> Result<String, ApiError> {
    b.only(&["text", "cache_control", "citations"], at)?;
    if matches!(&b.citations, Field::Given(c) if c != &json!([])) {
        let m = "citations are not supported";
        return Err(ApiError::bad(format!("{at}.citations"), m));
    }
    string(b.text, at, "text")
}

/// `messages` as the chat template's conversation, after `out`'s system message: a
/// user's `tool_result` blocks become `tool` messages (before its text), an assistant's
/// `tool_use` blocks its tool calls and its `thinking` its reasoning.
pub(crate) fn conversation(
    list: Vec<Field<AnthropicMessage>>,
    out: &mut Vec<ChatMessage>,
) -> Result<(), ApiError> {
    // The function of each tool-use id, for the results that answer them.
    let mut called: HashMap<String, String> = HashMap::new();
    for (i, m) in list.into_iter().enumerate() {
        let at = format!("messages[{i}]");
        let Field::Given(m) = m else {
            return Err(ApiError::bad(
                at.clone(),
                format!("`{at}` must be an object with `role` and `content`"),
            ));
        };
        if let Some(k) = m.extra.keys().next() {
            return Err(ApiError::bad(
                format!("{at}.{k}"),
                format!("unknown field `{k}` in `{at}`"),
            ));
        }
        let role = match &m.role {
            Field::Given(r) if matches!(r.as_str(), "user" | "assistant") => r.as_str(),
            _ => {
                return Err(ApiError::bad(
                    format!("{at}.role"),
                    format!("`{at}.role` must be `user` or `assistant`"),
                ))
            }
        };
        let blocks = match m.content {
            Field::Given(Content::Text(t)) => {
                out.push(ChatMessage::new(role, t));
                continue;
            }
            Field::Given(Content::Blocks(b)) => b,
            _ => {
                return Err(ApiError::bad(
                    format!("{at}.content"),
                    format!("`{at}.content` must be a string or a list of content blocks"),
                ))
            }
        };
        let mut msg = ChatMessage::new(role, "");
        let mut had_results = false;
        for (j, b) in blocks.into_iter().enumerate() {
            let bat = format!("{at}.content[{j}]");
            let b = block(b, &bat)?;
            let kind = b.kind().map(str::to_string);
            let wrong_role = |owner: &str| {
                ApiError::bad(
                    format!("{bat}.type"),
                    format!(
                        "`{}` blocks belong to `{owner}` messages",
                        kind.as_deref().unwrap_or("")
                    ),
                )
            };
            match kind.as_deref() {
                Some("text") => {
                    let t = text_block(b, &bat)?;
                    msg.content.get_or_insert_with(String::new).push_str(&t);
                }
                Some("tool_use") => {
                    if role != "assistant" {
                        return Err(wrong_role("assistant"));
                    }
                    b.only(
                        &[
                            "id",
                            "name",
                            "input",
                            "cache_control",
                            "caller",
                            "toolset_name",
                        ],
                        &bat,
                    )?;
                    sdk_echo(&b, &bat)?;
                    let (id, name) = (string(b.id, &bat, "id")?, string(b.name, &bat, "name")?);
                    let Field::Given(input) = b.input else {
                        return Err(ApiError::bad(
                            format!("{bat}.input"),
                            format!("`{bat}.input` must be an object"),
                        ));
                    };
                    called.insert(id.clone(), name.clone());
                    msg.tool_calls.push(ToolCall {
                        id,
                        kind: "function".into(),
                        function: FunctionCall {
                            name,
                            arguments: Value::Object(input),
                        },
                    });
                }
                // Thinking another model redacted is opaque: nothing to render, so it is
                // left out of the prompt.
                Some("redacted_thinking") => {
                    if role != "assistant" {
                        return Err(wrong_role("assistant"));
                    }
                    b.only(&["data"], &bat)?;
                    string(b.data, &bat, "data")?;
                }
                Some("thinking") => {
                    if role != "assistant" {
                        return Err(wrong_role("assistant"));
                    }
                    b.only(&["thinking", "signature"], &bat)?;
                    let t = string(b.thinking, &bat, "thinking")?;
                    msg.reasoning_content
                        .get_or_insert_with(String::new)
                        .push_str(&t);
                }
                Some("tool_result") => {
                    if role != "user" {
                        return Err(wrong_role("user"));
                    }
                    had_results = true;
                    b.only(
                        &["tool_use_id", "content", "is_error", "cache_control"],
                        &bat,
                    )?;
                    let id = string(b.tool_use_id, &bat, "tool_use_id")?;
                    let mut text = match b.content {
                        Field::Absent => String::new(),
                        Field::Given(Content::Text(t)) => t,
                        Field::Given(Content::Blocks(l)) => {
                            blocks_text(l, &format!("{bat}.content"))?
                        }
                        Field::Wrong => {
                            return Err(ApiError::bad(
                                format!("{bat}.content"),
                                format!(
                                    "`{bat}.content` must be a string or a list of text blocks"
                                ),
                            ))
                        }
                    };
                    match b.is_error {
                        Field::Absent | Field::Given(false) => {}
                        // The template has no error flag: the text says it.
                        Field::Given(true) => text = format!("Error: {text}"),
                        Field::Wrong => {
                            return Err(ApiError::bad(
                                format!("{bat}.is_error"),
                                format!("`{bat}.is_error` must be a boolean"),
                            ))
                        }
                    }
                    let mut tm = ChatMessage::new("tool", text);
                    tm.name = called.get(&id).cloned();
                    tm.tool_call_id = Some(id);
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
fn sdk_echo(b: &Block, at: &str) -> Result<(), ApiError> {
    match &b.caller {
        Field::Absent => {}
        Field::Given(c) if c == &json!({"type": "direct"}) => {}
        _ => {
            return Err(ApiError::bad(
                format!("{at}.caller"),
                format!("`{at}.caller` other than `{{\"type\": \"direct\"}}` is not supported: the model calls the client's tools itself"),
            ))
        }
    }
    match b.toolset_name {
        Field::Absent => Ok(()),
        _ => Err(ApiError::bad(
            format!("{at}.toolset_name"),
            format!("`{at}.toolset_name` is not supported: the server has no MCP toolsets"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `param` and message of the refusal of `messages`.
    fn refusal(messages: Value) -> (String, String) {
        let list = serde_json::from_value(messages).unwrap();
        let e = conversation(list, &mut Vec::new()).unwrap_err();
        (e.param.unwrap_or_default().into_owned(), e.message)
    }

    #[test]
    fn bad_blocks_are_refused_naming_the_field() {
        let user = |b: Value| json!([{"role": "user", "content": [b]}]);
        let assistant = |b: Value| json!([{"role": "assistant", "content": [b]}]);
        for (messages, param, words) in [
            (json!([5]), "messages[0]", "must be an object"),
            (
                json!([{"role": "user", "content": "x", "name": "a"}]),
                "messages[0].name",
                "unknown field",
            ),
            (
                json!([{"role": "system", "content": "x"}]),
                "messages[0].role",
                "`user` or `assistant`",
            ),
            (
                json!([{"role": "user", "content": 5}]),
                "messages[0].content",
                "string or a list",
            ),
            (
                user(json!(5)),
                "messages[0].content[0]",
                "content block object",
            ),
            (
                user(json!({"text": "a"})),
                "messages[0].content[0].type",
                "needs a `type`",
            ),
            (
                user(json!({"type": "image"})),
                "messages[0].content[0].type",
                "takes text",
            ),
            (
                user(json!({"type": "text", "text": 5})),
                "messages[0].content[0].text",
                "must be a string",
            ),
            (
                user(json!({"type": "text", "text": "a", "id": "x"})),
                "messages[0].content[0].id",
                "unknown field",
            ),
            (
                user(json!({"type": "text", "text": "a", "citations": [{}]})),
                "messages[0].content[0].citations",
                "citations",
            ),
            (
                user(json!({"type": "tool_use", "id": "a", "name": "f", "input": {}})),
                "messages[0].content[0].type",
                "belong to `assistant`",
            ),
            (
                assistant(json!({"type": "tool_use", "id": "a", "name": "f", "input": []})),
                "messages[0].content[0].input",
                "object",
            ),
            (
                assistant(json!({"type": "tool_use", "id": 1, "name": "f", "input": {}})),
                "messages[0].content[0].id",
                "string",
            ),
            (
                assistant(json!({"type": "thinking", "thinking": "a", "data": "x"})),
                "messages[0].content[0].data",
                "unknown field",
            ),
            (
                assistant(json!({"type": "redacted_thinking"})),
                "messages[0].content[0].data",
                "string",
            ),
            (
                user(json!({"type": "tool_result", "tool_use_id": "a", "content": 5})),
                "messages[0].content[0].content",
                "list of text blocks",
            ),
            (
                user(
                    json!({"type": "tool_result", "tool_use_id": "a", "content": [{"type": "image"}]}),
                ),
                "messages[0].content[0].content[0].type",
                "takes text",
            ),
            (
                user(json!({"type": "tool_result", "tool_use_id": "a", "is_error": "no"})),
                "messages[0].content[0].is_error",
                "boolean",
            ),
        ] {
            let (p, m) = refusal(messages.clone());
            assert_eq!(p, param, "{messages}: {m}");
            assert!(m.contains(words), "{messages}: {m}");
        }
    }

    #[test]
    fn blocks_read_into_the_conversation() {
        let list = serde_json::from_value(json!([
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "why", "signature": "s"},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}, "caller": null}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": [{"type": "text", "text": "22"}], "is_error": true}]},
        ]))
        .unwrap();
        let mut out = Vec::new();
        conversation(list, &mut out).unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(out[1].reasoning_content.as_deref(), Some("why"));
        assert_eq!(out[1].tool_calls[0].function.arguments, json!({"a": 1}));
        assert_eq!(out[2].content.as_deref(), Some("Error: 22"));
        assert_eq!(out[2].name.as_deref(), Some("f"));
        assert_eq!(
            system(serde_json::from_value(json!([{"type": "text", "text": "s"}])).unwrap())
                .unwrap()
                .as_deref(),
            Some("s")
        );
    }
}
