//! The endpoints agent clients speak besides chat completions, over the same engine:
//! OpenAI's `/v1/responses` and Anthropic's `/v1/messages` (and `count_tokens`). Each
//! answers what chat completions answers for the same conversation (greedy text, usage,
//! prompt tokens), whole and streamed as its typed events; stop sequences; tool calls
//! forced by `tool_choice` and a call's result sent back; bad input refused in each
//! endpoint's own error shape, naming the field.

use std::net::SocketAddr;

use serde_json::{json, Value};

use crate::harness::*;

const CHAT: &str = "/v1/chat/completions";
const RESPONSES: &str = "/v1/responses";
const MESSAGES: &str = "/v1/messages";

/// The (event name, data) pairs of a typed SSE body.
fn events(raw: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut name = String::new();
    for line in raw.lines() {
        if let Some(n) = line.strip_prefix("event: ") {
            name = n.to_string();
        } else if let Some(d) = line.strip_prefix("data: ") {
            let v: Value = serde_json::from_str(d).unwrap_or_else(|e| panic!("{d}: {e}"));
            assert_eq!(v["type"], name.as_str(), "{raw}");
            out.push((std::mem::take(&mut name), v));
        }
    }
    out
}

/// Chat's greedy answer: its message and usage.
fn chat_answer(a: SocketAddr, messages: Value, extra: Value) -> Value {
    let mut b = json!({"model": MODEL, "max_tokens": 12, "temperature": 0, "messages": messages});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    let (st, v) = post(a, CHAT, b);
    assert_eq!(st, 200, "{v}");
    v
}

/// The text of a response's message items.
fn output_text(r: &Value) -> String {
    r["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["type"] == "message")
        .flat_map(|o| o["content"].as_array().unwrap().iter())
        .map(|p| p["text"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn responses_answer_what_chat_answers() {
    let s = start(None);
    let c = chat_answer(
        s.addr,
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]),
        json!({}),
    );
    let text = c["choices"][0]["message"]["content"].as_str().unwrap();
    let status = match c["choices"][0]["finish_reason"].as_str() {
        Some("length") => "incomplete",
        _ => "completed",
    };
    let base = json!({"model": MODEL, "max_output_tokens": 12, "temperature": 0,
                      "instructions": "Be brief."});
    let as_items = json!([{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]);
    for input in [json!("hi"), as_items] {
        let mut b = base.clone();
        b["input"] = input;
        let (st, r) = post(s.addr, RESPONSES, b.clone());
        assert_eq!(st, 200, "{r}");
        assert_eq!(r["object"], "response");
        assert!(r["id"].as_str().unwrap().starts_with("resp_"), "{r}");
        assert_eq!(output_text(&r), text);
        assert_eq!(r["status"], status);
        assert_eq!(r["usage"]["input_tokens"], c["usage"]["prompt_tokens"]);
        assert_eq!(r["usage"]["output_tokens"], c["usage"]["completion_tokens"]);
        assert_eq!(r["instructions"], "Be brief.");
        // Streamed: the typed events, their deltas adding up to the text, and the final
        // response as the whole one (less its ids and time).
        b["stream"] = json!(true);
        let ev = events(&post_raw(s.addr, RESPONSES, &b));
        let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names[..2], ["response.created", "response.in_progress"]);
        let last = format!("response.{status}");
        assert_eq!(names.last().copied(), Some(last.as_str()), "{names:?}");
        let deltas: String = ev
            .iter()
            .filter(|(n, _)| n == "response.output_text.delta")
            .map(|(_, e)| e["delta"].as_str().unwrap())
            .collect();
        assert_eq!(deltas, text);
        let fin = &ev.last().unwrap().1["response"];
        assert_eq!(output_text(fin), text);
        assert_eq!(fin["usage"], r["usage"]);
        for (i, (_, e)) in ev.iter().enumerate() {
            assert_eq!(e["sequence_number"], i);
        }
    }
}

#[test]
fn messages_answer_what_chat_answers() {
    let s = start(None);
    let c = chat_answer(
        s.addr,
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]),
        json!({}),
    );
    let text = c["choices"][0]["message"]["content"].as_str().unwrap();
    let stop = match c["choices"][0]["finish_reason"].as_str() {
        Some("length") => "max_tokens",
        _ => "end_turn",
    };
    let b = json!({"model": MODEL, "max_tokens": 12, "temperature": 0,
                   "system": [{"type": "text", "text": "Be brief."}],
                   "messages": [{"role": "user", "content": "hi"}]});
    let (st, m) = post(s.addr, MESSAGES, b.clone());
    assert_eq!(st, 200, "{m}");
    assert_eq!(m["type"], "message");
    assert_eq!(m["content"], json!([{"type": "text", "text": text}]));
    assert_eq!(m["stop_reason"], stop);
    assert_eq!(m["usage"]["input_tokens"], c["usage"]["prompt_tokens"]);
    assert_eq!(m["usage"]["output_tokens"], c["usage"]["completion_tokens"]);
    let mut count = b.clone();
    for k in ["max_tokens", "temperature"] {
        count.as_object_mut().unwrap().remove(k);
    }
    let (st, n) = post(s.addr, "/v1/messages/count_tokens", count);
    assert_eq!(st, 200, "{n}");
    assert_eq!(n, json!({"input_tokens": c["usage"]["prompt_tokens"]}));
    // Streamed.
    let mut sb = b.clone();
    sb["stream"] = json!(true);
    let ev = events(&post_raw(s.addr, MESSAGES, &sb));
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[0], "message_start");
    assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"]);
    let deltas: String = ev
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, e)| e["delta"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, text);
    let delta = &ev[ev.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], stop);
    assert_eq!(delta["usage"]["output_tokens"], m["usage"]["output_tokens"]);
    // A stop sequence from the middle of the text ends it there, and is named.
    let chars: Vec<char> = text.chars().collect();
    if chars.len() >= 6 {
        let seq: String = chars[3..5].iter().collect();
        let at = text.find(&seq).unwrap();
        let mut b = b.clone();
        b["stop_sequences"] = json!(["\u{1}never", seq]);
        for stream in [false, true] {
            b["stream"] = json!(stream);
            let (got, reason, named) = if stream {
                let ev = events(&post_raw(s.addr, MESSAGES, &b));
                let t: String = ev
                    .iter()
                    .filter(|(n, _)| n == "content_block_delta")
                    .map(|(_, e)| e["delta"]["text"].as_str().unwrap())
                    .collect();
                let d = &ev[ev.len() - 2].1["delta"];
                (t, d["stop_reason"].clone(), d["stop_sequence"].clone())
            } else {
                let (_, m) = post(s.addr, MESSAGES, b.clone());
                let t = m["content"][0]["text"].as_str().unwrap().to_string();
                (t, m["stop_reason"].clone(), m["stop_sequence"].clone())
            };
            assert_eq!(got, text[..at]);
            assert_eq!((reason, named), (json!("stop_sequence"), json!(seq)));
        }
    }
}

