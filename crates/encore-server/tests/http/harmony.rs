//! gpt-oss's chat format, harmony, through the server (`--reasoning-parser harmony` on
//! `dummy:tiny`, whose byte tokenizer writes harmony's special tokens as their text): the
//! prompt as OpenAI's renderer writes it (the fixture `openai-harmony` rendered, over
//! `/tokenize`), `reasoning_effort` in its system message and refused for other models,
//! and the model's output (forced by a `choice` inside the final message, as a random
//! model writes no harmony) read by channel, whole and streamed: `analysis` as reasoning,
//! a `commentary` message to `functions.NAME` as a call, `final` as content; forced calls
//! and structured outputs written as harmony messages on chat, responses and messages.

use std::net::SocketAddr;

use encore_server::ReasoningFormat;
use serde_json::{json, Value};

use crate::harness::*;
use crate::tools::{chat, streamed, tools, whole};

const CHAT: &str = "/v1/chat/completions";

// What a `choice` forces after the `<|channel|>final<|message|>` harmony's grammar puts
// first (the byte tokenizer has no harmony tokens, so no analysis may come before it):
// the rest of a final message, then more messages.
const ANSWER_THEN_THINK: &str =
    "2 + 2 = 4.<|end|><|start|>assistant<|channel|>analysis<|message|>User asks 2+2.";
const ANSWER_THINK_CALL: &str = "Checking.<|end|><|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}";

fn fixture(name: &str) -> Value {
    let all: Value = serde_json::from_str(include_str!(
        "../../../encore-core/tests/fixtures/harmony.json"
    ))
    .unwrap();
    all["renders"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap()
        .clone()
}

/// The text of the prompt the server renders for `body` (messages, tools, kwargs).
fn prompt(a: SocketAddr, body: Value) -> String {
    let (st, v) = post(a, "/tokenize", body);
    assert_eq!(st, 200, "{v}");
    let (st, d) = post(a, "/detokenize", json!({"tokens": v["tokens"]}));
    assert_eq!(st, 200, "{d}");
    d["prompt"].as_str().unwrap().to_string()
}

#[test]
fn harmony_prompt_is_openai_harmonys() {
    let s = start_parsers(None, Some(ReasoningFormat::Harmony));
    let f = fixture("tool_round_trip");
    let req = &f["request"];
    let got = prompt(
        s.addr,
        json!({"model": MODEL, "messages": req["messages"], "tools": req["tools"]}),
    );
    // The server writes today's date where the fixture has its own.
    let date = got
        .split("Current date: ")
        .nth(1)
        .map(|r| &r[..10])
        .expect("a date line");
    let want = f["text"]
        .as_str()
        .unwrap()
        .replace("Current date: 2025-08-07", &format!("Current date: {date}"));
    assert_eq!(got, want);
    // The effort goes into the system message, from chat's `reasoning_effort` too.
    let b = |effort: &str| {
        json!({"model": MODEL, "max_tokens": 1, "reasoning_effort": effort,
               "messages": [{"role": "user", "content": "Hi"}]})
    };
    let (st, lo) = post(s.addr, CHAT, b("low"));
    assert_eq!(st, 200, "{lo}");
    let (st, hi) = post(s.addr, CHAT, b("high"));
    assert_eq!(st, 200, "{hi}");
    // "high" is one byte longer than "low".
    assert_eq!(
        hi["usage"]["prompt_tokens"].as_u64().unwrap(),
        lo["usage"]["prompt_tokens"].as_u64().unwrap() + 1
    );
    let text = prompt(
        s.addr,
        json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
               "chat_template_kwargs": {"reasoning_effort": "high"}}),
    );
    assert!(text.contains("\n\nReasoning: high\n\n"), "{text}");
    assert!(text.ends_with("<|start|>user<|message|>Hi<|end|><|start|>assistant"));
    // A word harmony does not know, named.
    let (st, v) = post(s.addr, CHAT, b("extreme"));
    assert_eq!(
        (st, v["error"]["param"].as_str()),
        (400, Some("reasoning_effort")),
        "{v}"
    );
    let r = json!({"model": MODEL, "input": "Hi", "reasoning": {"effort": "minimal"}});
    let (st, v) = post(s.addr, "/v1/responses", r);
    assert_eq!(
        (st, v["error"]["param"].as_str()),
        (400, Some("reasoning.effort")),
        "{v}"
    );
    // A model whose template reads no effort refuses it by name.
    let plain = start_parsers(None, None);
    let (st, v) = post(plain.addr, CHAT, b("low"));
    assert_eq!(
        (st, v["error"]["param"].as_str()),
        (400, Some("reasoning_effort")),
        "{v}"
    );
}

