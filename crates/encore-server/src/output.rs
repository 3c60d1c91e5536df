//! The OpenAI response shapes both ways of answering share: the chunk of a streamed
//! token, the usage object, the log-probability objects, the finish reason's name, and
//! the text a token releases past the stop strings.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::response::{IntoResponse, Response};
use axum::Json;
use encore_core::request::{FinishReason, Output, TokenLogprobs};
use encore_core::tokenizer::{StopStream, Tokenizer};
use serde_json::json;

use crate::parse::Delta;
use crate::wire::{
    ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionResponse, ChatDelta,
    ChatLogprobs, ChatMessageOut, ChatTokenLogprob, Choice, Chunk, CompletionChoice,
    CompletionChunk, CompletionChunkChoice, CompletionLogprobs, CompletionResponse, Logprobs,
    TopLogprob, Usage,
};

/// Which endpoint a request came through.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Completion,
    Chat,
}

/// What every response or chunk of one request repeats.
pub(crate) struct Reply {
    pub kind: Kind,
    /// `cmpl-N` or `chatcmpl-N`.
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Reply {
    /// The reply to request `id` of `kind`, created now.
    pub fn new(kind: Kind, id: u64, model: String) -> Self {
        let id = match kind {
            Kind::Completion => format!("cmpl-{id}"),
            Kind::Chat => format!("chatcmpl-{id}"),
        };
        Reply {
            kind,
            id,
            created: now_secs(),
            model,
        }
    }

    /// The `object` of a whole response.
    pub fn object(&self) -> &'static str {
        match self.kind {
            Kind::Completion => "text_completion",
            Kind::Chat => "chat.completion",
        }
    }

