//! OpenAI's `POST /v1/responses`, stateless: the request (`input` as a string or a list of
//! items, `instructions`, function `tools`, `text.format`, `reasoning`) is read into the
//! same typed chat request as `/v1/chat/completions` ([`Chat`]) and runs the same path;
//! only the answer's shape differs. A whole answer is a `response` object whose `output`
//! holds a `reasoning` item (when the reasoning parser split some out), a `message` item
//! with one `output_text` part, and a `function_call` item per call; a streamed one is
//! the typed events (`response.created`, `response.output_item.added`,
//! `response.output_text.delta`, ..., `response.completed`), each item opened, filled and
//! closed in order. Nothing is stored: `previous_response_id` and `store: true` are
//! refused; a reasoning item's `encrypted_content` (asked for with `include`) is its text,
//! read back into the conversation when a client sends the item back.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use encore_core::request::TokenLogprobs;
use encore_core::tokenizer::{ChatMessage, Tokenizer};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use utoipa::ToSchema;

use crate::api_tools::{
    responses_tool_choice, responses_tools, ResponsesTool, ResponsesToolChoice,
};
use crate::body::{
    check_model, count, flag, given, read, validate_stop, Chat, Common, Field, SamplingBody, Stop,
};
use crate::error::ApiError;
use crate::fields;
use crate::generate::{chat_prompt, generate, Api, ChatOut, Ending, Typed};
use crate::output::{chat_logprobs, Kind, Reply};
use crate::parse::{CallIds, Delta, Parsed};
use crate::responses_input::{input, Input};
use crate::responses_params::{include, reasoning, IncludeValue, Reasoning};
use crate::structured::{text, TextParam};
use crate::tools::Tools;
use crate::wire::ChatTokenLogprob;
use crate::wire_responses::{
    ContentPart, IncompleteDetails, InputTokensDetails, OutputItem, OutputTokensDetails,
    ResponseObject, ResponseUsage,
};
use crate::AppState;

mod stream;

pub(crate) use stream::Stream;

pub(crate) async fn create(
    State(s): State<Arc<AppState>>,
    body: Result<Json<Value>, JsonRejection>,
) -> Response {
    let valid = read::<ResponsesBody>(body, fields::RESPONSES)
        .and_then(|b| b.validate(&s))
        .and_then(|(chat, echo)| {
            let (ids, c, out) = chat_prompt(&s, chat)?;
            Ok((ids, c, out, echo))
        });
    match valid {
        Ok((prompt, c, out, echo)) => {
            let api = Api::Responses(Box::new(echo));
            generate(s, c, prompt, Kind::Chat, Some(out), api).await
        }
        Err(e) => e.into_response(),
    }
}

/// The body of `/v1/responses`.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct ResponsesBody {
    #[schema(value_type = Option<String>)]
    model: Field<String>,
    #[schema(value_type = Option<Input>)]
    input: Field<Input>,
    #[schema(value_type = Option<String>)]
    instructions: Field<String>,
    #[schema(value_type = Option<u64>)]
    max_output_tokens: Field<u64>,
    #[serde(flatten)]
    sampling: SamplingBody,
    #[schema(value_type = Option<bool>)]
    stream: Field<bool>,
    #[schema(value_type = Option<Vec<ResponsesTool>>)]
    tools: Field<Vec<Value>>,
    #[schema(value_type = Option<ResponsesToolChoice>)]
    tool_choice: Field<Value>,
    #[schema(value_type = Option<bool>)]
    parallel_tool_calls: Field<bool>,
    #[schema(value_type = Option<TextParam>)]
    text: Field<Value>,
    #[schema(value_type = Option<Reasoning>)]
    reasoning: Field<Reasoning>,
    #[schema(value_type = Option<u64>)]
    top_logprobs: Field<u64>,
    #[schema(value_type = Option<Vec<IncludeValue>>)]
    include: Field<Vec<Field<String>>>,
    #[schema(value_type = Option<serde_json::Value>)]
    metadata: Field<Value>,
    /// vLLM's extensions, which guidellm sends.
    #[schema(value_type = Option<bool>)]
    ignore_eos: Field<bool>,
    #[schema(value_type = Option<Stop>)]
    stop: Field<Stop>,
}

/// What a response object repeats of its request.
pub(crate) struct Echo {
    instructions: Value,
    max_output_tokens: Value,
    temperature: f64,
    top_p: f64,
    tools: Value,
    tool_choice: Value,
    parallel_tool_calls: bool,
    text: Value,
    reasoning: Value,
    metadata: Value,
    top_logprobs: usize,
    /// Output text carries log-probabilities.
    logprobs: bool,
    /// Reasoning items carry `encrypted_content` (their text).
    encrypted_reasoning: bool,
}

