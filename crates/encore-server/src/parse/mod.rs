//! What a chat model wrote, split into reasoning, content and tool calls: the formats of
//! `--reasoning-parser` (`<think>` ... `</think>`) and `--tool-call-parser` (Hermes and
//! Qwen's `<tool_call>` tags, Llama 3.x's JSON, Mistral's `[TOOL_CALLS]`), and the JSON
//! the grammars of `tool_choice` `required` and a named function force.
//!
//! [`ChatParser::parse`] reads the whole text so far and returns only what is certain:
//! text that could still turn into a marker (`<tool_c` of `<tool_call>`), trailing
//! whitespace, and a call's name before its string closes are held back until the text
//! decides them or ends. So each parse of a longer text extends the previous one, and a
//! stream ([`ChatStream`]) sends the difference; the whole response is the last parse.
//! The arguments of a call are the raw text of its JSON value, as the model wrote it,
//! whole or streamed, so the streamed pieces concatenate to the whole response's
//! `arguments`.

use crate::wire::{ChatMessageOut, FunctionCall, FunctionDelta, ToolCall, ToolCallDelta};

mod harmony;
mod json_scan;
use json_scan::{scan_object, skip_ws, value_end, ObjectScan};

/// How the model writes tool calls (`--tool-call-parser`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one block per call
    /// (Hermes 2/3, Qwen2.5, Qwen3).
    Hermes,
    /// `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`, several
    /// separated by `;` (Llama 3.1-3.3).
    Llama3Json,
    /// `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`, or
    /// `[TOOL_CALLS]name[ARGS]{...}` per call (Mistral's tokenizer v11 and later).
    Mistral,
    /// gpt-oss's harmony: a message to `functions.NAME` on `commentary`. Picks the whole
    /// harmony chat format (the prompt too), as `--reasoning-parser harmony` does.
    Harmony,
}

impl ToolFormat {
    /// Every format by its `--tool-call-parser` name.
    pub const ALL: [(&'static str, ToolFormat); 4] = [
        ("hermes", ToolFormat::Hermes),
        ("llama3_json", ToolFormat::Llama3Json),
        ("mistral", ToolFormat::Mistral),
        ("harmony", ToolFormat::Harmony),
    ];

    /// The format a chat template writes tool calls in, read from its source; `None`
    /// when the template shows none of them.
    pub fn detect(template: &str) -> Option<ToolFormat> {
        if template.contains("<tool_call>") {
            Some(ToolFormat::Hermes)
        } else if template.contains("[TOOL_CALLS]") {
            Some(ToolFormat::Mistral)
        } else if template.contains("<|python_tag|>") || template.contains("\"parameters\": ") {
            Some(ToolFormat::Llama3Json)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "hermes",
            ToolFormat::Llama3Json => "llama3_json",
            ToolFormat::Mistral => "mistral",
            ToolFormat::Harmony => "harmony",
        }
    }
}

/// How the model writes its reasoning (`--reasoning-parser`): both between `<think>` and
/// `</think>`; the output starts inside it when the template opened it in the prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// Qwen3 (`enable_thinking` in `chat_template_kwargs` switches it).
    Qwen3,
    /// DeepSeek-R1 and its distills.
    DeepSeekR1,
    /// gpt-oss's harmony: the `analysis` channel. Picks the whole harmony chat format
    /// (the prompt too); chosen by itself for a tokenizer with harmony's special tokens.
    Harmony,
}

impl ReasoningFormat {
    /// Every format by its `--reasoning-parser` name.
    pub const ALL: [(&'static str, ReasoningFormat); 3] = [
        ("qwen3", ReasoningFormat::Qwen3),
        ("deepseek_r1", ReasoningFormat::DeepSeekR1),
        ("harmony", ReasoningFormat::Harmony),
    ];

    pub fn name(self) -> &'static str {
        match self {
            ReasoningFormat::Qwen3 => "qwen3",
            ReasoningFormat::DeepSeekR1 => "deepseek_r1",
            ReasoningFormat::Harmony => "harmony",
        }
    }
}

