//! Round trips: every architecture and dtype pair, rounding, shards, tying and biases.

use super::*;

#[test]
fn round_trip_every_arch_and_dtype_pair() {
    // (architecture, extra config fields, checkpoint dtype, run dtype)
    let cases: &[(&str, &str, Dtype, DType)] = &[
        ("LlamaForCausalLM", "", Dtype::F32, DType::BF16),
        ("LlamaForCausalLM", "", Dtype::BF16, DType::BF16),
        (
            "MistralForCausalLM",
            r#", "sliding_window": 4096"#,
            Dtype::BF16,
            DType::F32,
        ),
        (
            "Qwen2ForCausalLM",
            r#", "tie_word_embeddings": true, "use_sliding_window": false"#,
            Dtype::F16,
            DType::BF16,
        ),
        (
            "Qwen3ForCausalLM",
            r#", "head_dim": 32, "tie_word_embeddings": true"#,
            Dtype::BF16,
            DType::F16,
        ),
        (
            "Qwen3ForCausalLM",
            r#", "head_dim": 24"#,
            Dtype::F32,
            DType::F32,
        ),
    ];
    for (k, &(arch, extra, src, run)) in cases.iter().enumerate() {
        let json = tiny_json(arch, extra);
        let cfg = ModelConfig::from_json(&json, "test").unwrap();
        let mut ts = checkpoint(&cfg, src, k as u64 + 1);
        // Extra tensors are ignored.
        ts.push(Ck {
            name: "model.layers.0.self_attn.rotary_emb.inv_freq".into(),
            dtype: Dtype::F32,
            shape: vec![cfg.head_dim / 2],
            values: vec![0.5; cfg.head_dim / 2],
        });
        let dir = model_dir("roundtrip", &json, &ts);
        let (cfg2, w) = load_dir(dir.path(), run).unwrap();
        assert_eq!(cfg, cfg2);
        check_model(&cfg, &w, &ts, run);
        let expect_bias = arch == "Qwen2ForCausalLM";
        assert_eq!(cfg.qkv_bias, expect_bias, "{arch}");
        assert_eq!(w.layers[0].qkv_bias().is_some(), expect_bias, "{arch}");
        assert_eq!(w.layers[0].q_norm().is_some(), arch == "Qwen3ForCausalLM");
    }
}

#[test]
fn conversion_rounds_to_nearest_even_once() {
    // 1 + 2^-8 lies halfway between two bf16 values: ties to even (1.0); 1 + 3*2^-9 rounds up.
    let xs = [1.0 + 1.0 / 256.0, 1.0 + 3.0 / 512.0, -0.1, 65504.0, 1e-8];
    let json = tiny_json("LlamaForCausalLM", "");
    let cfg = ModelConfig::from_json(&json, "test").unwrap();
    let mut ts = checkpoint(&cfg, Dtype::F32, 9);
    let norm = ts
        .iter_mut()
        .find(|t| t.name == "model.norm.weight")
        .unwrap();
    norm.values[..xs.len()].copy_from_slice(&xs);
    let dir = model_dir("rounding", &json, &ts);
    let (_, w) = load_dir(dir.path(), DType::BF16).unwrap();
    let got = download(&w.norm);
    assert_eq!(got[0], 1.0);
    assert_eq!(got[1], 1.0 + 1.0 / 128.0);
    assert_eq!(got[..xs.len()], xs.map(|x| bf16::from_f32(x).to_f32()));
    let (_, w) = load_dir(dir.path(), DType::F16).unwrap();
    assert_eq!(download(&w.norm)[3], 65504.0);
}

