//! No field is silently ignored: the fields the server does not support (yet) and the
//! ones it does not know get a 400 naming them, the ones it only logs are accepted, chat
//! content given as text parts reads as the plain string, and vLLM's `/tokenize` and
//! `/detokenize`.

use serde_json::{json, Value};

use crate::harness::*;

const COMPLETIONS: &str = "/v1/completions";
const CHAT: &str = "/v1/chat/completions";

/// A valid small body of the endpoint at `path` with `extra` fields set.
fn body(path: &str, extra: Value) -> Value {
    let mut b = if path == CHAT {
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    } else {
        json!({"model": MODEL, "prompt": "hi", "max_tokens": 2})
    };
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

/// POSTs `b` to `path` and checks a 400 whose `param` is `param` and whose message names
/// `words`.
fn refused(a: std::net::SocketAddr, path: &str, b: Value, param: &str, words: &str) {
    let (st, v) = post(a, path, b.clone());
    assert_eq!(st, 400, "{path} {b}: {v}");
    assert_eq!(v["error"]["param"], param, "{path} {b}: {v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains(words), "{path} {b}: {msg}");
}

#[test]
fn unsupported_and_unknown_fields_are_refused_naming_them() {
    let s = start(None);
    let both = [COMPLETIONS, CHAT];
    let cases: &[(&[&str], Value, &str)] = &[
        (&both, json!({"n": 0}), "integer in [1, 64]"),
        (&both, json!({"n": 65}), "integer in [1, 64]"),
        (&both, json!({"logit_bias": {"abc": 10}}), "not a token id"),
        (&both, json!({"logit_bias": {"5": 101}}), "[-100, 100]"),
        (
            &both,
            json!({"logit_bias": {"99999": 1}}),
            "outside the vocabulary",
        ),
        (&[CHAT], json!({"echo": true}), "not supported on chat"),
        (&[COMPLETIONS], json!({"best_of": 2}), "use `n`"),
        (
            &[COMPLETIONS],
            json!({"suffix": "end"}),
            "not supported yet",
        ),
        (
            &[CHAT],
            json!({"functions": [{"name": "f"}]}),
            "use `tools`",
        ),
        (
            &[CHAT],
            json!({"function_call": "auto"}),
            "use `tool_choice`",
        ),
        (&[CHAT], json!({"audio": {"voice": "alloy"}}), "text"),
        (&[CHAT], json!({"modalities": ["text", "audio"]}), "text"),
        (
            &[CHAT],
            json!({"prediction": {"type": "content"}}),
            "not supported yet",
        ),
        (
            &[CHAT],
            json!({"reasoning_effort": "low"}),
            // Read by harmony (gpt-oss) and templates that read it; not by this one.
            "not supported for this model",
        ),
        (&[CHAT], json!({"web_search_options": {}}), "web"),
        (&[CHAT], json!({"store": true}), "stores nothing"),
        (&[CHAT], json!({"metadata": "x"}), "object"),
        (&both, json!({"user": 5}), "string"),
        (
            &both,
            json!({"temprature": 0}),
            "unknown field `temprature`",
        ),
        // A field of the other endpoint is unknown here.
        (&[COMPLETIONS], json!({"tools": []}), "unknown field"),
        (&[CHAT], json!({"suffix": ""}), "unknown field"),
        (
            &both,
            json!({"stream": true, "stream_options": {"include_usage": true, "x": 1}}),
            "unknown field `stream_options.x`",
        ),
    ];
    for (paths, extra, words) in cases {
        let k = extra.as_object().unwrap().keys().next_back().unwrap();
        let param = match k.as_str() {
            "stream_options" => "stream_options.x",
            k => k,
        };
        for path in *paths {
            refused(s.addr, path, body(path, extra.clone()), param, words);
        }
    }
}

#[test]
fn no_op_values_and_logged_fields_are_accepted() {
    let s = start(None);
    let both = json!({"n": 1, "logit_bias": {}, "echo": false, "user": "u-1",
                      "response_format": {"type": "text"}, "guided_json": null});
    let chat = json!({"metadata": {"team": "a"}, "store": false, "service_tier": "auto",
                      "tools": [], "tool_choice": "none", "modalities": ["text"],
                      "safety_identifier": "s", "prompt_cache_key": "k", "chat_template_kwargs": {}});
    let completions = json!({"best_of": 1, "suffix": ""});
    for (path, extra) in [
        (COMPLETIONS, &both),
        (COMPLETIONS, &completions),
        (CHAT, &both),
        (CHAT, &chat),
    ] {
        let (st, v) = post(s.addr, path, body(path, extra.clone()));
        assert_eq!(st, 200, "{path} {extra}: {v}");
    }
}

#[test]
fn content_parts_read_as_the_plain_string_and_roles_are_checked() {
    let s = start(None);
    let greedy = |messages: Value| {
        let (st, v) = post(
            s.addr,
            CHAT,
            json!({"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0,
                   "ignore_eos": true}),
        );
        assert_eq!(st, 200, "{v}");
        (
            v["choices"][0]["message"]["content"].clone(),
            v["usage"].clone(),
        )
    };
    let plain = greedy(json!([{"role": "system", "content": "be brief"},
                              {"role": "user", "content": "hello there"}]));
    let parts = greedy(json!([
        {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": " there"}]},
    ]));
    assert_eq!(parts, plain);
    let user = |m: Value| body(CHAT, json!({ "messages": [m] }));
    refused(
        s.addr,
        CHAT,
        user(json!({"role": "wizard", "content": "x"})),
        "messages[0].role",
        "wizard",
    );
    refused(
        s.addr,
        CHAT,
        user(json!({"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        ]})),
        "messages[0].content[1].type",
        "content part type `image_url` is not supported",
    );
    refused(
        s.addr,
        CHAT,
        user(json!({"role": "tool", "content": "42"})),
        "messages[0].tool_call_id",
        "required",
    );
    refused(
        s.addr,
        CHAT,
        user(json!({"role": "user", "content": "x", "name": 5})),
        "messages[0].name",
        "string",
    );
}

#[test]
fn tokenize_and_detokenize() {
    let s = start(None);
    let a = s.addr;
    let (st, m) = http(a, "GET", "/v1/models", None, &[]);
    assert_eq!(st, 200);
    let max_len = serde_json::from_str::<Value>(&m).unwrap()["data"][0]["max_model_len"].clone();
    // A prompt: the byte tokenizer puts BOS (256) first unless asked not to.
    let (st, v) = post(a, "/tokenize", json!({"model": MODEL, "prompt": "hi"}));
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v,
        json!({"count": 3, "max_model_len": max_len, "tokens": [256, 104, 105]})
    );
    let text = "héllo, wörld";
    let (_, v) = post(
        a,
        "/tokenize",
        json!({"prompt": text, "add_special_tokens": false}),
    );
    let (st, back) = post(
        a,
        "/detokenize",
        json!({"model": MODEL, "tokens": v["tokens"]}),
    );
    assert_eq!(st, 200, "{back}");
    assert_eq!(back, json!({ "prompt": text }));
    let (_, bos) = post(a, "/detokenize", json!({"tokens": [256, 104, 105]}));
    assert_eq!(bos["prompt"], "<|bos|>hi");
    // Messages: the chat template's prompt, as chat completions count it.
    let messages = json!([{"role": "user", "content": [{"type": "text", "text": "hello"}]}]);
    let (st, v) = post(a, "/tokenize", json!({ "messages": messages }));
    assert_eq!(st, 200, "{v}");
    let (_, chat) = post(a, CHAT, body(CHAT, json!({ "messages": messages })));
    assert_eq!(v["count"], chat["usage"]["prompt_tokens"], "{v} {chat}");
    let (_, without) = post(
        a,
        "/tokenize",
        json!({"messages": messages, "add_generation_prompt": false}),
    );
    assert!(without["count"].as_u64() < v["count"].as_u64(), "{without}");
    // Errors name the field.
    refused(
        a,
        "/detokenize",
        json!({"tokens": [104, 258]}),
        "tokens",
        "vocabulary",
    );
    refused(
        a,
        "/detokenize",
        json!({"tokens": "hi"}),
        "tokens",
        "token ids",
    );
    refused(
        a,
        "/detokenize",
        json!({"text": "hi", "tokens": []}),
        "text",
        "unknown field",
    );
    refused(a, "/tokenize", json!({}), "prompt", "required");
    refused(
        a,
        "/tokenize",
        json!({"prompt": "x", "messages": []}),
        "messages",
        "not both",
    );
    refused(
        a,
        "/tokenize",
        json!({"messages": [{"role": "wizard", "content": "x"}]}),
        "messages[0].role",
        "wizard",
    );
    refused(
        a,
        "/tokenize",
        json!({"prompt": "x", "return_token_strs": true}),
        "return_token_strs",
        "not supported yet",
    );
    let (st, v) = post(a, "/tokenize", json!({"model": "gpt-4", "prompt": "x"}));
    assert_eq!((st, &v["error"]["param"]), (404, &json!("model")), "{v}");
}

#[test]
fn tokenize_needs_the_api_key_too() {
    let s = start(Some("sekret"));
    let b = json!({"prompt": "hi"}).to_string();
    assert_eq!(http(s.addr, "POST", "/tokenize", Some(&b), &[]).0, 401);
    let (st, _) = http(
        s.addr,
        "POST",
        "/tokenize",
        Some(&b),
        &[("Authorization", "Bearer sekret")],
    );
    assert_eq!(st, 200);
}

/// Structured outputs: each spelling constrains the output (JSON that parses and follows
/// the schema; a regex; a choice), greedy and sampled, whole and streamed; a bad
/// schema, regex or shape is a 400 naming the field before anything is queued.
#[test]
fn structured_outputs_constrain_the_text() {
    let s = start(None);
    let schema = json!({"type": "object",
        "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99},
                       "tag": {"enum": ["x", "y"]}},
        "required": ["id", "tag"], "additionalProperties": false});
    let check_json = |text: &str| {
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert!((0..=99).contains(&v["id"].as_i64().unwrap()), "{text}");
        assert!(v["tag"] == "x" || v["tag"] == "y", "{text}");
        assert_eq!(v.as_object().unwrap().len(), 2, "{text}");
    };
    let rf = json!({"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": true}});
    for path in [COMPLETIONS, CHAT] {
        for (extra, seed) in [
            (json!({"response_format": rf}), 0),
            (
                json!({"structured_outputs": {"json": schema}, "temperature": 1.0}),
                1,
            ),
            (
                json!({"guided_json": schema.to_string(), "temperature": 1.0}),
                2,
            ),
        ] {
            let mut b = body(path, extra);
            b["max_tokens"] = json!(60);
            b["seed"] = json!(seed);
            let (st, v) = post(s.addr, path, b.clone());
            assert_eq!(st, 200, "{b}: {v}");
            let c = &v["choices"][0];
            let text = if path == CHAT {
                &c["message"]["content"]
            } else {
                &c["text"]
            };
            check_json(text.as_str().unwrap());
            assert_eq!(c["finish_reason"], "stop", "{v}");
            // Streamed: the same text.
            b["stream"] = json!(true);
            let streamed = stream_text(s.addr, path, b);
            assert_eq!(streamed, text.as_str().unwrap());
        }
        for (extra, ok) in [
            (
                json!({"structured_outputs": {"regex": "[a-c]{2}-[0-9]"}, "temperature": 1.0}),
                Box::new(|t: &str| {
                    let b = t.as_bytes();
                    b.len() == 4
                        && b[..2].iter().all(|c| (b'a'..=b'c').contains(c))
                        && b[2] == b'-'
                        && b[3].is_ascii_digit()
                }) as Box<dyn Fn(&str) -> bool>,
            ),
            (
                json!({"guided_choice": ["red", "green"], "temperature": 1.0}),
                Box::new(|t: &str| t == "red" || t == "green"),
            ),
            (
                json!({"response_format": {"type": "json_object"}}),
                Box::new(|t: &str| serde_json::from_str::<Value>(t).is_ok_and(|v| v.is_object())),
            ),
        ] {
            let mut b = body(path, extra);
            b["max_tokens"] = json!(60);
            let (st, v) = post(s.addr, path, b.clone());
            assert_eq!(st, 200, "{b}: {v}");
            let c = &v["choices"][0];
            let text = if path == CHAT {
                &c["message"]["content"]
            } else {
                &c["text"]
            };
            let t = text.as_str().unwrap();
            if c["finish_reason"] == "stop" {
                assert!(ok(t), "{b}: {t:?}");
            }
        }
        for (extra, param, words) in [
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "wizard"}}}}),
                "response_format",
                "wizard",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
                "response_format.json_schema",
                "schema",
            ),
            (
                json!({"response_format": {"type": "xml"}}),
                "response_format.type",
                "xml",
            ),
            (
                json!({"structured_outputs": {"regex": "(open"}}),
                "structured_outputs",
                "invalid",
            ),
            (
                json!({"structured_outputs": {"regex": "a", "choice": ["b"]}}),
                "structured_outputs",
                "one of",
            ),
            (
                json!({"structured_outputs": {"whitespace_pattern": " "}}),
                "structured_outputs.whitespace_pattern",
                "unknown",
            ),
            (json!({"guided_choice": []}), "guided_choice", "non-empty"),
            (
                json!({"guided_json": {"type": "object"}, "guided_regex": "a"}),
                "guided_regex",
                "one structured-output field",
            ),
        ] {
            refused(s.addr, path, body(path, extra), param, words);
        }
    }
}

/// The text of a streamed response of either endpoint.
fn stream_text(a: std::net::SocketAddr, path: &str, b: Value) -> String {
    let raw = post_raw(a, path, &b);
    let mut text = String::new();
    for e in sse(&raw) {
        if e == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(&e).unwrap();
        if let Some(c) = v["choices"].get(0) {
            let piece = if path == CHAT {
                &c["delta"]["content"]
            } else {
                &c["text"]
            };
            text.push_str(piece.as_str().unwrap_or(""));
        }
    }
    text
}
