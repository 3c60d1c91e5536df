//! `encore bench capture`, `bench prefill` and `bench serve --in-process` end to end on
//! the CPU: their rows and reports, and clear errors for bad values.

mod common;

use common::{bench_on_cpu, encore, failure, json_lines, text};

#[test]
fn bench_capture_reports_every_strategy() {
    let out = bench_on_cpu(
        "capture",
        &[
            "--model",
            "dummy:tiny",
            "--dtype",
            "f32",
            "--buckets",
            "1,2,4,8,16,32",
            "--prefill-buckets",
            "16,64",
            "--order",
            "descending",
            "--json",
        ],
    );
    let rows = json_lines(&out);
    let get = |name: &str, key: &str| -> u64 {
        let row = rows.iter().find(|r| r["strategy"] == name).unwrap();
        assert_eq!(row["buckets"].as_array().unwrap().len(), 6);
        assert_eq!(row["token_buckets"].as_array().unwrap().len(), 2);
        // 6 decode graphs + 2 token buckets of (layers + 1) pieces each.
        assert!(row["pieces"].as_u64().unwrap() > 8, "{row}");
        assert!(row["capture_seconds"].as_f64().unwrap() > 0.0);
        row[key].as_u64().unwrap()
    };
    let largest = get("arena", "largest_bucket_bytes");
    let g = get("arena", "granularity");
    assert_eq!(get("arena", "physical_bytes"), largest.next_multiple_of(g));
    assert_eq!(
        get("multi-va", "physical_bytes"),
        get("arena", "physical_bytes")
    );
    assert!(get("multi-va", "virtual_bytes") > get("arena", "virtual_bytes"));
    assert!(get("private", "physical_bytes") > get("arena", "physical_bytes"));
    assert_eq!(get("private", "largest_bucket_bytes"), largest);

    let out = bench_on_cpu("capture", &["--strategies", "shared"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("private, multi-va, arena"));
}

#[test]
fn bench_prefill_reports_a_row_per_shape() {
    let out = bench_on_cpu(
        "prefill",
        &[
            "--model",
            "dummy:tiny",
            "--dtype",
            "f32",
            "--tokens",
            "16,40",
            "--batch",
            "1,2",
            "--repeats",
            "2",
            "--prefill-buckets",
            "16,48",
            "--json",
        ],
    );
    let lines = json_lines(&out);
    // A start-up line first: both buckets captured before the first row.
    assert_eq!(lines[0]["captured"].as_u64(), Some(2), "{}", lines[0]);
    assert!(lines[0]["capture_s"].as_f64().unwrap() > 0.0);
    let rows = &lines[1..];
    let shapes: Vec<(u64, u64)> = rows
        .iter()
        .map(|r| (r["batch"].as_u64().unwrap(), r["tokens"].as_u64().unwrap()))
        .collect();
    assert_eq!(shapes, [(1, 16), (1, 40), (2, 16), (2, 40)]);
    // 16 and 40 tokens pad to buckets 16 and 48; 32 to 48; 80 runs eagerly.
    let buckets: Vec<Option<u64>> = rows.iter().map(|r| r["bucket"].as_u64()).collect();
    assert_eq!(buckets, [Some(16), Some(48), Some(48), None]);
    for r in rows {
        let ms = r["prefill_ms"].as_f64().unwrap();
        let tps = r["tokens_per_s"].as_f64().unwrap();
        let tokens = (r["tokens"].as_u64().unwrap() * r["batch"].as_u64().unwrap()) as f64;
        assert!(ms > 0.0 && r["cold_ms"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["eager_ms"].as_f64().unwrap() > 0.0, "{r}");
        assert!((tps - tokens / (ms / 1e3)).abs() < 1e-6 * tps, "{r}");
        if r["bucket"].is_null() {
            assert!(
                r["piecewise_ms"].is_null() && r["matches_eager"].is_null(),
                "{r}"
            );
        } else {
            assert_eq!(r["prefill_ms"], r["piecewise_ms"], "{r}");
            assert_eq!(r["matches_eager"].as_bool(), Some(true), "{r}");
        }
    }
    for (flag, value) in [("--tokens", "0"), ("--batch", "-1"), ("--repeats", "0")] {
        let err = failure(&bench_on_cpu("prefill", &[flag, value]));
        assert!(err.contains(flag), "{flag}: {err}");
    }
    let err = failure(&bench_on_cpu("prefill", &["--tokens", "4096"]));
    assert!(
        err.contains("--tokens 4096") && err.contains("positions"),
        "{err}"
    );
}

#[test]
fn bench_serve_in_process_reports_throughput_and_latencies() {
    let out = bench_on_cpu(
        "serve",
        &[
            "--in-process",
            "--model",
            "dummy:tiny",
            "--dtype",
            "f32",
            "--num-prompts",
            "6",
            "--input-len",
            "10",
            "--output-len",
            "5",
            "--max-num-seqs",
            "4",
            "--max-num-batched-tokens",
            "32",
            "--json",
        ],
    );
    let rows = json_lines(&out);
    let r = &rows[0];
    assert_eq!(r["input_tokens"], 60, "{r}");
    assert_eq!(r["output_tokens"], 30, "{r}");
    assert!(r["max_running"].as_u64().unwrap() <= 4, "{r}");
    for k in ["ttft_ms", "tpot_ms", "itl_ms"] {
        for q in ["mean", "p50", "p90", "p99"] {
            assert!(r[k][q].as_f64().unwrap() > 0.0, "{k}.{q}: {r}");
        }
    }
    assert!(r["output_throughput"].as_f64().unwrap() > 0.0);
    assert!(r["spec_acceptance_rate"].is_null(), "no speculation: {r}");
    // With n-gram speculation: the same token counts, and its acceptance figures.
    let spec = json_lines(&bench_on_cpu(
        "serve",
        &[
            "--in-process",
            "--model",
            "dummy:tiny",
            "--num-prompts",
            "4",
            "--input-len",
            "16",
            "--output-len",
            "32",
            "--speculative-method",
            "ngram",
            "--json",
        ],
    ));
    let r = &spec[0];
    assert_eq!(r["output_tokens"], 4 * 32, "{r}");
    let rate = r["spec_acceptance_rate"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&rate), "{r}");
    assert!(
        r["spec_mean_accepted_length"].as_f64().unwrap() >= 1.0,
        "{r}"
    );
    for (flag, value, what) in [
        ("--input-len", "5:2", "--input-len"),
        ("--request-rate", "0", "--request-rate"),
        ("--output-len", "0", "--output-len"),
    ] {
        let err = failure(&bench_on_cpu("serve", &["--in-process", flag, value]));
        assert!(err.contains(what), "{flag}: {err}");
    }
    // Without --in-process it loads a server: none listens on port 1.
    let err = failure(&encore(&["bench", "serve", "--url", "http://127.0.0.1:1"]));
    assert!(
        err.contains("cannot reach the server") && err.contains("--in-process"),
        "{err}"
    );
}

#[test]
fn bench_structured_reports_compile_and_mask_times() {
    let out = encore(&[
        "bench",
        "structured",
        "--model",
        "dummy:tiny",
        "--repeats",
        "1",
        "--tokens",
        "30",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows = json_lines(&out);
    let r = &rows[0];
    assert_eq!(r["schemas"], 8, "{r}");
    assert!(r["tokens"].as_u64().unwrap() > 30, "{r}");
    for k in [
        "index_ms",
        "compile_ms_p50",
        "compile_ms_p99",
        "mask_us_p50",
        "mask_us_p99",
    ] {
        assert!(r[k].as_f64().unwrap() > 0.0, "{k}: {r}");
    }
    let out = encore(&["bench", "structured", "--repeats", "0"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--repeats"));
}

/// `--router-skew` on a mixture of experts: the rows report the distinct experts each
/// batch reaches under the table; bad values and a dense model are refused naming it.
#[test]
fn bench_decode_router_skew_reports_experts_and_refuses_bad_values() {
    let out = bench_on_cpu(
        "decode",
        &[
            "--model",
            "dummy:tiny-qwen3-moe",
            "--batch",
            "1,4",
            "--steps",
            "2",
            "--eager",
            "--router-skew",
            "0",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows = json_lines(&out);
    assert_eq!(rows.len(), 2);
    // tiny-qwen3-moe: 8 experts, top 2; one row reaches 2 experts a layer.
    assert_eq!(rows[0]["experts_per_layer"].as_f64(), Some(2.0));
    let four = rows[1]["experts_per_layer"].as_f64().unwrap();
    assert!((2.0..=8.0).contains(&four), "{four}");
    assert_eq!(rows[1]["router_skew"].as_f64(), Some(0.0));
    for (args, says) in [
        (["dummy:tiny-qwen3-moe", "-1"], "0..=8"),
        (["dummy:tiny-qwen3-moe", "x"], "not a number"),
        (["dummy:tiny", "1"], "no experts"),
    ] {
        let out = bench_on_cpu(
            "decode",
            &["--model", args[0], "--batch", "1", "--router-skew", args[1]],
        );
        let err = failure(&out);
        assert!(err.contains("--router-skew") && err.contains(says), "{err}");
    }
}

/// `bench decode --speculative K,...` times the verify step per draft count beside each
/// batch's decode step (JSON `verify_ms`, a table line each); a bad count is refused.
#[test]
fn bench_decode_times_the_verify_step() {
    let out = bench_on_cpu(
        "decode",
        &[
            "--model",
            "dummy:tiny",
            "--batch",
            "1,3",
            "--steps",
            "2",
            "--speculative",
            "1,4",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    for row in json_lines(&out) {
        for k in ["1", "4"] {
            let ms = row["verify_ms"][k].as_f64().unwrap_or(-1.0);
            assert!(ms > 0.0, "{row}");
        }
    }
    let table = bench_on_cpu(
        "decode",
        &[
            "--model",
            "dummy:tiny",
            "--batch",
            "2",
            "--steps",
            "2",
            "--speculative",
            "2",
        ],
    );
    let t = text(&table.stdout);
    assert!(t.contains("verify step, 2 drafts a sequence"), "{t}");
    let err = failure(&bench_on_cpu(
        "decode",
        &[
            "--model",
            "dummy:tiny",
            "--batch",
            "1",
            "--speculative",
            "17",
        ],
    ));
    assert!(err.contains("--speculative"), "{err}");
}
