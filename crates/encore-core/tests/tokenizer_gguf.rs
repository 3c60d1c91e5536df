//! `Tokenizer::from_gguf_vocab` against references written by
//! `scripts/gguf_tokenizer_reference.py`: a small SentencePiece model (ids from
//! SentencePiece and the Llama-2 `tokenizer.json` pipeline), a small byte-level vocabulary
//! under each pre-tokenizer name (ids from transformers' GGUF builder and `tokenizers`),
//! and SmolLM2-135M-Instruct's GGUF (ids and chat renders from transformers), whose
//! vocabulary is read from the file named by `ENCORE_SMOLLM2_GGUF` (skipped when unset,
//! unless `ENCORE_REQUIRE_SMOLLM2=1`). Plus the flags and the errors.

use std::path::Path;

use encore_core::tokenizer::{ChatMessage, GgufVocab, Tokenizer};
use encore_core::Error;
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn opt_id(v: &Value) -> Option<u32> {
    v.as_u64().map(|x| x as u32)
}

/// The SentencePiece fixture as a GGUF vocabulary.
fn spm_vocab() -> (GgufVocab, Value) {
    let f = fixture("gguf_spm.json");
    let vocab = GgufVocab {
        model: "llama".into(),
        tokens: strings(&f["tokens"]),
        scores: Some(
            f["scores"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_f64().unwrap() as f32)
                .collect(),
        ),
        token_types: Some(
            ids(&f["token_types"])
                .into_iter()
                .map(|t| t as i32)
                .collect(),
        ),
        bos_token_id: opt_id(&f["bos_token_id"]),
        eos_token_id: opt_id(&f["eos_token_id"]),
        unknown_token_id: opt_id(&f["unknown_token_id"]),
        ..GgufVocab::default()
    };
    (vocab, f)
}

/// The byte-level fixture as a GGUF vocabulary with pre-tokenizer `pre`.
fn byte_level_vocab(f: &Value, pre: Option<&str>) -> GgufVocab {
    GgufVocab {
        model: "gpt2".into(),
        pre: pre.map(str::to_string),
        tokens: strings(&f["tokens"]),
        merges: Some(strings(&f["merges"])),
        token_types: Some(
            ids(&f["token_types"])
                .into_iter()
                .map(|t| t as i32)
                .collect(),
        ),
        bos_token_id: Some(0),
        eos_token_id: Some(2),
        ..GgufVocab::default()
    }
}

/// Every case of a fixture: ids without and with special tokens, and both decodes.
fn check_cases(tok: &Tokenizer, cases: &Value) {
    for case in cases.as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        assert_eq!(tok.encode(text, false).unwrap(), want, "ids of {text:?}");
        if let Some(sp) = case.get("sentencepiece_ids") {
            assert_eq!(want, ids(sp), "fixture: SentencePiece ids of {text:?}");
        }
        assert_eq!(
            tok.encode(text, true).unwrap(),
            ids(&case["ids_with_special"]),
            "ids with special tokens of {text:?}"
        );
        assert_eq!(
            tok.decode(&want, false).unwrap(),
            case["decoded"].as_str().unwrap(),
            "decode of {text:?}"
        );
        assert_eq!(
            tok.decode(&want, true).unwrap(),
            case["decoded_skip_special"].as_str().unwrap(),
            "decode without special tokens of {text:?}"
        );
    }
}

