#!/usr/bin/env python3
"""Drive a running `encore serve` with the official `openai` Python client.

Run by crates/encore/tests/serve_cli.rs (test `the_openai_python_client_works`) with the venv
python of scripts/ci-venv.sh. The one argument is a JSON file:

    {"base_url": "http://127.0.0.1:PORT/v1", "api_key": "...", "model": "...",
     "prompt": "...", "max_tokens": N,
     "completion_text": "...",   # `encore generate` greedy text for the prompt
     "chat_text": "..."}         # `encore generate --chat` greedy text for it

Checks, all greedy (temperature 0, end-of-sequence ignored): `models.list()`; completions
and chat completions, whole and streamed with `stream_options={"include_usage": True}`,
each equal to the expected text, with the usage counts; chat content as a list of text
parts; a stop string ends the text before it; errors (an unknown model, a bad
temperature, `best_of`) as the client's exception types; `n=3` as three choices, whole and
streamed; structured outputs (a JSON schema
validated with `jsonschema`, regex and choice; greedy and sampled, whole and streamed);
tool calls (`tool_choice` required and named, sampled, whole and streamed, their
arguments validated against the tool's schema, the calls and a tool result passed back).
Exits non-zero with a message on the first mismatch.
"""

import json
import sys

import openai


def check(cond, what):
    if not cond:
        sys.exit(f"openai_client_test: FAILED: {what}")


