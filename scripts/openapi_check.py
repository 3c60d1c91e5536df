#!/usr/bin/env python3
"""Check a running encore server against its own `/openapi.json` (as vLLM's schemathesis run
checks its server against its schema).

Run by crates/encore-server/tests/http/openapi.rs with the venv python of
scripts/ci-venv.sh (it needs `jsonschema`). The one argument is a JSON file:

    {"base_url": "http://127.0.0.1:PORT", "model": "dummy:tiny", "seed": N, "cases": N,
     "keyed_url": "http://127.0.0.1:PORT2"}   # optional: a server with an API key

1. Real responses: a request of each kind to every route (completions and chat, whole and
   streamed, with log-probabilities and usage; responses, messages and count_tokens; the
   models; tokenize and detokenize; errors, a body over the limit) must answer with a status the document lists
   for the route, and a body (each event of a stream) that validates against the schema
   the document gives for that status and content type.
2. Generated bodies: for every POST route, `cases` bodies generated from its request
   schema (values drawn from each field's schema, a few fields at a time), as many of
   the values a client sends (pools; at least one must be answered 200), and as many
   made invalid (an unknown field, a field of the wrong type, a required field left out,
   a body that is not an object, a body that is not JSON): no 5xx, every answer
   documented and valid against the schema; an unknown field is a 4xx naming it.

Seeded (`seed`), so a failure is reproducible; exits non-zero with the case on the first
failure.
"""

import http.client
import json
import random
import sys
import urllib.parse
from collections import Counter

import jsonschema

CFG = json.load(open(sys.argv[1]))
URL = urllib.parse.urlparse(CFG["base_url"])
MODEL = CFG["model"]
RNG = random.Random(CFG.get("seed", 0))
CASES = CFG.get("cases", 20)
STATUSES = Counter()


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def request(method, path, body=None, raw=None, url=URL):
    """(status, content type, text) of one request; `raw` is sent as it is."""
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    data = raw if raw is not None else (None if body is None else json.dumps(body))
    headers = {"Content-Type": "application/json"} if data is not None else {}
    conn.request(method, path, body=data, headers=headers)
    r = conn.getresponse()
    STATUSES[r.status] += 1
    text = r.read().decode("utf-8")
    ctype = (r.getheader("content-type") or "").split(";")[0].strip()
    conn.close()
    return r.status, ctype, text


DOC = json.loads(request("GET", "/openapi.json")[2])
SCHEMAS = DOC["components"]["schemas"]


def validate(instance, schema, what):
    root = dict(schema)
    root["components"] = DOC["components"]
    try:
        jsonschema.Draft202012Validator(root).validate(instance)
    except jsonschema.ValidationError as e:
        fail(f"{what}: {e.message} at {list(e.absolute_path)}\n{json.dumps(instance)[:2000]}")


def events(text):
    """The `data` of each server-sent event."""
    return [line[len("data:"):].strip() for line in text.splitlines() if line.startswith("data:")]


def check(method, path, status, ctype, text, doc_path=None, what=""):
    """The answer is documented for the route and valid against its schema."""
    what = f"{method} {path} {what} -> {status}"
    if status >= 500:
        fail(f"{what}: a server error\n{text[:2000]}")
    op = DOC["paths"][doc_path or path][method.lower()]
    resp = op["responses"].get(str(status))
    if resp is None:
        fail(f"{what}: status not documented\n{text[:2000]}")
    content = resp.get("content", {})
    if ctype not in content:
        fail(f"{what}: content type {ctype!r} not documented ({list(content)})")
    schema = content[ctype].get("schema", {})
    if ctype == "application/json":
        validate(json.loads(text), schema, what)
    elif ctype == "text/event-stream":
        for data in events(text):
            if data == "[DONE]":
                continue
            v = json.loads(data)
            if path in ("/v1/completions", "/v1/chat/completions") and "error" in v:
                # A stream of chunks that ends with an error sends the error body.
                validate(v, {"$ref": "#/components/schemas/ErrorBody"}, what + " (error event)")
            else:
                validate(v, schema, what)


def call(method, path, body=None, raw=None, doc_path=None, what="", url=URL):
    status, ctype, text = request(method, path, body, raw, url)
    check(method, path, status, ctype, text, doc_path, what or json.dumps(body)[:300])
    return status, text


