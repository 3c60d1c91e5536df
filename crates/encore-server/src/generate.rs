//! The generation endpoints, `/v1/completions` and `/v1/chat/completions`: validate the
//! body, turn it into a prompt and a [`Request`], have the engine admit it (a refusal is
//! a 400 naming the parameter, whether or not the request streams), then answer whole
//! (`whole`) or as a stream (`stream`). An [`AbortGuard`] aborts the request in the engine
//! when its answer is dropped before the end (a client that went away).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use encore_core::request::{Event, Refusal, Request};
use encore_core::serve::EngineHandle;
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, oneshot};

use encore_core::tokenizer::{ChatMessage, ChatOptions};

use crate::body::{read, Chat, ChatBody, Common, CompletionBody, DefaultLength, PromptInput};
use crate::error::ApiError;
use crate::fields;
use crate::generic_tools;
use crate::output::{Kind, Reply};
use crate::parse::{CallIds, CallMode, ChatParser, ToolFormat};
use crate::tools::ToolChoice;
use crate::AppState;

pub(crate) async fn completions(
    State(s): State<Arc<AppState>>,
    body: Result<Json<Value>, JsonRejection>,
) -> Response {
    let valid = read::<CompletionBody>(body, fields::COMPLETIONS)
        .and_then(|b| b.validate(&s.cfg.served_model_name, &s.eos))
        .and_then(|(prompts, c)| {
            let prompts = prompts
                .into_iter()
                .map(|p| prompted(&s, p, c.echo))
                .collect::<Result<Vec<_>, _>>()?;
            Ok((prompts, c))
        });
    match valid {
        Ok((prompts, c)) => generate_all(s, c, prompts, Kind::Completion, None, Api::OpenAi).await,
        Err(e) => e.into_response(),
    }
}

/// A completion's prompt as token ids, and with `echo` the text its choices start with:
/// the prompt as given, or its token ids written out.
fn prompted(s: &AppState, prompt: PromptInput, echo: bool) -> Result<Prompted, ApiError> {
    let (ids, text) = match prompt {
        PromptInput::Ids(ids) => (ids, None),
        PromptInput::Text(p) => {
            let ids = s
                .tokenizer
                .encode(&p, true)
                .map_err(|e| ApiError::bad("prompt", e.to_string()))?;
            (ids, Some(p))
        }
    };
    let echo = match (echo, text) {
        (false, _) => None,
        (true, Some(t)) => Some(t),
        (true, None) => Some(
            s.tokenizer
                .decode(&ids, false)
                .map_err(|e| ApiError::bad("prompt", e.to_string()))?,
        ),
    };
    Ok(Prompted { ids, echo })
}

/// One prompt of a request: its token ids, and for completions' `echo` the text its
/// choices start with.
pub(crate) struct Prompted {
    pub ids: Vec<u32>,
    pub echo: Option<String>,
}

pub(crate) async fn chat_completions(
    State(s): State<Arc<AppState>>,
    body: Result<Json<Value>, JsonRejection>,
) -> Response {
    let valid = read::<ChatBody>(body, fields::CHAT)
        .and_then(|b| b.validate(&s.cfg.served_model_name, &s.eos))
        .and_then(|chat| chat_prompt(&s, chat));
    match valid {
        Ok((prompt, c, out)) => generate(s, c, prompt, Kind::Chat, Some(out), Api::OpenAi).await,
        Err(e) => e.into_response(),
    }
}

