//! What a caller asks of the engine and what comes back: a [`Request`] with its
//! [`RequestParams`] (sampling, length, stop tokens), the typed [`Refusal`] of a request
//! that can never run (naming the [`Param`] it concerns), the [`Output`] tokens with their
//! [`FinishReason`], and the [`Event`]s a request's sink receives from the engine loop.
//! [`Limits`] holds the admission rules: the scheduler checks every request against them,
//! once, and callers such as the HTTP server map the refusal to their own error without
//! checking again.

use std::fmt;

use crate::backend::MAX_TOP_LOGPROBS;
use crate::error::Error;

/// Per-sequence sampling parameters (semantics: [`crate::backend::Sampling`],
/// [`crate::backend::Penalties`], [`crate::backend::SampleLogprobs`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// <= 0: greedy.
    pub temperature: f32,
    /// <= 0: off.
    pub top_k: i32,
    /// >= 1: off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; <= 0: off.
    pub min_p: f32,
    pub seed: u64,
    /// Subtracted from the logit of every token the output holds; 0: off.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per occurrence in the output; 0: off.
    pub frequency_penalty: f32,
    /// Divides positive (multiplies negative) logits of tokens in the prompt or the
    /// output; 1: off.
    pub repetition_penalty: f32,
    /// Log-probabilities of each sampled token and of the `n` most likely ones
    /// (`n <= MAX_TOP_LOGPROBS`), over the logits after penalties and before temperature
    /// and truncation; `None`: off.
    pub logprobs: Option<usize>,
    /// Log-probabilities of each prompt token after the first given the tokens before it,
    /// with the `n` most likely tokens there (`n <= MAX_TOP_LOGPROBS`), over the model's
    /// logits (no penalties), on the request's first [`Output`]; `None`: off. Such a
    /// prompt is computed whole (no prefix-cache reuse), in chunks of at most the
    /// runner's `max_seqs` tokens.
    pub prompt_logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logprobs: None,
            prompt_logprobs: None,
        }
    }
}

impl SamplingParams {
    /// Whether any penalty is on: the sequence then needs a penalty slot
    /// ([`crate::runner::Seqs::begin_penalties`]).
    pub fn has_penalties(&self) -> bool {
        self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || self.repetition_penalty != 1.0
    }
}

/// The log-probabilities of one sampled token: its own and the most likely tokens'
/// (largest first), over the logits after penalties and before temperature (vLLM's
/// "raw" log-probabilities when no penalty is on).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// What a request's output must match (structured outputs), compiled at admission by
/// [`crate::constraint::ConstraintCompiler`].
#[derive(Clone, Debug, PartialEq)]
pub enum Constraint {
    /// Only these token ids (vLLM's `allowed_token_ids`).
    AllowedTokens(Vec<u32>),
    /// JSON matching this JSON schema (its text).
    JsonSchema(String),
    /// Any JSON object.
    JsonObject,
    /// Text matching this regular expression, whole.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// Text of this Lark grammar (llguidance's dialect).
    Lark(String),
}

/// One request's generation parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestParams {
    pub sampling: SamplingParams,
    /// New tokens at most (>= 1).
    pub max_tokens: usize,
    /// Tokens that end the request (the model's end-of-generation tokens, plus the
    /// request's own); ignored with `ignore_eos`.
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// Refuse the request at admission when its prompt and `max_tokens` together exceed
    /// the context (the OpenAI API's rule); `false`: it is admitted and ends with
    /// [`FinishReason::Context`] when the context is full.
    pub fit_context: bool,
    /// What the output must match; `None`: anything.
    pub constraint: Option<Constraint>,
    /// Requests with the same value share their prompt (the `n` samples of one API
    /// request): with prefix caching on, while one of them computes the prompt the others
    /// wait, then start from its cached KV blocks, so the prompt is computed once.
    pub share_prompt: Option<u64>,
    /// Added to the logits of these tokens before sampling (OpenAI's `logit_bias`; ids
    /// distinct, at most [`MAX_LOGIT_BIAS`]), inside the captured step.
    pub logit_bias: Vec<(u32, f32)>,
}

