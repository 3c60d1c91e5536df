//! The OpenAI response shapes both ways of answering share: the chunk of a streamed
//! token, the usage object, the log-probability objects, the finish reason's name, and
//! the text a token releases past the stop strings.

use std::time::{SystemTime, UNIX_EPOCH};

use encore_core::request::{FinishReason, Output, TokenLogprobs};
use encore_core::tokenizer::{StopStream, Tokenizer};
use serde_json::{json, Value};

use crate::parse::Delta;

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
        logprobs: Value,
    ) -> Value {
        let mut delta = serde_json::Map::new();
        if first {
            delta.insert("role".into(), json!("assistant"));
        }
        if !d.reasoning.is_empty() {
            delta.insert("reasoning_content".into(), json!(d.reasoning));
        }
        if !d.content.is_empty() || d.is_empty() {
            delta.insert("content".into(), json!(d.content));
        }
        if !d.calls.is_empty() {
            delta.insert("tool_calls".into(), Value::Array(d.calls.clone()));
        }
        let choice =
            json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish});
        json!({"id": self.id, "object": self.chunk_object(), "created": self.created,
               "model": self.model, "choices": [choice]})
    }

    /// The chunk of one streamed token of choice `index`: its text `delta`, the finish
    /// reason on the last, the role on chat's first.
    pub fn chunk(
        &self,
        index: usize,
        delta: &str,
        finish: Option<&str>,
        first: bool,
        logprobs: Value,
    ) -> Value {
        if self.kind == Kind::Chat {
            let d = Delta {
                content: delta.to_string(),
                ..Delta::default()
            };
            return self.parsed_chunk(index, &d, finish, first, logprobs);
        }
        let choice =
            json!({"index": index, "text": delta, "logprobs": logprobs, "finish_reason": finish});
        json!({"id": self.id, "object": self.chunk_object(), "created": self.created,
               "model": self.model, "choices": [choice]})
    }

    /// The last chunk of a stream that asked for usage.
    pub fn usage_chunk(&self, prompt: usize, completion: usize) -> Value {
        json!({
            "id": self.id, "object": self.chunk_object(), "created": self.created,
            "model": self.model, "choices": [], "usage": usage(prompt, completion),
        })
    }

    /// Choice `index` of a whole response: `text` (its token `ids`), ended by `finish`;
    /// a chat's `message` when a parser read the text.
    pub fn choice(
        &self,
        index: usize,
        text: &str,
        ids: &[u32],
        logprobs: Value,
        finish: &str,
        message: Option<Value>,
    ) -> Value {
        match self.kind {
            Kind::Completion => {
                json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish, "token_ids": ids})
            }
            Kind::Chat => {
                let message =
                    message.unwrap_or_else(|| json!({"role": "assistant", "content": text}));
                json!({"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish, "token_ids": ids})
            }
        }
    }

    /// A whole response of `choices`, with the usage of a `prompt` of so many tokens and
    /// `completion` tokens over all choices.
    pub fn whole(&self, choices: Vec<Value>, prompt: usize, completion: usize) -> Value {
        json!({
            "id": self.id, "object": self.object(), "created": self.created, "model": self.model,
            "choices": choices, "usage": usage(prompt, completion),
        })
    }
}

/// OpenAI's usage object of a prompt of `prompt` tokens and `completion` output tokens.
pub(crate) fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
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
) -> Value {
    let (mut tokens, mut lps, mut tops, mut offsets) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (id, lp) in entries {
        let text = token_text(tok, id);
        offsets.push(*offset);
        *offset += text.len();
        tokens.push(text);
        let Some(lp) = lp else {
            lps.push(Value::Null);
            tops.push(Value::Null);
            continue;
        };
        lps.push(json!(lp.logprob));
        // Keyed by text: of tokens with the same text the likelier stays.
        let mut top = serde_json::Map::new();
        for &(t, l) in &lp.top {
            top.entry(token_text(tok, t)).or_insert(json!(l));
        }
        tops.push(Value::Object(top));
    }
    json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
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
) -> Value {
    match kind {
        Kind::Completion => {
            completion_logprobs(tok, entries.iter().map(|(id, lp)| (*id, Some(lp))), offset)
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
