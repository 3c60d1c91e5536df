//! encore-server: the OpenAI-compatible HTTP API over the engine loop
//! (`encore_core::serve::EngineHandle`): `/v1/completions` and `/v1/chat/completions`
//! (streaming as server-sent events, or whole), `/v1/models`, `/health` and `/metrics`
//! (Prometheus text). Requests are validated at the edge: a bad field is a 400 with an
//! OpenAI-style error body naming it; an unknown model a 404; a missing or wrong bearer
//! token a 401 when an API key is set; a body over the limit a 413. A client that goes
//! away aborts its request, which frees its KV blocks within a step. [`serve`] shuts down
//! gracefully: it stops accepting, lets the requests in flight finish for a grace period,
//! then ends the rest.

use std::convert::Infallible;
use std::future::{Future, IntoFuture};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{DefaultBodyLimit, Request as HttpRequest, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::{Json, Router};
use encore_core::generate::FinishReason;
use encore_core::histogram::HistogramSnapshot;
use encore_core::runner::{SamplingParams, TokenLogprobs};
use encore_core::scheduler::{Request, RequestParams};
use encore_core::serve::{EngineHandle, Event};
use encore_core::tokenizer::{ChatMessage, StopMatcher, StopStream, Tokenizer};
use encore_core::MAX_TOP_LOGPROBS;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::StreamExt;

/// What the server needs besides the engine.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The name `/v1/models` lists and requests must use.
    pub served_model_name: String,
    /// Bearer token every `/v1` request must carry, if set.
    pub api_key: Option<String>,
    /// Largest request body in bytes (413 above).
    pub max_body_bytes: usize,
    /// Default `max_tokens` of a completion (OpenAI's is 16).
    pub default_max_tokens: usize,
    /// Refuse new requests with 503 (and `Retry-After`) while this many wait in the
    /// engine's queue; `None`: no limit.
    pub max_waiting: Option<usize>,
}

/// Shared by the handlers.
struct AppState {
    engine: Arc<EngineHandle>,
    tokenizer: Arc<Tokenizer>,
    eos: Vec<u32>,
    cfg: ServerConfig,
    next_id: AtomicU64,
    requests_total: AtomicU64,
    /// Set when the server shuts down: new generation requests get a 503.
    draining: AtomicBool,
    /// Becomes `true` when the requests still in flight must end now.
    cut: watch::Sender<bool>,
}

/// The server: its router and the state [`serve`] drains at shutdown.
pub struct App {
    router: Router,
    state: Arc<AppState>,
}

impl App {
    /// The router with every endpoint (to serve it some other way; it does not drain).
    pub fn router(&self) -> Router {
        self.router.clone()
    }
}

/// The server with every endpoint, over a started engine and the model's tokenizer.
pub fn app(engine: Arc<EngineHandle>, tokenizer: Arc<Tokenizer>, cfg: ServerConfig) -> App {
    let eos = tokenizer.eos_token_ids();
    let limit = cfg.max_body_bytes;
    let state = Arc::new(AppState {
        engine,
        tokenizer,
        eos,
        cfg,
        next_id: AtomicU64::new(1),
        requests_total: AtomicU64::new(0),
        draining: AtomicBool::new(false),
        cut: watch::Sender::new(false),
    });
    let v1 = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    let router = Router::new()
        .merge(v1)
        .route("/health", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(Arc::clone(&state));
    App { router, state }
}

/// How long requests cut off at the end of the grace period get to end before their
/// connections are dropped.
const CUT_WAIT: Duration = Duration::from_secs(5);

/// Serve `app` on `listener` until `shutdown` resolves; then stop accepting connections
/// (and answer 503 to a request that still arrives), let the requests in flight finish
/// for up to `grace`, and end the rest: a stream with an error event and `[DONE]`, a
/// whole response with a 503; the engine aborts them. Returns once every connection has
/// closed.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: App,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    let App { router, state } = app;
    let (draining_tx, draining_rx) = oneshot::channel::<()>();
    let st = Arc::clone(&state);
    let signal = async move {
        shutdown.await;
        st.draining.store(true, Ordering::SeqCst);
        let _ = draining_tx.send(());
    };
    // Every SSE chunk is a small write: without TCP_NODELAY, Nagle's algorithm holds it
    // until the client's delayed ACK (40 ms on Linux), which a first token would pay.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!("cannot set TCP_NODELAY on a connection: {e}");
        }
    });
    let server = axum::serve(listener, router)
        .with_graceful_shutdown(signal)
        .into_future();
    tokio::pin!(server);
    tokio::select! {
        r = &mut server => return r,
        Ok(()) = draining_rx => {}
    }
    tokio::select! {
        r = &mut server => return r,
        _ = tokio::time::sleep(grace) => {}
    }
    tracing::warn!(
        "shutdown: requests still in flight after {:.1} s are cut off",
        grace.as_secs_f64()
    );
    state.cut.send_replace(true);
    match tokio::time::timeout(CUT_WAIT, server).await {
        Ok(r) => r,
        Err(_) => Ok(()), // connections that did not close are dropped
    }
}