/// Where a request's tool calls come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CallMode {
    /// `tool_choice: auto`: the model's own format, read from its text.
    Native(ToolFormat),
    /// `tool_choice: required`: the grammar's `[{"name": ..., "parameters": {...}}, ...]`.
    Required,
    /// A named function: the grammar's output is that function's arguments.
    Named(String),
    /// `tool_choice: auto` on a template that renders no tools (the generic tool prompt,
    /// `generic_tools`): an answer that starts with a JSON list of calls, `[{"name": ...,
    /// "parameters": {...}}, ...]` as the prompt asks, is the calls; any other the text.
    Generic,
}

/// A tool call as parsed so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Call {
    /// Its name, once the whole name is written.
    pub name: Option<String>,
    /// The raw JSON text of its arguments so far.
    pub arguments: String,
}

/// The model's text split up, up to what is certain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Parsed {
    pub reasoning: String,
    pub content: String,
    pub calls: Vec<Call>,
}

const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";

/// How one chat request's output is read.
#[derive(Clone, Debug)]
pub(crate) struct ChatParser {
    /// `Some(opened)`: `<think>` ... `</think>` reasoning is split out; `opened`: the
    /// prompt already ends with `<think>` (the template opened it, as DeepSeek-R1's and
    /// Qwen3-2507's do), so the output starts inside it.
    pub think: Option<bool>,
    pub calls: Option<CallMode>,
    /// Keep the first call only (`parallel_tool_calls: false`).
    pub first_only: bool,
    /// The output is harmony (gpt-oss): read by channel (`harmony`), `think` and `calls`
    /// aside.
    pub harmony: bool,
}

impl ChatParser {
    /// The split of `text`, the whole output so far; `done`: the output ended (nothing is
    /// held back).
    pub fn parse(&self, text: &str, done: bool) -> Parsed {
        if self.harmony {
            let mut out = harmony::parse(text, done);
            if self.first_only {
                out.calls.truncate(1);
            }
            return out;
        }
        let (reasoning, rest) = match self.think {
            Some(opened) => split_think(text, opened, done),
            None => (String::new(), Some(text)),
        };
        let mut out = Parsed {
            reasoning,
            ..Parsed::default()
        };
        let Some(rest) = rest else { return out };
        match &self.calls {
            None => out.content = hold_ws(rest, done).to_string(),
            Some(CallMode::Native(f)) => {
                let (content, calls) = match f {
                    ToolFormat::Hermes => marked(rest, "<tool_call>", done, hermes_calls),
                    ToolFormat::Mistral => marked(rest, "[TOOL_CALLS]", done, mistral_calls),
                    ToolFormat::Llama3Json => llama3(rest, done),
                    // Read by `harmony` (above) when the format is harmony's.
                    ToolFormat::Harmony => (hold_ws(rest, done).to_string(), Vec::new()),
                };
                out.content = content;
                out.calls = calls;
            }
            Some(CallMode::Required) => out.calls = required_calls(rest),
            Some(CallMode::Generic) => (out.content, out.calls) = generic(rest, done),
            Some(CallMode::Named(name)) => out.calls.push(Call {
                name: Some(name.clone()),
                arguments: rest.trim().to_string(),
            }),
        }
        if self.first_only {
            out.calls.truncate(1);
        }
        out
    }
}

/// `text` without trailing whitespace unless `done` (it may end the text).
fn hold_ws(text: &str, done: bool) -> &str {
    if done {
        text
    } else {
        text.trim_end()
    }
}

/// `text` less a tail that could begin `marker`, unless `done`.
fn hold_prefix<'a>(text: &'a str, marker: &str, done: bool) -> &'a str {
    if done {
        return text;
    }
    let keep = (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && text.ends_with(&marker[..n]))
        .map_or(text.len(), |n| text.len() - n);
    &text[..keep]
}