fn weather_schema() -> Value {
    json!({"type": "object",
           "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
           "required": ["city"], "additionalProperties": false})
}

/// A forced call's arguments name a city of the schema.
fn check_city(args: &Value) {
    let city = args["city"].as_str().unwrap_or_default();
    assert!(["Paris", "Rome"].contains(&city), "{args}");
}

#[test]
fn forced_calls_and_their_results_on_both_endpoints() {
    let s = start_parsers(None, None);
    // Responses: `required`, whole and streamed.
    let tools = json!([{"type": "function", "name": "get_weather", "description": "Weather",
                        "parameters": weather_schema()}]);
    let b = json!({"model": MODEL, "max_output_tokens": 400, "temperature": 1, "seed": 3,
                   "input": "Weather in Paris?", "tools": tools, "tool_choice": "required",
                   "parallel_tool_calls": false});
    let (st, r) = post(s.addr, RESPONSES, b.clone());
    assert_eq!(st, 200, "{r}");
    let calls: Vec<&Value> = r["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["type"] == "function_call")
        .collect();
    assert_eq!(calls.len(), 1, "{r}");
    assert_eq!(calls[0]["name"], "get_weather");
    let args: Value = serde_json::from_str(calls[0]["arguments"].as_str().unwrap()).unwrap();
    check_city(&args);
    let mut sb = b.clone();
    sb["stream"] = json!(true);
    let ev = events(&post_raw(s.addr, RESPONSES, &sb));
    let streamed: String = ev
        .iter()
        .filter(|(n, _)| n == "response.function_call_arguments.delta")
        .map(|(_, e)| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, calls[0]["arguments"].as_str().unwrap());
    let fin = &ev.last().unwrap().1["response"];
    assert_eq!(
        fin["output"].as_array().unwrap().last().unwrap()["arguments"],
        streamed
    );
    // The call and its output sent back render as chat's tool message does.
    let call_id = calls[0]["call_id"].as_str().unwrap();
    let input = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": call_id, "name": "get_weather",
         "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call_output", "call_id": call_id, "output": "22 C"},
    ]);
    let b = json!({"model": MODEL, "max_output_tokens": 4, "input": input,
                   "tools": [{"type": "function", "name": "get_weather", "parameters": weather_schema()}]});
    let (st, r) = post(s.addr, RESPONSES, b);
    assert_eq!(st, 200, "{r}");
    let chat_tools = json!([{"type": "function", "function": {"name": "get_weather",
                             "parameters": weather_schema()}}]);
    let messages = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": call_id, "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "22 C"},
    ]);
    let c = chat_answer(s.addr, messages, json!({"tools": chat_tools}));
    assert_eq!(r["usage"]["input_tokens"], c["usage"]["prompt_tokens"]);

    // Messages: a named tool, whole and streamed.
    let tools = json!([{"name": "get_weather", "description": "Weather",
                        "input_schema": weather_schema()}]);
    let b = json!({"model": MODEL, "max_tokens": 400, "temperature": 1,
                   "messages": [{"role": "user", "content": "Weather in Paris?"}],
                   "tools": tools, "tool_choice": {"type": "tool", "name": "get_weather"}});
    let (st, m) = post(s.addr, MESSAGES, b.clone());
    assert_eq!(st, 200, "{m}");
    assert_eq!(m["stop_reason"], "tool_use");
    let uses: Vec<&Value> = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .collect();
    assert_eq!(uses.len(), 1, "{m}");
    check_city(&uses[0]["input"]);
    let mut sb = b.clone();
    sb["stream"] = json!(true);
    let ev = events(&post_raw(s.addr, MESSAGES, &sb));
    let start = ev
        .iter()
        .find(|(n, e)| n == "content_block_start" && e["content_block"]["type"] == "tool_use")
        .unwrap();
    assert_eq!(start.1["content_block"]["name"], "get_weather");
    let json_text: String = ev
        .iter()
        .filter(|(n, e)| n == "content_block_delta" && e["delta"]["type"] == "input_json_delta")
        .map(|(_, e)| e["delta"]["partial_json"].as_str().unwrap())
        .collect();
    check_city(&serde_json::from_str(&json_text).unwrap());
    assert_eq!(ev[ev.len() - 2].1["delta"]["stop_reason"], "tool_use");
    // The call and its result sent back, counted as chat renders them.
    let id = uses[0]["id"].as_str().unwrap();
    let conv = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": id, "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": [{"type": "text", "text": "22 C"}]}]},
    ]);
    let (st, n) = post(
        s.addr,
        "/v1/messages/count_tokens",
        json!({"model": MODEL, "messages": conv, "tools": tools}),
    );
    assert_eq!(st, 200, "{n}");
    let messages = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": id, "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": id, "content": "22 C"},
    ]);
    let chat_tools = json!([{"type": "function", "function": {"name": "get_weather",
                             "description": "Weather", "parameters": weather_schema()}}]);
    let c = chat_answer(s.addr, messages, json!({"tools": chat_tools}));
    assert_eq!(n["input_tokens"], c["usage"]["prompt_tokens"]);
    let (st, m) = post(
        s.addr,
        MESSAGES,
        json!({"model": MODEL, "max_tokens": 4, "messages": conv, "tools": tools}),
    );
    assert_eq!(st, 200, "{m}");
}

