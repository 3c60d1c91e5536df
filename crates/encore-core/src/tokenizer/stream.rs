//! Incremental detokenization for streaming responses.

use crate::error::Result;

use super::Tokenizer;

/// Prompt ids kept as decoding context for the first generated tokens.
const PROMPT_CONTEXT: usize = 5;

/// Turns generated ids, fed one at a time, into the newly completed text.
///
/// Text is decoded over a short window of ids (the last emitted ones as context, then the
/// new ones) and only the part after the context's own text is emitted. That handles
/// tokenizers whose decode of a token depends on what precedes it (SentencePiece's
/// leading space), and text is held back while the window's decode ends in U+FFFD (a
/// multi-byte character split across byte tokens) until the character completes or
/// [`StreamDecoder::finish`] flushes it. For tokenizers that decode token by token (byte
/// level BPE, the byte tokenizer) the pieces concatenate to `decode(generated ids)`.
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    ids: Vec<u32>,
    /// Start of the context window: `ids[prefix..read]` is already emitted (or prompt).
    prefix: usize,
    /// Start of the ids not emitted yet.
    read: usize,
    skip_special_tokens: bool,
}

impl<'a> StreamDecoder<'a> {
    /// A decoder for the tokens generated after `prompt_ids` (whose last few ids serve as
    /// context). Special tokens are skipped; see [`StreamDecoder::skip_special_tokens`].
    pub fn new(tok: &'a Tokenizer, prompt_ids: &[u32]) -> Self {
        let ids = prompt_ids[prompt_ids.len().saturating_sub(PROMPT_CONTEXT)..].to_vec();
        StreamDecoder {
            tok,
            prefix: 0,
            read: ids.len(),
            ids,
            skip_special_tokens: true,
        }
    }

    /// Whether special tokens are left out of the text (default `true`).
    pub fn skip_special_tokens(mut self, skip: bool) -> Self {
        self.skip_special_tokens = skip;
        self
    }

    /// Add one generated id; returns the text it completes, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        self.emit(false)
    }

    /// The text still held back (an incomplete character at the end, as U+FFFD, the way
    /// a full decode writes it), if any. Later calls return `None` until more is pushed.
    pub fn finish(&mut self) -> Result<Option<String>> {
        self.emit(true)
    }

    fn emit(&mut self, flush: bool) -> Result<Option<String>> {
        let skip = self.skip_special_tokens;
        let context = self.tok.decode(&self.ids[self.prefix..self.read], skip)?;
        let text = self.tok.decode(&self.ids[self.prefix..], skip)?;
        if text.len() <= context.len() || (!flush && text.ends_with('\u{FFFD}')) {
            return Ok(None);
        }
        let new = new_text(&context, &text);
        // The ids just emitted become the next context; older ones are not needed.
        self.ids.drain(..self.read);
        self.prefix = 0;
        self.read = self.ids.len();
        Ok(Some(new.to_string()))
    }
}

/// The part of `text` after `context`. When the window's decode changed the context's
/// text (rare), everything after the longest common prefix.
fn new_text<'t>(context: &str, text: &'t str) -> &'t str {
    if let Some(rest) = text.strip_prefix(context) {
        return rest;
    }
    let common = context
        .char_indices()
        .zip(text.chars())
        .find(|((_, a), b)| a != b)
        .map_or(context.len().min(text.len()), |((i, _), _)| i);
    &text[common..]
}
