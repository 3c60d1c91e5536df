//! The request bodies of `/v1/completions` and `/v1/chat/completions` (those of
//! `/tokenize` and `/detokenize` are in `tokenize`) as typed structs, each with one
//! `validate()` that checks what the wire format alone decides (types, the OpenAI API's
//! ranges, the model's name, the chat messages' roles and content parts) and names the
//! field it refuses. What depends on the engine (the context, the KV cache, the
//! vocabulary, the log-probability limit) is admission's to check: its refusal comes back
//! typed and is mapped to the same kind of 400 ([`ApiError::refused`](crate::error::ApiError::refused)).
//!
//! No field is silently ignored: [`read`] checks a body's keys against the endpoint's
//! table in `fields` before the typed parsing, refusing with a 400 naming it a field the
//! server does not know or does not support (yet), and logging the few it accepts
//! without using them (`user`, `metadata`, ...). Each body derives `ToSchema` too: its
//! fields' types are the request schemas of `/openapi.json` (`openapi`).

use encore_core::request::{RequestParams, SamplingParams};
use encore_core::tokenizer::{ChatMessage, StopMatcher};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

pub(crate) use crate::field::{check_model, count, flag, given, integer, number, read, Field};

pub(crate) use crate::body_maps::template_kwargs;
use crate::body_maps::{logit_bias, LogitBias};
use crate::chat_messages::messages;
use crate::error::{ApiError, ParamNames};
use crate::fields;
use crate::request_tools::{ChatTool, ChatToolChoice};
use crate::structured::{
    choice, constraint, grammar, regex, response_format, schema, structured_outputs,
    ResponseFormat, Schema, StructuredOutputs,
};
use crate::tools::Tools;

/// `stop`: one string or a list of them.
#[derive(Deserialize, Serialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum Stop {
    One(String),
    Many(Vec<String>),
}

/// What `stream_options` asks a stream to report of its usage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct StreamUsage {
    /// `include_usage`: a last chunk with the whole request's usage.
    pub last: bool,
    /// `continuous_usage_stats` (vLLM's): every chunk carries its choice's usage so far.
    pub every: bool,
}

/// `stream_options`: `include_usage` and vLLM's `continuous_usage_stats` (other keys are
/// refused); only with `stream: true`, as OpenAI has it (a 400 naming it otherwise, not
/// silently ignored).
fn stream_options(f: Field<Map<String, Value>>, stream: bool) -> Result<StreamUsage, ApiError> {
    let Some(o) = f.get("stream_options", || {
        "`stream_options` must be an object".into()
    })?
    else {
        return Ok(StreamUsage::default());
    };
    if !stream {
        return Err(ApiError::bad(
            "stream_options",
            "`stream_options` is only allowed with `stream: true`",
        ));
    }
    fields::check(fields::STREAM_OPTION_KEYS, &o, "stream_options.")?;
    let o: StreamOptionsBody = serde_json::from_value(Value::Object(o))
        .map_err(|e| ApiError::bad("stream_options", format!("invalid `stream_options`: {e}")))?;
    Ok(StreamUsage {
        last: flag(o.include_usage, "stream_options.include_usage")?,
        every: flag(
            o.continuous_usage_stats,
            "stream_options.continuous_usage_stats",
        )?,
    })
}

/// A `stream_options` object (its keys checked against its table first).
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct StreamOptionsBody {
    #[schema(value_type = Option<bool>)]
    include_usage: Field<bool>,
    #[schema(value_type = Option<bool>)]
    continuous_usage_stats: Field<bool>,
}

/// The sampling fields both endpoints share.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct SamplingBody {
    #[schema(value_type = Option<f64>)]
    pub temperature: Field<f64>,
    #[schema(value_type = Option<f64>)]
    pub top_p: Field<f64>,
    #[schema(value_type = Option<i64>)]
    pub top_k: Field<i64>,
    #[schema(value_type = Option<i64>)]
    pub seed: Field<i64>,
    #[schema(value_type = Option<f64>)]
    pub min_p: Field<f64>,
    #[schema(value_type = Option<f64>)]
    pub presence_penalty: Field<f64>,
    #[schema(value_type = Option<f64>)]
    pub frequency_penalty: Field<f64>,
    #[schema(value_type = Option<f64>)]
    pub repetition_penalty: Field<f64>,
}