/// A 400 in Anthropic's shape naming `param`.
fn anthropic_400(a: SocketAddr, path: &str, body: Value, param: &str) {
    let (st, e) = post(a, path, body.clone());
    assert_eq!(st, 400, "{body}: {e}");
    assert_eq!(e["type"], "error", "{e}");
    assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
    let m = e["error"]["message"].as_str().unwrap();
    assert!(m.starts_with(&format!("{param}: ")), "{body}: {m}");
}

/// A 400 in OpenAI's shape naming `param`.
fn openai_400(a: SocketAddr, body: Value, param: &str) {
    let (st, e) = post(a, RESPONSES, body.clone());
    assert_eq!(st, 400, "{body}: {e}");
    assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
    assert_eq!(e["error"]["param"], param, "{body}: {e}");
}

#[test]
fn bad_input_is_refused_in_each_endpoints_shape() {
    let s = start(Some("sekret"));
    let _ = &s;
    // Auth: a bearer token or Anthropic's `x-api-key`; a miss in each shape.
    let body =
        json!({"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]});
    let (st, raw) = http(
        s.addr,
        "POST",
        MESSAGES,
        Some(&body.to_string()),
        &[("x-api-key", "sekret")],
    );
    assert_eq!(st, 200, "{raw}");
    let (st, raw) = http(
        s.addr,
        "POST",
        MESSAGES,
        Some(&body.to_string()),
        &[("x-api-key", "nope")],
    );
    assert_eq!(st, 401);
    let e: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(e["error"]["type"], "authentication_error");
    let (st, raw) = http(
        s.addr,
        "POST",
        RESPONSES,
        Some(&json!({"model": MODEL, "input": "hi"}).to_string()),
        &[],
    );
    assert_eq!(st, 401);
    let e: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(e["error"]["type"], "authentication_error");

    let s = start(None);
    let user = json!([{"role": "user", "content": "hi"}]);
    let m = |extra: Value| {
        let mut b = json!({"model": MODEL, "max_tokens": 4, "messages": user});
        for (k, v) in extra.as_object().unwrap() {
            if v.is_null() {
                b.as_object_mut().unwrap().remove(k);
            } else {
                b[k] = v.clone();
            }
        }
        b
    };
    for (body, param) in [
        (m(json!({"max_tokens": null})), "max_tokens"),
        (
            m(
                json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
            ),
            "messages[0].content[0].type",
        ),
        (
            m(json!({"messages": [{"role": "user", "content": [{"type": "sparkle"}]}]})),
            "messages[0].content[0].type",
        ),
        (
            m(json!({"tools": [{"name": "f", "input_schema": "object"}]})),
            "tools[0].input_schema",
        ),
        (
            m(json!({"tools": [{"name": "f", "input_schema": {"type": "array"}}]})),
            "tools[0].input_schema",
        ),
        (
            m(json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]})),
            "tools[0].type",
        ),
        (m(json!({"temperature": 1.5})), "temperature"),
        (m(json!({"stop_sequences": [""]})), "stop_sequences"),
        (
            m(json!({"messages": [{"role": "system", "content": "x"}]})),
            "messages[0].role",
        ),
        (
            m(
                json!({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]}),
            ),
            "messages[0].content[0].type",
        ),
        (
            m(
                json!({"tool_choice": {"type": "tool", "name": "nope"}, "tools": [{"name": "f", "input_schema": {"type": "object"}}]}),
            ),
            "tool_choice",
        ),
        (
            m(json!({"thinking": {"type": "enabled", "budget_tokens": 2048}, "max_tokens": 4096})),
            "thinking",
        ),
        (
            m(json!({"thinking": {"type": "enabled", "budget_tokens": 2048}})),
            "thinking.budget_tokens",
        ),
        (m(json!({"top_logprobs": 2})), "top_logprobs"),
        (m(json!({"mcp_servers": [{"url": "x"}]})), "mcp_servers"),
    ] {
        anthropic_400(s.addr, MESSAGES, body, param);
    }
    let (st, e) = post(s.addr, MESSAGES, m(json!({"model": "other"})));
    assert_eq!(
        (st, e["error"]["type"].as_str()),
        (404, Some("not_found_error"))
    );
    anthropic_400(
        s.addr,
        "/v1/messages/count_tokens",
        json!({"model": MODEL, "messages": user, "max_tokens": 3}),
        "max_tokens",
    );

    let r = |extra: Value| {
        let mut b = json!({"model": MODEL, "input": "hi"});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    for (body, param) in [
        (json!({"model": MODEL}), "input"),
        (
            r(json!({"input": [{"type": "item_reference", "id": "x"}]})),
            "input[0].type",
        ),
        (
            r(
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            ),
            "input[0].content[0].type",
        ),
        (
            r(
                json!({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": 5}]}),
            ),
            "input[0].arguments",
        ),
        (
            r(json!({"tools": [{"type": "function", "name": "f", "parameters": "x"}]})),
            "tools[0].parameters",
        ),
        (
            r(json!({"tools": [{"type": "web_search"}]})),
            "tools[0].type",
        ),
        (r(json!({"store": true})), "store"),
        (
            r(json!({"previous_response_id": "resp_1"})),
            "previous_response_id",
        ),
        (
            r(json!({"text": {"format": {"type": "yaml"}}})),
            "text.format.type",
        ),
        (
            r(json!({"include": ["file_search_call.results"]})),
            "include[0]",
        ),
        (
            r(json!({"reasoning": {"effort": "high"}})),
            "reasoning.effort",
        ),
        (r(json!({"max_output_tokens": -1})), "max_output_tokens"),
        (r(json!({"tool_choice": "required"})), "tool_choice"),
    ] {
        openai_400(s.addr, body, param);
    }
    // A structured output that cannot compile is admission's refusal, named as the body
    // spells it.
    openai_400(
        s.addr,
        r(
            json!({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}}),
        ),
        "text.format",
    );
    // Accepted no-ops.
    let (st, v) = post(
        s.addr,
        RESPONSES,
        r(
            json!({"store": false, "truncation": "disabled", "metadata": {"a": "b"},
                 "max_output_tokens": 2, "reasoning": {"effort": "none"}}),
        ),
    );
    assert_eq!(st, 200, "{v}");
}