/// The most logit biases one request may give.
pub const MAX_LOGIT_BIAS: usize = 1024;

/// A request: its caller-chosen id (unique among live requests), prompt and parameters.
#[derive(Clone, Debug)]
pub struct Request {
    pub id: u64,
    pub prompt: Vec<u32>,
    pub params: RequestParams,
}

/// One new token of a request; `finish` is set on its last.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    pub id: u64,
    pub token: u32,
    /// When the request's sampling asks for log-probabilities.
    pub logprobs: Option<TokenLogprobs>,
    /// On a request's first output when its sampling asks for them
    /// ([`SamplingParams::prompt_logprobs`]): one entry per prompt token after the first.
    pub prompt_logprobs: Option<Vec<TokenLogprobs>>,
    pub finish: Option<FinishReason>,
}

/// Why a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// Produced an end-of-sequence token.
    Eos,
    /// Reached `max_tokens`.
    Length,
    /// Reached the runner's `max_seq_len`.
    Context,
    /// The caller's `on_token` asked to stop.
    Stopped,
    /// Its text reached one of the request's stop strings (the caller's check: the
    /// engine only counts tokens).
    StopString,
}

impl FinishReason {
    /// The lower-case name used in output (`eos`, `length`, `context`, `stopped`, `stop`).
    pub fn name(self) -> &'static str {
        match self {
            FinishReason::Eos => "eos",
            FinishReason::Length => "length",
            FinishReason::Context => "context",
            FinishReason::Stopped => "stopped",
            FinishReason::StopString => "stop",
        }
    }
}

/// What a request's sink receives from the engine loop.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A new token (`finish` set on the last one).
    Token(Output),
    /// The request was refused at admission (it can never run as asked); nothing more
    /// follows.
    Refused(Refusal),
    /// The engine failed while running the request (a step failed on the device); nothing
    /// more follows.
    Failed(String),
}

/// The request parameter a refusal concerns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Param {
    /// The request's id (already live).
    Id,
    Prompt,
    MaxTokens,
    /// The number of top log-probabilities (`SamplingParams::logprobs`).
    Logprobs,
    /// The prompt's log-probabilities (`SamplingParams::prompt_logprobs`).
    PromptLogprobs,
    PresencePenalty,
    FrequencyPenalty,
    RepetitionPenalty,
    /// What the output must match ([`RequestParams::constraint`]).
    Constraint,
    /// [`RequestParams::logit_bias`].
    LogitBias,
}

impl Param {
    /// The parameter's name as the OpenAI API spells it (`prompt`, `max_tokens`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Param::Id => "id",
            Param::Prompt => "prompt",
            Param::MaxTokens => "max_tokens",
            Param::Logprobs => "logprobs",
            Param::PromptLogprobs => "prompt_logprobs",
            Param::PresencePenalty => "presence_penalty",
            Param::FrequencyPenalty => "frequency_penalty",
            Param::RepetitionPenalty => "repetition_penalty",
            Param::Constraint => "response_format",
            Param::LogitBias => "logit_bias",
        }
    }
}

/// Why a request can never run as asked: the parameter at fault, and what is wrong with
/// it (a predicate that reads after the parameter's name: "`prompt` is empty").
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    /// The refused request's id.
    pub id: u64,
    pub param: Param,
    pub message: String,
}

impl Refusal {
    /// Refuse request `id` for `param`: `message` reads after the parameter's name.
    pub fn new(id: u64, param: Param, message: impl Into<String>) -> Self {
        Refusal {
            id,
            param,
            message: message.into(),
        }
    }

    /// The message naming the parameter as `name` (a caller's own spelling of it, such
    /// as the HTTP API's `top_logprobs` for [`Param::Logprobs`]).
    pub fn message_naming(&self, name: &str) -> String {
        format!("`{name}` {}", self.message)
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "request {}: {}",
            self.id,
            self.message_naming(self.param.name())
        )
    }
}

impl std::error::Error for Refusal {}

impl From<Refusal> for Error {
    fn from(r: Refusal) -> Self {
        Error::Refused(Box::new(r))
    }
}

