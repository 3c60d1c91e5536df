//! `encore serve` end to end: the real binary on a loopback port (port 0, the address read
//! from its stderr line), driven over HTTP. SIGTERM with requests in flight lets them
//! finish and exits 0; with `--shutdown-timeout 0` they are cut off and it still exits 0;
//! the official `openai` Python client gets the greedy text of `encore generate`.
//!
//! The official `openai` and `anthropic` clients drive `/v1/responses` and `/v1/messages`
//! (scripts/agent_clients_test.py), on `dummy:tiny` and on the real SmolLM2 GGUF.
//!
//! The client tests need a python with `openai`, `anthropic` and `jsonschema` installed
//! (`scripts/ci-venv.sh` makes one and `.ci/run` sets `ENCORE_OPENAI_PYTHON` to it). Without
//! it the tests say so and pass, unless `ENCORE_REQUIRE_OPENAI=1` (CI), where that is a
//! failure.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use common::{encore, failure, http, success, Serve};
use serde_json::{json, Value};

const MODEL: &str = "dummy:tiny";

/// [`MODEL`] on the CPU in f32: the flags `serve` and `generate` share here.
const CPU_F32: [&str; 6] = ["--model", MODEL, "--device", "cpu", "--dtype", "f32"];

/// `encore serve` of [`MODEL`] on the CPU in f32 on any free port, at most 8 sequences
/// a step, with `extra` flags.
fn start(extra: &[&str]) -> Serve {
    let args = ["--port", "0", "--max-num-seqs", "8"];
    Serve::start(
        &[&CPU_F32[..], &args, extra].concat(),
        Duration::from_secs(120),
    )
}

/// A streaming completion on its own connection, read on a thread; returns once its
/// first event arrived. The thread answers the `data:` payloads.
fn open_stream(addr: SocketAddr, body: Value) -> JoinHandle<Vec<String>> {
    let (first_tx, first_rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let b = body.to_string();
        write!(
            c,
            "POST /v1/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        )
        .unwrap();
        let mut r = BufReader::new(c);
        let mut events = Vec::new();
        let mut line = String::new();
        while r.read_line(&mut line).unwrap_or(0) > 0 {
            if let Some(d) = line.trim_end().strip_prefix("data: ") {
                if events.is_empty() {
                    let _ = first_tx.send(());
                }
                events.push(d.to_string());
            }
            line.clear();
        }
        events
    });
    first_rx
        .recv_timeout(Duration::from_secs(120))
        .expect("no first event");
    h
}

/// Open `streams` streams of `max_tokens` tokens each, send `sig` to the server once
/// each has its first event, and return the events of every stream, each checked to end
/// with `[DONE]`.
fn signalled(s: &Serve, streams: usize, max_tokens: usize, sig: &str) -> Vec<Vec<String>> {
    let streams: Vec<JoinHandle<Vec<String>>> = (0..streams)
        .map(|i| open_stream(s.addr, long_request(i, max_tokens)))
        .collect();
    s.signal(sig);
    streams
        .into_iter()
        .enumerate()
        .map(|(i, h)| {
            let events = h.join().unwrap();
            assert_eq!(
                events.last().map(String::as_str),
                Some("[DONE]"),
                "stream {i}"
            );
            events
        })
        .collect()
}