def streamed(chunks, kind):
    """(text, finish_reason, usage) of a stream of chunks."""
    text, finish, usage = [], None, None
    for c in chunks:
        if c.usage is not None:
            check(not c.choices, f"{kind}: the usage chunk has no choices")
            usage = c.usage
            continue
        for ch in c.choices:
            piece = ch.text if kind == "completion" else ch.delta.content
            text.append(piece or "")
            if ch.finish_reason is not None:
                finish = ch.finish_reason
    return "".join(text), finish, usage


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cfg = json.load(f)
    client = openai.OpenAI(base_url=cfg["base_url"], api_key=cfg["api_key"], max_retries=0)
    model, prompt, n = cfg["model"], cfg["prompt"], cfg["max_tokens"]
    greedy = {"temperature": 0, "max_tokens": n, "extra_body": {"ignore_eos": True}}

    ids = [m.id for m in client.models.list().data]
    check(ids == [model], f"models.list() gave {ids}, expected [{model!r}]")
    m = client.models.retrieve(model)
    check(m.id == model and m.object == "model", f"models.retrieve gave {m}")
    try:
        client.models.retrieve("org/nope")
        check(False, "models.retrieve of an unknown model succeeded")
    except openai.NotFoundError as e:
        check(e.code == "model_not_found", f"unknown model: {e.body}")

    # Completions, whole and streamed.
    r = client.completions.create(model=model, prompt=prompt, **greedy)
    got = r.choices[0].text
    check(got == cfg["completion_text"],
          f"completion text {got!r} != encore generate's {cfg['completion_text']!r}")
    check(r.choices[0].finish_reason == "length", f"finish_reason {r.choices[0].finish_reason}")
    check(r.usage.completion_tokens == n, f"usage {r.usage}")
    text, finish, usage = streamed(
        client.completions.create(model=model, prompt=prompt, stream=True,
                                  stream_options={"include_usage": True}, **greedy),
        "completion")
    check(text == cfg["completion_text"], f"streamed completion text {text!r}")
    check(finish == "length", f"streamed finish_reason {finish}")
    check(usage is not None and usage.completion_tokens == n
          and usage.total_tokens == usage.prompt_tokens + n, f"streamed usage {usage}")

    # Chat completions, whole and streamed.
    messages = [{"role": "user", "content": prompt}]
    r = client.chat.completions.create(model=model, messages=messages, **greedy)
    got = r.choices[0].message.content
    check(r.choices[0].message.role == "assistant", f"role {r.choices[0].message.role}")
    check(got == cfg["chat_text"],
          f"chat text {got!r} != encore generate --chat's {cfg['chat_text']!r}")
    check(r.usage.completion_tokens == n, f"chat usage {r.usage}")
    text, finish, usage = streamed(
        client.chat.completions.create(model=model, messages=messages, stream=True,
                                       stream_options={"include_usage": True}, **greedy),
        "chat")
    check(text == cfg["chat_text"], f"streamed chat text {text!r}")
    check(finish == "length", f"streamed chat finish_reason {finish}")
    check(usage is not None and usage.completion_tokens == n, f"streamed chat usage {usage}")

    # Content as a list of text parts (what many clients send) reads as the plain string;
    # `user` is accepted (and only logged).
    parts = [{"role": "user", "content": [{"type": "text", "text": prompt[:5]},
                                          {"type": "text", "text": prompt[5:]}]}]
    r = client.chat.completions.create(model=model, messages=parts, user="client-test", **greedy)
    got = r.choices[0].message.content
    check(got == cfg["chat_text"], f"chat text of text parts {got!r} != {cfg['chat_text']!r}")

    # A stop string from the text: the answer ends before its first occurrence.
    full = cfg["completion_text"]
    stop = next((full[i:i + 2] for i in range(len(full) - 1, 0, -1)
                 if "\ufffd" not in full[i:i + 2] and full.find(full[i:i + 2]) > 0), None)
    check(stop is not None, f"no stop string to test in {full!r}: pick another prompt")
    r = client.completions.create(model=model, prompt=prompt, stop=[stop], **greedy)
    want = full[:full.find(stop)]
    check(r.choices[0].text == want, f"stop {stop!r}: text {r.choices[0].text!r} != {want!r}")
    check(r.choices[0].finish_reason == "stop", f"stop: finish_reason {r.choices[0].finish_reason}")

    # echo with logprobs: the prompt's tokens lead the log-probabilities, the first None.
    r = client.completions.create(model=model, prompt=prompt, echo=True, logprobs=2,
                                  temperature=0, max_tokens=3, extra_body={"ignore_eos": True})
    c, lp = r.choices[0], r.choices[0].logprobs
    check(c.text.startswith(prompt), f"echo: text {c.text!r} does not start with the prompt")
    check(len(lp.tokens) == r.usage.prompt_tokens + 3 == len(lp.token_logprobs),
          f"echo: {len(lp.tokens)} tokens for {r.usage}")
    check(lp.token_logprobs[0] is None and lp.top_logprobs[0] is None,
          f"echo: the first prompt token has {lp.token_logprobs[0]}")
    check(all(x <= 0 for x in lp.token_logprobs[1:]), f"echo: {lp.token_logprobs}")

    # Errors come back as the client's exception types.
    try:
        client.completions.create(model="no-such-model", prompt=prompt, max_tokens=2)
        check(False, "an unknown model was accepted")
    except openai.NotFoundError:
        pass
    try:
        client.completions.create(model=model, prompt=prompt, max_tokens=2, temperature=9)
        check(False, "temperature 9 was accepted")
    except openai.BadRequestError:
        pass
    # A field the server does not support is refused, not ignored.
    try:
        client.completions.create(model=model, prompt=prompt, max_tokens=2, best_of=2)
        check(False, "best_of=2 was accepted")
    except openai.BadRequestError as e:
        check(e.param == "best_of", f"best_of=2: param {e.param!r}: {e.body}")
    # n samples: one choice each, whole and streamed alike.
    kw = dict(model=model, messages=messages, max_tokens=6, n=3, temperature=1.0, seed=9)
    r = client.chat.completions.create(**kw)
    check([c.index for c in r.choices] == [0, 1, 2], f"n=3: {r.choices}")
    texts = [c.message.content for c in r.choices]
    got = {}
    for chunk in client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            got[ch.index] = got.get(ch.index, "") + (ch.delta.content or "")
    check([got.get(i) for i in range(3)] == texts, f"n=3 streamed {got} != {texts}")
    structured(client, model, messages)
    tool_calls(client, model)
    print(f"openai_client_test: ok (openai {openai.__version__}; stop string {stop!r})")


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "level": {"type": "integer", "minimum": 1, "maximum": 9},
        "tags": {"type": "array", "items": {"enum": ["red", "blue"]}, "maxItems": 3},
        "meta": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                 "required": ["ok"], "additionalProperties": False},
    },
    "required": ["name", "level", "tags", "meta"],
    "additionalProperties": False,
}


