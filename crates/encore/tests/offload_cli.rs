//! Weight offload from the command line, on the CPU twin: `--weight-budget` and
//! `--offload-policy` on generate, serve, bench decode and bench serve (the text under a
//! budget is the resident text; bad values fail naming the flag, the value or the
//! minimum), and `encore bench offload`'s rows.

mod common;

use std::process::Output;
use std::time::Duration;

use common::{bench_on_cpu, encore, failure, json_lines, success, text, Serve};
use encore_core::model::open_model;
use encore_core::offload::{AccessOrder, SLOT_ALIGN};
use encore_core::DType;
use serde_json::Value;

const MODEL: &str = "dummy:tiny-qwen3";

/// `encore serve` of [`MODEL`] on the CPU on any free port.
const SERVE: [&str; 6] = ["--device", "cpu", "--model", MODEL, "--port", "0"];

/// The minimum budget of [`MODEL`] in bf16 (the commands' default dtype).
fn floor_bytes() -> usize {
    let files = open_model(MODEL).unwrap();
    AccessOrder::llama(&files.config, DType::BF16)
        .unwrap()
        .aligned(SLOT_ALIGN)
        .floor()
        .bytes
}

fn generate(extra: &[&str]) -> Output {
    let mut args = vec![
        "generate",
        "--device",
        "cpu",
        "--model",
        MODEL,
        "--prompt",
        "Hello there",
        "--prompt",
        "The quick brown fox",
        "--max-tokens",
        "8",
        "--ignore-eos",
    ];
    args.extend_from_slice(extra);
    encore(&args)
}