/// Resolves once the requests in flight must end (never, unless the server shuts down).
async fn cut_off(mut cut: watch::Receiver<bool>) {
    while !*cut.borrow_and_update() {
        if cut.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// The error a request cut off at shutdown ends with.
fn shutting_down() -> ApiError {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: "the server is shutting down".into(),
        kind: "server_error",
        param: None,
    }
}

/// An OpenAI-style error response.
struct ApiError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    param: Option<&'static str>,
}

impl ApiError {
    fn bad(param: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = match self.status {
            StatusCode::NOT_FOUND => json!("model_not_found"),
            StatusCode::UNAUTHORIZED => json!("invalid_api_key"),
            _ => Value::Null,
        };
        let body = json!({"error": {
            "message": self.message, "type": self.kind, "param": self.param, "code": code,
        }});
        (self.status, Json(body)).into_response()
    }
}

async fn auth(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    req: HttpRequest,
    next: Next,
) -> Response {
    if let Some(key) = &s.cfg.api_key {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_str()) {
            return ApiError {
                status: StatusCode::UNAUTHORIZED,
                message: "missing or wrong API key (Authorization: Bearer ...)".into(),
                kind: "authentication_error",
                param: None,
            }
            .into_response();
        }
    }
    next.run(req).await
}

async fn models(State(s): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{
        "id": s.cfg.served_model_name, "object": "model", "created": 0, "owned_by": "encore",
        "max_model_len": s.engine.max_seq_len,
    }]}))
}

