//! Tokenizers and chat templates: a Hugging Face `tokenizer.json` (with the special tokens
//! and chat template of `tokenizer_config.json`), the `tokenizer.*` metadata of a GGUF file
//! (`gguf.rs`), or a built-in byte-level tokenizer for dummy models; plus an incremental
//! detokenizer for streaming and a stop-string matcher over its text.
//!
//! NOTE: a rendered chat template already holds the special tokens it wants (usually the
//! BOS text): encode it with `add_special_tokens = false`, as `transformers` does, or the
//! prompt starts with two BOS tokens.

mod gguf;
pub mod harmony;
mod stop;
mod stream;
mod template;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::error::{Error, Result};

pub(crate) use gguf::end_of_generation_ids;
pub use gguf::GgufVocab;
pub use stop::{StopMatcher, StopOutput, StopStream};
pub use stream::StreamDecoder;
pub use template::civil_from_days;
use template::ChatTemplate;

/// The byte tokenizer's BOS id (ids `0..=255` are the bytes).
pub const BYTES_BOS: u32 = 256;
/// The byte tokenizer's EOS id.
pub const BYTES_EOS: u32 = 257;
/// The byte tokenizer's vocabulary size.
pub const BYTES_VOCAB_SIZE: usize = 258;

/// The byte tokenizer's chat template: `<|role|>\ncontent\n` per message, then
/// `<|assistant|>\n` when a generation prompt is asked for. With `tools` it starts with a
/// `<|system|>` turn listing them, and writes an assistant's tool calls as Hermes does
/// (`<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`), so dummy models take
/// the tool-calling path of real ones.
const BYTES_CHAT_TEMPLATE: &str = "{% if tools %}<|system|>\n# Tools\n{% for tool in tools %}\
     {{ tool | tojson }}{{ '\\n' }}{% endfor %}Call a tool as <tool_call>{{ '\\n' }}\
     {\"name\": <name>, \"arguments\": <arguments>}{{ '\\n' }}</tool_call>{{ '\\n' }}{% endif %}\
     {% for message in messages %}<|{{ message.role }}|>\n\
     {% if message.content is not none %}{{ message.content }}{% endif %}\
     {% for call in message.tool_calls or [] %}<tool_call>{{ '\\n' }}{\"name\": \"\
     {{ call.function.name }}\", \"arguments\": {{ call.function.arguments | tojson }}}\
     {{ '\\n' }}</tool_call>{% endfor %}{{ '\\n' }}{% endfor %}\
     {% if add_generation_prompt %}<|assistant|>\n{% endif %}";

/// One message of a conversation, as the chat template sees it (the OpenAI message shape
/// that `transformers` templates take).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    /// `None`: no content (an assistant message that only calls tools). Templates see
    /// `none`.
    #[serde(default)]
    pub content: Option<String>,
    /// The participant's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant message's tool calls; absent from the template's view when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// A `tool` message's answer to this call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant message's reasoning (templates of thinking models read it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    /// A message of `role` with text `content` and nothing else.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: Some(content.into()),
            name: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            reasoning_content: None,
        }
    }
}

/// A tool call in an assistant message: `{"id", "type": "function", "function": {"name",
/// "arguments"}}`, its arguments a JSON value (an object), not the OpenAI wire format's
/// string, since templates write them with `tojson` (as vLLM passes them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

/// The function a [`ToolCall`] calls.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: Json,
}

/// What a chat template renders besides the messages.
#[derive(Clone, Debug, Default)]
pub struct ChatOptions {
    /// End with the header of the assistant's turn.
    pub add_generation_prompt: bool,
    /// Tool definitions (`{"type": "function", "function": {...}}`), the template's
    /// `tools`; `None`: undefined.
    pub tools: Option<Vec<Json>>,
    /// More template variables (`chat_template_kwargs`, e.g. `enable_thinking`); keys the
    /// renderer sets itself ([`RESERVED_TEMPLATE_VARS`]) are refused.
    pub kwargs: serde_json::Map<String, Json>,
}

