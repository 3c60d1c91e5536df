//! `encore bench serve --url` against a real server on loopback (encore-server's router
//! over an engine loop with `dummy:tiny` on the CPU, in this process): every request of
//! a trace or of the length ranges completes with its token count, the report's fields
//! are there and sane, refusals (503) and error events count as failed requests with the
//! server's message, and a bad URL, an unreachable server or an unknown model are clear
//! errors.

mod common;

use std::net::SocketAddr;
use std::process::Output;
use std::sync::Arc;

use common::{command, failure, success, temp_file, text};
use encore_core::engine::{EngineConfig, KvSizing};
use encore_core::progress::NoProgress;
use encore_core::scheduler::SchedulerConfig;
use encore_core::serve::EngineHandle;
use encore_core::DType;
use encore_server::ServerConfig;
use serde_json::Value;

const MODEL: &str = "dummy:tiny";

/// A server on an ephemeral loopback port; the runtime lives as long as the value.
struct Server {
    url: String,
    engine: Arc<EngineHandle>,
    _rt: tokio::runtime::Runtime,
}

fn start(max_waiting: Option<usize>) -> Server {
    let engine = Arc::new(
        EngineHandle::start(
            Arc::new(encore_core::backend::cpu::CpuBackend::new()),
            encore_core::model::open_model(MODEL).unwrap(),
            EngineConfig::new(DType::F32, 16, 64, 8, 128, KvSizing::Blocks(1 + 8 * 8)),
            SchedulerConfig::new(64, 8),
            Box::new(NoProgress),
        )
        .unwrap(),
    );
    let files = encore_core::model::open_model(MODEL).unwrap();
    let tokenizer = Arc::new(encore_core::model::open_tokenizer(&files.source).unwrap());
    let app = encore_server::app(
        Arc::clone(&engine),
        tokenizer,
        ServerConfig {
            served_model_name: MODEL.into(),
            api_key: None,
            max_body_bytes: 64 * 1024,
            default_max_tokens: 16,
            max_waiting,
            tool_call_parser: None,
            reasoning_parser: None,
        },
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    rt.spawn(encore_server::serve(
        listener,
        app,
        std::future::pending(),
        std::time::Duration::ZERO,
    ));
    Server {
        url: format!("http://{addr}"),
        engine,
        _rt: rt,
    }
}

fn bench(url: &str, args: &[&str]) -> Output {
    command(&["bench", "serve", "--url", url, "--json"])
        .args(args)
        .env_remove("ENCORE_API_KEY")
        .output()
        .expect("run encore")
}

/// The report of a successful run.
fn report(out: &Output) -> Value {
    serde_json::from_str(success(out).trim()).unwrap()
}

fn assert_latencies(r: &Value) {
    for k in ["ttft_ms", "tpot_ms", "itl_ms"] {
        for q in ["mean", "p50", "p90", "p99"] {
            let v = r[k][q].as_f64().unwrap_or(-1.0);
            assert!(v > 0.0 && v < 60_000.0, "{k}.{q}: {r}");
        }
        assert!(r[k]["p50"].as_f64() <= r[k]["p99"].as_f64(), "{k}: {r}");
    }
    for k in [
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "duration_s",
    ] {
        assert!(r[k].as_f64().unwrap_or(0.0) > 0.0, "{k}: {r}");
    }
}

#[test]
fn a_trace_and_length_ranges_complete_with_their_token_counts() {
    let s = start(None);
    // Known lengths: ids, random prompts of a length, arrivals from timestamps.
    let trace = temp_file(
        "trace.jsonl",
        concat!(
            "{\"prompt\": [1, 2, 3, 4, 5], \"output_len\": 7, \"timestamp\": 0}\n",
            "{\"prompt_len\": 12, \"output_len\": 3, \"timestamp\": 0.05}\n",
            "{\"prompt_len\": 30, \"output_len\": 9, \"timestamp\": 0.05}\n",
            "{\"prompt_len\": 2, \"output_len\": 1, \"timestamp\": 0.1}\n",
            "{\"prompt_len\": 20, \"output_len\": 12, \"timestamp\": 0.2}\n",
        ),
    );
    let r = report(&bench(
        &s.url,
        &["--trace", trace.to_str().unwrap(), "--max-concurrency", "3"],
    ));
    assert_eq!(r["mode"], "url", "{r}");
    assert_eq!(r["model"], MODEL, "{r}");
    assert_eq!(r["request_rate"], "trace", "{r}");
    assert_eq!(r["num_prompts"], 5, "{r}");
    assert_eq!(r["completed"], 5, "{r}");
    assert_eq!(r["failed"], 0, "{r}");
    assert_eq!(r["input_tokens"], 5 + 12 + 30 + 2 + 20, "{r}");
    assert_eq!(r["output_tokens"], 7 + 3 + 9 + 1 + 12, "{r}");
    assert_eq!(r["input_len"], serde_json::json!([2, 30]), "{r}");
    // Sampled from /metrics while the run goes on: never above the concurrency limit.
    assert!(r["max_running"].as_u64().unwrap() <= 3, "{r}");
    assert!(r["steps"].as_u64().unwrap() >= 12, "{r}");
    assert_eq!(r["preemptions"], 0, "{r}");
    for k in ["ttft_ms", "itl_ms"] {
        assert!(r[k]["mean"].as_f64().unwrap() > 0.0, "{k}: {r}");
    }

    // Ranges, Poisson arrivals at a rate: 10 requests of 6 prompt and 5 output tokens.
    let r = report(&bench(
        &s.url,
        &[
            "--num-prompts",
            "10",
            "--input-len",
            "6",
            "--output-len",
            "5",
            "--request-rate",
            "200",
            "--seed",
            "4",
        ],
    ));
    assert_eq!(
        (r["completed"].as_u64(), r["failed"].as_u64()),
        (Some(10), Some(0)),
        "{r}"
    );
    assert_eq!(r["output_tokens"], 50, "{r}");
    assert_eq!(r["input_tokens"], 60, "{r}");
    assert_eq!(r["arrival"], "poisson", "{r}");
    assert_latencies(&r);

    // A shared prefix of 32 tokens (two 16-token blocks), one request at a time: the first
    // computes it, the 7 after it find it in the prefix cache.
    let r = report(&bench(
        &s.url,
        &[
            "--num-prompts",
            "8",
            "--input-len",
            "40",
            "--output-len",
            "2",
            "--shared-prefix-len",
            "32",
            "--max-concurrency",
            "1",
            "--seed",
            "5",
        ],
    ));
    assert_eq!(r["completed"], 8, "{r}");
    assert_eq!(r["shared_prefix_len"], 32, "{r}");
    assert_eq!(r["input_tokens"], 8 * 40, "{r}");
    let ratio = r["prefix_cache_hit_ratio"].as_f64().unwrap();
    assert!((ratio - 7.0 * 32.0 / 320.0).abs() < 1e-9, "{r}");

    // Every request was seen through: the engine holds no blocks and ran 23 requests. It
    // publishes its figures after the step that answered the last one, which the client
    // may see first: wait for them.
    let m = &s.engine.metrics;
    let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let t = std::time::Instant::now();
    while (load(&m.requests_finished_total), load(&m.kv_blocks_used)) != (23, 0)
        && t.elapsed() < std::time::Duration::from_secs(10)
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(load(&m.requests_finished_total), 23);
    assert_eq!(load(&m.kv_blocks_used), 0);
    let _ = std::fs::remove_file(trace);
}

#[test]
fn refused_requests_and_error_events_count_as_failed() {
    // Every request is refused with 503 while 0 may wait.
    let s = start(Some(0));
    let out = bench(
        &s.url,
        &[
            "--num-prompts",
            "4",
            "--input-len",
            "3",
            "--output-len",
            "2",
        ],
    );
    let r = report(&out);
    assert_eq!(
        (r["completed"].as_u64(), r["failed"].as_u64()),
        (Some(0), Some(4)),
        "{r}"
    );
    let msg = r["errors"][0]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("HTTP 503: ") && msg.contains("capacity"),
        "{r}"
    );
    assert_eq!(r["errors"][0]["count"], 4, "{r}");
    assert!(r["ttft_ms"].is_null(), "{r}");
    assert!(text(&out.stderr).contains("failed: 4 request(s): HTTP 503"));

    // Prompt ids past the model's vocabulary: the engine refuses them in the stream.
    let s = start(None);
    let r = report(&bench(
        &s.url,
        &[
            "--num-prompts",
            "3",
            "--input-len",
            "50",
            "--output-len",
            "2",
            "--vocab-size",
            "100000",
        ],
    ));
    assert_eq!(r["failed"], 3, "{r}");
    let msg = r["errors"][0]["message"].as_str().unwrap();
    assert!(msg.contains("outside the vocabulary"), "{r}");
}

#[test]
fn bad_urls_unreachable_servers_and_unknown_models_are_clear_errors() {
    for (url, want) in [
        ("localhost:8000", "--url"),
        ("https://127.0.0.1:1", "https is not supported"),
    ] {
        let err = failure(&bench(url, &[]));
        assert!(err.contains(want), "{url}: {err}");
    }
    // A port nothing listens on (bound, then closed).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = failure(&bench(&format!("http://127.0.0.1:{port}"), &[]));
    assert!(err.contains("cannot reach the server"), "{err}");

    let s = start(None);
    let err = failure(&bench(&s.url, &["--model", "other"]));
    assert!(err.contains("serves `dummy:tiny`"), "{err}");
    // Longer than the server's context (128 tokens).
    let err = failure(&bench(
        &s.url,
        &["--input-len", "100", "--output-len", "40"],
    ));
    assert!(err.contains("max_model_len is 128"), "{err}");
    // --url and --in-process exclude each other.
    let err = failure(&bench(&s.url, &["--in-process"]));
    assert!(err.contains("--in-process"), "{err}");
}