impl ResponsesBody {
    pub fn validate(self, s: &AppState) -> Result<(Chat, Echo), ApiError> {
        check_model(self.model, &s.cfg.served_model_name, true)?;
        let (sampling, seed) = self.sampling.validate()?;
        let (temperature, top_p) = (sampling.temperature as f64, sampling.top_p as f64);
        let ignore_eos = flag(self.ignore_eos, "ignore_eos")?;
        let eos = if ignore_eos {
            Vec::new()
        } else {
            s.eos.clone()
        };
        let mut c = Common::new(sampling, seed, eos);
        c.stop = validate_stop(self.stop)?;
        c.stream = flag(self.stream, "stream")?;
        c.max_tokens = count(self.max_output_tokens, "max_output_tokens")?;
        c.names.max_tokens = "max_output_tokens";
        c.names.logprobs = "top_logprobs";
        c.names.constraint = "text.format";
        let include = include(self.include)?;
        let top = count(self.top_logprobs, "top_logprobs")?;
        let logprobs = include.logprobs || top.is_some();
        if logprobs {
            c.params.sampling.logprobs = Some(top.unwrap_or(0));
        }
        let (text, constraint) = text(given(self.text))?;
        c.params.constraint = constraint;
        let (reasoning, kwargs) = reasoning(self.reasoning, s)?;
        let choice_given = given(self.tool_choice);
        let parallel = self
            .parallel_tool_calls
            .get("parallel_tool_calls", || {
                "`parallel_tool_calls` must be a boolean".into()
            })?
            .unwrap_or(true);
        let defs = responses_tools(&self.tools)?;
        // The choice as given is echoed; its typed reading is checked.
        let choice = serde_json::from_value(choice_given.clone().unwrap_or_default())
            .unwrap_or(Field::Wrong);
        let choice = responses_tool_choice(choice)?;
        let tools = Tools::assemble(defs, choice, parallel, "tool_choice")?;
        // A forced call's grammar wins over `text.format` (see `tools::Tools::constraint`).
        if let Some(forced) = tools.as_ref().and_then(Tools::constraint) {
            c.params.constraint = Some(forced);
            c.names.constraint = "tools";
        }
        let instructions = self
            .instructions
            .get("instructions", || "`instructions` must be a string".into())?;
        let mut messages = Vec::new();
        if let Some(i) = &instructions {
            messages.push(ChatMessage::new("system", i.clone()));
        }
        messages.extend(input(self.input)?);
        let metadata = given(self.metadata);
        if metadata.as_ref().is_some_and(|m| !m.is_object()) {
            return Err(ApiError::bad("metadata", "`metadata` must be an object"));
        }
        let echo = Echo {
            instructions: json!(instructions),
            max_output_tokens: json!(c.max_tokens),
            temperature,
            top_p,
            tools: match self.tools {
                Field::Given(t) => Value::Array(t),
                _ => json!([]),
            },
            tool_choice: choice_given.unwrap_or_else(|| json!("auto")),
            parallel_tool_calls: parallel,
            text,
            reasoning,
            metadata: metadata.unwrap_or_else(|| json!({})),
            top_logprobs: top.unwrap_or(0),
            logprobs,
            encrypted_reasoning: include.encrypted_reasoning,
        };
        let chat = Chat {
            messages,
            tools,
            kwargs,
            effort: None,
            common: c,
        };
        Ok((chat, echo))
    }
}

/// The `usage` of a response.
fn usage(prompt: usize, output: usize, reasoning: usize) -> ResponseUsage {
    ResponseUsage {
        input_tokens: prompt,
        input_tokens_details: InputTokensDetails { cached_tokens: 0 },
        output_tokens: output,
        output_tokens_details: OutputTokensDetails {
            reasoning_tokens: reasoning,
        },
        total_tokens: prompt + output,
    }
}

/// A response's status, and why it is incomplete, from how its output ended.
fn status(finish: &str) -> (&'static str, Option<IncompleteDetails>) {
    match finish {
        "length" => (
            "incomplete",
            Some(IncompleteDetails {
                reason: "max_output_tokens",
            }),
        ),
        "abort" => ("cancelled", None),
        _ => ("completed", None),
    }
}

