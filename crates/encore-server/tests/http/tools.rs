//! Tool calling and reasoning through the server, on `dummy:tiny` (whose byte-level chat
//! template renders tools and writes calls as Hermes does): `tool_choice` `required` and
//! a named function forced by their grammar, sampled, whole and streamed; `auto` read
//! from each format (the model's text forced by a `choice` constraint, since a random
//! model calls nothing on its own); `none`; a conversation that carries calls and their
//! results back; `<think>` reasoning split out; the bad inputs.

use std::collections::HashSet;
use std::net::SocketAddr;

use encore_server::{ReasoningFormat, ToolFormat};
use serde_json::{json, Value};

use crate::harness::*;

const CHAT: &str = "/v1/chat/completions";

pub(crate) fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object",
                "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                               "unit": {"type": "string", "enum": ["c", "f"]}},
                "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "now", "description": "The time"}},
    ])
}

pub(crate) fn chat(extra: Value) -> Value {
    let mut b = json!({"model": MODEL, "max_tokens": 400, "tools": tools(),
                       "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

/// A call as the client sees it: (id, name, arguments text).
pub(crate) type Call = (String, String, String);

/// What an answer says: content, reasoning, calls, finish reason.
#[derive(Debug, PartialEq)]
pub(crate) struct Answer {
    pub content: Option<String>,
    pub reasoning: Option<String>,
    pub calls: Vec<Call>,
    pub finish: String,
}

impl Answer {
    /// The calls without their ids (which each response draws anew).
    pub fn named_calls(&self) -> Vec<(String, String)> {
        self.calls
            .iter()
            .map(|(_, n, a)| (n.clone(), a.clone()))
            .collect()
    }
}

pub(crate) fn whole(a: SocketAddr, b: &Value) -> Answer {
    let (st, v) = post(a, CHAT, b.clone());
    assert_eq!(st, 200, "{b}: {v}");
    let c = &v["choices"][0];
    let m = &c["message"];
    let calls = m["tool_calls"]
        .as_array()
        .map(|calls| {
            calls
                .iter()
                .map(|t| {
                    assert_eq!(t["type"], "function", "{v}");
                    (
                        t["id"].as_str().unwrap().to_string(),
                        t["function"]["name"].as_str().unwrap().to_string(),
                        t["function"]["arguments"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Answer {
        content: m["content"].as_str().map(String::from),
        reasoning: m["reasoning_content"].as_str().map(String::from),
        calls,
        finish: c["finish_reason"].as_str().unwrap().to_string(),
    }
}

/// The streamed answer, put together as the `openai` client does: a call's first delta
/// has its index, id and name; later ones add to its arguments.
pub(crate) fn streamed(a: SocketAddr, b: &Value) -> Answer {
    let mut b = b.clone();
    b["stream"] = json!(true);
    let raw = post_raw(a, CHAT, &b);
    let events = sse(&raw);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{raw}");
    let (mut content, mut reasoning) = (String::new(), String::new());
    let mut calls: Vec<Call> = Vec::new();
    let mut finish = String::new();
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        let c = &v["choices"][0];
        let d = &c["delta"];
        content.push_str(d["content"].as_str().unwrap_or(""));
        reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
        for t in d["tool_calls"].as_array().into_iter().flatten() {
            let i = t["index"].as_u64().unwrap() as usize;
            if let Some(id) = t["id"].as_str() {
                assert_eq!(i, calls.len(), "{e}");
                assert_eq!(t["type"], "function", "{e}");
                let name = t["function"]["name"].as_str().unwrap().to_string();
                calls.push((id.to_string(), name, String::new()));
            }
            calls[i]
                .2
                .push_str(t["function"]["arguments"].as_str().unwrap_or(""));
        }
        if let Some(f) = c["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    Answer {
        content: (!content.is_empty()).then_some(content),
        reasoning: (!reasoning.is_empty()).then_some(reasoning),
        calls,
        finish,
    }
}

/// `calls` are calls of [`tools`] with arguments their schemas allow, ids unique.
fn check_calls(calls: &[Call]) {
    let ids: HashSet<&str> = calls.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(ids.len(), calls.len(), "{calls:?}");
    for (id, name, args) in calls {
        assert!(id.starts_with("call_"), "{id}");
        let args: Value = serde_json::from_str(args).unwrap_or_else(|e| panic!("{args}: {e}"));
        let args = args.as_object().unwrap();
        match name.as_str() {
            "get_weather" => {
                assert!(["Paris", "Rome"].contains(&args["city"].as_str().unwrap()));
                assert!(args.keys().all(|k| k == "city" || k == "unit"), "{args:?}");
            }
            "now" => {}
            other => panic!("call of unknown function {other}"),
        }
    }
}

#[test]
fn required_and_named_tool_choice_force_calls() {
    let s = start_parsers(None, None);
    for seed in 0..3 {
        for parallel in [true, false] {
            let b = chat(
                json!({"tool_choice": "required", "temperature": 1.0, "seed": seed,
                                "parallel_tool_calls": parallel}),
            );
            let w = whole(s.addr, &b);
            assert_eq!(
                (w.content.as_deref(), w.finish.as_str()),
                (None, "tool_calls"),
                "{w:?}"
            );
            assert!(!w.calls.is_empty());
            if !parallel {
                assert_eq!(w.calls.len(), 1, "{w:?}");
            }
            check_calls(&w.calls);
            let st = streamed(s.addr, &b);
            assert_eq!(st.named_calls(), w.named_calls());
            assert_eq!((st.content, st.finish.as_str()), (None, "tool_calls"));
            check_calls(&st.calls);
        }
        // A named function: its arguments; finish `stop`, as OpenAI answers.
        let b = chat(json!({"temperature": 1.0, "seed": seed,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}));
        let w = whole(s.addr, &b);
        assert_eq!(w.calls.len(), 1, "{w:?}");
        assert_eq!(
            (w.calls[0].1.as_str(), w.finish.as_str()),
            ("get_weather", "stop")
        );
        check_calls(&w.calls);
        assert_eq!(streamed(s.addr, &b).named_calls(), w.named_calls());
    }
}

/// `auto`: the model's own text, read in each format (forced here by a `choice`).
#[test]
fn auto_reads_each_format_whole_and_streamed() {
    let weather = r#"{"city": "Paris"}"#;
    let cases = [
        (
            None, // read from the template: Hermes
            "I will look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
            Some("I will look."),
            vec![("get_weather", weather), ("now", "{}")],
        ),
        (
            Some(ToolFormat::Llama3Json),
            "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
            None,
            vec![("get_weather", weather)],
        ),
        (
            Some(ToolFormat::Mistral),
            "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"now\", \"arguments\": {}}]",
            None,
            vec![("get_weather", weather), ("now", "{}")],
        ),
    ];
    for (format, text, content, want) in cases {
        let s = start_parsers(format, None);
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(n, a)| (n.to_string(), a.to_string()))
            .collect();
        let b = chat(json!({"structured_outputs": {"choice": [text]}}));
        let w = whole(s.addr, &b);
        assert_eq!(w.content.as_deref(), content, "{format:?}: {w:?}");
        assert_eq!(w.named_calls(), want, "{format:?}");
        assert_eq!(w.finish, "tool_calls");
        let st = streamed(s.addr, &b);
        assert_eq!(st.content.as_deref(), content, "{format:?}");
        assert_eq!(st.named_calls(), want, "{format:?}");
        assert_eq!(st.finish, "tool_calls");
        if format == Some(ToolFormat::Mistral) {
            // Mistral's template takes 9 letters and digits back.
            for (id, ..) in &w.calls {
                assert!(id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()));
            }
        }
        // Plain text stays content; `parallel_tool_calls: false` keeps the first call.
        let b = chat(json!({"structured_outputs": {"choice": ["Sunny, I think."]}}));
        let w = whole(s.addr, &b);
        assert_eq!(w.content.as_deref(), Some("Sunny, I think."));
        assert_eq!((w.calls.len(), w.finish.as_str()), (0, "stop"));
        let b =
            chat(json!({"structured_outputs": {"choice": [text]}, "parallel_tool_calls": false}));
        assert_eq!(whole(s.addr, &b).named_calls(), want[..1]);
    }
}

#[test]
fn conversations_carry_calls_and_results_and_none_hides_the_tools() {
    let s = start_parsers(None, None);
    let messages = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"c\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22 C and sunny"},
    ]);
    let (st, v) = post(
        s.addr,
        "/tokenize",
        json!({"messages": messages, "tools": tools()}),
    );
    assert_eq!(st, 200, "{v}");
    let (st, d) = post(s.addr, "/detokenize", json!({"tokens": v["tokens"]}));
    assert_eq!(st, 200, "{d}");
    let text = d["prompt"].as_str().unwrap();
    // The byte template writes the tools, the call (its arguments as JSON, in order) and
    // the result.
    let want = format!(
        "<|system|>\n# Tools\n{}\n{}\n",
        serde_json::to_string(&tools()[0])
            .unwrap()
            .replace(",\"", ", \"")
            .replace("\":", "\": "),
        serde_json::to_string(&tools()[1])
            .unwrap()
            .replace(",\"", ", \"")
            .replace("\":", "\": "),
    );
    assert!(text.starts_with(&want), "{text}");
    assert!(
        text.contains("<|assistant|>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>\n<|tool|>\n22 C and sunny\n<|assistant|>\n"),
        "{text}"
    );
    let b = json!({"model": MODEL, "messages": messages, "tools": tools(), "max_tokens": 4});
    let (st, v) = post(s.addr, CHAT, b);
    assert_eq!(st, 200, "{v}");
    // `none`: the tools are not rendered, and the answer is content.
    let plain = json!({"model": MODEL, "max_tokens": 4, "temperature": 0,
                       "messages": [{"role": "user", "content": "hi"}]});
    let mut none = plain.clone();
    none["tools"] = tools();
    none["tool_choice"] = json!("none");
    let (_, a) = post(s.addr, CHAT, plain);
    let (_, b) = post(s.addr, CHAT, none);
    assert_eq!(a["usage"], b["usage"]);
    assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"]);
}

#[test]
fn reasoning_is_split_out_whole_and_streamed() {
    let s = start_parsers(None, Some(ReasoningFormat::Qwen3));
    let text = "<think>\nThe user wants 2+2.\n</think>\n\nIt is 4.";
    let b = json!({"model": MODEL, "max_tokens": 80,
                   "messages": [{"role": "user", "content": "2+2?"}],
                   "structured_outputs": {"choice": [text]},
                   "chat_template_kwargs": {"enable_thinking": true}});
    for a in [whole(s.addr, &b), streamed(s.addr, &b)] {
        assert_eq!(a.reasoning.as_deref(), Some("The user wants 2+2."));
        assert_eq!(
            (a.content.as_deref(), a.finish.as_str()),
            (Some("It is 4."), "stop")
        );
    }
    // With tools: reasoning, then a call.
    let text = "<think>I need the weather.</think><tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
    let b = chat(json!({"structured_outputs": {"choice": [text]}}));
    for a in [whole(s.addr, &b), streamed(s.addr, &b)] {
        assert_eq!(a.reasoning.as_deref(), Some("I need the weather."));
        assert_eq!(a.named_calls(), [("now".to_string(), "{}".to_string())]);
        assert_eq!((a.content, a.finish.as_str()), (None, "tool_calls"));
    }
}

#[test]
fn bad_tool_requests_are_refused_naming_the_field() {
    let s = start_parsers(None, None);
    let refused = |extra: Value, param: &str, words: &str| {
        let b = chat(extra);
        let (st, v) = post(s.addr, CHAT, b.clone());
        assert_eq!(st, 400, "{b}: {v}");
        assert_eq!(v["error"]["param"], param, "{v}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains(words), "{m}");
    };
    refused(
        json!({"tool_choice": {"type": "function", "function": {"name": "fly"}}}),
        "tool_choice",
        "`fly`, which is not in `tools`",
    );
    refused(
        json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "wizard"}}}],
               "tool_choice": "required"}),
        "tools",
        "",
    );
    refused(
        json!({"tools": [{"type": "function", "function": {"description": "x"}}]}),
        "tools[0].function.name",
        "letters",
    );
    refused(json!({"tools": {}}), "tools", "list");
    refused(
        json!({"tools": null, "tool_choice": "auto"}),
        "tool_choice",
        "needs `tools`",
    );
    refused(
        json!({"chat_template_kwargs": {"tools": []}}),
        "chat_template_kwargs.tools",
        "set by the server",
    );
}