#[test]
fn generate_under_a_budget_prints_the_resident_text() {
    let want = success(&generate(&[]));
    assert!(want.contains("=== [2/2]"), "{want}");
    for (extra, policy) in [
        (&["--weight-budget", "50%"][..], "(planned)"),
        (&["--weight-budget", "50%", "--eager"], "(planned)"),
        (
            &["--weight-budget", "60%", "--offload-policy", "planned"],
            "(planned)",
        ),
        (
            &[
                "--weight-budget",
                "50%",
                "--offload-policy",
                "lru",
                "--eager",
            ],
            "(lru)",
        ),
    ] {
        let out = generate(extra);
        assert_eq!(success(&out), want, "{extra:?}");
        let err = text(&out.stderr);
        let line = err
            .lines()
            .find(|l| l.starts_with("weight budget"))
            .unwrap_or_else(|| panic!("{extra:?}: no budget line in {err}"));
        assert!(
            line.contains(policy)
                && line.contains("resident")
                && line.contains("streamed per step"),
            "{line}"
        );
    }
    // JSON: the same ids, and stdout holds only the JSON lines.
    let ids = |out: &Output| -> Vec<Value> {
        success(out)
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["output_ids"].clone())
            .collect()
    };
    assert_eq!(
        ids(&generate(&["--json", "--weight-budget", "40%"])),
        ids(&generate(&["--json"]))
    );
    // Quantized weights stream in their format: the text under a budget is the resident
    // quantized text (and the start-up line names the format).
    let q8 = generate(&["--quantization", "q8_0"]);
    let q8_text = success(&q8);
    assert!(text(&q8.stderr).contains("q8_0"), "{}", text(&q8.stderr));
    for extra in [
        &["--weight-budget", "50%"][..],
        &[
            "--weight-budget",
            "50%",
            "--offload-policy",
            "lru",
            "--eager",
        ],
    ] {
        let args = [&["--quantization", "q8_0"][..], extra].concat();
        assert_eq!(success(&generate(&args)), q8_text, "{args:?}");
    }
    // A budget holding every weight says so.
    let out = generate(&["--weight-budget", "100%"]);
    assert_eq!(success(&out), want);
    assert!(
        text(&out.stderr).contains("holds every weight"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn bad_offload_values_name_the_flag_value_or_minimum() {
    let cases: [(&[&str], &[&str]); 8] = [
        (
            &["--weight-budget", "0"],
            &["--weight-budget", "`0` is zero"],
        ),
        (
            &["--weight-budget", "12XB"],
            &["--weight-budget", "`12XB`", "unknown unit"],
        ),
        (
            &["--weight-budget", "101%"],
            &["--weight-budget", "`101%`", "(0, 100]"],
        ),
        (
            &["--weight-budget", "50%", "--offload-policy", "fifo"],
            &["--offload-policy", "`fifo`", "planned", "lru"],
        ),
        (
            &["--offload-policy", "lru"],
            &["--weight-budget", "--offload-policy"],
        ),
        (
            &["--weight-budget", "50%", "--offload-policy", "lru"],
            &["--offload-policy lru", "--eager"],
        ),
        // A dense model has no expert cache to prefetch into.
        (
            &["--weight-budget", "50%", "--expert-prefetch"],
            &["--expert-prefetch", "planned offload policy"],
        ),
        (
            &["--expert-prefetch"],
            &["--weight-budget", "--expert-prefetch"],
        ),
    ];
    for (args, want) in cases {
        let err = failure(&generate(args));
        for w in want {
            assert!(err.contains(w), "{args:?}: missing `{w}` in {err}");
        }
    }
    // Below the floor: refused at load with the exact minimum.
    let floor = floor_bytes();
    for budget in ["1KiB".to_string(), format!("{}", floor - 1)] {
        let err = failure(&generate(&["--weight-budget", &budget]));
        assert!(
            err.contains(&format!("minimum of {floor} bytes")) && err.contains("--weight-budget"),
            "{budget}: {err}"
        );
    }
    success(&generate(&["--weight-budget", &floor.to_string()]));
}

#[test]
fn offload_flags_on_the_other_commands_name_the_flag_or_minimum() {
    let minimum = format!("minimum of {} bytes", floor_bytes());
    let serve_1kib = [&["serve"][..], &SERVE, &["--weight-budget", "1KiB"]].concat();
    let cases: [(&[&str], &[&str]); 4] = [
        (
            &["serve", "--device", "cpu", "--weight-budget", "12XB"],
            &["--weight-budget", "12XB"],
        ),
        (&serve_1kib, &[&minimum]),
        (
            &[
                "bench",
                "decode",
                "--device",
                "cpu",
                "--model",
                MODEL,
                "--weight-budget",
                "50%",
                "--offload-policy",
                "lru",
            ],
            &["--offload-policy lru", "--eager"],
        ),
        (
            &[
                "bench",
                "serve",
                "--url",
                "http://127.0.0.1:1",
                "--weight-budget",
                "50%",
            ],
            &["--in-process"],
        ),
    ];
    for (args, want) in cases {
        let err = failure(&encore(args));
        for w in want {
            assert!(err.contains(w), "{args:?}: missing `{w}` in {err}");
        }
    }
    for (args, want) in [
        (&["--budgets", "0"][..], "--budgets"),
        (&["--budgets", "101"], "--budgets"),
        (&["--budgets", "1"], "minimum of"),
        (&["--policy", "fifo"], "`fifo`"),
        (&["--graphs-only", "--policy", "lru"], "--graphs-only"),
        (&["--eager", "--graphs-only"], "--graphs-only"),
    ] {
        let err = failure(&bench_on_cpu(
            "offload",
            &[&["--model", MODEL][..], args].concat(),
        ));
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// The fields of a `bench offload --json` row.
const FIELDS: [&str; 15] = [
    "expert_hit_rate",
    "policy",
    "mode",
    "batch",
    "budget_fraction",
    "budget_bytes",
    "resident_bytes",
    "streaming_bytes",
    "streamed_bytes_per_step",
    "step_ms",
    "tok_s",
    "pcie_bound_ms",
    "bound_ratio",
    "h2d_gbs",
    "h2d_graph_gbs",
];

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1e-9)
}

/// Check one `bench offload` row (`h2d`: the run's measured bandwidth, GB/s): its fields,
/// throughput, PCIe bound, and its budget by policy. Returns "POLICY MODE BATCH".
fn check_row(r: &Value, h2d: f64) -> String {
    let f = |r: &Value, k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k}: {r}"));
    let mut keys: Vec<&str> = FIELDS.to_vec();
    keys.sort_unstable();
    let mut got: Vec<&str> = r.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    got.sort_unstable();
    assert_eq!(got, keys, "{r}");
    let (policy, mode) = (r["policy"].as_str().unwrap(), r["mode"].as_str().unwrap());
    let batch = r["batch"].as_u64().unwrap();
    let step = f(r, "step_ms");
    assert!(step > 0.0, "{r}");
    assert!(close(f(r, "tok_s"), batch as f64 / step * 1e3), "{r}");
    assert_eq!(f(r, "h2d_gbs"), h2d);
    let streamed = f(r, "streamed_bytes_per_step");
    assert!(
        close(f(r, "pcie_bound_ms"), streamed / (h2d * 1e9) * 1e3),
        "{r}"
    );
    if policy == "resident" {
        assert_eq!(f(r, "budget_fraction"), 1.0, "{r}");
        assert_eq!(streamed, 0.0, "{r}");
        assert_eq!(f(r, "streaming_bytes"), 0.0, "{r}");
        assert_eq!(f(r, "resident_bytes"), f(r, "budget_bytes"), "{r}");
        assert!(r["bound_ratio"].is_null(), "{r}");
    } else {
        assert_eq!(f(r, "budget_fraction"), 0.5, "{r}");
        assert!(streamed > 0.0, "{r}");
        assert!(
            f(r, "resident_bytes") + f(r, "streaming_bytes") <= f(r, "budget_bytes"),
            "{r}"
        );
        assert!(
            close(f(r, "bound_ratio"), step / f(r, "pcie_bound_ms")),
            "{r}"
        );
    }
    format!("{policy} {mode} {batch}")
}

#[test]
fn bench_offload_rows() {
    let out = bench_on_cpu(
        "offload",
        &[
            "--budgets",
            "100,50",
            "--batch",
            "1,2",
            "--steps",
            "2",
            "--context",
            "16",
            "--json",
        ],
    );
    let rows = json_lines(&out);
    let h2d = rows[0]["h2d_gbs"].as_f64().unwrap();
    assert!(h2d > 0.0 && h2d.is_finite());
    let h2d_graph = rows[0]["h2d_graph_gbs"].as_f64().unwrap();
    assert!(h2d_graph > 0.0 && h2d_graph.is_finite());
    let f = |r: &Value, k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k}: {r}"));
    let seen: Vec<String> = rows.iter().map(|r| check_row(r, h2d)).collect();
    let mut want: Vec<String> = Vec::new();
    for (policy, modes) in [
        ("resident", &["graph", "eager"][..]),
        ("planned", &["graph", "eager"]),
        ("lru", &["eager"]),
    ] {
        for b in [1, 2] {
            for m in modes {
                want.push(format!("{policy} {m} {b}"));
            }
        }
    }
    let (mut got, mut wanted) = (seen.clone(), want);
    got.sort();
    wanted.sort();
    assert_eq!(got, wanted);
    // Half the resident budget; planned streams less than LRU at every batch.
    let total = f(&rows[0], "budget_bytes");
    let row = |policy: &str, mode: &str, batch: u64| {
        rows.iter()
            .find(|r| r["policy"] == policy && r["mode"] == mode && r["batch"] == batch)
            .unwrap()
    };
    for b in [1, 2] {
        let planned = row("planned", "eager", b);
        assert_eq!(f(planned, "budget_bytes"), (total / 2.0).floor());
        assert_eq!(
            f(planned, "streamed_bytes_per_step"),
            f(row("planned", "graph", b), "streamed_bytes_per_step")
        );
        assert!(
            f(planned, "streamed_bytes_per_step")
                < f(row("lru", "eager", b), "streamed_bytes_per_step"),
            "planned {planned} vs lru {}",
            row("lru", "eager", b)
        );
    }
}

