//! What real clients send (issue #45): each test sends the request a client library
//! sends by default, byte for byte where it matters (header spellings, the fields it adds
//! on its own), and checks the server answers it as OpenAI, Anthropic or vLLM would.

use serde_json::{json, Value};

use crate::harness::*;

#[test]
fn the_bearer_scheme_is_case_insensitive() {
    let s = start(Some("sekret"));
    let body = json!({"model": MODEL, "prompt": "hi", "max_tokens": 2}).to_string();
    for auth in [
        "Bearer sekret",
        "bearer sekret",
        "BEARER sekret",
        "bEaReR  sekret",
    ] {
        let (st, b) = http(
            s.addr,
            "POST",
            "/v1/completions",
            Some(&body),
            &[("Authorization", auth)],
        );
        assert_eq!(st, 200, "{auth}: {b}");
    }
    for auth in ["bearer nope", "Basic sekret", "sekret", "Bearersekret"] {
        let (st, b) = http(
            s.addr,
            "POST",
            "/v1/completions",
            Some(&body),
            &[("Authorization", auth)],
        );
        assert_eq!(st, 401, "{auth}: {b}");
        let v: Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["error"]["code"], "invalid_api_key", "{auth}");
    }
}

#[test]
fn stream_options_without_stream_is_refused_by_name() {
    let s = start(None);
    // The openai client sends `stream_options` as given, and no `stream` for a whole
    // answer; OpenAI answers 400 naming `stream_options`.
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "model": MODEL,
                   "stream_options": {"include_usage": true}}),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "hi", "stream": false,
                   "stream_options": {"include_usage": true}}),
        ),
    ] {
        let (st, v) = post(s.addr, path, body);
        assert_eq!(st, 400, "{path}: {v}");
        assert_eq!(v["error"]["param"], "stream_options", "{path}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("stream"),
            "{v}"
        );
    }
}

#[test]
fn models_retrieve_and_unknown_paths_answer_openai_errors() {
    let s = start(Some("k"));
    let auth = [("Authorization", "Bearer k")];
    // `client.models.retrieve(MODEL)`: GET /v1/models/{model}.
    let (st, b) = http(s.addr, "GET", &format!("/v1/models/{MODEL}"), None, &auth);
    assert_eq!(st, 200, "{b}");
    let m: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(
        (m["id"].as_str(), m["object"].as_str()),
        (Some(MODEL), Some("model"))
    );
    assert!(m["created"].is_u64() && m["owned_by"].is_string(), "{m}");
    // The list holds the same object.
    let (_, list) = http(s.addr, "GET", "/v1/models", None, &auth);
    let list: Value = serde_json::from_str(&list).unwrap();
    assert_eq!(list["data"][0], m);
    // An unknown model (one with a `/` too, which the client sends as `%2F`) is
    // OpenAI's 404.
    for (path, id) in [
        ("gpt-4o", "gpt-4o"),
        ("org/name", "org/name"),
        ("org%2Fname", "org/name"),
    ] {
        let (st, b) = http(s.addr, "GET", &format!("/v1/models/{path}"), None, &auth);
        assert_eq!(st, 404, "{id}: {b}");
        let e: Value = serde_json::from_str(&b).unwrap_or_else(|_| panic!("{id}: {b:?}"));
        assert_eq!(e["error"]["code"], "model_not_found", "{e}");
        assert_eq!(e["error"]["param"], "model", "{e}");
        assert!(e["error"]["message"].as_str().unwrap().contains(id), "{e}");
    }
    // Unknown paths and wrong methods: the error object, never an empty body.
    for (method, path, status) in [
        ("GET", "/v1/nope", 404),
        ("POST", "/v1/chat/completion", 404),
        ("GET", "/", 404),
        ("GET", "/v1/chat/completions", 405),
        ("DELETE", "/v1/models", 405),
        ("POST", "/v1/models", 405),
    ] {
        let (st, b) = http(s.addr, method, path, Some("{}"), &auth);
        assert_eq!(st, status, "{method} {path}: {b}");
        let e: Value =
            serde_json::from_str(&b).unwrap_or_else(|_| panic!("{method} {path}: {b:?}"));
        let err = &e["error"];
        assert!(err["message"].as_str().unwrap().contains(path), "{e}");
        assert_eq!(err["type"], "invalid_request_error", "{e}");
        assert!(err["param"].is_null() && err["code"].is_null(), "{e}");
    }
    // Under `/v1/messages`, Anthropic's shape.
    let (st, b) = http(s.addr, "GET", "/v1/messages", None, &auth);
    assert_eq!(st, 405, "{b}");
    let e: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(e["type"], "error", "{e}");
}

