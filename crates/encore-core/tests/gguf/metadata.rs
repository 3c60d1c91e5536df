//! Config from GGUF metadata as llama.cpp writes it, and the errors naming an unsupported
//! key or a broken tensor.

use super::*;

fn small_cfg(arch: &str, extra: &str) -> ModelConfig {
    ModelConfig::from_json(&tiny_json(arch, extra), "test").unwrap()
}

/// A GGUF of `cfg` with `edit` applied, written and opened; returns the open result.
fn edited(
    dir: &TempDir,
    cfg: &ModelConfig,
    edit: impl FnOnce(&mut GgufWriter),
) -> (PathBuf, encore_core::Result<GgufFile>) {
    let ts = hf_checkpoint(cfg, Store::F32, 3);
    let mut w = gguf_twin(cfg, &ts, Store::F32);
    edit(&mut w);
    let path = dir.file("edited.gguf");
    w.write(&path).unwrap();
    let r = GgufFile::open(&path);
    (path, r)
}

fn config_of(
    cfg: &ModelConfig,
    edit: impl FnOnce(&mut GgufWriter),
) -> encore_core::Result<ModelConfig> {
    let dir = TempDir::new("cfg");
    let (_, file) = edited(&dir, cfg, edit);
    config_from_gguf(&file?)
}

#[test]
fn metadata_maps_to_the_config() {
    let cfg = small_cfg("LlamaForCausalLM", "");
    // Mistral-style llama file: a sliding window in every layer.
    let c = config_of(&cfg, |w| {
        w.kv("llama.attention.sliding_window", Value::U32(16));
        w.kv("tokenizer.ggml.eot_token_id", Value::U32(7));
        w.remove_kv("llama.attention.key_length");
        w.remove_kv("llama.attention.value_length");
        w.remove_kv("llama.attention.head_count_kv");
    })
    .unwrap();
    assert_eq!(
        c.sliding_window,
        Some(SlidingWindow {
            size: 16,
            first_layer: 0
        })
    );
    // A window of 0 is none (llama.cpp's converter writes 0 for Phi-4's `null`).
    let none = config_of(&cfg, |w| {
        w.kv("llama.attention.sliding_window", Value::U32(0));
    })
    .unwrap();
    assert_eq!(none.sliding_window, None);
    assert_eq!(c.eos_token_ids, vec![2, 7]);
    assert_eq!(c.head_dim, 16, "default head dim: embedding / heads");
    assert_eq!(c.num_kv_heads, 4, "default kv heads: heads");
    assert_eq!(c.vocab_size, 96, "vocab from the token list");
    let c = config_of(&cfg, |w| {
        w.kv("llama.vocab_size", Value::U64(96));
        w.kv("llama.rope.freq_base", Value::F64(500000.0));
    })
    .unwrap();
    assert_eq!(c.rope.theta, 500000.0);
    assert!(!c.tie_word_embeddings && !c.qkv_bias && !c.qk_norm);

    // Llama-3 scaling baked into rope_freqs.weight is recognised.
    let scaling = Llama3Scaling {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192,
    };
    let rope = RopeConfig {
        rot_dim: 16,
        theta: 500000.0,
        scaling: None,
    };
    let plain = rope.inv_freq();
    let scaled = RopeConfig {
        scaling: Some(RopeScaling::Llama3(scaling)),
        ..rope
    }
    .inv_freq();
    let divisors: Vec<f32> = plain
        .iter()
        .zip(&scaled)
        .map(|(p, s)| (p / s) as f32)
        .collect();
    assert!(divisors.iter().any(|&d| d > 1.0) && divisors.contains(&1.0));
    let dir = TempDir::new("rope");
    let (path, file) = edited(&dir, &cfg, |w| {
        w.kv("llama.rope.freq_base", Value::F32(500000.0));
        w.tensor_f32("rope_freqs.weight", &[8], &divisors);
    });
    let c = config_from_gguf(&file.unwrap()).unwrap();
    assert_eq!(c.rope.scaling, Some(RopeScaling::Llama3(scaling)));
    // rope_freqs.weight is consumed by the config, not an unused tensor.
    load(&c, WeightSource::Gguf(PathBuf::from(&path))).unwrap();
    let (_, msg) = err_text(config_of(&cfg, |w| {
        w.tensor_f32(
            "rope_freqs.weight",
            &[8],
            &[1.0, 2.0, 3.0, 1.0, 1.0, 1.0, 1.0, 5.0],
        );
    }));
    assert_mentions(&msg, &["rope_freqs.weight", "not supported"]);
}

