//! `encore generate` end to end on the CPU with the built-in dummy models: text and JSON
//! output, batches, prompts from stdin and files, dtype names, graph mode against eager,
//! stop strings, and the engine loop against offline generation.

mod common;

use std::process::Output;

use common::{bench_on_cpu, encore, encore_with_stdin, failure, json_lines, temp_dir, text};
use encore_core::request::SamplingParams;
use encore_core::DType;

/// `encore generate --device cpu` with `args`.
fn generate(args: &[&str]) -> Output {
    encore(&[&["generate", "--device", "cpu"][..], args].concat())
}

#[test]
fn generate_json_for_a_batch_of_prompts() {
    let out = generate(&[
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
    let lines = json_lines(&out);
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
        let mut args = vec!["--max-tokens", "6", "--ignore-eos", "--json"];
        for p in prompts {
            args.extend(["--prompt", p]);
        }
        json_lines(&generate(&args))
    };
    let alone = run(&["one two three"]);
    let batched = run(&["x", "one two three", "a much longer prompt than the others"]);
    assert_eq!(alone[0]["output_ids"], batched[1]["output_ids"]);
}

#[test]
fn graph_mode_generates_what_eager_generates() {
    let run = |extra: &[&str]| -> Vec<serde_json::Value> {
        let mut args = vec![
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
        json_lines(&generate(&args))
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
fn generate_streams_text_and_prints_a_summary() {
    let out = generate(&["--prompt", "Hi", "--max-tokens", "4", "--ignore-eos"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("prompt 3 tokens, generated 4 (length)"),
        "{err}"
    );
    assert!(err.contains("decode") && err.contains("tok/s"), "{err}");
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
        json_lines(&generate(&[
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
    let out = bench_on_cpu(
        "capture",
        &[
            "--dtype",
            "Float32",
            "--buckets",
            "1",
            "--max-batch",
            "1",
            "--strategies",
            "arena",
            "--json",
        ],
    );
    assert_eq!(json_lines(&out)[0]["dtype"], "f32");
}

#[test]
fn max_num_batched_tokens_chunks_prefill_and_keeps_its_old_name() {
    let run = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
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
        json_lines(&generate(&args))[0]["output_ids"].clone()
    };
    let whole = run(&[]);
    assert_eq!(run(&["--max-num-batched-tokens", "7"]), whole);
    assert_eq!(run(&["--max-tokens-per-step", "7"]), whole);
}

#[test]
fn a_batch_prints_a_header_per_prompt_and_labeled_summaries() {
    let out = generate(&[
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

/// The output ids of the synchronous `encore_core::generate::generate` of `dummy:tiny`
/// in f32 on the CPU: 7 tokens per prompt, end-of-sequence ignored.
fn offline(prompt_ids: &[Vec<u32>], sampling: SamplingParams) -> Vec<Vec<u32>> {
    use encore_core::engine::{Engine, EngineConfig, KvSizing};
    use encore_core::generate::{generate, GenerateOptions};
    use encore_core::progress::NoProgress;
    let be = encore_core::backend::cpu::CpuBackend::new();
    let files = encore_core::model::open_model("dummy:tiny").unwrap();
    let cfg = EngineConfig::new(DType::F32, 16, 2048, 3, 256, KvSizing::Blocks(1 + 3 * 16));
    let mut runner = Engine::new(&be, files, &cfg, &NoProgress).unwrap().runner;
    let opts = GenerateOptions {
        max_tokens: 7,
        sampling,
        ignore_eos: true,
    };
    generate(&mut runner, prompt_ids, &[], &opts, &NoProgress, |_, _| {
        std::ops::ControlFlow::Continue(())
    })
    .unwrap()
    .into_iter()
    .map(|g| g.output_ids)
    .collect()
}

#[test]
fn generate_on_the_engine_loop_matches_offline_generation() {
    // `encore generate` submits to the engine loop's thread; the synchronous
    // `encore_core::generate::generate` over the same batch gives the same tokens, greedy
    // and seeded sampling alike, with min-p and penalties too.
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
        let rows = json_lines(&generate(&args));
        assert_eq!(rows.len(), 3);
        let ids =
            |v: &serde_json::Value| -> Vec<u32> { serde_json::from_value(v.clone()).unwrap() };
        let prompt_ids: Vec<Vec<u32>> = rows.iter().map(|r| ids(&r["prompt_ids"])).collect();

        for (r, g) in rows.iter().zip(offline(&prompt_ids, sampling)) {
            assert_eq!(ids(&r["output_ids"]), g, "{extra:?}: {r}");
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
        generate(&a.iter().map(String::as_str).collect::<Vec<_>>())
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

/// `--speculative-method ngram`, `draft` and `eagle3` generate what decoding token by token
/// generates, greedy and sampled, in graph mode (verify steps replayed from their graphs)
/// and eagerly; bad speculative flags (a draft model of another vocabulary among them)
/// are refused naming them.
#[test]
fn ngram_speculation_generates_the_same_tokens() {
    let run = |extra: &[&str]| -> Vec<serde_json::Value> {
        // In f32 a verify step's logits equal a decode step's bit for bit on the CPU (in
        // bf16 they round differently, which can move a sample).
        let mut args = vec![
            "--model",
            "dummy:tiny",
            "--dtype",
            "f32",
            "--prompt",
            "abcabcabcabcabcabc",
            "--prompt",
            "the cat sat on the mat, the cat sat on",
            "--max-tokens",
            "40",
            "--ignore-eos",
            "--json",
        ];
        args.extend_from_slice(extra);
        json_lines(&generate(&args))
            .into_iter()
            .map(|v| v["output_ids"].clone())
            .collect()
    };
    let ngram = [
        "--speculative-method",
        "ngram",
        "--num-speculative-tokens",
        "6",
    ];
    // The target itself as the draft (every greedy draft kept), and another model.
    let draft = [
        "--speculative-method",
        "draft",
        "--draft-model",
        "dummy:tiny",
    ];
    let other = [
        "--speculative-method",
        "draft",
        "--draft-model",
        "dummy:tiny-llama3",
    ];
    // A random EAGLE-3 head shaped for the target.
    let eagle = [
        "--speculative-method",
        "eagle3",
        "--draft-model",
        "dummy:eagle3",
    ];
    for sampling in [
        &["--temperature", "0"][..],
        &["--temperature", "0.9", "--seed", "5"],
    ] {
        for mode in [&[][..], &["--eager"]] {
            let plain = run(&[sampling, mode].concat());
            for spec in [&ngram[..], &draft, &other, &eagle] {
                let fast = run(&[sampling, mode, spec].concat());
                assert_eq!(plain, fast, "{sampling:?} {mode:?} {spec:?}");
            }
        }
    }
    // The summary line counts the kept drafts: all of them, greedy with itself.
    let out = generate(
        &[
            &[
                "--model",
                "dummy:tiny",
                "--prompt",
                "abc",
                "--max-tokens",
                "20",
            ][..],
            &draft,
        ]
        .concat(),
    );
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("speculative decoding:"))
        .unwrap_or_else(|| panic!("no speculative line: {err}"));
    let kept = line.split(", ").find(|p| p.ends_with("(100.0%)"));
    assert!(kept.is_some(), "{line}");
    let head = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../encore-core/tests/data/eagle/head"
    );
    for (args, want) in [
        (
            &["--speculative-method", "eagle3"][..],
            "--speculative-method eagle3 needs --draft-model",
        ),
        (
            &["--speculative-method", "medusa"],
            "expected ngram, draft or eagle3",
        ),
        (
            &[
                "--speculative-method",
                "eagle3",
                "--draft-model",
                "dummy:tiny",
            ],
            "not an EAGLE-3 head",
        ),
        (
            &["--speculative-method", "draft", "--draft-model", head],
            "use --speculative-method eagle3",
        ),
        // The reference head was made for a target of 211 tokens.
        (
            &["--speculative-method", "eagle3", "--draft-model", head],
            "vocabulary of 211 tokens",
        ),
        (
            &[
                "--speculative-method",
                "eagle3",
                "--draft-model",
                "dummy:eagle3",
                "-t",
                "2",
            ],
            "tensor parallelism splits",
        ),
        (&["--speculative-method", "draft"], "needs --draft-model"),
        (&["--draft-model", "dummy:tiny"], "--speculative-method"),
        (
            &[
                "--speculative-method",
                "ngram",
                "--draft-model",
                "dummy:tiny",
            ],
            "--speculative-method draft",
        ),
        (
            &[
                "--speculative-method",
                "draft",
                "--draft-model",
                "dummy:qwen2.5-0.5b",
            ],
            "--draft-model",
        ),
        (
            &[
                "--speculative-method",
                "draft",
                "--draft-model",
                "/no/such/model",
            ],
            "--draft-model /no/such/model",
        ),
        (&["--num-speculative-tokens", "4"], "--speculative-method"),
        (
            &["--speculative-disable-by-batch-size", "4"],
            "--speculative-method",
        ),
        (
            &[
                "--speculative-method",
                "ngram",
                "--speculative-disable-by-batch-size",
                "0",
            ],
            "--speculative-disable-by-batch-size",
        ),
        (
            &[
                "--speculative-method",
                "ngram",
                "--num-speculative-tokens",
                "0",
            ],
            "--num-speculative-tokens",
        ),
        (
            &[
                "--speculative-method",
                "ngram",
                "--ngram-min",
                "5",
                "--ngram-max",
                "2",
            ],
            "--ngram-min",
        ),
    ] {
        let err = failure(&generate(&[args, &["--max-tokens", "2"]].concat()));
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// A mixture of experts over two and four tensor-parallel CPU ranks generates one rank's
/// tokens: with a shared expert, and under the expert cache (each rank its own budget),
/// with and without its prefetch of the next layer's experts.
#[test]
fn a_mixture_of_experts_over_tensor_parallel_ranks_generates_one_ranks_tokens() {
    let run = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "--dtype",
            "f32",
            "--prompt",
            "the quick brown fox",
            "--max-tokens",
            "12",
            "--ignore-eos",
            "--json",
        ];
        args.extend_from_slice(extra);
        let v = json_lines(&generate(&args));
        assert_eq!(v.len(), 1, "{extra:?}");
        v[0]["output_ids"].clone()
    };
    for model in [
        &["--model", "dummy:tiny-qwen2-moe"][..],
        &["--model", "dummy:tiny-qwen3-moe", "--weight-budget", "80%"],
        &[
            "--model",
            "dummy:tiny-qwen3-moe",
            "--weight-budget",
            "80%",
            "--expert-prefetch",
        ],
    ] {
        let one = run(model);
        for size in ["2", "4"] {
            let tp = run(&[model, &["--tensor-parallel-size", size][..]].concat());
            assert_eq!(tp, one, "{model:?} over {size} ranks");
        }
    }
}

/// Speculation over a mixture of experts, under a weight budget (the expert cache and the
/// layer ring), with quantized weights and over two tensor-parallel ranks generates what
/// decoding token by token does (n-gram drafts everywhere; an EAGLE-3 head but over two
/// ranks; a draft model over two ranks);
/// and a stop string inside a run of kept drafts ends the text where it ends without
/// speculation.
#[test]
fn speculation_with_moe_offload_quantized_weights_and_stop_strings() {
    let run = |extra: &[&str]| -> Vec<(serde_json::Value, serde_json::Value)> {
        let mut args = vec![
            "--dtype",
            "f32",
            "--prompt",
            "abcabcabcabcabcabcabcabc",
            "--max-tokens",
            "30",
            "--ignore-eos",
            "--json",
        ];
        args.extend_from_slice(extra);
        json_lines(&generate(&args))
            .into_iter()
            .map(|v| (v["output_ids"].clone(), v["text"].clone()))
            .collect()
    };
    let ngram = ["--speculative-method", "ngram"];
    for model in [
        &["--model", "dummy:tiny-qwen3-moe"][..],
        &["--model", "dummy:tiny-qwen3-moe", "--weight-budget", "80%"],
        &["--model", "dummy:tiny", "--weight-budget", "50%"],
        &["--model", "dummy:tiny", "--quantization", "q8_0"],
        // Tensor parallelism: the verify graphs run on every rank.
        &["--model", "dummy:tiny", "--tensor-parallel-size", "2"],
    ] {
        let plain = run(model);
        assert_eq!(plain.len(), 1, "{model:?}");
        assert_eq!(run(&[model, &ngram[..]].concat()), plain, "{model:?}");
        // Over two ranks a draft model runs on the first rank's device.
        if model.contains(&"--tensor-parallel-size") {
            let draft = [
                "--speculative-method",
                "draft",
                "--draft-model",
                "dummy:tiny",
            ];
            assert_eq!(run(&[model, &draft[..]].concat()), plain, "{model:?}");
        }
        // An EAGLE-3 head reads an MoE's, a quantized model's and an offloaded model's
        // hidden states alike (on one device).
        if !model.contains(&"--tensor-parallel-size") {
            let eagle = [
                "--speculative-method",
                "eagle3",
                "--draft-model",
                "dummy:eagle3",
            ];
            assert_eq!(run(&[model, &eagle[..]].concat()), plain, "{model:?}");
        }
    }
    // A stop string taken from the middle of the plain text.
    let plain = run(&["--model", "dummy:tiny"]);
    let text = plain[0].1.as_str().unwrap().to_string();
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() > 12, "{text:?}");
    let stop: String = chars[8..10].iter().collect();
    let with_stop = |extra: &[&str]| {
        let args = [
            &["--model", "dummy:tiny", "--stop", stop.as_str()][..],
            extra,
        ]
        .concat();
        let v = json_lines(&generate(
            &[
                &args[..],
                &[
                    "--dtype",
                    "f32",
                    "--prompt",
                    "abcabcabcabcabcabcabcabc",
                    "--max-tokens",
                    "30",
                    "--json",
                ],
            ]
            .concat(),
        ));
        (v[0]["text"].clone(), v[0]["finish_reason"].clone())
    };
    let want = with_stop(&[]);
    assert_eq!(want.1, "stop", "{want:?}");
    assert!(!want.0.as_str().unwrap().contains(&stop), "{want:?}");
    assert_eq!(with_stop(&ngram), want);
}
