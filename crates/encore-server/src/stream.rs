//! A streamed answer: a task turns the engine's events into server-sent events, one per
//! token as vLLM sends them (its text may be empty while a character or a possible stop
//! string is incomplete, so clients can time every token), each choice's last with its
//! finish reason (with `n` > 1 the choices' chunks interleave, each with its `index`),
//! a `usage` object on every chunk with vLLM's `continuous_usage_stats`, the usage chunk
//! when asked for, then `[DONE]` once every choice ended. When the client goes away the
//! task ends and its guard aborts the request; at a shutdown's cut-off the stream ends
//! with an error event.

use std::convert::Infallible;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use encore_core::request::{Event, Output, TokenLogprobs};
use encore_core::tokenizer::{StopMatcher, StopStream, Tokenizer};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::StreamExt;

use crate::body::StreamUsage;
use crate::error::ApiError;
use crate::generate::{AbortGuard, Api, ChatOut, Child, Ending, Form, Prompted, Typed};
use crate::output::{
    completion_logprobs, finish_name, logprobs_json, prompt_entries, release, Reply,
};
use crate::parse::{ChatStream, Delta};
use crate::shutdown::cut_off;
use crate::wire::Usage;
use crate::AppState;
use crate::{messages, responses};

/// Answer an admitted request as a stream of its `children`'s events (one per choice).
pub(crate) fn respond(
    s: &AppState,
    children: Vec<Child>,
    prompt: Prompted,
    stop: StopMatcher,
    usage: StreamUsage,
    form: Form,
) -> Response {
    let Form {
        reply,
        chat,
        score_only,
        api,
    } = form;
    let Prompted { ids: prompt, echo } = prompt;
    let (out, out_rx) = mpsc::unbounded_channel::<SseEvent>();
    let keep_special = chat.as_ref().is_some_and(|c| c.keep_special);
    // The choices' events, merged and tagged with their index.
    let (merged, events) = mpsc::unbounded_channel::<(usize, Event)>();
    let mut choices = Vec::with_capacity(children.len());
    for (index, (guard, mut rx)) in children.into_iter().enumerate() {
        let merged = merged.clone();
        tokio::spawn(async move {
            while let Some(e) = rx.recv().await {
                if merged.send((index, e)).is_err() {
                    return;
                }
            }
        });
        let parsed = chat.as_ref().and_then(|c| {
            let p = c.parser.clone()?;
            Some((ChatStream::new(p, c.call_ids(index)), c.clone()))
        });
        choices.push(Choice {
            guard,
            parsed,
            n: 0,
            offset: 0,
            done: false,
        });
    }
    let id_seed = chat.as_ref().map_or(0, |c| c.id_seed);
    let mut writer = match api {
        Api::OpenAi => None,
        Api::Responses(e) => Some(Writer::Responses(responses::Stream::new(
            e,
            id_seed,
            Arc::clone(&s.tokenizer),
        ))),
        Api::Messages { omit_thinking } => Some(Writer::Messages(messages::Stream::new(
            id_seed,
            omit_thinking,
        ))),
    };
    // The typed streams open before the first token.
    if let Some(w) = &mut writer {
        for e in w.start(&reply, prompt.len()) {
            let _ = out.send(typed_event(e));
        }
    }
    let task = Task {
        writer,
        echo,
        score_only,
        keep_special,
        tokenizer: Arc::clone(&s.tokenizer),
        reply,
        usage,
        prompt: prompt.into(),
        out,
        choices,
    };
    tokio::spawn(task.run(events, stop, s.cut.subscribe()));
    let data = UnboundedReceiverStream::new(out_rx).map(Ok::<_, Infallible>);
    Sse::new(data).into_response()
}

/// The server-sent event of a typed event.
fn typed_event((name, data): Typed) -> SseEvent {
    SseEvent::default().event(name).data(data.to_string())
}

