//! The fields each endpoint knows, one table per endpoint: honored (read by the typed body
//! of `body.rs`), accepted and logged (they never change the output), or refused with a
//! 400 naming them unless their value changes nothing. [`check`] runs over a body's keys
//! before the typed parsing, so no field is silently ignored: a key no table lists is
//! refused as unknown (a typo such as `temprature` too). `null` reads as absent
//! everywhere. README.md's "Server API fields" tables are these tables (a test checks
//! that they agree), and so are the request schemas of `/openapi.json` (`openapi`, whose
//! tests check each table against the typed body that reads it).

use serde_json::{Map, Value};

use crate::error::ApiError;

/// What an endpoint does with a field.
#[derive(Clone, Copy)]
pub(crate) enum Handling {
    /// Read by the typed body and honored.
    Honored,
    /// Accepted when of this JSON type, and logged (debug); never changes the output.
    Logged(Shape),
    /// A 400 with the rule's note as its message, unless the value is this no-op.
    Refused(NoOp),
}

/// The JSON type of a logged field.
#[derive(Clone, Copy)]
pub(crate) enum Shape {
    String,
    Object,
}

/// The values of a refused field that change nothing (accepted as if absent).
#[derive(Clone, Copy)]
pub(crate) enum NoOp {
    /// Only `null`.
    Nothing,
    False,
    One,
    /// `""`, `[]` or `{}`.
    Empty,
    /// This JSON value.
    Is(&'static str),
    /// One of these strings.
    AnyOf(&'static [&'static str]),
}

impl NoOp {
    fn allows(self, v: &Value) -> bool {
        match self {
            NoOp::Nothing => false,
            NoOp::False => *v == Value::Bool(false),
            NoOp::One => v.as_f64() == Some(1.0),
            NoOp::Empty => match v {
                Value::String(s) => s.is_empty(),
                Value::Array(a) => a.is_empty(),
                Value::Object(o) => o.is_empty(),
                _ => false,
            },
            NoOp::Is(json) => serde_json::from_str::<Value>(json).is_ok_and(|x| x == *v),
            NoOp::AnyOf(list) => v.as_str().is_some_and(|s| list.contains(&s)),
        }
    }
}

/// One field of an endpoint.
pub(crate) struct Rule {
    pub name: &'static str,
    pub handling: Handling,
    /// What the server does with it (for the README); for a refused field, the message
    /// of its 400.
    pub note: &'static str,
}

const fn honored(name: &'static str, note: &'static str) -> Rule {
    Rule {
        name,
        handling: Handling::Honored,
        note,
    }
}

const fn logged(name: &'static str, shape: Shape) -> Rule {
    Rule {
        name,
        handling: Handling::Logged(shape),
        note: "logged (debug level); does not change the output",
    }
}

const fn refused(name: &'static str, ok: NoOp, why: &'static str) -> Rule {
    Rule {
        name,
        handling: Handling::Refused(ok),
        note: why,
    }
}