#[test]
fn chat_without_max_tokens_runs_to_the_contexts_end_and_completions_to_16() {
    let s = start(None);
    // The openai client's `chat.completions.create(model, messages)`: no length at all.
    // `ignore_eos` keeps the random model from ending early.
    let b = json!({"messages": [{"role": "user", "content": "hi"}], "model": MODEL,
                   "ignore_eos": true});
    let (st, v) = post(s.addr, "/v1/chat/completions", b);
    assert_eq!(st, 200, "{v}");
    let ctx = s.engine.max_seq_len as u64;
    let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(
        v["usage"]["completion_tokens"].as_u64(),
        Some(ctx - prompt),
        "{v}"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // Legacy completions keep OpenAI's and vLLM's 16.
    let b = json!({"model": MODEL, "prompt": "hi", "ignore_eos": true});
    let (st, v) = post(s.addr, "/v1/completions", b);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 16, "{v}");
}

#[test]
fn a_tool_call_cut_off_by_length_goes_back_as_its_text() {
    let s = start_parsers(None, None);
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    // The assistant message the openai client got back with `finish_reason: length`
    // (`message.model_dump()`), sent back in the next turn as it is.
    let cut = "{\"city\": \"Par";
    let messages = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"content": null, "refusal": null, "role": "assistant", "tool_calls": [{"id": "call_1",
            "function": {"arguments": cut, "name": "get_weather"}, "type": "function"}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "error: cut off"},
    ]);
    let (st, v) = post(
        s.addr,
        "/tokenize",
        json!({"messages": messages, "tools": tools}),
    );
    assert_eq!(st, 200, "{v}");
    let (_, d) = post(s.addr, "/detokenize", json!({"tokens": v["tokens"]}));
    // The template writes the arguments out with `tojson`: the text, quoted.
    let quoted = serde_json::to_string(cut).unwrap();
    assert!(
        d["prompt"].as_str().unwrap().contains(&quoted),
        "{}",
        d["prompt"]
    );
    let b = json!({"model": MODEL, "messages": messages, "tools": tools, "max_tokens": 2});
    let (st, v) = post(s.addr, "/v1/chat/completions", b);
    assert_eq!(st, 200, "{v}");
    // The responses API's `function_call` item alike.
    let input = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": cut},
        {"type": "function_call_output", "call_id": "call_1", "output": "error: cut off"},
    ]);
    let tools = json!([{"type": "function", "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let b = json!({"model": MODEL, "input": input, "tools": tools, "max_output_tokens": 2});
    let (st, v) = post(s.addr, "/v1/responses", b);
    assert_eq!(st, 200, "{v}");
}

/// The `data:` payloads of a chunk stream, parsed, less `[DONE]` (which must end it).
fn chunks(raw: &str) -> Vec<Value> {
    let events = sse(raw);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{raw}");
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

#[test]
fn guidellms_default_streaming_run_is_served() {
    let s = start(None);
    let n = 20;
    // guidellm's requests (its OpenAI HTTP backend, a synthetic text of a set output
    // length): `continuous_usage_stats`, `stop: null` and `ignore_eos`.
    let options = json!({"include_usage": true, "continuous_usage_stats": true});
    let chat = json!({"model": MODEL, "stream": true, "stream_options": options,
        "max_completion_tokens": n, "stop": null, "ignore_eos": true,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a b c d"}]}]});
    let completion = json!({"model": MODEL, "stream": true, "stream_options": options,
        "max_tokens": n, "stop": null, "ignore_eos": true, "prompt": "a b c d"});
    for (path, body) in [
        ("/v1/chat/completions", chat),
        ("/v1/completions", completion),
    ] {
        let all = chunks(&post_raw(s.addr, path, &body));
        let (last, tokens) = all.split_last().unwrap();
        // Every token's chunk carries the usage so far, as vLLM's.
        assert_eq!(tokens.len(), n, "{path}: {all:?}");
        let prompt = last["usage"]["prompt_tokens"].as_u64().unwrap();
        for (i, c) in tokens.iter().enumerate() {
            let u = &c["usage"];
            assert_eq!(u["prompt_tokens"], prompt, "{path}: {c}");
            assert_eq!(u["completion_tokens"], i + 1, "{path}: {c}");
            assert_eq!(u["total_tokens"], prompt + i as u64 + 1, "{path}: {c}");
        }
        // Then the usage chunk of `include_usage`.
        assert_eq!(last["choices"], json!([]), "{path}: {last}");
        assert_eq!(last["usage"]["completion_tokens"], n, "{path}: {last}");
    }
    let responses = json!({"model": MODEL, "stream": true, "max_output_tokens": n,
        "stop": null, "ignore_eos": true,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "a b c d"}]}]});
    let raw = post_raw(s.addr, "/v1/responses", &responses);
    let done = sse(&raw)
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .find(|e| e["type"] == "response.incomplete")
        .unwrap_or_else(|| panic!("{raw}"));
    assert_eq!(done["response"]["usage"]["output_tokens"], n, "{done}");
}

#[test]
fn ignore_eos_generates_past_the_end_token() {
    let s = start(None);
    let files = encore_core::model::open_model(MODEL).unwrap();
    let tok = encore_core::model::open_tokenizer(&files.source).unwrap();
    let eos = tok.eos_token_ids()[0];
    // The end token made certain: it ends the text at once, unless `ignore_eos`.
    let bias = json!({ eos.to_string(): 100 });
    for (ignore, want) in [(false, 1), (true, 12)] {
        let b = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 12, "logit_bias": bias, "ignore_eos": ignore});
        let (st, v) = post(s.addr, "/v1/chat/completions", b);
        assert_eq!(st, 200, "{v}");
        assert_eq!(
            v["usage"]["completion_tokens"], want,
            "ignore_eos {ignore}: {v}"
        );
    }
    // Responses, without a length: to the context's end.
    let b = json!({"model": MODEL, "input": "hi", "ignore_eos": true});
    let (st, r) = post(s.addr, "/v1/responses", b);
    assert_eq!(st, 200, "{r}");
    let ctx = s.engine.max_seq_len as u64;
    let prompt = r["usage"]["input_tokens"].as_u64().unwrap();
    assert_eq!(
        r["usage"]["output_tokens"].as_u64(),
        Some(ctx - prompt),
        "{r}"
    );
}

