//! The request bodies of `/v1/completions` and `/v1/chat/completions` as typed structs,
//! each with one `validate()` that checks what the wire format alone decides (types,
//! the OpenAI API's ranges, the model's name) and names the field it refuses. What depends
//! on the engine (the context, the KV cache, the vocabulary, the log-probability limit) is
//! admission's to check: its refusal comes back typed and is mapped to the same kind of
//! 400 ([`ApiError::refused`](crate::error::ApiError::refused)).
//!
//! Fields the server does not know are ignored, as the hand-written parser this replaced
//! ignored them (OpenAI clients send fields such as `user` and `n`).

use axum::http::StatusCode;
use encore_core::request::{RequestParams, SamplingParams};
use encore_core::tokenizer::{ChatMessage, StopMatcher};
use serde::de::{DeserializeOwned, Deserializer, Error as _};
use serde::Deserialize;
use serde_json::Value;

use crate::error::{ApiError, ParamNames};

/// A field as the client sent it. A value of the wrong type does not fail the body's
/// deserialization: `validate` refuses it with a message naming the field. `null` reads
/// as absent.
#[derive(Default)]
pub(crate) enum Field<T> {
    #[default]
    Absent,
    Given(T),
    Wrong,
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Field<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Value::deserialize(d)? {
            Value::Null => Field::Absent,
            v => serde_json::from_value(v).map_or(Field::Wrong, Field::Given),
        })
    }
}

impl<T> Field<T> {
    /// The value (`None` when absent), or a 400 for field `name` saying `rule`.
    fn get(self, name: &'static str, rule: impl FnOnce() -> String) -> Result<Option<T>, ApiError> {
        match self {
            Field::Absent => Ok(None),
            Field::Given(x) => Ok(Some(x)),
            Field::Wrong => Err(ApiError::bad(name, rule())),
        }
    }
}

/// A JSON object read as `T` (a derived struct would also take a JSON array, by
/// position).
pub(crate) struct Object<T>(T);

impl<'de, T: DeserializeOwned> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        if !v.is_object() {
            return Err(D::Error::custom("expected a JSON object"));
        }
        serde_json::from_value(v)
            .map(Object)
            .map_err(D::Error::custom)
    }
}

/// A number field in `[lo, hi]`, `default` when absent.
fn number(
    f: Field<f64>,
    name: &'static str,
    lo: f64,
    hi: f64,
    default: f64,
) -> Result<f64, ApiError> {
    let rule = || format!("`{name}` must be a number in [{lo}, {hi}]");
    match f.get(name, rule)? {
        None => Ok(default),
        Some(x) if x.is_finite() && x >= lo && x <= hi => Ok(x),
        Some(_) => Err(ApiError::bad(name, rule())),
    }
}

/// An integer field in `[lo, hi]`.
fn integer(f: Field<i64>, name: &'static str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
    let rule = || format!("`{name}` must be an integer in [{lo}, {hi}]");
    match f.get(name, rule)? {
        Some(x) if x < lo || x > hi => Err(ApiError::bad(name, rule())),
        x => Ok(x),
    }
}

/// A non-negative integer field (its upper bound is admission's to check).
fn count(f: Field<u64>, name: &'static str) -> Result<Option<usize>, ApiError> {
    let n = f.get(name, || format!("`{name}` must be a non-negative integer"))?;
    Ok(n.map(|n| usize::try_from(n).unwrap_or(usize::MAX)))
}

/// A boolean field, `false` when absent.
fn flag(f: Field<bool>, name: &'static str) -> Result<bool, ApiError> {
    Ok(f.get(name, || format!("`{name}` must be a boolean"))?
        .unwrap_or(false))
}

/// `stop`: one string or a list of them.
#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Default, Deserialize)]
#[serde(default)]
pub(crate) struct StreamOptions {
    include_usage: Field<bool>,
}

/// The sampling fields both endpoints share.
#[derive(Default, Deserialize)]
#[serde(default)]
pub(crate) struct SamplingBody {
    temperature: Field<f64>,
    top_p: Field<f64>,
    top_k: Field<i64>,
    seed: Field<i64>,
    min_p: Field<f64>,
    presence_penalty: Field<f64>,
    frequency_penalty: Field<f64>,
    repetition_penalty: Field<f64>,
}