/// The template variables [`Tokenizer::render_chat`] sets itself.
pub const RESERVED_TEMPLATE_VARS: &[&str] = &[
    "messages",
    "tools",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
];

/// Text <-> token ids, special tokens and the chat template of one model.
pub struct Tokenizer {
    kind: Kind,
    /// One past the largest id the tokenizer can produce.
    vocab_size: usize,
    bos_id: Option<u32>,
    eos_ids: Vec<u32>,
    /// Whether `encode(.., true)` must put BOS first (`add_bos_token` of
    /// tokenizer_config.json), for tokenizer.json files whose post-processor does not.
    add_bos: bool,
    /// Special-token strings the chat template sees (`bos_token`, `eos_token`, ...).
    special_strings: BTreeMap<&'static str, String>,
    template: Option<ChatTemplate>,
    /// Why there is no chat template, for the error.
    no_template_reason: String,
}

enum Kind {
    Hf(Box<tokenizers::Tokenizer>),
    Bytes,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field(
                "kind",
                &match self.kind {
                    Kind::Hf(_) => "hf",
                    Kind::Bytes => "bytes",
                },
            )
            .field("vocab_size", &self.vocab_size)
            .field("bos_id", &self.bos_id)
            .field("eos_ids", &self.eos_ids)
            .field("has_chat_template", &self.template.is_some())
            .finish()
    }
}

