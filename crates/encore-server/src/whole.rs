//! A whole answer: collect an admitted request's tokens until its end (or the first stop
//! string, the text built as it streams), then answer with its text, token ids,
//! log-probabilities and usage. At a shutdown's cut-off the answer is a 503.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use encore_core::request::{Event, TokenLogprobs};
use encore_core::tokenizer::{StopMatcher, StopStream};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::generate::{AbortGuard, Api, ChatOut, Child, Ending, Form, Prompted};
use crate::output::{completion_logprobs, finish_name, logprobs_json, prompt_entries, release};
use crate::parse::{self, Parsed};
use crate::shutdown::cut_off;
use crate::AppState;
use crate::{messages, responses};

/// What a request produced until its end.
struct Collected {
    ids: Vec<u32>,
    logprobs: Vec<(u32, TokenLogprobs)>,
    /// The prompt's log-probabilities, when asked for (`echo` with `logprobs`).
    prompt_logprobs: Option<Vec<TokenLogprobs>>,
    /// Its text when stop strings built it as it streamed.
    text: Option<String>,
    finish: &'static str,
    /// The stop string that ended the text.
    stop_string: Option<String>,
}

/// Answer an admitted request whole, from the events of its `children` (one per choice).
pub(crate) async fn respond(
    s: &AppState,
    children: Vec<Child>,
    prompts: &[Prompted],
    stop: StopMatcher,
    form: Form,
) -> Response {
    let Form {
        reply,
        chat,
        score_only,
        api,
    } = form;
    let prompt = &prompts[0].ids;
    // Responses and messages: one output, written in their own shape.
    match (&chat, &api) {
        (Some(out), Api::Responses(echo)) => {
            return typed(s, children, prompt, stop, out, &api, |p, lps, end| {
                responses::whole(&s.tokenizer, &reply, echo, out, p, lps, end)
            })
            .await
        }
        (Some(out), Api::Messages { omit_thinking }) => {
            return typed(s, children, prompt, stop, out, &api, |p, _, end| {
                messages::whole(&reply, out, p, end, *omit_thinking)
            })
            .await
        }
        _ => {}
    }
    let keep_special = chat.as_ref().is_some_and(|c| c.keep_special);
    let mut choices = Vec::with_capacity(children.len());
    let mut completion = 0;
    // Each prompt's choices in order (`n` of them).
    let per_prompt = children.len() / prompts.len().max(1);
    let mut children = children.into_iter();
    // The choices run together in the engine; their events wait in their channels while
    // an earlier one is collected. A failure drops the rest, which aborts them.
    for (index, (guard, events)) in children.by_ref().enumerate() {
        let Prompted { ids: prompt, echo } = &prompts[index / per_prompt.max(1)];
        let c = match collect(s, events, guard, prompt, stop.clone(), keep_special).await {
            Ok(c) => c,
            Err(e) => return e.into_response(),
        };
        if score_only {
            // The prompt alone: the token the engine ran is left out.
            let lps = c.prompt_logprobs.as_ref().map(|scores| {
                completion_logprobs(&s.tokenizer, prompt_entries(prompt, scores), &mut 0)
            });
            let text = echo.clone().unwrap_or_default();
            choices.push(reply.choice(index, &text, &[], lps, "length", None));
            continue;
        }
        completion += c.ids.len();
        let decoded = match c.text {
            Some(t) => Ok(t),
            None => s.tokenizer.decode(&c.ids, true),
        };
        let text = match decoded {
            Ok(t) => t,
            Err(e) => {
                return ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
                    .into_response()
            }
        };
        let lps = match &c.prompt_logprobs {
            // `echo` with `logprobs`: the prompt's entries first.
            Some(scores) => {
                let generated = c.logprobs.iter().map(|(id, lp)| (*id, Some(lp)));
                let entries = prompt_entries(prompt, scores).chain(generated);
                Some(completion_logprobs(&s.tokenizer, entries, &mut 0))
            }
            None if c.logprobs.is_empty() => None,
            None => Some(logprobs_json(&s.tokenizer, reply.kind, &c.logprobs, &mut 0)),
        };
        let (message, finish) = match &chat {
            Some(
                out @ ChatOut {
                    parser: Some(p), ..
                },
            ) => {
                let parsed = p.parse(&text, true);
                let mut ids = out.call_ids(index);
                let m = parse::message(&parsed, &mut ids, out.reasoning);
                (Some(m), out.finish(c.finish, !parsed.calls.is_empty()))
            }
            _ => (None, c.finish),
        };
        let text = match echo {
            Some(e) => format!("{e}{text}"),
            None => text,
        };
        choices.push(reply.choice(index, &text, &c.ids, lps, finish, message));
    }
    // Each prompt counts once, whatever its `n`.
    let prompt_tokens = prompts.iter().map(|p| p.ids.len()).sum();
    reply.whole(choices, prompt_tokens, completion)
}