#[test]
fn sentencepiece_vocab_encodes_like_sentencepiece_and_decodes_back() {
    let (vocab, f) = spm_vocab();
    let tok = Tokenizer::from_gguf_vocab(&vocab, "spm.gguf").unwrap();
    assert_eq!(tok.vocab_size(), vocab.tokens.len());
    assert_eq!(tok.bos_token_id(), Some(1));
    // `</s>` from the metadata, then the control token `<|im_end|>`, which ends a turn.
    assert_eq!(tok.eos_token_ids(), vec![2, 4]);
    check_cases(&tok, &f["cases"]);
    // A control token in text is one id; a user-defined one too.
    let im_start = tok.token_to_id("<|im_start|>").unwrap();
    let user = tok.token_to_id("<|user|>").unwrap();
    let got = tok.encode("<|user|>x<|im_start|>", false).unwrap();
    assert_eq!(got.first(), Some(&user));
    assert_eq!(got.last(), Some(&im_start));
    // Text only byte fallback can spell round-trips.
    let text = "日本 🦙 x";
    let ids = tok.encode(text, false).unwrap();
    assert_eq!(tok.decode(&ids, true).unwrap(), text);
}

#[test]
fn sentencepiece_flags_are_honoured() {
    let (mut vocab, _) = spm_vocab();
    let with_prefix = Tokenizer::from_gguf_vocab(&vocab, "spm.gguf").unwrap();
    assert_eq!(
        with_prefix.encode("the", true).unwrap()[0],
        1,
        "BOS by default"
    );

    vocab.add_bos_token = Some(false);
    vocab.add_eos_token = Some(true);
    vocab.add_space_prefix = Some(false);
    let tok = Tokenizer::from_gguf_vocab(&vocab, "spm.gguf").unwrap();
    let plain = tok.encode("the quick", false).unwrap();
    assert_eq!(
        tok.encode("the quick", true).unwrap(),
        [&plain[..], &[2]].concat()
    );
    // Without the prefix space, " the" spells what "the" spells with it.
    assert_eq!(
        tok.encode(" the quick", false).unwrap(),
        with_prefix.encode("the quick", false).unwrap()
    );
    assert_ne!(plain, with_prefix.encode("the quick", false).unwrap());
    assert_eq!(
        tok.decode(&tok.encode(" the", false).unwrap(), true)
            .unwrap(),
        " the"
    );
}

