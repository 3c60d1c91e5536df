#!/usr/bin/env python3
"""The client libraries people point at an OpenAI-compatible server, each on its default
structured-output, tool and streaming paths, against a running `encore serve`.

Run by scripts/clients-check (which makes the venv and starts the servers); one argument,
a JSON file:

    {"base_url": "http://127.0.0.1:PORT", "api_key": "...", "model": "...",
     "text_only": false}

`text_only`: only the plain and streamed text paths (a real model whose template renders
no tools, SmolLM2's); otherwise every path. The model of the full run is a dummy one (random weights, a template that renders tools): what is checked
is that each library's request is accepted and its answer parsed by the library itself
(structured outputs and forced tool calls are constrained by the server's grammar, so a
random model still answers in the schema), not what the model says. Prints one line per
check and a table at the end; exits non-zero when a check fails.
"""

import asyncio
import enum
import json
import sys
import time
import traceback
from typing import Callable, Literal

from pydantic import BaseModel

RESULTS: list[tuple[str, str, bool, str]] = []


class Color(str, enum.Enum):
    RED = "red"
    GREEN = "green"


class Address(BaseModel):
    """A nested model: its schema goes to `$defs` (pydantic-ai's and instructor's case)."""

    country: Color
    capital: bool


class Person(BaseModel):
    color: Color
    address: Address


WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": WEATHER_PARAMS,
    },
}
PROMPT = "Describe a person."
SHORT = 24  # max tokens of free text


TEXT_ONLY = False
TEXT_PATHS = {"chat", "chat stream", "models.retrieve", "messages stream", "stream text",
              "stream", "invoke + stream", "completion + stream"}


def check(library: str, path: str):
    def wrap(fn: Callable[[], str]):
        if TEXT_ONLY and path not in TEXT_PATHS:
            return fn
        t0 = time.time()
        try:
            detail = fn() or ""
            ok = True
        except Exception as e:  # noqa: BLE001 - the library's own exception is the finding
            ok = False
            detail = f"{type(e).__name__}: {e}"
            traceback.print_exc(limit=3)
        detail = " ".join(str(detail).split())[:110]
        RESULTS.append((library + (" (smollm2)" if TEXT_ONLY else ""), path, ok, detail))
        print(f"{'ok  ' if ok else 'FAIL'} {library:17} {path:22} {time.time() - t0:5.1f}s {detail}",
              flush=True)
        return fn

    return wrap


