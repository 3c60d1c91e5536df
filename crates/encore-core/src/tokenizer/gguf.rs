//! A [`Tokenizer`] built from the `tokenizer.*` metadata of a GGUF file.
//!
//! The GGUF reader (`model::gguf`) fills a [`GgufVocab`]; this module turns it into a
//! `tokenizers` pipeline that encodes like the Hugging Face tokenizer the file was
//! converted from:
//!
//! - `gpt2`: byte-level BPE over `tokens` + `merges`. The pre-tokenizer comes from
//!   `tokenizer.ggml.pre`, named as llama.cpp's `llama-vocab.cpp` names them; each name
//!   maps to the split the model's own `tokenizer.json` makes (llama3's digits in runs of
//!   one to three, qwen2's single digits, smollm's and starcoder's `Digits` then GPT-2's
//!   regex, ...). An unknown name is a warning and GPT-2's regex, which is what
//!   `transformers` builds for it (llama.cpp refuses such a file instead). For the names of
//!   llama.cpp's Llama 3 group (`llama3`, `llama-v3`, `llama-bpe`, `falcon3`, `falcon-h1`,
//!   `pixtral`, `midm-2.0`, `lfm2`, `jina-v5-nano`) and `tekken`, `minicpm5`, `youtu`,
//!   `granite-embed-multi-97m` the BPE model has `ignore_merges` (as the Llama 3
//!   `tokenizer.json` does): a pre-token that is itself a token is that one id, even where
//!   the merges would not rebuild it.
//! - `llama`: SentencePiece BPE as `LlamaTokenizerFast` (the Llama-2 `tokenizer.json`)
//!   writes it: the normalizer prepends `▁` (when `add_space_prefix`, default true) and
//!   turns spaces into `▁`; BPE with byte fallback, merges derived from the vocabulary
//!   and scores the way `transformers` derives them; the decoder undoes it.
//!
//! Control tokens (type 3) become special added tokens and user-defined ones (type 4)
//! plain added tokens, so `<|im_start|>` in a prompt is one id and
//! `skip_special_tokens` drops control tokens. BOS/EOS come from their ids and
//! `add_bos_token`/`add_eos_token` go into the post-processor. Without
//! `add_bos_token`, BOS is added as llama.cpp defaults it: for `llama` vocabularies and
//! for the Llama 3 group, `tekken` and `chameleon`, not for other `gpt2` ones.
//!
//! `eos_token_ids()` (what generation stops on) is the metadata's EOS, then its EOT, then
//! every control token whose text is one llama.cpp treats as end of generation
//! (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `<|eom_id|>`, `<end_of_turn>`, `<|end|>`,
//! ...: [`END_OF_GENERATION_TEXTS`]), in id order; the GGUF model config's
//! `eos_token_ids` is the same list. Unlike llama.cpp, a token of that text which is not
//! a control token is left out (llama.cpp promotes it to control), and llama.cpp's
//! FIM tokens (`<|fim_pad|>`, `<|repo_name|>`, `<|file_sep|>`), which it also stops on, are
//! not added: transformers' generation configs do not list them.
//!
//! NOTE: where `transformers`' GGUF loader and the model's original tokenizer differ,
//! this follows the original (and llama.cpp): `smollm`/`starcoder`/`falcon`/... keep their
//! digit splitting (`transformers` only special-cases a few names), a control or
//! user-defined token spelled outside the byte alphabet stays whole at its id
//! (`transformers` drops it), and `add_space_prefix` is honoured. For `llama` vocabularies
//! recent `transformers` uses a `Metaspace` pre-tokenizer that adds no `▁` to text already
//! starting with a space, nor after a special token; SentencePiece, llama.cpp and the
//! Llama-2 `tokenizer.json` do (`" Hello"` is `▁▁Hello`), and so does this.

use std::collections::HashMap;

use serde_json::{json, Map, Value as Json};

use super::template::ChatTemplate;
use super::{Kind, Tokenizer};
use crate::error::{Error, Result};