#[test]
fn bench_offload_graph_rows_only() {
    // Graph rows only: no LRU, no eager rows.
    let out = bench_on_cpu(
        "offload",
        &[
            "--budgets",
            "50",
            "--batch",
            "1",
            "--steps",
            "1",
            "--context",
            "4",
            "--graphs-only",
            "--json",
        ],
    );
    let rows = json_lines(&out);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (rows[0]["policy"].as_str(), rows[0]["mode"].as_str()),
        (Some("planned"), Some("graph"))
    );
}

#[test]
fn bench_decode_and_serve_take_a_budget() {
    let out = bench_on_cpu(
        "decode",
        &[
            "--model",
            MODEL,
            "--batch",
            "1",
            "--steps",
            "2",
            "--context",
            "8",
            "--weight-budget",
            "50%",
        ],
    );
    let table = success(&out);
    assert!(
        table.contains("weight budget") && table.contains("(planned)"),
        "{table}"
    );

    let out = bench_on_cpu(
        "serve",
        &[
            "--in-process",
            "--model",
            MODEL,
            "--num-prompts",
            "3",
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--max-num-seqs",
            "2",
            "--max-num-batched-tokens",
            "32",
            "--weight-budget",
            "50%",
            "--offload-policy",
            "lru",
            "--eager",
            "--json",
        ],
    );
    let row: Value = serde_json::from_str(success(&out).trim()).unwrap();
    assert_eq!(row["output_tokens"], 12, "{row}");
    assert_eq!(row["offload"]["policy"], "lru", "{row}");
    assert!(
        row["offload"]["streaming_bytes"].as_u64().unwrap() > 0,
        "{row}"
    );

    // serve prints the budget line before it listens.
    let extra = [
        "--lazy-capture",
        "--cpu-kv-blocks",
        "64",
        "--max-seq-len",
        "256",
        "--weight-budget",
        "50%",
    ];
    let s = Serve::start(&[&SERVE[..], &extra].concat(), Duration::from_secs(60));
    assert!(
        s.before
            .iter()
            .any(|l| l.starts_with("weight budget") && l.contains("(planned)")),
        "{:?}",
        s.before
    );
}