def main(cfg: dict) -> int:
    global TEXT_ONLY
    TEXT_ONLY = bool(cfg.get("text_only"))
    base, key, model = cfg["base_url"], cfg["api_key"], cfg["model"]
    v1 = base + "/v1"

    # --- openai ---------------------------------------------------------------------
    import openai

    oa = openai.OpenAI(base_url=v1, api_key=key)

    @check("openai", "chat")
    def _():
        c = oa.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPT}],
                                       max_tokens=SHORT)
        return f"{c.usage.completion_tokens} tokens, {c.choices[0].finish_reason}"

    @check("openai", "chat stream")
    def _():
        n = 0
        for ch in oa.chat.completions.create(model=model, stream=True, max_tokens=SHORT,
                                             messages=[{"role": "user", "content": PROMPT}]):
            n += 1
        return f"{n} chunks"

    @check("openai", "structured (parse)")
    def _():
        c = oa.chat.completions.parse(model=model, response_format=Person,
                                      messages=[{"role": "user", "content": PROMPT}])
        return repr(c.choices[0].message.parsed)

    @check("openai", "tool loop")
    def _():
        msgs = [{"role": "user", "content": "Weather in Paris?"}]
        c = oa.chat.completions.create(model=model, messages=msgs, tools=[WEATHER_TOOL],
                                       tool_choice="required", max_tokens=64)
        call = c.choices[0].message.tool_calls[0]
        json.loads(call.function.arguments)
        msgs += [c.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
        c2 = oa.chat.completions.create(model=model, messages=msgs, tools=[WEATHER_TOOL],
                                        max_tokens=SHORT)
        return f"{call.function.name}({call.function.arguments}) -> {c2.choices[0].finish_reason}"

    @check("openai", "models.retrieve")
    def _():
        return oa.models.retrieve(model).id

    # --- anthropic ------------------------------------------------------------------
    import anthropic

    an = anthropic.Anthropic(base_url=base, api_key=key)

    @check("anthropic", "messages stream")
    def _():
        with an.messages.stream(model=model, max_tokens=SHORT,
                                messages=[{"role": "user", "content": PROMPT}]) as s:
            text = "".join(s.text_stream)
        return f"{len(text)} chars"

    @check("anthropic", "tool round trip")
    def _():
        tool = {"name": "get_weather", "description": "The weather in a city.",
                "input_schema": WEATHER_PARAMS}
        msgs = [{"role": "user", "content": "Weather in Paris?"}]
        m = an.messages.create(model=model, max_tokens=64, tools=[tool],
                               tool_choice={"type": "any"}, messages=msgs)
        use = next(b for b in m.content if b.type == "tool_use")
        msgs += [{"role": "assistant", "content": [b.model_dump() for b in m.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                               "content": "sunny"}]}]
        m2 = an.messages.create(model=model, max_tokens=SHORT, tools=[tool], messages=msgs)
        return f"{use.name}({json.dumps(use.input)}) -> {m2.stop_reason}"

    # --- instructor -----------------------------------------------------------------
    import instructor

    for mode in ("TOOLS", "JSON_SCHEMA", "RESPONSES_TOOLS"):
        @check("instructor", f"{mode.lower()}")
        def _(mode=mode):
            ic = instructor.from_openai(openai.OpenAI(base_url=v1, api_key=key),
                                        mode=getattr(instructor.Mode, mode))
            if mode == "RESPONSES_TOOLS":
                p = ic.responses.create(model=model, response_model=Person, max_retries=0,
                                        input=[{"role": "user", "content": PROMPT}])
            else:
                p = ic.chat.completions.create(model=model, response_model=Person, max_retries=0,
                                               messages=[{"role": "user", "content": PROMPT}])
            return repr(p)

    # --- pydantic-ai ----------------------------------------------------------------
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    pm = OpenAIChatModel(model, provider=OpenAIProvider(base_url=v1, api_key=key))

    @check("pydantic-ai", "structured (output)")
    def _():
        r = Agent(pm, output_type=Person).run_sync(PROMPT,
                                                   usage_limits=UsageLimits(request_limit=4))
        return repr(r.output)

    @check("pydantic-ai", "stream text")
    def _():
        async def go():
            async with Agent(pm).run_stream(PROMPT, model_settings={"max_tokens": SHORT}) as s:
                return [t async for t in s.stream_text(delta=True)]

        return f"{len(asyncio.run(go()))} deltas"

    @check("pydantic-ai", "tool + output")
    def _():
        agent = Agent(pm, output_type=Person)

        @agent.tool_plain
        def get_weather(city: Color) -> str:
            """The weather in a city."""
            return "sunny"

        r = agent.run_sync(PROMPT, usage_limits=UsageLimits(request_limit=6))
        return f"{len(r.all_messages())} messages, {r.output!r}"

    # --- openai-agents --------------------------------------------------------------
    from agents import (Agent as OAAgent, ModelSettings, OpenAIChatCompletionsModel, Runner,
                        function_tool, set_tracing_disabled)

    set_tracing_disabled(True)
    am = OpenAIChatCompletionsModel(model=model,
                                    openai_client=openai.AsyncOpenAI(base_url=v1, api_key=key))

    @check("openai-agents", "structured (output)")
    def _():
        r = Runner.run_sync(OAAgent(name="a", model=am, output_type=Person), PROMPT)
        return repr(r.final_output)

    @check("openai-agents", "tool")
    def _():
        @function_tool
        def get_weather(city: Literal["Paris", "Rome"]) -> str:
            """The weather in a city."""
            return "sunny"

        a = OAAgent(name="a", model=am, tools=[get_weather], tool_use_behavior="stop_on_first_tool",
                    model_settings=ModelSettings(tool_choice="required", max_tokens=64))
        return repr(Runner.run_sync(a, "Weather in Paris?").final_output)

    @check("openai-agents", "stream")
    def _():
        async def go():
            r = Runner.run_streamed(OAAgent(name="a", model=am,
                                            model_settings=ModelSettings(max_tokens=SHORT)), PROMPT)
            return [e async for e in r.stream_events()]

        return f"{len(asyncio.run(go()))} events"

    # --- langchain-openai -----------------------------------------------------------
    from langchain_core.tools import tool as lc_tool
    from langchain_openai import ChatOpenAI

    lc = ChatOpenAI(model=model, base_url=v1, api_key=key, max_tokens=SHORT)

    @check("langchain-openai", "invoke + stream")
    def _():
        lc.invoke(PROMPT)
        return f"{sum(1 for _ in lc.stream(PROMPT))} chunks"

    @check("langchain-openai", "structured")
    def _():
        return repr(ChatOpenAI(model=model, base_url=v1, api_key=key)
                    .with_structured_output(Person).invoke(PROMPT))

    @check("langchain-openai", "tools")
    def _():
        @lc_tool
        def get_weather(city: Literal["Paris", "Rome"]) -> str:
            """The weather in a city."""
            return "sunny"

        m = ChatOpenAI(model=model, base_url=v1, api_key=key, max_tokens=64)
        r = m.bind_tools([get_weather], tool_choice="any").invoke("Weather in Paris?")
        assert r.tool_calls, f"no tool call: {r!r}"
        return f'{r.tool_calls[0]["name"]}({r.tool_calls[0]["args"]})'

    # --- litellm --------------------------------------------------------------------
    import litellm

    lm = {"model": f"openai/{model}", "api_base": v1, "api_key": key}

    @check("litellm", "completion + stream")
    def _():
        litellm.completion(**lm, messages=[{"role": "user", "content": PROMPT}], max_tokens=SHORT)
        chunks = list(litellm.completion(**lm, stream=True, max_tokens=SHORT,
                                         messages=[{"role": "user", "content": PROMPT}]))
        return f"{len(chunks)} chunks"

    @check("litellm", "structured")
    def _():
        r = litellm.completion(**lm, response_format=Person,
                               messages=[{"role": "user", "content": PROMPT}])
        return repr(Person.model_validate_json(r.choices[0].message.content))

    @check("litellm", "tools")
    def _():
        r = litellm.completion(**lm, tools=[WEATHER_TOOL], tool_choice="required", max_tokens=64,
                               messages=[{"role": "user", "content": "Weather in Paris?"}])
        return r.choices[0].message.tool_calls[0].function.arguments

    failed = [r for r in RESULTS if not r[2]]
    print()
    print(f"{'library':27} {'path':22} result")
    for lib, path, ok, detail in RESULTS:
        print(f"{lib:27} {path:22} {'ok' if ok else 'FAILED: ' + detail}")
    print(f"{len(RESULTS) - len(failed)} of {len(RESULTS)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        sys.exit(main(json.load(f)))
