//! encore-server: the OpenAI-compatible HTTP API over the engine loop
//! (`encore_core::serve::EngineHandle`): `/v1/completions` and `/v1/chat/completions`
//! (streaming as server-sent events, or whole), vLLM's `/tokenize` and `/detokenize`,
//! `/v1/models` and `/v1/models/{model}`, `/health`, `/metrics` (Prometheus text) and
//! `/openapi.json` (the OpenAPI document of every route, generated from the wire types).
//! Every field of a request body is honored, accepted and logged, or refused with a 400
//! naming it, by one table per endpoint (`fields`): no field is silently ignored.
//! Bodies are then read as typed structs validated at the edge (`body`); what depends
//! on the engine is checked once, at admission, whose typed refusal the server maps to
//! its 400: a bad field or a refused parameter is a 400 with an OpenAI-style error body
//! naming it; an unknown model a 404 (and so is an unknown path, with the same error
//! body; a method a route does not take is a 405); a missing or wrong bearer token a
//! 401 when an API key is set; a body over the limit a 413. A client that goes away
//! aborts its request, which frees its KV blocks within a step. [`serve`] shuts down
//! gracefully: it stops accepting, lets the requests in flight finish for a grace
//! period, then ends the rest.
//!
//! Modules by job: `fields` (the table of each endpoint's fields), `field` (a body's
//! field as sent, and the checks of one field), `body` (request bodies and their
//! validation, with `chat_messages` for chat's `messages`, `structured` for the typed
//! structured-output fields, `request_tools` for chat's typed tools and `body_maps` for
//! `logit_bias` and `chat_template_kwargs`), `wire` (the OpenAI response bodies as
//! serde types; Anthropic's in `wire_anthropic`, the responses API's in
//! `wire_responses`), `error` (error responses), `generate` (the generation path:
//! admission, then a whole response (`whole`) or a stream (`stream`), formatted by `output`
//! for completions and chat, by `responses` and `messages` (which also read their own
//! bodies into the chat request, its typed content blocks in `anthropic_blocks`, `thinking`
//! and `output_config` in `anthropic_params`, the responses `input` in `responses_input`,
//! its `reasoning` and `include` in `responses_params`, both APIs' tools in `api_tools`;
//! their streams in `responses::stream` and `messages::stream`) for theirs), `tokenize`
//! (`/tokenize`, `/detokenize`), `metrics` (`/metrics`), `openapi` (`/openapi.json`),
//! `shutdown` ([`serve`] and its drain).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Path, Request as HttpRequest, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use encore_core::serve::EngineHandle;
use encore_core::tokenizer::Tokenizer;
use tokio::sync::watch;

mod anthropic_blocks;
mod anthropic_params;
mod api_tools;
mod body;
mod body_maps;
mod chat_messages;
mod error;
mod field;
mod fields;
mod generate;
mod generic_tools;
mod harmony;
mod messages;
mod metrics;
mod openapi;
mod output;
mod parse;
mod request_tools;
mod responses;
mod responses_input;
mod responses_params;
mod shutdown;
mod stream;
mod structured;
mod tokenize;
mod tools;
mod whole;
mod wire;
mod wire_anthropic;
mod wire_responses;

pub use parse::{ReasoningFormat, ToolFormat};
pub use shutdown::serve;

use error::ApiError;
use wire::{Model, ModelList};

/// What the server needs besides the engine.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The name `/v1/models` lists and requests must use.
    pub served_model_name: String,
    /// Bearer token every `/v1` request must carry, if set.
    pub api_key: Option<String>,
    /// Largest request body in bytes (413 above).
    pub max_body_bytes: usize,
    /// Default `max_tokens` of `/v1/completions` (OpenAI's and vLLM's is 16); chat
    /// completions and responses run to the context's end by default, as theirs.
    pub default_max_tokens: usize,
    /// Refuse new requests with 503 (and `Retry-After`) while this many wait in the
    /// engine's queue: the server's requests in the engine are at most its
    /// `max_num_seqs` plus this many, reserved atomically as each arrives; `None`: no
    /// limit.
    pub max_waiting: Option<usize>,
    /// The format tool calls are read in (`--tool-call-parser`); `None`: the one the chat
    /// template shows.
    pub tool_call_parser: Option<ToolFormat>,
    /// Split reasoning out of chat outputs (`--reasoning-parser`).
    pub reasoning_parser: Option<ReasoningFormat>,
}

/// What the server knows of the model's chat formats.
struct ChatFormats {
    /// The chat template renders `tools`.
    template_takes_tools: bool,
    /// How the model writes tool calls, if known.
    tool_format: Option<ToolFormat>,
    reasoning: Option<ReasoningFormat>,
    /// The chat template reads `enable_thinking` (Qwen3's switch).
    template_switches_thinking: bool,
    /// The chat template reads `reasoning_effort`.
    template_reads_effort: bool,
    /// The chat format is gpt-oss's harmony (`harmony`): encore renders the prompt, the
    /// output is read by channel.
    harmony: bool,
}