#[test]
fn byte_level_pre_tokenizers_split_like_their_models() {
    let f = fixture("gguf_pre.json");
    let texts = strings(&f["texts"]);
    let expected = f["expected"].as_object().unwrap();
    for (pre, want) in expected {
        let tok = Tokenizer::from_gguf_vocab(&byte_level_vocab(&f, Some(pre)), "pre.gguf").unwrap();
        for (text, want) in texts.iter().zip(want.as_array().unwrap()) {
            let got = tok.encode(text, false).unwrap();
            assert_eq!(got, ids(want), "pre `{pre}`, text {text:?}");
            assert_eq!(
                tok.decode(&got, false).unwrap(),
                *text,
                "pre `{pre}` round trip"
            );
        }
    }
    // The names split digits differently: qwen2 one by one, llama3 in threes (whose
    // pieces the vocabulary may spell in more than one token), GPT-2 all together.
    let pieces = |pre: &str| {
        let tok = Tokenizer::from_gguf_vocab(&byte_level_vocab(&f, Some(pre)), "pre.gguf").unwrap();
        let ids = tok.encode("1234567", false).unwrap();
        ids.iter()
            .map(|&id| tok.decode(&[id], false).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(pieces("qwen2"), ["1", "2", "3", "4", "5", "6", "7"]);
    assert_eq!(pieces("llama-bpe").concat(), "1234567");
    assert!(pieces("llama-bpe").iter().all(|p| p.len() <= 3));
    assert_ne!(pieces("llama-bpe"), pieces("gpt2"));
}

#[test]
fn every_known_pre_name_builds_and_an_unknown_one_falls_back_to_gpt2() {
    let f = fixture("gguf_pre.json");
    let text = "Hello World 12345\n\n  中文 日本語 한국어 Ωmega K 𐐀 ﬁ!? $+<=>";
    for pre in [
        "default",
        "gpt2",
        "gpt-2",
        "mpt",
        "olmo",
        "starcoder",
        "refact",
        "command-r",
        "smollm",
        "llama3",
        "llama-bpe",
        "dbrx",
        "qwen2",
        "stablelm2",
        "deepseek-r1-qwen",
        "tekken",
        "gpt-4o",
        "llama4",
        "deepseek-llm",
        "deepseek-coder",
        "falcon",
        "chatglm-bpe",
    ] {
        let tok = Tokenizer::from_gguf_vocab(&byte_level_vocab(&f, Some(pre)), "pre.gguf")
            .unwrap_or_else(|e| panic!("pre `{pre}`: {e}"));
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text, "pre `{pre}`");
    }
    let texts = strings(&f["texts"]);
    let unknown =
        Tokenizer::from_gguf_vocab(&byte_level_vocab(&f, Some("no-such-pre")), "pre.gguf").unwrap();
    let absent = Tokenizer::from_gguf_vocab(&byte_level_vocab(&f, None), "pre.gguf").unwrap();
    for (text, want) in texts.iter().zip(f["expected"]["gpt2"].as_array().unwrap()) {
        assert_eq!(unknown.encode(text, false).unwrap(), ids(want), "{text:?}");
        assert_eq!(absent.encode(text, false).unwrap(), ids(want), "{text:?}");
    }
}

#[test]
fn byte_level_specials_flags_and_spelling() {
    let f = fixture("gguf_pre.json");
    let mut vocab = byte_level_vocab(&f, Some("qwen2"));
    // A normal token written as plain text is respelled in the byte alphabet; a control
    // token outside the alphabet stays whole at its id.
    // (Tab is byte 9, `ĉ` in the alphabet.)
    vocab.tokens.push("\t\t".into());
    vocab.merges.as_mut().unwrap().push("ĉ ĉ".into());
    vocab.tokens.push("<｜begin▁of▁sentence｜>".into());
    vocab.token_types.as_mut().unwrap().extend([1, 3]);
    let n = vocab.tokens.len() as u32;
    vocab.eot_token_id = Some(1);
    vocab.add_bos_token = Some(true);
    vocab.add_eos_token = Some(true);
    vocab.chat_template = Some("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}".into());
    let tok = Tokenizer::from_gguf_vocab(&vocab, "bl.gguf").unwrap();
    assert_eq!(tok.vocab_size(), n as usize);
    // EOS, EOT, then the control token `<|endoftext|>` (an end-of-generation text).
    assert_eq!(tok.eos_token_ids(), vec![2, 1, 0]);
    assert_eq!(tok.encode("\t\t", false).unwrap(), [n - 2]);
    assert_eq!(
        tok.encode("a<｜begin▁of▁sentence｜>", false).unwrap()[1..],
        [n - 1]
    );
    let plain = tok.encode("hi <|im_end|>", false).unwrap();
    assert_eq!(plain.last(), Some(&2));
    assert_eq!(
        tok.encode("hi <|im_end|>", true).unwrap(),
        [&[0], &plain[..], &[2]].concat()
    );
    assert_eq!(tok.decode(&plain, true).unwrap(), "hi ");
    let rendered = tok
        .apply_chat_template(&[ChatMessage::new("user", "yo")], true)
        .unwrap();
    assert_eq!(rendered, "<|endoftext|>yo<|im_end|>");

    vocab.chat_template = None;
    let tok = Tokenizer::from_gguf_vocab(&vocab, "bl.gguf").unwrap();
    assert!(!tok.has_chat_template());
    let err = tok
        .apply_chat_template(&[ChatMessage::new("user", "yo")], true)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no chat template") && err.contains("bl.gguf"),
        "{err}"
    );
}

/// A tiny byte-level vocabulary whose `abc` is a token the merges cannot build: they
/// merge `a b` first, and there is no `ab c`, so BPE gives `ab` `c`.
fn unreachable_word_vocab(pre: &str) -> GgufVocab {
    let tokens = ["<|endoftext|>", "a", "b", "c", "ab", "bc", "abc"];
    GgufVocab {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens: tokens.iter().map(|t| t.to_string()).collect(),
        token_types: Some(vec![3, 1, 1, 1, 1, 1, 1]),
        merges: Some(vec!["a b".into(), "b c".into()]),
        bos_token_id: Some(0),
        eos_token_id: Some(0),
        ..GgufVocab::default()
    }
}

