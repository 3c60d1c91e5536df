//! A harmony completion read back into messages, from its text as decoded with the
//! special tokens (`<|channel|>`, `<|message|>`, ...) written out: what the model writes
//! after the prompt's `<|start|>assistant`, each message a header (`<|channel|>NAME`, a
//! recipient `to=...` before or after it, a content type such as `<|constrain|>json`),
//! `<|message|>`, its content, and `<|end|>` (then `<|start|>` and the next header),
//! `<|call|>` or `<|return|>`. Headers are read as `openai-harmony`'s
//! `StreamableParser` reads them (checked on its fixtures).
//!
//! [`parse_completion`] reads the whole text so far and returns only what is certain, so
//! a longer text's parse extends a shorter one's: a message appears once its header is
//! whole, and a tail of its content that could still become a marker (`<|en`) is held
//! back until the text decides it or ends. A text that never opens a message (a model
//! that ignores the format) is, once it ends, one message without a channel.

use super::{CALL, CHANNEL, CONSTRAIN, END, MESSAGE, RETURN, START};

/// One message of a completion.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HarmonyMessage {
    pub channel: Option<String>,
    /// `functions.NAME` for a tool call.
    pub recipient: Option<String>,
    /// `<|constrain|>json` or `json` for a call's arguments.
    pub content_type: Option<String>,
    pub content: String,
    /// Its end marker was written.
    pub ended: bool,
}

const ENDS: [&str; 3] = [END, CALL, RETURN];

/// The messages of `text`, a completion so far; `done`: it ended (nothing is held back).
pub fn parse_completion(text: &str, done: bool) -> Vec<HarmonyMessage> {
    let mut out = Vec::new();
    let mut rest = text;
    let mut first = true;
    loop {
        if !first {
            match rest.strip_prefix(START) {
                Some(r) => rest = r,
                None if rest.is_empty() || (!done && START.starts_with(rest)) => break,
                None => {
                    // Text after a message that starts none: content without a channel.
                    out.push(HarmonyMessage {
                        content: held(rest, done).to_string(),
                        ended: done,
                        ..HarmonyMessage::default()
                    });
                    break;
                }
            }
        }
        let Some(h_end) = rest.find(MESSAGE) else {
            if done && first && !rest.is_empty() {
                out.push(HarmonyMessage {
                    content: rest.to_string(),
                    ended: true,
                    ..HarmonyMessage::default()
                });
            }
            break;
        };
        let mut m = header(&rest[..h_end], first);
        first = false;
        rest = &rest[h_end + MESSAGE.len()..];
        let end = ENDS
            .iter()
            .filter_map(|e| rest.find(e).map(|at| (at, e.len())))
            .min();
        match end {
            Some((at, len)) => {
                m.content = rest[..at].to_string();
                m.ended = true;
                out.push(m);
                rest = &rest[at + len..];
            }
            None => {
                m.content = held(rest, done).to_string();
                m.ended = done;
                out.push(m);
                break;
            }
        }
    }
    out
}

/// `text` less a tail that could begin a marker, unless `done` (every marker starts with
/// `<` and holds no other, so only a tail from the last `<` can).
fn held(text: &str, done: bool) -> &str {
    if done {
        return text;
    }
    match text.rfind('<') {
        Some(at)
            if ENDS.iter().chain(&[START]).any(|m| {
                let tail = &text[at..];
                m.len() > tail.len() && m.starts_with(tail)
            }) =>
        {
            &text[..at]
        }
        _ => text,
    }
}

/// A header's channel, recipient and content type, read as `openai-harmony` reads them
/// (`parse_header_from_string`); `first`: the role was given (the prompt's `assistant`).
fn header(h: &str, first: bool) -> HarmonyMessage {
    let mut h = h.to_string();
    let mut channel = None;
    if let Some(idx) = h.find(CHANNEL) {
        let after = &h[idx + CHANNEL.len()..];
        let end = after
            .find(|c: char| c.is_whitespace() || c == '<')
            .unwrap_or(after.len());
        if end > 0 {
            channel = Some(after[..end].to_string());
        }
        h = format!("{}{}", &h[..idx], &after[end..]);
    }
    let mut h = h.trim().to_string();
    if h.contains(CONSTRAIN) {
        h = h
            .replace(CONSTRAIN, &format!(" {CONSTRAIN}"))
            .trim()
            .to_string();
    }
    let mut parts: Vec<&str> = h.split_ascii_whitespace().collect();
    // The role: given for the first message, written after `<|start|>` for the others.
    if parts.first() == Some(&"assistant")
        || (!first && !parts.is_empty() && !parts[0].starts_with("to="))
    {
        parts.remove(0);
    }
    let mut m = HarmonyMessage {
        channel,
        ..HarmonyMessage::default()
    };
    let n = parts.len();
    if let Some(last) = parts.pop() {
        if let Some(r) = last.strip_prefix("to=") {
            m.recipient = Some(r.to_string());
        } else if n == 1 {
            m.recipient = Some(last.to_string());
        } else {
            m.content_type = Some(last.to_string());
            if let Some(r) = parts.pop() {
                m.recipient = Some(r.strip_prefix("to=").unwrap_or(r).to_string());
            }
        }
    }
    m
}