const MODEL: Rule = honored(
    "model",
    "required; the served model name (`--served-model-name`), 404 otherwise",
);
const MAX_TOKENS: Rule = honored(
    "max_tokens",
    "the most tokens to generate; default 16 (as OpenAI's and vLLM's), shrunk to the room the context leaves; 0 only with `echo` (the prompt scored alone)",
);
const CHAT_MAX_TOKENS: Rule = honored(
    "max_tokens",
    "the most tokens to generate; default: to the context's end (the context less the prompt), as OpenAI's and vLLM's",
);
const MAX_COMPLETION_TOKENS: Rule = honored(
    "max_completion_tokens",
    "the same as `max_tokens` (wins when both are given)",
);
const TEMPERATURE: Rule = honored("temperature", "0..=2, default 1; 0 is greedy");
const TOP_P: Rule = honored("top_p", "(0, 1], default 1");
const TOP_K: Rule = honored("top_k", "-1 or 0: off (vLLM extension)");
const MIN_P: Rule = honored("min_p", "0..=1, default 0 (vLLM extension)");
const SEED: Rule = honored(
    "seed",
    "a 64-bit integer: the same seed gives the same output",
);
const PRESENCE_PENALTY: Rule = honored("presence_penalty", "-2..=2, default 0");
const FREQUENCY_PENALTY: Rule = honored("frequency_penalty", "-2..=2, default 0");
const REPETITION_PENALTY: Rule = honored(
    "repetition_penalty",
    "above 0, default 1 (vLLM extension and semantics)",
);
const STOP: Rule = honored(
    "stop",
    "a string or a list of at most 4: the text ends before the first to occur",
);
const STOP_TOKEN_IDS: Rule = honored(
    "stop_token_ids",
    "token ids that end the text besides the model's end tokens (vLLM extension)",
);
const IGNORE_EOS: Rule = honored(
    "ignore_eos",
    "generate past the model's end tokens, up to `max_tokens` (vLLM extension; guidellm sends it)",
);
const STREAM: Rule = honored("stream", "server-sent events");
/// vLLM's sampling extensions the server does not honor yet: refused by name, their
/// defaults accepted.
const MIN_TOKENS: Rule = refused(
    "min_tokens",
    NoOp::Is("0"),
    "`min_tokens` (vLLM extension) is not supported yet: the engine does not hold back the end tokens; for a set length give `ignore_eos` with `max_tokens`",
);
const RETURN_TOKEN_IDS: Rule = refused(
    "return_token_ids",
    NoOp::False,
    "`return_token_ids` (vLLM extension) is not supported yet: a whole answer's choices carry their `token_ids` already",
);
const PROMPT_LOGPROBS: Rule = refused(
    "prompt_logprobs",
    NoOp::Nothing,
    "`prompt_logprobs` (vLLM extension) is not supported yet: on /v1/completions, `echo` with `logprobs` scores the prompt",
);
const SKIP_SPECIAL_TOKENS: Rule = refused(
    "skip_special_tokens",
    NoOp::Is("true"),
    "`skip_special_tokens: false` (vLLM extension) is not supported yet: the text leaves special tokens out",
);
const SPACES_BETWEEN_SPECIAL_TOKENS: Rule = refused(
    "spaces_between_special_tokens",
    NoOp::Is("true"),
    "`spaces_between_special_tokens: false` (vLLM extension) is not supported yet",
);
const TRUNCATE_PROMPT_TOKENS: Rule = refused(
    "truncate_prompt_tokens",
    NoOp::Nothing,
    "`truncate_prompt_tokens` (vLLM extension) is not supported: a prompt longer than the context is refused, not cut",
);
const STREAM_OPTIONS: Rule = honored(
    "stream_options",
    "only with `stream: true` (a 400 otherwise, as OpenAI); `include_usage` adds a final usage chunk, vLLM's `continuous_usage_stats` a `usage` object to every chunk; other keys are refused",
);
const N: Rule = honored(
    "n",
    "1..=64 samples of the prompt (`choices[i]`), each with its own sampling stream (seed + i); the prompt is computed once and its KV blocks shared",
);
const LOGIT_BIAS: Rule = honored(
    "logit_bias",
    "token ids (as strings) to biases in [-100, 100], added to the logits before sampling, inside the captured step (at most 1024)",
);
const ECHO: Rule = refused(
    "echo",
    NoOp::False,
    "`echo` is not supported on chat completions",
);
const USER: Rule = logged("user", Shape::String);
const RESPONSE_FORMAT: Rule = honored(
    "response_format",
    "`text`, `json_object` or `json_schema` (its `schema`; `strict` or not, the output follows it): decoding is constrained to match",
);
const STRUCTURED_OUTPUTS: Rule = honored(
    "structured_outputs",
    "one of `json` (a schema), `json_object`, `regex`, `choice`, `grammar` (Lark) (vLLM extension)",
);
const GUIDED_JSON: Rule = honored("guided_json", "a JSON schema (vLLM's older spelling)");
const GUIDED_REGEX: Rule = honored(
    "guided_regex",
    "a regular expression (vLLM's older spelling)",
);
const GUIDED_CHOICE: Rule = honored("guided_choice", "a list of strings (vLLM's older spelling)");
const GUIDED_GRAMMAR: Rule = honored("guided_grammar", "a Lark grammar (vLLM's older spelling)");
const CHAT_TEMPLATE_KWARGS: Rule = honored(
    "chat_template_kwargs",
    "more variables for the chat template, e.g. `{\"enable_thinking\": false}` (vLLM extension); those the server sets are refused",
);
const TOOLS: Rule = honored(
    "tools",
    "`{\"type\": \"function\", \"function\": {name, description, parameters, strict}}` each, rendered by the chat template; when it renders none, described in a generic system prompt (calls as `[{\"name\", \"parameters\"}]`, as llama.cpp's generic format), where `auto` reads an answer that starts with such a list as its calls",
);

