//! The `encore` binary end to end on the CPU: `generate` with the built-in dummy model
//! (text and JSON output, batches, prompts from stdin and files), `info`'s self-check,
//! and clear errors (never a panic) for bad input, closed pipes and runs too big to fit.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use encore_core::DType;

fn command(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_encore"));
    c.args(args).env("ENCORE_LOG", "error");
    c
}

fn encore(args: &[&str]) -> Output {
    command(args).output().expect("run encore")
}

/// Run encore with `input` on standard input.
fn encore_with_stdin(args: &[&str], input: &str) -> Output {
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

/// A fresh directory under the system's temp dir for this test.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("encore-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The JSON lines of a successful run.
fn json_lines(out: &Output) -> Vec<serde_json::Value> {
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A failed run whose stderr says no panic happened; returns stderr.
fn failure(out: &Output) -> String {
    let err = text(&out.stderr);
    assert!(!out.status.success(), "expected a failure; stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    err
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
    // Prefill as piecewise graphs of token buckets (prompts of 4, 16 and 2 tokens: one
    // step of 22 tokens pads to 32), captured on first use and at start-up.
    for extra in [&[][..], &["--capture-all"][..]] {
        let mut args = vec!["--prefill-buckets", "8,32", "--verify-graphs"];
        args.extend(extra);
        let piecewise = run(&args);
        for (p, e) in piecewise.iter().zip(&eager) {
            assert_eq!(p["output_ids"], e["output_ids"], "{args:?}");
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
        "--prefill-buckets",
        "16,64",
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
fn bench_prefill_reports_a_row_per_shape() {
    let out = encore(&[
        "bench",
        "prefill",
        "--device",
        "cpu",
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
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
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
        let err = failure(&encore(&[
            "bench", "prefill", "--device", "cpu", flag, value,
        ]));
        assert!(err.contains(flag), "{flag}: {err}");
    }
    let err = failure(&encore(&[
        "bench", "prefill", "--device", "cpu", "--tokens", "4096",
    ]));
    assert!(
        err.contains("--tokens 4096") && err.contains("positions"),
        "{err}"
    );
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

    let err = failure(&encore(&["generate", "--device", "tpu"]));
    assert!(err.contains("'tpu'") && err.contains("--device"), "{err}");
    let err = failure(&encore(&["bench", "decode", "--device", "cuda:x"]));
    assert!(err.contains("--device"), "{err}");

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

    let err = failure(&encore(&["generate", "--device", "cpu", "--dtype", "int4"]));
    assert!(err.contains("int4") && err.contains("--dtype"), "{err}");

    // A missing file: the path, and the OS's message once.
    let err = failure(&encore(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        "/nonexistent/model",
    ]));
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");

    // A tokenizer.json that is JSON but not a tokenizer says so.
    let dir = temp_dir("not-a-tokenizer");
    std::fs::write(
        dir.join("config.json"),
        r#"{"architectures": ["LlamaForCausalLM"], "vocab_size": 96, "hidden_size": 64,
            "intermediate_size": 80, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "max_position_embeddings": 256}"#,
    )
    .unwrap();
    std::fs::write(dir.join("tokenizer.json"), r#"{"version": "1.0"}"#).unwrap();
    let err = failure(&encore(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        dir.to_str().unwrap(),
    ]));
    assert!(
        err.contains("tokenizer.json` is JSON but not a Hugging Face tokenizer"),
        "{err}"
    );
}

#[test]
fn bad_sampling_and_size_values_name_the_flag() {
    let generate_cases: &[(&str, &str)] = &[
        ("--temperature", "-1"),
        ("--temperature", "-0.5"),
        ("--temperature", "nan"),
        ("--temperature", "inf"),
        ("--top-p", "0"),
        ("--top-p", "1.5"),
        ("--top-p", "-0.1"),
        ("--top-k", "-1"),
        ("--min-p", "1.5"),
        ("--presence-penalty", "3"),
        ("--frequency-penalty", "-2.5"),
        ("--repetition-penalty", "0"),
        ("--max-tokens", "0"),
        ("--max-tokens", "-3"),
        ("--kv-fraction", "0"),
        ("--kv-fraction", "1.5"),
        ("--block-size", "0"),
        ("--max-num-batched-tokens", "0"),
        ("--max-tokens-per-step", "-2"),
        ("--max-seq-len", "0"),
    ];
    for &(flag, value) in generate_cases {
        let err = failure(&encore(&["generate", "--device", "cpu", flag, value]));
        // The alias is reported under the flag's current name.
        let name = flag.replace("max-tokens-per-step", "max-num-batched-tokens");
        assert!(err.contains(&name), "{flag} {value}: {err}");
        assert!(err.contains(&format!("'{value}'")), "{flag} {value}: {err}");
        assert!(
            !err.contains("unexpected argument"),
            "{flag} {value}: {err}"
        );
    }
    let bench_cases: &[(&str, &str, &str)] = &[
        ("decode", "--batch", "1,0"),
        ("decode", "--batch", "-4"),
        ("decode", "--steps", "0"),
        ("decode", "--context", "0"),
        ("decode", "--context", "4096"),
        ("capture", "--max-batch", "0"),
        ("capture", "--max-seq-len", "0"),
    ];
    for &(cmd, flag, value) in bench_cases {
        let err = failure(&encore(&["bench", cmd, "--device", "cpu", flag, value]));
        assert!(err.contains(flag), "{cmd} {flag} {value}: {err}");
    }
}

#[test]
fn a_closed_pipe_ends_quietly() {
    let cases: &[&[&str]] = &[
        &[
            "generate",
            "--device",
            "cpu",
            "--max-tokens",
            "500",
            "--ignore-eos",
        ],
        &[
            "generate",
            "--device",
            "cpu",
            "--max-tokens",
            "4",
            "--json",
            "--prompt",
            "a",
            "--prompt",
            "b",
            "--prompt",
            "c",
        ],
        &[
            "bench", "decode", "--device", "cpu", "--batch", "1,2", "--steps", "2", "--eager",
        ],
        &["info", "--device", "cpu", "--seed", "3"],
    ];
    for args in cases {
        let mut child = command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut first = [0u8; 5];
        stdout.read_exact(&mut first).unwrap();
        drop(stdout);
        let out = child.wait_with_output().unwrap();
        let err = text(&out.stderr);
        assert!(
            matches!(out.status.code(), Some(0 | 141)),
            "{args:?}: {:?} {err}",
            out.status
        );
        assert!(
            !err.contains("panicked") && !err.contains("error"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn prompts_from_stdin_and_files() {
    let args = [
        "generate",
        "--device",
        "cpu",
        "--max-tokens",
        "2",
        "--ignore-eos",
        "--json",
    ];
    fn with<'a>(args: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        [args, extra].concat()
    }
    let out = encore_with_stdin(
        &with(&args, &["--prompt", "first", "--prompt", "-"]),
        "from stdin\n",
    );
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["prompt"], "first");
    assert_eq!(lines[1]["prompt"], "from stdin");
    // BOS and one id per byte: the trailing newline is not part of the prompt.
    assert_eq!(lines[1]["prompt_ids"].as_array().unwrap().len(), 11);

    let dir = temp_dir("prompt-files");
    let file = dir.join("prompts.jsonl");
    std::fs::write(
        &file,
        "plain line\n\n   \n{\"prompt\": \"json \\\"quoted\\\"\", \"id\": 7}\nlast\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let lines = json_lines(&encore(&with(
        &args,
        &["--prompt", "cli", "--prompt-file", path],
    )));
    let prompts: Vec<&str> = lines
        .iter()
        .map(|l| l["prompt"].as_str().unwrap())
        .collect();
    assert_eq!(prompts, ["cli", "plain line", "json \"quoted\"", "last"]);

    for (body, want) in [
        ("ok\n{\"prompt\": \n", "line 2: not valid JSON"),
        ("\n\n{\"text\": \"x\"}\n", "line 3: missing field `prompt`"),
        ("\n\n", "holds no prompts"),
    ] {
        std::fs::write(&file, body).unwrap();
        let err = failure(&encore(&with(&args, &["--prompt-file", path])));
        assert!(err.contains(path) && err.contains(want), "{body:?}: {err}");
    }
    let gone = dir.join("missing.txt");
    let err = failure(&encore(&with(
        &args,
        &["--prompt-file", gone.to_str().unwrap()],
    )));
    assert!(err.contains(gone.to_str().unwrap()), "{err}");
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
}

#[test]
fn dtype_aliases_in_any_case() {
    let run = |dtype: &str| -> Vec<serde_json::Value> {
        json_lines(&encore(&[
            "generate",
            "--device",
            "cpu",
            "--dtype",
            dtype,
            "--max-tokens",
            "3",
            "--ignore-eos",
            "--json",
        ]))
    };
    for (names, canonical) in [
        (&["BF16", "bfloat16"][..], "bf16"),
        (&["fp16", "Float16", "half"][..], "f16"),
        (&["FP32", "float32"][..], "f32"),
    ] {
        let want = run(canonical);
        for name in names {
            assert_eq!(run(name)[0]["output_ids"], want[0]["output_ids"], "{name}");
        }
    }
    let out = encore(&[
        "bench",
        "capture",
        "--device",
        "cpu",
        "--dtype",
        "Float32",
        "--buckets",
        "1",
        "--max-batch",
        "1",
        "--strategies",
        "arena",
        "--json",
    ]);
    assert_eq!(json_lines(&out)[0]["dtype"], "f32");
}

#[test]
fn max_num_batched_tokens_chunks_prefill_and_keeps_its_old_name() {
    let run = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "generate",
            "--device",
            "cpu",
            "--dtype",
            "f32",
            "--prompt",
            "a prompt of some thirty bytes..",
            "--max-tokens",
            "4",
            "--ignore-eos",
            "--json",
        ];
        args.extend(extra);
        json_lines(&encore(&args))[0]["output_ids"].clone()
    };
    let whole = run(&[]);
    assert_eq!(run(&["--max-num-batched-tokens", "7"]), whole);
    assert_eq!(run(&["--max-tokens-per-step", "7"]), whole);
}

#[test]
fn a_run_too_big_for_memory_is_refused_at_once() {
    let t = Instant::now();
    let err = failure(&encore(&[
        "bench",
        "decode",
        "--device",
        "cpu",
        "--batch",
        "100000",
        "--context",
        "2000",
    ]));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(
        err.contains("needs") && err.contains("GiB") && err.contains("KV cache"),
        "{err}"
    );
    assert!(
        err.contains("the limit is") && err.contains("host memory"),
        "{err}"
    );
    assert!(err.contains("--batch"), "{err}");
}

#[test]
fn a_batch_prints_a_header_per_prompt_and_labeled_summaries() {
    let out = encore(&[
        "generate",
        "--device",
        "cpu",
        "--prompt",
        "Hi",
        "--prompt",
        "second \"one\"",
        "--max-tokens",
        "3",
        "--ignore-eos",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let first = stdout
        .find("=== [1/2] prompt: \"Hi\" ===\n")
        .expect(&stdout);
    let second = stdout
        .find("=== [2/2] prompt: \"second \\\"one\\\"\" ===\n")
        .expect(&stdout);
    assert!(first == 0 && second > first, "{stdout}");
    let err = text(&out.stderr);
    for want in [
        "summary [1/2]: prompt 3 tokens, generated 3 (length), decode ",
        "tok/s (per sequence)",
        "summary [2/2]: prompt 13 tokens",
        "summary: 2 prompts on cpu",
        "tok/s (all sequences)",
    ] {
        assert!(err.contains(want), "{want}: {err}");
    }
}

#[test]
fn every_flag_has_a_help_line() {
    for cmd in [
        &["info"][..],
        &["generate"],
        &["bench", "kernels"],
        &["bench", "decode"],
        &["bench", "capture"],
        &["bench", "prefill"],
        &["bench", "serve"],
        &["bench", "offload"],
        &["serve"],
    ] {
        let out = encore(&[cmd, &["--help"]].concat());
        assert!(out.status.success());
        let help = text(&out.stdout);
        // Each option starts a line `  -x, --name <V>` or `      --name <V>`; its help
        // follows on the same line or on more-indented lines after it.
        let mut entries: Vec<(String, String)> = Vec::new();
        for line in help.lines() {
            let trimmed = line.trim_start();
            let indent = line.len() - trimmed.len();
            if indent <= 6 && trimmed.starts_with('-') {
                let (flag, rest) = trimmed.split_once("  ").unwrap_or((trimmed, ""));
                entries.push((flag.to_string(), rest.to_string()));
            } else if let Some(last) = entries.last_mut() {
                if indent > 6 {
                    last.1.push_str(trimmed);
                }
            }
        }
        assert!(entries.len() >= 2, "{cmd:?}: {help}");
        for (flag, help_text) in &entries {
            let words: String = help_text
                .split('[')
                .next()
                .unwrap_or("")
                .chars()
                .filter(|c| c.is_alphabetic())
                .collect();
            assert!(!words.is_empty(), "{cmd:?} {flag} has no help line");
        }
    }
    // The command's description (the first line of its help, its line in the list).
    let out = encore(&["generate", "--help"]);
    let about = text(&out.stdout).lines().next().unwrap_or("").to_string();
    assert!(
        about.starts_with("Generate text") && !about.contains("eagerly"),
        "{about}"
    );
    let list = text(&encore(&["--help"]).stdout);
    assert!(
        list.contains("generate") && !list.contains("eagerly"),
        "{list}"
    );
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

#[test]
fn bench_serve_in_process_reports_throughput_and_latencies() {
    let out = encore(&[
        "bench",
        "serve",
        "--in-process",
        "--device",
        "cpu",
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
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
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
    for (flag, value, what) in [
        ("--input-len", "5:2", "--input-len"),
        ("--request-rate", "0", "--request-rate"),
        ("--output-len", "0", "--output-len"),
    ] {
        let err = failure(&encore(&[
            "bench",
            "serve",
            "--in-process",
            "--device",
            "cpu",
            flag,
            value,
        ]));
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
fn generate_on_the_engine_loop_matches_offline_generation() {
    // `encore generate` submits to the engine loop's thread; the synchronous
    // `encore_core::generate::generate` over the same batch gives the same tokens, greedy
    // and seeded sampling alike, with min-p and penalties too.
    use encore_core::engine::{Engine, EngineConfig, KvSizing};
    use encore_core::generate::{generate, GenerateOptions};
    use encore_core::progress::NoProgress;
    use encore_core::runner::SamplingParams;
    let prompts = ["a", "two words", "a third, longer prompt"];
    let sampled = SamplingParams {
        temperature: 0.8,
        top_k: 20,
        top_p: 0.9,
        seed: 7,
        ..Default::default()
    };
    let penalised = SamplingParams {
        temperature: 0.8,
        min_p: 0.05,
        presence_penalty: 0.5,
        frequency_penalty: 0.2,
        repetition_penalty: 1.3,
        seed: 7,
        ..Default::default()
    };
    for (extra, sampling) in [
        (&[][..], SamplingParams::default()),
        (
            &[
                "--temperature",
                "0.8",
                "--top-k",
                "20",
                "--top-p",
                "0.9",
                "--seed",
                "7",
            ][..],
            sampled,
        ),
        (
            &[
                "--temperature",
                "0.8",
                "--min-p",
                "0.05",
                "--presence-penalty",
                "0.5",
                "--frequency-penalty",
                "0.2",
                "--repetition-penalty",
                "1.3",
                "--seed",
                "7",
            ][..],
            penalised,
        ),
    ] {
        let mut args = vec![
            "generate",
            "--device",
            "cpu",
            "--dtype",
            "f32",
            "--eager",
            "--max-seq-len",
            "256",
            "--max-tokens",
            "7",
            "--ignore-eos",
            "--json",
        ];
        for p in prompts {
            args.extend(["--prompt", p]);
        }
        args.extend(extra);
        let rows = json_lines(&encore(&args));
        assert_eq!(rows.len(), 3);
        let ids =
            |v: &serde_json::Value| -> Vec<u32> { serde_json::from_value(v.clone()).unwrap() };
        let prompt_ids: Vec<Vec<u32>> = rows.iter().map(|r| ids(&r["prompt_ids"])).collect();

        let be = encore_core::backend::cpu::CpuBackend::new();
        let files = encore_core::model::open_model("dummy:tiny").unwrap();
        let cfg = EngineConfig::new(DType::F32, 16, 2048, 3, 256, KvSizing::Blocks(1 + 3 * 16));
        let mut runner = Engine::new(&be, files, &cfg, &NoProgress).unwrap().runner;
        let opts = GenerateOptions {
            max_tokens: 7,
            sampling,
            ignore_eos: true,
        };
        let offline = generate(&mut runner, &prompt_ids, &[], &opts, &NoProgress, |_, _| {
            std::ops::ControlFlow::Continue(())
        })
        .unwrap();
        for (r, g) in rows.iter().zip(&offline) {
            assert_eq!(ids(&r["output_ids"]), g.output_ids, "{extra:?}: {r}");
            assert_eq!(r["finish_reason"], "length");
        }
    }
}

#[test]
fn stop_strings_end_generate_text_before_them() {
    // A stop string taken from the middle of a greedy run's text: the run with it ends
    // right before its first occurrence, with finish reason "stop" and fewer tokens;
    // streamed text (one prompt) and JSON text (two) agree.
    let args = |extra: &[&str]| {
        let mut v = vec![
            "generate",
            "--device",
            "cpu",
            "--dtype",
            "f32",
            "--eager",
            "--max-seq-len",
            "512",
            "--max-tokens",
            "300",
            "--ignore-eos",
            "--prompt",
            "The capital of France is",
        ];
        v.extend(extra);
        v.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let run = |extra: &[&str]| {
        let a = args(extra);
        encore(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let full = json_lines(&run(&["--json"]));
    let full_text = full[0]["text"].as_str().unwrap().to_string();
    let chars: Vec<char> = full_text.chars().collect();
    assert!(
        chars.len() >= 8,
        "too little text to pick a stop from: {full_text:?}"
    );
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
    let expected = &full_text[..full_text.find(&stop).unwrap()];

    let json = json_lines(&run(&["--json", "--stop", &stop, "--prompt", "x"]));
    assert_eq!(json[0]["text"], expected, "stop {stop:?} in {full_text:?}");
    assert_eq!(json[0]["finish_reason"], "stop");
    let n = json[0]["output_ids"].as_array().unwrap().len();
    assert!(n < 300, "{n} tokens: the prompt did not end at the stop");
    // The second prompt ran on, unless its own text reached the stop.
    let other = json[1]["finish_reason"].as_str().unwrap();
    assert!(other == "length" || other == "stop", "{other}");

    let streamed = run(&["--stop", &stop, "--stop", "never-in-the-output"]);
    assert!(streamed.status.success(), "{}", text(&streamed.stderr));
    assert_eq!(text(&streamed.stdout), format!("{expected}\n"));

    let err = failure(&run(&["--stop", ""]));
    assert!(err.contains("--stop"), "{err}");
}
