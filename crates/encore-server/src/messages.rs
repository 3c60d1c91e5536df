//! Anthropic's `POST /v1/messages` and `POST /v1/messages/count_tokens`: the request
//! (`system`, `messages` of content blocks including `tool_use` and `tool_result`,
//! `tools`, `tool_choice`, `stop_sequences`, `thinking`) is read into the same typed chat
//! request as `/v1/chat/completions` ([`Chat`]) and runs the same path; only the answer's
//! shape differs: a `message` whose `content` holds a `thinking` block (when the
//! reasoning parser split some out), a `text` block and a `tool_use` block per call, with
//! Anthropic's `stop_reason`; streamed as `message_start`, `content_block_start` /
//! `content_block_delta` / `content_block_stop` per block, `message_delta` and
//! `message_stop`. Errors have Anthropic's shape, `{"type": "error", "error": {"type",
//! "message"}}`, the message naming the field.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use encore_core::tokenizer::ChatMessage;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

use crate::anthropic_blocks::{conversation, system, AnthropicMessage, Content};
use crate::anthropic_params::{output_config, thinking, OutputConfig, Thinking};
use crate::api_tools::{
    anthropic_tool_choice, anthropic_tools, AnthropicTool, AnthropicToolChoice,
};
use crate::body::{check_model, count, flag, number, read, Chat, Common, Field, SamplingBody};
use crate::error::ApiError;
use crate::fields;
use crate::generate::{chat_prompt, generate, Api, ChatOut, Ending, Typed};
use crate::output::{Kind, Reply};
use crate::parse::{CallIds, Delta, Parsed};
use crate::tools::Tools;
use crate::wire::{AnthropicError, AnthropicErrorBody};
use crate::wire_anthropic::{
    BlockDelta, ContentBlock, CountTokensResponse, Message, MessageDelta, MessageEvent,
    MessageUsage, OutputUsage,
};
use crate::AppState;

mod stream;

pub(crate) use stream::Stream;

/// The most stop sequences a request may give.
const MAX_STOP_SEQUENCES: usize = 64;

pub(crate) async fn create(
    State(s): State<Arc<AppState>>,
    body: Result<Json<Value>, JsonRejection>,
) -> Response {
    let valid = read::<MessagesBody>(body, fields::MESSAGES)
        .and_then(|b| b.validate(&s))
        .and_then(|(chat, omit)| Ok((chat_prompt(&s, chat)?, omit)));
    match valid {
        Ok(((prompt, c, out), omit_thinking)) => {
            let api = Api::Messages { omit_thinking };
            generate(s, c, prompt, Kind::Chat, Some(out), api).await
        }
        Err(e) => error(e),
    }
}

pub(crate) async fn count_tokens(
    State(s): State<Arc<AppState>>,
    body: Result<Json<Value>, JsonRejection>,
) -> Response {
    let valid = read::<CountBody>(body, fields::COUNT_TOKENS)
        .and_then(|b| b.validate(&s))
        .and_then(|(chat, _)| chat_prompt(&s, chat));
    match valid {
        Ok((prompt, ..)) => Json(CountTokensResponse {
            input_tokens: prompt.len(),
        })
        .into_response(),
        Err(e) => error(e),
    }
}

/// Error `e` in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`,
/// the message naming the field.
pub(crate) fn error(e: ApiError) -> Response {
    let mut r = (e.status, Json(error_body(&e))).into_response();
    r.extensions_mut().insert(e.refusal());
    r
}

fn error_body(e: &ApiError) -> AnthropicErrorBody {
    let kind = match e.status {
        StatusCode::BAD_REQUEST => "invalid_request_error",
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        _ => "api_error",
    };
    let message = match &e.param {
        Some(p) => format!("{p}: {}", e.message),
        None => e.message.clone(),
    };
    AnthropicErrorBody {
        kind: "error",
        error: AnthropicError { kind, message },
    }
}