impl SamplingBody {
    /// The sampling parameters (no log-probabilities yet), and the seed when given.
    pub fn validate(self) -> Result<(SamplingParams, Option<u64>), ApiError> {
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
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct CommonBody {
    #[schema(value_type = Option<String>)]
    model: Field<String>,
    #[serde(flatten)]
    sampling: SamplingBody,
    #[schema(value_type = Option<u64>)]
    max_completion_tokens: Field<u64>,
    #[schema(value_type = Option<u64>)]
    max_tokens: Field<u64>,
    #[schema(value_type = Option<bool>)]
    stream: Field<bool>,
    #[schema(value_type = Option<Object>)]
    stream_options: Field<Map<String, Value>>,
    #[schema(value_type = Option<i64>)]
    n: Field<i64>,
    #[schema(value_type = Option<HashMap<String, f64>>)]
    logit_bias: Field<LogitBias>,
    #[schema(value_type = Option<bool>)]
    ignore_eos: Field<bool>,
    #[schema(value_type = Option<Vec<u32>>)]
    stop_token_ids: Field<Vec<u32>>,
    #[schema(value_type = Option<Stop>)]
    stop: Field<Stop>,
    /// Structured outputs: OpenAI's, vLLM's, and vLLM's older spelling.
    #[schema(value_type = Option<ResponseFormat>)]
    response_format: Field<ResponseFormat>,
    #[schema(value_type = Option<StructuredOutputs>)]
    structured_outputs: Field<StructuredOutputs>,
    #[schema(value_type = Option<Schema>)]
    guided_json: Field<Schema>,
    #[schema(value_type = Option<String>)]
    guided_regex: Field<String>,
    #[schema(value_type = Option<Vec<String>>)]
    guided_choice: Field<Vec<String>>,
    #[schema(value_type = Option<String>)]
    guided_grammar: Field<String>,
}

/// The most samples one request may ask for (`n`).
pub(crate) const MAX_N: usize = 64;

/// How long an output runs when its request gives no `max_tokens`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DefaultLength {
    /// The server's `default_max_tokens` (16, as vLLM's and OpenAI's legacy
    /// completions), shrunk to the room the context leaves.
    Server,
    /// To the context's end: the room the context (and the KV cache) leaves after the
    /// prompt, as OpenAI's and vLLM's chat completions and responses.
    Context,
}

/// What the server needs of a valid body besides its prompt.
pub(crate) struct Common {
    pub stream: bool,
    /// Samples of the prompt (`n`).
    pub n: usize,
    /// Completions' `echo`: each choice's text starts with the prompt's.
    pub echo: bool,
    /// Completions' `echo` with `max_tokens: 0`: each choice is the prompt alone (with its
    /// log-probabilities), the one token the engine runs left out.
    pub score_only: bool,
    pub usage: StreamUsage,
    /// `None`: the request gave none; `default_length` says how long the output runs.
    pub max_tokens: Option<usize>,
    pub default_length: DefaultLength,
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
        check_model(self.model, served, true)?;
        let (sampling, seed) = self.sampling.validate()?;
        let (max_tokens, max_name) =
            match count(self.max_completion_tokens, "max_completion_tokens")? {
                Some(m) => (Some(m), "max_completion_tokens"),
                None => (count(self.max_tokens, "max_tokens")?, "max_tokens"),
            };
        let stream = flag(self.stream, "stream")?;
        let n = integer(self.n, "n", 1, MAX_N as i64)?.unwrap_or(1) as usize;
        let usage = stream_options(self.stream_options, stream)?;
        let ignore_eos = flag(self.ignore_eos, "ignore_eos")?;
        let mut stop_token_ids = if ignore_eos { Vec::new() } else { eos.to_vec() };
        let ids = self.stop_token_ids.get("stop_token_ids", || {
            "`stop_token_ids` must be a list of token ids".into()
        })?;
        stop_token_ids.extend(ids.unwrap_or_default());
        let stop = validate_stop(self.stop)?;
        let logit_bias = logit_bias(self.logit_bias)?;
        let (constraint, constraint_name) = constraint([
            ("response_format", response_format(self.response_format)),
            (
                "structured_outputs",
                structured_outputs(self.structured_outputs),
            ),
            ("guided_json", schema(self.guided_json, "guided_json")),
            ("guided_regex", regex(self.guided_regex, "guided_regex")),
            ("guided_choice", choice(self.guided_choice, "guided_choice")),
            (
                "guided_grammar",
                grammar(self.guided_grammar, "guided_grammar"),
            ),
        ])?;
        let mut c = Common::new(sampling, seed, stop_token_ids);
        c.stream = stream;
        c.n = n;
        c.usage = usage;
        c.max_tokens = max_tokens;
        c.stop = stop;
        c.params.constraint = constraint;
        c.params.logit_bias = logit_bias;
        c.names.max_tokens = max_name;
        c.names.constraint = constraint_name;
        Ok(c)
    }
}

