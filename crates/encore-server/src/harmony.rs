//! gpt-oss's chat format, harmony (`encore_core::tokenizer::harmony`), in the server: the
//! prompt rendered by encore's harmony renderer in place of a chat template, with the
//! request's reasoning effort in the system message and today's date; the stop tokens
//! that end the assistant's turn (`<|return|>`, and `<|call|>`: a tool call ends it);
//! which effort words harmony takes; and the grammars of structured outputs and forced
//! calls moved inside the right channel ([`constrain`]). Its output is read by
//! `parse::harmony`.

use std::time::{SystemTime, UNIX_EPOCH};

use encore_core::constraint::json_layout;
use encore_core::request::Constraint;
use encore_core::tokenizer::harmony::{self, Effort, HarmonyOptions};
use encore_core::tokenizer::{ChatMessage, ChatOptions, Tokenizer};
use serde_json::{json, Value};

use crate::body::Common;
use crate::error::ApiError;
use crate::tools::{ToolChoice, Tools};

/// Whether a tokenizer holds harmony's special tokens (gpt-oss's o200k_harmony does).
pub(crate) fn detect(tok: &Tokenizer) -> bool {
    [harmony::CHANNEL, harmony::MESSAGE, harmony::START]
        .iter()
        .all(|t| tok.token_to_id(t).is_some())
}

/// The ids of `<|return|>` and `<|call|>` where the vocabulary has them: a turn ends at
/// either (a tokenizer without them is a byte-level dummy's, whose forced outputs end
/// by themselves).
pub(crate) fn stop_ids(tok: &Tokenizer) -> Vec<u32> {
    [harmony::RETURN, harmony::CALL]
        .iter()
        .filter_map(|t| tok.token_to_id(t))
        .collect()
}

/// The effort of a `reasoning_effort` word, or a 400 naming `param`.
pub(crate) fn effort(word: &str, param: &'static str) -> Result<Effort, ApiError> {
    Effort::from_name(word).ok_or_else(|| {
        ApiError::bad(
            param,
            format!(
                "`{param}` must be `low`, `medium` or `high` for gpt-oss (harmony), not \
                 `{word}`"
            ),
        )
    })
}

/// The harmony prompt of `messages` with `opts`' tools; the effort is `opts.kwargs`'
/// `reasoning_effort` (where `reasoning_effort`, `reasoning.effort` and
/// `output_config.effort` put it), medium by default. Without `add_generation_prompt`
/// (`/tokenize`'s) the prompt ends after the last message.
pub(crate) fn render(messages: &[ChatMessage], opts: &ChatOptions) -> Result<String, ApiError> {
    let effort = match opts.kwargs.get("reasoning_effort") {
        None | Some(Value::Null) => Effort::default(),
        Some(Value::String(w)) => effort(w, "reasoning_effort")?,
        Some(_) => {
            return Err(ApiError::bad(
                "reasoning_effort",
                "`reasoning_effort` must be `low`, `medium` or `high`",
            ))
        }
    };
    if let Some(k) = opts.kwargs.keys().find(|k| *k != "reasoning_effort") {
        return Err(ApiError::bad(
            "chat_template_kwargs",
            format!(
                "`chat_template_kwargs.{k}`: gpt-oss's chat format (harmony) takes only \
                 `reasoning_effort`"
            ),
        ));
    }
    let h = HarmonyOptions {
        effort,
        date: Some(today()),
    };
    let text = harmony::render(messages, opts.tools.as_deref(), &h)
        .map_err(|e| ApiError::bad("messages", e.to_string()))?;
    Ok(match text.strip_suffix(harmony::GENERATION_PROMPT) {
        Some(t) if !opts.add_generation_prompt => t.to_string(),
        _ => text,
    })
}

/// Harmony's markers as grammar atoms: the special token by id (`<[id]>`) where the
/// vocabulary has it, else its text (a byte-level dummy's).
struct Marks {
    channel: String,
    message: String,
    constrain: String,
    /// The analysis message a reply may start with, where the markers are tokens: free
    /// text is then any token but harmony's own.
    analysis: Option<String>,
}