#[test]
fn unsupported_metadata_is_an_error_naming_the_key() {
    let cfg = small_cfg("LlamaForCausalLM", "");
    type Edit = Box<dyn FnOnce(&mut GgufWriter)>;
    let cases: Vec<(Edit, Vec<&str>)> = vec![
        (
            Box::new(|w| {
                w.kv("general.architecture", Value::String("olmoe".into()));
            }),
            vec!["olmoe", "general.architecture", "llama, qwen2, qwen3"],
        ),
        (
            Box::new(|w| {
                w.remove_kv("general.architecture");
            }),
            vec!["general.architecture", "missing"],
        ),
        (
            // Mixtral as llama.cpp writes it (`llama` with experts), with more experts
            // per token than experts.
            Box::new(|w| {
                w.kv("llama.expert_count", Value::U32(8));
                w.kv("llama.expert_used_count", Value::U32(9));
            }),
            vec![
                "llama.expert_used_count",
                "9",
                "more than",
                "llama.expert_count",
            ],
        ),
        (
            Box::new(|w| {
                w.kv("llama.rope.dimension_count", Value::U32(8));
            }),
            vec!["llama.rope.dimension_count", "partial rotary"],
        ),
        (
            Box::new(|w| {
                w.kv("llama.rope.scaling.type", Value::String("longrope".into()));
            }),
            vec!["llama.rope.scaling.type", "longrope"],
        ),
        // YaRN without its factor, and with what transformers' YaRN has no counterpart for.
        (
            Box::new(|w| {
                w.kv("llama.rope.scaling.type", Value::String("yarn".into()));
            }),
            vec!["llama.rope.scaling.factor", "missing"],
        ),
        (
            Box::new(|w| {
                w.kv("llama.rope.scaling.type", Value::String("yarn".into()));
                w.kv("llama.rope.scaling.factor", Value::F32(4.0));
                w.kv("llama.rope.scaling.yarn_ext_factor", Value::F32(0.5));
            }),
            vec!["llama.rope.scaling.yarn_ext_factor", "0.5"],
        ),
        (
            Box::new(|w| {
                w.kv("llama.expert_count", Value::U32(8));
            }),
            vec!["llama.expert_used_count", "missing"],
        ),
        (
            Box::new(|w| {
                w.remove_kv("llama.block_count");
            }),
            vec!["llama.block_count", "missing"],
        ),
        (
            Box::new(|w| {
                w.kv("llama.block_count", Value::U32(1 << 30));
            }),
            vec!["llama.block_count", "1073741824", "tensors"],
        ),
        (
            Box::new(|w| {
                w.kv("llama.attention.head_count_kv", Value::U32(3));
            }),
            vec!["llama.attention.head_count_kv", "multiple"],
        ),
        // Sizes no model has, and metadata the embedding contradicts, fail before any
        // memory estimate sees them.
        (
            Box::new(|w| {
                w.kv("llama.embedding_length", Value::U64(1 << 62));
            }),
            vec!["llama.embedding_length", "4611686018427387904", "beyond"],
        ),
        (
            Box::new(|w| {
                w.kv("llama.embedding_length", Value::U32(128));
                w.kv("llama.attention.key_length", Value::U32(16));
            }),
            vec!["token_embd.weight", "llama.embedding_length", "128"],
        ),
        (
            Box::new(|w| {
                w.kv(
                    "llama.attention.head_count",
                    Value::Array(5, vec![Value::I32(4); 2]),
                );
            }),
            vec!["llama.attention.head_count", "per-layer"],
        ),
        (
            Box::new(|w| {
                w.kv("llama.context_length", Value::String("big".into()));
            }),
            vec!["llama.context_length", "\"big\""],
        ),
    ];
    for (edit, parts) in cases {
        let (e, msg) = err_text(config_of(&cfg, edit));
        assert!(matches!(e, Error::Config { .. }), "{msg}");
        assert_mentions(&msg, &parts);
        assert_mentions(&msg, &["edited.gguf"]);
    }
}