/// The JSON text of a chunk (serializing these types cannot fail: their maps have string
/// keys).
fn to_json(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// How a responses or messages stream's typed events are written.
enum Writer {
    Responses(responses::Stream),
    Messages(messages::Stream),
}

impl Writer {
    /// The events that open the stream (a prompt of `prompt` tokens).
    fn start(&mut self, reply: &Reply, prompt: usize) -> Vec<Typed> {
        match self {
            Writer::Responses(w) => w.start(reply),
            Writer::Messages(w) => w.start(reply, prompt),
        }
    }

    /// The events of one token's output `d` (its log-probabilities `lp`).
    fn token(&mut self, d: &Delta, lp: Option<(u32, TokenLogprobs)>) -> Vec<Typed> {
        match self {
            Writer::Responses(w) => w.token(d, lp),
            Writer::Messages(w) => w.token(d),
        }
    }

    /// The events that end the stream.
    fn end(&mut self, reply: &Reply, end: &Ending) -> Vec<Typed> {
        match self {
            Writer::Responses(w) => w.end(reply, end),
            Writer::Messages(w) => w.end(end),
        }
    }

    /// The events of an error that ends the stream.
    fn error(&mut self, e: &ApiError) -> Vec<Typed> {
        match self {
            Writer::Responses(w) => w.error(e),
            Writer::Messages(w) => w.error(e),
        }
    }
}

/// The task that streams one request.
struct Task {
    /// `None`: completions' or chat's chunks, then `[DONE]`.
    writer: Option<Writer>,
    /// Completions' `echo`: each choice's first chunk starts with this prompt text.
    echo: Option<String>,
    /// `echo` with `max_tokens: 0`: each choice's one chunk is the prompt alone.
    score_only: bool,
    /// The text holds special tokens (not the end-of-generation one).
    keep_special: bool,
    tokenizer: Arc<Tokenizer>,
    reply: Reply,
    usage: StreamUsage,
    prompt: Arc<[u32]>,
    /// The events to send.
    out: mpsc::UnboundedSender<SseEvent>,
    choices: Vec<Choice>,
}

/// One choice of a streamed request.
struct Choice {
    guard: AbortGuard,
    /// A chat output read by a parser.
    parsed: Option<(ChatStream, ChatOut)>,
    /// Tokens sent so far.
    n: usize,
    /// The text offset of the next token's log-probabilities.
    offset: usize,
    /// Its last chunk went out.
    done: bool,
}

impl Task {
    async fn run(
        mut self,
        mut events: mpsc::UnboundedReceiver<(usize, Event)>,
        stop: StopMatcher,
        cut: tokio::sync::watch::Receiver<bool>,
    ) {
        let tokenizer = Arc::clone(&self.tokenizer);
        let prompt = Arc::clone(&self.prompt);
        let mut texts: Vec<StopStream<'_>> = (0..self.choices.len())
            .map(|_| {
                StopStream::new(&tokenizer, &prompt, stop.clone())
                    .keep_special_tokens(self.keep_special)
            })
            .collect();
        let cut = cut_off(cut);
        tokio::pin!(cut);
        loop {
            let ev = tokio::select! {
                ev = events.recv() => ev,
                _ = self.out.closed() => return,
                _ = &mut cut => {
                    // The guards abort the request's choices in the engine.
                    self.end_with(ApiError::shutting_down());
                    return;
                }
            };
            let Some((i, ev)) = ev else { return };
            let more = match ev {
                Event::Token(o) if self.writer.is_none() => self.token(i, &mut texts[i], o),
                Event::Token(o) => self.typed_token(i, &mut texts[i], o),
                Event::Refused(r) => {
                    // A refusal is the request's fault; a failed step the server's.
                    self.choices[i].guard.done = true;
                    let e = ApiError::bad(r.param.name(), r.message_naming(r.param.name()));
                    self.end_with(e);
                    false
                }
                Event::Failed(e) => {
                    self.choices[i].guard.done = true;
                    self.end_with(ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, e));
                    false
                }
            };
            if !more {
                return;
            }
        }
    }

    /// Send the chunk of token `o` of choice `i`; whether the stream goes on.
    fn token(&mut self, i: usize, text: &mut StopStream<'_>, o: Output) -> bool {
        let c = &mut self.choices[i];
        if c.done {
            // A step still in flight after a stop string.
            return true;
        }
        // Scoring the prompt alone: the token the engine ran is left out.
        let score_only = self.score_only;
        if !score_only {
            c.n += 1;
        }
        let (delta, stopped) = match score_only {
            true => (String::new(), false),
            false => release(text, &o, self.keep_special),
        };
        let mut finish = if score_only {
            Some("length")
        } else if stopped {
            Some("stop")
        } else {
            o.finish.map(finish_name)
        };
        let lps = match (&o.prompt_logprobs, o.logprobs) {
            // `echo` with `logprobs`: the prompt's entries come in the first chunk.
            (Some(scores), lp) => {
                let own = lp
                    .as_ref()
                    .filter(|_| !score_only)
                    .map(|lp| (o.token, Some(lp)));
                let entries = prompt_entries(&self.prompt, scores).chain(own);
                Some(completion_logprobs(&self.tokenizer, entries, &mut c.offset))
            }
            (None, Some(lp)) => Some(logprobs_json(
                &self.tokenizer,
                self.reply.kind,
                &[(o.token, lp)],
                &mut c.offset,
            )),
            (None, None) => None,
        };
        let first = c.n == 1 || score_only;
        let mut chunk = match &mut c.parsed {
            Some((stream, out)) => {
                let d = stream.push(&delta, finish.is_some());
                finish = finish.map(|f| out.finish(f, stream.called()));
                self.reply.parsed_chunk(i, &d, finish, first, lps)
            }
            None => match (&self.echo, first) {
                (Some(e), true) => self
                    .reply
                    .chunk(i, &format!("{e}{delta}"), finish, first, lps),
                _ => self.reply.chunk(i, &delta, finish, first, lps),
            },
        };
        if self.usage.every {
            // vLLM's `continuous_usage_stats`: the choice's tokens so far.
            chunk.set_usage(Usage::new(self.prompt.len(), c.n));
        }
        if self
            .out
            .send(SseEvent::default().data(to_json(&chunk)))
            .is_err()
        {
            return false;
        }
        if finish.is_none() {
            return true;
        }
        // A stop string ends the choice here; the engine may still be running it: it
        // ends there as finished.
        c.done = true;
        c.guard.done = o.finish.is_some();
        if stopped {
            c.guard.stopped();
        }
        if self.choices.iter().any(|c| !c.done) {
            return true;
        }
        if self.usage.last {
            let tokens = self.choices.iter().map(|c| c.n).sum();
            let u = self.reply.usage_chunk(self.prompt.len(), tokens);
            let _ = self.send(to_json(&u));
        }
        let _ = self.send("[DONE]".into());
        false
    }

    /// Send the event of data `d`.
    fn send(&self, d: String) -> Result<(), ()> {
        self.out.send(SseEvent::default().data(d)).map_err(|_| ())
    }

    /// Send the events of token `o` of a responses or messages stream (one choice);
    /// whether the stream goes on.
    fn typed_token(&mut self, i: usize, text: &mut StopStream<'_>, o: Output) -> bool {
        let c = &mut self.choices[i];
        if c.done {
            return true;
        }
        c.n += 1;
        let (piece, stopped) = release(text, &o, self.keep_special);
        let finish = if stopped {
            Some("stop")
        } else {
            o.finish.map(finish_name)
        };
        let (d, finish) = match &mut c.parsed {
            Some((stream, out)) => {
                let d = stream.push(&piece, finish.is_some());
                (d, finish.map(|f| out.finish(f, stream.called())))
            }
            None => {
                let d = Delta {
                    content: piece,
                    ..Delta::default()
                };
                (d, finish)
            }
        };
        let Some(w) = &mut self.writer else {
            return false;
        };
        let mut events = w.token(&d, o.logprobs.map(|lp| (o.token, lp)));
        if let Some(finish) = finish {
            let end = Ending {
                finish,
                stop: text.matched().map(str::to_string),
                prompt: self.prompt.len(),
                completion: c.n,
            };
            events.extend(w.end(&self.reply, &end));
            c.done = true;
            c.guard.done = o.finish.is_some();
            if stopped {
                c.guard.stopped();
            }
        }
        for e in events {
            if self.out.send(typed_event(e)).is_err() {
                return false;
            }
        }
        finish.is_none()
    }

    /// End the stream with error `e`: an error event (and `[DONE]` for chunks).
    fn end_with(&mut self, e: ApiError) {
        match &mut self.writer {
            None => {
                let _ = self.send(to_json(&e.body()));
                let _ = self.send("[DONE]".into());
            }
            Some(w) => {
                for ev in w.error(&e) {
                    let _ = self.out.send(typed_event(ev));
                }
            }
        }
    }
}
