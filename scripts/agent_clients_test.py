#!/usr/bin/env python3
"""Drive a running `encore serve` with the official `openai` client's Responses API and the
official `anthropic` client's Messages API.

Run by crates/encore/tests/serve_cli.rs (tests `the_agent_python_clients_work` on
`dummy:tiny` and `the_agent_python_clients_work_on_smollm2` on the real SmolLM2 GGUF) with
the venv python of scripts/ci-venv.sh. The one argument is a JSON file:

    {"base_url": "http://127.0.0.1:PORT", "api_key": "...", "model": "...",
     "prompt": "...", "max_tokens": N,
     "tools": true,             # the model's template renders tools (dummy:tiny)
     "answer": "Paris" | null}  # a word the greedy answer to `prompt` must hold

The greedy text of chat completions (temperature 0) for the same conversation is the
reference. Checks, on both APIs: plain, with a system prompt / `instructions`, streamed
(the typed events add up to the whole answer), the usage against chat's; on responses a
JSON schema through `text.format` (validated with `jsonschema`); on messages
`count_tokens` and a stop sequence; with `tools`, a forced call on each and its result
sent back (`function_call_output`, `tool_result`), the objects the client got passed back
as they are; bad input as the client's exception types naming the field. Exits non-zero
with a message on the first mismatch.
"""

import json
import sys

import anthropic
import jsonschema
import openai


def check(cond, what):
    if not cond:
        sys.exit(f"agent_clients_test: FAILED: {what}")


# The current `anthropic` client has no sampling parameters; older clients send them, and
# the server takes them.
GREEDY = {"temperature": 0}

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
    "required": ["city"],
    "additionalProperties": False,
}


def chat_reference(oa, model, messages, n):
    c = oa.chat.completions.create(model=model, messages=messages, max_tokens=n, temperature=0)
    return c.choices[0].message.content, c.usage


def responses(cfg, oa):
    model, prompt, n = cfg["model"], cfg["prompt"], cfg["max_tokens"]
    text, usage = chat_reference(oa, model, [{"role": "user", "content": prompt}], n)
    r = oa.responses.create(model=model, input=prompt, max_output_tokens=n, temperature=0)
    check(r.output_text == text, f"responses: {r.output_text!r} != chat's {text!r}")
    check(r.usage.input_tokens == usage.prompt_tokens, f"responses usage {r.usage}")
    check(r.usage.output_tokens == usage.completion_tokens, f"responses usage {r.usage}")
    if cfg["answer"]:
        check(cfg["answer"] in r.output_text, f"responses: {r.output_text!r} lacks {cfg['answer']}")

    system = "Answer in one word."
    text_sys, _ = chat_reference(
        oa, model, [{"role": "system", "content": system}, {"role": "user", "content": prompt}], n
    )
    r = oa.responses.create(
        model=model, instructions=system, input=prompt, max_output_tokens=n, temperature=0
    )
    check(r.output_text == text_sys, f"instructions: {r.output_text!r} != {text_sys!r}")

    # Streamed: the text deltas add up, the last event is the whole response.
    deltas, last, kinds = [], None, []
    for e in oa.responses.create(
        model=model, input=prompt, max_output_tokens=n, temperature=0, stream=True
    ):
        kinds.append(e.type)
        if e.type == "response.output_text.delta":
            deltas.append(e.delta)
        last = e
    check(kinds[0] == "response.created", f"stream starts {kinds[:2]}")
    check(last.type in ("response.completed", "response.incomplete"), f"stream ends {last.type}")
    check("".join(deltas) == text, f"streamed {''.join(deltas)!r} != {text!r}")
    check(last.response.output_text == text, "streamed final response")

    # A JSON schema through text.format.
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    r = oa.responses.create(
        model=model,
        input="Weather in Paris, as JSON?",
        max_output_tokens=200,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "weather", "schema": schema, "strict": True}},
    )
    jsonschema.validate(json.loads(r.output_text), schema)

    # Bad input: the client's exception naming the field.
    try:
        oa.responses.create(model=model, input=prompt, previous_response_id="resp_x")
        check(False, "previous_response_id accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and "previous_response_id" in str(e), str(e))

    if not cfg["tools"]:
        return
    tools = [
        {"type": "function", "name": "get_weather", "description": "Weather", "parameters": WEATHER}
    ]
    for stream in (False, True):
        args = dict(
            model=model,
            input=[{"role": "user", "content": "Weather in Paris?"}],
            tools=tools,
            tool_choice="required",
            max_output_tokens=300,
            temperature=0.7,
            parallel_tool_calls=False,
        )
        if stream:
            final = None
            for e in oa.responses.create(stream=True, **args):
                if e.type == "response.completed":
                    final = e.response
            r = final
        else:
            r = oa.responses.create(**args)
        calls = [o for o in r.output if o.type == "function_call"]
        check(len(calls) == 1, f"one call, got {r.output}")
        jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
        # The output as the client got it, then the call's output.
        conv = args["input"] + r.output + [
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "22 C"}
        ]
        r2 = oa.responses.create(model=model, input=conv, tools=tools, max_output_tokens=4)
        check(r2.status in ("completed", "incomplete"), f"round trip {r2.status}")