#[test]
fn llama3_group_takes_a_whole_pre_token_from_the_vocabulary() {
    // `tokenizers` with `ignore_merges: true` (the Llama 3 `tokenizer.json`, llama.cpp's
    // llama3 group and tekken) looks the whole pre-token up first; without it the merges
    // alone decide.
    for (pre, want) in [
        ("llama-bpe", vec![6]),
        ("llama3", vec![6]),
        ("tekken", vec![6]),
        ("gpt2", vec![4, 3]),
        ("qwen2", vec![4, 3]),
        ("smollm", vec![4, 3]),
    ] {
        let mut vocab = unreachable_word_vocab(pre);
        vocab.add_bos_token = Some(false);
        let tok = Tokenizer::from_gguf_vocab(&vocab, "um.gguf").unwrap();
        assert_eq!(tok.encode("abc", false).unwrap(), want, "pre `{pre}`");
        // A pre-token not in the vocabulary still goes through the merges.
        assert_eq!(
            tok.encode("abcabc", false).unwrap(),
            [4, 3, 4, 3],
            "pre `{pre}`"
        );
        assert_eq!(tok.decode(&want, false).unwrap(), "abc");
    }
}

#[test]
fn add_bos_defaults_per_vocabulary_and_the_key_wins() {
    // Without `tokenizer.ggml.add_bos_token`: llama.cpp's defaults (the llama3 group,
    // tekken and SentencePiece add BOS; other byte-level vocabularies do not).
    for (pre, key, bos) in [
        ("llama-bpe", None, true),
        ("llama3", None, true),
        ("tekken", None, true),
        ("gpt2", None, false),
        ("qwen2", None, false),
        ("smollm", None, false),
        ("llama-bpe", Some(false), false),
        ("gpt2", Some(true), true),
    ] {
        let mut vocab = unreachable_word_vocab(pre);
        vocab.add_bos_token = key;
        let tok = Tokenizer::from_gguf_vocab(&vocab, "bos.gguf").unwrap();
        let plain = tok.encode("abc", false).unwrap();
        let with = tok.encode("abc", true).unwrap();
        let want = if bos {
            [&[0], &plain[..]].concat()
        } else {
            plain
        };
        assert_eq!(with, want, "pre `{pre}`, add_bos_token {key:?}");
    }
    let (mut spm, _) = spm_vocab();
    assert_eq!(spm.add_bos_token, None);
    let tok = Tokenizer::from_gguf_vocab(&spm, "spm.gguf").unwrap();
    assert_eq!(tok.encode("hi", true).unwrap()[0], 1);
    spm.add_bos_token = Some(false);
    let tok = Tokenizer::from_gguf_vocab(&spm, "spm.gguf").unwrap();
    assert_ne!(tok.encode("hi", true).unwrap()[0], 1);
}