/// `POST /v1/completions`.
pub(crate) const COMPLETIONS: &[Rule] = &[
    MODEL,
    honored(
        "prompt",
        "required: a string, a list of token ids, or a batch (a list of either, at most 256; not streamed yet): `n` choices per prompt, choice `i * n + j` sample `j` of prompt `i`",
    ),
    MAX_TOKENS,
    MAX_COMPLETION_TOKENS,
    TEMPERATURE,
    TOP_P,
    TOP_K,
    MIN_P,
    SEED,
    PRESENCE_PENALTY,
    FREQUENCY_PENALTY,
    REPETITION_PENALTY,
    STOP,
    STOP_TOKEN_IDS,
    IGNORE_EOS,
    MIN_TOKENS,
    RETURN_TOKEN_IDS,
    PROMPT_LOGPROBS,
    SKIP_SPECIAL_TOKENS,
    SPACES_BETWEEN_SPECIAL_TOKENS,
    TRUNCATE_PROMPT_TOKENS,
    STREAM,
    STREAM_OPTIONS,
    honored(
        "logprobs",
        "0..=20: the sampled token's log-probability and this many top ones",
    ),
    N,
    refused("best_of", NoOp::One, "`best_of` is not supported; use `n`"),
    honored(
        "echo",
        "each choice's text starts with the prompt (whole, or in each choice's first chunk); with `logprobs`, the prompt's tokens lead the log-probabilities (the first with `null`), computed as the prompt runs (no prefix-cache reuse for it); with `max_tokens: 0` (vLLM's prompt scoring, as lm-evaluation-harness and scoring scripts send it), the prompt alone, `finish_reason` `length`",
    ),
    refused("suffix", NoOp::Empty, "`suffix` is not supported yet"),
    LOGIT_BIAS,
    USER,
    RESPONSE_FORMAT,
    STRUCTURED_OUTPUTS,
    GUIDED_JSON,
    GUIDED_REGEX,
    GUIDED_CHOICE,
    GUIDED_GRAMMAR,
];