/// The admission rules of one engine: what a request may ask for, from the sizes it was
/// built with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub vocab_size: usize,
    /// Tokens in one sequence at most (prompt and output).
    pub max_seq_len: usize,
    /// Tokens per KV block, and the blocks the whole cache has for sequences.
    pub block_size: usize,
    pub usable_blocks: usize,
    /// Sequences that may use penalties at once (0: penalties are off).
    pub penalty_slots: usize,
}

impl Limits {
    /// Tokens the whole KV cache holds.
    pub fn kv_capacity_tokens(&self) -> usize {
        self.usable_blocks * self.block_size
    }

    /// Refuse `req` when it can never run: an empty prompt, `max_tokens` 0, a prompt
    /// that leaves no room in the context (or, with `fit_context`, prompt and
    /// `max_tokens` that exceed it), a token outside the vocabulary, more KV blocks than
    /// the cache has, too many top log-probabilities, penalties that are not finite (or a
    /// repetition penalty <= 0), or penalties on an engine without penalty slots.
    pub fn check(&self, req: &Request) -> Result<(), Refusal> {
        let refuse = |param, m: String| Err(Refusal::new(req.id, param, m));
        let (n, p) = (req.prompt.len(), &req.params);
        if n == 0 {
            return refuse(Param::Prompt, "is empty".into());
        }
        if p.max_tokens == 0 {
            return refuse(Param::MaxTokens, "must be at least 1".into());
        }
        if n >= self.max_seq_len {
            return refuse(
                Param::Prompt,
                format!(
                    "has {n} tokens; the context holds {} (prompt and output)",
                    self.max_seq_len
                ),
            );
        }
        if p.fit_context && n + p.max_tokens > self.max_seq_len {
            return refuse(
                Param::MaxTokens,
                format!(
                    "{} with {n} prompt tokens exceeds the model's context of {}",
                    p.max_tokens, self.max_seq_len
                ),
            );
        }
        let vocab = self.vocab_size;
        if let Some(t) = req.prompt.iter().find(|&&t| t as usize >= vocab) {
            return refuse(
                Param::Prompt,
                format!("holds token id {t}, outside the vocabulary of {vocab}"),
            );
        }
        // The longest the sequence can get must fit the cache on its own.
        let longest = (n + p.max_tokens).min(self.max_seq_len);
        let need = longest.div_ceil(self.block_size);
        if need > self.usable_blocks {
            let param = if n > self.kv_capacity_tokens() {
                Param::Prompt
            } else {
                Param::MaxTokens
            };
            return refuse(
                param,
                format!(
                    "makes {longest} tokens, which need {need} KV blocks; the cache has {}",
                    self.usable_blocks
                ),
            );
        }
        self.check_sampling(req)
    }

