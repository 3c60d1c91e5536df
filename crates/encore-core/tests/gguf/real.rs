//! The real model (not in CI): a GGUF file on disk loads, matches gguf-py and answers.

use super::*;

/// `ENCORE_GGUF_MODEL` (default: `ENCORE_SMOLLM2_GGUF`, SmolLM2-135M-Instruct Q4_1) loads on the CPU, matches
/// gguf-py's dequantization (`ENCORE_GGUF_REFERENCE`, made by
/// `scripts/gguf_reference.py model`), and answers a factual prompt.
#[test]
#[ignore = "needs a real GGUF model on disk"]
fn real_gguf_smoke() {
    let Ok(model) =
        std::env::var("ENCORE_GGUF_MODEL").or_else(|_| std::env::var("ENCORE_SMOLLM2_GGUF"))
    else {
        eprintln!("skipped: set ENCORE_GGUF_MODEL or ENCORE_SMOLLM2_GGUF to a GGUF file");
        return;
    };
    let t = std::time::Instant::now();
    let ModelFiles {
        config: cfg,
        source,
    } = open_model(&model).unwrap();
    eprintln!("config in {:.3} s: {cfg:?}", t.elapsed().as_secs_f64());
    assert_smollm2_135m_shape(&cfg);
    let file = GgufFile::open(Path::new(&model)).unwrap();
    if let Ok(reference) = std::env::var("ENCORE_GGUF_REFERENCE") {
        assert_dequantized_like_gguf_py(&file, Path::new(&reference));
    }
    let vocab = vocab_from_gguf(&file).unwrap();
    let t = std::time::Instant::now();
    let w = weights::load(
        &CpuBackend::new(),
        &cfg,
        source,
        DType::F32,
        &encore_core::progress::NoProgress,
    )
    .unwrap();
    eprintln!("weights (f32, CPU) in {:.2} s", t.elapsed().as_secs_f64());

    let id = |s: &str| vocab.tokens.iter().position(|t| t == s).unwrap() as u32;
    let prompt: Vec<u32> = ["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis"]
        .map(id)
        .to_vec();
    let out = greedy_on_cpu(&cfg, w, &[prompt], 16, 8).remove(0);
    let text: String = out
        .iter()
        .map(|&i| {
            vocab.tokens[i as usize]
                .replace('Ġ', " ")
                .replace('Ċ', "\n")
        })
        .collect();
    eprintln!("The capital of France is|{text}|");
    assert!(text.contains("Paris"), "{text}");
}

/// SmolLM2-135M's shape: 30 layers of 576, 9 heads over 3 KV heads, tied embeddings.
fn assert_smollm2_135m_shape(cfg: &ModelConfig) {
    assert_eq!(
        (
            cfg.num_layers,
            cfg.hidden_size,
            cfg.vocab_size,
            cfg.num_heads,
            cfg.num_kv_heads
        ),
        (30, 576, 49152, 9, 3)
    );
    assert_eq!(
        (cfg.head_dim, cfg.intermediate_size, cfg.rope.theta),
        (64, 1536, 100000.0)
    );
    assert!(cfg.tie_word_embeddings && !cfg.qkv_bias);
}

/// Every tensor of the `reference` file (gguf-py's dequantization) equals `file`'s, bit
/// for bit.
fn assert_dequantized_like_gguf_py(file: &GgufFile, reference: &Path) {
    let r = GgufFile::open(reference).unwrap();
    for t in r.tensors() {
        let want = r.tensor_f32(&t.name).unwrap();
        let got = file.tensor_f32(&t.name).unwrap();
        let same = want
            .iter()
            .zip(&got)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same && want.len() == got.len(),
            "{} differs from gguf-py",
            t.name
        );
        eprintln!("{}: {} values equal gguf-py's", t.name, want.len());
    }
}