/// A chat request's prompt (the conversation and its tools rendered by the template), its
/// common fields, and how its output is read.
pub(crate) fn chat_prompt(
    s: &AppState,
    chat: Chat,
) -> Result<(Vec<u32>, Common, ChatOut), ApiError> {
    let Chat {
        messages,
        tools,
        mut kwargs,
        effort,
        mut common,
    } = chat;
    if let Some(e) = effort {
        // Harmony's system message and templates that read it take it; elsewhere it
        // would change nothing, so it is refused.
        if !s.chat.template_reads_effort {
            return Err(ApiError::bad(
                "reasoning_effort",
                "`reasoning_effort` is not supported for this model: neither its chat \
                 template nor its chat format reads one",
            ));
        }
        kwargs.insert("reasoning_effort".into(), json!(e));
    }
    // `tool_choice: none`: the tools are not shown and nothing is read as a call.
    let tools = tools.filter(|t| t.choice != ToolChoice::None);
    // A template that renders no tools gets the generic tool prompt (`generic_tools`).
    let generic = !s.chat.template_takes_tools;
    let calls = match &tools {
        None => None,
        Some(t) => Some(match &t.choice {
            ToolChoice::Required => CallMode::Required,
            ToolChoice::Named(name) => CallMode::Named(name.clone()),
            _ if generic => CallMode::Generic,
            _ => match s.chat.tool_format {
                Some(f) => CallMode::Native(f),
                None => {
                    return Err(ApiError::bad(
                        "tools",
                        "no tool-call format is known for this model's chat template: \
                             start the server with `--tool-call-parser`",
                    ))
                }
            },
        }),
    };
    let first_only = tools.as_ref().is_some_and(|t| !t.parallel);
    if s.chat.harmony {
        crate::harmony::constrain(&s.tokenizer, &mut common, tools.as_ref())?;
    }
    let defs = tools.map(|t| t.defs);
    let (messages, defs) = generic_tools::for_template(s, messages, defs);
    let opts = ChatOptions {
        add_generation_prompt: true,
        tools: defs,
        kwargs,
    };
    let text = render(s, &messages, &opts)?;
    let ids = s
        .tokenizer
        .encode(&text, false)
        .map_err(|e| ApiError::bad("messages", e.to_string()))?;
    if s.chat.harmony {
        return Ok(harmony_out(s, ids, common, calls, first_only));
    }
    // Reasoning the template opened in the prompt is already under way.
    let think = s
        .chat
        .reasoning
        .map(|_| text.trim_end().ends_with("<think>"));
    let out = ChatOut {
        // Markers such as `[TOOL_CALLS]` and `<|python_tag|>` are special tokens.
        keep_special: matches!(calls, Some(CallMode::Native(_))),
        mistral_ids: s.chat.tool_format == Some(ToolFormat::Mistral),
        parser: (think.is_some() || calls.is_some()).then_some(ChatParser {
            think,
            calls,
            first_only,
            harmony: false,
        }),
        reasoning: think.is_some(),
        id_seed: 0,
    };
    Ok((ids, common, out))
}

/// The prompt of `messages` rendered as the model's chat format: harmony's renderer, or
/// the chat template.
pub(crate) fn render(
    s: &AppState,
    messages: &[ChatMessage],
    opts: &ChatOptions,
) -> Result<String, ApiError> {
    if s.chat.harmony {
        return crate::harmony::render(messages, opts);
    }
    s.tokenizer
        .render_chat(messages, opts)
        .map_err(|e| ApiError::bad("messages", e.to_string()))
}

/// How a harmony output is read: by channel, with its special tokens, the turn ending at
/// `<|return|>` or `<|call|>` (a forced call's grammar writes harmony too:
/// `harmony::constrain`; `calls` stays for the finish reason of a named function).
fn harmony_out(
    s: &AppState,
    ids: Vec<u32>,
    mut common: Common,
    calls: Option<CallMode>,
    first_only: bool,
) -> (Vec<u32>, Common, ChatOut) {
    if !common.params.ignore_eos {
        for id in crate::harmony::stop_ids(&s.tokenizer) {
            if !common.params.stop_token_ids.contains(&id) {
                common.params.stop_token_ids.push(id);
            }
        }
    }
    let out = ChatOut {
        keep_special: true,
        mistral_ids: false,
        parser: Some(ChatParser {
            think: None,
            calls,
            first_only,
            harmony: true,
        }),
        reasoning: true,
        id_seed: 0,
    };
    (ids, common, out)
}