impl SamplingBody {
    /// The sampling parameters (no log-probabilities yet), and the seed when given.
    fn validate(self) -> Result<(SamplingParams, Option<u64>), ApiError> {
        let temperature = number(self.temperature, "temperature", 0.0, 2.0, 1.0)?;
        // Above 0 in f32 too: the kernel reads 0 as "off".
        let top_p = number(self.top_p, "top_p", f32::MIN_POSITIVE as f64, 1.0, 1.0)?;
        let top_k = integer(self.top_k, "top_k", -1, i32::MAX as i64)?.unwrap_or(0);
        let seed = integer(self.seed, "seed", i64::MIN, i64::MAX)?;
        let min_p = number(self.min_p, "min_p", 0.0, 1.0, 0.0)?;
        let presence_penalty = number(self.presence_penalty, "presence_penalty", -2.0, 2.0, 0.0)?;
        let frequency_penalty =
            number(self.frequency_penalty, "frequency_penalty", -2.0, 2.0, 0.0)?;
        // Its lower bound (> 0) is admission's.
        let repetition_penalty = self
            .repetition_penalty
            .get("repetition_penalty", || {
                "`repetition_penalty` must be a number".into()
            })?
            .unwrap_or(1.0);
        let sampling = SamplingParams {
            temperature: temperature as f32,
            top_k: top_k as i32,
            top_p: top_p as f32,
            min_p: min_p as f32,
            presence_penalty: presence_penalty as f32,
            frequency_penalty: frequency_penalty as f32,
            repetition_penalty: repetition_penalty as f32,
            ..Default::default()
        };
        Ok((sampling, seed.map(|x| x as u64)))
    }
}

/// The fields both endpoints share: the model, sampling, length, streaming and stops.
#[derive(Default, Deserialize)]
#[serde(default)]
pub(crate) struct CommonBody {
    model: Field<String>,
    #[serde(flatten)]
    sampling: SamplingBody,
    max_completion_tokens: Field<u64>,
    max_tokens: Field<u64>,
    stream: Field<bool>,
    stream_options: Field<Object<StreamOptions>>,
    ignore_eos: Field<bool>,
    stop_token_ids: Field<Vec<u32>>,
    stop: Field<Stop>,
}

/// What the server needs of a valid body besides its prompt.
pub(crate) struct Common {
    pub stream: bool,
    pub include_usage: bool,
    /// `None`: the request gave none; the server's default applies (it shrinks to the
    /// room the context leaves, as vLLM's does).
    pub max_tokens: Option<usize>,
    /// The request's parameters (its `max_tokens` and seed are set once the defaults
    /// are known).
    pub params: RequestParams,
    /// The seed the request gave (the server picks one otherwise).
    pub seed: Option<u64>,
    /// Stop strings (at most 4, none empty), checked on the detokenized text.
    pub stop: StopMatcher,
    /// How this body spells the parameters admission may refuse.
    pub names: ParamNames,
}

impl CommonBody {
    /// Check every field; `served` is the model this server serves, `eos` the model's
    /// end-of-generation tokens.
    fn validate(self, served: &str, eos: &[u32]) -> Result<Common, ApiError> {
        check_model(self.model, served)?;
        let (sampling, seed) = self.sampling.validate()?;
        let (max_tokens, max_name) =
            match count(self.max_completion_tokens, "max_completion_tokens")? {
                Some(m) => (Some(m), "max_completion_tokens"),
                None => (count(self.max_tokens, "max_tokens")?, "max_tokens"),
            };
        let stream = flag(self.stream, "stream")?;
        let include_usage = match self.stream_options.get("stream_options", || {
            "`stream_options` must be an object".into()
        })? {
            None => false,
            Some(Object(o)) => o
                .include_usage
                .get("stream_options", || {
                    "`include_usage` must be a boolean".into()
                })?
                .unwrap_or(false),
        };
        let ignore_eos = flag(self.ignore_eos, "ignore_eos")?;
        let mut stop_token_ids = if ignore_eos { Vec::new() } else { eos.to_vec() };
        let ids = self.stop_token_ids.get("stop_token_ids", || {
            "`stop_token_ids` must be a list of token ids".into()
        })?;
        stop_token_ids.extend(ids.unwrap_or_default());
        let stop = validate_stop(self.stop)?;
        Ok(Common {
            stream,
            include_usage,
            max_tokens,
            params: RequestParams {
                sampling,
                max_tokens: max_tokens.unwrap_or(0),
                stop_token_ids,
                // The stop ids already hold the model's end tokens unless ignore_eos.
                ignore_eos: false,
                // The OpenAI API's rule: prompt and max_tokens must fit the context.
                fit_context: true,
            },
            seed,
            stop,
            names: ParamNames {
                max_tokens: max_name,
                logprobs: "logprobs",
            },
        })
    }
}