async fn metrics(State(s): State<Arc<AppState>>) -> impl IntoResponse {
    let m = &s.engine.metrics;
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let rows: [(&str, &str, &str, u64); 12] = [
        (
            "encore_requests_running",
            "gauge",
            "Requests in the running batch.",
            g(&m.requests_running),
        ),
        (
            "encore_requests_waiting",
            "gauge",
            "Requests queued.",
            g(&m.requests_waiting),
        ),
        (
            "encore_kv_blocks_used",
            "gauge",
            "KV-cache blocks held by requests.",
            g(&m.kv_blocks_used),
        ),
        (
            "encore_kv_blocks_total",
            "gauge",
            "Usable KV-cache blocks.",
            g(&m.kv_blocks_total),
        ),
        (
            "encore_preemptions_total",
            "counter",
            "Requests preempted for KV blocks.",
            g(&m.preemptions_total),
        ),
        (
            "encore_steps_total",
            "counter",
            "Engine steps run.",
            g(&m.steps_total),
        ),
        (
            "encore_requests_finished_total",
            "counter",
            "Requests finished.",
            g(&m.requests_finished_total),
        ),
        (
            "encore_requests_aborted_total",
            "counter",
            "Requests aborted.",
            g(&m.requests_aborted_total),
        ),
        (
            "encore_http_requests_total",
            "counter",
            "Generation requests received.",
            g(&s.requests_total),
        ),
        (
            "encore_tokens_computed_total",
            "counter",
            "Tokens run through the model.",
            g(&m.tokens_computed_total),
        ),
        (
            "encore_prefix_cache_queries_total",
            "counter",
            "Prompt tokens looked up in the prefix cache.",
            g(&m.prefix_cache_queries_total),
        ),
        (
            "encore_prefix_cache_hits_total",
            "counter",
            "Prompt tokens found in the prefix cache (not computed).",
            g(&m.prefix_cache_hits_total),
        ),
    ];
    let mut text = String::new();
    for (name, kind, help, v) in rows {
        text.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"
        ));
    }
    text.push_str(&format!(
        "# HELP encore_prefix_cache_hit_ratio Prompt tokens found in the prefix cache per token looked up.\n# TYPE encore_prefix_cache_hit_ratio gauge\nencore_prefix_cache_hit_ratio {}\n",
        m.prefix_cache_hit_ratio()
    ));
    // Weight offload (all 0 when every weight is resident).
    let o = s.engine.boot.offload.clone().unwrap_or_default();
    for (name, help, v) in [
        (
            "encore_weight_budget_bytes",
            "Device bytes the weights may take (--weight-budget; 0: no budget).",
            o.budget_bytes,
        ),
        (
            "encore_weights_resident_bytes",
            "Bytes of weights kept on the device under the budget.",
            o.resident_bytes,
        ),
        (
            "encore_weights_streamed_bytes_per_step",
            "Bytes of weights copied from host memory per step (the plan's, or LRU's estimate).",
            o.streamed_bytes_per_step,
        ),
    ] {
        text.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}\n"
        ));
    }
    text.push_str("# HELP encore_graph_replays_total Graph replays by phase.\n# TYPE encore_graph_replays_total counter\n");
    text.push_str(&format!(
        "encore_graph_replays_total{{phase=\"decode\"}} {}\nencore_graph_replays_total{{phase=\"mixed\"}} {}\n",
        g(&m.graph_replays_decode),
        g(&m.graph_replays_mixed)
    ));
    histogram_text(
        &mut text,
        "encore_time_to_first_token_seconds",
        "Time from a request's arrival to its first token.",
        &m.time_to_first_token.snapshot(),
    );
    histogram_text(
        &mut text,
        "encore_inter_token_latency_seconds",
        "Time between consecutive tokens of a request.",
        &m.inter_token_latency.snapshot(),
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

/// A Prometheus histogram: cumulative `_bucket{le=...}` lines, `_sum` and `_count`.
fn histogram_text(text: &mut String, name: &str, help: &str, h: &HistogramSnapshot) {
    text.push_str(&format!("# HELP {name} {help}\n# TYPE {name} histogram\n"));
    for (le, c) in h.bounds.iter().zip(&h.cumulative) {
        text.push_str(&format!("{name}_bucket{{le=\"{le}\"}} {c}\n"));
    }
    text.push_str(&format!(
        "{name}_bucket{{le=\"+Inf\"}} {count}\n{name}_sum {sum}\n{name}_count {count}\n",
        count = h.count(),
        sum = h.sum_secs
    ));
}

/// The sampling and length fields both endpoints share, validated.
struct Common {
    stream: bool,
    include_usage: bool,
    max_tokens: usize,
    /// `max_tokens` is the server's default (the request gave none): it shrinks to the
    /// room the context leaves, as vLLM's does.
    max_tokens_default: bool,
    params: RequestParams,
    /// Stop strings (at most 4, none empty), checked on the detokenized text.
    stop: StopMatcher,
}

fn field<'a>(body: &'a Value, name: &str) -> Option<&'a Value> {
    body.get(name).filter(|v| !v.is_null())
}

