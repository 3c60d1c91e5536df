//! The `encore` binary end to end on the CPU: `info`'s self-check, a help line for every
//! flag, and clear errors (never a panic) for bad input, closed pipes and runs too big to
//! fit. `generate` is tested in generate_cli.rs, the benchmarks in bench_cli.rs.

mod common;

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{bench_on_cpu, command, encore, failure, success, temp_dir, text};

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

    // A weight format encore does not run, and one the model's rows cannot hold (tiny's
    // rows of 128 are not whole Q4_K blocks of 256): the flag and the tensor.
    let err = failure(&encore(&[
        "generate",
        "--device",
        "cpu",
        "--quantization",
        "q2_k",
    ]));
    assert!(
        err.contains("q2_k") && err.contains("--quantization"),
        "{err}"
    );
    let err = failure(&encore(&[
        "generate",
        "--device",
        "cpu",
        "--quantization",
        "q4_k",
    ]));
    assert!(
        err.contains("--quantization q4_k")
            && err.contains("model.layers.0.self_attn.qkv_proj")
            && err.contains("128"),
        "{err}"
    );

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

    // A mixture of experts is read (`info` counts its weights): Mixtral-8x7B's config,
    // 46,702,792,704 parameters, 93.41 GB in bf16.
    let dir = temp_dir("moe");
    std::fs::write(
        dir.join("config.json"),
        r#"{"architectures": ["MixtralForCausalLM"], "vocab_size": 32000, "hidden_size": 4096,
            "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
            "rms_norm_eps": 1e-5, "rope_theta": 1e6, "tie_word_embeddings": false}"#,
    )
    .unwrap();
    // The model's description, without the kernel self-check (info_self_check_passes_on_cpu
    // runs that): the check takes ~20 s of this machine's CPU a call.
    let describe = |model: &str| {
        success(&encore(&[
            "info",
            "--device",
            "cpu",
            "--no-self-check",
            "--model",
            model,
        ]))
    };
    let out = describe(dir.to_str().unwrap());
    assert!(out.contains("Mixtral, 32 layers, hidden 4096"), "{out}");
    assert!(out.contains("weights 93.41 GB"), "{out}");
    // 8 experts of 3 x 4096 x 14336 in bf16 a layer; a token reads 2 of them.
    assert!(
        out.contains("experts 8 per sparse layer (32 of 32 layers), top 2, 14336 wide: 90.19 GB, 352.3 MB each; a token reads 22.55 GB"),
        "{out}"
    );
    // Its dummy twin has the same shapes.
    let out = describe("dummy:mixtral-8x7b");
    assert!(out.contains("weights 93.41 GB"), "{out}");
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
fn a_run_too_big_for_memory_is_refused_at_once() {
    let t = Instant::now();
    let err = failure(&bench_on_cpu(
        "decode",
        &["--batch", "100000", "--context", "2000"],
    ));
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

/// `bench kernels --only` runs just the named groups (on the CPU, quick shapes) and
/// refuses a group it does not know, listing the ones it does.
#[test]
fn bench_kernels_runs_only_the_named_groups() {
    let out = encore(&[
        "bench",
        "kernels",
        "--device",
        "cpu",
        "--quick",
        "--only",
        "copy,gemv",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(table.contains("device copy"), "{table}");
    assert!(
        table.contains("gemv 1x256x256 f32") && table.contains("GB/s"),
        "{table}"
    );
    for absent in ["gemm", "decode attention", "launch", "moe"] {
        assert!(!table.contains(absent), "{absent} in {table}");
    }
    let out = encore(&["bench", "kernels", "--device", "cpu", "--only", "gemv,nope"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("nope") && err.contains("gemv"), "{err}");
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
