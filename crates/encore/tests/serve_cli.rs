//! `encore serve` end to end: the real binary on a loopback port (port 0, the address read
//! from its stderr line), driven over HTTP. SIGTERM with requests in flight lets them
//! finish and exits 0; with `--shutdown-timeout 0` they are cut off and it still exits 0;
//! the official `openai` Python client gets the greedy text of `encore generate`.
//!
//! The client test needs a python with `openai` installed (`scripts/ci-venv.sh` makes one
//! and `.ci/run` sets `ENCORE_OPENAI_PYTHON` to it). Without it the test says so and passes,
//! unless `ENCORE_REQUIRE_OPENAI=1` (CI), where that is a failure.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const MODEL: &str = "dummy:tiny";

/// A running `encore serve`; killed if still running when dropped.
struct Serve {
    child: Child,
    addr: SocketAddr,
    /// Its stderr lines after the address line.
    stderr: Receiver<String>,
}

impl Serve {
    fn start(extra: &[&str]) -> Serve {
        let mut child = Command::new(env!("CARGO_BIN_EXE_encore"))
            .args([
                "serve",
                "--model",
                MODEL,
                "--device",
                "cpu",
                "--dtype",
                "f32",
                "--port",
                "0",
                "--max-num-seqs",
                "8",
            ])
            .args(extra)
            .env("ENCORE_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run encore serve");
        let (tx, rx) = mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let t = Instant::now();
        let addr = loop {
            let line = rx
                .recv_timeout(Duration::from_secs(120).saturating_sub(t.elapsed()))
                .expect("encore serve printed no address");
            // serving `NAME` on http://ADDR (...)
            if let Some(rest) = line.split(" on http://").nth(1) {
                let a = rest.split_whitespace().next().unwrap();
                break a
                    .parse()
                    .unwrap_or_else(|_| panic!("bad address in {line:?}"));
            }
        };
        Serve {
            child,
            addr,
            stderr: rx,
        }
    }

    fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success(), "kill {sig} failed");
    }

    /// Waits for the process to exit (at most `limit`); returns its status and stderr.
    fn wait(mut self, limit: Duration) -> (ExitStatus, String) {
        let t = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                let mut err = String::new();
                while let Ok(l) = self.stderr.recv_timeout(Duration::from_secs(5)) {
                    err.push_str(&l);
                    err.push('\n');
                }
                return (st, err);
            }
            assert!(t.elapsed() < limit, "encore serve did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request on its own connection; returns (status, body with chunking undone).
fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let b = body.map(Value::to_string).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
        b.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, rest.to_string())
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

fn long_request(i: usize, n: usize) -> Value {
    json!({"model": MODEL, "prompt": format!("a long story, part {i}"), "max_tokens": n,
           "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}})
}

#[test]
fn sigterm_lets_requests_in_flight_finish_and_exits_0() {
    let s = Serve::start(&[]);
    let n = 600;
    let streams: Vec<_> = (0..3)
        .map(|i| open_stream(s.addr, long_request(i, n)))
        .collect();
    s.signal("-TERM");
    for (i, h) in streams.into_iter().enumerate() {
        let events = h.join().unwrap();
        assert_eq!(
            events.last().map(String::as_str),
            Some("[DONE]"),
            "stream {i}"
        );
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
    let s = Serve::start(&["--shutdown-timeout", "0"]);
    let n = 2000;
    let streams: Vec<_> = (0..2)
        .map(|i| open_stream(s.addr, long_request(i, n)))
        .collect();
    s.signal("-INT");
    for (i, h) in streams.into_iter().enumerate() {
        let events = h.join().unwrap();
        assert_eq!(
            events.last().map(String::as_str),
            Some("[DONE]"),
            "stream {i}"
        );
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
        let out = Command::new(env!("CARGO_BIN_EXE_encore"))
            .args(["serve", "--device", "cpu", "--shutdown-timeout", bad])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--shutdown-timeout {bad} accepted");
        assert!(err.contains("--shutdown-timeout"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// The python to run the `openai` client with, or `None` (skip) when there is none and
/// it is not required.
fn openai_python() -> Option<PathBuf> {
    let required = std::env::var("ENCORE_REQUIRE_OPENAI").as_deref() == Ok("1");
    let py = std::env::var_os("ENCORE_OPENAI_PYTHON").map(PathBuf::from);
    let usable = py.as_ref().is_some_and(|p| {
        Command::new(p)
            .args(["-c", "import openai"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if usable {
        return py;
    }
    assert!(
        !required,
        "ENCORE_REQUIRE_OPENAI=1 but ENCORE_OPENAI_PYTHON ({py:?}) is not a python with `openai`"
    );
    eprintln!(
        "skipped: set ENCORE_OPENAI_PYTHON to a python with the `openai` package \
         (scripts/ci-venv.sh makes one)"
    );
    None
}

/// `encore generate`'s greedy text for `prompt` (`--chat`: through the chat template).
fn generate_text(prompt: &str, max_tokens: usize, chat: bool) -> String {
    let n = max_tokens.to_string();
    let mut args = vec![
        "generate",
        "--model",
        MODEL,
        "--device",
        "cpu",
        "--dtype",
        "f32",
        "--prompt",
        prompt,
        "--max-tokens",
        &n,
        "--ignore-eos",
        "--json",
    ];
    if chat {
        args.push("--chat");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_encore"))
        .args(&args)
        .env("ENCORE_LOG", "error")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
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
    let s = Serve::start(&["--api-key", "sekret"]);
    let dir = std::env::temp_dir().join(format!("encore-openai-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("case.json");
    let case = json!({
        "base_url": format!("http://{}/v1", s.addr), "api_key": "sekret", "model": MODEL,
        "prompt": prompt, "max_tokens": n,
        "completion_text": completion_text, "chat_text": chat_text,
    });
    std::fs::write(&cfg, case.to_string()).unwrap();
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/openai_client_test.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(&cfg)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&out.stdout).trim());
    // The server is still healthy after the client's requests and errors.
    assert_eq!(http(s.addr, "GET", "/health", None).0, 200);
    s.signal("-TERM");
    let (st, err) = s.wait(Duration::from_secs(60));
    assert!(st.success(), "exit {st}: {err}");
}
