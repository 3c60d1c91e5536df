//! Stop strings, matched on detokenized text as it streams.

use crate::error::{Error, Result};

use super::{StreamDecoder, Tokenizer};

/// What [`StopMatcher::push`] releases.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopOutput {
    /// Text that can be shown now: it cannot be part of a stop string any more.
    pub text: String,
    /// A stop string matched: `text` ends right before it, and nothing follows.
    pub stopped: bool,
}

/// Finds the first of a request's stop strings to occur in text that arrives in pieces
/// (what a [`StreamDecoder`](super::StreamDecoder) emits), OpenAI's semantics: the text
/// returned ends right before the stop string, which is itself not returned. "First" is the
/// one that completes first (the longest of those completing at the same character), so
/// the result does not depend on how the text is split into pieces.
///
/// Only the text that could still be the start of a stop string is held back: the longest
/// suffix of what arrived that is a prefix of some stop string. Everything before it is
/// released at once, and the held text is released as soon as it can no longer begin a
/// match. Stop strings and pieces are `str`s, so a match and every released piece begin
/// and end on character boundaries: a UTF-8 character is never cut.
#[derive(Clone, Debug)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Arrived, not released, no stop string inside it.
    held: String,
    stopped: bool,
    /// The stop string that matched (its index in `stops`).
    matched: Option<usize>,
}

impl StopMatcher {
    /// A matcher for `stops`; an empty stop string is an error naming `stop` (it would
    /// match before any text). No stops: every piece passes through unchanged.
    pub fn new<S: Into<String>>(stops: impl IntoIterator<Item = S>) -> Result<Self> {
        let stops: Vec<String> = stops.into_iter().map(Into::into).collect();
        if stops.iter().any(String::is_empty) {
            return Err(Error::invalid("stop", "a stop string must not be empty"));
        }
        Ok(StopMatcher {
            stops,
            held: String::new(),
            stopped: false,
            matched: None,
        })
    }

    /// Whether there are no stop strings.
    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Whether a stop string matched (later pushes release nothing).
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The stop string that ended the text, if one did.
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// Add the next piece of text; returns what can be released now, and whether a stop
    /// string ended the text.
    pub fn push(&mut self, piece: &str) -> StopOutput {
        if self.stopped {
            return StopOutput {
                text: String::new(),
                stopped: true,
            };
        }
        if self.stops.is_empty() {
            return StopOutput {
                text: piece.to_string(),
                stopped: false,
            };
        }
        self.held.push_str(piece);
        // The held text held no whole stop string before this piece, and no match can
        // begin in text already released (it would have been held), so every match here
        // ends in the new piece. The one that completes first wins (then the longest), as
        // if the text had arrived a character at a time.
        let first = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| self.held.find(s.as_str()).map(|at| (at + s.len(), at, i)))
            .min();
        if let Some((_, at, i)) = first {
            self.held.truncate(at);
            self.stopped = true;
            self.matched = Some(i);
            return StopOutput {
                text: std::mem::take(&mut self.held),
                stopped: true,
            };
        }
        let keep = self.partial_len();
        let text = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        StopOutput {
            text,
            stopped: false,
        }
    }

    /// Release the text held back (the text ended without completing a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Bytes of the longest suffix of the held text that is a proper prefix of a stop
    /// string (a whole one would have matched).
    fn partial_len(&self) -> usize {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let h = &self.held;
        let from = h.len().saturating_sub(longest.saturating_sub(1));
        (from..h.len())
            .filter(|&i| h.is_char_boundary(i))
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&h[i..])))
            .map_or(0, |i| h.len() - i)
    }
}

/// A request's output text as its tokens arrive: detokenized incrementally
/// ([`StreamDecoder`]) and passed through its stop strings ([`StopMatcher`]). What the
/// server streams and what `encore generate` prints.
pub struct StopStream<'t> {
    dec: StreamDecoder<'t>,
    stop: StopMatcher,
}

impl<'t> StopStream<'t> {
    pub fn new(tokenizer: &'t Tokenizer, prompt: &[u32], stop: StopMatcher) -> Self {
        StopStream {
            dec: StreamDecoder::new(tokenizer, prompt),
            stop,
        }
    }

    /// With `keep`, write special tokens into the text instead of leaving them out
    /// (tool-call markers such as `[TOOL_CALLS]` are special tokens).
    pub fn keep_special_tokens(self, keep: bool) -> Self {
        StopStream {
            dec: self.dec.skip_special_tokens(!keep),
            stop: self.stop,
        }
    }

    /// The text token `id` releases, and whether a stop string ended the text there
    /// (the stop string and anything after it are never released).
    pub fn push(&mut self, id: u32) -> StopOutput {
        let piece = self.dec.push(id).ok().flatten().unwrap_or_default();
        self.stop.push(&piece)
    }

    /// The output ended: release the text still held (the decoder's tail, then what the
    /// stop strings held back), up to a stop string the tail may complete; nothing after
    /// a stop.
    pub fn finish(&mut self) -> String {
        if self.stop.stopped() {
            return String::new();
        }
        let mut rest = String::new();
        if let Ok(Some(tail)) = self.dec.finish() {
            let out = self.stop.push(&tail);
            rest = out.text;
            if out.stopped {
                return rest;
            }
        }
        rest.push_str(&self.stop.finish());
        rest
    }

    /// Whether a stop string ended the text.
    pub fn stopped(&self) -> bool {
        self.stop.stopped()
    }

    /// The stop string that ended the text, if one did.
    pub fn matched(&self) -> Option<&str> {
        self.stop.matched()
    }
}