/// What both bodies share: the conversation, its tools and thinking.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
struct Conversation {
    #[schema(value_type = Option<String>)]
    model: Field<String>,
    #[schema(value_type = Option<Vec<AnthropicMessage>>)]
    messages: Field<Vec<Field<AnthropicMessage>>>,
    #[schema(value_type = Option<Content>)]
    system: Field<Content>,
    #[schema(value_type = Option<Vec<AnthropicTool>>)]
    tools: Field<Vec<Value>>,
    #[schema(value_type = Option<AnthropicToolChoice>)]
    tool_choice: Field<AnthropicToolChoice>,
    #[schema(value_type = Option<Thinking>)]
    thinking: Field<Thinking>,
    #[schema(value_type = Option<OutputConfig>)]
    output_config: Field<OutputConfig>,
    /// Accepted: prefix caching is automatic.
    #[schema(value_type = Option<Object>)]
    cache_control: Field<Map<String, Value>>,
}

/// The body of `/v1/messages`.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct MessagesBody {
    #[serde(flatten)]
    conversation: Conversation,
    #[schema(value_type = Option<u64>)]
    max_tokens: Field<u64>,
    #[schema(value_type = Option<Vec<String>>)]
    stop_sequences: Field<Vec<String>>,
    #[schema(value_type = Option<bool>)]
    stream: Field<bool>,
    #[schema(value_type = Option<f64>)]
    temperature: Field<f64>,
    #[schema(value_type = Option<f64>)]
    top_p: Field<f64>,
    #[schema(value_type = Option<i64>)]
    top_k: Field<i64>,
}

/// The body of `/v1/messages/count_tokens`.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct CountBody {
    #[serde(flatten)]
    conversation: Conversation,
}

impl CountBody {
    fn validate(self, s: &AppState) -> Result<(Chat, bool), ApiError> {
        let c = Common::new(Default::default(), None, s.eos.clone());
        self.conversation.validate(s, c, None)
    }
}

impl MessagesBody {
    /// The chat request, and whether the thinking is left out of the answer.
    pub fn validate(self, s: &AppState) -> Result<(Chat, bool), ApiError> {
        let sampling = SamplingBody {
            top_p: self.top_p,
            top_k: self.top_k,
            ..SamplingBody::default()
        };
        let (mut sampling, _) = sampling.validate()?;
        sampling.temperature = number(self.temperature, "temperature", 0.0, 1.0, 1.0)? as f32;
        let mut c = Common::new(sampling, None, s.eos.clone());
        c.stream = flag(self.stream, "stream")?;
        let max = count(self.max_tokens, "max_tokens")?
            .ok_or_else(|| ApiError::bad("max_tokens", "`max_tokens` is required"))?;
        if max == 0 {
            return Err(ApiError::bad(
                "max_tokens",
                "`max_tokens` must be at least 1",
            ));
        }
        c.max_tokens = Some(max);
        c.names.constraint = "tool_choice";
        let rule = || {
            format!(
                "`stop_sequences` must be a list of at most {MAX_STOP_SEQUENCES} non-empty strings"
            )
        };
        let stops = self
            .stop_sequences
            .get("stop_sequences", rule)?
            .unwrap_or_default();
        if stops.len() > MAX_STOP_SEQUENCES {
            return Err(ApiError::bad("stop_sequences", rule()));
        }
        c.stop = encore_core::tokenizer::StopMatcher::new(stops)
            .map_err(|_| ApiError::bad("stop_sequences", rule()))?;
        self.conversation.validate(s, c, Some(max))
    }
}

impl Conversation {
    /// The chat request, and whether the thinking is left out of the answer;
    /// `max_tokens` bounds a thinking budget.
    fn validate(
        self,
        s: &AppState,
        mut c: Common,
        max_tokens: Option<usize>,
    ) -> Result<(Chat, bool), ApiError> {
        check_model(self.model, &s.cfg.served_model_name, true)?;
        // Prefix caching is automatic: the breakpoint asks for nothing more.
        self.cache_control.get("cache_control", || {
            "`cache_control` must be an object".into()
        })?;
        let mut kwargs = Map::new();
        let omit_thinking = thinking(self.thinking, s, max_tokens, &mut kwargs)?;
        if self.output_config.is_given() {
            c.params.constraint = output_config(self.output_config, s, &mut kwargs)?;
            c.names.constraint = "output_config.format";
        }
        let defs = anthropic_tools(&self.tools)?;
        let (choice, parallel) = anthropic_tool_choice(self.tool_choice)?;
        let tools = Tools::assemble(defs, choice, parallel, "tool_choice")?;
        // A forced call's grammar wins over `output_config.format` (see
        // `tools::Tools::constraint`).
        if let Some(forced) = tools.as_ref().and_then(Tools::constraint) {
            c.params.constraint = Some(forced);
            c.names.constraint = "tool_choice";
        }
        let mut messages = Vec::new();
        if let Some(text) = system(self.system)? {
            messages.push(ChatMessage::new("system", text));
        }
        let list = self
            .messages
            .get("messages", || "`messages` must be a list".into())?
            .ok_or_else(|| ApiError::bad("messages", "`messages` is required"))?;
        if list.is_empty() {
            return Err(ApiError::bad("messages", "`messages` must not be empty"));
        }
        conversation(list, &mut messages)?;
        let chat = Chat {
            messages,
            tools,
            kwargs,
            effort: None,
            common: c,
        };
        Ok((chat, omit_thinking))
    }
}