/// `POST /v1/chat/completions`.
pub(crate) const CHAT: &[Rule] = &[
    MODEL,
    honored(
        "messages",
        "required, non-empty: rendered with the model's chat template (see the message table)",
    ),
    CHAT_MAX_TOKENS,
    MAX_COMPLETION_TOKENS,
    TEMPERATURE,
    TOP_P,
    TOP_K,
    MIN_P,
    SEED,
    PRESENCE_PENALTY,
    FREQUENCY_PENALTY,
    REPETITION_PENALTY,
    STOP,
    STOP_TOKEN_IDS,
    IGNORE_EOS,
    MIN_TOKENS,
    RETURN_TOKEN_IDS,
    PROMPT_LOGPROBS,
    SKIP_SPECIAL_TOKENS,
    SPACES_BETWEEN_SPECIAL_TOKENS,
    TRUNCATE_PROMPT_TOKENS,
    STREAM,
    STREAM_OPTIONS,
    honored("logprobs", "`true`: the sampled token's log-probability"),
    honored(
        "top_logprobs",
        "0..=20 top log-probabilities per token; needs `logprobs: true`",
    ),
    N,
    ECHO,
    LOGIT_BIAS,
    RESPONSE_FORMAT,
    TOOLS,
    honored(
        "tool_choice",
        "`auto` (default with tools: calls read from the model's format, `--tool-call-parser`), `none` (tools not rendered), `required` or `{\"type\": \"function\", \"function\": {\"name\": ...}}` (both forced by a grammar, which wins over `response_format`: the output is the call)",
    ),
    honored(
        "parallel_tool_calls",
        "default `true`; `false`: `required` forces exactly one call, `auto` keeps the first",
    ),
    refused(
        "functions",
        NoOp::Empty,
        "`functions` is deprecated and not supported: use `tools`",
    ),
    refused(
        "function_call",
        NoOp::Nothing,
        "`function_call` is deprecated and not supported: use `tool_choice`",
    ),
    refused(
        "audio",
        NoOp::Nothing,
        "`audio` is not supported: this model takes and writes text",
    ),
    refused(
        "modalities",
        NoOp::Is(r#"["text"]"#),
        "`modalities` other than [\"text\"] are not supported: this model writes text",
    ),
    refused(
        "prediction",
        NoOp::Nothing,
        "`prediction` (predicted outputs) is not supported yet",
    ),
    honored(
        "reasoning_effort",
        "`low`, `medium` or `high`: gpt-oss's (harmony's) system message `Reasoning:` line (default `medium`), or `reasoning_effort` of a chat template that reads one; refused for other models",
    ),
    refused(
        "verbosity",
        NoOp::Nothing,
        "`verbosity` is not supported yet",
    ),
    refused(
        "web_search_options",
        NoOp::Nothing,
        "`web_search_options` is not supported: the server does not search the web",
    ),
    USER,
    logged("safety_identifier", Shape::String),
    logged("prompt_cache_key", Shape::String),
    logged("metadata", Shape::Object),
    logged("service_tier", Shape::String),
    refused(
        "store",
        NoOp::False,
        "`store: true` is not supported: the server stores nothing",
    ),
    STRUCTURED_OUTPUTS,
    GUIDED_JSON,
    GUIDED_REGEX,
    GUIDED_CHOICE,
    GUIDED_GRAMMAR,
    CHAT_TEMPLATE_KWARGS,
];

/// `POST /v1/responses` (stateless).
pub(crate) const RESPONSES: &[Rule] = &[
    MODEL,
    honored(
        "input",
        "required: a string (a user message) or a list of items: messages (`role`, `content` as a string or `input_text` / `output_text` parts), `function_call`, `function_call_output`, `reasoning` (its text, or the `encrypted_content` this server wrote, back into the conversation); other item and part types are refused",
    ),
    honored(
        "instructions",
        "a system message before `input`",
    ),
    honored(
        "max_output_tokens",
        "the most tokens to generate; default: to the context's end (the context less the prompt), as OpenAI's and vLLM's; reaching it makes the response `incomplete`",
    ),
    TEMPERATURE,
    TOP_P,
    TOP_K,
    MIN_P,
    SEED,
    PRESENCE_PENALTY,
    FREQUENCY_PENALTY,
    REPETITION_PENALTY,
    honored(
        "stream",
        "the typed events: `response.created`, `response.in_progress`, `response.output_item.added`/`.done`, `response.content_part.added`/`.done`, `response.output_text.delta`/`.done`, `response.reasoning_text.delta`/`.done`, `response.function_call_arguments.delta`/`.done`, then `response.completed` (or `response.incomplete`)",
    ),
    honored(
        "tools",
        "`{\"type\": \"function\", name, description, parameters, strict}` each, rendered by the chat template; other tool types are refused",
    ),
    honored(
        "tool_choice",
        "`auto` (default with tools), `none`, `required` or `{\"type\": \"function\", \"name\": ...}`, as in chat completions (a forced call wins over `text.format`)",
    ),
    honored(
        "parallel_tool_calls",
        "default `true`; `false`: one call at most",
    ),
    honored(
        "text",
        "`format`: `text`, `json_object` or `json_schema` (`name`, `schema`, `description`, `strict`): decoding is constrained to match; `verbosity` refused unless `medium`",
    ),
    honored(
        "reasoning",
        "`effort`: `none` turns thinking off through the template's `enable_thinking` switch, any other level turns it on (and is the template's `reasoning_effort` where it reads one); needs `--reasoning-parser`. The reasoning comes back whole as a `reasoning` item's `reasoning_text`; `summary` is accepted, but there is no summarizer: the item's `summary` is empty",
    ),
    honored(
        "top_logprobs",
        "0..=20 top log-probabilities per output token (implies `message.output_text.logprobs`)",
    ),
    honored(
        "include",
        "`message.output_text.logprobs` (the output text's log-probabilities) and `reasoning.encrypted_content` (a reasoning item's text, to send back: nothing is stored); others are refused",
    ),
    refused(
        "store",
        NoOp::False,
        "`store: true` is not supported: the server is stateless and stores no responses",
    ),
    refused(
        "previous_response_id",
        NoOp::Nothing,
        "`previous_response_id` is not supported: the server is stateless; send the whole conversation as `input`",
    ),
    refused(
        "conversation",
        NoOp::Nothing,
        "`conversation` is not supported: the server is stateless; send the whole conversation as `input`",
    ),
    refused(
        "background",
        NoOp::False,
        "`background: true` is not supported",
    ),
    refused("prompt", NoOp::Nothing, "`prompt` (stored prompt templates) is not supported"),
    refused(
        "max_tool_calls",
        NoOp::Nothing,
        "`max_tool_calls` is not supported yet",
    ),
    refused(
        "truncation",
        NoOp::Is(r#""disabled""#),
        "`truncation` other than `disabled` is not supported: a conversation longer than the context is refused",
    ),
    refused(
        "service_tier",
        NoOp::Is(r#""auto""#),
        "`service_tier` other than `auto` is not supported",
    ),
    refused(
        "stream_options",
        NoOp::Empty,
        "`stream_options` is not supported",
    ),
    logged("metadata", Shape::Object),
    USER,
    logged("prompt_cache_key", Shape::String),
    logged("safety_identifier", Shape::String),
    honored(
        "stop",
        "a string or a list of at most 4: the text ends before the first to occur (vLLM extension; guidellm sends it)",
    ),
    honored(
        "ignore_eos",
        "generate past the model's end tokens, up to `max_output_tokens` (vLLM extension; guidellm sends it)",
    ),
];

/// What `/v1/messages` and `/v1/messages/count_tokens` share.
const ANTHROPIC_MODEL: Rule = honored(
    "model",
    "required; the served model name (`--served-model-name`), `not_found_error` otherwise",
);
const ANTHROPIC_MESSAGES: Rule = honored(
    "messages",
    "required, non-empty: `user` and `assistant` turns, `content` a string or blocks: `text` (`cache_control` accepted: prefix caching is automatic), `tool_use` (assistant; the `caller` and `toolset_name` the SDK sends back as `null` are accepted), `tool_result` (user: a `tool` message; `is_error` writes `Error: ` before its text), `thinking` (assistant: its reasoning), `redacted_thinking` (assistant: opaque, so left out of the prompt); other block types are refused",
);
const ANTHROPIC_SYSTEM: Rule = honored(
    "system",
    "a string or a list of text blocks: the system message",
);
const ANTHROPIC_TOOLS: Rule = honored(
    "tools",
    "client tools `{name, description, input_schema}` (`input_schema` of `type` `object`), rendered by the chat template; server tool types are refused",
);
const ANTHROPIC_TOOL_CHOICE: Rule = honored(
    "tool_choice",
    "`auto` (default with tools), `any` and `tool` (`name`) forced by a grammar (which wins over `output_config.format`: the output is the call), `none` (tools not rendered); `disable_parallel_tool_use`: one call at most",
);
const ANTHROPIC_THINKING: Rule = honored(
    "thinking",
    "`enabled` (`budget_tokens` at least 1024 and below `max_tokens`; the thinking ends when the model ends it, within `max_tokens`; needs `--reasoning-parser`) or `disabled`, through the template's `enable_thinking` switch; `adaptive`: the model's default; the reasoning comes back as `thinking` blocks (`display: \"omitted\"`: without their text); `between_tools` is refused",
);
const ANTHROPIC_OUTPUT_CONFIG: Rule = honored(
    "output_config",
    "`format` `{\"type\": \"json_schema\", \"schema\"}`: decoding is constrained to match; `effort`: the template's `reasoning_effort` (refused when the template reads none)",
);
const ANTHROPIC_CACHE_CONTROL: Rule =
    honored("cache_control", "accepted: prefix caching is automatic");
const ANTHROPIC_SPEED: Rule = refused(
    "speed",
    NoOp::Is(r#""standard""#),
    "`speed` other than `standard` is not supported",
);
const ANTHROPIC_USER_PROFILE: Rule = logged("user_profile_id", Shape::String);
const ANTHROPIC_WORKSPACE: Rule = logged("workspace_id", Shape::String);

/// `POST /v1/messages` (Anthropic's).
pub(crate) const MESSAGES: &[Rule] = &[
    ANTHROPIC_MODEL,
    ANTHROPIC_MESSAGES,
    honored("max_tokens", "required: the most tokens to generate"),
    ANTHROPIC_SYSTEM,
    honored(
        "stop_sequences",
        "at most 64 non-empty strings: the text ends before the first to occur (`stop_reason` `stop_sequence`, `stop_sequence` names it)",
    ),
    honored(
        "stream",
        "the events `message_start`, `content_block_start` / `content_block_delta` (`text_delta`, `thinking_delta`, `input_json_delta`) / `content_block_stop` per block, `message_delta` (stop reason, usage), `message_stop`",
    ),
    honored(
        "temperature",
        "0..=1, default 1; 0 is greedy (older clients send it; the current SDK sends it as an extra)",
    ),
    TOP_P,
    honored("top_k", "sample from the k likeliest tokens"),
    ANTHROPIC_TOOLS,
    ANTHROPIC_TOOL_CHOICE,
    ANTHROPIC_THINKING,
    ANTHROPIC_OUTPUT_CONFIG,
    ANTHROPIC_CACHE_CONTROL,
    ANTHROPIC_SPEED,
    logged("metadata", Shape::Object),
    ANTHROPIC_USER_PROFILE,
    ANTHROPIC_WORKSPACE,
    refused(
        "service_tier",
        NoOp::AnyOf(&["auto", "standard_only"]),
        "`service_tier` other than `auto` or `standard_only` is not supported",
    ),
    refused("container", NoOp::Nothing, "`container` is not supported"),
    refused(
        "diagnostics",
        NoOp::Nothing,
        "`diagnostics` is not supported",
    ),
    refused(
        "inference_geo",
        NoOp::Nothing,
        "`inference_geo` is not supported: inference runs on this server",
    ),
    refused(
        "mcp_servers",
        NoOp::Empty,
        "`mcp_servers` is not supported: give client `tools`",
    ),
    refused(
        "context_management",
        NoOp::Nothing,
        "`context_management` is not supported",
    ),
];

/// `POST /v1/messages/count_tokens` (Anthropic's): the prompt's tokens, as
/// `/v1/messages` would render it.
pub(crate) const COUNT_TOKENS: &[Rule] = &[
    ANTHROPIC_MODEL,
    ANTHROPIC_MESSAGES,
    ANTHROPIC_SYSTEM,
    ANTHROPIC_TOOLS,
    ANTHROPIC_TOOL_CHOICE,
    ANTHROPIC_THINKING,
    ANTHROPIC_OUTPUT_CONFIG,
    ANTHROPIC_CACHE_CONTROL,
    ANTHROPIC_SPEED,
    ANTHROPIC_USER_PROFILE,
    ANTHROPIC_WORKSPACE,
    refused(
        "mcp_servers",
        NoOp::Empty,
        "`mcp_servers` is not supported: give client `tools`",
    ),
];

/// One message of `messages` (chat and `/tokenize`).
pub(crate) const MESSAGE: &[Rule] = &[
    honored(
        "role",
        "`system`, `developer` (read as `system`), `user`, `assistant` or `tool`",
    ),
    honored(
        "content",
        "a string, or a list of `{\"type\": \"text\", \"text\": ...}` parts (concatenated); other part types are refused; null or absent only for `assistant` (read as empty)",
    ),
    honored("name", "a string, passed to the chat template"),
    honored(
        "tool_calls",
        "`assistant` only: `{id, type: \"function\", function: {name, arguments}}` each, `arguments` any string, as OpenAI takes it: a JSON text reaches the template parsed, anything else (a call cut off by `length`) as the string it is",
    ),
    honored(
        "tool_call_id",
        "`tool` only, and required there: the call the message answers",
    ),
    honored(
        "reasoning_content",
        "`assistant` only: its reasoning, passed to the chat template",
    ),
    honored(
        "refusal",
        "`assistant` only: a refusal the model wrote, rendered as the message's content when it has none (the openai client sends `refusal: null` back with each assistant message)",
    ),
    refused(
        "annotations",
        NoOp::Empty,
        "`annotations` (URL citations) are not supported: the server does not search the web",
    ),
    refused(
        "audio",
        NoOp::Nothing,
        "`audio` is not supported: this model takes and writes text",
    ),
    refused(
        "function_call",
        NoOp::Nothing,
        "`function_call` is deprecated and not supported: use `tool_calls`",
    ),
];

/// A `stream_options` object.
pub(crate) const STREAM_OPTION_KEYS: &[Rule] = &[
    honored("include_usage", "a final chunk with the usage"),
    honored(
        "continuous_usage_stats",
        "every chunk carries a `usage` object: the prompt's tokens and its choice's tokens so far (vLLM extension; guidellm sends it)",
    ),
];

/// `POST /tokenize` (vLLM's).
pub(crate) const TOKENIZE: &[Rule] = &[
    honored("model", "optional; the served model name, 404 otherwise"),
    honored("prompt", "a string (this or `messages`)"),
    honored(
        "messages",
        "a conversation, rendered with the chat template (as in chat completions)",
    ),
    honored(
        "add_special_tokens",
        "default `true` for `prompt`, `false` for `messages` (the template writes them)",
    ),
    honored("add_generation_prompt", "`messages` only; default `true`"),
    refused(
        "continue_final_message",
        NoOp::False,
        "`continue_final_message` is not supported yet",
    ),
    refused(
        "return_token_strs",
        NoOp::False,
        "`return_token_strs` is not supported yet",
    ),
    refused(
        "chat_template",
        NoOp::Nothing,
        "`chat_template` is not supported: the model's template is used",
    ),
    CHAT_TEMPLATE_KWARGS,
    honored(
        "tools",
        "`messages` only: tool definitions the chat template renders",
    ),
];

/// `POST /detokenize` (vLLM's).
pub(crate) const DETOKENIZE: &[Rule] = &[
    honored("model", "optional; the served model name, 404 otherwise"),
    honored(
        "tokens",
        "required: token ids in the vocabulary (special tokens are written out)",
    ),
];

/// Refuse the first key of `body` the table does not know or refuses (a 400 naming
/// `{prefix}{key}`), and log the logged ones.
pub(crate) fn check(
    table: &[Rule],
    body: &Map<String, Value>,
    prefix: &str,
) -> Result<(), ApiError> {
    for (key, v) in body {
        let Some(rule) = table.iter().find(|r| r.name == key) else {
            return Err(ApiError::bad(
                format!("{prefix}{key}"),
                format!("unknown field `{prefix}{key}`"),
            ));
        };
        match rule.handling {
            _ if v.is_null() => {}
            Handling::Honored => {}
            Handling::Logged(shape) => {
                let (fits, kind) = match shape {
                    Shape::String => (v.is_string(), "a string"),
                    Shape::Object => (v.is_object(), "an object"),
                };
                if !fits {
                    return Err(ApiError::bad(
                        format!("{prefix}{key}"),
                        format!("`{prefix}{key}` must be {kind}"),
                    ));
                }
                tracing::debug!("request field `{prefix}{key}`: {v}");
            }
            Handling::Refused(ok) if ok.allows(v) => {}
            Handling::Refused(_) => {
                return Err(ApiError::bad(format!("{prefix}{key}"), rule.note));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's tables, rendered from the code's.
    fn render() -> String {
        let mut out = String::new();
        for (title, table) in [
            ("`POST /v1/completions`", COMPLETIONS),
            ("`POST /v1/chat/completions`", CHAT),
            ("A chat message (`messages[i]`)", MESSAGE),
            ("A stream's options (`stream_options`)", STREAM_OPTION_KEYS),
            ("`POST /v1/responses`", RESPONSES),
            ("`POST /v1/messages`", MESSAGES),
            ("`POST /v1/messages/count_tokens`", COUNT_TOKENS),
            ("`POST /tokenize`", TOKENIZE),
            ("`POST /detokenize`", DETOKENIZE),
        ] {
            out.push_str(&format!(
                "### {title}\n\n| field | handling | notes |\n|---|---|---|\n"
            ));
            for r in table {
                let handling = match r.handling {
                    Handling::Honored => "honored".to_string(),
                    Handling::Logged(_) => "accepted and logged".to_string(),
                    Handling::Refused(ok) => match ok {
                        NoOp::Nothing => "refused".to_string(),
                        NoOp::False => "refused unless `false`".to_string(),
                        NoOp::One => "refused unless `1`".to_string(),
                        NoOp::Empty => "refused unless empty".to_string(),
                        NoOp::Is(json) => format!("refused unless `{json}`"),
                        NoOp::AnyOf(list) => format!("refused unless `{}`", list.join("` or `")),
                    },
                };
                out.push_str(&format!("| `{}` | {handling} | {} |\n", r.name, r.note));
            }
            out.push('\n');
        }
        out
    }

    #[test]
    fn the_readme_lists_the_tables_of_the_code() {
        let readme = include_str!("../../../README.md");
        let section = readme
            .split_once("## Server API fields\n")
            .map(|(_, s)| s)
            .expect("README.md has no \"## Server API fields\" section");
        let want = render();
        assert!(
            section.contains(&want),
            "README.md's \"Server API fields\" tables differ from crates/encore-server/src/fields.rs; \
             they should read:\n\n{want}"
        );
    }

    #[test]
    fn every_table_names_a_field_once() {
        for table in [
            COMPLETIONS,
            CHAT,
            MESSAGE,
            RESPONSES,
            MESSAGES,
            COUNT_TOKENS,
            STREAM_OPTION_KEYS,
            TOKENIZE,
            DETOKENIZE,
        ] {
            for (i, r) in table.iter().enumerate() {
                assert!(
                    table[..i].iter().all(|q| q.name != r.name),
                    "{} twice",
                    r.name
                );
                if let Handling::Refused(NoOp::Is(json)) = r.handling {
                    assert!(serde_json::from_str::<Value>(json).is_ok(), "{json}");
                }
            }
        }
    }

    #[test]
    fn no_ops_pass_and_the_rest_is_refused_naming_the_field() {
        let body = |v: Value| v.as_object().unwrap().clone();
        let no_ops = serde_json::json!({
            "n": 1, "best_of": 1, "echo": false, "suffix": "", "logit_bias": {}, "user": "u",
            "response_format": {"type": "text"}, "guided_json": null,
        });
        assert!(check(COMPLETIONS, &body(no_ops), "").is_ok());
        for (bad, param) in [
            (serde_json::json!({"best_of": 3}), "best_of"),
            (serde_json::json!({"suffix": "x"}), "suffix"),
            (serde_json::json!({"user": 5}), "user"),
            (serde_json::json!({"temprature": 0}), "temprature"),
            (serde_json::json!({"tools": []}), "tools"),
        ] {
            let e = check(COMPLETIONS, &body(bad.clone()), "").unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{bad}");
            assert!(e.message.contains(param), "{bad}: {}", e.message);
        }
        let e = check(
            MESSAGE,
            &body(serde_json::json!({"nam": "x"})),
            "messages[3].",
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[3].nam"));
        assert_eq!(e.message, "unknown field `messages[3].nam`");
    }
}
