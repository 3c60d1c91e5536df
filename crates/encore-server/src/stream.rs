//! A streamed answer: a task turns the engine's events into server-sent events, one per
//! token as vLLM sends them (its text may be empty while a character or a possible stop
//! string is incomplete, so clients can time every token), the last with the finish
//! reason, the usage chunk when asked for, then `[DONE]`. When the client goes away the
//! task ends and its guard aborts the request; at a shutdown's cut-off the stream ends
//! with an error event.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use encore_core::request::{Event, Output};
use encore_core::tokenizer::{StopMatcher, StopStream, Tokenizer};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::StreamExt;

use crate::error::ApiError;
use crate::generate::{AbortGuard, ChatOut, Form};
use crate::output::{finish_name, logprobs_json, release, Reply};
use crate::parse::{CallIds, ChatStream};
use crate::shutdown::cut_off;
use crate::AppState;

/// Answer an admitted request as a stream of its `events`.
pub(crate) fn respond(
    s: &AppState,
    events: mpsc::UnboundedReceiver<Event>,
    guard: AbortGuard,
    prompt: Vec<u32>,
    stop: StopMatcher,
    include_usage: bool,
    form: Form,
) -> Response {
    let Form { reply, chat } = form;
    let (out, out_rx) = mpsc::unbounded_channel::<String>();
    let keep_special = chat.as_ref().is_some_and(|c| c.keep_special);
    let parsed = chat.and_then(|c| {
        let ids = CallIds::new(c.id_seed, c.mistral_ids);
        let p = c.parser.clone()?;
        Some((ChatStream::new(p, ids), c))
    });
    let task = Task {
        keep_special,
        parsed,
        tokenizer: Arc::clone(&s.tokenizer),
        reply,
        include_usage,
        prompt_len: prompt.len(),
        out,
        guard,
        n: 0,
        offset: 0,
    };
    tokio::spawn(task.run(events, prompt, stop, s.cut.subscribe()));
    let data = UnboundedReceiverStream::new(out_rx)
        .map(|d| Ok::<_, Infallible>(SseEvent::default().data(d)));
    Sse::new(data).into_response()
}

/// The task that streams one request.
struct Task {
    /// The text holds special tokens (not the end-of-generation one).
    keep_special: bool,
    /// A chat output read by a parser.
    parsed: Option<(ChatStream, ChatOut)>,
    tokenizer: Arc<Tokenizer>,
    reply: Reply,
    include_usage: bool,
    prompt_len: usize,
    /// The SSE data payloads.
    out: mpsc::UnboundedSender<String>,
    guard: AbortGuard,
    /// Tokens sent so far.
    n: usize,
    /// The text offset of the next token's log-probabilities.
    offset: usize,
}

impl Task {
    async fn run(
        mut self,
        mut events: mpsc::UnboundedReceiver<Event>,
        prompt: Vec<u32>,
        stop: StopMatcher,
        cut: tokio::sync::watch::Receiver<bool>,
    ) {
        let tokenizer = Arc::clone(&self.tokenizer);
        let mut text = StopStream::new(&tokenizer, &prompt, stop);
        if self.keep_special {
            text = text.keep_special_tokens();
        }
        let cut = cut_off(cut);
        tokio::pin!(cut);
        loop {
            let ev = tokio::select! {
                ev = events.recv() => ev,
                _ = self.out.closed() => return,
                _ = &mut cut => {
                    // The guard aborts the request in the engine.
                    self.end_with(&ApiError::shutting_down().body());
                    return;
                }
            };
            let Some(ev) = ev else { return };
            let more = match ev {
                Event::Token(o) => self.token(&mut text, o),
                Event::Refused(r) => {
                    // A refusal is the request's fault; a failed step the server's.
                    self.guard.done = true;
                    let e = ApiError::bad(r.param.name(), r.message_naming(r.param.name()));
                    self.end_with(&e.body());
                    false
                }
                Event::Failed(e) => {
                    self.guard.done = true;
                    let e = json!({"error": {"message": e, "type": "server_error", "param": null, "code": null}});
                    self.end_with(&e);
                    false
                }
            };
            if !more {
                return;
            }
        }
    }

    /// Send the chunk of token `o`; whether the stream goes on.
    fn token(&mut self, text: &mut StopStream<'_>, o: Output) -> bool {
        self.n += 1;
        let (delta, stopped) = release(text, &o, self.keep_special);
        let mut finish = if stopped {
            Some("stop")
        } else {
            o.finish.map(finish_name)
        };
        let lps = match o.logprobs {
            Some(lp) => logprobs_json(
                &self.tokenizer,
                self.reply.kind,
                &[(o.token, lp)],
                &mut self.offset,
            ),
            None => Value::Null,
        };
        let c = match &mut self.parsed {
            Some((stream, out)) => {
                let d = stream.push(&delta, finish.is_some());
                finish = finish.map(|f| out.finish(f, stream.called()));
                self.reply.parsed_chunk(&d, finish, self.n == 1, lps)
            }
            None => self.reply.chunk(&delta, finish, self.n == 1, lps),
        };
        if self.out.send(c.to_string()).is_err() {
            return false;
        }
        if finish.is_none() {
            return true;
        }
        // A stop string ends the request here; the engine may still be running it: it
        // ends there as finished.
        self.guard.done = o.finish.is_some();
        if stopped {
            self.guard.stopped();
        }
        if self.include_usage {
            let u = self.reply.usage_chunk(self.prompt_len, self.n);
            let _ = self.out.send(u.to_string());
        }
        let _ = self.out.send("[DONE]".into());
        false
    }

    /// End the stream with an error event and `[DONE]`.
    fn end_with(&self, err: &Value) {
        let _ = self.out.send(err.to_string());
        let _ = self.out.send("[DONE]".into());
    }
}