/// Turn the model's thinking on or off (`param` names the request field that asks): on
/// needs the reasoning parser, to split it out; off needs a template with an
/// `enable_thinking` switch, unless the model does not think (no parser).
pub(crate) fn thinking_switch(
    s: &AppState,
    on: bool,
    param: &'static str,
    kwargs: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    let parser = s.chat.reasoning.is_some();
    if on && !parser {
        return Err(ApiError::bad(
            param,
            format!(
                "`{param}` asks for reasoning, which this server does not split out: start \
                 it with `--reasoning-parser`"
            ),
        ));
    }
    if s.chat.template_switches_thinking {
        kwargs.insert("enable_thinking".into(), json!(on));
    } else if !on && parser {
        return Err(ApiError::bad(
            param,
            format!(
                "`{param}` asks for no reasoning, but this model's chat template has no \
                 `enable_thinking` switch to turn it off"
            ),
        ));
    }
    Ok(())
}

/// How an answer is written: what its every part repeats, and for chat how its output
/// is read.
pub(crate) struct Form {
    pub reply: Reply,
    pub chat: Option<ChatOut>,
    /// Completions' `echo` with `max_tokens: 0` (see [`Common::score_only`]).
    pub score_only: bool,
    pub api: Api,
}

/// The API an answer is written in.
pub(crate) enum Api {
    /// Completions or chat completions (the reply's kind says which).
    OpenAi,
    /// OpenAI's responses, with what the response object repeats of its request.
    Responses(Box<crate::responses::Echo>),
    /// Anthropic's messages; `omit_thinking`: thinking blocks come without their text
    /// (`thinking.display: "omitted"`).
    Messages { omit_thinking: bool },
}

impl Api {
    /// The response of error `e` in this API's shape.
    pub fn error(&self, e: ApiError) -> Response {
        match self {
            Api::Messages { .. } => crate::messages::error(e),
            _ => e.into_response(),
        }
    }
}