fn parse_common(s: &AppState, body: &Value) -> Result<Common, ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad(
            "body",
            "the request body must be a JSON object",
        ));
    }
    match field(body, "model").map(|m| m.as_str()) {
        None => return Err(ApiError::bad("model", "`model` is required")),
        Some(None) => return Err(ApiError::bad("model", "`model` must be a string")),
        Some(Some(m)) if m != s.cfg.served_model_name => {
            return Err(ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!(
                    "the model `{m}` does not exist; this server serves `{}`",
                    s.cfg.served_model_name
                ),
                kind: "invalid_request_error",
                param: Some("model"),
            })
        }
        _ => {}
    }
    let num = |name: &'static str, lo: f64, hi: f64, default: f64| -> Result<f64, ApiError> {
        match field(body, name) {
            None => Ok(default),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && x >= lo && x <= hi => Ok(x),
                _ => Err(ApiError::bad(
                    name,
                    format!("`{name}` must be a number in [{lo}, {hi}]"),
                )),
            },
        }
    };
    let int = |name: &'static str, lo: i64, hi: i64| -> Result<Option<i64>, ApiError> {
        match field(body, name) {
            None => Ok(None),
            Some(v) => match v.as_i64() {
                Some(x) if x >= lo && x <= hi => Ok(Some(x)),
                _ => Err(ApiError::bad(
                    name,
                    format!("`{name}` must be an integer in [{lo}, {hi}]"),
                )),
            },
        }
    };
    let flag = |name: &'static str| -> Result<bool, ApiError> {
        match field(body, name) {
            None => Ok(false),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| ApiError::bad(name, format!("`{name}` must be a boolean"))),
        }
    };
    let temperature = num("temperature", 0.0, 2.0, 1.0)?;
    // Above 0 in f32 too: the kernel reads 0 as "off".
    let top_p = num("top_p", f32::MIN_POSITIVE as f64, 1.0, 1.0)?;
    let top_k = int("top_k", -1, i32::MAX as i64)?.unwrap_or(0);
    let seed = int("seed", i64::MIN, i64::MAX)?;
    let min_p = num("min_p", 0.0, 1.0, 0.0)?;
    let presence_penalty = num("presence_penalty", -2.0, 2.0, 0.0)?;
    let frequency_penalty = num("frequency_penalty", -2.0, 2.0, 0.0)?;
    let repetition_penalty = match field(body, "repetition_penalty") {
        None => 1.0,
        Some(v) => match v.as_f64() {
            Some(x) if x.is_finite() && x > 0.0 && x as f32 > 0.0 => x,
            _ => {
                return Err(ApiError::bad(
                    "repetition_penalty",
                    "`repetition_penalty` must be a number > 0",
                ))
            }
        },
    };
    let max_ctx = s.engine.max_seq_len as i64;
    let max_tokens = match int("max_completion_tokens", 1, max_ctx)? {
        Some(m) => Some(m),
        None => int("max_tokens", 1, max_ctx)?,
    };
    let max_tokens_default = max_tokens.is_none();
    let max_tokens = max_tokens.map_or(s.cfg.default_max_tokens, |m| m as usize);
    let stream = flag("stream")?;
    let include_usage = match field(body, "stream_options") {
        None => false,
        Some(o) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(v) => v.as_bool().ok_or_else(|| {
                ApiError::bad("stream_options", "`include_usage` must be a boolean")
            })?,
        },
    };
    let ignore_eos = flag("ignore_eos")?;
    let mut stop_token_ids = if ignore_eos {
        Vec::new()
    } else {
        s.eos.clone()
    };
    if let Some(v) = field(body, "stop_token_ids") {
        let ids = v
            .as_array()
            .and_then(|a| {
                a.iter()
                    .map(|x| x.as_u64().and_then(|t| u32::try_from(t).ok()))
                    .collect::<Option<Vec<u32>>>()
            })
            .ok_or_else(|| {
                ApiError::bad(
                    "stop_token_ids",
                    "`stop_token_ids` must be a list of token ids",
                )
            })?;
        stop_token_ids.extend(ids);
    }
    let stop = match field(body, "stop") {
        None => Vec::new(),
        Some(Value::String(x)) => vec![x.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(String::from))
            .collect::<Option<Vec<String>>>()
            .filter(|v| v.len() <= 4)
            .ok_or_else(|| {
                ApiError::bad(
                    "stop",
                    "`stop` must be a string or a list of at most 4 strings",
                )
            })?,
        Some(_) => {
            return Err(ApiError::bad(
                "stop",
                "`stop` must be a string or a list of at most 4 strings",
            ))
        }
    };
    let stop = StopMatcher::new(stop)
        .map_err(|_| ApiError::bad("stop", "a `stop` string must not be empty"))?;
    let seed = seed.map_or_else(
        || {
            s.next_id
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        },
        |x| x as u64,
    );
    Ok(Common {
        stream,
        include_usage,
        max_tokens,
        max_tokens_default,
        params: RequestParams {
            sampling: SamplingParams {
                temperature: temperature as f32,
                top_k: top_k as i32,
                top_p: top_p as f32,
                min_p: min_p as f32,
                seed,
                presence_penalty: presence_penalty as f32,
                frequency_penalty: frequency_penalty as f32,
                repetition_penalty: repetition_penalty as f32,
                ..Default::default()
            },
            max_tokens,
            stop_token_ids,
            // The stop ids already hold the model's end tokens unless ignore_eos.
            ignore_eos: false,
        },
        stop,
    })
}

/// The request body, or the rejection as an OpenAI-style error (413 for a body over the
/// limit, 400 for anything that is not JSON).
fn json_body(
    body: Result<Json<Value>, axum::extract::rejection::JsonRejection>,
) -> Result<Value, ApiError> {
    body.map(|Json(b)| b).map_err(|e| {
        let status = e.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError {
                status,
                message: "the request body is larger than the server accepts (--max-body-bytes)"
                    .into(),
                kind: "invalid_request_error",
                param: Some("body"),
            }
        } else {
            ApiError::bad("body", format!("invalid JSON body: {e}"))
        }
    })
}