#[test]
fn sharded_checkpoint_loads_through_its_index() {
    let json = tiny_json("Qwen2ForCausalLM", "");
    let cfg = ModelConfig::from_json(&json, "test").unwrap();
    assert!(!cfg.tie_word_embeddings, "Qwen2's HF default is untied");
    let ts = checkpoint(&cfg, Dtype::BF16, 3);
    let dir = TempDir::new("sharded");
    std::fs::write(dir.path().join("config.json"), &json).unwrap();
    // Split across three shards, interleaved so q/k/v of a layer live in different files.
    let shard = |i: usize| format!("model-{:05}-of-00003.safetensors", i + 1);
    let mut weight_map = serde_json::Map::new();
    for s in 0..3 {
        let part: Vec<Ck> = ts.iter().skip(s).step_by(3).cloned().collect();
        for t in &part {
            weight_map.insert(t.name.clone(), shard(s).into());
        }
        write_safetensors(&dir.path().join(shard(s)), &part);
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let (_, w) = load_dir(dir.path(), DType::BF16).unwrap();
    check_model(&cfg, &w, &ts, DType::BF16);

    // An index mapping a tensor to a shard that does not hold it.
    let pos = ts
        .iter()
        .position(|t| t.name == "model.norm.weight")
        .unwrap();
    let other = shard((pos + 1) % 3);
    let mut bad = index.clone();
    bad["weight_map"]["model.norm.weight"] = other.clone().into();
    let index_path = dir.path().join("model.safetensors.index.json");
    std::fs::write(&index_path, bad.to_string()).unwrap();
    let (e, msg) = err_text(load_dir(dir.path(), DType::BF16));
    assert!(matches!(e, Error::Weights { .. }), "{msg}");
    assert!(
        msg.contains("`model.norm.weight`") && msg.contains(&other),
        "{msg}"
    );

    // An index naming a shard that is not there: the error names the shard's path.
    std::fs::write(&index_path, index.to_string()).unwrap();
    std::fs::remove_file(dir.path().join(shard(1))).unwrap();
    let (e, msg) = err_text(load_dir(dir.path(), DType::BF16));
    assert!(matches!(e, Error::Io { .. }), "{msg}");
    assert!(msg.contains(&shard(1)), "{msg}");

    // A corrupt index names the index file.
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        "{\"weight_",
    )
    .unwrap();
    let (e, msg) = err_text(load_dir(dir.path(), DType::BF16));
    assert!(matches!(e, Error::WeightsFile { .. }), "{msg}");
    assert!(msg.contains("model.safetensors.index.json"), "{msg}");
    std::fs::write(dir.path().join("model.safetensors.index.json"), "{}").unwrap();
    let (_, msg) = err_text(load_dir(dir.path(), DType::BF16));
    assert!(msg.contains("weight_map"), "{msg}");
}

