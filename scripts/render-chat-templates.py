#!/usr/bin/env python3
"""Render real models' chat templates with Hugging Face transformers' own renderer.

Writes crates/encore-core/tests/data/chat_templates/expected.json: for each template
(*.jinja in that folder, as the models ship them: Llama 3.1, Qwen2.5, Qwen3, Mistral
Nemo, Hermes 3) and each conversation below (tool definitions, an assistant tool call and
the tool's answer, reasoning, chat_template_kwargs), the inputs and the text transformers
renders. crates/encore-core/tests/tokenizer.rs renders the same inputs with encore's
minijinja renderer and compares, byte for byte.

    python3 -m venv /tmp/tf && /tmp/tf/bin/pip install transformers jinja2
    /tmp/tf/bin/python scripts/render-chat-templates.py
"""
import json
import pathlib

from transformers.utils.chat_template_utils import render_jinja_template

DIR = pathlib.Path(__file__).resolve().parent.parent / "crates/encore-core/tests/data/chat_templates"
SPECIAL = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "The time now",
                                      "parameters": {"type": "object", "properties": {}}}},
]

CALL = {"id": "abc123XYZ", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}

TOOL_TURNS = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "abc123XYZ", "content": "22 degrees, sunny"},
]

CASES = [
    # name, messages, tools, kwargs, add_generation_prompt
    ("tools", [{"role": "system", "content": "You are a helpful assistant."}] + TOOL_TURNS, TOOLS, {}, True),
    ("tools, second turn", TOOL_TURNS + [
        {"role": "assistant", "content": "It is 22 degrees and sunny in Paris."},
        {"role": "user", "content": "And in Rome?"}], TOOLS, {}, True),
    ("tools, no system", [{"role": "user", "content": "Hi"}], TOOLS, {}, True),
    ("plain", [{"role": "system", "content": "Be brief."},
               {"role": "user", "content": "Hello"},
               {"role": "assistant", "content": "Hi! How can I help?"},
               {"role": "user", "content": "Tell me a joke."}], None, {}, True),
    ("plain, no generation prompt", [{"role": "user", "content": "Hello"},
                                     {"role": "assistant", "content": "Hi."}], None, {}, False),
    ("reasoning in history", [{"role": "user", "content": "2+2?"},
                              {"role": "assistant", "content": "4", "reasoning_content": "Simple sum."},
                              {"role": "user", "content": "3+3?"}], None, {}, True),
    ("enable_thinking false", [{"role": "user", "content": "2+2?"}], None, {"enable_thinking": False}, True),
]

# Conversations a template refuses or cannot express are left out (e.g. Llama 3.1 takes one
# call per message; Mistral needs 9-character call ids, which CALL has).
out = []
for path in sorted(DIR.glob("*.jinja")):
    source = path.read_text()
    for name, messages, tools, kwargs, gen in CASES:
        if "enable_thinking" in kwargs and "enable_thinking" not in source:
            continue
        try:
            rendered, _ = render_jinja_template(
                conversations=[messages], tools=tools, chat_template=source,
                add_generation_prompt=gen, **SPECIAL, **kwargs)
        except Exception as e:  # a template's raise_exception
            print(f"{path.name} / {name}: skipped ({e})")
            continue
        out.append({"template": path.name, "case": name, "messages": messages, "tools": tools,
                    "kwargs": kwargs, "add_generation_prompt": gen, "special": SPECIAL,
                    "expected": rendered[0]})
(DIR / "expected.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
print(f"{len(out)} renderings written")