/// The answer to a responses or messages request: its one output, split by its parser and
/// written by `write` (the split, the tokens' log-probabilities, how it ended); an error
/// in `api`'s shape.
async fn typed<T: Serialize>(
    s: &AppState,
    children: Vec<Child>,
    prompt: &[u32],
    stop: StopMatcher,
    out: &ChatOut,
    api: &Api,
    write: impl FnOnce(&Parsed, &[(u32, TokenLogprobs)], &Ending) -> T,
) -> Response {
    match split(s, children, prompt, stop, out).await {
        Ok((parsed, logprobs, end)) => Json(write(&parsed, &logprobs, &end)).into_response(),
        Err(e) => api.error(e),
    }
}

/// The one output of a responses or messages request, split by its parser: the split,
/// the tokens' log-probabilities, and how it ended.
async fn split(
    s: &AppState,
    children: Vec<Child>,
    prompt: &[u32],
    stop: StopMatcher,
    out: &ChatOut,
) -> Result<(Parsed, Vec<(u32, TokenLogprobs)>, Ending), ApiError> {
    let (guard, events) = children
        .into_iter()
        .next()
        .ok_or_else(|| ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, "no output"))?;
    let c = collect(s, events, guard, prompt, stop, out.keep_special).await?;
    let text = match c.text {
        Some(t) => t,
        None => s
            .tokenizer
            .decode(&c.ids, true)
            .map_err(|e| ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?,
    };
    let parsed = match &out.parser {
        Some(p) => p.parse(&text, true),
        None => Parsed {
            content: text,
            ..Parsed::default()
        },
    };
    let end = Ending {
        finish: out.finish(c.finish, !parsed.calls.is_empty()),
        stop: c.stop_string,
        prompt: prompt.len(),
        completion: c.ids.len(),
    };
    Ok((parsed, c.logprobs, end))
}

/// Take the request's events until its end.
async fn collect(
    s: &AppState,
    mut events: mpsc::UnboundedReceiver<Event>,
    mut guard: AbortGuard,
    prompt: &[u32],
    stop: StopMatcher,
    keep_special: bool,
) -> Result<Collected, ApiError> {
    let mut ids = Vec::new();
    let mut logprobs: Vec<(u32, TokenLogprobs)> = Vec::new();
    let mut prompt_logprobs = None;
    let mut stop_string = None;
    // With stop strings the text is built as it streams, to end at the first one; with
    // special tokens, to leave out the end-of-generation one.
    let mut stop_text = (!stop.is_empty() || keep_special).then(|| {
        let t = StopStream::new(&s.tokenizer, prompt, stop).keep_special_tokens(keep_special);
        (t, String::new())
    });
    let cut = cut_off(s.cut.subscribe());
    tokio::pin!(cut);
    let finish = loop {
        let ev = tokio::select! {
            ev = events.recv() => ev,
            // The guard aborts the request in the engine.
            _ = &mut cut => return Err(ApiError::shutting_down()),
        };
        let o = match ev {
            Some(Event::Token(o)) => o,
            ended => {
                guard.done = true;
                return Err(match ended {
                    Some(Event::Refused(r)) => {
                        ApiError::bad(r.param.name(), r.message_naming(r.param.name()))
                    }
                    Some(Event::Failed(e)) => {
                        ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, e)
                    }
                    _ => ApiError::server(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "the engine dropped the request",
                    ),
                });
            }
        };
        ids.push(o.token);
        if let Some(lp) = o.logprobs.clone() {
            logprobs.push((o.token, lp));
        }
        if o.prompt_logprobs.is_some() {
            prompt_logprobs = o.prompt_logprobs.clone();
        }
        if let Some((t, acc)) = &mut stop_text {
            let (piece, stopped) = release(t, &o, keep_special);
            acc.push_str(&piece);
            if stopped {
                stop_string = t.matched().map(str::to_string);
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
    };
    drop(guard);
    Ok(Collected {
        ids,
        logprobs,
        prompt_logprobs,
        text: stop_text.map(|(_, acc)| acc),
        finish,
        stop_string,
    })
}
