//! Token-level constraints on what a request generates (structured outputs): a request's
//! [`Constraint`] is compiled once, at admission, into a [`TokenConstraint`] that gives the
//! tokens allowed next as a bitmask (one bit per token of the model's vocabulary, 32 to
//! a word) and advances by each sampled token. The runner applies the mask inside the
//! sampling op (`crate::backend::TokenMask`), so constrained and unconstrained requests
//! share the batch and the captured graphs.
//!
//! JSON schemas, `json_object`, regular expressions, choices and Lark grammars go through
//! `llguidance` (the library vLLM and mistral.rs use), over the bytes of every token of
//! the model's tokenizer ([`Tokenizer::token_bytes`]); `AllowedTokens` is a fixed set.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};

use crate::request::Constraint;
use crate::tokenizer::Tokenizer;

/// One request's live constraint.
pub trait TokenConstraint: Send {
    /// Write the tokens allowed next into `words` (bit `t % 32` of word `t / 32` for
    /// token `t`; every other bit 0). An error when the constraint failed or allows no
    /// token: the request cannot go on.
    fn fill_mask(&mut self, words: &mut [u32]) -> Result<(), String>;
    /// Advance by the token sampled under the last mask.
    fn commit(&mut self, token: u32) -> Result<(), String>;
    /// Speculative decoding: how many of `tokens`, in a row from here, the constraint
    /// allows (the drafts a grammar rejects are cut there); it does not advance.
    fn validate(&mut self, tokens: &[u32]) -> usize;
    /// Speculative decoding: undo the last `n` commits (drafts a verify step's masks were
    /// computed through).
    fn rollback(&mut self, n: usize) -> Result<(), String>;
    /// Tokens the constraint forces from here, one way only (a JSON key, a closing
    /// bracket): drafts every sample under its masks will equal. Empty: none.
    fn forced(&mut self) -> Vec<u32> {
        Vec::new()
    }
}

/// Compiles [`Constraint`]s for one model: its tokenizer's tokens, indexed once.
pub struct ConstraintCompiler {
    factory: Arc<ParserFactory>,
    /// Tokens of the model's logits (the embedding rows; may exceed the tokenizer's).
    vocab: usize,
    /// The tokens that end generation; allowed wherever the grammar may end.
    eos: Vec<u32>,
    /// The end token the grammar engine knows (one of `eos`).
    grammar_eos: u32,
}

impl std::fmt::Debug for ConstraintCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintCompiler")
            .field("vocab", &self.vocab)
            .field("eos", &self.eos)
            .finish()
    }
}

impl ConstraintCompiler {
    /// Index `tok`'s tokens for a model with `vocab` logits. An error (naming why) when
    /// the tokenizer has no end-of-generation token.
    pub fn new(tok: &Tokenizer, vocab: usize) -> Result<Self, String> {
        let eos = tok.eos_token_ids();
        let Some(&grammar_eos) = eos.first() else {
            return Err("the tokenizer has no end-of-generation token".into());
        };
        let mut words = tok.token_bytes();
        words.truncate(vocab);
        let n = words.len() as u32;
        if grammar_eos >= n {
            return Err(format!(
                "the end token {grammar_eos} is outside the vocabulary"
            ));
        }
        let trie = TokTrie::from(&TokRxInfo::new(n, grammar_eos), &words);
        let env: llguidance::toktrie::TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        Ok(ConstraintCompiler {
            factory: Arc::new(factory),
            vocab,
            eos,
            grammar_eos,
        })
    }

    /// Words per mask row: the model's vocabulary over 32, rounded up.
    pub fn mask_words(&self) -> usize {
        self.vocab.div_ceil(32)
    }

