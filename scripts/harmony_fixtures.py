#!/usr/bin/env python3
"""Regenerate crates/encore-core/tests/fixtures/harmony.json with OpenAI's own harmony
implementation (the `openai-harmony` wheel: Python bindings of the `openai-harmony` Rust
crate), which encore's renderer and parser (`encore_core::tokenizer::harmony`) are tested
against.

    python3 -m venv /tmp/hv && /tmp/hv/bin/pip install openai-harmony==0.0.8
    TIKTOKEN_ENCODINGS_BASE=DIR /tmp/hv/bin/python scripts/harmony_fixtures.py

DIR holds `o200k_base.tiktoken` (SHA-256 446a9538...2d; the wheel checks it). Offline it
can be rebuilt from the npm package `tiktoken`'s `encoders/o200k_base.json`: each line
of its `bpe_ranks` after the first two words lists tokens from the rank the second word
gives; write `base64 rank` lines ordered by rank.

Each conversation is given as an OpenAI chat request (`messages`, `tools`,
`reasoning_effort`, and the date the server would take from its clock), turned into a
harmony conversation here by the mapping encore implements (README, "Harmony"), and
rendered with `render_conversation_for_completion(..., Role.ASSISTANT)` (the wheel's
default config: analysis before the first final is dropped when the last assistant
message is final). The fixture keeps the text and the token ids; `text_encodes_back`
records that encoding the text (special tokens allowed) gives the same ids, so equal
text means equal tokens under the o200k_harmony tokenizer.

Parser fixtures: completions (as the model writes them after `<|start|>assistant`) as
token ids and text, and the messages `StreamableParser(role=assistant)` yields.
"""

import json
import sys
from pathlib import Path

from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncodingName,
    Message,
    ReasoningEffort,
    Role,
    StreamableParser,
    SystemContent,
    ToolDescription,
    load_harmony_encoding,
)

ENC = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
OUT = Path(__file__).resolve().parent.parent / "crates/encore-core/tests/fixtures/harmony.json"

EFFORT = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM, "high": ReasoningEffort.HIGH}


def to_harmony(req):
    """The harmony conversation of an OpenAI chat request, as encore maps it."""
    sys_c = SystemContent.new().with_reasoning_effort(EFFORT[req.get("reasoning_effort", "medium")])
    if req.get("date"):
        sys_c = sys_c.with_conversation_start_date(req["date"])
    msgs = [Message.from_role_and_content(Role.SYSTEM, sys_c)]
    rest = list(req["messages"])
    instructions = []
    while rest and rest[0]["role"] in ("system", "developer"):
        instructions.append(rest.pop(0)["content"])
    tools = req.get("tools") or []
    if instructions or tools:
        dev = DeveloperContent.new()
        if instructions:
            dev = dev.with_instructions("\n\n".join(instructions))
        if tools:
            dev = dev.with_function_tools([
                ToolDescription.new(
                    t["function"]["name"],
                    t["function"].get("description", ""),
                    parameters=t["function"].get("parameters"),
                )
                for t in tools
            ])
        msgs.append(Message.from_role_and_content(Role.DEVELOPER, dev))
    names = {}
    for m in rest:
        role = m["role"]
        if role in ("system", "developer"):
            msgs.append(Message.from_role_and_content(Role.DEVELOPER, DeveloperContent.new().with_instructions(m["content"])))
        elif role == "user":
            msgs.append(Message.from_role_and_content(Role.USER, m["content"]))
        elif role == "assistant":
            calls = m.get("tool_calls") or []
            if m.get("reasoning_content"):
                msgs.append(Message.from_role_and_content(Role.ASSISTANT, m["reasoning_content"]).with_channel("analysis"))
            if m.get("content"):
                channel = "commentary" if calls else "final"
                msgs.append(Message.from_role_and_content(Role.ASSISTANT, m["content"]).with_channel(channel))
            for c in calls:
                names[c["id"]] = c["function"]["name"]
                msgs.append(
                    Message.from_role_and_content(Role.ASSISTANT, c["function"]["arguments"])
                    .with_channel("commentary")
                    .with_recipient("functions." + c["function"]["name"])
                    .with_content_type("<|constrain|>json")
                )
        elif role == "tool":
            name = names[m["tool_call_id"]]
            msgs.append(
                Message.from_author_and_content(Author.new(Role.TOOL, "functions." + name), m["content"])
                .with_channel("commentary")
                .with_recipient("assistant")
            )
        else:
            raise ValueError(role)
    return Conversation.from_messages(msgs)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Gets the current weather in the provided location.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                "format": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "days": {"type": "integer", "description": "How many days ahead"},
            },
            "required": ["location"],
        },
    },
}
BOOK = {
    "type": "function",
    "function": {
        "name": "book_trip",
        "description": "Books a trip.\nAsks for confirmation first.",
        "parameters": {
            "type": "object",
            "description": "The trip",
            "properties": {
                "travellers": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}, "age": {"type": "number"}},
                        "required": ["name"],
                    },
                },
                "hotel": {
                    "type": "object",
                    "description": "Where to stay",
                    "properties": {
                        "stars": {"type": "integer", "enum": [3, 4, 5]},
                        "breakfast": {"type": "boolean", "default": True},
                    },
                },
                "tags": {"type": "array", "items": {"type": "string"}},
                "notes": {"type": ["string", "null"]},
                "mode": {"oneOf": [{"type": "string", "description": "A named mode"}, {"type": "number"}], "description": "How"},
                "budget": {"type": "number", "nullable": True, "title": "Budget", "examples": ["100"]},
                "anything": {},
            },
            "required": ["travellers"],
        },
    },
}
NOW = {"type": "function", "function": {"name": "now", "description": "The time."}}

