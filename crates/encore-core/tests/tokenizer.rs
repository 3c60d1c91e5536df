//! Tokenizers, offline: a byte-level BPE `tokenizer.json` written here (Llama-3-style and
//! Qwen2-style special tokens and chat templates), and the built-in byte tokenizer.
//! Round trips, special tokens, chat templates rendered to exact strings, errors, and the
//! streaming decoder.

use std::path::{Path, PathBuf};

use encore_core::tokenizer::{
    ChatMessage, ChatOptions, StreamDecoder, Tokenizer, BYTES_BOS, BYTES_EOS, BYTES_VOCAB_SIZE,
};
use encore_core::Error;
use serde_json::{json, Value};

const LLAMA3_TEMPLATE: &str = r#"{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"#;

const CHATML_TEMPLATE: &str = r#"{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"#;

/// A multi-line template whose output depends on `trim_blocks` and `lstrip_blocks`, with
/// Python methods, `tojson` and `raise_exception`.
const MULTILINE_TEMPLATE: &str = "{% for message in messages %}
    {% if message.role not in ['system', 'user', 'assistant'] %}
        {{ raise_exception('Unknown role: ' + message.role) }}
    {% elif message.role == 'system' %}
<<SYS>>{{ message.content.strip() }}<</SYS>>
    {% else %}