#[test]
fn end_of_generation_adds_control_tokens_that_end_a_turn() {
    let tokens = [
        "a",                     // 0
        "<|endoftext|>",         // 1 control: ends generation
        "<|im_start|>",          // 2 control: does not
        "<|im_end|>",            // 3 control, the metadata's EOS
        "<|eot_id|>",            // 4 normal: not a control token, so not added
        "<end_of_turn>",         // 5 user-defined: not added either
        "<|eom_id|>",            // 6 control: added
        "<｜end▁of▁sentence｜>", // 7 control: added
    ];
    let vocab = GgufVocab {
        model: "gpt2".into(),
        pre: Some("qwen2".into()),
        tokens: tokens.iter().map(|t| t.to_string()).collect(),
        token_types: Some(vec![1, 3, 3, 3, 1, 4, 3, 3]),
        merges: Some(vec![]),
        eos_token_id: Some(3),
        ..GgufVocab::default()
    };
    let tok = Tokenizer::from_gguf_vocab(&vocab, "eog.gguf").unwrap();
    assert_eq!(tok.eos_token_ids(), vec![3, 1, 6, 7]);
    // EOT from the metadata comes second, even when its text is in the list.
    let tok = Tokenizer::from_gguf_vocab(
        &GgufVocab {
            eot_token_id: Some(6),
            ..vocab.clone()
        },
        "eog.gguf",
    )
    .unwrap();
    assert_eq!(tok.eos_token_ids(), vec![3, 6, 1, 7]);
    // No token types: nothing is known to be a control token.
    let tok = Tokenizer::from_gguf_vocab(
        &GgufVocab {
            token_types: None,
            ..vocab.clone()
        },
        "eog.gguf",
    )
    .unwrap();
    assert_eq!(tok.eos_token_ids(), vec![3]);

    // gpt-oss: `<|end|>` ends a message, not the turn, when `<|return|>` and `<|call|>`
    // exist; it ends generation otherwise.
    let harmony = |tokens: &[&str]| GgufVocab {
        model: "gpt2".into(),
        tokens: tokens.iter().map(|t| t.to_string()).collect(),
        token_types: Some(vec![3; tokens.len()]),
        merges: Some(vec![]),
        eos_token_id: Some(0),
        ..GgufVocab::default()
    };
    let tok =
        Tokenizer::from_gguf_vocab(&harmony(&["<|return|>", "<|end|>", "<|call|>"]), "oss.gguf")
            .unwrap();
    assert_eq!(tok.eos_token_ids(), vec![0, 2]);
    let tok =
        Tokenizer::from_gguf_vocab(&harmony(&["<|endoftext|>", "<|end|>"]), "phi.gguf").unwrap();
    assert_eq!(tok.eos_token_ids(), vec![0, 1]);
}

#[test]
fn bad_metadata_is_an_error_naming_the_file_and_the_fault() {
    let f = fixture("gguf_pre.json");
    let good = byte_level_vocab(&f, Some("gpt2"));
    let (spm, _) = spm_vocab();
    let cases: Vec<(GgufVocab, &str)> = vec![
        (
            GgufVocab {
                tokens: vec![],
                ..good.clone()
            },
            "`tokenizer.ggml.tokens` is empty",
        ),
        (
            GgufVocab {
                model: "bert".into(),
                ..good.clone()
            },
            "`bert` is not supported",
        ),
        (
            GgufVocab {
                model: "t5".into(),
                ..good.clone()
            },
            "`t5` is not supported",
        ),
        (
            GgufVocab {
                merges: None,
                ..good.clone()
            },
            "needs `tokenizer.ggml.merges`",
        ),
        (
            GgufVocab {
                merges: Some(vec!["Ġ t".into(), "abc".into()]),
                ..good.clone()
            },
            "merge 1 `abc`",
        ),
        (
            GgufVocab {
                merges: Some(vec!["Ġ zzzq".into()]),
                ..good.clone()
            },
            "cannot build it",
        ),
        (
            GgufVocab {
                token_types: Some(vec![1; 3]),
                ..good.clone()
            },
            "`tokenizer.ggml.token_type` has 3 entries",
        ),
        (
            GgufVocab {
                bos_token_id: Some(1_000_000),
                ..good.clone()
            },
            "`tokenizer.ggml.bos_token_id` is 1000000",
        ),
        (
            GgufVocab {
                eot_token_id: Some(u32::MAX),
                ..good.clone()
            },
            "`tokenizer.ggml.eot_token_id`",
        ),
        (
            GgufVocab {
                chat_template: Some("{% for %}".into()),
                ..good.clone()
            },
            "chat template",
        ),
        (
            GgufVocab {
                scores: None,
                ..spm.clone()
            },
            "needs `tokenizer.ggml.scores`",
        ),
        (
            GgufVocab {
                scores: Some(vec![0.0; 5]),
                ..spm.clone()
            },
            "`tokenizer.ggml.scores` has 5 entries",
        ),
    ];
    for (vocab, want) in cases {
        let err = Tokenizer::from_gguf_vocab(&vocab, "bad.gguf").unwrap_err();
        assert!(matches!(err, Error::Tokenizer(_)), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains(want) && msg.contains("bad.gguf"),
            "want {want:?} in {msg}"
        );
    }
}