fn finish_name(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Eos | FinishReason::StopString => "stop",
        FinishReason::Length | FinishReason::Context => "length",
        FinishReason::Stopped => "abort",
    }
}

/// The text `token` releases, and whether a stop string ended the text there; `last`: the
/// engine's final token, after which everything held back is released.
fn release(text: &mut StopStream<'_>, token: u32, last: bool) -> (String, bool) {
    let mut out = text.push(token);
    if last && !out.stopped {
        out.text.push_str(&text.finish());
        out.stopped = text.stopped();
    }
    (out.text, out.stopped)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn completions(
    State(s): State<Arc<AppState>>,
    body: Result<Json<Value>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let body = match json_body(body) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let prompt = match field(&body, "prompt") {
        Some(Value::String(p)) => s
            .tokenizer
            .encode(p, true)
            .map_err(|e| ApiError::bad("prompt", e.to_string())),
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_u64) => a
            .iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .filter(|&t| (t as usize) < s.engine.vocab_size)
                    .ok_or_else(|| {
                        ApiError::bad(
                            "prompt",
                            format!(
                                "token id {x} is outside the vocabulary of {}",
                                s.engine.vocab_size
                            ),
                        )
                    })
            })
            .collect(),
        Some(_) => Err(ApiError::bad(
            "prompt",
            "`prompt` must be a string or a list of token ids",
        )),
        None => Err(ApiError::bad("prompt", "`prompt` is required")),
    };
    let prompt = match prompt {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    generate(s, body, prompt, Kind::Completion).await
}

async fn chat_completions(
    State(s): State<Arc<AppState>>,
    body: Result<Json<Value>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let body = match json_body(body) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let messages: Result<Vec<ChatMessage>, ApiError> = match field(&body, "messages") {
        Some(Value::Array(a)) if !a.is_empty() => a
            .iter()
            .map(|m| {
                let role = m.get("role").and_then(Value::as_str);
                let content = m.get("content").and_then(Value::as_str);
                match (role, content) {
                    (Some(r), Some(c)) => Ok(ChatMessage::new(r, c)),
                    _ => Err(ApiError::bad(
                        "messages",
                        "each message needs a string `role` and `content`",
                    )),
                }
            })
            .collect(),
        _ => Err(ApiError::bad(
            "messages",
            "`messages` must be a non-empty list",
        )),
    };
    let prompt = messages.and_then(|m| {
        let text = s
            .tokenizer
            .apply_chat_template(&m, true)
            .map_err(|e| ApiError::bad("messages", e.to_string()))?;
        s.tokenizer
            .encode(&text, false)
            .map_err(|e| ApiError::bad("messages", e.to_string()))
    });
    match prompt {
        Ok(p) => generate(s, body, p, Kind::Chat).await,
        Err(e) => e.into_response(),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Completion,
    Chat,
}

/// Aborts the request when dropped before its end (a client that went away).
struct AbortGuard {
    engine: Arc<EngineHandle>,
    id: u64,
    done: bool,
    /// Set when a stop string ended the text (shared with the request's sink).
    stopped: Arc<AtomicBool>,
}

impl AbortGuard {
    /// The request's text reached a stop string: end it in the engine as finished.
    fn stopped(&mut self) {
        if !self.done {
            self.stopped.store(true, Ordering::Relaxed);
            self.engine.finish(self.id);
            self.done = true;
        }
    }
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if !self.done {
            self.engine.abort(self.id);
        }
    }
}

/// The number of top log-probabilities asked for, or `None`: completions' `logprobs`
/// (an integer 0..=20), chat's `logprobs` (a boolean) with `top_logprobs` (0..=20, only
/// with `logprobs: true`).
fn parse_logprobs(body: &Value, kind: Kind) -> Result<Option<usize>, ApiError> {
    let max = MAX_TOP_LOGPROBS as u64;
    let count = |name: &'static str| -> Result<Option<usize>, ApiError> {
        match field(body, name) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n <= max => Ok(Some(n as usize)),
                _ => Err(ApiError::bad(
                    name,
                    format!("`{name}` must be an integer in [0, {max}]"),
                )),
            },
        }
    };
    match kind {
        Kind::Completion => count("logprobs"),
        Kind::Chat => {
            let on = match field(body, "logprobs") {
                None => false,
                Some(v) => v
                    .as_bool()
                    .ok_or_else(|| ApiError::bad("logprobs", "`logprobs` must be a boolean"))?,
            };
            let top = count("top_logprobs")?;
            if top.is_some() && !on {
                return Err(ApiError::bad(
                    "top_logprobs",
                    "`top_logprobs` needs `logprobs: true`",
                ));
            }
            Ok(on.then_some(top.unwrap_or(0)))
        }
    }
}