impl Common {
    /// A request of one sample with `sampling`, the `seed` if given, ended by
    /// `stop_token_ids`; not streamed, no stop strings, no constraint, running to the
    /// context's end unless it gives `max_tokens`.
    pub fn new(sampling: SamplingParams, seed: Option<u64>, stop_token_ids: Vec<u32>) -> Self {
        Common {
            stream: false,
            n: 1,
            echo: false,
            score_only: false,
            usage: StreamUsage::default(),
            max_tokens: None,
            default_length: DefaultLength::Context,
            params: RequestParams {
                sampling,
                max_tokens: 0,
                stop_token_ids,
                // The stop ids already hold the model's end tokens unless ignore_eos.
                ignore_eos: false,
                // The OpenAI API's rule: prompt and max_tokens must fit the context.
                fit_context: true,
                constraint: None,
                share_prompt: None,
                logit_bias: Vec::new(),
            },
            seed,
            stop: StopMatcher::new(Vec::<String>::new()).expect("no stop strings"),
            names: ParamNames {
                max_tokens: "max_tokens",
                logprobs: "logprobs",
                constraint: "response_format",
            },
        }
    }
}

/// `stop`: a string or a list of at most 4, none empty.
pub(crate) fn validate_stop(f: Field<Stop>) -> Result<StopMatcher, ApiError> {
    let rule = || "`stop` must be a string or a list of at most 4 strings".to_string();
    let stop = match f.get("stop", rule)? {
        None => Vec::new(),
        Some(Stop::One(x)) => vec![x],
        Some(Stop::Many(v)) if v.len() <= 4 => v,
        Some(Stop::Many(_)) => return Err(ApiError::bad("stop", rule())),
    };
    StopMatcher::new(stop).map_err(|_| ApiError::bad("stop", "a `stop` string must not be empty"))
}

/// A completion's `prompt`: text, token ids, or a batch of either (one choice, or `n`,
/// per prompt, in order).
#[derive(Deserialize, Serialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum Prompt {
    Text(String),
    Ids(Vec<u64>),
    Texts(Vec<String>),
    Batch(Vec<Vec<u64>>),
}

/// The most prompts one completion request may batch.
pub(crate) const MAX_PROMPTS: usize = 256;

/// The body of `/v1/completions`.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct CompletionBody {
    #[schema(value_type = Option<Prompt>)]
    prompt: Field<Prompt>,
    /// The number of top log-probabilities per token.
    #[schema(value_type = Option<u64>)]
    logprobs: Field<u64>,
    #[schema(value_type = Option<bool>)]
    echo: Field<bool>,
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
    /// The prompts (one, or a batch), and the common fields.
    pub fn validate(
        self,
        served: &str,
        eos: &[u32],
    ) -> Result<(Vec<PromptInput>, Common), ApiError> {
        let rule =
            || "`prompt` must be a string, a list of token ids, or a list of either".to_string();
        let prompts = match self.prompt.get("prompt", rule)? {
            None => return Err(ApiError::bad("prompt", "`prompt` is required")),
            Some(Prompt::Text(t)) => vec![PromptInput::Text(t)],
            Some(Prompt::Ids(ids)) if ids.is_empty() => {
                return Err(ApiError::bad("prompt", rule()))
            }
            Some(Prompt::Ids(ids)) => vec![token_ids(ids)?],
            Some(Prompt::Texts(t)) => t.into_iter().map(PromptInput::Text).collect(),
            Some(Prompt::Batch(b)) => {
                if b.iter().any(Vec::is_empty) {
                    return Err(ApiError::bad("prompt", "a prompt of `prompt` is empty"));
                }
                b.into_iter().map(token_ids).collect::<Result<_, _>>()?
            }
        };
        if prompts.len() > MAX_PROMPTS {
            return Err(ApiError::bad(
                "prompt",
                format!("`prompt` batches at most {MAX_PROMPTS} prompts"),
            ));
        }
        let mut c = self.common.validate(served, eos)?;
        if prompts.len() > 1 && c.stream {
            return Err(ApiError::bad(
                "prompt",
                "a batch of prompts is not streamed yet: send them one by one, or `stream: false`",
            ));
        }
        c.default_length = DefaultLength::Server;
        c.params.sampling.logprobs = count(self.logprobs, "logprobs")?;
        c.echo = flag(self.echo, "echo")?;
        if c.echo {
            // The echoed prompt's tokens get log-probabilities too.
            c.params.sampling.prompt_logprobs = c.params.sampling.logprobs;
            // Scoring a prompt (lm-evaluation-harness, vLLM's `max_tokens: 0`): the prompt
            // alone. The engine runs one token, which the answer leaves out.
            if c.max_tokens == Some(0) {
                c.max_tokens = Some(1);
                c.score_only = true;
            }
        }
        Ok((prompts, c))
    }
}