/// The stop reason of an output.
fn stop_reason(end: &Ending, called: bool) -> &'static str {
    if called {
        "tool_use"
    } else if end.finish == "length" {
        "max_tokens"
    } else if end.stop.is_some() {
        "stop_sequence"
    } else {
        "end_turn"
    }
}

/// A call's `input`: its arguments parsed (the raw text if they are not JSON).
fn input(arguments: &str) -> Value {
    if arguments.trim().is_empty() {
        return json!({});
    }
    serde_json::from_str(arguments).unwrap_or_else(|_| json!(arguments))
}

fn message_id(seed: u64) -> String {
    CallIds::new(seed ^ 0x2545_f491_4f6c_dd1d, false).item("msg")
}

/// A whole answer: the message.
pub(crate) fn whole(
    reply: &Reply,
    out: &ChatOut,
    parsed: &Parsed,
    end: &Ending,
    omit_thinking: bool,
) -> Message {
    let mut calls = out.call_ids(0);
    let mut content = Vec::new();
    if !parsed.reasoning.is_empty() {
        let text = if omit_thinking { "" } else { &parsed.reasoning };
        content.push(ContentBlock::Thinking {
            thinking: text.to_string(),
            signature: String::new(),
        });
    }
    let named: Vec<_> = parsed.calls.iter().filter(|c| c.name.is_some()).collect();
    if !parsed.content.is_empty() || (named.is_empty() && content.is_empty()) {
        content.push(ContentBlock::Text {
            text: parsed.content.clone(),
        });
    }
    for c in &named {
        content.push(ContentBlock::ToolUse {
            id: calls.next(),
            name: c.name.clone().unwrap_or_default(),
            input: input(&c.arguments),
        });
    }
    Message {
        id: message_id(out.id_seed),
        kind: "message",
        role: "assistant",
        model: reply.model.clone(),
        content,
        stop_reason: Some(stop_reason(end, !named.is_empty())),
        stop_sequence: end.stop.clone(),
        usage: MessageUsage {
            input_tokens: end.prompt,
            output_tokens: end.completion,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::Call;
    use crate::wire::ToolCallDelta;

    fn out(id_seed: u64) -> ChatOut {
        ChatOut::plain(id_seed)
    }

    /// The content blocks a client builds from a stream's events, and its stop reason.
    fn accumulate(events: &[Typed]) -> (Vec<Value>, Value, Value) {
        let mut blocks: Vec<Value> = Vec::new();
        let mut json_text: Vec<String> = Vec::new();
        let (mut stop, mut seq) = (Value::Null, Value::Null);
        for (kind, e) in events {
            assert_eq!(e["type"], *kind);
            match *kind {
                "content_block_start" => {
                    assert_eq!(e["index"], blocks.len());
                    blocks.push(e["content_block"].clone());
                    json_text.push(String::new());
                }
                "content_block_delta" => {
                    let i = e["index"].as_u64().unwrap() as usize;
                    let d = &e["delta"];
                    match d["type"].as_str().unwrap() {
                        "text_delta" => {
                            let t = blocks[i]["text"].as_str().unwrap().to_string();
                            blocks[i]["text"] = json!(t + d["text"].as_str().unwrap());
                        }
                        "thinking_delta" => {
                            let t = blocks[i]["thinking"].as_str().unwrap().to_string();
                            blocks[i]["thinking"] = json!(t + d["thinking"].as_str().unwrap());
                        }
                        "input_json_delta" => {
                            json_text[i].push_str(d["partial_json"].as_str().unwrap())
                        }
                        other => panic!("{other}"),
                    }
                }
                "content_block_stop" => {
                    let i = e["index"].as_u64().unwrap() as usize;
                    if blocks[i]["type"] == "tool_use" {
                        blocks[i]["input"] = serde_json::from_str(&json_text[i]).unwrap();
                    }
                }
                "message_delta" => {
                    stop = e["delta"]["stop_reason"].clone();
                    seq = e["delta"]["stop_sequence"].clone();
                }
                _ => {}
            }
        }
        (blocks, stop, seq)
    }

    #[test]
    fn a_stream_builds_the_whole_message() {
        let reply = Reply::new(Kind::Chat, 7, "m".into());
        let parsed = Parsed {
            reasoning: "Hmm.".into(),
            content: "Let me look.".into(),
            calls: vec![Call {
                name: Some("get_weather".into()),
                arguments: "{\"city\": \"Paris\"}".into(),
            }],
        };
        let end = Ending {
            finish: "tool_calls",
            stop: None,
            prompt: 3,
            completion: 20,
        };
        let w = serde_json::to_value(whole(&reply, &out(9), &parsed, &end, false)).unwrap();
        assert_eq!(w["stop_reason"], "tool_use");
        let mut ids = out(9).call_ids(0);
        let d = |r: &str, c: &str, calls: Vec<Value>| Delta {
            reasoning: r.into(),
            content: c.into(),
            calls: calls.iter().map(ToolCallDelta::from_json).collect(),
        };
        let mut st = Stream::new(9, false);
        let mut events = st.start(&reply, 3);
        for delta in [
            d("Hm", "", vec![]),
            d("m.", "Let me", vec![]),
            d(
                "",
                " look.",
                vec![json!({"index": 0, "id": ids.next(), "type": "function",
                "function": {"name": "get_weather", "arguments": ""}})],
            ),
            d(
                "",
                "",
                vec![json!({"index": 0, "function": {"arguments": "{\"city\": "}})],
            ),
            d(
                "",
                "",
                vec![json!({"index": 0, "function": {"arguments": "\"Paris\"}"}})],
            ),
        ] {
            events.extend(st.token(&delta));
        }
        events.extend(st.end(&end));
        assert_eq!(events[0].0, "message_start");
        assert_eq!(events[0].1["message"]["id"], w["id"]);
        assert_eq!(events.last().unwrap().0, "message_stop");
        let (blocks, stop, _) = accumulate(&events);
        assert_eq!(Value::Array(blocks), w["content"]);
        assert_eq!(stop, w["stop_reason"]);
        let kinds: Vec<&str> = w["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["thinking", "text", "tool_use"]);
    }

    #[test]
    fn stop_reasons() {
        let reply = Reply::new(Kind::Chat, 7, "m".into());
        let text = Parsed {
            content: "Hi".into(),
            ..Parsed::default()
        };
        for (finish, stop, want) in [
            ("stop", None, "end_turn"),
            ("length", None, "max_tokens"),
            ("stop", Some("\n\n".to_string()), "stop_sequence"),
        ] {
            let end = Ending {
                finish,
                stop: stop.clone(),
                prompt: 1,
                completion: 2,
            };
            let w = serde_json::to_value(whole(&reply, &out(1), &text, &end, false)).unwrap();
            assert_eq!(
                (w["stop_reason"].as_str(), &w["stop_sequence"]),
                (Some(want), &json!(stop))
            );
            let mut st = Stream::new(1, false);
            let mut events = st.start(&reply, 1);
            events.extend(st.token(&Delta {
                content: "Hi".into(),
                ..Delta::default()
            }));
            events.extend(st.end(&end));
            let (blocks, s, q) = accumulate(&events);
            assert_eq!(
                (Value::Array(blocks), s, q),
                (
                    w["content"].clone(),
                    w["stop_reason"].clone(),
                    w["stop_sequence"].clone()
                )
            );
        }
    }

    #[test]
    fn errors_name_the_field_in_anthropics_shape() {
        let e = ApiError::bad(
            "messages[0].content[1].type",
            "content block type `image` is not supported",
        );
        let b = serde_json::to_value(error_body(&e)).unwrap();
        assert_eq!(b["type"], "error");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert!(b["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("messages[0].content[1].type: "));
    }
}