/// The reasoning of `text`, and the text after it (`None` while still inside it).
fn split_think(text: &str, opened: bool, done: bool) -> (String, Option<&str>) {
    let body = if opened {
        text
    } else {
        let t = text.trim_start();
        if let Some(after) = t.strip_prefix(THINK_START) {
            after
        } else if !done && THINK_START.starts_with(t) {
            // Empty or a piece of `<think>`: undecided.
            return (String::new(), None);
        } else {
            return (String::new(), Some(text));
        }
    };
    match body.find(THINK_END) {
        Some(end) => {
            let rest = body[end + THINK_END.len()..].trim_start();
            (body[..end].trim().to_string(), Some(rest))
        }
        None if done => (body.trim().to_string(), None),
        None => {
            let held = hold_prefix(body, THINK_END, false);
            (held.trim().to_string(), None)
        }
    }
}

/// Content before the first `marker`, and the calls `calls` reads after it.
fn marked(
    text: &str,
    marker: &str,
    done: bool,
    calls: fn(&str) -> Vec<Call>,
) -> (String, Vec<Call>) {
    match text.find(marker) {
        Some(at) => (text[..at].trim_end().to_string(), calls(&text[at..])),
        None => {
            let held = hold_prefix(text, marker, done);
            (hold_ws(held, done).to_string(), Vec::new())
        }
    }
}

/// `<tool_call>{json}</tool_call>` blocks (`text` starts with the first).
fn hermes_calls(text: &str) -> Vec<Call> {
    let mut calls = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("<tool_call>") {
        let start = skip_ws(text, from + at + "<tool_call>".len());
        let Some(obj) = scan_object(text, start) else {
            break;
        };
        calls.extend(call_of(text, &obj, &["arguments", "parameters"]));
        match obj.end {
            Some(end) => from = end,
            None => break,
        }
    }
    calls
}

/// `[TOOL_CALLS]` then a JSON list of calls, or `name[ARGS]{json}` per call.
fn mistral_calls(text: &str) -> Vec<Call> {
    const MARK: &str = "[TOOL_CALLS]";
    let after = skip_ws(text, MARK.len());
    if text[after..].starts_with('[') {
        return list_calls(text, after, &["arguments", "parameters"]);
    }
    let mut calls = Vec::new();
    let mut from = MARK.len();
    while let Some(args_at) = text[from..].find("[ARGS]") {
        // `name[CALL_ID]id[ARGS]` in some versions.
        let head = &text[from..from + args_at];
        let name = head.split("[CALL_ID]").next().unwrap_or("").trim();
        let start = skip_ws(text, from + args_at + "[ARGS]".len());
        let end = value_end(text, start);
        calls.push(Call {
            name: Some(name.to_string()),
            arguments: text[start..end.unwrap_or(text.len())].to_string(),
        });
        let Some(end) = end else { break };
        match text[end..].find(MARK) {
            Some(next) => from = end + next + MARK.len(),
            None => break,
        }
    }
    calls
}

/// Llama 3.x: the output is calls when it starts (past whitespace) with `{` or
/// `<|python_tag|>`; `{json}` objects separated by `;`. An output that starts so but does
/// not end as whole calls is content after all.
fn llama3(text: &str, done: bool) -> (String, Vec<Call>) {
    const TAG: &str = "<|python_tag|>";
    let t = text.trim_start();
    let body = if let Some(b) = t.strip_prefix(TAG) {
        b
    } else if t.starts_with('{') {
        t
    } else if !done && TAG.starts_with(t) {
        return (String::new(), Vec::new());
    } else {
        return (hold_ws(text, done).to_string(), Vec::new());
    };
    let base = text.len() - body.len();
    let mut calls = Vec::new();
    let mut at = skip_ws(text, base);
    let mut whole = true;
    while at < text.len() {
        let Some(obj) = scan_object(text, at) else {
            whole = false;
            break;
        };
        let call = call_of(text, &obj, &["parameters", "arguments"]);
        whole &= call.as_ref().is_some_and(|c| c.name.is_some()) && obj.end.is_some();
        calls.extend(call);
        let Some(end) = obj.end else { break };
        at = skip_ws(text, end);
        if text[at..].starts_with(';') {
            at = skip_ws(text, at + 1);
        }
    }
    if done && (!whole || calls.is_empty()) {
        return (text.to_string(), Vec::new());
    }
    (String::new(), calls)
}