/// A prompt's token ids, each 32-bit (their vocabulary is admission's to check).
fn token_ids(ids: Vec<u64>) -> Result<PromptInput, ApiError> {
    ids.into_iter()
        .map(|t| {
            u32::try_from(t).map_err(|_| {
                ApiError::bad(
                    "prompt",
                    format!("token id {t} is outside the vocabulary (ids are 32-bit)"),
                )
            })
        })
        .collect::<Result<_, _>>()
        .map(PromptInput::Ids)
}

/// The body of `/v1/chat/completions`.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct ChatBody {
    #[schema(value_type = Option<Vec<Object>>)]
    messages: Field<Vec<Value>>,
    /// Whether to return log-probabilities, and how many top ones per token.
    #[schema(value_type = Option<bool>)]
    logprobs: Field<bool>,
    #[schema(value_type = Option<u64>)]
    top_logprobs: Field<u64>,
    #[schema(value_type = Option<Vec<ChatTool>>)]
    tools: Field<Vec<Value>>,
    #[schema(value_type = Option<ChatToolChoice>)]
    tool_choice: Field<ChatToolChoice>,
    #[schema(value_type = Option<bool>)]
    parallel_tool_calls: Field<bool>,
    #[schema(value_type = Option<HashMap<String, serde_json::Value>>)]
    chat_template_kwargs: Field<Map<String, Value>>,
    /// How much the model reasons: `low`, `medium` or `high` (gpt-oss's harmony, and chat
    /// templates that read `reasoning_effort`).
    #[schema(value_type = Option<String>)]
    reasoning_effort: Field<String>,
    #[serde(flatten)]
    common: CommonBody,
}

/// A valid chat body: the conversation, how to render it, and the common fields.
pub(crate) struct Chat {
    pub messages: Vec<ChatMessage>,
    pub tools: Option<Tools>,
    /// `chat_template_kwargs`.
    pub kwargs: Map<String, Value>,
    /// `reasoning_effort` (whether the model takes one is the prompt's to check).
    pub effort: Option<String>,
    pub common: Common,
}

impl ChatBody {
    pub fn validate(self, served: &str, eos: &[u32]) -> Result<Chat, ApiError> {
        let messages = messages(self.messages)?;
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
        let tools = Tools::read(self.tools, self.tool_choice, self.parallel_tool_calls)?;
        // A forced call's grammar wins over `response_format` (see `tools::Tools::constraint`).
        if let Some(forced) = tools.as_ref().and_then(Tools::constraint) {
            c.params.constraint = Some(forced);
            c.names.constraint = "tools";
        }
        let kwargs = template_kwargs(self.chat_template_kwargs)?;
        let effort = self.reasoning_effort.get("reasoning_effort", || {
            "`reasoning_effort` must be a string: `low`, `medium` or `high`".into()
        })?;
        Ok(Chat {
            messages,
            tools,
            kwargs,
            effort,
            common: c,
        })
    }
}

#[cfg(test)]
mod tests {
    use encore_core::tokenizer::{FunctionCall, ToolCall};
    use serde::de::DeserializeOwned;

    use crate::fields::Rule;

    use crate::tokenize::{DetokenizeBody, TokenizeBody, TokenizeInput};
    use serde_json::json;

    use super::*;

