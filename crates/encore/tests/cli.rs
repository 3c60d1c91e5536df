//! The `encore` binary end to end on the CPU: `generate` with the built-in dummy model
//! (text and JSON output), `info`'s self-check, and clear errors for bad input.

use std::process::{Command, Output};

fn encore(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_encore"))
        .args(args)
        .env("ENCORE_LOG", "error")
        .output()
        .expect("run encore")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn generate_json_for_a_batch_of_prompts() {
    let out = encore(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        "dummy:tiny",
        "--prompt",
        "Hello",
        "--prompt",
        "A longer second prompt",
        "--max-tokens",
        "5",
        "--ignore-eos",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    for (i, (v, prompt)) in lines
        .iter()
        .zip(["Hello", "A longer second prompt"])
        .enumerate()
    {
        assert_eq!(v["index"], i);
        // Byte-level tokenizer: BOS (256) then one id per byte.
        let ids: Vec<u64> = v["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        assert_eq!(ids[0], 256);
        assert_eq!(ids.len(), prompt.len() + 1);
        assert_eq!(v["output_ids"].as_array().unwrap().len(), 5);
        assert_eq!(v["finish_reason"], "length");
        assert_eq!(v["device"], "cpu");
    }
}

#[test]
fn greedy_generation_is_deterministic_and_batch_independent() {
    let run = |prompts: &[&str]| -> Vec<serde_json::Value> {
        let mut args = vec![
            "generate",
            "--device",
            "cpu",
            "--max-tokens",
            "6",
            "--ignore-eos",
            "--json",
        ];
        for p in prompts {
            args.extend(["--prompt", p]);
        }
        let out = encore(&args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let alone = run(&["one two three"]);
    let batched = run(&["x", "one two three", "a much longer prompt than the others"]);
    assert_eq!(alone[0]["output_ids"], batched[1]["output_ids"]);
}

#[test]
fn graph_mode_generates_what_eager_generates() {
    let run = |extra: &[&str]| -> Vec<serde_json::Value> {
        let mut args = vec![
            "generate",
            "--device",
            "cpu",
            "--model",
            "dummy:tiny-qwen3",
            "--dtype",
            "f32",
            "--max-tokens",
            "8",
            "--ignore-eos",
            "--json",
            "--prompt",
            "abc",
            "--prompt",
            "a longer prompt",
            "--prompt",
            "z",
        ];
        args.extend(extra);
        let out = encore(&args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let (graph, eager, verified) = (run(&[]), run(&["--eager"]), run(&["--verify-graphs"]));
    for ((g, e), v) in graph.iter().zip(&eager).zip(&verified) {
        assert_eq!(g["output_ids"], e["output_ids"]);
        assert_eq!(v["output_ids"], e["output_ids"]);
    }
    // Every bucket captured at start-up (largest first), with other bucket lists.
    for buckets in ["vllm", "pow2", "1,3"] {
        let warm = run(&["--capture-all", "--buckets", buckets, "--verify-graphs"]);
        for (w, e) in warm.iter().zip(&eager) {
            assert_eq!(w["output_ids"], e["output_ids"], "{buckets}");
        }
    }
    for strategy in ["private", "multi-va", "arena"] {
        let other = run(&["--graph-memory", strategy, "--verify-graphs"]);
        for (o, e) in other.iter().zip(&eager) {
            assert_eq!(o["output_ids"], e["output_ids"], "{strategy}");
        }
    }
}

#[test]
fn bench_capture_reports_every_strategy() {
    let out = encore(&[
        "bench",
        "capture",
        "--device",
        "cpu",
        "--model",
        "dummy:tiny",
        "--dtype",
        "f32",
        "--buckets",
        "1,2,4,8,16,32",
        "--order",
        "descending",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let get = |name: &str, key: &str| -> u64 {
        let row = rows.iter().find(|r| r["strategy"] == name).unwrap();
        assert_eq!(row["buckets"].as_array().unwrap().len(), 6);
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

    let out = encore(&[
        "bench",
        "capture",
        "--device",
        "cpu",
        "--strategies",
        "shared",
    ]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("private, multi-va, arena"));
}

#[test]
fn generate_streams_text_and_prints_a_summary() {
    let out = encore(&[
        "generate",
        "--device",
        "cpu",
        "--prompt",
        "Hi",
        "--max-tokens",
        "4",
        "--ignore-eos",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("prompt 3 tokens, generated 4 (length)"),
        "{err}"
    );
    assert!(err.contains("decode") && err.contains("tok/s"), "{err}");
}

#[test]
fn bad_input_gets_a_clear_error() {
    let out = encore(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        "/nonexistent/model",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("/nonexistent/model"),
        "{}",
        text(&out.stderr)
    );

    let out = encore(&["generate", "--device", "cpu", "--model", "dummy:nope"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("nope"), "{}", text(&out.stderr));

    let out = encore(&["generate", "--device", "tpu"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("`tpu`"), "{}", text(&out.stderr));

    let out = encore(&["generate", "--device", "cpu", "--block-size", "0"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--block-size"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        !text(&out.stderr).contains("panicked"),
        "{}",
        text(&out.stderr)
    );

    let out = encore(&["generate", "--device", "cpu", "--buckets", "2,x"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--buckets"),
        "{}",
        text(&out.stderr)
    );

    let out = encore(&["generate", "--device", "cpu", "--dtype", "int4"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("int4"), "{}", text(&out.stderr));
}

#[test]
fn info_self_check_passes_on_cpu() {
    let out = encore(&["info", "--device", "cpu", "--seed", "11"]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let stdout = text(&out.stdout);
    assert!(stdout.contains("selected cpu"), "{stdout}");
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
}