#[test]
fn the_anthropic_sdks_own_blocks_go_back_as_it_dumps_them() {
    let s = start_parsers(None, None);
    let tools = json!([{"name": "get_weather", "description": "Weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    // `[b.model_dump() for b in message.content]` of the anthropic SDK (2.14): a
    // `redacted_thinking` block, a text block's `citations: null`, and a `tool_use`
    // block's `caller` and `toolset_name` as null.
    let dumped = json!([
        {"signature": "", "thinking": "hmm", "type": "thinking"},
        {"data": "abc", "type": "redacted_thinking"},
        {"citations": null, "text": "Let me check.", "type": "text"},
        {"id": "toolu_1", "caller": null, "input": {"city": "Paris"}, "name": "get_weather",
         "type": "tool_use", "toolset_name": null},
    ]);
    let conversation = |assistant: Value| {
        json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": assistant},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                          "content": "22C"}]},
        ])
    };
    let b = json!({"model": MODEL, "max_tokens": 4, "tools": tools,
                   "messages": conversation(dumped.clone())});
    let (st, v) = post(s.addr, "/v1/messages", b);
    assert_eq!(st, 200, "{v}");
    // The redacted thinking is left out of the prompt: the same tokens as without it.
    let count = |assistant: Value| {
        let b = json!({"model": MODEL, "tools": tools, "messages": conversation(assistant)});
        let (st, v) = post(s.addr, "/v1/messages/count_tokens", b);
        assert_eq!(st, 200, "{v}");
        v["input_tokens"].as_u64().unwrap()
    };
    let mut without = dumped.clone();
    without.as_array_mut().unwrap().remove(1);
    assert_eq!(count(dumped.clone()), count(without));
    // A caller other than the model itself, and a toolset, are refused naming them.
    for (key, value, param) in [
        (
            "caller",
            json!({"type": "code_execution_20250825", "tool_id": "x"}),
            "messages[1].content[3].caller",
        ),
        (
            "toolset_name",
            json!("mcp"),
            "messages[1].content[3].toolset_name",
        ),
    ] {
        let mut blocks = dumped.clone();
        blocks[3][key] = value;
        let b = json!({"model": MODEL, "max_tokens": 4, "tools": tools,
                       "messages": conversation(blocks)});
        let (st, v) = post(s.addr, "/v1/messages", b);
        assert_eq!(st, 400, "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(param),
            "{v}"
        );
    }
}

/// pydantic's JSON schema of a nested model with an enum (`Person` holding an `Address`,
/// both a `Color`), as pydantic-ai sends it for its output tool (strict: closed objects).
fn person_schema() -> Value {
    json!({
        "$defs": {
            "Address": {"additionalProperties": false,
                        "properties": {"color": {"$ref": "#/$defs/Color"},
                                       "big": {"title": "Big", "type": "boolean"}},
                        "required": ["color", "big"], "title": "Address", "type": "object"},
            "Color": {"enum": ["red", "green"], "title": "Color", "type": "string"},
        },
        "additionalProperties": false,
        "properties": {"color": {"$ref": "#/$defs/Color"},
                       "address": {"$ref": "#/$defs/Address"},
                       "tall": {"title": "Tall", "type": "boolean"}},
        "required": ["color", "address", "tall"], "title": "Person", "type": "object",
    })
}

/// Whether `args` are a `Person` of [`person_schema`].
fn check_person(args: &Value) {
    let colors = [json!("red"), json!("green")];
    assert!(colors.contains(&args["color"]), "{args}");
    assert!(colors.contains(&args["address"]["color"]), "{args}");
    assert!(
        args["address"]["big"].is_boolean() && args["tall"].is_boolean(),
        "{args}"
    );
}

#[test]
fn pydantic_ais_structured_output_with_nested_models_is_forced() {
    let s = start_parsers(None, None);
    // pydantic-ai's `Agent(model, output_type=Person).run_sync(...)`: one output tool,
    // `tool_choice` `required` (the OpenAI chat model) or `any` (the Anthropic one).
    let tool = json!({"type": "function", "function": {"name": "final_result",
        "description": "The final response which ends this conversation",
        "parameters": person_schema(), "strict": true}});
    let b = json!({"messages": [{"role": "user", "content": "Describe a person."}],
        "model": MODEL, "n": 1, "stream": false, "tool_choice": "required", "tools": [tool]});
    let (st, v) = post(s.addr, "/v1/chat/completions", b);
    assert_eq!(st, 200, "{v}");
    let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "final_result", "{v}");
    check_person(&serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap());
    let b = json!({"max_tokens": 1024, "messages": [{"role": "user", "content": "Describe a person."}],
        "model": MODEL, "stream": false, "tool_choice": {"type": "any"},
        "tools": [{"name": "final_result",
                   "description": "The final response which ends this conversation",
                   "input_schema": person_schema()}]});
    let (st, v) = post(s.addr, "/v1/messages", b);
    assert_eq!(st, 200, "{v}");
    let block = v["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(block["name"], "final_result", "{v}");
    check_person(&block["input"]);
}

#[test]
fn a_format_beside_a_forced_call_leaves_the_call_to_its_tool() {
    let s = start_parsers(None, None);
    // The openai client's `responses.parse(text_format=Person, tools=..., tool_choice=...)`
    // as instructor's responses-tools mode sends it: `text.format` and a forced call.
    let mut person = person_schema();
    person["properties"]
        .as_object_mut()
        .unwrap()
        .remove("address");
    person["required"] = json!(["color", "tall"]);
    let format = json!({"type": "json_schema", "strict": true, "name": "Person",
                        "schema": person});
    let b = json!({"model": MODEL, "input": [{"role": "user", "content": "q"}],
        "text": {"format": format}, "tool_choice": {"type": "function", "name": "Person"},
        "tools": [{"type": "function", "name": "Person", "parameters": person}]});
    let (st, r) = post(s.addr, "/v1/responses", b);
    assert_eq!(st, 200, "{r}");
    let call = r["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["type"] == "function_call")
        .unwrap_or_else(|| panic!("{r}"));
    assert_eq!(call["name"], "Person");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(args["tall"].is_boolean(), "{args}");
    // `chat.completions.parse(response_format=Person, tools=[...], tool_choice=...)`.
    let b = json!({"model": MODEL, "stream": false,
        "messages": [{"role": "user", "content": "q"}],
        "response_format": {"type": "json_schema",
                            "json_schema": {"schema": person, "name": "Person", "strict": true}},
        "tool_choice": {"type": "function", "function": {"name": "Person"}},
        "tools": [{"type": "function",
                   "function": {"name": "Person", "strict": true, "parameters": person}}]});
    let (st, v) = post(s.addr, "/v1/chat/completions", b.clone());
    assert_eq!(st, 200, "{v}");
    let args = &v["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"];
    let args: Value = serde_json::from_str(args.as_str().unwrap()).unwrap();
    assert!(args["tall"].is_boolean(), "{args}");
    // `required` likewise; Anthropic's `output_config.format` with `any` too.
    let mut b = b;
    b["tool_choice"] = json!("required");
    let (st, v) = post(s.addr, "/v1/chat/completions", b);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    let b = json!({"model": MODEL, "max_tokens": 200,
        "messages": [{"role": "user", "content": "q"}],
        "output_config": {"format": {"type": "json_schema", "schema": person}},
        "tool_choice": {"type": "any"},
        "tools": [{"name": "Person", "input_schema": person}]});
    let (st, v) = post(s.addr, "/v1/messages", b);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["stop_reason"], "tool_use", "{v}");
}

#[test]
fn a_burst_gets_no_more_places_than_the_queue_has() {
    // 2 running and 2 waiting at most; 10 clients at once.
    let s = start_queue(2, 2);
    let addr = s.addr;
    let gate = std::sync::Arc::new(std::sync::Barrier::new(10));
    let clients: Vec<_> = (0..10)
        .map(|_| {
            let gate = std::sync::Arc::clone(&gate);
            std::thread::spawn(move || {
                let b = json!({"model": MODEL, "prompt": "hi", "max_tokens": 300,
                               "ignore_eos": true})
                .to_string();
                gate.wait();
                http(addr, "POST", "/v1/completions", Some(&b), &[])
            })
        })
        .collect();
    let answers: Vec<(u16, String)> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let served = answers.iter().filter(|(st, _)| *st == 200).count();
    let full = answers.iter().filter(|(st, _)| *st == 503).count();
    let statuses: Vec<u16> = answers.iter().map(|(st, _)| *st).collect();
    assert_eq!((served, full), (4, 6), "{statuses:?}");
    for (_, b) in answers.iter().filter(|(st, _)| *st == 503) {
        assert!(b.contains("at capacity"), "{b}");
    }
    // Once they ended, the places are free again.
    let (st, b) = http(
        addr,
        "POST",
        "/v1/completions",
        Some(&json!({"model": MODEL, "prompt": "hi", "max_tokens": 2}).to_string()),
        &[],
    );
    assert_eq!(st, 200, "{b}");
}

/// What the server logs at `info` and above, from every test of this binary (a global
/// subscriber: the server's runtime threads are not the test's).
fn server_log() -> &'static std::sync::Mutex<Vec<u8>> {
    use std::sync::{Mutex, OnceLock};
    static LOG: OnceLock<&'static Mutex<Vec<u8>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let log: &'static Mutex<Vec<u8>> = Box::leak(Box::new(Mutex::new(Vec::new())));
        struct Sink(&'static Mutex<Vec<u8>>);
        impl std::io::Write for Sink {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || Sink(log))
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one subscriber");
        log
    })
}