    /// `body` checked against `table`, read as a `T` and validated by `v`.
    fn run<T: DeserializeOwned, R>(
        table: &[Rule],
        body: &Value,
        v: impl FnOnce(T) -> Result<R, ApiError>,
    ) -> Result<R, ApiError> {
        fields::check(table, body.as_object().unwrap(), "")?;
        v(serde_json::from_value(body.clone()).unwrap())
    }

    fn param(r: Result<impl Sized, ApiError>) -> String {
        r.err()
            .and_then(|e| e.param)
            .unwrap_or_default()
            .into_owned()
    }

    /// Every field a table calls honored is read by the typed body: a value of the wrong
    /// type is refused naming it.
    #[test]
    fn every_honored_field_is_read_by_its_body() {
        let wrong = json!([[[]]]);
        // The `param` of a body's refusal ("" when valid).
        type ParamOf = dyn Fn(&Value) -> String;
        let endpoints: [(&[Rule], Value, &ParamOf); 4] = [
            (
                fields::COMPLETIONS,
                json!({"model": "m", "prompt": "x"}),
                &|b| {
                    param(run(fields::COMPLETIONS, b, |c: CompletionBody| {
                        c.validate("m", &[])
                    }))
                },
            ),
            (
                fields::CHAT,
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
                &|b| param(run(fields::CHAT, b, |c: ChatBody| c.validate("m", &[]))),
            ),
            (
                fields::TOKENIZE,
                json!({"messages": [{"role": "user", "content": "x"}]}),
                &|b| param(run(fields::TOKENIZE, b, |c: TokenizeBody| c.validate("m"))),
            ),
            (fields::DETOKENIZE, json!({"tokens": [1]}), &|b| {
                param(run(fields::DETOKENIZE, b, |c: DetokenizeBody| {
                    c.validate("m", 9)
                }))
            }),
        ];
        for (table, base, param_of) in endpoints {
            assert_eq!(param_of(&base), "", "{base}");
            for rule in table {
                if let fields::Handling::Honored = rule.handling {
                    let mut body = base.clone();
                    body[rule.name] = wrong.clone();
                    let p = param_of(&body);
                    assert!(p.starts_with(rule.name), "{body}: param {p:?}");
                }
            }
        }
    }

    fn chat(messages: Value) -> Result<Vec<ChatMessage>, ApiError> {
        let body = json!({"model": "m", "messages": messages});
        run(fields::CHAT, &body, |c: ChatBody| c.validate("m", &[])).map(|c| c.messages)
    }