/// The response object of `reply`: the request's `echo`, its `status` and `output`.
fn response(
    reply: &Reply,
    id: &str,
    echo: &Echo,
    status: &'static str,
    incomplete: Option<IncompleteDetails>,
    output: Vec<OutputItem>,
    usage: Option<ResponseUsage>,
) -> ResponseObject {
    ResponseObject {
        id: id.to_string(),
        object: "response",
        created_at: reply.created,
        status,
        background: false,
        error: None,
        incomplete_details: incomplete,
        instructions: echo.instructions.clone(),
        max_output_tokens: echo.max_output_tokens.clone(),
        max_tool_calls: None,
        model: reply.model.clone(),
        output,
        parallel_tool_calls: echo.parallel_tool_calls,
        previous_response_id: None,
        reasoning: echo.reasoning.clone(),
        service_tier: "auto",
        store: false,
        temperature: echo.temperature,
        text: echo.text.clone(),
        tool_choice: echo.tool_choice.clone(),
        tools: echo.tools.clone(),
        top_logprobs: echo.top_logprobs,
        top_p: echo.top_p,
        truncation: "disabled",
        usage,
        user: None,
        metadata: echo.metadata.clone(),
    }
}

/// The ids of one response and its items.
fn ids(seed: u64) -> (String, CallIds) {
    let mut ids = CallIds::new(seed ^ 0x5bd1_e995_5bd1_e995, false);
    (ids.item("resp"), ids)
}

fn reasoning_item(id: &str, text: &str, echo: &Echo, status: &'static str) -> OutputItem {
    OutputItem::Reasoning {
        id: id.to_string(),
        summary: Vec::new(),
        content: vec![ContentPart::ReasoningText {
            text: text.to_string(),
        }],
        status,
        encrypted_content: echo.encrypted_reasoning.then(|| text.to_string()),
    }
}

fn text_part(text: &str, logprobs: &[ChatTokenLogprob]) -> ContentPart {
    ContentPart::OutputText {
        text: text.to_string(),
        annotations: Vec::new(),
        logprobs: logprobs.to_vec(),
    }
}

fn message_item(
    id: &str,
    text: &str,
    logprobs: &[ChatTokenLogprob],
    status: &'static str,
) -> OutputItem {
    OutputItem::Message {
        id: id.to_string(),
        status,
        role: "assistant",
        content: vec![text_part(text, logprobs)],
    }
}

fn call_item(
    id: &str,
    call_id: &str,
    name: &str,
    arguments: &str,
    status: &'static str,
) -> OutputItem {
    OutputItem::FunctionCall {
        id: id.to_string(),
        call_id: call_id.to_string(),
        name: name.to_string(),
        arguments: arguments.to_string(),
        status,
    }
}

/// The `logprobs` of output text: chat's entries.
fn logprob_entries(tok: &Tokenizer, entries: &[(u32, TokenLogprobs)]) -> Vec<ChatTokenLogprob> {
    chat_logprobs(tok, entries).content
}

/// Tokens of `text` (the reasoning's share of the output, as the usage reports it).
fn tokens_of(tok: &Tokenizer, text: &str) -> usize {
    if text.is_empty() {
        0
    } else {
        tok.encode(text, false).map_or(0, |ids| ids.len())
    }
}