/// Send `body` to `path` on a connection of its own; its client address and status.
fn from_client(addr: std::net::SocketAddr, path: &str, body: &str) -> (String, u16) {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    let me = c.local_addr().unwrap().to_string();
    write!(
        c,
        "POST {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    c.read_to_string(&mut raw).unwrap();
    let status = raw.split(' ').nth(1).unwrap().parse().unwrap();
    (me, status)
}

#[test]
fn every_refusal_is_logged_with_its_route_field_and_client_not_its_body() {
    let log = server_log();
    let s = start(None);
    let secret = "hunter2-the-users-own-words";
    let cases = [
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": secret}],
                   "temprature": 0.5}),
            "400 invalid_request_error, field temprature",
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": secret, "max_tokens": 100000}),
            "400 invalid_request_error, field max_tokens",
        ),
        (
            "/v1/messages",
            json!({"model": MODEL, "max_tokens": 5, "system": 7,
                   "messages": [{"role": "user", "content": secret}]}),
            "400 invalid_request_error, field system",
        ),
        (
            "/v1/embeddings",
            json!({"model": MODEL, "input": secret}),
            "404 invalid_request_error, field -",
        ),
    ];
    for (path, body, want) in cases {
        let (client, status) = from_client(s.addr, path, &body.to_string());
        assert!((400..500).contains(&status), "{path}: {status}");
        let line = format!("refused POST {path} from {client}: {want}");
        let t = std::time::Instant::now();
        loop {
            let text = String::from_utf8_lossy(&log.lock().unwrap()).to_string();
            if let Some(l) = text.lines().find(|l| l.contains(&line)) {
                assert!(l.contains(" INFO "), "{l}");
                break;
            }
            assert!(t.elapsed().as_secs() < 10, "no `{line}` in:\n{text}");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    let text = String::from_utf8_lossy(&log.lock().unwrap()).to_string();
    assert!(
        !text.contains(secret),
        "the log holds a request body:\n{text}"
    );
}

#[test]
fn prompt_scoring_as_lm_evaluation_harness_does_it() {
    let s = start(None);
    let (_, t) = post(
        s.addr,
        "/tokenize",
        json!({"prompt": "The cat sat on the mat"}),
    );
    let ids: Vec<u64> = serde_json::from_value(t["tokens"].clone()).unwrap();
    let k = ids.len();
    // vLLM's `max_tokens: 0` with `echo`: the prompt alone, each token after the first
    // scored (a text prompt, as scoring scripts send it).
    let b = json!({"model": MODEL, "prompt": "The cat sat on the mat", "max_tokens": 0,
                   "echo": true, "logprobs": 2, "temperature": 0.0});
    let (st, v) = post(s.addr, "/v1/completions", b);
    assert_eq!(st, 200, "{v}");
    let c = &v["choices"][0];
    assert_eq!(c["text"], "The cat sat on the mat", "{v}");
    assert_eq!(c["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 0, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], k, "{v}");
    let lp = &c["logprobs"];
    let scores = lp["token_logprobs"].as_array().unwrap().clone();
    assert_eq!(scores.len(), k, "{lp}");
    assert!(
        scores[0].is_null() && scores[1..].iter().all(Value::is_f64),
        "{lp}"
    );
    assert_eq!(lp["tokens"].as_array().unwrap().len(), k);
    assert_eq!(lp["text_offset"][0], 0);
    assert!(lp["top_logprobs"][0].is_null(), "{lp}");
    assert!(
        lp["top_logprobs"][1].as_object().unwrap().len() <= 2,
        "{lp}"
    );
    // lm-evaluation-harness's `local-completions` loglikelihood request: token ids in a
    // batch (here of two), `max_tokens: 1`, `logprobs: 1`, `echo`; it reads
    // `token_logprobs[ctxlen:-1]` of each choice, by `index`.
    let half: Vec<u64> = ids[..k - 2].to_vec();
    let b = json!({"model": MODEL, "prompt": [ids, half], "temperature": 0, "max_tokens": 1,
                   "logprobs": 1, "seed": 1234, "echo": true});
    let (st, v) = post(s.addr, "/v1/completions", b);
    assert_eq!(st, 200, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2, "{v}");
    for (i, len) in [(0, k), (1, k - 2)] {
        let c = choices.iter().find(|c| c["index"] == i).unwrap();
        let got = c["logprobs"]["token_logprobs"].as_array().unwrap();
        // The prompt's tokens, then the one generated.
        assert_eq!(got.len(), len + 1, "{c}");
        assert_eq!(
            c["logprobs"]["top_logprobs"].as_array().unwrap().len(),
            len + 1
        );
        // The same scores as the prompt alone.
        for (a, b) in got[1..len].iter().zip(&scores[1..len]) {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }
    assert_eq!(v["usage"]["prompt_tokens"], 2 * k - 2, "{v}");
    // Streamed, `max_tokens: 0` is one chunk: the prompt and its scores.
    let b = json!({"model": MODEL, "prompt": "The cat sat on the mat", "max_tokens": 0,
                   "echo": true, "logprobs": 0, "stream": true});
    let all = chunks(&post_raw(s.addr, "/v1/completions", &b));
    assert_eq!(all.len(), 1, "{all:?}");
    let c = &all[0]["choices"][0];
    assert_eq!(c["text"], "The cat sat on the mat");
    assert_eq!(c["finish_reason"], "length");
    assert_eq!(c["logprobs"]["token_logprobs"].as_array().unwrap().len(), k);
    // Without `echo`, `max_tokens: 0` asks for nothing.
    let b = json!({"model": MODEL, "prompt": "hi", "max_tokens": 0});
    let (st, v) = post(s.addr, "/v1/completions", b);
    assert_eq!(
        (st, &v["error"]["param"]),
        (400, &json!("max_tokens")),
        "{v}"
    );
    // A batch of texts with `n`: choice `i * n + j` is sample `j` of prompt `i`.
    let b = json!({"model": MODEL, "prompt": ["hi", "there"], "max_tokens": 2, "n": 2,
                   "echo": true});
    let (st, v) = post(s.addr, "/v1/completions", b);
    assert_eq!(st, 200, "{v}");
    let texts: Vec<(u64, bool)> = v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let i = c["index"].as_u64().unwrap();
            let want = if i < 2 { "hi" } else { "there" };
            (i, c["text"].as_str().unwrap().starts_with(want))
        })
        .collect();
    assert_eq!(texts, [(0, true), (1, true), (2, true), (3, true)], "{v}");
    // A batch does not stream yet: refused naming `prompt`.
    let b = json!({"model": MODEL, "prompt": ["a", "b"], "stream": true});
    let (st, v) = post(s.addr, "/v1/completions", b);
    assert_eq!((st, &v["error"]["param"]), (400, &json!("prompt")), "{v}");
}

/// A chat template that renders no tools (as many small models' do).
const PLAIN_TEMPLATE: &str = "{% for message in messages %}<|{{ message.role }}|>\n\
    {{ message.content }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}";

#[test]
fn a_template_without_tools_gets_the_generic_tool_prompt() {
    let s = start_template(PLAIN_TEMPLATE);
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string",
            "enum": ["Paris", "Rome"]}}, "required": ["city"], "additionalProperties": false}}}]);
    // The openai client's second turn: the call it got and its result sent back.
    let messages = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"content": null, "refusal": null, "role": "assistant", "tool_calls": [{"id": "call_1",
            "function": {"arguments": "{\"city\": \"Paris\"}", "name": "get_weather"},
            "type": "function"}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22 C and sunny"},
    ]);
    let prompt = |body: Value| {
        let (st, v) = post(s.addr, "/tokenize", body);
        assert_eq!(st, 200, "{v}");
        let (_, d) = post(s.addr, "/detokenize", json!({"tokens": v["tokens"]}));
        d["prompt"].as_str().unwrap().to_string()
    };
    // Nothing is dropped: the tools, the call and its result are in the prompt, in the
    // generic shape.
    let text = prompt(json!({"messages": messages, "tools": tools}));
    assert!(text.starts_with("<|system|>\n# Tools"), "{text}");
    assert!(text.contains("\"name\":\"get_weather\""), "{text}");
    assert!(
        text.contains(
            "<|assistant|>\n[{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Paris\"}}]\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("<|user|>\nResult of the call call_1 (get_weather):\n22 C and sunny\n"),
        "{text}"
    );
    // The history alone, without `tools`, too.
    let text = prompt(json!({"messages": messages}));
    assert!(
        !text.contains("# Tools") && text.contains("22 C and sunny"),
        "{text}"
    );
    assert!(
        text.contains("\"parameters\":{\"city\":\"Paris\"}"),
        "{text}"
    );
    // A forced call is made through the generic prompt and read as usual.
    let b = json!({"model": MODEL, "messages": [{"role": "user", "content": "Weather?"}],
                   "tools": tools, "tool_choice": "required", "max_tokens": 100});
    let (st, v) = post(s.addr, "/v1/chat/completions", b);
    assert_eq!(st, 200, "{v}");
    let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{v}");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"] == "Paris" || args["city"] == "Rome", "{args}");
    // The conversation goes on.
    let b = json!({"model": MODEL, "messages": messages, "tools": tools,
                   "tool_choice": "none", "max_tokens": 3});
    let (st, v) = post(s.addr, "/v1/chat/completions", b);
    assert_eq!(st, 200, "{v}");
    // `auto`: the model answers freely; text that is no list of calls is the answer
    // (the list is read as calls: `parse.rs`'s generic_answers_are_calls_or_text).
    let b = json!({"model": MODEL, "messages": messages, "tools": tools, "max_tokens": 3});
    let (st, v) = post(s.addr, "/v1/chat/completions", b);
    assert_eq!(st, 200, "{v}");
    let m = &v["choices"][0]["message"];
    assert!(
        m["tool_calls"].is_null() || m["tool_calls"].is_array(),
        "{v}"
    );
}

