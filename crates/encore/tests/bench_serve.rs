//! `encore bench serve --url` against a real server on loopback (encore-server's router
//! over an engine loop with `dummy:tiny` on the CPU, in this process): every request of
//! a trace or of the length ranges completes with its token count, the report's fields
//! are there and sane, refusals (503) and error events count as failed requests with the
//! server's message, and a bad URL, an unreachable server or an unknown model are clear
//! errors. `--dataset-shape trtllm` runs its four rows end to end (in process and against
//! a server, a few requests a row) with TensorRT-LLM's figures beside ours, and the flags
//! it sets are refused beside it.

mod common;

use std::net::SocketAddr;
use std::process::Output;
use std::sync::Arc;

use common::{bench_on_cpu, command, failure, success, temp_dir, temp_file, text};
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
    start_sized(
        max_waiting,
        encore_core::model::open_model(MODEL).unwrap(),
        EngineConfig::new(DType::F32, 16, 64, 8, 128, KvSizing::Blocks(1 + 8 * 8)),
        SchedulerConfig::new(64, 8),
    )
}

/// `dummy:tiny` with 4096 positions (its own 2048 are too few for the trtllm preset's
/// 2048/128 and 500/2000 rows) and one layer (the preset decodes 3256 steps a request).
fn long_tiny() -> encore_core::model::config::ModelConfig {
    let mut cfg = encore_core::model::config::ModelConfig::dummy("tiny").unwrap();
    cfg.max_position_embeddings = 4096;
    cfg.num_layers = 1;
    cfg
}

/// The longest sequence of the trtllm preset (500 + 2000), rounded up to a 16-token block.
const PRESET_SEQ_LEN: usize = 2512;

/// A server for the trtllm preset: [`long_tiny`], up to 4 sequences of 2512 tokens.
fn start_long() -> Server {
    let mut files = encore_core::model::open_model(MODEL).unwrap();
    files.config = long_tiny();
    let blocks = 1 + 4 * PRESET_SEQ_LEN.div_ceil(16);
    start_sized(
        None,
        files,
        EngineConfig::new(
            DType::F32,
            16,
            512,
            4,
            PRESET_SEQ_LEN,
            KvSizing::Blocks(blocks),
        ),
        SchedulerConfig::new(512, 4),
    )
}