#[test]
fn tied_embeddings_share_one_tensor_and_ignore_a_stored_lm_head() {
    let json = tiny_json("LlamaForCausalLM", r#", "tie_word_embeddings": true"#);
    let cfg = ModelConfig::from_json(&json, "test").unwrap();
    let mut ts = checkpoint(&cfg, Dtype::F32, 4);
    ts.push(Ck {
        name: "lm_head.weight".into(),
        dtype: Dtype::F32,
        shape: vec![cfg.vocab_size, cfg.hidden_size],
        values: vec![7.0; cfg.vocab_size * cfg.hidden_size],
    });
    let dir = model_dir("tied", &json, &ts);
    let (_, w) = load_dir(dir.path(), DType::F32).unwrap();
    assert!(w.lm_head.same_start(&w.embed));
    assert_eq!(w.lm_head.shape(), w.embed.shape());
    check_model(&cfg, &w, &ts, DType::F32);
}

#[test]
fn single_file_and_unindexed_shards_load_too() {
    let json = tiny_json("LlamaForCausalLM", "");
    let cfg = ModelConfig::from_json(&json, "test").unwrap();
    let ts = checkpoint(&cfg, Dtype::BF16, 5);
    let dir = model_dir("file", &json, &ts);
    // A path to the .safetensors file itself.
    let be = cpu();
    let file = dir.path().join("model.safetensors");
    let w = weights::load(
        &be,
        &cfg,
        WeightSource::Dir(PathBuf::from(&file)),
        DType::BF16,
        &encore_core::progress::NoProgress,
    )
    .unwrap();
    check_model(&cfg, &w, &ts, DType::BF16);
    // Two shards without an index.
    let dir = TempDir::new("noindex");
    let (a, b) = ts.split_at(ts.len() / 2);
    write_safetensors(&dir.path().join("a.safetensors"), a);
    write_safetensors(&dir.path().join("b.safetensors"), b);
    let w = weights::load(
        &be,
        &cfg,
        WeightSource::Dir(PathBuf::from(dir.path())),
        DType::F32,
        &encore_core::progress::NoProgress,
    )
    .unwrap();
    check_model(&cfg, &w, &ts, DType::F32);
    // The same tensor in both: ambiguous.
    write_safetensors(&dir.path().join("c.safetensors"), &a[..1]);
    let (e, msg) = err_text(weights::load(
        &be,
        &cfg,
        WeightSource::Dir(PathBuf::from(dir.path())),
        DType::F32,
        &encore_core::progress::NoProgress,
    ));
    assert!(matches!(e, Error::Weights { .. }), "{msg}");
    assert!(msg.contains(&a[0].name), "{msg}");
}

#[test]
fn llama_attention_bias_loads_qkv_bias_and_requires_a_zero_o_bias() {
    let json = tiny_json("LlamaForCausalLM", r#", "attention_bias": true"#);
    let cfg = ModelConfig::from_json(&json, "test").unwrap();
    assert!(cfg.qkv_bias);
    let mut ts = checkpoint(&cfg, Dtype::F32, 6);
    let o_bias = |v: f32| Ck {
        name: "model.layers.1.self_attn.o_proj.bias".into(),
        dtype: Dtype::F32,
        shape: vec![cfg.hidden_size],
        values: vec![v; cfg.hidden_size],
    };
    ts.push(o_bias(0.0));
    let dir = model_dir("obias", &json, &ts);
    let (_, w) = load_dir(dir.path(), DType::F32).unwrap();
    check_model(&cfg, &w, &ts, DType::F32);

    *ts.last_mut().unwrap() = o_bias(0.5);
    let dir = model_dir("obias-nonzero", &json, &ts);
    let (e, msg) = err_text(load_dir(dir.path(), DType::F32));
    assert!(matches!(e, Error::Weights { .. }), "{msg}");
    assert!(
        msg.contains("model.layers.1.self_attn.o_proj.bias"),
        "{msg}"
    );
}

/// Gemma 3: the text checkpoint (`Gemma3ForCausalLM`) and the language model of a
/// multimodal one (`Gemma3ForConditionalGeneration`, its config's `text_config`; tensors
/// under `language_model.model.` as transformers 4 saved them, or `model.language_model.`
/// as 5 does, beside a vision tower that is skipped) load the same weights; the norms
/// load as `1 + w` (q's times the query scale).
#[test]
fn gemma3_text_and_multimodal_checkpoints_load_the_same_language_model() {
    let text = r#""hidden_activation": "gelu_pytorch_tanh", "head_dim": 16,
        "query_pre_attn_scalar": 16, "sliding_window": 8, "layer_types":
        ["sliding_attention", "full_attention"], "final_logit_softcapping": null"#;
    let json = tiny_json("Gemma3ForCausalLM", &format!(", {text}"));
    let cfg = ModelConfig::from_json(&json, "test").unwrap();
    assert!(cfg.post_norms && cfg.norm_plus_one && cfg.tie_word_embeddings);
    let ts = checkpoint(&cfg, Dtype::F32, 41);
    let dir = model_dir("gemma3-text", &json, &ts);
    let (_, plain) = load_dir(dir.path(), DType::F32).unwrap();
    let embed = download(&plain.embed);
    let norm = download(&plain.norm);
    let hf_norm = &find(&ts, "model.norm.weight").values;
    assert!(norm.iter().zip(hf_norm).all(|(g, w)| *g == 1.0 + w));
    // The multimodal layouts: the text config nested, the tensors renamed, a vision tensor.
    let inner: serde_json::Value = serde_json::from_str(&json).unwrap();
    let mm_json = serde_json::json!({
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": inner,
        "vision_config": {"hidden_size": 8},
        "eos_token_id": [2, 106],
    })
    .to_string();
    for prefix in ["language_model.model.", "model.language_model."] {
        let mut mm: Vec<Ck> = ts
            .iter()
            .map(|t| Ck {
                name: t.name.replacen("model.", prefix, 1),
                ..t.clone()
            })
            .collect();
        mm.push(Ck {
            name: "vision_tower.vision_model.post_layernorm.weight".into(),
            dtype: Dtype::F32,
            shape: vec![8],
            values: vec![1.0; 8],
        });
        let dir = model_dir("gemma3-mm", &mm_json, &mm);
        let (mm_cfg, w) = load_dir(dir.path(), DType::F32).unwrap();
        assert_eq!(mm_cfg.arch, cfg.arch, "{prefix}");
        assert_eq!(mm_cfg.num_layers, cfg.num_layers);
        assert_eq!(download(&w.embed), embed, "{prefix}");
        assert_eq!(download(&w.norm), norm, "{prefix}");
        for (a, b) in w.layers.iter().zip(&plain.layers) {
            assert_eq!(download(a.qkv()), download(b.qkv()), "{prefix}");
            assert_eq!(
                download(a.mlp_out_norm().unwrap()),
                download(b.mlp_out_norm().unwrap())
            );
        }
    }
}
