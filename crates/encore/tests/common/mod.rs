//! What the `encore` binary's end-to-end tests share: running the binary (with
//! arguments, standard input or a closed pipe), reading its output (text, JSON lines, a
//! failure's stderr), fresh temporary files, and `encore serve` on a loopback port.
//!
//! Each test file includes it with `mod common;` and uses a part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The `encore` binary with `args`, logging only errors.
pub fn command(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_encore"));
    c.args(args).env("ENCORE_LOG", "error");
    c
}

/// Run `encore` with `args` to the end.
pub fn encore(args: &[&str]) -> Output {
    command(args).output().expect("run encore")
}

/// Run `encore` with `input` on standard input.
pub fn encore_with_stdin(args: &[&str], input: &str) -> Output {
    let mut child = command(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run encore");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Bytes as text (invalid UTF-8 replaced).
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The stdout of a successful run.
pub fn success(out: &Output) -> String {
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

/// The JSON lines of a successful run.
pub fn json_lines(out: &Output) -> Vec<Value> {
    success(out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A failed run whose stderr says no panic happened; returns stderr.
pub fn failure(out: &Output) -> String {
    let err = text(&out.stderr);
    assert!(!out.status.success(), "expected a failure; stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

/// A fresh directory under the system's temp dir for this test.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("encore-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A file under the system's temp dir holding `body`.
pub fn temp_file(name: &str, body: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("encore-cli-{}-{name}", std::process::id()));
    std::fs::write(&p, body).unwrap();
    p
}

/// A running `encore serve`; killed if still running when dropped.
pub struct Serve {
    pub child: Child,
    pub addr: SocketAddr,
    /// Its stderr lines before the address line.
    pub before: Vec<String>,
    /// Its stderr lines after the address line.
    pub stderr: Receiver<String>,
}

impl Serve {
    /// `encore serve` with `args` (add `--port 0`), once it printed the address it
    /// listens on (within `limit`).
    pub fn start(args: &[&str], limit: Duration) -> Serve {
        let mut child = command(&[&["serve"][..], args].concat())
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
        let mut before = Vec::new();
        let addr = loop {
            let line = match rx.recv_timeout(limit.saturating_sub(t.elapsed())) {
                Ok(line) => line,
                Err(_) => panic!("encore serve printed no address: {before:?}"),
            };
            // serving `NAME` on http://ADDR (...)
            if let Some(rest) = line.split(" on http://").nth(1) {
                let a = rest.split_whitespace().next().unwrap();
                break a
                    .parse()
                    .unwrap_or_else(|_| panic!("bad address in {line:?}"));
            }
            before.push(line);
        };
        Serve {
            child,
            addr,
            before,
            stderr: rx,
        }
    }

    /// Send `sig` (e.g. `-TERM`) to the process.
    pub fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success(), "kill {sig} failed");
    }

    /// Waits for the process to exit (at most `limit`); returns its status and stderr.
    pub fn wait(mut self, limit: Duration) -> (ExitStatus, String) {
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

/// `encore bench CMD --device cpu` with `args`.
pub fn bench_on_cpu(cmd: &str, args: &[&str]) -> Output {
    encore(&[&["bench", cmd, "--device", "cpu"][..], args].concat())
}

/// The real SmolLM2 GGUF (`ENCORE_SMOLLM2_GGUF`, as `.ci/run` sets it), or `None` (the
/// test says so and passes) unless `ENCORE_REQUIRE_SMOLLM2=1` (CI), where its absence
/// fails.
pub fn smollm2_gguf() -> Option<PathBuf> {
    let Some(gguf) = std::env::var_os("ENCORE_SMOLLM2_GGUF") else {
        assert!(
            std::env::var("ENCORE_REQUIRE_SMOLLM2").as_deref() != Ok("1"),
            "ENCORE_REQUIRE_SMOLLM2=1 but ENCORE_SMOLLM2_GGUF is not set"
        );
        eprintln!("skipped: set ENCORE_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf");
        return None;
    };
    Some(PathBuf::from(gguf))
}

/// The value of the Prometheus sample `name` (a metric name, with its labels if any) in
/// `/metrics` text `metrics`; panics naming it when absent.
pub fn metric(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} not in {metrics}"))
        .parse()
        .unwrap()
}

/// One request on its own connection; returns (status, body with chunking undone).
pub fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
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