fn start_sized(
    max_waiting: Option<usize>,
    files: encore_core::model::ModelFiles,
    config: EngineConfig,
    scheduler: SchedulerConfig,
) -> Server {
    let engine = Arc::new(
        EngineHandle::start(
            Arc::new(encore_core::backend::cpu::CpuBackend::new()),
            files,
            config,
            scheduler,
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

/// TensorRT-LLM's rows: ISL, OSL, its request count and output tok/s (Llama-3.1-8B FP8,
/// one H200), as `--dataset-shape trtllm` reports them.
const TRTLLM_ROWS: [(u64, u64, u64, f64); 4] = [
    (128, 128, 30_000, 27_911.0),
    (1000, 1000, 3000, 17_744.0),
    (500, 2000, 3000, 20_770.0),
    (2048, 128, 3000, 3538.0),
];

/// [`long_tiny`] as a GGUF file with seeded random f32 weights, for `--in-process`.
fn long_tiny_gguf() -> std::path::PathBuf {
    use encore_core::model::gguf::{gguf_source, GgufWriter, Value as Meta};
    let cfg = long_tiny();
    let mut w = GgufWriter::new();
    w.model_metadata(&cfg);
    let tokens = (0..cfg.vocab_size)
        .map(|i| Meta::String(format!("t{i}")))
        .collect();
    w.kv("tokenizer.ggml.model", Meta::String("gpt2".into()));
    w.kv("tokenizer.ggml.tokens", Meta::Array(8, tokens));
    w.kv("tokenizer.ggml.merges", Meta::Array(8, Vec::new()));
    let mut state = 0x5eed_u64;
    for spec in encore_core::model::weights::hf_tensors(&cfg) {
        let (name, _) = gguf_source(&spec.name).unwrap();
        let scale = 1.0 / (*spec.shape.last().unwrap() as f32).sqrt();
        let values: Vec<f32> = (0..spec.numel())
            .map(|_| {
                if spec.name.ends_with("norm.weight") {
                    return 1.0;
                }
                // xorshift64
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale * 3.46
            })
            .collect();
        w.tensor_f32(&name, &spec.shape, &values);
    }
    let path = temp_dir("trtllm-preset").join("long-tiny.gguf");
    w.write(&path).unwrap();
    path
}

#[test]
fn the_trtllm_preset_runs_its_rows_in_process_with_the_peer_beside_each() {
    let gguf = long_tiny_gguf();
    // Two requests a row (--num-prompts overrides TensorRT-LLM's counts), one warm-up.
    let out = bench_on_cpu(
        "serve",
        &[
            "--in-process",
            "--model",
            gguf.to_str().unwrap(),
            "--dtype",
            "f32",
            "--dataset-shape",
            "trtllm",
            "--num-prompts",
            "2",
            "--warmup",
            "1",
            "--max-num-batched-tokens",
            "512",
            "--json",
        ],
    );
    let rows: Value = serde_json::from_str(success(&out).trim()).unwrap();
    let rows = rows.as_array().expect("one JSON array");
    assert_eq!(rows.len(), 4, "{rows:?}");
    for (r, &(isl, osl, requests, peer)) in rows.iter().zip(&TRTLLM_ROWS) {
        assert_eq!(
            (r["isl"].as_u64(), r["osl"].as_u64()),
            (Some(isl), Some(osl))
        );
        assert_eq!(r["mode"], "in-process", "{r}");
        assert_eq!(r["num_prompts"], 2, "{r}");
        assert_eq!(r["peer"], "TensorRT-LLM", "{r}");
        assert_eq!(r["peer_num_prompts"], requests, "{r}");
        assert_eq!(r["peer_output_throughput"].as_f64(), Some(peer), "{r}");
        assert!(
            r["peer_source"]
                .as_str()
                .unwrap()
                .ends_with("docs/source/performance/perf-overview.md"),
            "{r}"
        );
        // Exact lengths, every request at once; the warm-up is not counted.
        assert_eq!(
            (r["completed"].as_u64(), r["failed"].as_u64()),
            (Some(2), Some(0)),
            "{r}"
        );
        assert_eq!(r["input_len"], serde_json::json!([isl, isl]), "{r}");
        assert_eq!(r["input_tokens"].as_u64(), Some(2 * isl), "{r}");
        assert_eq!(r["output_tokens"].as_u64(), Some(2 * osl), "{r}");
        assert_eq!(r["request_rate"], "inf", "{r}");
        assert_eq!(r["max_concurrency"], 0, "{r}");
        // Both requests decode together: about OSL steps (and the prefill's), not two
        // runs' worth (the warm-up's or an earlier row's).
        let steps = r["steps"].as_u64().unwrap();
        assert!(steps >= osl - 1 && steps < osl + 2 * isl / 512 + 8, "{r}");
        assert_eq!(r["prefix_cache_hit_ratio"].as_f64(), Some(0.0), "{r}");
        let ours = r["output_throughput"].as_f64().unwrap();
        let ratio = r["output_throughput_ratio"].as_f64().unwrap();
        assert!(ours > 0.0 && (ratio - ours / peer).abs() < 1e-12, "{r}");
        assert!(r["tpot_ms"]["mean"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["total_token_throughput"].as_f64().unwrap() > ours, "{r}");
    }
    // dummy:tiny has 2048 positions: too few for the 500/2000 row.
    let err = failure(&bench_on_cpu(
        "serve",
        &[
            "--in-process",
            "--dataset-shape",
            "trtllm",
            "--num-prompts",
            "1",
        ],
    ));
    assert!(
        err.contains("--dataset-shape trtllm") && err.contains("2048 positions"),
        "{err}"
    );
    let _ = std::fs::remove_file(gguf);
}

#[test]
fn the_trtllm_preset_prints_one_table_against_a_server() {
    let s = start_long();
    // One request a row, no warm-up; without --json: the table.
    let out = command(&["bench", "serve", "--url", &s.url])
        .args([
            "--dataset-shape",
            "trtllm",
            "--num-prompts",
            "1",
            "--warmup",
            "0",
        ])
        .env_remove("ENCORE_API_KEY")
        .output()
        .expect("run encore");
    let table = success(&out);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].contains("dummy:tiny (url)"), "{table}");
    let head: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        head,
        [
            "ISL/OSL",
            "requests",
            "failed",
            "output",
            "tok/s",
            "TensorRT-LLM",
            "ours/peer",
            "total",
            "tok/s",
            "mean",
            "TPOT",
            "ms"
        ],
        "{table}"
    );
    for (line, &(isl, osl, _, peer)) in lines[2..6].iter().zip(&TRTLLM_ROWS) {
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cells.len(), 8, "{line}");
        assert_eq!(cells[0], format!("{isl}/{osl}"), "{line}");
        assert_eq!(&cells[1..3], ["1", "0"], "{line}");
        let num = |i: usize| cells[i].parse::<f64>().unwrap();
        assert_eq!(num(4), peer, "{line}");
        assert!(num(3) > 0.0, "{line}");
        // ours / peer, as printed (3 decimals of a tiny model's CPU throughput).
        assert!((num(5) - num(3) / peer).abs() < 2e-3, "{line}");
        assert!(num(6) > num(3) && num(7) > 0.0, "{line}");
    }
    assert!(lines[6].starts_with("note: --num-prompts"), "{table}");
    assert!(
        lines[7].contains("github.com/NVIDIA/TensorRT-LLM"),
        "{table}"
    );
    // Each row started on stderr.
    let err = text(&out.stderr);
    assert!(
        err.contains("row 4/4: ISL/OSL 2048/128, 1 request(s) at once"),
        "{err}"
    );
}

#[test]
fn the_trtllm_preset_refuses_the_flags_it_sets() {
    for (flag, value) in [
        ("--input-len", "5"),
        ("--output-len", "5"),
        ("--shared-prefix-len", "4"),
        ("--trace", "t.jsonl"),
        ("--request-rate", "10"),
        ("--arrival", "fixed"),
        ("--max-concurrency", "4"),
    ] {
        let err = failure(&bench(
            "http://127.0.0.1:1",
            &["--dataset-shape", "trtllm", flag, value],
        ));
        assert!(
            err.contains("'--dataset-shape <DATASET_SHAPE>' cannot be used with")
                && err.contains(flag),
            "{flag}: {err}"
        );
    }
    // --warmup is the preset's; an unknown shape names the known one.
    let err = failure(&bench("http://127.0.0.1:1", &["--warmup", "3"]));
    assert!(err.contains("--dataset-shape"), "{err}");
    let err = failure(&bench("http://127.0.0.1:1", &["--dataset-shape", "vllm"]));
    assert!(err.contains("possible values: trtllm"), "{err}");
    // A server whose context is shorter than the preset's longest row: refused before any
    // request is sent.
    let s = start(None);
    let err = failure(&bench(
        &s.url,
        &["--dataset-shape", "trtllm", "--num-prompts", "1"],
    ));
    assert!(
        err.contains("reach 2500 tokens (--dataset-shape trtllm)")
            && err.contains("max_model_len is 128"),
        "{err}"
    );
    assert_eq!(
        s.engine
            .metrics
            .requests_finished_total
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}