fn load_err(cfg: &ModelConfig, edit: impl FnOnce(&mut GgufWriter)) -> (Error, String) {
    let dir = TempDir::new("werr");
    let (path, _) = edited(&dir, cfg, edit);
    err_text(load(cfg, WeightSource::Gguf(PathBuf::from(&path))))
}

#[test]
fn tensor_problems_are_errors_naming_the_tensor() {
    let cfg = small_cfg("Qwen2ForCausalLM", "");
    // An unsupported GGML type names the type and both names.
    let wide = ModelConfig {
        hidden_size: 256,
        ..small_cfg("Qwen2ForCausalLM", "")
    };
    let (e, msg) = load_err(&wide, |w| {
        w.remove_tensor("blk.1.ffn_gate.weight");
        w.tensor(
            "blk.1.ffn_gate.weight",
            &[96, 256],
            GgmlType::Q2_K,
            vec![0; 96 * 84],
        );
    });
    assert!(matches!(e, Error::Weights { .. }), "{msg}");
    assert_mentions(
        &msg,
        &[
            "blk.1.ffn_gate.weight",
            "Q2_K",
            "model.layers.1.mlp.gate_proj.weight",
        ],
    );
    let (_, msg) = load_err(&cfg, |w| {
        w.remove_tensor("token_embd.weight");
        w.tensor(
            "token_embd.weight",
            &[96, 256],
            GgmlType::IQ2_XXS,
            vec![0; 96 * 66],
        );
    });
    assert_mentions(&msg, &["token_embd.weight", "shape [96, 256]", "[96, 64]"]);
    // Missing: both names.
    let (_, msg) = load_err(&cfg, |w| {
        w.remove_tensor("blk.1.attn_k.bias");
    });
    assert_mentions(
        &msg,
        &[
            "blk.1.attn_k.bias",
            "model.layers.1.self_attn.k_proj.bias",
            "missing",
        ],
    );
    // Unused: the first in model order.
    let (_, msg) = load_err(&cfg, |w| {
        w.tensor_f32("blk.2.attn_norm.weight", &[64], &[1.0; 64]);
        w.tensor_f32("blk.10.attn_norm.weight", &[64], &[1.0; 64]);
        w.tensor_f32("zzz", &[1], &[1.0]);
    });
    assert_mentions(
        &msg,
        &["`blk.2.attn_norm.weight`", "does not use", "3 unused"],
    );
    // An attention output bias of zeros is accepted (as the safetensors loader does),
    // any other value is named.
    let dir = TempDir::new("obias");
    let (path, _) = edited(&dir, &cfg, |w| {
        w.tensor_f32("blk.1.attn_output.bias", &[64], &[0.0; 64]);
    });
    load(&cfg, WeightSource::Gguf(PathBuf::from(&path))).unwrap();
    let (_, msg) = load_err(&cfg, |w| {
        let mut bias = [0.0; 64];
        bias[5] = 0.5;
        w.tensor_f32("blk.1.attn_output.bias", &[64], &bias);
    });
    assert_mentions(&msg, &["`blk.1.attn_output.bias`", "not all zeros"]);
    // Shape: GGUF dims are reversed against HF's.
    let (_, msg) = load_err(&cfg, |w| {
        w.remove_tensor("blk.0.attn_output.weight");
        w.tensor_f32("blk.0.attn_output.weight", &[32, 64], &[0.0; 32 * 64]);
    });
    assert_mentions(
        &msg,
        &[
            "model.layers.0.self_attn.o_proj.weight",
            "blk.0.attn_output.weight",
            "[64, 32]",
            "[64, 64]",
        ],
    );
    // A non-finite norm weight.
    let (_, msg) = load_err(&cfg, |w| {
        w.remove_tensor("output_norm.weight");
        let mut v = vec![1.0; 64];
        v[3] = f32::NAN;
        w.tensor_f32("output_norm.weight", &[64], &v);
    });
    assert_mentions(&msg, &["model.norm.weight", "element 3", "NaN"]);
}
