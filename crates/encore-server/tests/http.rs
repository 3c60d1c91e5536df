//! The OpenAI-compatible server over a real engine loop (CPU backend, `dummy:tiny`) and a
//! real HTTP listener on loopback, driven by a minimal HTTP/1.1 client: completions and
//! chat, whole and streamed (with the usage chunk), greedy output equal to `generate`,
//! 64 concurrent streaming clients, stop strings, a client leaving mid-stream frees its KV
//! blocks, the bad inputs' status codes and error bodies, bearer auth, models, health and
//! metrics.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use encore_core::engine::{EngineConfig, KvSizing};
use encore_core::progress::NoProgress;
use encore_core::scheduler::SchedulerConfig;
use encore_core::serve::EngineHandle;
use encore_core::DType;
use encore_server::ServerConfig;
use serde_json::{json, Value};

const MODEL: &str = "dummy:tiny";

fn engine_config() -> EngineConfig {
    EngineConfig::new(DType::F32, 16, 256, 32, 256, KvSizing::Blocks(1 + 32 * 16))
}

/// A server on an ephemeral loopback port; the runtime lives as long as the returned
/// value.
struct Server {
    addr: SocketAddr,
    engine: Arc<EngineHandle>,
    _rt: tokio::runtime::Runtime,
}

fn start(api_key: Option<&str>) -> Server {
    start_with(api_key, None)
}

fn start_with(api_key: Option<&str>, max_waiting: Option<usize>) -> Server {
    start_full(
        api_key,
        max_waiting,
        engine_config(),
        std::future::pending(),
        Duration::ZERO,
    )
    .0
}