/// The text of one token for log-probability entries (invalid UTF-8 of a partial
/// character is replaced).
fn token_text(tok: &Tokenizer, id: u32) -> String {
    tok.decode(&[id], false).unwrap_or_default()
}

/// The OpenAI `logprobs` object of `entries` (tokens with their log-probabilities):
/// completions' `{tokens, token_logprobs, top_logprobs, text_offset}` with offsets from
/// `*offset` (advanced past the tokens), chat's `{content: [{token, logprob, bytes,
/// top_logprobs}]}`.
fn logprobs_json(
    tok: &Tokenizer,
    kind: Kind,
    entries: &[(u32, TokenLogprobs)],
    offset: &mut usize,
) -> Value {
    match kind {
        Kind::Completion => {
            let (mut tokens, mut lps, mut tops, mut offsets) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for (id, lp) in entries {
                let text = token_text(tok, *id);
                offsets.push(*offset);
                *offset += text.len();
                tokens.push(text);
                lps.push(lp.logprob);
                // Keyed by text: of tokens with the same text the likelier stays.
                let mut top = serde_json::Map::new();
                for &(t, l) in &lp.top {
                    top.entry(token_text(tok, t)).or_insert(json!(l));
                }
                tops.push(Value::Object(top));
            }
            json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
        }
        Kind::Chat => {
            let entry = |id: u32, l: f32| {
                let text = token_text(tok, id);
                json!({"token": text, "logprob": l, "bytes": text.as_bytes()})
            };
            let content: Vec<Value> = entries
                .iter()
                .map(|(id, lp)| {
                    let mut e = entry(*id, lp.logprob);
                    e["top_logprobs"] = lp.top.iter().map(|&(t, l)| entry(t, l)).collect();
                    e
                })
                .collect();
            json!({ "content": content })
        }
    }
}