    /// Compile `c`; an error says what is wrong with it (an invalid schema, regex or
    /// grammar, a token id outside the vocabulary).
    pub fn compile(&self, c: &Constraint) -> Result<Box<dyn TokenConstraint>, String> {
        let grammar = match c {
            Constraint::AllowedTokens(ids) => {
                let mut words = vec![0u32; self.mask_words()];
                for &t in ids {
                    if t as usize >= self.vocab {
                        return Err(format!(
                            "token id {t} is outside the vocabulary of {}",
                            self.vocab
                        ));
                    }
                    words[t as usize / 32] |= 1 << (t % 32);
                }
                if ids.is_empty() {
                    return Err("the list of allowed tokens is empty".into());
                }
                return Ok(Box::new(Fixed(words)));
            }
            Constraint::JsonSchema(schema) => {
                let v: serde_json::Value = serde_json::from_str(schema)
                    .map_err(|e| format!("the JSON schema is not JSON: {e}"))?;
                if !v.is_object() {
                    return Err("the JSON schema must be an object".into());
                }
                TopLevelGrammar::from_json_schema(json_layout(v))
            }
            Constraint::JsonObject => TopLevelGrammar::from_json_schema(json_layout(
                serde_json::json!({"type": "object"}),
            )),
            Constraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Constraint::Choice(choices) => {
                if choices.is_empty() {
                    return Err("the list of choices is empty".into());
                }
                let alts: Vec<String> = choices
                    .iter()
                    .map(|c| serde_json::to_string(c).expect("a string serializes"))
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | ")))
            }
            Constraint::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        Ok(Box::new(Grammar {
            matcher,
            eos: self.eos.clone(),
            grammar_eos: self.grammar_eos,
        }))
    }
}

/// The JSON layout constrained output takes unless the schema sets its own
/// (`x-guidance`): `{"a": 1, "b": [2, 3]}`, one space after `:` and `,` and none
/// elsewhere, as JSON is usually written, so a model cannot fill its budget with
/// whitespace.
pub fn json_layout(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "whitespace_flexible": false,
                "key_separator": ": ",
                "item_separator": ", ",
            })
        });
    }
    schema
}

/// A fixed set of allowed tokens.
struct Fixed(Vec<u32>);

impl TokenConstraint for Fixed {
    fn fill_mask(&mut self, words: &mut [u32]) -> Result<(), String> {
        words.fill(0);
        let n = self.0.len().min(words.len());
        words[..n].copy_from_slice(&self.0[..n]);
        Ok(())
    }

    fn commit(&mut self, _: u32) -> Result<(), String> {
        Ok(())
    }

    fn validate(&mut self, tokens: &[u32]) -> usize {
        let allowed = |t: u32| {
            let w = self.0.get(t as usize / 32).copied().unwrap_or(0);
            (w >> (t % 32)) & 1 == 1
        };
        tokens.iter().take_while(|&&t| allowed(t)).count()
    }

    fn rollback(&mut self, _: usize) -> Result<(), String> {
        Ok(())
    }
}

/// An llguidance grammar (JSON schema, regex, choice, Lark).
struct Grammar {
    matcher: Matcher,
    eos: Vec<u32>,
    grammar_eos: u32,
}

impl TokenConstraint for Grammar {
    fn fill_mask(&mut self, words: &mut [u32]) -> Result<(), String> {
        let mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| format!("the constraint allows no token here ({})", first_line(&e)))?;
        words.fill(0);
        let src = mask.as_slice();
        let n = src.len().min(words.len());
        words[..n].copy_from_slice(&src[..n]);
        // Bits past the tokenizer's vocabulary stay 0 (its last word may hold some).
        let vocab = mask.len();
        if vocab % 32 != 0 && vocab / 32 < words.len() {
            words[vocab / 32] &= (1u32 << (vocab % 32)) - 1;
        }
        let e = self.grammar_eos as usize;
        if (words[e / 32] >> (e % 32)) & 1 == 1 {
            for &t in &self.eos {
                if let Some(w) = words.get_mut(t as usize / 32) {
                    *w |= 1 << (t % 32);
                }
            }
        }
        if words.iter().all(|&w| w == 0) {
            return Err("the constraint allows no token here".into());
        }
        Ok(())
    }

    fn commit(&mut self, token: u32) -> Result<(), String> {
        let t = if self.eos.contains(&token) {
            if self.matcher.is_stopped() {
                return Ok(()); // the grammar is complete: the end token is all it allows
            }
            self.grammar_eos
        } else {
            token
        };
        self.matcher
            .consume_token(t)
            .map_err(|e| format!("the constraint refused token {token}: {}", first_line(&e)))
    }

    fn validate(&mut self, tokens: &[u32]) -> usize {
        // The grammar knows one end token: the others map to it, and nothing follows.
        // An end token is never a draft here (its commit may consume nothing, which a
        // rollback would miscount): drafts stop before it.
        let ids: Vec<u32> = tokens
            .iter()
            .copied()
            .take_while(|t| !self.eos.contains(t))
            .collect();
        self.matcher.validate_tokens(&ids).unwrap_or(0)
    }

    fn rollback(&mut self, n: usize) -> Result<(), String> {
        self.matcher
            .rollback(n)
            .map_err(|e| format!("the constraint could not roll back: {}", first_line(&e)))
    }

    fn forced(&mut self) -> Vec<u32> {
        if self.matcher.is_stopped() {
            return Vec::new();
        }
        self.matcher.compute_ff_tokens()
    }
}

/// The first line of an llguidance error (the rest is a dump of the parser's state).
fn first_line(e: &impl std::fmt::Display) -> String {
    e.to_string()
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_string()
}