impl Tokenizer {
    /// Load `dir/tokenizer.json`, with `dir/tokenizer_config.json` (special tokens,
    /// `add_bos_token`, `chat_template`), `dir/chat_template.jinja` (preferred over the
    /// config's template, as in recent `transformers`) and `dir/generation_config.json`
    /// (`eos_token_id`, which may list several ids) where present.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer> {
        let tok_path = dir.join("tokenizer.json");
        let bytes = std::fs::read(&tok_path).map_err(|source| Error::Io {
            what: "reading tokenizer",
            path: tok_path.display().to_string(),
            source,
        })?;
        let hf = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
            let path = tok_path.display();
            Error::Tokenizer(match serde_json::from_slice::<Json>(&bytes) {
                Ok(_) => format!("`{path}` is JSON but not a Hugging Face tokenizer: {e}"),
                Err(_) => format!("`{path}` is not valid JSON: {e}"),
            })
        })?;
        let config = read_json_if_exists(&dir.join("tokenizer_config.json"))?;
        let gen_config = read_json_if_exists(&dir.join("generation_config.json"))?;
        let config = config.unwrap_or(Json::Null);

        let vocab_size = hf
            .get_vocab(true)
            .values()
            .map(|&id| id as usize + 1)
            .max()
            .unwrap_or(0);

        let mut special_strings = BTreeMap::new();
        for key in ["bos_token", "eos_token", "unk_token", "pad_token"] {
            if let Some(s) = token_string(&config[key]) {
                special_strings.insert(key, s);
            }
        }
        let known_id = |key: &str| -> Option<u32> {
            let s = special_strings.get(key)?;
            let id = hf.token_to_id(s);
            if id.is_none() {
                tracing::warn!("{key} `{s}` of tokenizer_config.json is not in the vocabulary");
            }
            id
        };
        let bos_id = known_id("bos_token").or_else(|| {
            gen_config
                .as_ref()
                .and_then(|g| g["bos_token_id"].as_u64())
                .map(|id| id as u32)
        });
        let mut eos_ids: Vec<u32> = known_id("eos_token").into_iter().collect();
        if let Some(g) = &gen_config {
            let ids = match &g["eos_token_id"] {
                Json::Array(a) => a.iter().filter_map(Json::as_u64).collect(),
                other => other.as_u64().into_iter().collect::<Vec<_>>(),
            };
            for id in ids {
                if !eos_ids.contains(&(id as u32)) {
                    eos_ids.push(id as u32);
                }
            }
        }
        let add_bos = config["add_bos_token"].as_bool() == Some(true) && bos_id.is_some();

        let (template, no_template_reason) = load_chat_template(dir, &config)?;
        Ok(Tokenizer {
            kind: Kind::Hf(Box::new(hf)),
            vocab_size,
            bos_id,
            eos_ids,
            add_bos,
            special_strings,
            template,
            no_template_reason,
        })
    }

    /// The built-in byte-level tokenizer for dummy models: token id = byte value,
    /// [`BYTES_BOS`] = 256, [`BYTES_EOS`] = 257, vocabulary size 258. Encoding with
    /// special tokens puts BOS first. Its chat template writes `<|role|>\ncontent\n` per
    /// message and `<|assistant|>\n` as the generation prompt.
    ///
    /// NOTE: input text is always plain bytes: `<|bos|>` in a prompt is seven byte tokens,
    /// not BOS (decoding with special tokens writes BOS and EOS as `<|bos|>`, `<|eos|>`).
    pub fn bytes() -> Tokenizer {
        let template = ChatTemplate::new(BYTES_CHAT_TEMPLATE.to_string(), "the byte tokenizer")
            .expect("the built-in chat template compiles");
        Tokenizer {
            kind: Kind::Bytes,
            vocab_size: BYTES_VOCAB_SIZE,
            bos_id: Some(BYTES_BOS),
            eos_ids: vec![BYTES_EOS],
            add_bos: true,
            special_strings: BTreeMap::from([
                ("bos_token", "<|bos|>".to_string()),
                ("eos_token", "<|eos|>".to_string()),
            ]),
            template: Some(template),
            no_template_reason: String::new(),
        }
    }

    /// Token ids of `text`; with `add_special_tokens`, the tokenizer's own additions
    /// (BOS, ...) as `transformers` makes them.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let mut ids = match &self.kind {
            Kind::Hf(t) => t
                .encode(text, add_special_tokens)
                .map_err(|e| Error::Tokenizer(format!("encoding failed: {e}")))?
                .get_ids()
                .to_vec(),
            Kind::Bytes => text.bytes().map(u32::from).collect(),
        };
        if add_special_tokens && self.add_bos {
            if let Some(bos) = self.bos_id {
                if ids.first() != Some(&bos) {
                    ids.insert(0, bos);
                }
            }
        }
        Ok(ids)
    }

    /// Text of `ids`. Ids outside the vocabulary are skipped (as `tokenizers` does);
    /// bytes that do not form valid UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        match &self.kind {
            Kind::Hf(t) => t
                .decode(ids, skip_special_tokens)
                .map_err(|e| Error::Tokenizer(format!("decoding failed: {e}"))),
            Kind::Bytes => {
                let mut out = String::new();
                let mut run = Vec::new();
                for &id in ids {
                    match id {
                        0..=255 => run.push(id as u8),
                        BYTES_BOS | BYTES_EOS if !skip_special_tokens => {
                            out.push_str(&String::from_utf8_lossy(&run));
                            run.clear();
                            let key = if id == BYTES_BOS {
                                "bos_token"
                            } else {
                                "eos_token"
                            };
                            out.push_str(&self.special_strings[key]);
                        }
                        _ => {}
                    }
                }
                out.push_str(&String::from_utf8_lossy(&run));
                Ok(out)
            }
        }
    }

    /// One past the largest token id this tokenizer produces (the model's embedding
    /// table may be larger).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Ids that end generation: `eos_token` of tokenizer_config.json, then the
    /// `eos_token_id`s of generation_config.json not already listed.
    pub fn eos_token_ids(&self) -> Vec<u32> {
        self.eos_ids.clone()
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// The bytes each token id in `0..vocab_size()` stands for in generated text, for
    /// token-level constraints (structured outputs): a byte-level BPE token's bytes
    /// through GPT-2's byte-to-character table, a SentencePiece token's text with `▁` as a
    /// space and `<0xXX>` as the byte, and special tokens (added tokens marked special,
    /// the byte tokenizer's BOS/EOS) as `0xFF` followed by their text, which no text
    /// matches (the convention of `toktrie`). Ids without a token are empty.
    pub fn token_bytes(&self) -> Vec<Vec<u8>> {
        match &self.kind {
            Kind::Bytes => (0..BYTES_VOCAB_SIZE as u32)
                .map(|id| match id {
                    0..=255 => vec![id as u8],
                    BYTES_BOS => [&[0xFF][..], b"<|bos|>"].concat(),
                    _ => [&[0xFF][..], b"<|eos|>"].concat(),
                })
                .collect(),
            Kind::Hf(t) => {
                let byte_level = t
                    .get_decoder()
                    .and_then(|d| serde_json::to_string(d).ok())
                    .is_some_and(|d| d.contains("\"ByteLevel\""));
                let special: std::collections::HashSet<u32> = t
                    .get_added_tokens_decoder()
                    .into_iter()
                    .filter(|(_, a)| a.special)
                    .map(|(id, _)| id)
                    .collect();
                let unbyte = byte_level.then(gpt2_char_bytes);
                (0..self.vocab_size as u32)
                    .map(|id| {
                        let Some(tok) = t.id_to_token(id) else {
                            return Vec::new();
                        };
                        if special.contains(&id) {
                            return [&[0xFF][..], tok.as_bytes()].concat();
                        }
                        match &unbyte {
                            Some(map) => tok
                                .chars()
                                .map(|c| map.get(&c).copied())
                                .collect::<Option<Vec<u8>>>()
                                // An added (not special) token is stored as its text.
                                .unwrap_or_else(|| tok.as_bytes().to_vec()),
                            None => sentencepiece_bytes(&tok),
                        }
                    })
                    .collect()
            }
        }
    }

    /// The id of a token string (special tokens included), if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        match &self.kind {
            Kind::Hf(t) => t.token_to_id(token),
            Kind::Bytes => match token.as_bytes() {
                [b] => Some(u32::from(*b)),
                _ if token == self.special_strings["bos_token"] => Some(BYTES_BOS),
                _ if token == self.special_strings["eos_token"] => Some(BYTES_EOS),
                _ => None,
            },
        }
    }

    /// Render a conversation with the model's chat template, with Hugging Face's
    /// conventions (`messages`, `add_generation_prompt`, `bos_token`, `eos_token`,
    /// `raise_exception`, `strftime_now`, `tojson`, Python string and dict methods,
    /// `trim_blocks` and `lstrip_blocks`). Encode the result with
    /// `add_special_tokens = false`.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let opts = ChatOptions {
            add_generation_prompt,
            ..ChatOptions::default()
        };
        self.render_chat(messages, &opts)
    }

    /// [`Tokenizer::apply_chat_template`] with tools and more template variables.
    pub fn render_chat(&self, messages: &[ChatMessage], opts: &ChatOptions) -> Result<String> {
        let template = self
            .template
            .as_ref()
            .ok_or_else(|| Error::Tokenizer(self.no_template_reason.clone()))?;
        if let Some(k) = opts
            .kwargs
            .keys()
            .find(|k| RESERVED_TEMPLATE_VARS.contains(&k.as_str()))
        {
            return Err(Error::Tokenizer(format!(
                "the template variable `{k}` is set by the renderer"
            )));
        }
        let mut ctx: Vec<(&str, minijinja::Value)> = vec![
            ("messages", minijinja::Value::from_serialize(messages)),
            (
                "add_generation_prompt",
                minijinja::Value::from(opts.add_generation_prompt),
            ),
        ];
        if let Some(tools) = &opts.tools {
            ctx.push(("tools", minijinja::Value::from_serialize(tools)));
        }
        for (k, v) in &opts.kwargs {
            ctx.push((k.as_str(), minijinja::Value::from_serialize(v)));
        }
        for (&k, v) in &self.special_strings {
            ctx.push((k, minijinja::Value::from(v.as_str())));
        }
        template.render(ctx.into_iter().collect())
    }

    /// This tokenizer with the chat template `source` in place of its own (`origin`
    /// names it in errors, e.g. a file path).
    pub fn with_chat_template(mut self, source: String, origin: &str) -> Result<Tokenizer> {
        self.template = Some(ChatTemplate::new(source, origin)?);
        Ok(self)
    }

    /// The chat template's Jinja source, if the model has one (which tool-call and
    /// reasoning formats the model writes is read from it).
    pub fn chat_template_source(&self) -> Option<&str> {
        self.template.as_ref().map(|t| t.source())
    }

    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }
}