fn long_request(i: usize, n: usize) -> Value {
    json!({"model": MODEL, "prompt": format!("a long story, part {i}"), "max_tokens": n,
           "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}})
}

#[test]
fn sigterm_lets_requests_in_flight_finish_and_exits_0() {
    let s = start(&[]);
    let n = 600;
    for (i, events) in signalled(&s, 3, n, "-TERM").iter().enumerate() {
        let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
        assert_eq!(usage["usage"]["completion_tokens"], n, "stream {i}");
    }
    let (st, err) = s.wait(Duration::from_secs(60));
    assert!(st.success(), "exit {st}: {err}");
    assert!(err.contains("SIGTERM: shutting down"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn sigint_past_the_shutdown_timeout_cuts_requests_off_and_exits_0() {
    let s = start(&["--shutdown-timeout", "0"]);
    let n = 2000;
    for (i, events) in signalled(&s, 2, n, "-INT").iter().enumerate() {
        let err: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
        assert!(
            err["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("shutting down")),
            "stream {i}: {err}"
        );
        assert!(events.len() < n + 2, "stream {i} was not cut off");
    }
    let (st, err) = s.wait(Duration::from_secs(60));
    assert!(st.success(), "exit {st}: {err}");
    assert!(err.contains("SIGINT: shutting down"), "{err}");
}

#[test]
fn a_bad_shutdown_timeout_names_the_flag() {
    for bad in ["-1", "x", "86401"] {
        let err = failure(&encore(&[
            "serve",
            "--device",
            "cpu",
            "--shutdown-timeout",
            bad,
        ]));
        assert!(err.contains("--shutdown-timeout"), "{bad}: {err}");
    }
}

/// The python to run the `openai` client with, or `None` (skip) when there is none and
/// it is not required.
fn openai_python() -> Option<PathBuf> {
    python_with("openai")
}

/// The python to run the clients with, with the `modules` (`import` syntax), or `None`
/// (skip) when there is none and it is not required.
fn python_with(modules: &str) -> Option<PathBuf> {
    let required = std::env::var("ENCORE_REQUIRE_OPENAI").as_deref() == Ok("1");
    let py = std::env::var_os("ENCORE_OPENAI_PYTHON").map(PathBuf::from);
    let usable = py.as_ref().is_some_and(|p| {
        Command::new(p)
            .args(["-c", &format!("import {modules}")])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if usable {
        return py;
    }
    assert!(
        !required,
        "ENCORE_REQUIRE_OPENAI=1 but ENCORE_OPENAI_PYTHON ({py:?}) is not a python with {modules}"
    );
    eprintln!(
        "skipped: set ENCORE_OPENAI_PYTHON to a python with {modules} \
         (scripts/ci-venv.sh makes one)"
    );
    None
}

/// Run `scripts/{script}` with the JSON `case` (a file, its one argument); it must pass.
fn run_script(python: &PathBuf, script: &str, case: &Value) {
    let model = case["model"].as_str().unwrap_or_default();
    let dir = common::temp_dir(&format!("{script}-{model}"));
    let cfg = dir.join("case.json");
    std::fs::write(&cfg, case.to_string()).unwrap();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(script);
    let out = Command::new(python).arg(&path).arg(&cfg).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&out.stdout).trim());
}

/// Run scripts/agent_clients_test.py against the server at `addr` serving `model`.
fn agent_clients(python: &PathBuf, addr: SocketAddr, model: &str, case: Value) {
    let mut c = json!({"base_url": format!("http://{addr}"), "api_key": "sekret", "model": model});
    for (k, v) in case.as_object().unwrap() {
        c[k] = v.clone();
    }
    run_script(python, "agent_clients_test.py", &c);
}

/// `/v1/responses` through the official `openai` client and `/v1/messages` through the
/// official `anthropic` client, on `dummy:tiny` (whose template renders tools: the tool
/// round trips too).
#[test]
fn the_agent_python_clients_work() {
    let Some(python) = python_with("openai, anthropic, jsonschema") else {
        return;
    };
    let s = start(&["--api-key", "sekret"]);
    let case = json!({"prompt": "stop strings, please", "max_tokens": 24, "tools": true,
                      "answer": null});
    agent_clients(&python, s.addr, MODEL, case);
    s.signal("-TERM");
    let (st, err) = s.wait(Duration::from_secs(60));
    assert!(st.success(), "exit {st}: {err}");
}

/// The same clients on the real SmolLM2 GGUF (`ENCORE_SMOLLM2_GGUF`, as `.ci/run` sets
/// it): the answers hold "Paris". Its template renders no tools.
#[test]
fn the_agent_python_clients_work_on_smollm2() {
    let Some(gguf) = common::smollm2_gguf() else {
        return;
    };
    let Some(python) = python_with("openai, anthropic, jsonschema") else {
        return;
    };
    let gguf = gguf.to_string_lossy().to_string();
    let s = Serve::start(
        &[
            "--model",
            &gguf,
            "--device",
            "cpu",
            "--served-model-name",
            "smollm2",
            "--port",
            "0",
            "--api-key",
            "sekret",
            "--max-num-seqs",
            "4",
        ],
        Duration::from_secs(300),
    );
    let case = json!({"prompt": "What is the capital of France?", "max_tokens": 24,
                      "tools": false, "answer": "Paris"});
    agent_clients(&python, s.addr, "smollm2", case);
    s.signal("-TERM");
    let (st, err) = s.wait(Duration::from_secs(60));
    assert!(st.success(), "exit {st}: {err}");
}

/// `encore generate`'s greedy text for `prompt` (`--chat`: through the chat template).
fn generate_text(prompt: &str, max_tokens: usize, chat: bool) -> String {
    let n = max_tokens.to_string();
    let mut args = vec!["generate"];
    args.extend(CPU_F32);
    args.extend([
        "--prompt",
        prompt,
        "--max-tokens",
        &n,
        "--ignore-eos",
        "--json",
    ]);
    if chat {
        args.push("--chat");
    }
    let v: Value = serde_json::from_str(&success(&encore(&args))).unwrap();
    v["text"].as_str().unwrap().to_string()
}

#[test]
fn the_openai_python_client_works() {
    let Some(python) = openai_python() else {
        return;
    };
    // A prompt whose greedy text (noise from random weights) has printable characters.
    let prompt = "stop strings, please";
    let n = 24;
    let completion_text = generate_text(prompt, n, false);
    let chat_text = generate_text(prompt, n, true);
    let s = start(&["--api-key", "sekret"]);
    let case = json!({
        "base_url": format!("http://{}/v1", s.addr), "api_key": "sekret", "model": MODEL,
        "prompt": prompt, "max_tokens": n,
        "completion_text": completion_text, "chat_text": chat_text,
    });
    run_script(&python, "openai_client_test.py", &case);
    // The server is still healthy after the client's requests and errors.
    assert_eq!(http(s.addr, "GET", "/health", None).0, 200);
    s.signal("-TERM");
    let (st, err) = s.wait(Duration::from_secs(60));
    assert!(st.success(), "exit {st}: {err}");
}

/// `serve --speculative-method ngram` (and `draft`) over a real server: completions
/// (greedy and seeded sampling, whole and streamed) equal those of a server without
/// speculation, and
/// `/metrics` counts drafts verified and kept, the draft model's steps and time, and verify
/// graphs replayed.
#[test]
fn ngram_speculation_serves_the_same_completions() {
    let bodies = [
        json!({"model": MODEL, "prompt": "abcabcabcabcabc", "max_tokens": 40, "ignore_eos": true,
               "temperature": 0}),
        json!({"model": MODEL, "prompt": "one two one two one two", "max_tokens": 40,
               "ignore_eos": true, "temperature": 0.8, "seed": 7}),
    ];
    let complete = |s: &Serve| -> Vec<String> {
        bodies
            .iter()
            .map(|b| {
                let (status, reply) = http(s.addr, "POST", "/v1/completions", Some(b));
                assert_eq!(status, 200, "{reply}");
                let v: Value = serde_json::from_str(&reply).unwrap();
                v["choices"][0]["text"].as_str().unwrap().to_string()
            })
            .collect()
    };
    let plain = complete(&start(&[]));
    // A draft model (the target itself) serves the same completions.
    let drafted = start(&[
        "--speculative-method",
        "draft",
        "--draft-model",
        MODEL,
        "--num-speculative-tokens",
        "3",
    ]);
    assert_eq!(complete(&drafted), plain);
    let (_, metrics) = http(drafted.addr, "GET", "/metrics", None);
    assert!(
        !metrics.contains("encore_spec_decode_num_accepted_tokens_total 0\n"),
        "{metrics}"
    );
    // The draft model's steps and time.
    assert!(
        common::metric(&metrics, "encore_spec_decode_draft_steps_total") > 0,
        "{metrics}"
    );
    assert!(
        metrics.contains("encore_spec_decode_draft_seconds_total ")
            && !metrics.contains("encore_spec_decode_draft_seconds_total 0\n"),
        "{metrics}"
    );
    let s = start(&[
        "--speculative-method",
        "ngram",
        "--num-speculative-tokens",
        "5",
    ]);
    assert_eq!(complete(&s), plain);
    let (status, metrics) = http(s.addr, "GET", "/metrics", None);
    assert_eq!(status, 200);
    let value = |name: &str| common::metric(&metrics, name);
    let drafts = value("encore_spec_decode_num_draft_tokens_total");
    let kept = value("encore_spec_decode_num_accepted_tokens_total");
    assert!(drafts > 0 && kept <= drafts, "{metrics}");
    assert!(
        value("encore_spec_decode_num_verifications_total") > 0,
        "{metrics}"
    );
    // Sequences whose drafts fail stop speculating for a while; the count is there.
    let _ = value("encore_spec_decode_num_pauses_total");
    // Verify steps replay their bucket's verify graph.
    assert!(
        value("encore_graph_replays_total{phase=\"verify\"}") > 0,
        "{metrics}"
    );
}