/// `model`: required, and the model this server serves (`served`; a 404 otherwise).
fn check_model(model: Field<String>, served: &str) -> Result<(), ApiError> {
    match model.get("model", || "`model` must be a string".into())? {
        None => Err(ApiError::bad("model", "`model` is required")),
        Some(m) if m != served => Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("the model `{m}` does not exist; this server serves `{served}`"),
            kind: "invalid_request_error",
            param: Some("model"),
        }),
        Some(_) => Ok(()),
    }
}

/// `stop`: a string or a list of at most 4, none empty.
fn validate_stop(f: Field<Stop>) -> Result<StopMatcher, ApiError> {
    let rule = || "`stop` must be a string or a list of at most 4 strings".to_string();
    let stop = match f.get("stop", rule)? {
        None => Vec::new(),
        Some(Stop::One(x)) => vec![x],
        Some(Stop::Many(v)) if v.len() <= 4 => v,
        Some(Stop::Many(_)) => return Err(ApiError::bad("stop", rule())),
    };
    StopMatcher::new(stop).map_err(|_| ApiError::bad("stop", "a `stop` string must not be empty"))
}

/// A completion's `prompt`: text, or token ids.
#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum Prompt {
    Text(String),
    Ids(Vec<u64>),
}

/// The body of `/v1/completions`.
#[derive(Default, Deserialize)]
#[serde(default)]
pub(crate) struct CompletionBody {
    prompt: Field<Prompt>,
    /// The number of top log-probabilities per token.
    logprobs: Field<u64>,
    #[serde(flatten)]
    common: CommonBody,
}

/// A completion's prompt as given: text to encode, or token ids (their vocabulary is
/// admission's to check).
pub(crate) enum PromptInput {
    Text(String),
    Ids(Vec<u32>),
}

impl CompletionBody {
    pub fn validate(self, served: &str, eos: &[u32]) -> Result<(PromptInput, Common), ApiError> {
        let rule = || "`prompt` must be a string or a list of token ids".to_string();
        let prompt = match self.prompt.get("prompt", rule)? {
            None => return Err(ApiError::bad("prompt", "`prompt` is required")),
            Some(Prompt::Text(t)) => PromptInput::Text(t),
            Some(Prompt::Ids(ids)) if ids.is_empty() => {
                return Err(ApiError::bad("prompt", rule()))
            }
            Some(Prompt::Ids(ids)) => PromptInput::Ids(
                ids.into_iter()
                    .map(|t| {
                        u32::try_from(t).map_err(|_| {
                            ApiError::bad(
                                "prompt",
                                format!("token id {t} is outside the vocabulary (ids are 32-bit)"),
                            )
                        })
                    })
                    .collect::<Result<_, _>>()?,
            ),
        };
        let mut c = self.common.validate(served, eos)?;
        c.params.sampling.logprobs = count(self.logprobs, "logprobs")?;
        Ok((prompt, c))
    }
}

/// One chat message.
#[derive(Deserialize)]
pub(crate) struct Message {
    role: String,
    content: String,
}

/// The body of `/v1/chat/completions`.
#[derive(Default, Deserialize)]
#[serde(default)]
pub(crate) struct ChatBody {
    messages: Field<Vec<Field<Object<Message>>>>,
    /// Whether to return log-probabilities, and how many top ones per token.
    logprobs: Field<bool>,
    top_logprobs: Field<u64>,
    #[serde(flatten)]
    common: CommonBody,
}

impl ChatBody {
    pub fn validate(
        self,
        served: &str,
        eos: &[u32],
    ) -> Result<(Vec<ChatMessage>, Common), ApiError> {
        let list = || "`messages` must be a non-empty list".to_string();
        let messages = match self.messages.get("messages", list)? {
            Some(m) if !m.is_empty() => m,
            _ => return Err(ApiError::bad("messages", list())),
        };
        let messages = messages
            .into_iter()
            .map(|m| match m {
                Field::Given(Object(m)) => Ok(ChatMessage::new(m.role, m.content)),
                _ => Err(ApiError::bad(
                    "messages",
                    "each message needs a string `role` and `content`",
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut c = self.common.validate(served, eos)?;
        let on = flag(self.logprobs, "logprobs")?;
        let top = count(self.top_logprobs, "top_logprobs")?;
        if top.is_some() && !on {
            return Err(ApiError::bad(
                "top_logprobs",
                "`top_logprobs` needs `logprobs: true`",
            ));
        }
        c.params.sampling.logprobs = on.then_some(top.unwrap_or(0));
        c.names.logprobs = "top_logprobs";
        Ok((messages, c))
    }
}