impl Marks {
    fn of(tok: &Tokenizer) -> Marks {
        let id = |m: &str| tok.token_to_id(m);
        let atom = |m: &str| match id(m) {
            Some(i) => format!("<[{i}]>"),
            None => lit(m),
        };
        let specials = [
            harmony::START,
            harmony::END,
            harmony::MESSAGE,
            harmony::CHANNEL,
            harmony::CONSTRAIN,
            harmony::RETURN,
            harmony::CALL,
        ];
        let ids: Option<Vec<u32>> = specials.iter().map(|&m| id(m)).collect();
        let analysis = ids.map(|mut ids| {
            ids.extend(tok.eos_token_ids());
            ids.sort_unstable();
            ids.dedup();
            let not: Vec<String> = ids.iter().map(u32::to_string).collect();
            format!(
                "{} \"analysis\" {} <[^{}]>* {} {} \"assistant\"",
                atom(harmony::CHANNEL),
                atom(harmony::MESSAGE),
                not.join(","),
                atom(harmony::END),
                atom(harmony::START),
            )
        });
        Marks {
            channel: atom(harmony::CHANNEL),
            message: atom(harmony::MESSAGE),
            constrain: atom(harmony::CONSTRAIN),
            analysis,
        }
    }

    /// The grammar of a reply: an optional analysis message, then `reply`.
    fn grammar(&self, reply: &str) -> String {
        match &self.analysis {
            Some(a) => format!("start: analysis? reply\nanalysis: {a}\nreply: {reply}\n"),
            None => format!("start: reply\nreply: {reply}\n"),
        }
    }
}