/// A typed server-sent event of the responses and messages APIs: its name, and its data.
pub(crate) type Typed = (&'static str, Value);

/// How one output ended, as the responses and messages APIs report it.
pub(crate) struct Ending {
    /// The finish reason's OpenAI name (`stop`, `length`, `tool_calls`, `abort`).
    pub finish: &'static str,
    /// The stop string that ended the text.
    pub stop: Option<String>,
    /// Tokens of the prompt and of the output.
    pub prompt: usize,
    pub completion: usize,
}

/// How a chat request's output is read and answered.
#[derive(Clone)]
pub(crate) struct ChatOut {
    /// `None`: the text is all content.
    pub parser: Option<ChatParser>,
    /// Decode with special tokens (the end-of-generation token excepted).
    pub keep_special: bool,
    /// Tool-call ids of Mistral's shape.
    pub mistral_ids: bool,
    /// Answer with `reasoning_content`.
    pub reasoning: bool,
    /// Seeds the tool-call ids.
    pub id_seed: u64,
}

impl ChatOut {
    /// An output read as plain content, its ids seeded by `id_seed` (the writers' tests).
    #[cfg(test)]
    pub fn plain(id_seed: u64) -> Self {
        ChatOut {
            parser: None,
            keep_special: false,
            mistral_ids: false,
            reasoning: false,
            id_seed,
        }
    }

    /// The tool-call ids of choice `index`.
    pub fn call_ids(&self, index: usize) -> CallIds {
        let seed = self.id_seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        CallIds::new(seed, self.mistral_ids)
    }

    /// The finish reason of an output that ended as `finish` with `called` tool calls:
    /// `tool_calls` when the model chose to call (not for a named function, as OpenAI).
    pub fn finish(&self, finish: &'static str, called: bool) -> &'static str {
        let named = matches!(
            self.parser,
            Some(ChatParser {
                calls: Some(CallMode::Named(_)),
                ..
            })
        );
        if called && finish == "stop" && !named {
            "tool_calls"
        } else {
            finish
        }
    }
}

/// Admit a valid request of `prompt` and answer it in `api`, whole or streamed.
pub(crate) async fn generate(
    s: Arc<AppState>,
    c: Common,
    prompt: Vec<u32>,
    kind: Kind,
    chat: Option<ChatOut>,
    api: Api,
) -> Response {
    let prompt = Prompted {
        ids: prompt,
        echo: None,
    };
    generate_all(s, c, vec![prompt], kind, chat, api).await
}

/// Admit a valid request of `prompts` (`n` choices each, in order: choice `i * n + j` is
/// sample `j` of prompt `i`) and answer it in `api`, whole or streamed (one prompt).
pub(crate) async fn generate_all(
    s: Arc<AppState>,
    mut c: Common,
    mut prompts: Vec<Prompted>,
    kind: Kind,
    chat: Option<ChatOut>,
    api: Api,
) -> Response {
    s.requests_total.fetch_add(1, Ordering::Relaxed);
    let n = c.n;
    let mut slots = match reserve(&s, n * prompts.len()) {
        Ok(slots) => slots,
        Err((e, retry)) => {
            let mut r = api.error(e);
            if retry {
                r.headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            }
            return r;
        }
    };
    c.params.sampling.seed = c.seed.unwrap_or_else(|| {
        s.next_id
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
    });
    // `n` samples of each prompt: one request each, in order, sharing their prompt
    // (computed once).
    let first = s
        .next_id
        .fetch_add((n * prompts.len()) as u64, Ordering::Relaxed);
    let mut children = Vec::with_capacity(n * prompts.len());
    for (p, prompt) in prompts.iter().enumerate() {
        let mut params = c.params.clone();
        params.max_tokens = c.max_tokens.unwrap_or_else(|| {
            // Not asked for: as many as the context and the cache leave (a prompt that
            // leaves none is admission's to refuse), up to the server's default where
            // the endpoint has one.
            let room = s.engine.max_seq_len.min(s.engine.kv_capacity_tokens);
            let room = room.saturating_sub(prompt.ids.len()).max(1);
            match c.default_length {
                DefaultLength::Server => s.cfg.default_max_tokens.min(room),
                DefaultLength::Context => room,
            }
        });
        let group = first + (p * n) as u64;
        for i in 0..n {
            let mut params = params.clone();
            params.sampling.seed = params.sampling.seed.wrapping_add(i as u64);
            params.share_prompt = (n > 1).then_some(group);
            let req = Request {
                id: group + i as u64,
                prompt: prompt.ids.clone(),
                params,
            };
            let slot = slots.pop().expect("a slot per sample");
            // A refusal drops the children already admitted, which aborts them.
            match admit(&s.engine, req, slot).await {
                Ok(x) => children.push(x),
                Err(Admission::Refused(r)) => return api.error(ApiError::refused(&r, c.names)),
                Err(Admission::Failed(e)) => return api.error(e),
            }
        }
    }
    let reply = Reply::new(kind, first, s.cfg.served_model_name.clone());
    let chat = chat.map(|mut c| {
        c.id_seed = reply.created.rotate_left(32) ^ first.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        c
    });
    let form = Form {
        reply,
        chat,
        score_only: c.score_only,
        api,
    };
    match prompts.pop() {
        Some(one) if c.stream && prompts.is_empty() => {
            crate::stream::respond(&s, children, one, c.stop, c.usage, form)
        }
        Some(last) => {
            prompts.push(last);
            crate::whole::respond(&s, children, &prompts, c.stop, form).await
        }
        None => ApiError::bad("prompt", "`prompt` is required").into_response(),
    }
}

/// One admitted choice of a request: the guard that aborts it, and its events.
pub(crate) type Child = (AbortGuard, mpsc::UnboundedReceiver<Event>);

/// One request's place in the engine, held from admission to its end: while
/// `--max-waiting` is set, the server's requests in the engine number at most
/// `max_num_seqs` running plus that many waiting.
pub(crate) struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The engine's places for the `n` samples of a request, taken in one step (so a burst
/// of requests cannot all pass the check before any is counted); a 503 when the server
/// drains or its queue is full (then with `Retry-After`: `true`). The engine's count of
/// waiting requests, as of its last step, is checked too: requests wait there beyond
/// `max_num_seqs` when the KV cache is short.
fn reserve(s: &AppState, n: usize) -> Result<Vec<Slot>, (ApiError, bool)> {
    if s.draining.load(Ordering::SeqCst) {
        return Err((ApiError::shutting_down(), false));
    }
    let full = |waiting: usize| {
        let e = ApiError::server(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the server is at capacity ({waiting} requests waiting); retry shortly"),
        );
        (e, true)
    };
    match s.cfg.max_waiting {
        None => {
            s.in_engine.fetch_add(n, Ordering::AcqRel);
        }
        Some(limit) => {
            let waiting = s.engine.metrics.requests_waiting.load(Ordering::Relaxed) as usize;
            if waiting >= limit {
                return Err(full(waiting));
            }
            let cap = s.engine.max_num_seqs + limit;
            s.in_engine
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                    (held + n <= cap).then_some(held + n)
                })
                .map_err(|held| full((held + n).saturating_sub(s.engine.max_num_seqs)))?;
        }
    }
    Ok((0..n).map(|_| Slot(Arc::clone(&s.in_engine))).collect())
}