# 1. Real responses of every route.
def real_responses():
    user = [{"role": "user", "content": "hi"}]
    cases = [
        ("/v1/completions", {"model": MODEL, "prompt": "hello", "max_tokens": 3}, 200),
        ("/v1/completions", {"model": MODEL, "prompt": "hello", "max_tokens": 3, "logprobs": 2,
                             "echo": True, "n": 2}, 200),
        ("/v1/completions", {"model": MODEL, "prompt": "hello", "max_tokens": 3, "stream": True,
                             "logprobs": 1, "stream_options": {"include_usage": True,
                                                               "continuous_usage_stats": True}}, 200),
        ("/v1/chat/completions", {"model": MODEL, "messages": user, "max_tokens": 3,
                                  "logprobs": True, "top_logprobs": 2}, 200),
        ("/v1/chat/completions", {"model": MODEL, "messages": user, "max_tokens": 3,
                                  "stream": True, "logprobs": True,
                                  "stream_options": {"include_usage": True}}, 200),
        ("/v1/chat/completions", {"model": "other", "messages": user}, 404),
        ("/v1/chat/completions", {"model": MODEL, "messages": user, "temprature": 1}, 400),
        ("/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 3}, 200),
        ("/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 3, "stream": True}, 200),
        ("/v1/messages", {"model": MODEL, "messages": user, "max_tokens": 3}, 200),
        ("/v1/messages", {"model": MODEL, "messages": user, "max_tokens": 3, "stream": True}, 200),
        ("/v1/messages", {"model": MODEL, "messages": user}, 400),
        ("/v1/messages/count_tokens", {"model": MODEL, "messages": user}, 200),
        ("/tokenize", {"model": MODEL, "prompt": "hello"}, 200),
        ("/tokenize", {"messages": user}, 200),
        ("/detokenize", {"tokens": [1, 2, 3]}, 200),
        ("/detokenize", {"tokens": "x"}, 400),
    ]
    for path, body, want in cases:
        status, text = call("POST", path, body)
        if status != want:
            fail(f"POST {path} {json.dumps(body)}: {status}, not {want}\n{text[:1000]}")
    # A body over the server's limit (the test server's is 64 KiB): a documented 413.
    for path, item in DOC["paths"].items():
        if "post" in item:
            big = json.dumps({"model": MODEL, "prompt": "x" * 70000})
            status, _ = call("POST", path, raw=big, what="a body over the limit")
            if status != 413:
                fail(f"POST {path} with a body over the limit: {status}, not 413")
    for path, doc_path, want in [
        ("/v1/models", None, 200),
        (f"/v1/models/{MODEL}", "/v1/models/{model}", 200),
        ("/v1/models/org/other", "/v1/models/{model}", 404),
        ("/health", None, 200),
        ("/metrics", None, 200),
        ("/openapi.json", None, 200),
    ]:
        status, text = call("GET", path, doc_path=doc_path, what="")
        if status != want:
            fail(f"GET {path}: {status}, not {want}\n{text[:1000]}")


# 2. Generated bodies.
POOLS = {
    "model": [MODEL] * 8 + ["other", ""],
    "messages": [
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}],
        [],
        [{"role": "robot", "content": "x"}],
    ],
    "prompt": ["hello", [1, 2, 3], ["a", "b"], [[1, 2], [3]], "", []],
    "input": ["hi", [{"role": "user", "content": "hi"}], [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}], []],
    "tokens": [[1, 2, 3], [], [10 ** 9]],
    "system": ["be brief", [{"type": "text", "text": "be brief"}]],
    "instructions": ["be brief"],
    "stop": ["x", ["a", "b"], [], ["a", "b", "c", "d", "e"]],
}
SMALL = {"max_tokens", "max_completion_tokens", "max_output_tokens", "n", "logprobs", "top_logprobs"}


def resolve(s):
    while isinstance(s, dict) and "$ref" in s:
        s = SCHEMAS[s["$ref"].rsplit("/", 1)[1]]
    return s