#[test]
fn vllms_extensions_are_honored_or_refused_by_name() {
    let s = start(None);
    let base = |path: &str| match path {
        "/v1/completions" => json!({"model": MODEL, "prompt": "hi", "max_tokens": 2}),
        _ => json!({"model": MODEL, "max_tokens": 2,
                    "messages": [{"role": "user", "content": "hi"}]}),
    };
    for path in ["/v1/completions", "/v1/chat/completions"] {
        // Their defaults change nothing and are accepted, as `ignore_eos` is honored.
        let mut b = base(path);
        for (k, v) in [
            ("min_tokens", json!(0)),
            ("return_token_ids", json!(false)),
            ("prompt_logprobs", json!(null)),
            ("skip_special_tokens", json!(true)),
            ("spaces_between_special_tokens", json!(true)),
            ("truncate_prompt_tokens", json!(null)),
            ("ignore_eos", json!(true)),
        ] {
            b[k] = v;
        }
        let (st, v) = post(s.addr, path, b);
        assert_eq!(st, 200, "{path}: {v}");
        // The rest is refused naming the field, saying it is vLLM's.
        for (k, v) in [
            ("min_tokens", json!(4)),
            ("return_token_ids", json!(true)),
            ("prompt_logprobs", json!(1)),
            ("skip_special_tokens", json!(false)),
            ("spaces_between_special_tokens", json!(false)),
            ("truncate_prompt_tokens", json!(100)),
        ] {
            let mut b = base(path);
            b[k] = v;
            let (st, v) = post(s.addr, path, b);
            assert_eq!((st, &v["error"]["param"]), (400, &json!(k)), "{path}: {v}");
            let m = v["error"]["message"].as_str().unwrap();
            assert!(m.contains(k) && m.contains("vLLM"), "{m}");
        }
    }
}