#[test]
fn smollm2_gguf_matches_transformers() {
    let Some(path) = std::env::var_os("ENCORE_SMOLLM2_GGUF") else {
        assert!(
            std::env::var("ENCORE_REQUIRE_SMOLLM2").as_deref() != Ok("1"),
            "ENCORE_REQUIRE_SMOLLM2=1 but ENCORE_SMOLLM2_GGUF is not set"
        );
        eprintln!("skipped: set ENCORE_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf");
        return;
    };
    let path = Path::new(&path);
    let vocab = gguf_meta::read_vocab(path);
    assert_eq!(
        (vocab.model.as_str(), vocab.pre.as_deref()),
        ("gpt2", Some("smollm"))
    );
    let f = fixture("gguf_smollm2_reference.json");
    let tok = Tokenizer::from_gguf_vocab(&vocab, &path.display().to_string()).unwrap();
    assert_eq!(tok.vocab_size() as u64, f["vocab_size"].as_u64().unwrap());
    assert_eq!(tok.bos_token_id(), opt_id(&f["bos_token_id"]));
    // `<|im_end|>` (the metadata's EOS, first), then the control token `<|endoftext|>`
    // (id 0), which llama.cpp also stops on; transformers' generation config lists
    // only `<|im_end|>`, but the model ends a document with `<|endoftext|>`.
    let eos = opt_id(&f["eos_token_id"]).unwrap();
    assert_eq!(
        (tok.eos_token_ids(), tok.token_to_id("<|endoftext|>")),
        (vec![eos, 0], Some(0))
    );
    // The model config computes the same list from the same metadata.
    let file = encore_core::model::gguf::GgufFile::open(path).unwrap();
    let cfg = encore_core::model::gguf::config_from_gguf(&file).unwrap();
    assert_eq!(cfg.eos_token_ids, tok.eos_token_ids());
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(1));
    check_cases(&tok, &f["cases"]);
    for chat in f["chats"].as_array().unwrap() {
        let messages: Vec<ChatMessage> = serde_json::from_value(chat["messages"].clone()).unwrap();
        let gen = chat["add_generation_prompt"].as_bool().unwrap();
        let rendered = tok.apply_chat_template(&messages, gen).unwrap();
        assert_eq!(rendered, chat["rendered"].as_str().unwrap());
        assert_eq!(tok.encode(&rendered, false).unwrap(), ids(&chat["ids"]));
    }
}

/// A test-only reader of the `tokenizer.*` metadata of a GGUF file (the engine's reader
/// lives in `model::gguf`).
mod gguf_meta {
    use std::collections::HashMap;
    use std::io::{BufReader, Read};
    use std::path::Path;

    use encore_core::tokenizer::GgufVocab;

    #[derive(Debug)]
    enum V {
        Int(i64),
        Float(f64),
        Bool(bool),
        Str(String),
        Array(Vec<V>),
    }

    struct R(BufReader<std::fs::File>);