/// A server over an engine of `cfg` that shuts down when `shutdown` resolves, with a grace
/// period of `grace`; the receiver gets `serve`'s result when it returns.
fn start_full(
    api_key: Option<&str>,
    max_waiting: Option<usize>,
    cfg: EngineConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> (Server, std::sync::mpsc::Receiver<std::io::Result<()>>) {
    let engine = Arc::new(
        EngineHandle::start(
            Arc::new(encore_core::backend::cpu::CpuBackend::new()),
            MODEL.into(),
            cfg,
            SchedulerConfig::new(128, 32),
            Box::new(NoProgress),
        )
        .unwrap(),
    );
    let files = encore_core::model::open_model(MODEL).unwrap();
    let tokenizer = Arc::new(encore_core::model::open_tokenizer(&files.source).unwrap());
    let app = encore_server::app(
        Arc::clone(&engine),
        tokenizer,
        ServerConfig {
            served_model_name: MODEL.into(),
            api_key: api_key.map(String::from),
            max_body_bytes: 64 * 1024,
            default_max_tokens: 16,
            max_waiting,
        },
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    rt.spawn(async move {
        let r = encore_server::serve(listener, app, shutdown, grace).await;
        let _ = done_tx.send(r);
    });
    (
        Server {
            addr,
            engine,
            _rt: rt,
        },
        done_rx,
    )
}

/// One request; returns (status, body with chunked encoding undone).
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body.unwrap_or(""));
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    (status, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

fn post(addr: SocketAddr, path: &str, body: Value) -> (u16, Value) {
    let (st, b) = http(addr, "POST", path, Some(&body.to_string()), &[]);
    (st, serde_json::from_str(&b).unwrap_or(json!({ "raw": b })))
}

/// The `data:` payloads of an SSE body.
fn sse(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: ").map(String::from))
        .collect()
}

fn greedy_ids_from_generate(prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    use encore_core::generate::{generate, GenerateOptions};
    let be = encore_core::backend::cpu::CpuBackend::new();
    let files = encore_core::model::open_model(MODEL).unwrap();
    let engine =
        encore_core::engine::Engine::new(&be, files, &engine_config(), &NoProgress).unwrap();
    let mut runner = engine.runner;
    let opts = GenerateOptions {
        max_tokens,
        sampling: Default::default(),
        ignore_eos: true,
    };
    let g = generate(
        &mut runner,
        &[prompt.to_vec()],
        &[],
        &opts,
        &NoProgress,
        |_, _| std::ops::ControlFlow::Continue(()),
    )
    .unwrap();
    g[0].output_ids.clone()
}

#[test]
fn completions_whole_and_streamed_match_generate() {
    let s = start(None);
    let (st, v) = post(
        s.addr,
        "/v1/completions",
        json!({"model": MODEL, "prompt": [5, 6, 7, 8, 9], "max_tokens": 12, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(st, 200, "{v}");
    let ids: Vec<u32> = serde_json::from_value(v["choices"][0]["token_ids"].clone()).unwrap();
    assert_eq!(ids, greedy_ids_from_generate(&[5, 6, 7, 8, 9], 12));
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17})
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["object"], "text_completion");
    // Streamed: the text pieces concatenate to the whole text; usage last, then [DONE].
    let whole = v["choices"][0]["text"].as_str().unwrap().to_string();
    let body = json!({"model": MODEL, "prompt": [5, 6, 7, 8, 9], "max_tokens": 12, "temperature": 0,
                      "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}});
    let (st, raw) = http(
        s.addr,
        "POST",
        "/v1/completions",
        Some(&body.to_string()),
        &[],
    );
    assert_eq!(st, 200);
    let events = sse(&raw);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let usage = chunks.last().unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 12);
    assert_eq!(usage["choices"], json!([]));
    let text: String = chunks[..chunks.len() - 1]
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, whole);
    assert_eq!(
        chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
        "length"
    );
}

#[test]
fn chat_completions_whole_and_streamed() {
    let s = start(None);
    let req = json!({"model": MODEL, "messages": [{"role": "user", "content": "hello there"}],
                     "max_tokens": 6, "temperature": 0, "ignore_eos": true});
    let (st, v) = post(s.addr, "/v1/chat/completions", req.clone());
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["usage"]["completion_tokens"], 6);
    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    let (st, raw) = http(
        s.addr,
        "POST",
        "/v1/chat/completions",
        Some(&streamed.to_string()),
        &[],
    );
    assert_eq!(st, 200);
    let events = sse(&raw);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let text: String = events[..events.len() - 1]
        .iter()
        .map(|e| {
            let v: Value = serde_json::from_str(e).unwrap();
            v["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(
        text,
        v["choices"][0]["message"]["content"].as_str().unwrap()
    );
}

#[test]
fn concurrent_streaming_clients_all_complete() {
    let s = start(None);
    let addr = s.addr;
    let clients: Vec<_> = (0..64)
        .map(|i| {
            std::thread::spawn(move || {
                let n = 4 + i % 9;
                let body = json!({"model": MODEL, "prompt": format!("client {i} says hello"),
                                  "max_tokens": n, "ignore_eos": true, "seed": i, "stream": true,
                                  "stream_options": {"include_usage": true}});
                let (st, raw) = http(
                    addr,
                    "POST",
                    "/v1/completions",
                    Some(&body.to_string()),
                    &[],
                );
                assert_eq!(st, 200);
                let events = sse(&raw);
                let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
                assert_eq!(usage["usage"]["completion_tokens"], n, "client {i}");
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let (st, m) = http(addr, "GET", "/metrics", None, &[]);
    assert_eq!(st, 200);
    assert!(m.contains("encore_requests_finished_total 64"), "{m}");
    assert!(m.contains("encore_kv_blocks_used 0"), "{m}");
    // 64 prompts looked up; no lookup before them, so the ratio is theirs.
    let hits = s
        .engine
        .metrics
        .prefix_cache_hits_total
        .load(std::sync::atomic::Ordering::Relaxed);
    let queries = s
        .engine
        .metrics
        .prefix_cache_queries_total
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(queries > 0, "{m}");
    assert!(
        m.contains(&format!(
            "encore_prefix_cache_hit_ratio {}\n",
            hits as f64 / queries as f64
        )),
        "{m}"
    );
}

#[test]
fn a_client_leaving_mid_stream_frees_its_blocks() {
    let s = start(None);
    let body = json!({"model": MODEL, "prompt": "a long story", "max_tokens": 200, "ignore_eos": true, "stream": true});
    let mut c = TcpStream::connect(s.addr).unwrap();
    let b = body.to_string();
    write!(
        c,
        "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
        b.len()
    )
    .unwrap();
    let mut r = BufReader::new(c.try_clone().unwrap());
    let mut seen = 0;
    let mut line = String::new();
    while seen < 3 {
        line.clear();
        r.read_line(&mut line).unwrap();
        if line.starts_with("data: ") {
            seen += 1;
        }
    }
    drop(r);
    drop(c);
    let m = &s.engine.metrics;
    let t = Instant::now();
    while m
        .requests_aborted_total
        .load(std::sync::atomic::Ordering::Relaxed)
        == 0
    {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no abort after the client left"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let (_, text) = http(s.addr, "GET", "/metrics", None, &[]);
    assert!(text.contains("encore_kv_blocks_used 0"), "{text}");
    assert!(text.contains("encore_requests_aborted_total 1"), "{text}");
}

#[test]
fn bad_inputs_get_openai_errors() {
    let s = start(None);
    let a = s.addr;
    let check = |path: &str, body: &str, status: u16, param: Option<&str>, what: &str| {
        let (st, b) = http(a, "POST", path, Some(body), &[]);
        assert_eq!(st, status, "{body}: {b}");
        let v: Value = serde_json::from_str(&b).unwrap_or_else(|_| panic!("{body}: {b}"));
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(what), "{body}: {msg}");
        assert!(v["error"]["type"].is_string());
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{body}");
        }
    };
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
        Some("messages"),
        "content",
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
fn a_served_model_under_a_weight_budget_answers_as_resident_and_reports_its_budget() {
    use encore_core::offload::{OffloadConfig, Policy, WeightBudget};
    let body = json!({"model": MODEL, "prompt": "hello there", "max_tokens": 8,
        "temperature": 0})
    .to_string();
    let text = |cfg: EngineConfig| {
        let (s, _) = start_full(None, None, cfg, std::future::pending(), Duration::ZERO);
        let (st, out) = http(s.addr, "POST", "/v1/completions", Some(&body), &[]);
        assert_eq!(st, 200, "{out}");
        let out: Value = serde_json::from_str(&out).unwrap();
        let (_, metrics) = http(s.addr, "GET", "/metrics", None, &[]);
        (
            out["choices"][0]["text"].as_str().unwrap().to_string(),
            metrics,
        )
    };
    let (want, _) = text(engine_config());
    let (got, metrics) = text(EngineConfig {
        offload: Some(OffloadConfig {
            budget: WeightBudget::Percent(50.0),
            policy: Policy::Planned,
        }),
        ..engine_config()
    });
    assert_eq!(got, want);
    let gauge = |name: &str| -> u64 {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name}: {metrics}"));
        line[name.len() + 1..].parse().unwrap()
    };
    let total = encore_core::model::open_model(MODEL)
        .unwrap()
        .config
        .weight_bytes(DType::F32) as u64;
    assert_eq!(gauge("encore_weight_budget_bytes"), total / 2);
    let resident = gauge("encore_weights_resident_bytes");
    assert!(resident > 0 && resident < total / 2, "{metrics}");
    assert!(
        gauge("encore_weights_streamed_bytes_per_step") > 0,
        "{metrics}"
    );
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

/// The text of a streamed completion's chunks and the last finish reason.
fn streamed_text(raw: &str) -> (String, Value) {
    let events = sse(raw);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{raw}");
    let mut text = String::new();
    let mut finish = Value::Null;
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        if let Some(c) = v["choices"].get(0) {
            text.push_str(c["text"].as_str().unwrap_or(""));
            if !c["finish_reason"].is_null() {
                finish = c["finish_reason"].clone();
            }
        }
    }
    (text, finish)
}

/// Waits until no KV block is held (an aborted request frees its blocks within a step).
fn wait_for_no_kv_blocks(s: &Server) {
    let t = Instant::now();
    while s
        .engine
        .metrics
        .kv_blocks_used
        .load(std::sync::atomic::Ordering::Relaxed)
        != 0
    {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "KV blocks still held"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn stop_strings_end_the_text_before_them_whole_and_streamed() {
    let s = start(None);
    let req = |extra: Value| {
        let mut b = json!({"model": MODEL, "prompt": "stop strings, please", "max_tokens": 40,
                           "temperature": 0, "ignore_eos": true});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let (st, v) = post(s.addr, "/v1/completions", req(json!({})));
    assert_eq!(st, 200, "{v}");
    let full = v["choices"][0]["text"].as_str().unwrap().to_string();
    // A stop string that occurs in the greedy text: the two characters (no replacement
    // character, so real text) whose first occurrence is latest, so text precedes it.
    let chars: Vec<char> = full.chars().collect();
    let (at, stop) = chars
        .windows(2)
        .map(|w| w.iter().collect::<String>())
        .filter(|w| !w.contains('\u{FFFD}'))
        .map(|w| (full.find(&w).unwrap(), w))
        .max()
        .unwrap_or_else(|| panic!("no usable stop string in {full:?}"));
    assert!(at > 0, "{full:?}");
    let expected = &full[..at];
    let total_tokens = v["usage"]["completion_tokens"].as_u64().unwrap();

    for stop_field in [json!(stop), json!(["never-in-the-output", stop])] {
        // Whole: the text before the stop, finish "stop", fewer tokens than without it.
        let (st, v) = post(s.addr, "/v1/completions", req(json!({"stop": stop_field})));
        assert_eq!(st, 200, "{v}");
        assert_eq!(
            v["choices"][0]["text"], expected,
            "stop {stop:?} in {full:?}"
        );
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        let n = v["usage"]["completion_tokens"].as_u64().unwrap();
        assert!(
            n < total_tokens,
            "{n} tokens: the request did not end at the stop"
        );
        // Streamed: the pieces concatenate to the same text, the last says "stop", and
        // the usage chunk counts the tokens generated until the stop.
        let body = req(json!({"stop": stop_field, "stream": true,
                              "stream_options": {"include_usage": true}}));
        let (st, raw) = http(
            s.addr,
            "POST",
            "/v1/completions",
            Some(&body.to_string()),
            &[],
        );
        assert_eq!(st, 200);
        let (text, finish) = streamed_text(&raw);
        assert_eq!(text, expected);
        assert_eq!(finish, "stop");
        let events = sse(&raw);
        let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
        assert_eq!(usage["usage"]["completion_tokens"], n);
    }
    // Chat takes the same field.
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 3, "stop": ["a", "b"]});
    assert_eq!(post(s.addr, "/v1/chat/completions", chat).0, 200);
    // Requests ended by a stop string ended in the engine as finished, not aborted: no
    // block stays held.
    wait_for_no_kv_blocks(&s);
    let aborted = s
        .engine
        .metrics
        .requests_aborted_total
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(aborted, 0, "stop-string ends count as finished");
    // Bad values name `stop`.
    for bad in [
        json!(""),
        json!(["a", ""]),
        json!(["a", "b", "c", "d", "e"]),
        json!(7),
        json!([1]),
        json!({"x": "y"}),
    ] {
        let (st, v) = post(s.addr, "/v1/completions", req(json!({"stop": bad})));
        assert_eq!(st, 400, "stop {bad}: {v}");
        assert_eq!(v["error"]["param"], "stop", "stop {bad}: {v}");
    }
}

/// A streaming request on its own connection, read on a thread after its first event:
/// returns the thread's answer (the SSE payloads) once the first event has arrived.
fn open_stream(addr: SocketAddr, body: Value) -> std::thread::JoinHandle<Vec<String>> {
    let (first_tx, first_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let b = body.to_string();
        write!(
            c,
            "POST /v1/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        )
        .unwrap();
        let mut r = BufReader::new(c);
        let mut events = Vec::new();
        let mut line = String::new();
        while r.read_line(&mut line).unwrap() > 0 {
            if let Some(d) = line.trim_end().strip_prefix("data: ") {
                if events.is_empty() {
                    first_tx.send(()).unwrap();
                }
                events.push(d.to_string());
            }
            line.clear();
        }
        events
    });
    first_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("no first event");
    reader
}

/// An engine with room for long requests.
fn long_engine_config() -> EngineConfig {
    EngineConfig::new(DType::F32, 16, 256, 32, 2048, KvSizing::Blocks(1 + 8 * 128))
}

#[test]
fn shutdown_lets_requests_in_flight_finish_and_refuses_new_connections() {
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let (s, done) = start_full(
        None,
        None,
        long_engine_config(),
        async move {
            let _ = go_rx.await;
        },
        Duration::from_secs(120),
    );
    let n = 1000;
    let streams: Vec<_> = (0..3)
        .map(|i| {
            open_stream(
                s.addr,
                json!({"model": MODEL, "prompt": format!("long story {i}"), "max_tokens": n,
                       "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}}),
            )
        })
        .collect();
    let running = s
        .engine
        .metrics
        .requests_running
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(running > 0, "the requests ended before the shutdown");
    go_tx.send(()).unwrap();
    // The listener closes: a new connection is refused.
    let t = Instant::now();
    while TcpStream::connect(s.addr).is_ok() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "still accepting after shutdown"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Every stream still ends with all its tokens, then the server returns.
    for (i, h) in streams.into_iter().enumerate() {
        let events = h.join().unwrap();
        assert_eq!(events.last().unwrap(), "[DONE]", "stream {i}");
        let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
        assert_eq!(usage["usage"]["completion_tokens"], n, "stream {i}");
    }
    done.recv_timeout(Duration::from_secs(30))
        .expect("serve did not return")
        .unwrap();
}

#[test]
fn shutdown_past_the_grace_period_cuts_requests_off() {
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let (s, done) = start_full(
        None,
        None,
        long_engine_config(),
        async move {
            let _ = go_rx.await;
        },
        Duration::ZERO,
    );
    let n = 2000;
    let body = move |stream: bool| {
        json!({"model": MODEL, "prompt": "a very long story", "max_tokens": n,
               "ignore_eos": true, "stream": stream})
    };
    let streams: Vec<_> = (0..2).map(|_| open_stream(s.addr, body(true))).collect();
    let addr = s.addr;
    let whole = std::thread::spawn(move || post(addr, "/v1/completions", body(false)));
    // Wait until the whole request runs in the engine (3 running).
    let t = Instant::now();
    while s
        .engine
        .metrics
        .requests_running
        .load(std::sync::atomic::Ordering::Relaxed)
        < 3
    {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "requests not running"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    go_tx.send(()).unwrap();
    for (i, h) in streams.into_iter().enumerate() {
        let events = h.join().unwrap();
        assert_eq!(events.last().unwrap(), "[DONE]", "stream {i}");
        let err: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
        assert!(
            err["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("shutting down")),
            "stream {i}: {err}"
        );
        // Fewer than all the tokens came.
        assert!(events.len() < n + 2, "stream {i} was not cut off");
    }
    let (st, v) = whole.join().unwrap();
    assert_eq!(st, 503, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("shutting down"));
    done.recv_timeout(Duration::from_secs(30))
        .expect("serve did not return")
        .unwrap();
    // The engine aborted them: their KV blocks are free.
    wait_for_no_kv_blocks(&s);
    let aborted = s
        .engine
        .metrics
        .requests_aborted_total
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(aborted, 3);
}

/// The value of a metrics line `name value`.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[test]
fn latency_histograms_and_graph_replays_in_metrics() {
    let s = start(None);
    // Two streamed requests of 5 and 7 tokens: 2 first tokens, 4 + 6 gaps between tokens.
    for n in [5, 7] {
        let body = json!({"model": MODEL, "prompt": "timing", "max_tokens": n, "ignore_eos": true,
                          "stream": true});
        let (st, raw) = http(
            s.addr,
            "POST",
            "/v1/completions",
            Some(&body.to_string()),
            &[],
        );
        assert_eq!(st, 200);
        assert_eq!(streamed_text(&raw).1, "length");
    }
    let (st, text) = http(s.addr, "GET", "/metrics", None, &[]);
    assert_eq!(st, 200);
    for (name, count) in [
        ("encore_time_to_first_token_seconds", 2.0),
        ("encore_inter_token_latency_seconds", 10.0),
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} histogram\n")),
            "{text}"
        );
        assert_eq!(metric(&text, &format!("{name}_count")), count, "{name}");
        assert_eq!(
            metric(&text, &format!("{name}_bucket{{le=\"+Inf\"}}")),
            count,
            "{name}"
        );
        assert!(metric(&text, &format!("{name}_sum")) > 0.0, "{name}");
        // Cumulative buckets, non-decreasing, with vLLM-like bounds.
        let buckets: Vec<f64> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{name}_bucket{{le=")))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert!(buckets.len() > 10, "{name}: {buckets:?}");
        assert!(
            buckets.windows(2).all(|w| w[0] <= w[1]),
            "{name}: {buckets:?}"
        );
        assert!(
            text.contains(&format!("{name}_bucket{{le=\"0.01\"}}")),
            "{text}"
        );
    }
    assert!(
        text.contains("encore_graph_replays_total{phase=\"decode\"} "),
        "{text}"
    );
    assert!(
        text.contains("encore_graph_replays_total{phase=\"mixed\"} "),
        "{text}"
    );
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

#[test]
fn logprobs_come_back_in_the_openai_shapes() {
    let s = start(None);
    // Completions, greedy: the sampled token is the most likely one.
    let (st, v) = post(
        s.addr,
        "/v1/completions",
        json!({"model": MODEL, "prompt": "Hello", "max_tokens": 6, "temperature": 0,
               "ignore_eos": true, "logprobs": 3, "min_p": 0.1,
               "presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.2}),
    );
    assert_eq!(st, 200, "{v}");
    let choice = &v["choices"][0];
    let lp = &choice["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 6, "{lp}");
    let token_lps = lp["token_logprobs"].as_array().unwrap();
    let tops = lp["top_logprobs"].as_array().unwrap();
    let offsets = lp["text_offset"].as_array().unwrap();
    assert_eq!((token_lps.len(), tops.len(), offsets.len()), (6, 6, 6));
    for (i, top) in tops.iter().enumerate() {
        let top = top.as_object().unwrap();
        assert!(!top.is_empty() && top.len() <= 3, "{top:?}");
        let best = top
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        let lp = token_lps[i].as_f64().unwrap();
        assert!(
            lp <= 0.0 && (lp - best).abs() < 1e-6,
            "greedy takes the top: {lp} vs {top:?}"
        );
    }
    assert_eq!(offsets[0], 0);

    // Chat, greedy: content[i].top_logprobs[0] is the sampled token.
    let (st, v) = post(
        s.addr,
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
               "max_tokens": 5, "temperature": 0, "ignore_eos": true,
               "logprobs": true, "top_logprobs": 2}),
    );
    assert_eq!(st, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 5);
    for e in content {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2, "{e}");
        assert_eq!(top[0]["token"], e["token"], "{e}");
        assert_eq!(top[0]["logprob"], e["logprob"], "{e}");
        assert!(
            top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64(),
            "{e}"
        );
        assert!(e["bytes"].is_array());
    }
    // Without logprobs: null.
    let (_, v) = post(
        s.addr,
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
    );
    assert!(v["choices"][0]["logprobs"].is_null(), "{v}");

    // Streamed: every token's entry arrives, in the chunks.
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                      "max_tokens": 7, "temperature": 0, "ignore_eos": true,
                      "stream": true, "logprobs": true});
    let (st, b) = http(
        s.addr,
        "POST",
        "/v1/chat/completions",
        Some(&body.to_string()),
        &[],
    );
    assert_eq!(st, 200);
    let entries: usize = sse(&b)
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| {
            let v: Value = serde_json::from_str(d).unwrap();
            v["choices"][0]["logprobs"]["content"]
                .as_array()
                .map_or(0, |c| c.len())
        })
        .sum();
    assert_eq!(entries, 7, "{b}");
}