/// Why a request did not get into the engine.
enum Admission {
    Refused(Refusal),
    Failed(ApiError),
}

/// Submit `req` and wait for admission's verdict: the request's events and the guard
/// that aborts it, or its refusal.
async fn admit(
    engine: &Arc<EngineHandle>,
    req: Request,
    slot: Slot,
) -> Result<(AbortGuard, mpsc::UnboundedReceiver<Event>), Admission> {
    let id = req.id;
    let (tx, rx) = mpsc::unbounded_channel::<Event>();
    let (verdict_tx, verdict_rx) = oneshot::channel();
    let stopped = Arc::new(AtomicBool::new(false));
    // After a stop string the reader goes away on purpose and a `finish` message is on
    // its way: the tokens of a step still in flight must not abort the request.
    let sink = {
        let stopped = Arc::clone(&stopped);
        Box::new(move |e| tx.send(e).is_ok() || stopped.load(Ordering::Relaxed))
    };
    let verdict = Box::new(move |v| {
        let _ = verdict_tx.send(v);
    });
    if let Err(e) = engine.submit_with_verdict(req, sink, verdict) {
        let e = ApiError::server(StatusCode::SERVICE_UNAVAILABLE, e.to_string());
        return Err(Admission::Failed(e));
    }
    // Made before waiting: a client that leaves meanwhile aborts the request.
    let mut guard = AbortGuard {
        engine: Arc::clone(engine),
        id,
        done: false,
        stopped,
        _slot: slot,
    };
    match verdict_rx.await {
        Ok(Ok(())) => Ok((guard, rx)),
        Ok(Err(r)) => {
            guard.done = true;
            Err(Admission::Refused(r))
        }
        Err(_) => {
            guard.done = true;
            let e = ApiError::server(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the engine dropped the request",
            );
            Err(Admission::Failed(e))
        }
    }
}

/// Aborts the request when dropped before its end (a client that went away).
pub(crate) struct AbortGuard {
    engine: Arc<EngineHandle>,
    id: u64,
    /// Set once the request ended in the engine (nothing to abort).
    pub done: bool,
    /// Set when a stop string ended the text (shared with the request's sink).
    stopped: Arc<AtomicBool>,
    /// Its place in the engine, given back with the guard.
    _slot: Slot,
}

impl AbortGuard {
    /// The request's text reached a stop string: end it in the engine as finished.
    pub fn stopped(&mut self) {
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