[{{ message.role.upper() }}] {{ message.content | tojson }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
[ASSISTANT]
{% endif %}
";

/// GPT-2's byte -> printable character map (byte-level BPE's alphabet).
fn byte_chars() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut extra = 0;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap()
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap()
            }
        })
        .collect()
}

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir(name: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("encore-tok-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

/// Write a byte-level BPE tokenizer.json: ids 0..=255 are the bytes, then merges building
/// "hello" and " world", then `specials`; BOS `bos` (if any) added by the post-processor.
fn write_tokenizer_json(dir: &Path, specials: &[&str], bos: Option<&str>) {
    let chars = byte_chars();
    let mut vocab = serde_json::Map::new();
    for (id, c) in chars.iter().enumerate() {
        vocab.insert(c.to_string(), json!(id));
    }
    let merges = [
        ("h", "e"),
        ("l", "l"),
        ("he", "ll"),
        ("hell", "o"),
        ("Ġ", "w"),
        ("o", "r"),
        ("Ġw", "or"),
        ("Ġwor", "l"),
        ("Ġworl", "d"),
    ];
    for (a, b) in merges {
        let id = vocab.len();
        vocab.insert(format!("{a}{b}"), json!(id));
    }
    let first_special = vocab.len();
    let added: Vec<Value> = specials
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({"id": first_special + i, "content": s, "single_word": false,
                   "lstrip": false, "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let post = bos.map(|b| {
        let id = first_special + specials.iter().position(|s| *s == b).unwrap();
        let tok = |t: u32| json!({"SpecialToken": {"id": b, "type_id": t}});
        json!({
            "type": "TemplateProcessing",
            "single": [tok(0), {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [tok(0), {"Sequence": {"id": "A", "type_id": 0}},
                     tok(1), {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {b: {"id": b, "ids": [id], "tokens": [b]}}
        })
    });
    let tok = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false,
                          "trim_offsets": true, "use_regex": true},
        "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true,
                    "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab,
            "merges": merges.iter().map(|(a, b)| format!("{a} {b}")).collect::<Vec<_>>()
        }
    });
    write_json(&dir.join("tokenizer.json"), &tok);
}

fn write_json(path: &Path, v: &Value) {
    std::fs::write(path, serde_json::to_string_pretty(v).unwrap()).unwrap();
}

const HELLO: u32 = 259;
const WORLD: u32 = 264;
// Llama-3-style special tokens, in order after the merges.
const BEGIN: u32 = 265;
const END_OF_TEXT: u32 = 266;
const EOT: u32 = 269;

/// A Llama-3-style model directory: BOS added by the post-processor, `bos_token` as an
/// AddedToken object, EOS `<|eot_id|>` plus generation_config's list.
fn llama3_dir(name: &str, template: &str) -> TempDir {
    let dir = temp_dir(name);
    let specials = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
    ];
    write_tokenizer_json(&dir, &specials, Some("<|begin_of_text|>"));
    write_json(
        &dir.join("tokenizer_config.json"),
        &json!({
            "bos_token": {"__type": "AddedToken", "content": "<|begin_of_text|>",
                          "lstrip": false, "normalized": false, "rstrip": false,
                          "single_word": false},
            "eos_token": "<|eot_id|>",
            "chat_template": template,
            "model_max_length": 131072,
            "tokenizer_class": "PreTrainedTokenizerFast"
        }),
    );
    write_json(
        &dir.join("generation_config.json"),
        &json!({"bos_token_id": BEGIN, "eos_token_id": [END_OF_TEXT, EOT]}),
    );
    dir
}

/// A Qwen2-style (ChatML) directory: no BOS, templates given as a named list.
fn qwen2_dir(name: &str) -> TempDir {
    let dir = temp_dir(name);
    write_tokenizer_json(&dir, &["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None);
    write_json(
        &dir.join("tokenizer_config.json"),
        &json!({
            "add_bos_token": false,
            "bos_token": null,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "chat_template": [
                {"name": "tool_use", "template": "{{ raise_exception('not this one') }}"},
                {"name": "default", "template": CHATML_TEMPLATE}
            ],
        }),
    );
    dir
}

fn msgs(list: &[(&str, &str)]) -> Vec<ChatMessage> {
    list.iter().map(|(r, c)| ChatMessage::new(*r, *c)).collect()
}

#[test]
fn hf_round_trip_and_special_tokens() {
    let tok = Tokenizer::from_dir(&llama3_dir("roundtrip", LLAMA3_TEMPLATE)).unwrap();
    assert_eq!(tok.vocab_size(), 270);
    assert_eq!(tok.bos_token_id(), Some(BEGIN));
    assert_eq!(tok.eos_token_ids(), vec![EOT, END_OF_TEXT]);
    assert_eq!(tok.token_to_id("<|eot_id|>"), Some(EOT));

    assert_eq!(
        tok.encode("hello world", false).unwrap(),
        vec![HELLO, WORLD]
    );
    assert_eq!(
        tok.encode("hello world", true).unwrap(),
        vec![BEGIN, HELLO, WORLD]
    );
    // Special-token text in the input is the special token.
    assert_eq!(
        tok.encode("hello<|eot_id|>", false).unwrap(),
        vec![HELLO, EOT]
    );
    let ids = [BEGIN, HELLO, WORLD, EOT];
    assert_eq!(tok.decode(&ids, true).unwrap(), "hello world");
    assert_eq!(
        tok.decode(&ids, false).unwrap(),
        "<|begin_of_text|>hello world<|eot_id|>"
    );
    for text in ["héllo wörld 🎉\n\ttabs  and  spaces", "", "日本語 text"] {
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text);
    }
    // "é" is two byte tokens; out-of-vocabulary ids are skipped.
    assert_eq!(tok.encode("é", false).unwrap().len(), 2);
    assert_eq!(tok.decode(&[HELLO, 9999], false).unwrap(), "hello");
}

#[test]
fn llama3_chat_template_renders_exactly() {
    let tok = Tokenizer::from_dir(&llama3_dir("llama3", LLAMA3_TEMPLATE)).unwrap();
    assert!(tok.has_chat_template());
    let conv = msgs(&[
        ("system", "You are terse."),
        ("user", "  Hi!  "),
        ("assistant", "Hello."),
    ]);
    let expected = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n\
        You are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>\
        <|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>";
    assert_eq!(tok.apply_chat_template(&conv, false).unwrap(), expected);
    let with_prompt = tok.apply_chat_template(&conv[..2], true).unwrap();
    assert_eq!(
        with_prompt,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n\
         You are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    // The rendered prompt holds its BOS: encode it without adding another.
    let ids = tok.encode(&with_prompt, false).unwrap();
    assert_eq!(ids[..2], [BEGIN, 267]);
    assert_eq!(ids.iter().filter(|&&i| i == BEGIN).count(), 1);
    assert_eq!(tok.decode(&ids, false).unwrap(), with_prompt);
}

#[test]
fn chatml_chat_template_renders_exactly() {
    let tok = Tokenizer::from_dir(&qwen2_dir("chatml")).unwrap();
    assert_eq!(tok.bos_token_id(), None);
    assert_eq!(tok.eos_token_ids(), vec![267]);
    assert_eq!(tok.encode("hello", true).unwrap(), vec![HELLO]);
    let conv = msgs(&[("user", "What is 2+2?"), ("assistant", "4")]);
    assert_eq!(
        tok.apply_chat_template(&conv, false).unwrap(),
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n\
         What is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
    );
    let conv = msgs(&[("system", "Be brief."), ("user", "Hi")]);
    let prompt = tok.apply_chat_template(&conv, true).unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    let ids = tok.encode(&prompt, false).unwrap();
    assert_eq!(ids[0], 266);
    assert_eq!(ids.iter().filter(|&&i| i == 266).count(), 3);
}

#[test]
fn templates_trim_and_lstrip_blocks_like_transformers() {
    let tok = Tokenizer::from_dir(&llama3_dir("multiline", MULTILINE_TEMPLATE)).unwrap();
    let conv = msgs(&[("system", "  S  "), ("user", "say \"hi\"\n")]);
    assert_eq!(
        tok.apply_chat_template(&conv, true).unwrap(),
        "<<SYS>>S<</SYS>>\n[USER] \"say \\\"hi\\\"\\n\"\n[ASSISTANT]\n"
    );
    assert_eq!(
        tok.apply_chat_template(&conv[1..], false).unwrap(),
        "[USER] \"say \\\"hi\\\"\\n\"\n"
    );
}

#[test]
fn raise_exception_is_an_error_with_its_message() {
    let tok = Tokenizer::from_dir(&llama3_dir("raise", MULTILINE_TEMPLATE)).unwrap();
    let e = tok
        .apply_chat_template(&msgs(&[("tool", "x")]), true)
        .unwrap_err();
    assert!(matches!(e, Error::Tokenizer(_)), "{e:?}");
    assert!(e.to_string().contains("Unknown role: tool"), "{e}");
}

#[test]
fn missing_or_broken_files_are_errors_naming_the_path() {
    let dir = temp_dir("missing");
    let e = Tokenizer::from_dir(&dir).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
    let path = dir.join("tokenizer.json").display().to_string();
    assert!(e.to_string().contains(&path), "{e}");

    std::fs::write(dir.join("tokenizer.json"), "{not json").unwrap();
    let e = Tokenizer::from_dir(&dir).unwrap_err();
    assert!(e.to_string().contains(&path), "{e}");

    // A template that does not compile names the config file.
    let dir = llama3_dir("badtemplate", "{% for m in messages %}");
    let e = Tokenizer::from_dir(&dir).unwrap_err();
    assert!(e.to_string().contains("tokenizer_config.json"), "{e}");

    // No template: loading works, rendering says why.
    let dir = temp_dir("notemplate");
    write_tokenizer_json(&dir, &["<s>"], None);
    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert!(!tok.has_chat_template());
    let e = tok
        .apply_chat_template(&msgs(&[("user", "x")]), true)
        .unwrap_err();
    assert!(e.to_string().contains("no chat template"), "{e}");
}

#[test]
fn bytes_tokenizer() {
    let tok = Tokenizer::bytes();
    assert_eq!(tok.vocab_size(), BYTES_VOCAB_SIZE);
    assert_eq!((BYTES_BOS, BYTES_EOS), (256, 257));
    assert_eq!(tok.bos_token_id(), Some(BYTES_BOS));
    assert_eq!(tok.eos_token_ids(), vec![BYTES_EOS]);
    assert_eq!(tok.encode("hé", false).unwrap(), vec![104, 0xC3, 0xA9]);
    assert_eq!(
        tok.encode("hé", true).unwrap(),
        vec![BYTES_BOS, 104, 0xC3, 0xA9]
    );
    let ids = [BYTES_BOS, 104, 105, BYTES_EOS, 999];
    assert_eq!(tok.decode(&ids, true).unwrap(), "hi");
    assert_eq!(tok.decode(&ids, false).unwrap(), "<|bos|>hi<|eos|>");
    assert_eq!(tok.decode(&[0xC3], false).unwrap(), "\u{FFFD}");
    let conv = msgs(&[("system", "sys"), ("user", "hi")]);
    assert_eq!(
        tok.apply_chat_template(&conv, true).unwrap(),
        "<|system|>\nsys\n<|user|>\nhi\n<|assistant|>\n"
    );
    assert_eq!(
        tok.apply_chat_template(&conv, false).unwrap(),
        "<|system|>\nsys\n<|user|>\nhi\n"
    );
}

/// Push every id; returns the emitted pieces (None as "") and the finish text.
fn stream(tok: &Tokenizer, prompt: &[u32], ids: &[u32]) -> (Vec<String>, String) {
    let mut d = StreamDecoder::new(tok, prompt);
    let pieces = ids
        .iter()
        .map(|&id| d.push(id).unwrap().unwrap_or_default())
        .collect();
    let rest = d.finish().unwrap().unwrap_or_default();
    assert_eq!(d.finish().unwrap(), None);
    (pieces, rest)
}

#[test]
fn stream_decoder_waits_for_whole_characters() {
    let tok = Tokenizer::bytes();
    let text = "héllo 🎉";
    let ids = tok.encode(text, false).unwrap();
    let prompt = tok.encode("prompt: ", true).unwrap();
    let (pieces, rest) = stream(&tok, &prompt, &ids);
    assert_eq!(pieces, ["h", "", "é", "l", "l", "o", " ", "", "", "", "🎉"]);
    assert_eq!(rest, "");
    assert_eq!(pieces.concat(), text);

    // A character cut off at the end comes out of `finish` as the full decode has it.
    let cut = &ids[..ids.len() - 2];
    let (pieces, rest) = stream(&tok, &[], cut);
    assert_eq!(rest, "\u{FFFD}");
    assert_eq!(pieces.concat() + &rest, tok.decode(cut, true).unwrap());

    // Special tokens are skipped by default, kept on request.
    let mut d = StreamDecoder::new(&tok, &[]).skip_special_tokens(false);
    assert_eq!(d.push(BYTES_EOS).unwrap().as_deref(), Some("<|eos|>"));
    let mut d = StreamDecoder::new(&tok, &[]);
    assert_eq!(d.push(BYTES_EOS).unwrap(), None);
}

#[test]
fn stream_decoder_reproduces_the_full_decode() {
    let tok = Tokenizer::from_dir(&llama3_dir("stream", LLAMA3_TEMPLATE)).unwrap();
    let text = "hello world, héllo wörld 🎉 日本語 hello\n world";
    let ids = tok.encode(text, false).unwrap();
    let prompt = tok.encode("hello", true).unwrap();
    let (pieces, rest) = stream(&tok, &prompt, &ids);
    assert_eq!(pieces.concat() + &rest, tok.decode(&ids, true).unwrap());
    assert_eq!(pieces.concat(), text);
    // No piece holds a replacement character.
    assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')));
    assert_eq!(pieces[..2], ["hello", " world"]);
}

#[test]
fn tokenizer_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Tokenizer>();
}

/// Real models' chat templates (Llama 3.1, Qwen2.5, Qwen3, Mistral Nemo, Hermes 3, as they
/// ship them) render conversations with tools, tool calls and their results, reasoning
/// and `chat_template_kwargs` exactly as transformers renders them
/// (`scripts/render-chat-templates.py` wrote the expected texts).
#[test]
fn real_chat_templates_render_tools_as_transformers_does() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat_templates");
    let cases: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(data.join("expected.json")).unwrap())
            .unwrap();
    assert!(cases.len() >= 20, "{} cases", cases.len());
    let mut templates = std::collections::BTreeSet::new();
    for c in &cases {
        let name = c["template"].as_str().unwrap();
        templates.insert(name);
        let source = std::fs::read_to_string(data.join(name)).unwrap();
        let dir = llama3_dir("real-template", &source);
        let tok = Tokenizer::from_dir(&dir).unwrap();
        assert_eq!(c["special"]["bos_token"], "<|begin_of_text|>");
        assert_eq!(c["special"]["eos_token"], "<|eot_id|>");
        let messages: Vec<ChatMessage> = serde_json::from_value(c["messages"].clone()).unwrap();
        let opts = ChatOptions {
            add_generation_prompt: c["add_generation_prompt"].as_bool().unwrap(),
            tools: c["tools"].as_array().cloned(),
            kwargs: c["kwargs"].as_object().unwrap().clone(),
        };
        let got = tok
            .render_chat(&messages, &opts)
            .unwrap_or_else(|e| panic!("{name} / {}: {e}", c["case"]));
        assert_eq!(
            got,
            c["expected"].as_str().unwrap(),
            "{name} / {}",
            c["case"]
        );
    }
    assert_eq!(templates.len(), 5, "{templates:?}");
}