/// The generic prompt's answer: calls when it starts with a list of them (as the
/// `required` grammar's), else text; undecided while empty. A list that ends without a
/// whole named call is text.
fn generic(text: &str, done: bool) -> (String, Vec<Call>) {
    let t = text.trim_start();
    if t.is_empty() && !done {
        return (String::new(), Vec::new());
    }
    if !t.starts_with('[') {
        return (hold_ws(text, done).to_string(), Vec::new());
    }
    let calls = required_calls(t);
    if done && (calls.is_empty() || calls.iter().any(|c| c.name.is_none())) {
        return (text.to_string(), Vec::new());
    }
    (String::new(), calls)
}

/// The `required` grammar's list: `[{"name": ..., "parameters": {...}}, ...]`.
fn required_calls(text: &str) -> Vec<Call> {
    let at = skip_ws(text, 0);
    if !text[at..].starts_with('[') {
        return Vec::new();
    }
    list_calls(text, at, &["parameters", "arguments"])
}

/// The call objects of the JSON list at `text[at]` (`[`).
fn list_calls(text: &str, at: usize, arg_keys: &[&str]) -> Vec<Call> {
    let mut calls = Vec::new();
    let mut i = skip_ws(text, at + 1);
    while let Some(obj) = scan_object(text, i) {
        calls.extend(call_of(text, &obj, arg_keys));
        let Some(end) = obj.end else { break };
        i = skip_ws(text, end);
        if !text[i..].starts_with(',') {
            break;
        }
        i = skip_ws(text, i + 1);
    }
    calls
}

/// The call an object describes: its `name` member, and the first of `arg_keys` as the
/// arguments. `None` until one of them has started.
fn call_of(text: &str, obj: &ObjectScan, arg_keys: &[&str]) -> Option<Call> {
    let name = obj
        .member("name")
        .and_then(|(s, e)| serde_json::from_str::<String>(&text[s..e?]).ok());
    let args = arg_keys.iter().find_map(|k| obj.member(k));
    if name.is_none() && args.is_none() {
        return None;
    }
    let arguments = match args {
        Some((s, e)) => text[s..e.unwrap_or(text.len())].to_string(),
        None => String::new(),
    };
    Some(Call { name, arguments })
}

/// A chunk's worth of new output: what [`ChatStream::push`] found since the last.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Delta {
    pub reasoning: String,
    pub content: String,
    /// `tool_calls` entries of a chunk's delta (`index`, and `id`, `type`, `function.name`
    /// on a call's first).
    pub calls: Vec<ToolCallDelta>,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty() && self.calls.is_empty()
    }
}

/// A streamed chat output through a [`ChatParser`]: each piece of text in, the chunk's
/// delta out.
pub(crate) struct ChatStream {
    parser: ChatParser,
    ids: CallIds,
    text: String,
    sent: Parsed,
    /// Per call sent: its id (its header went out with its name).
    sent_ids: Vec<String>,
}

impl ChatStream {
    pub fn new(parser: ChatParser, ids: CallIds) -> Self {
        ChatStream {
            parser,
            ids,
            text: String::new(),
            sent: Parsed::default(),
            sent_ids: Vec::new(),
        }
    }

    /// Add `piece` of the text; `done`: it is the last.
    pub fn push(&mut self, piece: &str, done: bool) -> Delta {
        self.text.push_str(piece);
        let now = self.parser.parse(&self.text, done);
        let mut d = Delta {
            reasoning: grown(&self.sent.reasoning, &now.reasoning),
            content: grown(&self.sent.content, &now.content),
            calls: Vec::new(),
        };
        self.sent.reasoning.push_str(&d.reasoning);
        self.sent.content.push_str(&d.content);
        for (i, call) in now.calls.iter().enumerate() {
            if i == self.sent.calls.len() {
                // A call goes out once its name is known.
                let Some(name) = &call.name else { break };
                let id = self.ids.next();
                d.calls.push(ToolCallDelta {
                    index: i,
                    id: Some(id.clone()),
                    kind: Some("function"),
                    function: FunctionDelta {
                        name: Some(name.clone()),
                        arguments: String::new(),
                    },
                });
                self.sent_ids.push(id);
                self.sent.calls.push(Call {
                    name: Some(name.clone()),
                    arguments: String::new(),
                });
            }
            let sent = &mut self.sent.calls[i].arguments;
            let more = grown(sent, &call.arguments);
            if !more.is_empty() {
                sent.push_str(&more);
                d.calls.push(ToolCallDelta {
                    index: i,
                    id: None,
                    kind: None,
                    function: FunctionDelta {
                        name: None,
                        arguments: more,
                    },
                });
            }
        }
        d
    }