/// A Lark string literal of `s`.
fn lit(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// Move a request's grammar inside harmony's channels: structured outputs
/// (`response_format` and its kin) constrain the `final` message's content (with
/// `tool_choice` `auto`, a call of one of the tools stays open instead, as OpenAI's
/// format applies to a text answer); a forced call (`tool_choice` `required` or a named
/// function) is a `commentary` message to `functions.NAME` with `<|constrain|>json` and
/// the function's arguments; either may follow an analysis message where the vocabulary
/// has harmony's tokens. An allowed-token list stays as it is (it is not text).
pub(crate) fn constrain(
    tok: &Tokenizer,
    c: &mut Common,
    tools: Option<&Tools>,
) -> Result<(), ApiError> {
    let m = Marks::of(tok);
    let forced = tools.and_then(|t| match &t.choice {
        ToolChoice::Required => Some(call_rule(t, &m, None)),
        ToolChoice::Named(n) => Some(call_rule(t, &m, Some(n.as_str()))),
        ToolChoice::None | ToolChoice::Auto => None,
    });
    let reply = match (forced, c.params.constraint.take()) {
        (Some(rule), _) => rule,
        (None, None) => return Ok(()),
        (None, Some(Constraint::AllowedTokens(ids))) => {
            c.params.constraint = Some(Constraint::AllowedTokens(ids));
            return Ok(());
        }
        (None, Some(other)) => {
            let answer = format!(
                "{} \"final\" {} {}",
                m.channel,
                m.message,
                body(other, c.names.constraint)?
            );
            match tools.filter(|t| t.choice == ToolChoice::Auto) {
                Some(t) => format!("({answer}) | ({})", call_rule(t, &m, None)),
                None => answer,
            }
        }
    };
    c.params.constraint = Some(Constraint::Lark(m.grammar(&reply)));
    Ok(())
}

/// A structured output's grammar as the body of a rule.
fn body(c: Constraint, param: &'static str) -> Result<String, ApiError> {
    let json = |schema: Value| format!("%json {}", json_layout(schema));
    Ok(match c {
        Constraint::JsonSchema(s) => {
            let v: Value = serde_json::from_str(&s)
                .map_err(|e| ApiError::bad(param, format!("the JSON schema is not JSON: {e}")))?;
            json(v)
        }
        Constraint::JsonObject => json(json!({"type": "object"})),
        Constraint::Regex(rx) => format!("/{}/", rx.replace('/', "\\/")),
        Constraint::Choice(cs) => {
            let alts: Vec<String> = cs.iter().map(|c| lit(c)).collect();
            format!("({})", alts.join(" | "))
        }
        Constraint::Lark(g) => format!("%lark {{\n{g}\n}}"),
        Constraint::AllowedTokens(_) => unreachable!("kept as it is by `constrain`"),
    })
}

/// The rule of a call of one of `tools` (of `name` only, when given), as harmony writes
/// a call (a tool call ends the turn: one call).
fn call_rule(tools: &Tools, m: &Marks, name: Option<&str>) -> String {
    let alts: Vec<String> = tools
        .defs
        .iter()
        .filter_map(|t| t["function"].as_object())
        .filter(|f| name.is_none_or(|n| f["name"] == n))
        .map(|f| {
            let params = f
                .get("parameters")
                .filter(|p| !p.is_null())
                .cloned()
                .unwrap_or_else(
                    || json!({"type": "object", "properties": {}, "additionalProperties": false}),
                );
            let head = format!(
                "commentary to=functions.{} ",
                f["name"].as_str().unwrap_or("")
            );
            format!(
                "{} {} \"json\" {} %json {}",
                lit(&head),
                m.constrain,
                m.message,
                json_layout(params)
            )
        })
        .collect();
    format!("{} ({})", m.channel, alts.join(" | "))
}

/// Today's date in UTC, `%Y-%m-%d` (as vLLM writes the system message's).
fn today() -> String {
    let days = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400) as i64;
    let (y, m, d) = encore_core::tokenizer::civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use encore_core::constraint::{ConstraintCompiler, TokenConstraint};

    use super::*;

    const SPECIALS: [&str; 7] = [
        harmony::START,
        harmony::END,
        harmony::MESSAGE,
        harmony::CHANNEL,
        harmony::CONSTRAIN,
        harmony::RETURN,
        harmony::CALL,
    ];

    /// A word-level tokenizer of harmony's special tokens and the printable ASCII
    /// characters, `<|return|>` its end token.
    fn tokenizer() -> Tokenizer {
        // One folder a call: the tests run in parallel and each removes its own.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("encore-harmony-{}-{call}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut vocab = serde_json::Map::new();
        let mut added = Vec::new();
        for (i, sp) in SPECIALS.iter().enumerate() {
            vocab.insert(sp.to_string(), json!(i));
            added.push(
                json!({"id": i, "content": sp, "single_word": false, "lstrip": false,
                              "rstrip": false, "normalized": false, "special": true}),
            );
        }
        for c in ' '..='~' {
            vocab.insert(c.to_string(), json!(SPECIALS.len() + (c as usize - 32)));
        }
        let t = json!({"version": "1.0", "added_tokens": added, "normalizer": null,
                       "pre_tokenizer": null, "post_processor": null, "decoder": null,
                       "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<|end|>"}});
        std::fs::write(dir.join("tokenizer.json"), t.to_string()).unwrap();
        std::fs::write(
            dir.join("tokenizer_config.json"),
            r#"{"eos_token": "<|return|>"}"#,
        )
        .unwrap();
        let tok = Tokenizer::from_dir(&dir).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        tok
    }

    /// The ids of `text`: harmony's markers as their tokens, other characters one each.
    fn ids(mut text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        while let Some(c) = text.chars().next() {
            if let Some(i) = SPECIALS.iter().position(|sp| text.starts_with(sp)) {
                out.push(i as u32);
                text = &text[SPECIALS[i].len()..];
            } else {
                out.push((SPECIALS.len() + c as usize - 32) as u32);
                text = &text[1..];
            }
        }
        out
    }

    /// The grammar `constrain` makes of `c` (and `tools`), compiled for [`tokenizer`].
    fn compiled(c: Option<Constraint>, tools: Option<&Tools>) -> Box<dyn TokenConstraint> {
        let tok = tokenizer();
        assert!(detect(&tok));
        let mut common = Common::new(Default::default(), None, Vec::new());
        common.params.constraint = c;
        constrain(&tok, &mut common, tools).unwrap();
        let Some(Constraint::Lark(g)) = &common.params.constraint else {
            panic!("not wrapped: {:?}", common.params.constraint)
        };
        let compiler = ConstraintCompiler::new(&tok, SPECIALS.len() + 95).unwrap();
        compiler
            .compile(&Constraint::Lark(g.clone()))
            .unwrap_or_else(|e| panic!("{e}\n{g}"))
    }

    /// How many tokens of `text` grammar `g` (fresh) accepts, and how many there are.
    fn accepted(g: &mut dyn TokenConstraint, text: &str) -> (usize, usize) {
        let t = ids(text);
        let n = g.validate(&t);
        (n, t.len())
    }

    #[test]
    fn harmony_structured_outputs_apply_inside_the_final_channel() {
        let schema =
            r#"{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}"#;
        let c = || Some(Constraint::JsonSchema(schema.into()));
        let think = "<|channel|>analysis<|message|>Think {not json}.<|end|><|start|>assistant";
        let answer = "<|channel|>final<|message|>{\"a\": 12}";
        for text in [format!("{think}{answer}"), answer.to_string()] {
            let (n, len) = accepted(&mut *compiled(c(), None), &text);
            assert_eq!(n, len, "{text}");
        }
        // Not from the first token, and not outside the schema.
        assert_eq!(accepted(&mut *compiled(c(), None), "{\"a\": 1}").0, 0);
        let (n, len) = accepted(
            &mut *compiled(c(), None),
            "<|channel|>final<|message|>hello",
        );
        assert!(n < len);
        let (n, len) = accepted(
            &mut *compiled(c(), None),
            "<|channel|>commentary<|message|>{",
        );
        assert!(n < len);
        // A choice and a regex too.
        let choice = Some(Constraint::Choice(vec!["yes".into(), "no".into()]));
        let (n, len) = accepted(
            &mut *compiled(choice, None),
            &format!("{think}<|channel|>final<|message|>no"),
        );
        assert_eq!(n, len);
        let rx = Some(Constraint::Regex("[0-9]+/[0-9]+".into()));
        let (n, len) = accepted(&mut *compiled(rx, None), "<|channel|>final<|message|>3/4");
        assert_eq!(n, len);
    }

    fn defs_auto() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object",
            "properties": {"x": {"type": "string"}}, "required": ["x"]}}}),
        ]
    }

    #[test]
    fn harmony_forced_calls_are_commentary_messages_to_the_function() {
        let defs = vec![
            json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                "properties": {"x": {"type": "string"}}, "required": ["x"]}}}),
            json!({"type": "function", "function": {"name": "g"}}),
        ];
        let named = Tools::assemble(
            defs.clone(),
            Some(ToolChoice::Named("f".into())),
            true,
            "tool_choice",
        )
        .unwrap()
        .unwrap();
        let call =
            "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"x\": \"y\"}";
        let (n, len) = accepted(&mut *compiled(None, Some(&named)), call);
        assert_eq!(n, len);
        let other = "<|channel|>commentary to=functions.g <|constrain|>json<|message|>{}";
        let (n, len) = accepted(&mut *compiled(None, Some(&named)), other);
        assert!(n < len);
        let required = Tools::assemble(defs, Some(ToolChoice::Required), true, "tool_choice")
            .unwrap()
            .unwrap();
        for text in [call, other] {
            let (n, len) = accepted(&mut *compiled(None, Some(&required)), text);
            assert_eq!(n, len, "{text}");
        }
        // `auto` with a structured output: the answer is the format, or a call.
        let auto = Tools::assemble(defs_auto(), None, true, "tool_choice")
            .unwrap()
            .unwrap();
        let schema = r#"{"type": "object", "properties": {"a": {"type": "integer"}}}"#;
        for text in [call, "<|channel|>final<|message|>{\"a\": 1}"] {
            let c = Some(Constraint::JsonSchema(schema.into()));
            let (n, len) = accepted(&mut *compiled(c, Some(&auto)), text);
            assert_eq!(n, len, "{text}");
        }
    }

    #[test]
    fn harmony_dates_and_efforts() {
        assert_eq!(encore_core::tokenizer::civil_from_days(0), (1970, 1, 1));
        assert_eq!(
            encore_core::tokenizer::civil_from_days(20_307),
            (2025, 8, 7)
        );
        assert_eq!(
            encore_core::tokenizer::civil_from_days(11_016),
            (2000, 2, 29)
        );
        assert_eq!(today().len(), 10);
        assert_eq!(effort("high", "x").unwrap(), Effort::High);
        let e = effort("minimal", "reasoning.effort").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("reasoning.effort"));
    }
}
