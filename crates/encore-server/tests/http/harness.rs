//! The harness of the server's tests: a server over a real engine loop (CPU backend,
//! `dummy:tiny`) on an ephemeral loopback port, a minimal HTTP/1.1 client, SSE parsing,
//! and the reference tokens of `generate`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use encore_core::engine::{EngineConfig, KvSizing};
use encore_core::progress::NoProgress;
use encore_core::scheduler::SchedulerConfig;
use encore_core::serve::EngineHandle;
use encore_core::DType;
use encore_server::{ReasoningFormat, ServerConfig, ToolFormat};
use serde_json::{json, Value};

pub const MODEL: &str = "dummy:tiny";

pub fn engine_config() -> EngineConfig {
    EngineConfig::new(DType::F32, 16, 256, 32, 256, KvSizing::Blocks(1 + 32 * 16))
}

/// A server on an ephemeral loopback port; the runtime lives as long as the returned
/// value.
pub struct Server {
    pub addr: SocketAddr,
    pub engine: Arc<EngineHandle>,
    _rt: tokio::runtime::Runtime,
}

pub fn start(api_key: Option<&str>) -> Server {
    start_with(api_key, None)
}

pub fn start_with(api_key: Option<&str>, max_waiting: Option<usize>) -> Server {
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
/// A server of [`long_engine_config`] that shuts down, with `grace`, when the returned
/// sender fires; and the channel on which `serve` returns.
pub fn start_long_with_shutdown(
    grace: Duration,
) -> (
    Server,
    std::sync::mpsc::Receiver<std::io::Result<()>>,
    tokio::sync::oneshot::Sender<()>,
) {
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        let _ = go_rx.await;
    };
    let (s, done) = start_full(None, None, long_engine_config(), shutdown, grace);
    (s, done, go_tx)
}

/// A server whose chat outputs are read with these parsers (`--tool-call-parser`,
/// `--reasoning-parser`), with room for prompts that list tools.
pub fn start_parsers(tool: Option<ToolFormat>, reasoning: Option<ReasoningFormat>) -> Server {
    start_full_with(
        None,
        None,
        long_engine_config(),
        std::future::pending(),
        Duration::ZERO,
        (tool, reasoning),
    )
    .0
}

pub fn start_full(
    api_key: Option<&str>,
    max_waiting: Option<usize>,
    cfg: EngineConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> (Server, std::sync::mpsc::Receiver<std::io::Result<()>>) {
    start_full_with(api_key, max_waiting, cfg, shutdown, grace, (None, None))
}

/// A server of [`long_engine_config`] whose scheduler runs `max_num_seqs` sequences at
/// once, refusing requests past `max_waiting` waiting ones.
pub fn start_queue(max_num_seqs: usize, max_waiting: usize) -> Server {
    let sched = SchedulerConfig::new(128, max_num_seqs);
    start_server(
        None,
        Some(max_waiting),
        long_engine_config(),
        sched,
        std::future::pending(),
        Duration::ZERO,
        (None, None),
    )
    .0
}

fn start_full_with(
    api_key: Option<&str>,
    max_waiting: Option<usize>,
    cfg: EngineConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    grace: Duration,
    parsers: (Option<ToolFormat>, Option<ReasoningFormat>),
) -> (Server, std::sync::mpsc::Receiver<std::io::Result<()>>) {
    let sched = SchedulerConfig::new(128, 32);
    start_server(api_key, max_waiting, cfg, sched, shutdown, grace, parsers)
}

thread_local! {
    /// The chat template a server started on this thread renders with in place of the
    /// model's, if any.
    static TEMPLATE: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// A server of [`long_engine_config`] whose model's chat template is `template`.
pub fn start_template(template: &str) -> Server {
    TEMPLATE.with(|t| *t.borrow_mut() = Some(template.to_string()));
    let s = start_parsers(None, None);
    TEMPLATE.with(|t| *t.borrow_mut() = None);
    s
}

fn start_server(
    api_key: Option<&str>,
    max_waiting: Option<usize>,
    cfg: EngineConfig,
    sched: SchedulerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    grace: Duration,
    parsers: (Option<ToolFormat>, Option<ReasoningFormat>),
) -> (Server, std::sync::mpsc::Receiver<std::io::Result<()>>) {
    let files = encore_core::model::open_model(MODEL).unwrap();
    let mut tokenizer = encore_core::model::open_tokenizer(&files.source).unwrap();
    if let Some(t) = TEMPLATE.with(|t| t.borrow().clone()) {
        tokenizer = tokenizer.with_chat_template(t, "the test").unwrap();
    }
    let tokenizer = Arc::new(tokenizer);
    // Structured outputs, as `encore serve` sets them up.
    let mut cfg = cfg;
    cfg.constraints = Some(Arc::new(
        encore_core::constraint::ConstraintCompiler::new(&tokenizer, files.config.vocab_size)
            .unwrap(),
    ));
    let engine = Arc::new(
        EngineHandle::start(
            Arc::new(encore_core::backend::cpu::CpuBackend::new()),
            encore_core::model::open_model(MODEL).unwrap(),
            cfg,
            sched,
            Box::new(NoProgress),
        )
        .unwrap(),
    );
    let app = encore_server::app(
        Arc::clone(&engine),
        tokenizer,
        ServerConfig {
            served_model_name: MODEL.into(),
            api_key: api_key.map(String::from),
            max_body_bytes: 64 * 1024,
            default_max_tokens: 16,
            max_waiting,
            tool_call_parser: parsers.0,
            reasoning_parser: parsers.1,
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
pub fn http(
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

pub fn dechunk(mut s: &str) -> String {
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

pub fn post(addr: SocketAddr, path: &str, body: Value) -> (u16, Value) {
    let (st, b) = http(addr, "POST", path, Some(&body.to_string()), &[]);
    (st, serde_json::from_str(&b).unwrap_or(json!({ "raw": b })))
}

/// A POST of `body` that must answer 200; the raw body (an SSE stream for `"stream": true`).
pub fn post_raw(addr: SocketAddr, path: &str, body: &Value) -> String {
    let (st, raw) = http(addr, "POST", path, Some(&body.to_string()), &[]);
    assert_eq!(st, 200, "{raw}");
    raw
}

/// The `data:` payloads of an SSE body.
pub fn sse(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: ").map(String::from))
        .collect()
}

pub fn greedy_ids_from_generate(prompt: &[u32], max_tokens: usize) -> Vec<u32> {
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
/// The text of a streamed completion's chunks and the last finish reason.
pub fn streamed_text(raw: &str) -> (String, Value) {
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
pub fn wait_for_no_kv_blocks(s: &Server) {
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

/// A streaming request on its own connection, read on a thread after its first event:
/// returns the thread's answer (the SSE payloads) once the first event has arrived.
pub fn open_stream(addr: SocketAddr, body: Value) -> std::thread::JoinHandle<Vec<String>> {
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
pub fn long_engine_config() -> EngineConfig {
    EngineConfig::new(DType::F32, 16, 256, 32, 2048, KvSizing::Blocks(1 + 8 * 128))
}

/// The value of a metrics line `name value`.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}