    /// Whether any call went out.
    pub fn called(&self) -> bool {
        !self.sent.calls.is_empty()
    }
}

/// What `now` adds to `sent` (nothing if it does not extend it).
fn grown(sent: &str, now: &str) -> String {
    match now.strip_prefix(sent) {
        Some(more) => more.to_string(),
        None => String::new(),
    }
}

/// The OpenAI message of a whole output: `content` (null when empty and calls were
/// made), `reasoning_content` when `reasoning` (the parser splits it out), `tool_calls`.
pub(crate) fn message(p: &Parsed, ids: &mut CallIds, reasoning: bool) -> ChatMessageOut {
    let calls: Vec<ToolCall> = p
        .calls
        .iter()
        .filter_map(|c| {
            let name = c.name.as_ref()?;
            Some(ToolCall {
                id: ids.next(),
                kind: "function",
                function: FunctionCall {
                    name: name.clone(),
                    arguments: c.arguments.clone(),
                },
            })
        })
        .collect();
    let content = (!p.content.is_empty() || calls.is_empty()).then(|| p.content.clone());
    ChatMessageOut {
        role: "assistant",
        content,
        reasoning_content: reasoning
            .then(|| (!p.reasoning.is_empty()).then(|| p.reasoning.clone())),
        tool_calls: (!calls.is_empty()).then_some(calls),
    }
}

/// Tool-call ids of one response: `call_` and 24 letters and digits, or 9 for Mistral's
/// format (its template refuses other lengths when the call comes back).
pub(crate) struct CallIds {
    state: u64,
    mistral: bool,
}

impl CallIds {
    pub fn new(seed: u64, mistral: bool) -> Self {
        CallIds {
            state: seed,
            mistral,
        }
    }

    pub fn next(&mut self) -> String {
        if self.mistral {
            self.alnum(9)
        } else {
            format!("call_{}", self.alnum(24))
        }
    }

    /// An id of another kind of output item: `prefix`, `_`, 24 letters and digits.
    pub fn item(&mut self, prefix: &str) -> String {
        format!("{prefix}_{}", self.alnum(24))
    }