async fn generate(s: Arc<AppState>, body: Value, prompt: Vec<u32>, kind: Kind) -> Response {
    let mut c = match parse_common(&s, &body) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    match parse_logprobs(&body, kind) {
        Ok(n) => c.params.sampling.logprobs = n,
        Err(e) => return e.into_response(),
    }
    s.requests_total.fetch_add(1, Ordering::Relaxed);
    if s.draining.load(Ordering::SeqCst) {
        return shutting_down().into_response();
    }
    if let Some(limit) = s.cfg.max_waiting {
        let waiting = s.engine.metrics.requests_waiting.load(Ordering::Relaxed) as usize;
        if waiting >= limit {
            let mut r = ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: format!(
                    "the server is at capacity ({waiting} requests waiting); retry shortly"
                ),
                kind: "server_error",
                param: None,
            }
            .into_response();
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            return r;
        }
    }
    if prompt.len() + 1 > s.engine.max_seq_len {
        return ApiError::bad(
            "prompt",
            format!(
                "the prompt has {} tokens; the model's context is {}",
                prompt.len(),
                s.engine.max_seq_len
            ),
        )
        .into_response();
    }
    if c.max_tokens_default {
        // Not asked for: as many as the context and the cache leave, up to the default.
        let room = s.engine.max_seq_len.min(s.engine.kv_capacity_tokens);
        c.max_tokens = c.max_tokens.min(room.saturating_sub(prompt.len()).max(1));
        c.params.max_tokens = c.max_tokens;
    }
    if prompt.len() + c.max_tokens > s.engine.max_seq_len {
        return ApiError::bad(
            "max_tokens",
            format!(
                "{} prompt tokens + max_tokens {} exceed the model's context of {}",
                prompt.len(),
                c.max_tokens,
                s.engine.max_seq_len
            ),
        )
        .into_response();
    }
    if prompt.len() + c.max_tokens > s.engine.kv_capacity_tokens {
        return ApiError::bad(
            "max_tokens",
            format!(
                "{} prompt tokens + max_tokens {} need more KV cache than the server has \
                 ({} tokens)",
                prompt.len(),
                c.max_tokens,
                s.engine.kv_capacity_tokens
            ),
        )
        .into_response();
    }
    let id = s.next_id.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = mpsc::unbounded_channel::<Event>();
    let stopped = Arc::new(AtomicBool::new(false));
    let submitted = s.engine.submit(
        Request {
            id,
            prompt: prompt.clone(),
            params: c.params.clone(),
        },
        {
            // After a stop string the reader goes away on purpose and a `finish` message is
            // on its way: the tokens of a step still in flight must not abort the request.
            let stopped = Arc::clone(&stopped);
            Box::new(move |e| tx.send(e).is_ok() || stopped.load(Ordering::Relaxed))
        },
    );
    if let Err(e) = submitted {
        return ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: e.to_string(),
            kind: "server_error",
            param: None,
        }
        .into_response();
    }
    let guard = AbortGuard {
        engine: Arc::clone(&s.engine),
        id,
        done: false,
        stopped,
    };
    let (object, chunk_object, rid) = match kind {
        Kind::Completion => ("text_completion", "text_completion", format!("cmpl-{id}")),
        Kind::Chat => (
            "chat.completion",
            "chat.completion.chunk",
            format!("chatcmpl-{id}"),
        ),
    };
    let created = now_secs();
    let model = s.cfg.served_model_name.clone();
    if !c.stream {
        return whole(
            s, rx, guard, prompt, c.stop, kind, object, rid, created, model,
        )
        .await;
    }
    // Streaming: a task turns engine events into SSE data (one event per token, as vLLM
    // sends them — its text may be empty while a character or a possible stop string is
    // incomplete, so clients can time every token — the last with the finish reason, the
    // usage chunk when asked for, then [DONE]).
    // When the client goes away, the task ends and its guard aborts the request.
    let tokenizer = Arc::clone(&s.tokenizer);
    let include_usage = c.include_usage;
    let stop = c.stop;
    let cut = s.cut.subscribe();
    let (out_tx, out_rx) = mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        let mut guard = guard;
        let mut rx = rx;
        let mut text = StopStream::new(&tokenizer, &prompt, stop);
        let mut n = 0usize;
        // The text offset of the next token's log-probabilities.
        let mut offset = 0usize;
        let cut = cut_off(cut);
        tokio::pin!(cut);
        loop {
            let ev = tokio::select! {
                ev = rx.recv() => ev,
                _ = out_tx.closed() => return,
                _ = &mut cut => {
                    // The guard aborts the request in the engine.
                    let e = shutting_down();
                    let err = json!({"error": {"message": e.message, "type": e.kind, "param": null, "code": null}});
                    let _ = out_tx.send(err.to_string());
                    let _ = out_tx.send("[DONE]".into());
                    return;
                }
            };
            let Some(ev) = ev else { return };
            let refused = matches!(ev, Event::Error(_));
            match ev {
                Event::Token(o) => {
                    n += 1;
                    let (delta, stopped) = release(&mut text, o.token, o.finish.is_some());
                    let finish = if stopped {
                        Some("stop")
                    } else {
                        o.finish.map(finish_name)
                    };
                    let lps = match o.logprobs.clone() {
                        Some(lp) => logprobs_json(&tokenizer, kind, &[(o.token, lp)], &mut offset),
                        None => Value::Null,
                    };
                    let c = chunk(
                        kind,
                        chunk_object,
                        &rid,
                        created,
                        &model,
                        &delta,
                        finish,
                        n == 1,
                        lps,
                    );
                    if out_tx.send(c.to_string()).is_err() {
                        return;
                    }
                    if finish.is_some() {
                        // A stop string ends the request here; the engine may still be
                        // running it: it ends there as finished.
                        guard.done = o.finish.is_some();
                        if stopped {
                            guard.stopped();
                        }
                        if include_usage {
                            let u = json!({
                                "id": rid, "object": chunk_object, "created": created,
                                "model": model, "choices": [], "usage": usage(prompt.len(), n),
                            });
                            let _ = out_tx.send(u.to_string());
                        }
                        let _ = out_tx.send("[DONE]".into());
                        return;
                    }
                }
                Event::Error(e) | Event::Failed(e) => {
                    guard.done = true;
                    // A refusal is the request's fault; a failed step the server's.
                    let kind = if refused {
                        "invalid_request_error"
                    } else {
                        "server_error"
                    };
                    let err =
                        json!({"error": {"message": e, "type": kind, "param": null, "code": null}});
                    let _ = out_tx.send(err.to_string());
                    let _ = out_tx.send("[DONE]".into());
                    return;
                }
            }
        }
    });
    let events = UnboundedReceiverStream::new(out_rx)
        .map(|d| Ok::<_, Infallible>(SseEvent::default().data(d)));
    Sse::new(events).into_response()
}