    fn check_sampling(&self, req: &Request) -> Result<(), Refusal> {
        let refuse = |param, m: String| Err(Refusal::new(req.id, param, m));
        let bias = &req.params.logit_bias;
        if bias.len() > MAX_LOGIT_BIAS {
            return refuse(
                Param::LogitBias,
                format!("has {} entries; at most {MAX_LOGIT_BIAS}", bias.len()),
            );
        }
        let vocab = self.vocab_size;
        if let Some((t, _)) = bias.iter().find(|&&(t, _)| t as usize >= vocab) {
            return refuse(
                Param::LogitBias,
                format!("names token id {t}, outside the vocabulary of {vocab}"),
            );
        }
        if let Some((t, b)) = bias.iter().find(|(_, b)| !b.is_finite()) {
            return refuse(
                Param::LogitBias,
                format!("gives token {t} the bias {b}; biases must be finite"),
            );
        }
        let sp = &req.params.sampling;
        if let Some(n) = sp.logprobs.filter(|&n| n > MAX_TOP_LOGPROBS) {
            return refuse(
                Param::Logprobs,
                format!(
                    "asks for {n} top log-probabilities; they are limited to {MAX_TOP_LOGPROBS}"
                ),
            );
        }
        if let Some(n) = sp.prompt_logprobs.filter(|&n| n > MAX_TOP_LOGPROBS) {
            return refuse(
                Param::PromptLogprobs,
                format!(
                    "asks for {n} top log-probabilities; they are limited to {MAX_TOP_LOGPROBS}"
                ),
            );
        }
        let penalties = [
            (Param::PresencePenalty, sp.presence_penalty),
            (Param::FrequencyPenalty, sp.frequency_penalty),
            (Param::RepetitionPenalty, sp.repetition_penalty),
        ];
        for (param, x) in penalties {
            if !x.is_finite() || (param == Param::RepetitionPenalty && x <= 0.0) {
                let rule = if param == Param::RepetitionPenalty {
                    "finite and > 0"
                } else {
                    "finite"
                };
                return refuse(param, format!("must be {rule} (is {x})"));
            }
        }
        if sp.has_penalties() && self.penalty_slots == 0 {
            let on = if sp.presence_penalty != 0.0 {
                Param::PresencePenalty
            } else if sp.frequency_penalty != 0.0 {
                Param::FrequencyPenalty
            } else {
                Param::RepetitionPenalty
            };
            return refuse(
                on,
                "needs penalties, which are off in this engine (no penalty slots)".into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        vocab_size: 100,
        max_seq_len: 64,
        block_size: 16,
        usable_blocks: 3,
        penalty_slots: 0,
    };

    fn request(prompt_len: usize, max_tokens: usize) -> Request {
        Request {
            id: 7,
            prompt: vec![1; prompt_len],
            params: RequestParams {
                sampling: SamplingParams::default(),
                max_tokens,
                stop_token_ids: Vec::new(),
                ignore_eos: false,
                fit_context: false,
                constraint: None,
                share_prompt: None,
                logit_bias: Vec::new(),
            },
        }
    }

    /// The parameter `req` is refused for, and the refusal's text.
    fn refused(req: &Request) -> (Param, String) {
        let r = LIMITS.check(req).unwrap_err();
        (r.param, r.to_string())
    }

    #[test]
    fn each_refusal_names_its_parameter() {
        assert_eq!(refused(&request(0, 4)).0, Param::Prompt);
        assert_eq!(refused(&request(4, 0)).0, Param::MaxTokens);
        let (p, m) = refused(&request(64, 4));
        assert_eq!(p, Param::Prompt);
        assert!(m.contains("`prompt` has 64 tokens"), "{m}");
        let mut bad = request(4, 4);
        bad.prompt[1] = 100;
        let (p, m) = refused(&bad);
        assert_eq!(p, Param::Prompt);
        assert!(m.contains("token id 100"), "{m}");
        // 49..=64 tokens need 4 blocks of 16; the cache has 3.
        let (p, m) = refused(&request(40, 20));
        assert_eq!(p, Param::MaxTokens);
        assert!(m.starts_with("request 7: `max_tokens`"), "{m}");
        let mut lp = request(4, 4);
        lp.params.sampling.logprobs = Some(MAX_TOP_LOGPROBS + 1);
        assert_eq!(refused(&lp).0, Param::Logprobs);
        let mut pen = request(4, 4);
        pen.params.sampling.frequency_penalty = 0.5;
        assert_eq!(refused(&pen).0, Param::FrequencyPenalty);
        pen.params.sampling.repetition_penalty = -1.0;
        assert_eq!(refused(&pen).0, Param::RepetitionPenalty);
    }

    #[test]
    fn fit_context_refuses_what_would_end_at_the_context() {
        // 40 + 30 > 64: admitted without fit_context (it ends with Context at 64, which
        // needs 4 blocks: give the cache room), refused with it.
        let roomy = Limits {
            usable_blocks: 8,
            ..LIMITS
        };
        let mut req = request(40, 30);
        assert!(roomy.check(&req).is_ok());
        req.params.fit_context = true;
        let r = roomy.check(&req).unwrap_err();
        assert_eq!(r.param, Param::MaxTokens);
        assert!(r
            .message_naming("max_completion_tokens")
            .starts_with("`max_completion_tokens` 30"));
    }
}