    impl R {
        fn bytes<const N: usize>(&mut self) -> [u8; N] {
            let mut b = [0; N];
            self.0.read_exact(&mut b).unwrap();
            b
        }
        fn u32(&mut self) -> u32 {
            u32::from_le_bytes(self.bytes())
        }
        fn u64(&mut self) -> u64 {
            u64::from_le_bytes(self.bytes())
        }
        fn string(&mut self) -> String {
            let n = self.u64() as usize;
            let mut b = vec![0; n];
            self.0.read_exact(&mut b).unwrap();
            String::from_utf8(b).unwrap()
        }
        fn value(&mut self, ty: u32) -> V {
            match ty {
                0 => V::Int(self.bytes::<1>()[0] as i64),
                1 => V::Int(self.bytes::<1>()[0] as i8 as i64),
                2 => V::Int(u16::from_le_bytes(self.bytes()) as i64),
                3 => V::Int(i16::from_le_bytes(self.bytes()) as i64),
                4 => V::Int(self.u32() as i64),
                5 => V::Int(i32::from_le_bytes(self.bytes()) as i64),
                6 => V::Float(f32::from_le_bytes(self.bytes()) as f64),
                7 => V::Bool(self.bytes::<1>()[0] != 0),
                8 => V::Str(self.string()),
                9 => {
                    let elem = self.u32();
                    let n = self.u64();
                    V::Array((0..n).map(|_| self.value(elem)).collect())
                }
                10 => V::Int(self.u64() as i64),
                11 => V::Int(i64::from_le_bytes(self.bytes())),
                12 => V::Float(f64::from_le_bytes(self.bytes())),
                other => panic!("GGUF value type {other}"),
            }
        }
    }

    pub fn read_vocab(path: &Path) -> GgufVocab {
        let mut r = R(BufReader::new(std::fs::File::open(path).unwrap()));
        assert_eq!(&r.bytes::<4>(), b"GGUF");
        assert!(r.u32() >= 2, "GGUF version");
        let _tensors = r.u64();
        let kvs = r.u64();
        let mut meta = HashMap::new();
        for _ in 0..kvs {
            let key = r.string();
            let ty = r.u32();
            meta.insert(key, r.value(ty));
        }
        let get = |k: &str| meta.get(&format!("tokenizer.{k}"));
        let int = |k: &str| match get(k) {
            Some(V::Int(i)) => Some(*i),
            _ => None,
        };
        let id = |k: &str| int(k).map(|i| i as u32);
        let flag = |k: &str| match get(k) {
            Some(V::Bool(b)) => Some(*b),
            _ => None,
        };
        let text = |k: &str| match get(k) {
            Some(V::Str(s)) => Some(s.clone()),
            _ => None,
        };
        let list = |k: &str| match get(k) {
            Some(V::Array(a)) => Some(a),
            _ => None,
        };
        let strs = |k: &str| {
            list(k).map(|a| {
                a.iter()
                    .map(|v| match v {
                        V::Str(s) => s.clone(),
                        other => panic!("{k}: {other:?}"),
                    })
                    .collect()
            })
        };
        GgufVocab {
            model: text("ggml.model").unwrap(),
            pre: text("ggml.pre"),
            tokens: strs("ggml.tokens").unwrap(),
            scores: list("ggml.scores").map(|a| {
                a.iter()
                    .map(|v| match v {
                        V::Float(x) => *x as f32,
                        other => panic!("scores: {other:?}"),
                    })
                    .collect()
            }),
            token_types: list("ggml.token_type").map(|a| {
                a.iter()
                    .map(|v| match v {
                        V::Int(x) => *x as i32,
                        other => panic!("token_type: {other:?}"),
                    })
                    .collect()
            }),
            merges: strs("ggml.merges"),
            bos_token_id: id("ggml.bos_token_id"),
            eos_token_id: id("ggml.eos_token_id"),
            eot_token_id: id("ggml.eot_token_id"),
            unknown_token_id: id("ggml.unknown_token_id"),
            padding_token_id: id("ggml.padding_token_id"),
            add_bos_token: flag("ggml.add_bos_token"),
            add_eos_token: flag("ggml.add_eos_token"),
            add_space_prefix: flag("ggml.add_space_prefix"),
            chat_template: text("chat_template"),
        }
    }
}