/// The `tokenizer.ggml.*` and `tokenizer.chat_template` values of a GGUF file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE) or `llama` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer name llama.cpp gives (`llama-bpe`,
    /// `qwen2`, `smollm`, `default`, ...), when present.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, indexed by token id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores` (SentencePiece vocabularies).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type`: 1 normal, 2 unknown, 3 control, 4 user-defined,
    /// 5 unused, 6 byte.
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges` (BPE), `"left right"` per entry, highest priority first.
    pub merges: Option<Vec<String>>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id` (end of turn, e.g. `<|eot_id|>`): a second id that
    /// ends generation.
    pub eot_token_id: Option<u32>,
    pub unknown_token_id: Option<u32>,
    pub padding_token_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token` / `add_eos_token` / `add_space_prefix`.
    pub add_bos_token: Option<bool>,
    pub add_eos_token: Option<bool>,
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}

/// `tokenizer.ggml.token_type` values that matter here.
const TYPE_CONTROL: i32 = 3;
const TYPE_USER_DEFINED: i32 = 4;

impl Tokenizer {
    /// The tokenizer a GGUF file describes; `origin` (the file path) names it in errors.
    pub fn from_gguf_vocab(vocab: &GgufVocab, origin: &str) -> Result<Tokenizer> {
        let err = |what: String| Error::Tokenizer(format!("GGUF tokenizer of `{origin}`: {what}"));
        let n = vocab.tokens.len();
        if n == 0 {
            return Err(err("`tokenizer.ggml.tokens` is empty".into()));
        }
        if n > u32::MAX as usize {
            return Err(err(format!("{n} tokens do not fit u32 ids")));
        }
        if let Some(types) = &vocab.token_types {
            if types.len() != n {
                return Err(err(format!(
                    "`tokenizer.ggml.token_type` has {} entries for {n} tokens",
                    types.len()
                )));
            }
        }
        let specials = SpecialIds::check(vocab, &err)?;

        let spm = match vocab.model.as_str() {
            "gpt2" => false,
            "llama" => true,
            other => {
                return Err(err(format!(
                    "tokenizer model `{other}` is not supported (supported: `gpt2` byte-level \
                     BPE, `llama` SentencePiece BPE)"
                )))
            }
        };
        let add_bos = vocab
            .add_bos_token
            .unwrap_or_else(|| spm || pre_adds_bos(vocab.pre.as_deref()));
        let add_eos = vocab.add_eos_token.unwrap_or(false);
        let text = |id: Option<u32>| id.map(|id| vocab.tokens[id as usize].clone());

        let mut tok = if spm {
            sentencepiece_json(vocab, text(specials.unk), &err)?
        } else {
            byte_level_json(vocab, origin, &err)?
        };
        tok["added_tokens"] = added_tokens(vocab, &specials);
        let with_text = |id: u32| (id, vocab.tokens[id as usize].clone());
        tok["post_processor"] = post_processor(
            specials.bos.filter(|_| add_bos).map(with_text),
            specials.eos.filter(|_| add_eos).map(with_text),
        );
        if add_bos && specials.bos.is_none() {
            tracing::warn!("`{origin}` asks for BOS but has no `tokenizer.ggml.bos_token_id`");
        }
        if add_eos && specials.eos.is_none() {
            tracing::warn!("`{origin}` asks for EOS but has no `tokenizer.ggml.eos_token_id`");
        }
        let hf: tokenizers::Tokenizer =
            serde_json::from_value(tok).map_err(|e| err(format!("cannot build it: {e}")))?;

        let mut special_strings = std::collections::BTreeMap::new();
        for (key, id) in [
            ("bos_token", specials.bos),
            ("eos_token", specials.eos),
            ("unk_token", specials.unk),
            ("pad_token", specials.pad),
        ] {
            if let Some(s) = text(id) {
                special_strings.insert(key, s);
            }
        }
        let eos_ids = end_of_generation_ids(
            specials.eos.into_iter().chain(specials.eot),
            vocab
                .tokens
                .iter()
                .enumerate()
                .filter(|&(id, _)| token_type(vocab, id) == TYPE_CONTROL)
                .map(|(id, t)| (id as u32, t.as_str())),
        );
        let (template, no_template_reason) = match &vocab.chat_template {
            Some(source) => (
                Some(ChatTemplate::new(source.clone(), origin)?),
                String::new(),
            ),
            None => (
                None,
                format!(
                    "the model has no chat template (no `tokenizer.chat_template` in \
                     `{origin}`); send a raw prompt instead"
                ),
            ),
        };
        Ok(Tokenizer {
            kind: Kind::Hf(Box::new(hf)),
            vocab_size: n,
            bos_id: specials.bos,
            eos_ids,
            // The post-processor adds BOS (and EOS) itself, as transformers' does.
            add_bos: false,
            special_strings,
            template,
            no_template_reason,
        })
    }
}

/// The special token ids of the metadata, each checked to be a token.
struct SpecialIds {
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
}

impl SpecialIds {
    fn check(vocab: &GgufVocab, err: &dyn Fn(String) -> Error) -> Result<SpecialIds> {
        let n = vocab.tokens.len();
        let check = |key: &str, id: Option<u32>| match id {
            Some(id) if id as usize >= n => Err(err(format!(
                "`tokenizer.ggml.{key}` is {id}, past the {n} tokens"
            ))),
            _ => Ok(id),
        };
        Ok(SpecialIds {
            bos: check("bos_token_id", vocab.bos_token_id)?,
            eos: check("eos_token_id", vocab.eos_token_id)?,
            eot: check("eot_token_id", vocab.eot_token_id)?,
            unk: check("unknown_token_id", vocab.unknown_token_id)?,
            pad: check("padding_token_id", vocab.padding_token_id)?,
        })
    }
}

/// `tokenizer.json` of a byte-level BPE vocabulary, without added tokens.
fn byte_level_json(vocab: &GgufVocab, origin: &str, err: &dyn Fn(String) -> Error) -> Result<Json> {
    let merges = vocab.merges.as_ref().ok_or_else(|| {
        err("a `gpt2` vocabulary needs `tokenizer.ggml.merges`, which is missing".into())
    })?;
    let alphabet = byte_alphabet();
    let mut is_letter = vec![false; 0x200];
    for &c in &alphabet {
        is_letter[c as usize] = true;
    }
    let in_alphabet = |t: &str| t.chars().all(|c| is_letter.get(c as usize) == Some(&true));
    let mut model_vocab = Map::new();
    for (id, token) in vocab.tokens.iter().enumerate() {
        let kind = token_type(vocab, id);
        // A normal token spelled as plain text is written in the byte alphabet, as
        // transformers does; an added (control or user-defined) one keeps its text, which
        // is what the added-token matcher looks for.
        let key = if in_alphabet(token) || kind == TYPE_CONTROL || kind == TYPE_USER_DEFINED {
            token.clone()
        } else {
            token.bytes().map(|b| alphabet[b as usize]).collect()
        };
        model_vocab.insert(key, json!(id));
    }
    let pairs = merge_pairs(merges, err)?;
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "normalizer": null,
        "pre_tokenizer": byte_level_pre_tokenizer(vocab.pre.as_deref(), origin),
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                    "use_regex": true},
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": pre_ignores_merges(vocab.pre.as_deref()),
            "vocab": model_vocab,
            "merges": pairs,
        },
    }))
}

/// `tokenizer.json` of a SentencePiece BPE vocabulary, without added tokens.
fn sentencepiece_json(
    vocab: &GgufVocab,
    unk: Option<String>,
    err: &dyn Fn(String) -> Error,
) -> Result<Json> {
    let n = vocab.tokens.len();
    let scores = vocab.scores.as_ref().ok_or_else(|| {
        err("a `llama` vocabulary needs `tokenizer.ggml.scores`, which is missing".into())
    })?;
    if scores.len() != n {
        return Err(err(format!(
            "`tokenizer.ggml.scores` has {} entries for {n} tokens",
            scores.len()
        )));
    }
    let mut model_vocab = Map::new();
    for (id, token) in vocab.tokens.iter().enumerate() {
        model_vocab.insert(token.clone(), json!(id));
    }
    let merges: Vec<Json> = match &vocab.merges {
        Some(merges) => merge_pairs(merges, err)?,
        None => merges_from_scores(&vocab.tokens, scores)
            .into_iter()
            .map(|(l, r)| json!([l, r]))
            .collect(),
    };
    let space_prefix = vocab.add_space_prefix.unwrap_or(true);
    let mut normalizers = Vec::new();
    if space_prefix {
        normalizers.push(json!({"type": "Prepend", "prepend": "▁"}));
    }
    normalizers.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"}));
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if space_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": null,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": unk,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": true,
            "byte_fallback": true,
            "ignore_merges": false,
            "vocab": model_vocab,
            "merges": merges,
        },
    }))
}

/// `tokenizer.ggml.merges` entries (`"left right"`) as `[left, right]` pairs.
fn merge_pairs(merges: &[String], err: &dyn Fn(String) -> Error) -> Result<Vec<Json>> {
    merges
        .iter()
        .enumerate()
        .map(|(i, merge)| match merge.split_once(' ') {
            Some((l, r)) if !l.is_empty() && !r.is_empty() && !r.contains(' ') => Ok(json!([l, r])),
            _ => Err(err(format!(
                "merge {i} `{merge}` of `tokenizer.ggml.merges` is not two tokens separated \
                 by one space"
            ))),
        })
        .collect()
}

/// BPE merges a SentencePiece vocabulary implies, as `transformers`' `generate_merges`
/// derives them: every split of a token into two tokens, best merged score first, then
/// longer left and right parts first; within one token by the parts' ids. Lengths are in
/// characters and ties keep vocabulary order (a stable sort).
fn merges_from_scores<'a>(tokens: &'a [String], scores: &[f32]) -> Vec<(&'a str, &'a str)> {
    // A repeated token keeps its first position and its last id and score, as a Python
    // dict built from the lists does.
    let mut ids: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    for (id, t) in tokens.iter().enumerate() {
        ids.insert(t.as_str(), id);
    }
    let mut seen = std::collections::HashSet::with_capacity(tokens.len());
    let mut merges: Vec<(&str, &str, f32, usize, usize)> = Vec::new();
    for token in tokens {
        let token = token.as_str();
        if !seen.insert(token) {
            continue;
        }
        let score = scores[ids[token]];
        let mut local: Vec<(&str, &str, usize, usize)> = Vec::new();
        for (split, _) in token.char_indices().skip(1) {
            let (l, r) = token.split_at(split);
            if let (Some(&il), Some(&ir)) = (ids.get(l), ids.get(r)) {
                local.push((l, r, il, ir));
            }
        }
        local.sort_by_key(|&(_, _, il, ir)| (il, ir));
        merges.extend(
            local
                .into_iter()
                .map(|(l, r, _, _)| (l, r, score, l.chars().count(), r.chars().count())),
        );
    }
    merges.sort_by(|a, b| b.2.total_cmp(&a.2).then(b.3.cmp(&a.3)).then(b.4.cmp(&a.4)));
    merges.into_iter().map(|(l, r, ..)| (l, r)).collect()
}

/// The pre-tokenizer names of the Llama 3 group, as llama.cpp groups them: a whole
/// pre-token found in the vocabulary is that token (`ignore_merges`), and BOS is added
/// by default.
const LLAMA3_GROUP: &[&str] = &[
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "jina-v5-nano",
];

/// Whether a byte-level vocabulary with this `tokenizer.ggml.pre` looks a whole
/// pre-token up in the vocabulary before merging (`ignore_merges` in `tokenizers`;
/// llama.cpp's list: the Llama 3 group, `tekken` and a few others).
fn pre_ignores_merges(pre: Option<&str>) -> bool {
    pre.is_some_and(|pre| {
        LLAMA3_GROUP.contains(&pre)
            || ["tekken", "minicpm5", "youtu", "granite-embed-multi-97m"].contains(&pre)
    })
}

/// Whether a byte-level vocabulary with this `tokenizer.ggml.pre` adds BOS when
/// `tokenizer.ggml.add_bos_token` is absent (llama.cpp's defaults: the Llama 3 group,
/// `tekken` and `chameleon`; other byte-level vocabularies add none).
fn pre_adds_bos(pre: Option<&str>) -> bool {
    pre.is_some_and(|pre| LLAMA3_GROUP.contains(&pre) || ["tekken", "chameleon"].contains(&pre))
}

/// Texts of control tokens that end generation besides the metadata's EOS/EOT ids, as
/// llama.cpp lists them (its `special_eog_ids`): the end-of-turn and end-of-text tokens
/// of the chat formats (Qwen's `<|im_end|>` and `<|endoftext|>`, Llama 3's `<|eot_id|>`
/// and `<|eom_id|>`, Gemma's `<end_of_turn>`, Phi's `<|end|>`, DeepSeek's
/// `<｜end▁of▁sentence｜>`, ...).
const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// The ids that end generation: `metadata` (EOS, then EOT) first, then the `controls`
/// (control tokens as `(id, text)`, in id order) whose text is in
/// [`END_OF_GENERATION_TEXTS`], each once. As llama.cpp does, `<|end|>` is left out when
/// the vocabulary also has `<|return|>` and `<|call|>` (gpt-oss) or `<|calls|>` and
/// `<|flush|>` (Solar Open), where it ends a message but not the turn, and `</s>` when it
/// has `<|tool_response>` (Gemma 4); an id of the metadata always stays.
pub(crate) fn end_of_generation_ids<'a>(
    metadata: impl IntoIterator<Item = u32>,
    controls: impl IntoIterator<Item = (u32, &'a str)>,
) -> Vec<u32> {
    let mut ids: Vec<u32> = Vec::new();
    for id in metadata {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    let found: Vec<(u32, &str)> = controls
        .into_iter()
        .filter(|(_, text)| END_OF_GENERATION_TEXTS.contains(text))
        .collect();
    let has = |t: &str| found.iter().any(|&(_, text)| text == t);
    let drop_end = (has("<|return|>") && has("<|call|>")) || (has("<|calls|>") && has("<|flush|>"));
    let drop_s = has("<|tool_response>");
    for (id, text) in found {
        let dropped = (drop_end && text == "<|end|>") || (drop_s && text == "</s>");
        if !dropped && !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

fn token_type(vocab: &GgufVocab, id: usize) -> i32 {
    vocab.token_types.as_ref().map_or(1, |t| t[id])
}

/// Control tokens as special added tokens, user-defined ones as plain added tokens, and
/// the BOS/EOS/UNK/PAD tokens as special (transformers adds its special tokens too).
fn added_tokens(vocab: &GgufVocab, specials: &SpecialIds) -> Json {
    let special_ids = [
        specials.bos,
        specials.eos,
        specials.eot,
        specials.unk,
        specials.pad,
    ];
    let mut out = Vec::new();
    for (id, token) in vocab.tokens.iter().enumerate() {
        let kind = token_type(vocab, id);
        let special = kind == TYPE_CONTROL || special_ids.contains(&Some(id as u32));
        if (special || kind == TYPE_USER_DEFINED) && !token.is_empty() {
            out.push(json!({
                "id": id,
                "content": token,
                "single_word": false,
                "lstrip": false,
                "rstrip": false,
                "normalized": false,
                "special": special,
            }));
        }
    }
    Json::Array(out)
}

/// A template post-processor putting BOS first and EOS last, each when given.
fn post_processor(bos: Option<(u32, String)>, eos: Option<(u32, String)>) -> Json {
    let special = |t: &str, type_id: u32| json!({"SpecialToken": {"id": t, "type_id": type_id}});
    let seq = |s: &str, type_id: u32| json!({"Sequence": {"id": s, "type_id": type_id}});
    let piece = |s: &str, type_id: u32| {
        let mut v = Vec::new();
        if let Some((_, t)) = &bos {
            v.push(special(t, type_id));
        }
        v.push(seq(s, type_id));
        if let Some((_, t)) = &eos {
            v.push(special(t, type_id));
        }
        v
    };
    let single = piece("A", 0);
    let mut pair = piece("A", 0);
    pair.extend(piece("B", 1));
    let mut tokens = Map::new();
    for (id, t) in bos.iter().chain(eos.iter()) {
        tokens.insert(t.clone(), json!({"id": t, "ids": [id], "tokens": [t]}));
    }
    json!({"type": "TemplateProcessing", "single": single, "pair": pair,
           "special_tokens": tokens})
}

/// GPT-2's pre-tokenizer regex (what `ByteLevel` with `use_regex` splits by).
const GPT2_SPLIT: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Llama 3's split: digits in runs of up to three, letters with one leading non-letter.
const LLAMA3_SPLIT: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// Qwen2's split: as Llama 3's but one digit per piece.
const QWEN2_SPLIT: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// Mistral's tekken split: words split at case changes, single digits.
const TEKKEN_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// GPT-4o's (o200k) split, also Llama 4's.
const GPT4O_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// DeepSeek LLM's splits, in order (its `tokenizer.json` lists the cased-letter ranges).
/// NOTE: characters with a canonical singleton decomposition (U+1F7D, U+2126, ...) are
/// written as `\x{..}` escapes: a tool that normalises text would silently change them.
const DEEPSEEK_LLM_SPLITS: &[&str] = &[
    r"[\r\n]",
    concat!(
        r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿ",
        r"ᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\x{1F7D}ᾀ-ᾴᾶ-ᾼ\x{1FBE}ῂ-ῄῆ-ῌῐ-\x{1FD3}ῖ-\x{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\x{2126}ℨ\x{212A}-ℭ",
        r"ℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻",
        r"𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+"
    ),
    r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
    r"\s+$",
    r"[一-龥ࠀ-一가-퟿]+",
    r"\p{N}+",
];

/// DeepSeek Coder's splits, in order.
const DEEPSEEK_CODER_SPLITS: &[&str] = &[
    r"[\r\n]",
    r"\s?\p{L}+",
    r"\s?\p{P}+",
    r"[一-龥ࠀ-一가-퟿]+",
    r"\p{N}",
];

/// Falcon's splits: punctuation runs, GPT-2's regex, then digits in threes.
const FALCON_SPLITS: &[&str] = &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2_SPLIT, r"[0-9][0-9][0-9]"];

/// How a byte-level vocabulary splits text before BPE.
enum PreSplit {
    /// GPT-2's regex (`ByteLevel` with `use_regex`).
    Gpt2,
    /// Single digits first, then GPT-2's regex (StarCoder, SmolLM, ...).
    DigitsThenGpt2,
    /// These regexes in order, each piece kept (`Split`, `Isolated`).
    Regexes(&'static [&'static str]),
}

/// The split of a `tokenizer.ggml.pre` name, as llama.cpp's `llama-vocab.cpp` maps them.
fn pre_split(pre: &str) -> Option<PreSplit> {
    Some(match pre {
        "default" | "gpt2" | "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "roberta-bpe"
        | "jina-es" | "jina-de" | "jina-v1-en" | "jina-v2-es" | "jina-v2-de" | "jina-v2-code"
        | "gigachat" | "trillion" => PreSplit::Gpt2,
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" => {
            PreSplit::DigitsThenGpt2
        }
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "dbrx" | "smaug-bpe" | "chatglm-bpe" => PreSplit::Regexes(&[LLAMA3_SPLIT]),
        "qwen2" | "deepseek-r1-qwen" | "megrez" | "stablelm2" | "hunyuan" => {
            PreSplit::Regexes(&[QWEN2_SPLIT])
        }
        "tekken" => PreSplit::Regexes(&[TEKKEN_SPLIT]),
        "gpt-4o" | "llama4" | "minimax-m2" => PreSplit::Regexes(&[GPT4O_SPLIT]),
        "deepseek-llm" => PreSplit::Regexes(DEEPSEEK_LLM_SPLITS),
        "deepseek-coder" => PreSplit::Regexes(DEEPSEEK_CODER_SPLITS),
        "falcon" => PreSplit::Regexes(FALCON_SPLITS),
        _ => return None,
    })
}

/// The byte-level pre-tokenizer for `tokenizer.ggml.pre` (GPT-2's when absent).
fn byte_level_pre_tokenizer(pre: Option<&str>, origin: &str) -> Json {
    let split = match pre {
        None => PreSplit::Gpt2,
        Some(name) => pre_split(name).unwrap_or_else(|| {
            tracing::warn!(
                "`{origin}`: unknown `tokenizer.ggml.pre` `{name}`; splitting text with \
                 GPT-2's regex, as transformers does (tokens may differ from the model's own \
                 tokenizer)"
            );
            PreSplit::Gpt2
        }),
    };
    let byte_level = |use_regex: bool| {
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
               "use_regex": use_regex})
    };
    match split {
        PreSplit::Gpt2 => byte_level(true),
        PreSplit::DigitsThenGpt2 => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            byte_level(true),
        ]}),
        PreSplit::Regexes(regexes) => {
            let mut seq: Vec<Json> = regexes
                .iter()
                .map(|r| {
                    json!({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated",
                           "invert": false})
                })
                .collect();
            seq.push(byte_level(false));
            json!({"type": "Sequence", "pretokenizers": seq})
        }
    }
}

/// GPT-2's byte -> printable character map: the alphabet byte-level BPE tokens are
/// spelled in.
fn byte_alphabet() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut extra = 0;
    (0..256u32)
        .map(|b| {
            let c = if printable(b) {
                b
            } else {
                extra += 1;
                255 + extra
            };
            char::from_u32(c).expect("below U+0200")
        })
        .collect()
}