/// A whole answer: the response object.
pub(crate) fn whole(
    tok: &Tokenizer,
    reply: &Reply,
    echo: &Echo,
    out: &ChatOut,
    parsed: &Parsed,
    logprobs: &[(u32, TokenLogprobs)],
    end: &Ending,
) -> ResponseObject {
    let (id, mut ids) = ids(out.id_seed);
    let mut calls = out.call_ids(0);
    let mut output = Vec::new();
    if !parsed.reasoning.is_empty() {
        output.push(reasoning_item(
            &ids.item("rs"),
            &parsed.reasoning,
            echo,
            "completed",
        ));
    }
    let named: Vec<_> = parsed.calls.iter().filter(|c| c.name.is_some()).collect();
    if !parsed.content.is_empty() || named.is_empty() {
        let lps = if echo.logprobs {
            logprob_entries(tok, logprobs)
        } else {
            Vec::new()
        };
        output.push(message_item(
            &ids.item("msg"),
            &parsed.content,
            &lps,
            "completed",
        ));
    }
    for c in named {
        let name = c.name.as_deref().unwrap_or_default();
        output.push(call_item(
            &ids.item("fc"),
            &calls.next(),
            name,
            &c.arguments,
            "completed",
        ));
    }
    let (status, incomplete) = status(end.finish);
    let u = usage(
        end.prompt,
        end.completion,
        tokens_of(tok, &parsed.reasoning),
    );
    response(reply, &id, echo, status, incomplete, output, Some(u))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::Call;
    use crate::wire::ToolCallDelta;

    fn echo() -> Echo {
        Echo {
            instructions: Value::Null,
            max_output_tokens: json!(32),
            temperature: 1.0,
            top_p: 1.0,
            tools: json!([]),
            tool_choice: json!("auto"),
            parallel_tool_calls: true,
            text: json!({"format": {"type": "text"}}),
            reasoning: json!({"effort": null, "summary": null}),
            metadata: json!({}),
            top_logprobs: 0,
            logprobs: false,
            encrypted_reasoning: true,
        }
    }

    fn out(id_seed: u64) -> ChatOut {
        ChatOut::plain(id_seed)
    }

    /// The deltas a stream sends for reasoning, content and two calls, their ids drawn
    /// from `ids` as a chat stream draws them.
    fn deltas(ids: &mut CallIds) -> Vec<Delta> {
        let d = |r: &str, c: &str, calls: Vec<Value>| Delta {
            reasoning: r.into(),
            content: c.into(),
            calls: calls.iter().map(ToolCallDelta::from_json).collect(),
        };
        let header = |i: usize, id: String, name: &str| {
            json!({"index": i, "id": id, "type": "function",
                   "function": {"name": name, "arguments": ""}})
        };
        let args = |i: usize, a: &str| json!({"index": i, "function": {"arguments": a}});
        vec![
            d("I ", "", vec![]),
            d("think.", "Hel", vec![]),
            d("", "", vec![]),
            d(
                "",
                "lo",
                vec![header(0, ids.next(), "f"), args(0, "{\"a\": ")],
            ),
            d("", "", vec![args(0, "1}"), header(1, ids.next(), "g")]),
            d("", "", vec![args(1, "{}")]),
        ]
    }

    fn parsed() -> Parsed {
        let call = |n: &str, a: &str| Call {
            name: Some(n.into()),
            arguments: a.into(),
        };
        Parsed {
            reasoning: "I think.".into(),
            content: "Hello".into(),
            calls: vec![call("f", "{\"a\": 1}"), call("g", "{}")],
        }
    }

    #[test]
    fn a_stream_ends_as_the_whole_response() {
        let tok = Arc::new(Tokenizer::bytes());
        let reply = Reply::new(Kind::Chat, 7, "m".into());
        let end = Ending {
            finish: "tool_calls",
            stop: None,
            prompt: 5,
            completion: 9,
        };
        let whole = whole(&tok, &reply, &echo(), &out(42), &parsed(), &[], &end);
        let whole = serde_json::to_value(whole).unwrap();
        let mut st = Stream::new(Box::new(echo()), 42, Arc::clone(&tok));
        let mut events = st.start(&reply);
        for d in deltas(&mut out(42).call_ids(0)) {
            events.extend(st.token(&d, None));
        }
        events.extend(st.end(&reply, &end));
        let kinds: Vec<&str> = events.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (i, (_, e)) in events.iter().enumerate() {
            assert_eq!(e["sequence_number"], json!(i));
        }
        let (_, last) = events.last().unwrap();
        assert_eq!(last["response"], whole);
        assert_eq!(whole["status"], "completed");
        let out = whole["output"].as_array().unwrap();
        let kinds: Vec<&str> = out.iter().map(|o| o["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            ["reasoning", "message", "function_call", "function_call"]
        );
        assert_eq!(out[0]["encrypted_content"], "I think.");
        assert_eq!(out[1]["content"][0]["text"], "Hello");
        assert_eq!(out[2]["arguments"], "{\"a\": 1}");
        assert!(out[3]["call_id"].as_str().unwrap().starts_with("call_"));
        // The deltas of each item add up to its text.
        let mut args = String::new();
        for (k, e) in &events {
            if *k == "response.function_call_arguments.delta" && e["output_index"] == 2 {
                args.push_str(e["delta"].as_str().unwrap());
            }
        }
        assert_eq!(args, "{\"a\": 1}");
    }

    #[test]
    fn a_length_cut_is_incomplete_and_an_empty_answer_is_a_message() {
        let tok = Arc::new(Tokenizer::bytes());
        let reply = Reply::new(Kind::Chat, 7, "m".into());
        let end = Ending {
            finish: "length",
            stop: None,
            prompt: 5,
            completion: 0,
        };
        let w = whole(
            &tok,
            &reply,
            &echo(),
            &out(1),
            &Parsed::default(),
            &[],
            &end,
        );
        let w = serde_json::to_value(w).unwrap();
        assert_eq!(w["status"], "incomplete");
        assert_eq!(w["incomplete_details"]["reason"], "max_output_tokens");
        let mut st = Stream::new(Box::new(echo()), 1, Arc::clone(&tok));
        let mut events = st.start(&reply);
        events.extend(st.end(&reply, &end));
        let (kind, last) = events.last().unwrap();
        assert_eq!(*kind, "response.incomplete");
        assert_eq!(last["response"], w);
        assert_eq!(w["output"][0]["type"], "message");
    }
}