def structured(client, model, messages):
    """Structured outputs through the client: a JSON schema (`response_format`, nested
    object, array, enum, bounds) validated with `jsonschema`, greedy and sampled, whole and
    streamed; vLLM's `structured_outputs` regex and choice through `extra_body`; an invalid
    schema as a BadRequestError naming `response_format`."""
    import re
    import jsonschema

    rf = {"type": "json_schema", "json_schema": {"name": "card", "schema": SCHEMA, "strict": True}}
    for temperature, seed in [(0, 0), (1.0, 1), (1.0, 2)]:
        kw = dict(model=model, messages=messages, max_tokens=120, temperature=temperature,
                  seed=seed, response_format=rf)
        r = client.chat.completions.create(**kw)
        text = r.choices[0].message.content
        check(r.choices[0].finish_reason == "stop", f"json_schema: finish {r.choices[0].finish_reason}: {text!r}")
        jsonschema.validate(json.loads(text), SCHEMA)
        chunks = client.chat.completions.create(stream=True, **kw)
        s_text, _, _ = streamed(chunks, "chat")
        check(s_text == text, f"json_schema streamed {s_text!r} != {text!r}")
        r = client.completions.create(model=model, prompt="card:", max_tokens=120,
                                      temperature=temperature, seed=seed,
                                      extra_body={"response_format": rf})
        jsonschema.validate(json.loads(r.choices[0].text), SCHEMA)
    for seed in range(3):
        r = client.chat.completions.create(
            model=model, messages=messages, max_tokens=20, temperature=1.0, seed=seed,
            extra_body={"structured_outputs": {"regex": "[a-f]{2,4}-[0-9]{2}"}})
        t = r.choices[0].message.content
        check(re.fullmatch("[a-f]{2,4}-[0-9]{2}", t) is not None, f"regex: {t!r}")
        r = client.chat.completions.create(
            model=model, messages=messages, max_tokens=20, temperature=1.0, seed=seed,
            extra_body={"structured_outputs": {"choice": ["alpha", "beta", "gamma"]}})
        t = r.choices[0].message.content
        check(t in ("alpha", "beta", "gamma"), f"choice: {t!r}")
    try:
        bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wizard"}}}
        client.chat.completions.create(model=model, messages=messages, max_tokens=4,
                                       response_format=bad)
        check(False, "an invalid schema was accepted")
    except openai.BadRequestError as e:
        check(e.param == "response_format", f"invalid schema: param {e.param!r}: {e.body}")


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                      "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                       "required": ["city", "days"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "description": "The time now"}},
]


def tool_calls(client, model):
    """Tool calls through the client: `tool_choice` required (parallel or not) and named,
    sampled, whole and streamed (the stream's `tool_calls` deltas put together by index as
    OpenAI's docs do), each call's arguments validated against its tool's schema; the
    assistant message and a tool result passed back; an unknown function in
    `tool_choice` as a BadRequestError naming it."""
    import jsonschema
    schemas = {t["function"]["name"]: t["function"].get(
        "parameters", {"type": "object", "additionalProperties": False}) for t in TOOLS}
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    choices = ["required", {"type": "function", "function": {"name": "get_weather"}}]
    for seed in range(2):
        for choice in choices:
            for parallel in (True, False):
                kw = dict(model=model, messages=messages, tools=TOOLS, tool_choice=choice,
                          parallel_tool_calls=parallel, temperature=1.0, seed=seed,
                          max_tokens=200)
                r = client.chat.completions.create(**kw)
                ch = r.choices[0]
                want = "tool_calls" if choice == "required" else "stop"
                check(ch.finish_reason == want, f"tools {choice}: finish {ch.finish_reason}")
                calls = ch.message.tool_calls or []
                check(calls, f"tools {choice}: no calls: {ch.message}")
                if not parallel or choice != "required":
                    check(len(calls) == 1, f"tools {choice}: {len(calls)} calls")
                for c in calls:
                    check(c.type == "function" and c.id, f"tools: call {c}")
                    jsonschema.validate(json.loads(c.function.arguments), schemas[c.function.name])
                acc = {}
                for chunk in client.chat.completions.create(stream=True, **kw):
                    for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                        e = acc.setdefault(d.index, {"name": None, "args": ""})
                        if d.function and d.function.name:
                            e["name"] = d.function.name
                        if d.function and d.function.arguments:
                            e["args"] += d.function.arguments
                got = [(acc[i]["name"], acc[i]["args"]) for i in sorted(acc)]
                check(got == [(c.function.name, c.function.arguments) for c in calls],
                      f"tools streamed {got} != {calls}")
            # The call and its result go back to the model.
            follow = messages + [ch.message] + [
                {"role": "tool", "tool_call_id": c.id, "content": "22 degrees"} for c in calls]
            r = client.chat.completions.create(model=model, messages=follow, tools=TOOLS,
                                               max_tokens=4)
            check(r.choices[0].message.role == "assistant", "tools: the follow-up")
    try:
        client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, max_tokens=4,
            tool_choice={"type": "function", "function": {"name": "fly"}})
        check(False, "an unknown function in tool_choice was accepted")
    except openai.BadRequestError as e:
        check(e.param == "tool_choice", f"unknown function: param {e.param!r}: {e.body}")


if __name__ == "__main__":
    main()