    /// The `object` of a streamed chunk.
    pub fn chunk_object(&self) -> &'static str {
        match self.kind {
            Kind::Completion => "text_completion",
            Kind::Chat => "chat.completion.chunk",
        }
    }

    /// The chunk of one streamed chat token whose output is read by a parser: its
    /// reasoning, content and tool-call deltas (`{"content": ""}` when it has none), the
    /// finish reason on the last, the role on the first.
    pub fn parsed_chunk(
        &self,
        index: usize,
        d: &Delta,
        finish: Option<&str>,
        first: bool,
        logprobs: Option<Logprobs>,
    ) -> Chunk {
        let delta = ChatDelta {
            role: first.then_some("assistant"),
            reasoning_content: (!d.reasoning.is_empty()).then(|| d.reasoning.clone()),
            content: (!d.content.is_empty() || d.is_empty()).then(|| d.content.clone()),
            tool_calls: (!d.calls.is_empty()).then(|| d.calls.clone()),
        };
        let choice = ChatChunkChoice {
            index,
            delta,
            logprobs,
            finish_reason: finish.map(str::to_string),
        };
        self.chat_chunk(vec![choice])
    }

    fn chat_chunk(&self, choices: Vec<ChatChunkChoice>) -> Chunk {
        Chunk::Chat(ChatCompletionChunk {
            id: self.id.clone(),
            object: self.chunk_object(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage: None,
        })
    }

    fn completion_chunk(&self, choices: Vec<CompletionChunkChoice>) -> Chunk {
        Chunk::Completion(CompletionChunk {
            id: self.id.clone(),
            object: self.chunk_object(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage: None,
        })
    }

    /// The chunk of one streamed token of choice `index`: its text `delta`, the finish
    /// reason on the last, the role on chat's first.
    pub fn chunk(
        &self,
        index: usize,
        delta: &str,
        finish: Option<&str>,
        first: bool,
        logprobs: Option<Logprobs>,
    ) -> Chunk {
        if self.kind == Kind::Chat {
            let d = Delta {
                content: delta.to_string(),
                ..Delta::default()
            };
            return self.parsed_chunk(index, &d, finish, first, logprobs);
        }
        self.completion_chunk(vec![CompletionChunkChoice {
            index,
            text: delta.to_string(),
            logprobs,
            finish_reason: finish.map(str::to_string),
        }])
    }

    /// The last chunk of a stream that asked for usage.
    pub fn usage_chunk(&self, prompt: usize, completion: usize) -> Chunk {
        let mut c = match self.kind {
            Kind::Completion => self.completion_chunk(Vec::new()),
            Kind::Chat => self.chat_chunk(Vec::new()),
        };
        c.set_usage(Usage::new(prompt, completion));
        c
    }

    /// Choice `index` of a whole response: `text` (its token `ids`), ended by `finish`;
    /// a chat's `message` when a parser read the text.
    pub fn choice(
        &self,
        index: usize,
        text: &str,
        ids: &[u32],
        logprobs: Option<Logprobs>,
        finish: &str,
        message: Option<ChatMessageOut>,
    ) -> Choice {
        let (finish_reason, token_ids) = (finish.to_string(), ids.to_vec());
        match self.kind {
            Kind::Completion => Choice::Completion(CompletionChoice {
                index,
                text: text.to_string(),
                logprobs,
                finish_reason,
                token_ids,
            }),
            Kind::Chat => Choice::Chat(ChatChoice {
                index,
                message: message.unwrap_or_else(|| ChatMessageOut::text(text)),
                logprobs,
                finish_reason,
                token_ids,
            }),
        }
    }

    /// A whole response of `choices`, with the usage of a `prompt` of so many tokens and
    /// `completion` tokens over all choices.
    pub fn whole(&self, choices: Vec<Choice>, prompt: usize, completion: usize) -> Response {
        let usage = Usage::new(prompt, completion);
        let (id, object, created, model) = (
            self.id.clone(),
            self.object(),
            self.created,
            self.model.clone(),
        );
        match self.kind {
            Kind::Completion => {
                let choices = choices
                    .into_iter()
                    .filter_map(|c| match c {
                        Choice::Completion(c) => Some(c),
                        Choice::Chat(_) => None,
                    })
                    .collect();
                Json(CompletionResponse {
                    id,
                    object,
                    created,
                    model,
                    choices,
                    usage,
                })
                .into_response()
            }
            Kind::Chat => {
                let choices = choices
                    .into_iter()
                    .filter_map(|c| match c {
                        Choice::Chat(c) => Some(c),
                        Choice::Completion(_) => None,
                    })
                    .collect();
                Json(ChatCompletionResponse {
                    id,
                    object,
                    created,
                    model,
                    choices,
                    usage,
                })
                .into_response()
            }
        }
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The OpenAI name of a finish reason.
pub(crate) fn finish_name(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Eos | FinishReason::StopString => "stop",
        FinishReason::Length | FinishReason::Context => "length",
        FinishReason::Stopped => "abort",
    }
}

/// The text output `o` releases, and whether a stop string ended the text there; after
/// the engine's final token everything held back is released. `keep_special`: the text
/// holds special tokens, but not the end-of-generation token that ended it.
pub(crate) fn release(text: &mut StopStream<'_>, o: &Output, keep_special: bool) -> (String, bool) {
    if keep_special && o.finish == Some(FinishReason::Eos) {
        let rest = text.finish();
        return (rest, text.stopped());
    }
    let (token, last) = (o.token, o.finish.is_some());
    let mut out = text.push(token);
    if last && !out.stopped {
        out.text.push_str(&text.finish());
        out.stopped = text.stopped();
    }
    (out.text, out.stopped)
}

/// The text of one token for log-probability entries (invalid UTF-8 of a partial
/// character is replaced).
fn token_text(tok: &Tokenizer, id: u32) -> String {
    tok.decode(&[id], false).unwrap_or_default()
}

/// Completions' `logprobs` object `{tokens, token_logprobs, top_logprobs, text_offset}`
/// of `entries`, offsets from `*offset` (advanced past the tokens); an entry without
/// log-probabilities (an echoed prompt's first token) has `null` for both.
pub(crate) fn completion_logprobs<'a>(
    tok: &Tokenizer,
    entries: impl Iterator<Item = (u32, Option<&'a TokenLogprobs>)>,
    offset: &mut usize,
) -> Logprobs {
    let mut out = CompletionLogprobs::default();
    for (id, lp) in entries {
        let text = token_text(tok, id);
        out.text_offset.push(*offset);
        *offset += text.len();
        out.tokens.push(text);
        let Some(lp) = lp else {
            out.token_logprobs.push(None);
            out.top_logprobs.push(None);
            continue;
        };
        out.token_logprobs.push(Some(f64::from(lp.logprob)));
        // Keyed by text: of tokens with the same text the likelier stays.
        let mut top = serde_json::Map::new();
        for &(t, l) in &lp.top {
            top.entry(token_text(tok, t)).or_insert(json!(l));
        }
        out.top_logprobs.push(Some(top));
    }
    Logprobs::Completion(out)
}

/// The entries of an echoed prompt with its log-probabilities (`scores`: one per token
/// after the first), for [`completion_logprobs`].
pub(crate) fn prompt_entries<'a>(
    prompt: &'a [u32],
    scores: &'a [TokenLogprobs],
) -> impl Iterator<Item = (u32, Option<&'a TokenLogprobs>)> + 'a {
    let first = prompt.first().map(|&t| (t, None));
    let rest = prompt
        .iter()
        .skip(1)
        .zip(scores)
        .map(|(&t, lp)| (t, Some(lp)));
    first.into_iter().chain(rest)
}

/// The OpenAI `logprobs` object of `entries` (tokens with their log-probabilities):
/// completions' `{tokens, token_logprobs, top_logprobs, text_offset}` with offsets from
/// `*offset` (advanced past the tokens), chat's `{content: [{token, logprob, bytes,
/// top_logprobs}]}`.
pub(crate) fn logprobs_json(
    tok: &Tokenizer,
    kind: Kind,
    entries: &[(u32, TokenLogprobs)],
    offset: &mut usize,
) -> Logprobs {
    match kind {
        Kind::Completion => {
            completion_logprobs(tok, entries.iter().map(|(id, lp)| (*id, Some(lp))), offset)
        }
        Kind::Chat => Logprobs::Chat(chat_logprobs(tok, entries)),
    }
}

/// Chat's `logprobs` of `entries` (also the responses API's `logprobs`, its `content`).
pub(crate) fn chat_logprobs(tok: &Tokenizer, entries: &[(u32, TokenLogprobs)]) -> ChatLogprobs {
    let entry = |id: u32, l: f32| {
        let token = token_text(tok, id);
        let bytes = token.as_bytes().to_vec();
        TopLogprob {
            token,
            logprob: f64::from(l),
            bytes,
        }
    };
    let content = entries
        .iter()
        .map(|(id, lp)| {
            let e = entry(*id, lp.logprob);
            ChatTokenLogprob {
                token: e.token,
                logprob: e.logprob,
                bytes: e.bytes,
                top_logprobs: lp.top.iter().map(|&(t, l)| entry(t, l)).collect(),
            }
        })
        .collect();
    ChatLogprobs { content }
}
