//! Bad inputs get OpenAI-style errors naming the field (status codes and bodies), bearer
//! auth, models and health, and a full queue's 503.

use std::io::{Read, Write};
use std::net::TcpStream;

use serde_json::{json, Value};

use crate::harness::*;

/// A checker of one bad request to the server at `a`: its status, the error's `param`
/// (when given) and a word of its message.
fn checker(a: std::net::SocketAddr) -> impl Fn(&str, &str, u16, Option<&str>, &str) {
    move |path: &str, body: &str, status: u16, param: Option<&str>, what: &str| {
        let (st, b) = http(a, "POST", path, Some(body), &[]);
        assert_eq!(st, status, "{body}: {b}");
        let v: Value = serde_json::from_str(&b).unwrap_or_else(|_| panic!("{body}: {b}"));
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(what), "{body}: {msg}");
        assert!(v["error"]["type"].is_string());
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{body}");
        }
    }
}

#[test]
fn bad_inputs_get_openai_errors() {
    let s = start(None);
    let check = checker(s.addr);
    check("/v1/completions", "{not json", 400, Some("body"), "JSON");
    check(
        "/v1/completions",
        r#"{"prompt": "x"}"#,
        400,
        Some("model"),
        "required",
    );
    check(
        "/v1/completions",
        r#"{"model": "gpt-4", "prompt": "x"}"#,
        404,
        Some("model"),
        "gpt-4",
    );
    check(
        "/v1/completions",
        r#"{"model": "dummy:tiny"}"#,
        400,
        Some("prompt"),
        "required",
    );
    check(
        "/v1/completions",
        r#"{"model": "dummy:tiny", "prompt": 7}"#,
        400,
        Some("prompt"),
        "string",
    );
    check(
        "/v1/completions",
        r#"{"model": "dummy:tiny", "prompt": "x", "temperature": 5}"#,
        400,
        Some("temperature"),
        "temperature",
    );
    check(
        "/v1/completions",
        r#"{"model": "dummy:tiny", "prompt": "x", "top_p": 0}"#,
        400,
        Some("top_p"),
        "top_p",
    );
    check(
        "/v1/completions",
        r#"{"model": "dummy:tiny", "prompt": "x", "max_tokens": 0}"#,
        400,
        Some("max_tokens"),
        "max_tokens",
    );
    check(
        "/v1/completions",
        r#"{"model": "dummy:tiny", "prompt": "x", "max_tokens": 100000}"#,
        400,
        Some("max_tokens"),
        "max_tokens",
    );
    check(
        "/v1/completions",
        r#"{"model": "dummy:tiny", "prompt": "x", "stream": "yes"}"#,
        400,
        Some("stream"),
        "boolean",
    );
}

#[test]
fn bad_prompts_and_messages_get_openai_errors() {
    let s = start(None);
    let a = s.addr;
    let check = checker(a);
    let long = json!({"model": MODEL, "prompt": "y".repeat(300)}).to_string();
    check("/v1/completions", &long, 400, Some("prompt"), "context");
    // Token ids are checked at the edge: a streamed request gets the 400 too (not a 200
    // and an error event), and an id past u32 is not wrapped into the vocabulary.
    for body in [
        r#"{"model": "dummy:tiny", "prompt": [1, 2, 999999]}"#,
        r#"{"model": "dummy:tiny", "prompt": [1, 2, 999999], "stream": true}"#,
        r#"{"model": "dummy:tiny", "prompt": [4294967297]}"#,
    ] {
        check("/v1/completions", body, 400, Some("prompt"), "vocabulary");
    }
    check(
        "/v1/completions",
        r#"{"model": "dummy:tiny", "prompt": "x", "stop_token_ids": [4294967297]}"#,
        400,
        Some("stop_token_ids"),
        "token ids",
    );
    // Without max_tokens, the default shrinks to the room the context leaves.
    let near = json!({"model": MODEL, "prompt": "y".repeat(250)}).to_string();
    let (st, b) = http(a, "POST", "/v1/completions", Some(&near), &[]);
    assert_eq!(st, 200, "{b}");
    check(
        "/v1/chat/completions",
        r#"{"model": "dummy:tiny", "messages": []}"#,
        400,
        Some("messages"),
        "non-empty",
    );
    check(
        "/v1/chat/completions",
        r#"{"model": "dummy:tiny", "messages": [{"role": "user"}]}"#,
        400,
        Some("messages[0].content"),
        "content",
    );
    // A refusal names the field the body used, and a body that is no object is refused.
    check(
        "/v1/completions",
        r#"{"model": "dummy:tiny", "prompt": "x", "max_completion_tokens": 100000}"#,
        400,
        Some("max_completion_tokens"),
        "max_completion_tokens",
    );
    check(
        "/v1/completions",
        r#"{"model": "dummy:tiny", "prompt": "x", "stream_options": 5}"#,
        400,
        Some("stream_options"),
        "stream_options",
    );
    check(
        "/v1/completions",
        "[1, 2]",
        400,
        Some("body"),
        "JSON object",
    );
    // A body over the limit.
    let big = json!({"model": MODEL, "prompt": "z".repeat(100_000)}).to_string();
    let (st, _) = http(a, "POST", "/v1/completions", Some(&big), &[]);
    assert_eq!(st, 413);
    // The server still serves after all that.
    let (st, _) = post(
        a,
        "/v1/completions",
        json!({"model": MODEL, "prompt": "ok", "max_tokens": 2}),
    );
    assert_eq!(st, 200);
}