    #[test]
    fn messages_take_roles_and_text_parts() {
        let m = chat(json!([
            {"role": "developer", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
            {"role": "user", "content": "hi", "name": null, "tool_calls": null},
            {"role": "assistant", "content": null},
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
              "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": [2]}"}}],
             "reasoning_content": "why"},
            {"role": "tool", "content": "22C", "tool_call_id": "c1", "name": "f"},
        ]))
        .unwrap_or_else(|e| panic!("{}", e.message));
        let mut call = ChatMessage::new("assistant", "");
        let none = call.clone();
        call.reasoning_content = Some("why".into());
        call.tool_calls = vec![ToolCall {
            id: "c1".into(),
            kind: "function".into(),
            function: FunctionCall {
                name: "f".into(),
                arguments: json!({"b": 1, "a": [2]}),
            },
        }];
        let tool = ChatMessage {
            tool_call_id: Some("c1".into()),
            name: Some("f".into()),
            ..ChatMessage::new("tool", "22C")
        };
        assert_eq!(
            m,
            [
                ChatMessage::new("system", "be brief"),
                ChatMessage::new("user", "hi"),
                none,
                call,
                tool,
            ]
        );
    }

    #[test]
    fn bad_messages_are_refused_naming_the_field() {
        let user = |content: Value| json!([{"role": "user", "content": "a"}, {"role": "user", "content": content}]);
        for (messages, want, words) in [
            (
                json!([{"role": "wizard", "content": "x"}]),
                "messages[0].role",
                "wizard",
            ),
            (json!([{"content": "x"}]), "messages[0].role", "role"),
            (
                json!([{"role": "tool", "content": "x", "tool_call_id": null}]),
                "messages[0].tool_call_id",
                "required",
            ),
            (
                json!([{"role": "user", "content": "x", "tool_call_id": "c"}]),
                "messages[0].tool_call_id",
                "belongs to `tool`",
            ),
            (json!([{"role": "user"}]), "messages[0].content", "required"),
            (json!([5]), "messages[0]", "object"),
            (
                user(json!(7)),
                "messages[1].content",
                "list of content parts",
            ),
            (
                user(
                    json!([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]),
                ),
                "messages[1].content[1].type",
                "`image_url` is not supported",
            ),
            (
                user(json!([{"text": "a"}])),
                "messages[1].content[0]",
                "type",
            ),
            (
                user(json!([{"type": "text"}])),
                "messages[1].content[0]",
                "text",
            ),
            (
                user(json!([{"type": "text", "text": 5}])),
                "messages[1].content[0]",
                "text",
            ),
            (
                user(json!([{"type": "text", "text": "a", "cache_control": {}}])),
                "messages[1].content[0].cache_control",
                "unknown field",
            ),
            (
                json!([{"role": "user", "content": "x", "name": 5}]),
                "messages[0].name",
                "string",
            ),
            (
                json!([{"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}]),
                "messages[0].tool_calls[0]",
                "function",
            ),
            (
                json!([{"role": "assistant", "tool_calls": [{"id": "1", "type": "function",
                         "function": {"name": "f", "arguments": {"a": 1}}}]}]),
                "messages[0].tool_calls[0]",
                "arguments",
            ),
            (
                json!([{"role": "user", "content": "x", "weight": 1}]),
                "messages[0].weight",
                "unknown field",
            ),
        ] {
            let e = chat(messages.clone())
                .err()
                .unwrap_or_else(|| panic!("{messages} accepted"));
            assert_eq!(e.param.as_deref(), Some(want), "{messages}: {}", e.message);
            assert!(e.message.contains(words), "{messages}: {}", e.message);
        }
    }

    #[test]
    fn stream_options_keys_are_checked() {
        let body =
            |o: Value| json!({"model": "m", "prompt": "x", "stream": true, "stream_options": o});
        let common = |o| {
            run(fields::COMPLETIONS, &body(o), |c: CompletionBody| {
                c.validate("m", &[])
            })
        };
        assert!(common(json!({"include_usage": true})).unwrap().1.usage.last);
        let both = json!({"include_usage": true, "continuous_usage_stats": true});
        assert_eq!(
            common(both).unwrap().1.usage,
            StreamUsage {
                last: true,
                every: true
            }
        );
        assert_eq!(
            param(common(json!({"include_usage": 1}))),
            "stream_options.include_usage"
        );
        assert_eq!(
            param(common(json!({"continuous_usage_stats": "yes"}))),
            "stream_options.continuous_usage_stats"
        );
        assert_eq!(
            param(common(json!({"include_obfuscation": true}))),
            "stream_options.include_obfuscation"
        );
    }

    #[test]
    fn tokenize_and_detokenize_bodies() {
        let tok = |b: Value| run(fields::TOKENIZE, &b, |c: TokenizeBody| c.validate("m"));
        match tok(json!({"prompt": "x"})) {
            Ok((TokenizeInput::Text(p), true)) => assert_eq!(p, "x"),
            _ => panic!("prompt"),
        }
        match tok(
            json!({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": false}),
        ) {
            Ok((TokenizeInput::Chat { opts, messages }, false)) => {
                assert!(!opts.add_generation_prompt);
                assert_eq!(messages, [ChatMessage::new("user", "x")])
            }
            _ => panic!("messages"),
        }
        assert_eq!(param(tok(json!({}))), "prompt");
        assert_eq!(
            param(tok(json!({"prompt": "x", "messages": []}))),
            "messages"
        );
        assert_eq!(
            param(tok(json!({"prompt": "x", "add_generation_prompt": true}))),
            "add_generation_prompt"
        );
        assert_eq!(
            param(tok(json!({"prompt": "x", "model": "other"}))),
            "model"
        );
        assert_eq!(
            param(tok(json!({"prompt": "x", "return_token_strs": true}))),
            "return_token_strs"
        );
        let detok = |b: Value| {
            run(fields::DETOKENIZE, &b, |c: DetokenizeBody| {
                c.validate("m", 10)
            })
        };
        assert_eq!(detok(json!({"tokens": [0, 9]})).ok(), Some(vec![0, 9]));
        assert_eq!(param(detok(json!({"tokens": [10]}))), "tokens");
        assert_eq!(param(detok(json!({"tokens": [4294967296u64]}))), "tokens");
        assert_eq!(param(detok(json!({}))), "tokens");
    }
}