/// A mixture of experts under a budget takes the expert cache by default: the resident
/// text from generate, the budget line naming the slots, and `/metrics` counting the
/// cache's hits, misses and streamed bytes.
#[test]
fn a_mixture_of_experts_runs_its_experts_through_the_cache() {
    let moe = "dummy:tiny-qwen3-moe";
    let gen = |extra: &[&str]| {
        let args = [
            &[
                "generate",
                "--device",
                "cpu",
                "--model",
                moe,
                "--prompt",
                "Hello there",
                "--max-tokens",
                "8",
                "--ignore-eos",
            ][..],
            extra,
        ]
        .concat();
        encore(&args)
    };
    let want = success(&gen(&[]));
    let out = gen(&["--weight-budget", "80%"]);
    assert_eq!(success(&out), want);
    let err = text(&out.stderr);
    assert!(
        err.lines().any(|l| l.starts_with("weight budget")
            && l.contains("(experts)")
            && l.contains("expert slots")),
        "{err}"
    );
    // The planned ring still runs on request, with the same text.
    let out = gen(&["--weight-budget", "80%", "--offload-policy", "planned"]);
    assert_eq!(success(&out), want);
    // Below the cache's floor: refused with the minimum.
    let low = failure(&gen(&["--weight-budget", "30%"]));
    assert!(
        low.contains("minimum of") && low.contains("expert slots"),
        "{low}"
    );

    let args = [
        "--device",
        "cpu",
        "--model",
        moe,
        "--port",
        "0",
        "--lazy-capture",
        "--cpu-kv-blocks",
        "64",
        "--max-seq-len",
        "256",
        "--weight-budget",
        "80%",
    ];
    // bench decode reports the cache per batch: a table line, and JSON fields.
    let bench = |json: bool| {
        let mut a = vec![
            "--model",
            moe,
            "--batch",
            "1,2",
            "--steps",
            "3",
            "--context",
            "8",
            "--router-skew",
            "0.8",
            "--prefetch-accuracy",
            "0.5",
            "--weight-budget",
            "80%",
            "--expert-prefetch",
        ];
        if json {
            a.push("--json");
        }
        success(&bench_on_cpu("decode", &a))
    };
    let table = bench(false);
    assert!(
        table.contains("(experts)")
            && table.contains("expert cache:")
            && table.contains("% hits")
            && table.contains("prefetched")
            && table.contains("prefetch predicts 50%"),
        "{table}"
    );
    for row in bench(true)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
    {
        let hits = row["expert_hit_rate"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&hits), "{row}");
        assert!(row["streamed_bytes_per_step"].as_f64().is_some(), "{row}");
        assert_eq!(row["prefetch_accuracy"].as_f64(), Some(0.5), "{row}");
        assert!(
            row["expert_prefetched_per_step"].as_f64() > Some(0.0),
            "{row}"
        );
    }

    let s = Serve::start(&args, Duration::from_secs(60));
    let body = serde_json::json!({
        "model": moe, "prompt": "Hello there", "max_tokens": 8, "ignore_eos": true
    });
    let (status, reply) = common::http(s.addr, "POST", "/v1/completions", Some(&body));
    assert_eq!(status, 200, "{reply}");
    // The engine publishes its figures after the step that answered (and reads the
    // cache's totals when it goes idle): poll until it has.
    let t = std::time::Instant::now();
    let metrics = loop {
        let (status, metrics) = common::http(s.addr, "GET", "/metrics", None);
        assert_eq!(status, 200);
        if metrics.contains("encore_requests_running 0")
            && !metrics.contains("encore_expert_cache_needed_total 0")
        {
            break metrics;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "{metrics}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let value = |name: &str| common::metric(&metrics, name);
    let (needed, hits, misses) = (
        value("encore_expert_cache_needed_total"),
        value("encore_expert_cache_hits_total"),
        value("encore_expert_cache_misses_total"),
    );
    assert!(needed > 0 && hits + misses == needed, "{metrics}");
    assert!(
        value("encore_expert_cache_streamed_bytes_total") > 0,
        "{metrics}"
    );
    // No --expert-prefetch here: nothing was fetched ahead.
    assert_eq!(
        value("encore_expert_cache_prefetched_total"),
        0,
        "{metrics}"
    );
}