def value(name, s, depth=0):
    """A value for field `name` of schema `s`."""
    if name in POOLS and RNG.random() < 0.8:
        return RNG.choice(POOLS[name])
    if name in SMALL and RNG.random() < 0.9:
        return RNG.choice([0, 1, 2, 3])
    s = resolve(s)
    if "enum" in s:
        return RNG.choice(s["enum"])
    for key in ("oneOf", "anyOf"):
        if key in s:
            return value(name, RNG.choice(s[key]), depth)
    t = s.get("type")
    if isinstance(t, list):
        t = RNG.choice([x for x in t if x != "null"] or ["null"]) if RNG.random() < 0.9 else "null"
    if t is None:
        return any_value(depth)
    if t == "null":
        return None
    if t == "boolean":
        return RNG.random() < 0.5
    if t == "integer":
        return RNG.choice([0, 1, 2, 5, -1, 100, 2 ** 40])
    if t == "number":
        return RNG.choice([0, 0.5, 1, 1.5, -0.5, 2.5, 1e9])
    if t == "string":
        return RNG.choice(["", "x", "hello world", MODEL, "auto", "none", "text"])
    if t == "array":
        return [value("", s.get("items", {}), depth + 1) for _ in range(RNG.randint(0, 3))]
    if t == "object":
        return {} if RNG.random() < 0.5 or depth > 1 else {"type": "text", "k": any_value(depth + 1)}
    return any_value(depth)


def any_value(depth=0):
    choices = [None, True, 0, 1, -1, 0.5, "", "x", {"type": "text"}, {"type": "json_object"}]
    if depth < 2:
        choices += [[], [1, 2], {"a": any_value(depth + 1)}, [any_value(depth + 1)]]
    return RNG.choice(choices)


def wrong(v):
    """A value of another JSON type than `v`'s."""
    options = [{"nested": [1]}, [1, "x"], "not a number", 12345, True, -7.5]
    return RNG.choice([o for o in options if type(o) is not type(v)])


def short(body, schema):
    """Short outputs: the schema allows any length, the test wants speed."""
    for k in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if k in schema["properties"] and k not in body:
            body[k] = 2
    return body


def generate_valid(schema):
    """A body of values drawn from the fields' schemas (many are refused by range)."""
    props = schema["properties"]
    body = {name: value(name, props[name]) for name in schema.get("required", [])}
    optional = [n for n in props if n not in body]
    for name in RNG.sample(optional, min(len(optional), RNG.randint(0, 4))):
        body[name] = value(name, props[name])
    return short(body, schema)


def generate_sane(schema):
    """A body of values a client would send (mostly answered 200): the required fields and
    a few others from their pools, the refused ones at a value that changes nothing."""
    props = schema["properties"]
    def pick(name):
        if "enum" in props[name]:
            return RNG.choice(props[name]["enum"])
        return RNG.choice(SANE[name])
    body = {name: pick(name) for name in schema.get("required", [])}
    optional = [n for n in props if n not in body and (n in SANE or "enum" in props[n])]
    for name in RNG.sample(optional, min(len(optional), RNG.randint(0, 3))):
        body[name] = pick(name)
    if isinstance(body.get("logprobs"), bool) or "logprobs" in body and props["logprobs"].get("type", [""])[0] == "boolean":
        body["logprobs"] = RNG.random() < 0.5
    if "stream_options" in body and body.get("stream") is not True:
        body["stream"] = True
    return short(body, schema)


SANE = {
    "model": [MODEL],
    "messages": POOLS["messages"][:3],
    "prompt": POOLS["prompt"][:4],
    "input": POOLS["input"][:3],
    "tokens": [[1, 2, 3], [65, 66]],
    "system": POOLS["system"],
    "instructions": POOLS["instructions"],
    "stop": ["x", ["a", "b"]],
    "stop_sequences": [["x"], []],
    "temperature": [0, 0.7, 1],
    "top_p": [0.9, 1],
    "top_k": [-1, 0, 5],
    "min_p": [0, 0.05],
    "seed": [1, 42],
    "presence_penalty": [0, 0.5],
    "frequency_penalty": [0, 0.5],
    "repetition_penalty": [1, 1.1],
    "n": [1, 2],
    "logprobs": [0, 2],
    "top_logprobs": [0, 2],
    "stream": [True, False],
    "stream_options": [{"include_usage": True}, {"continuous_usage_stats": True}],
    "ignore_eos": [False, True],
    "max_tokens": [1, 2, 3],
    "max_completion_tokens": [1, 3],
    "max_output_tokens": [1, 3],
    "echo": [True, False],
    "add_special_tokens": [True, False],
    "add_generation_prompt": [True, False],
    "user": ["u1"],
    "metadata": [{"k": "v"}],
    "response_format": [{"type": "text"}, {"type": "json_object"}],
}
SANE_OK = Counter()