/// A special token in tokenizer_config.json: a string, or an `AddedToken` object
/// `{"content": ...}`; `null` or absent is `None`.
fn token_string(v: &Json) -> Option<String> {
    match v {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

fn read_json_if_exists(path: &Path) -> Result<Option<Json>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(Error::Io {
                what: "reading",
                path: path.display().to_string(),
                source,
            })
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::Tokenizer(format!("cannot parse `{}`: {e}", path.display())))
}

/// The chat template of a model directory: `chat_template.jinja`, else the config's
/// `chat_template` (a string, or a list of `{name, template}` of which "default" is
/// taken). Returns the reason when there is none. A template that does not compile is an
/// error naming its file.
fn load_chat_template(dir: &Path, config: &Json) -> Result<(Option<ChatTemplate>, String)> {
    let jinja_path = dir.join("chat_template.jinja");
    match std::fs::read_to_string(&jinja_path) {
        Ok(source) => {
            let t = ChatTemplate::new(source, &jinja_path.display().to_string())?;
            return Ok((Some(t), String::new()));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(Error::Io {
                what: "reading chat template",
                path: jinja_path.display().to_string(),
                source,
            })
        }
    }
    let config_path = dir.join("tokenizer_config.json").display().to_string();
    let source = match &config["chat_template"] {
        Json::String(s) => s.clone(),
        Json::Array(list) => {
            let named = |name: &str| {
                list.iter()
                    .find(|t| t["name"].as_str() == Some(name))
                    .and_then(|t| t["template"].as_str())
            };
            match named("default") {
                Some(s) => s.to_string(),
                None => {
                    let names: Vec<&str> = list.iter().filter_map(|t| t["name"].as_str()).collect();
                    let reason = format!(
                        "`{config_path}` has chat templates {names:?} but none named \
                         \"default\""
                    );
                    return Ok((None, reason));
                }
            }
        }
        _ => {
            let reason = format!(
                "the model has no chat template (no `chat_template` in `{config_path}`, no \
                 `{}`); send a raw prompt instead",
                jinja_path.display()
            );
            return Ok((None, reason));
        }
    };
    Ok((
        Some(ChatTemplate::new(source, &config_path)?),
        String::new(),
    ))
}

/// GPT-2's byte-level BPE alphabet, reversed: the character standing for each byte (the
/// printable bytes stand for themselves, the others for U+0100 onwards, in order).
fn gpt2_char_bytes() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| {
            let c = if printable(b) {
                char::from(b)
            } else {
                next += 1;
                char::from_u32(next - 1).expect("U+0100.. are characters")
            };
            (c, b)
        })
        .collect()
}

/// A SentencePiece token's bytes: `<0xXX>` byte-fallback tokens are that byte, `▁` is a
/// space.
fn sentencepiece_bytes(tok: &str) -> Vec<u8> {
    if let Some(hex) = tok.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')) {
        if let (2, Ok(b)) = (hex.len(), u8::from_str_radix(hex, 16)) {
            return vec![b];
        }
    }
    tok.replace('\u{2581}', " ").into_bytes()
}
