//! What real clients send (issue #45): each test sends the request a client library
//! sends by default, byte for byte where it matters (header spellings, the fields it adds
//! on its own), and checks the server answers it as OpenAI, Anthropic or vLLM would.

use serde_json::{json, Value};

use crate::harness::*;

#[test]
fn the_bearer_scheme_is_case_insensitive() {
    let s = start(Some("sekret"));
    let body = json!({"model": MODEL, "prompt": "hi", "max_tokens": 2}).to_string();
    for auth in [
        "Bearer sekret",
        "bearer sekret",
        "BEARER sekret",
        "bEaReR  sekret",
    ] {
        let (st, b) = http(
            s.addr,
            "POST",
            "/v1/completions",
            Some(&body),
            &[("Authorization", auth)],
        );
        assert_eq!(st, 200, "{auth}: {b}");
    }
    for auth in ["bearer nope", "Basic sekret", "sekret", "Bearersekret"] {
        let (st, b) = http(
            s.addr,
            "POST",
            "/v1/completions",
            Some(&body),
            &[("Authorization", auth)],
        );
        assert_eq!(st, 401, "{auth}: {b}");
        let v: Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["error"]["code"], "invalid_api_key", "{auth}");
    }
}

#[test]
fn stream_options_without_stream_is_refused_by_name() {
    let s = start(None);
    // The openai client sends `stream_options` as given, and no `stream` for a whole
    // answer; OpenAI answers 400 naming `stream_options`.
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "model": MODEL,
                   "stream_options": {"include_usage": true}}),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "hi", "stream": false,
                   "stream_options": {"include_usage": true}}),
        ),
    ] {
        let (st, v) = post(s.addr, path, body);
        assert_eq!(st, 400, "{path}: {v}");
        assert_eq!(v["error"]["param"], "stream_options", "{path}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("stream"),
            "{v}"
        );
    }
}