    fn alnum(&mut self, len: usize) -> String {
        const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        let mut s = String::with_capacity(len);
        for _ in 0..len {
            // splitmix64.
            self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            s.push(ALNUM[(z % ALNUM.len() as u64) as usize] as char);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn native(f: ToolFormat) -> ChatParser {
        ChatParser {
            think: None,
            calls: Some(CallMode::Native(f)),
            first_only: false,
            harmony: false,
        }
    }

    fn call(name: &str, args: &str) -> Call {
        Call {
            name: Some(name.into()),
            arguments: args.into(),
        }
    }

    /// Every prefix of `text` (at each character) parses to a prefix of the next
    /// prefix's parse, and streaming it piece by piece gives the whole parse.
    fn streams_consistently(p: &ChatParser, text: &str) -> Parsed {
        let whole = p.parse(text, true);
        let mut prev = Parsed::default();
        let cuts: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
        for &cut in &cuts {
            let now = p.parse(&text[..cut], false);
            assert!(
                now.reasoning.starts_with(&prev.reasoning),
                "{text:?} at {cut}"
            );
            assert!(now.content.starts_with(&prev.content), "{text:?} at {cut}");
            assert!(now.calls.len() >= prev.calls.len(), "{text:?} at {cut}");
            for (a, b) in prev.calls.iter().zip(&now.calls) {
                assert!(b.arguments.starts_with(&a.arguments), "{text:?} at {cut}");
                if a.name.is_some() {
                    assert_eq!(a.name, b.name, "{text:?} at {cut}");
                }
            }
            prev = now;
        }
        // Streamed in pieces of 3 characters, the deltas add up to the whole parse.
        let mut s = ChatStream::new(p.clone(), CallIds::new(7, false));
        let (mut reasoning, mut content) = (String::new(), String::new());
        let mut args: Vec<(String, String)> = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        let pieces: Vec<String> = chars.chunks(3).map(|c| c.iter().collect()).collect();
        for (k, piece) in pieces.iter().enumerate() {
            let d = s.push(piece, k + 1 == pieces.len());
            reasoning.push_str(&d.reasoning);
            content.push_str(&d.content);
            for c in d.calls {
                let i = c.index;
                if let Some(name) = &c.function.name {
                    assert_eq!(i, args.len());
                    assert!(c.id.as_deref().unwrap().starts_with("call_"));
                    args.push((name.to_string(), String::new()));
                }
                args[i].1.push_str(&c.function.arguments);
            }
        }
        assert_eq!(reasoning, whole.reasoning, "{text:?}");
        assert_eq!(content, whole.content, "{text:?}");
        let named: Vec<(String, String)> = whole
            .calls
            .iter()
            .map(|c| (c.name.clone().unwrap(), c.arguments.clone()))
            .collect();
        assert_eq!(args, named, "{text:?}");
        whole
    }

    #[test]
    fn hermes_calls_and_content() {
        let p = native(ToolFormat::Hermes);
        let t = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"arguments\": {}, \"name\": \"now\"}\n</tool_call>";
        let out = streams_consistently(&p, t);
        assert_eq!(out.content, "Let me check.");
        assert_eq!(
            out.calls,
            [
                call("get_weather", "{\"city\": \"Paris\", \"days\": [1, 2]}"),
                call("now", "{}")
            ]
        );
        // Plain text, and text that only looks like the start of a tag.
        for t in ["Hello <b>there</b>\n", "a <tool_", "x < y"] {
            let out = streams_consistently(&p, t);
            assert_eq!(out.content, t);
            assert!(out.calls.is_empty());
        }
    }

    #[test]
    fn generic_answers_are_calls_or_text() {
        let p = ChatParser {
            think: None,
            calls: Some(CallMode::Generic),
            first_only: false,
            harmony: false,
        };
        let t = " [{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}]";
        let out = streams_consistently(&p, t);
        assert_eq!(out.calls, [call("get_weather", "{\"city\": \"Paris\"}")]);
        assert_eq!(out.content, "");
        let out = streams_consistently(&p, "It is sunny [1].");
        assert_eq!(
            (out.content.as_str(), out.calls.len()),
            ("It is sunny [1].", 0)
        );
        // A list that is not calls is the text.
        let out = p.parse("[1, 2]", true);
        assert_eq!((out.content.as_str(), out.calls.len()), ("[1, 2]", 0));
    }

    #[test]
    fn llama3_json_calls() {
        let p = native(ToolFormat::Llama3Json);
        let t = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"now\", \"parameters\": {}}";
        let out = streams_consistently(&p, t);
        assert_eq!(
            out.calls,
            [
                call("get_weather", "{\"city\": \"Paris\"}"),
                call("now", "{}")
            ]
        );
        assert_eq!(out.content, "");
        let t = "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": \"}{\"}}";
        assert_eq!(
            streams_consistently(&p, t).calls,
            [call("f", "{\"x\": \"}{\"}")]
        );
        // Text, and braces that are not a call, are content.
        for t in ["The answer is 4.", "{not json at all"] {
            let out = p.parse(t, true);
            assert_eq!((out.content.as_str(), out.calls.len()), (t, 0));
        }
        assert_eq!(streams_consistently(&p, "Sure: {}").content, "Sure: {}");
    }

    #[test]
    fn mistral_calls_both_versions() {
        let p = native(ToolFormat::Mistral);
        let t = "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"now\", \"arguments\": {}}]";
        assert_eq!(
            streams_consistently(&p, t).calls,
            [
                call("get_weather", "{\"city\": \"Paris\"}"),
                call("now", "{}")
            ]
        );
        let t = "ok[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]now[ARGS]{}";
        let out = streams_consistently(&p, t);
        assert_eq!(out.content, "ok");
        assert_eq!(
            out.calls,
            [
                call("get_weather", "{\"city\": \"Paris\"}"),
                call("now", "{}")
            ]
        );
    }

    #[test]
    fn required_and_named() {
        let p = ChatParser {
            think: None,
            calls: Some(CallMode::Required),
            first_only: false,
            harmony: false,
        };
        let t = "[{\"name\": \"a\", \"parameters\": {\"q\": [1, {\"r\": \"]\"}]}}, {\"name\": \"b\", \"parameters\": {}}]";
        assert_eq!(
            streams_consistently(&p, t).calls,
            [call("a", "{\"q\": [1, {\"r\": \"]\"}]}"), call("b", "{}")]
        );
        let p = ChatParser {
            think: None,
            calls: Some(CallMode::Named("f".into())),
            first_only: false,
            harmony: false,
        };
        assert_eq!(
            streams_consistently(&p, "{\"x\": 1}").calls,
            [call("f", "{\"x\": 1}")]
        );
    }

    #[test]
    fn reasoning_is_split_out() {
        let p = ChatParser {
            think: Some(false),
            calls: None,
            first_only: false,
            harmony: false,
        };
        let out = streams_consistently(&p, "<think>\nHmm, 2+2.\n</think>\n\nIt is 4.");
        assert_eq!(
            (out.reasoning.as_str(), out.content.as_str()),
            ("Hmm, 2+2.", "It is 4.")
        );
        let out = streams_consistently(&p, "No thinking here.");
        assert_eq!(
            (out.reasoning.as_str(), out.content.as_str()),
            ("", "No thinking here.")
        );
        // Cut off while thinking: all reasoning.
        let out = streams_consistently(&p, "<think>still going");
        assert_eq!(
            (out.reasoning.as_str(), out.content.as_str()),
            ("still going", "")
        );
        // The template opened it.
        let p = ChatParser {
            think: Some(true),
            calls: Some(CallMode::Native(ToolFormat::Hermes)),
            first_only: false,
            harmony: false,
        };
        let t = "I need the weather.</think>\n<tool_call>\n{\"name\": \"w\", \"arguments\": {}}\n</tool_call>";
        let out = streams_consistently(&p, t);
        assert_eq!(out.reasoning, "I need the weather.");
        assert_eq!((out.content.as_str(), out.calls.len()), ("", 1));
    }

    #[test]
    fn formats_are_detected_from_templates() {
        assert_eq!(
            ToolFormat::detect("{{- '<tool_call>\\n' }}"),
            Some(ToolFormat::Hermes)
        );
        assert_eq!(
            ToolFormat::detect("{{- '[TOOL_CALLS][' }}"),
            Some(ToolFormat::Mistral)
        );
        assert_eq!(
            ToolFormat::detect("{{- '<|python_tag|>' }}"),
            Some(ToolFormat::Llama3Json)
        );
        assert_eq!(ToolFormat::detect("{{ messages }}"), None);
    }

    #[test]
    fn message_shapes() {
        let mut ids = CallIds::new(1, true);
        let p = Parsed {
            reasoning: "r".into(),
            content: String::new(),
            calls: vec![call("f", "{}")],
        };
        let m = serde_json::to_value(message(&p, &mut ids, true)).unwrap();
        assert_eq!(m["content"], Value::Null);
        assert_eq!(m["reasoning_content"], "r");
        let id = m["tool_calls"][0]["id"].as_str().unwrap();
        assert!(id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()));
        let m = serde_json::to_value(message(&Parsed::default(), &mut ids, false)).unwrap();
        assert_eq!(m, json!({"role": "assistant", "content": ""}));
    }
}