#[test]
fn bearer_auth_models_health_metrics() {
    let s = start(Some("sekret"));
    let body = json!({"model": MODEL, "prompt": "hi", "max_tokens": 2}).to_string();
    let (st, b) = http(s.addr, "POST", "/v1/completions", Some(&body), &[]);
    assert_eq!(st, 401, "{b}");
    assert!(b.contains("invalid_api_key"));
    let (st, _) = http(
        s.addr,
        "POST",
        "/v1/completions",
        Some(&body),
        &[("Authorization", "Bearer nope")],
    );
    assert_eq!(st, 401);
    let (st, _) = http(
        s.addr,
        "POST",
        "/v1/completions",
        Some(&body),
        &[("Authorization", "Bearer sekret")],
    );
    assert_eq!(st, 200);
    let (st, m) = http(
        s.addr,
        "GET",
        "/v1/models",
        None,
        &[("Authorization", "Bearer sekret")],
    );
    assert_eq!(st, 200);
    let m: Value = serde_json::from_str(&m).unwrap();
    assert_eq!(m["data"][0]["id"], MODEL);
    // Health and metrics need no key.
    assert_eq!(http(s.addr, "GET", "/health", None, &[]).0, 200);
    let (st, text) = http(s.addr, "GET", "/metrics", None, &[]);
    assert_eq!(st, 200);
    for name in [
        "encore_requests_running",
        "encore_requests_waiting",
        "encore_kv_blocks_used",
        "encore_kv_blocks_total",
        "encore_preemptions_total",
        "encore_graph_replays_total",
        "encore_prefix_cache_hit_ratio",
        "encore_prefix_cache_queries_total",
        "encore_prefix_cache_hits_total",
    ] {
        assert!(text.contains(&format!("# TYPE {name} ")), "{name}: {text}");
    }
    // Every weight resident: the offload gauges are 0.
    for name in [
        "encore_weight_budget_bytes",
        "encore_weights_resident_bytes",
        "encore_weights_streamed_bytes_per_step",
    ] {
        assert!(text.contains(&format!("\n{name} 0\n")), "{name}: {text}");
    }
}

#[test]
fn a_full_queue_answers_503_with_retry_after() {
    // A limit of 0 waiting requests refuses every request: the queue is always "full".
    let s = start_with(None, Some(0));
    let body = json!({"model": MODEL, "prompt": "hi", "max_tokens": 2}).to_string();
    let mut c = TcpStream::connect(s.addr).unwrap();
    write!(
        c,
        "POST /v1/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    c.read_to_string(&mut raw).unwrap();
    assert!(raw.starts_with("HTTP/1.1 503"), "{raw}");
    assert!(raw.to_ascii_lowercase().contains("retry-after: 1"), "{raw}");
    assert!(raw.contains("at capacity"), "{raw}");
    // Without the limit the same request is served.
    let s = start(None);
    let (st, _) = http(s.addr, "POST", "/v1/completions", Some(&body), &[]);
    assert_eq!(st, 200);
}

#[test]
fn sampling_fields_out_of_range_get_400_naming_them() {
    let s = start(None);
    let cases: [(&str, &str, &str); 10] = [
        ("/v1/completions", r#""min_p": 1.5"#, "min_p"),
        (
            "/v1/completions",
            r#""presence_penalty": -2.5"#,
            "presence_penalty",
        ),
        (
            "/v1/completions",
            r#""frequency_penalty": "x""#,
            "frequency_penalty",
        ),
        (
            "/v1/completions",
            r#""repetition_penalty": 0"#,
            "repetition_penalty",
        ),
        ("/v1/completions", r#""logprobs": 21"#, "logprobs"),
        ("/v1/completions", r#""logprobs": true"#, "logprobs"),
        ("/v1/chat/completions", r#""logprobs": 3"#, "logprobs"),
        (
            "/v1/chat/completions",
            r#""logprobs": true, "top_logprobs": 21"#,
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            r#""top_logprobs": 2"#,
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            r#""repetition_penalty": -1"#,
            "repetition_penalty",
        ),
    ];
    for (path, extra, param) in cases {
        let input = if path.ends_with("chat/completions") {
            r#""messages": [{"role": "user", "content": "hi"}]"#
        } else {
            r#""prompt": "hi""#
        };
        let body = format!(r#"{{"model": "dummy:tiny", {input}, {extra}}}"#);
        let (st, b) = http(s.addr, "POST", path, Some(&body), &[]);
        assert_eq!(st, 400, "{body}: {b}");
        let v: Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["error"]["param"], param, "{body}: {b}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(param),
            "{b}"
        );
    }
}