#[allow(clippy::too_many_arguments)]
fn chunk(
    kind: Kind,
    object: &str,
    rid: &str,
    created: u64,
    model: &str,
    delta: &str,
    finish: Option<&str>,
    first: bool,
    logprobs: Value,
) -> Value {
    let choice = match kind {
        Kind::Completion => {
            json!({"index": 0, "text": delta, "logprobs": logprobs, "finish_reason": finish})
        }
        Kind::Chat => {
            let mut d = json!({"content": delta});
            if first {
                d["role"] = json!("assistant");
            }
            json!({"index": 0, "delta": d, "logprobs": logprobs, "finish_reason": finish})
        }
    };
    json!({"id": rid, "object": object, "created": created, "model": model, "choices": [choice]})
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

#[allow(clippy::too_many_arguments)]
async fn whole(
    s: Arc<AppState>,
    mut rx: mpsc::UnboundedReceiver<Event>,
    mut guard: AbortGuard,
    prompt: Vec<u32>,
    stop: StopMatcher,
    kind: Kind,
    object: &str,
    rid: String,
    created: u64,
    model: String,
) -> Response {
    let mut ids = Vec::new();
    let mut logprobs: Vec<(u32, TokenLogprobs)> = Vec::new();
    // With stop strings the text is built as it streams, to end at the first one.
    let mut stop_text =
        (!stop.is_empty()).then(|| (StopStream::new(&s.tokenizer, &prompt, stop), String::new()));
    let cut = cut_off(s.cut.subscribe());
    tokio::pin!(cut);
    let finish = loop {
        let ev = tokio::select! {
            ev = rx.recv() => ev,
            // The guard aborts the request in the engine.
            _ = &mut cut => return shutting_down().into_response(),
        };
        match ev {
            Some(Event::Token(o)) => {
                ids.push(o.token);
                if let Some(lp) = o.logprobs.clone() {
                    logprobs.push((o.token, lp));
                }
                if let Some((t, acc)) = &mut stop_text {
                    let (piece, stopped) = release(t, o.token, o.finish.is_some());
                    acc.push_str(&piece);
                    if stopped {
                        if o.finish.is_some() {
                            guard.done = true;
                        }
                        guard.stopped();
                        break "stop";
                    }
                }
                if let Some(f) = o.finish {
                    guard.done = true;
                    break finish_name(f);
                }
            }
            Some(Event::Error(e)) => {
                guard.done = true;
                return ApiError::bad("prompt", e).into_response();
            }
            Some(Event::Failed(e)) => {
                guard.done = true;
                return ApiError {
                    status: StatusCode::INTERNAL_SERVER_ERROR,
                    message: e,
                    kind: "server_error",
                    param: None,
                }
                .into_response();
            }
            None => {
                guard.done = true;
                return ApiError {
                    status: StatusCode::INTERNAL_SERVER_ERROR,
                    message: "the engine dropped the request".into(),
                    kind: "server_error",
                    param: None,
                }
                .into_response();
            }
        }
    };
    drop(guard);
    let decoded = match stop_text {
        Some((_, acc)) => Ok(acc),
        None => s.tokenizer.decode(&ids, true),
    };
    let text = match decoded {
        Ok(t) => t,
        Err(e) => {
            return ApiError {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                message: e.to_string(),
                kind: "server_error",
                param: None,
            }
            .into_response()
        }
    };
    let lps = if logprobs.is_empty() {
        Value::Null
    } else {
        logprobs_json(&s.tokenizer, kind, &logprobs, &mut 0)
    };
    let choice = match kind {
        Kind::Completion => {
            json!({"index": 0, "text": text, "logprobs": lps, "finish_reason": finish, "token_ids": ids})
        }
        Kind::Chat => {
            json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": lps, "finish_reason": finish, "token_ids": ids})
        }
    };
    Json(json!({
        "id": rid, "object": object, "created": created, "model": model,
        "choices": [choice], "usage": usage(prompt.len(), ids.len()),
    }))
    .into_response()
}