def messages(cfg, oa, an):
    model, prompt, n = cfg["model"], cfg["prompt"], cfg["max_tokens"]
    text, usage = chat_reference(oa, model, [{"role": "user", "content": prompt}], n)
    conv = [{"role": "user", "content": prompt}]
    m = an.messages.create(model=model, max_tokens=n, messages=conv, extra_body=GREEDY)
    got = "".join(b.text for b in m.content if b.type == "text")
    check(got == text, f"messages: {got!r} != chat's {text!r}")
    check(m.usage.input_tokens == usage.prompt_tokens, f"messages usage {m.usage}")
    check(m.usage.output_tokens == usage.completion_tokens, f"messages usage {m.usage}")
    check(m.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {m.stop_reason}")
    if cfg["answer"]:
        check(cfg["answer"] in got, f"messages: {got!r} lacks {cfg['answer']}")
    counted = an.messages.count_tokens(model=model, messages=conv)
    check(counted.input_tokens == m.usage.input_tokens, f"count_tokens {counted}")

    system = "Answer in one word."
    text_sys, _ = chat_reference(
        oa, model, [{"role": "system", "content": system}, {"role": "user", "content": prompt}], n
    )
    m = an.messages.create(model=model, max_tokens=n, system=system, messages=conv, extra_body=GREEDY)
    got = "".join(b.text for b in m.content if b.type == "text")
    check(got == text_sys, f"system: {got!r} != {text_sys!r}")

    with an.messages.stream(model=model, max_tokens=n, messages=conv, extra_body=GREEDY) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    check(streamed == text, f"streamed {streamed!r} != {text!r}")
    check(final.content[0].text == text, "streamed final message")
    check(final.usage.output_tokens == usage.completion_tokens, f"streamed usage {final.usage}")

    # A stop sequence from inside the text.
    if len(text) >= 6:
        seq = text[3:5]
        m = an.messages.create(
            model=model, max_tokens=n, messages=conv, extra_body=GREEDY, stop_sequences=[seq]
        )
        check(m.stop_reason == "stop_sequence" and m.stop_sequence == seq, f"stop {m}")
        check(m.content[0].text == text[: text.find(seq)], f"stopped text {m.content}")

    # A JSON schema through output_config.
    m = an.messages.create(
        model=model,
        max_tokens=200,
        messages=[{"role": "user", "content": "Weather in Paris, as JSON?"}],
        output_config={"format": {"type": "json_schema", "schema": WEATHER}},
    )
    jsonschema.validate(json.loads(m.content[0].text), WEATHER)

    try:
        an.messages.create(
            model=model, max_tokens=4, messages=[{"role": "user", "content": [{"type": "sparkle"}]}]
        )
        check(False, "an unknown block type accepted")
    except anthropic.BadRequestError as e:
        check(e.status_code == 400 and "messages[0].content[0].type" in str(e), str(e))
    try:
        an.messages.create(model="nope", max_tokens=4, messages=conv)
        check(False, "an unknown model accepted")
    except anthropic.NotFoundError:
        pass

    if not cfg["tools"]:
        return
    tools = [{"name": "get_weather", "description": "Weather", "input_schema": WEATHER}]
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    for stream in (False, True):
        args = dict(model=model, max_tokens=300, messages=ask, tools=tools)
        args["tool_choice"] = {"type": "any", "disable_parallel_tool_use": True}
        if stream:
            with an.messages.stream(**args) as s:
                m = s.get_final_message()
        else:
            m = an.messages.create(**args)
        check(m.stop_reason == "tool_use", f"stop_reason {m.stop_reason}")
        uses = [b for b in m.content if b.type == "tool_use"]
        check(len(uses) == 1 and uses[0].name == "get_weather", f"tool_use {m.content}")
        jsonschema.validate(uses[0].input, WEATHER)
        conv2 = ask + [
            {"role": "assistant", "content": m.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "22 C"}],
            },
        ]
        m2 = an.messages.create(model=model, max_tokens=4, messages=conv2, tools=tools)
        check(m2.type == "message", "round trip")
        # The blocks as the SDK dumps them (`caller`, `toolset_name` null) go back too.
        conv3 = ask + [
            {"role": "assistant", "content": [b.model_dump() for b in m.content]},
            conv2[-1],
        ]
        m3 = an.messages.create(model=model, max_tokens=4, messages=conv3, tools=tools)
        check(m3.type == "message", "round trip of model_dump() blocks")


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cfg = json.load(f)
    oa = openai.OpenAI(base_url=cfg["base_url"] + "/v1", api_key=cfg["api_key"], max_retries=0)
    an = anthropic.Anthropic(base_url=cfg["base_url"], api_key=cfg["api_key"], max_retries=0)
    responses(cfg, oa)
    messages(cfg, oa, an)
    print(f"agent_clients_test: ok ({cfg['model']})")


if __name__ == "__main__":
    main()