#[test]
fn harmony_output_is_read_by_channel_whole_and_streamed() {
    let s = start_parsers(None, Some(ReasoningFormat::Harmony));
    let b = json!({"model": MODEL, "max_tokens": 400, "reasoning_effort": "low",
                   "messages": [{"role": "user", "content": "2+2?"}],
                   "structured_outputs": {"choice": [ANSWER_THEN_THINK]}});
    for a in [whole(s.addr, &b), streamed(s.addr, &b)] {
        assert_eq!(a.reasoning.as_deref(), Some("User asks 2+2."));
        assert_eq!(a.content.as_deref(), Some("2 + 2 = 4."));
        assert_eq!((a.calls.len(), a.finish.as_str()), (0, "stop"));
    }
    let b = chat(json!({"structured_outputs": {"choice": [ANSWER_THINK_CALL]}}));
    for a in [whole(s.addr, &b), streamed(s.addr, &b)] {
        assert_eq!(a.reasoning.as_deref(), Some("Need the weather."));
        assert_eq!(a.content.as_deref(), Some("Checking."));
        assert_eq!(
            a.named_calls(),
            [(
                "get_weather".to_string(),
                "{\"city\":\"Paris\"}".to_string()
            )]
        );
        assert_eq!(a.finish, "tool_calls");
    }
    // A conversation that carries the call and its result back renders and runs.
    let mut b = chat(json!({"max_tokens": 4}));
    b["messages"] = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22 C"},
    ]);
    let text = prompt(
        s.addr,
        json!({"model": MODEL, "messages": b["messages"], "tools": tools()}),
    );
    assert!(
        text.ends_with("<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>22 C<|end|><|start|>assistant"),
        "{text}"
    );
    let (st, v) = post(s.addr, CHAT, b.clone());
    assert_eq!(st, 200, "{v}");
    // A result that answers no call is refused, naming the messages.
    b["messages"][2]["tool_call_id"] = json!("call_9");
    let (st, v) = post(s.addr, CHAT, b);
    assert_eq!(
        (st, v["error"]["param"].as_str()),
        (400, Some("messages")),
        "{v}"
    );
}

#[test]
fn harmony_on_responses_and_messages() {
    let s = start_parsers(None, Some(ReasoningFormat::Harmony));
    let weather = json!({"type": "function", "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris"]}},
                       "required": ["city"], "additionalProperties": false}});
    // A forced call: the grammar writes harmony's call message, read back as a call.
    let r = json!({"model": MODEL, "input": "Weather in Paris?", "tools": [weather],
                   "tool_choice": "required", "reasoning": {"effort": "high"},
                   "max_output_tokens": 200});
    let (st, v) = post(s.addr, "/v1/responses", r.clone());
    assert_eq!(st, 200, "{v}");
    let calls: Vec<&Value> = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "function_call")
        .collect();
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0]["name"], "get_weather");
    assert_eq!(calls[0]["arguments"], "{\"city\": \"Paris\"}");
    let mut streamed = r;
    streamed["stream"] = json!(true);
    let raw = post_raw(s.addr, "/v1/responses", &streamed);
    assert!(
        raw.contains("response.function_call_arguments.done"),
        "{raw}"
    );
    let m = json!({"model": MODEL, "max_tokens": 200,
                   "messages": [{"role": "user", "content": "Weather in Paris?"}],
                   "tools": [{"name": "get_weather", "input_schema": weather["parameters"]}],
                   "tool_choice": {"type": "tool", "name": "get_weather"},
                   "output_config": {"effort": "low"}});
    let (st, v) = post(s.addr, "/v1/messages", m);
    assert_eq!(st, 200, "{v}");
    let uses: Vec<&Value> = v["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .collect();
    assert_eq!(uses.len(), 1, "{v}");
    assert_eq!(uses[0]["input"], json!({"city": "Paris"}));
    // A word harmony has no `Reasoning:` line for, named.
    let m = json!({"model": MODEL, "max_tokens": 4, "output_config": {"effort": "max"},
                   "messages": [{"role": "user", "content": "Hi"}]});
    let (st, v) = post(s.addr, "/v1/messages", m);
    assert_eq!(st, 400, "{v}");
    assert!(v.to_string().contains("output_config.effort"), "{v}");
}

#[test]
fn harmony_structured_output_is_the_final_message() {
    let s = start_parsers(None, Some(ReasoningFormat::Harmony));
    let schema = json!({"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                        "required": ["city"], "additionalProperties": false});
    let b = json!({"model": MODEL, "max_tokens": 200,
                   "messages": [{"role": "user", "content": "A city?"}],
                   "response_format": {"type": "json_schema",
                                       "json_schema": {"name": "c", "schema": schema}}});
    for a in [whole(s.addr, &b), streamed(s.addr, &b)] {
        let content = a.content.expect("content");
        let v: Value = serde_json::from_str(&content).unwrap_or_else(|e| panic!("{content}: {e}"));
        assert!(
            ["Paris", "Rome"].contains(&v["city"].as_str().unwrap()),
            "{v}"
        );
        assert_eq!((a.reasoning, a.finish.as_str()), (None, "stop"));
    }
    // The tokens are harmony's final message, then the JSON.
    let (st, v) = post(s.addr, CHAT, b);
    assert_eq!(st, 200, "{v}");
    let ids = &v["choices"][0]["token_ids"];
    let (_, d) = post(s.addr, "/detokenize", json!({"tokens": ids}));
    let text = d["prompt"].as_str().unwrap();
    assert!(
        text.starts_with("<|channel|>final<|message|>{\"city\": "),
        "{text}"
    );
}