def generated_bodies():
    for path, item in sorted(DOC["paths"].items()):
        op = item.get("post")
        if op is None:
            continue
        ref = op["requestBody"]["content"]["application/json"]["schema"]
        schema = resolve(ref)
        assert schema.get("additionalProperties") is False, path
        for i in range(CASES):
            body = generate_valid(schema)
            call("POST", path, body, what=f"drawn #{i} {json.dumps(body)[:300]}")
            body = generate_sane(schema)
            status, _ = call("POST", path, body, what=f"sane #{i} {json.dumps(body)[:300]}")
            SANE_OK[path] += status == 200
            kind = RNG.choice(["unknown", "wrong", "missing", "not_object", "not_json"])
            bad = dict(body)
            if kind == "unknown":
                # Beside the required fields alone: the first field refused is named.
                key = RNG.choice(["temprature", "zz_unknown", "Model", "max-tokens"])
                bad = {k: SANE[k][0] for k in schema.get("required", [])}
                bad[key] = 1
                status, text = call("POST", path, bad, what=f"unknown field {key}")
                if not 400 <= status < 500 or key not in text:
                    fail(f"POST {path} with unknown field {key}: {status} {text[:500]}")
                continue
            if kind == "wrong" and bad:
                key = RNG.choice(sorted(bad))
                bad[key] = wrong(bad[key])
            elif kind == "missing" and schema.get("required"):
                bad.pop(RNG.choice(schema["required"]))
            elif kind == "not_object":
                bad = RNG.choice([[], "x", 5, None, [body]])
            elif kind == "not_json":
                call("POST", path, raw=RNG.choice(["{", "", "{\"model\": }", "\xff"]), what="not JSON")
                continue
            call("POST", path, bad, what=f"{kind} #{i} {json.dumps(bad)[:300]}")
    for name in [MODEL, "other", "a/b", "%20", "x" * 300]:
        call("GET", f"/v1/models/{urllib.parse.quote(name, safe='/:')}", doc_path="/v1/models/{model}", what=name)


def self_check():
    """The validator refuses what does not fit (its references resolve)."""
    for name, bad in [("CompletionResponse", {"id": 1}), ("ChatCompletionChunk", {"choices": "x"}),
                      ("ErrorBody", {"error": {"message": "m", "type": "t", "param": 5}})]:
        root = {"$ref": f"#/components/schemas/{name}", "components": DOC["components"]}
        if jsonschema.Draft202012Validator(root).is_valid(bad):
            fail(f"the schema {name} accepts {bad}")


def without_key():
    """A server with an API key answers every `/v1` route and vLLM's without it 401, as
    documented; `/health`, `/metrics` and `/openapi.json` need no key."""
    url = urllib.parse.urlparse(CFG["keyed_url"])
    for path, item in DOC["paths"].items():
        for method in item:
            served = path.replace("{model}", MODEL)
            body = {"model": MODEL} if method == "post" else None
            status, _ = call(method.upper(), served, body, doc_path=path, what="no key", url=url)
            open_route = path in ("/health", "/metrics", "/openapi.json")
            if (status == 401) == open_route:
                fail(f"{method.upper()} {path} without the key: {status}")


self_check()
if "keyed_url" in CFG:
    without_key()
real_responses()
generated_bodies()
for path, item in DOC["paths"].items():
    if "post" in item and SANE_OK[path] == 0:
        fail(f"POST {path}: no generated body was answered 200")
counts = ", ".join(f"{n} x {st}" for st, n in sorted(STATUSES.items()))
print(f"openapi_check: {len(DOC['paths'])} routes, {CASES} generated bodies and as many invalid a POST "
      f"route; every answer documented and valid ({counts})")