CONVERSATIONS = [
    ("plain", {"messages": [{"role": "user", "content": "What is 2+2?"}]}),
    ("low_effort_dated", {"reasoning_effort": "low", "date": "2025-08-07",
                          "messages": [{"role": "user", "content": "Hi"}]}),
    ("high_effort_system", {"reasoning_effort": "high", "date": "2026-01-02", "messages": [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hello"}]}),
    ("tools", {"date": "2025-08-07", "tools": [WEATHER, BOOK, NOW], "messages": [
        {"role": "developer", "content": "Be brief.\nUse tools."},
        {"role": "user", "content": "Weather in SF?"}]}),
    ("multi_turn", {"reasoning_effort": "low", "messages": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "reasoning_content": "Simple sum.", "content": "4."},
        {"role": "user", "content": "And 3+3?"}]}),
    ("tool_round_trip", {"date": "2025-08-07", "tools": [WEATHER], "messages": [
        {"role": "system", "content": "You help with weather."},
        {"role": "user", "content": "Weather in SF?"},
        {"role": "assistant", "reasoning_content": "Need to use function get_weather.", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"location\":\"San Francisco\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"sunny\": true, \"temperature\": 20}"}]}),
    ("tool_then_final_then_more", {"tools": [WEATHER, NOW], "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "Call it.",
         "tool_calls": [{"id": "a", "type": "function", "function": {"name": "now", "arguments": "{}"}},
                        {"id": "b", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"location\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "noon"},
        {"role": "tool", "tool_call_id": "b", "content": "sunny"},
        {"role": "assistant", "reasoning_content": "Both known.", "content": "Sunny at noon."},
        {"role": "user", "content": "Thanks! Tomorrow?"},
        {"role": "assistant", "reasoning_content": "Again.", "content": "Probably sunny."},
        {"role": "user", "content": "Ok"}]}),
]

COMPLETIONS = [
    ("analysis_then_final",
     "<|channel|>analysis<|message|>User asks 2+2. Answer 4.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>"),
    ("analysis_then_call",
     "<|channel|>analysis<|message|>Need to use function get_weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"San Francisco\"}<|call|>"),
    ("final_only", "<|channel|>final<|message|>Hello there!<|return|>"),
    ("preamble_then_call",
     "<|channel|>analysis<|message|>Plan.<|end|><|start|>assistant<|channel|>commentary<|message|>I'll check the weather first.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"location\": \"Paris\", \"days\": 2}<|call|>"),
    ("cut_off_in_final", "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Partial answ"),
]


def message_json(m):
    return {
        "role": m.author.role.value,
        "channel": m.channel,
        "recipient": m.recipient,
        "content_type": m.content_type,
        "content": "".join(c.text for c in m.content),
    }


def main():
    out = {"generator": "scripts/harmony_fixtures.py, openai-harmony " + __import__("importlib.metadata").metadata.version("openai-harmony"),
           "stop_tokens": sorted(ENC.stop_tokens_for_assistant_actions()), "renders": [], "parses": []}
    for name, req in CONVERSATIONS:
        conv = to_harmony(req)
        toks = ENC.render_conversation_for_completion(conv, Role.ASSISTANT)
        text = ENC.decode_utf8(toks)
        back = ENC.encode(text, allowed_special="all")
        out["renders"].append({"name": name, "request": req, "text": text, "tokens": toks,
                               "text_encodes_back": back == toks})
    for name, text in COMPLETIONS:
        toks = ENC.encode(text, allowed_special="all")
        p = StreamableParser(ENC, role=Role.ASSISTANT)
        for t in toks:
            p.process(t)
        current = {"channel": p.current_channel, "recipient": p.current_recipient,
                   "content_type": p.current_content_type, "content": p.current_content}
        p.process_eos()
        out["parses"].append({"name": name, "text": text, "tokens": toks,
                              "messages": [message_json(m) for m in p.messages],
                              "open_before_eos": current})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