/// Shared by the handlers.
struct AppState {
    engine: Arc<EngineHandle>,
    tokenizer: Arc<Tokenizer>,
    eos: Vec<u32>,
    chat: ChatFormats,
    cfg: ServerConfig,
    next_id: AtomicU64,
    requests_total: AtomicU64,
    /// This server's requests in the engine (admission reserves their places here in one
    /// step: `generate::reserve`).
    in_engine: Arc<AtomicUsize>,
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
    let template = tokenizer.chat_template_source().unwrap_or("");
    // Harmony: asked for by either parser flag, or a tokenizer with its special tokens.
    let harmony = cfg.tool_call_parser == Some(ToolFormat::Harmony)
        || cfg.reasoning_parser == Some(ReasoningFormat::Harmony)
        || harmony::detect(&tokenizer);
    let chat = if harmony {
        ChatFormats {
            template_takes_tools: true,
            tool_format: Some(ToolFormat::Harmony),
            reasoning: Some(ReasoningFormat::Harmony),
            template_switches_thinking: false,
            template_reads_effort: true,
            harmony,
        }
    } else {
        ChatFormats {
            template_takes_tools: template.contains("tools"),
            tool_format: cfg
                .tool_call_parser
                .or_else(|| ToolFormat::detect(template)),
            reasoning: cfg.reasoning_parser,
            template_switches_thinking: template.contains("enable_thinking"),
            template_reads_effort: template.contains("reasoning_effort"),
            harmony,
        }
    };
    tracing::info!(
        "chat: tools {}, tool-call format {}, reasoning {}",
        if chat.template_takes_tools {
            "rendered"
        } else {
            "not rendered by the template (a generic tool prompt stands in)"
        },
        chat.tool_format.map_or("unknown", ToolFormat::name),
        chat.reasoning.map_or("not split", ReasoningFormat::name),
    );
    let state = Arc::new(AppState {
        engine,
        tokenizer,
        eos,
        chat,
        cfg,
        next_id: AtomicU64::new(1),
        requests_total: AtomicU64::new(0),
        in_engine: Arc::new(AtomicUsize::new(0)),
        draining: AtomicBool::new(false),
        cut: watch::Sender::new(false),
    });
    let v1 = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/models/{*model}", get(model))
        .route("/v1/completions", post(generate::completions))
        .route("/v1/chat/completions", post(generate::chat_completions))
        .route("/v1/responses", post(responses::create))
        .route("/v1/messages", post(messages::create))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    let router = Router::new()
        .merge(v1)
        .route("/health", get(health))
        .route("/metrics", get(metrics::metrics))
        .route("/openapi.json", get(openapi::openapi_json))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn(error::log_refusals))
        .with_state(Arc::clone(&state));
    App { router, state }
}

/// `ok`, or 503 with the reason once the engine serves no more requests (its
/// tensor-parallel group failed, or its loop ended).
async fn health(State(s): State<Arc<AppState>>) -> Response {
    match s.engine.unhealthy() {
        None => "ok".into_response(),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
    }
}

async fn auth(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    req: HttpRequest,
    next: Next,
) -> Response {
    if let Some(key) = &s.cfg.api_key {
        // OpenAI's clients send a bearer token, Anthropic's an `x-api-key`.
        let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
        let bearer = header(header::AUTHORIZATION).and_then(bearer_token);
        let given = [bearer, header(header::HeaderName::from_static("x-api-key"))];
        if !given.contains(&Some(key.as_str())) {
            let e = ApiError {
                status: StatusCode::UNAUTHORIZED,
                message: "missing or wrong API key (`Authorization: Bearer ...` or `x-api-key`)"
                    .into(),
                kind: "authentication_error",
                param: None,
            };
            return in_shape_of(req.uri().path(), e);
        }
    }
    next.run(req).await
}

/// The token of an `Authorization` header of the bearer scheme, whose name is
/// case-insensitive (RFC 9110: `bearer KEY` is as good as `Bearer KEY`).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(char::is_whitespace)?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start())
}

async fn models(State(s): State<Arc<AppState>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![model_object(&s)],
    })
}

/// The served model as OpenAI's model object (`/v1/models` lists it).
fn model_object(s: &AppState) -> Model {
    Model {
        id: s.cfg.served_model_name.clone(),
        object: "model",
        created: 0,
        owned_by: "encore",
        max_model_len: s.engine.max_seq_len,
    }
}

/// `GET /v1/models/{model}` (the openai client's `models.retrieve`): the model object,
/// or a 404 naming `model` (a name with `/`, such as `org/name`, is one path).
async fn model(State(s): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    if id == s.cfg.served_model_name {
        return Json(model_object(&s)).into_response();
    }
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!(
            "the model `{id}` does not exist; this server serves `{}`",
            s.cfg.served_model_name
        ),
        kind: "invalid_request_error",
        param: Some("model".into()),
    }
    .into_response()
}

/// A path no route serves: OpenAI's 404 error body (Anthropic's under `/v1/messages`).
async fn not_found(method: Method, uri: Uri) -> Response {
    let e = ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!("no such endpoint: {method} {}", uri.path()),
        kind: "invalid_request_error",
        param: None,
    };
    in_shape_of(uri.path(), e)
}

/// A route asked with a method it does not take: a 405 with the error body.
async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    let e = ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: format!("{} does not take the method {method}", uri.path()),
        kind: "invalid_request_error",
        param: None,
    };
    in_shape_of(uri.path(), e)
}

/// Error `e` in the shape of the API that serves `path`.
fn in_shape_of(path: &str, e: ApiError) -> Response {
    if path.starts_with("/v1/messages") {
        messages::error(e)
    } else {
        e.into_response()
    }
}
