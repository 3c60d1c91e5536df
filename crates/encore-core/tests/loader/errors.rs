//! Broken checkpoints: each error names the tensor, the shape, the dtype or the path.

use super::*;

/// Load a tiny Llama checkpoint after `edit`; return the error and its message.
fn broken(tag: &str, edit: impl FnOnce(&mut Vec<Ck>)) -> (Error, String) {
    let json = tiny_json("LlamaForCausalLM", "");
    let cfg = ModelConfig::from_json(&json, "test").unwrap();
    let mut ts = checkpoint(&cfg, Dtype::BF16, 8);
    edit(&mut ts);
    let dir = model_dir(tag, &json, &ts);
    err_text(load_dir(dir.path(), DType::BF16))
}

#[test]
fn a_missing_tensor_is_named() {
    let (e, msg) = broken("missing", |ts| {
        ts.retain(|t| t.name != "model.layers.1.self_attn.k_proj.weight")
    });
    assert!(matches!(e, Error::Weights { .. }), "{msg}");
    assert!(
        msg.contains("`model.layers.1.self_attn.k_proj.weight`"),
        "{msg}"
    );
    assert!(msg.contains("missing"), "{msg}");
    // The last tensor too (untied lm_head), so all checks run before any upload.
    let (_, msg) = broken("missing-last", |ts| {
        ts.retain(|t| t.name != "lm_head.weight")
    });
    assert!(
        msg.contains("`lm_head.weight`") && msg.contains("missing"),
        "{msg}"
    );
}

#[test]
fn tensors_the_config_does_not_use_are_named() {
    // A checkpoint of 30 layers under a config of 2 (the tiny config): the first unused
    // tensor in model order is layer 2's, not layer 10's or 29's.
    let (e, msg) = broken("unused-layers", |ts| {
        let json = tiny_json("LlamaForCausalLM", r#", "num_hidden_layers": 30"#);
        let deep = ModelConfig::from_json(&json, "test").unwrap();
        *ts = checkpoint(&deep, Dtype::BF16, 8);
    });
    assert!(matches!(e, Error::Weights { .. }), "{msg}");
    assert!(
        msg.contains("`model.layers.2.input_layernorm.weight`"),
        "{msg}"
    );
    assert!(
        msg.contains("does not use") && msg.contains("252 unused"),
        "{msg}"
    );
    // One stray tensor anywhere.
    let (_, msg) = broken("unused-one", |ts| {
        ts.push(Ck {
            name: "model.layers.0.mlp.extra_proj.weight".into(),
            dtype: Dtype::BF16,
            shape: vec![2],
            values: vec![0.0; 2],
        })
    });
    assert!(
        msg.contains("`model.layers.0.mlp.extra_proj.weight`"),
        "{msg}"
    );
}

#[test]
fn a_layer_count_beyond_the_checkpoint_fails_fast() {
    // A count the checkpoint does not back is refused at once, naming the first missing
    // layer, before the plan names every layer's tensors (a billion layers is refused
    // earlier still, by the config's size limits).
    let json = tiny_json("LlamaForCausalLM", r#", "num_hidden_layers": 4000"#);
    let cfg = ModelConfig::from_json(&json, "test").unwrap();
    let tiny = ModelConfig::from_json(&tiny_json("LlamaForCausalLM", ""), "test").unwrap();
    let dir = model_dir("layer-count", &json, &checkpoint(&tiny, Dtype::BF16, 8));
    let t = std::time::Instant::now();
    let r = weights::load(
        &cpu(),
        &cfg,
        WeightSource::Dir(PathBuf::from(dir.path())),
        DType::BF16,
        &encore_core::progress::NoProgress,
    );
    let (e, msg) = err_text(r);
    assert!(t.elapsed().as_secs() < 5, "took {:?}", t.elapsed());
    assert!(matches!(e, Error::Weights { .. }), "{msg}");
    assert!(
        msg.contains("`model.layers.2.self_attn.o_proj.weight`")
            && msg.contains("num_hidden_layers = 4000"),
        "{msg}"
    );
}

#[test]
fn a_non_finite_norm_weight_is_named() {
    for (k, bad) in [f32::NAN, f32::INFINITY].into_iter().enumerate() {
        let (e, msg) = broken(&format!("nan-norm-{k}"), |ts| {
            let t = ts
                .iter_mut()
                .find(|t| t.name == "model.layers.1.post_attention_layernorm.weight")
                .unwrap();
            t.values[3] = bad;
        });
        assert!(matches!(e, Error::Weights { .. }), "{msg}");
        assert!(
            msg.contains("`model.layers.1.post_attention_layernorm.weight`")
                && msg.contains("element 3")
                && msg.contains("finite"),
            "{msg}"
        );
    }
}

#[test]
fn a_wrong_shape_names_expected_and_found() {
    let (e, msg) = broken("shape", |ts| {
        let t = ts
            .iter_mut()
            .find(|t| t.name == "model.layers.0.mlp.down_proj.weight")
            .unwrap();
        t.shape.reverse();
    });
    assert!(matches!(e, Error::Weights { .. }), "{msg}");
    assert!(
        msg.contains("`model.layers.0.mlp.down_proj.weight`"),
        "{msg}"
    );
    assert!(
        msg.contains("[80, 64]") && msg.contains("expected [64, 80]"),
        "{msg}"
    );
}

#[test]
fn an_unsupported_dtype_is_named() {
    let (e, msg) = broken("dtype", |ts| {
        let t = ts
            .iter_mut()
            .find(|t| t.name == "model.norm.weight")
            .unwrap();
        t.dtype = Dtype::I32;
    });
    assert!(matches!(e, Error::Weights { .. }), "{msg}");
    assert!(
        msg.contains("`model.norm.weight`") && msg.contains("I32"),
        "{msg}"
    );
}

#[test]
fn truncated_and_corrupt_files_name_the_path() {
    let json = tiny_json("LlamaForCausalLM", "");
    let cfg = ModelConfig::from_json(&json, "test").unwrap();
    let dir = model_dir("truncated", &json, &checkpoint(&cfg, Dtype::BF16, 10));
    let file = dir.path().join("model.safetensors");
    let full = std::fs::read(&file).unwrap();
    for len in [full.len() - 10, 200, 4, 0] {
        std::fs::write(&file, &full[..len]).unwrap();
        let (e, msg) = err_text(load_dir(dir.path(), DType::BF16));
        assert!(matches!(e, Error::WeightsFile { .. }), "{len}: {msg}");
        assert!(msg.contains(&file.display().to_string()), "{msg}");
    }
    let mut garbage = full.clone();
    garbage[8..16].copy_from_slice(b"not json");
    std::fs::write(&file, &garbage).unwrap();
    let (e, msg) = err_text(load_dir(dir.path(), DType::BF16));
    assert!(matches!(e, Error::WeightsFile { .. }), "{msg}");
}

#[test]
fn missing_directories_and_files_name_the_path() {
    let json = tiny_json("LlamaForCausalLM", "");
    let cfg = ModelConfig::from_json(&json, "test").unwrap();
    let be = cpu();
    let dir = TempDir::new("empty");
    let gone = dir.path().join("no-such-model");
    let (e, msg) = err_text(weights::load(
        &be,
        &cfg,
        WeightSource::Dir(PathBuf::from(&gone)),
        DType::BF16,
        &encore_core::progress::NoProgress,
    ));
    assert!(matches!(e, Error::Io { .. }), "{msg}");
    assert!(msg.contains("no-such-model"), "{msg}");
    let (e, msg) = err_text(weights::load(
        &be,
        &cfg,
        WeightSource::Dir(PathBuf::from(dir.path())),
        DType::BF16,
        &encore_core::progress::NoProgress,
    ));
    assert!(matches!(e, Error::WeightsFile { .. }), "{msg}");
    assert!(msg.contains("model.safetensors"), "{msg}");
    let (e, msg) = err_text(ModelConfig::from_file(&dir.path().join("config.json")));
    assert!(matches!(e, Error::Io { .. }), "{msg}");
    assert!(msg.contains("config.json"), "{msg}");
    // A non-float run dtype.
    let (_, msg) = err_text(weights::load(
        &be,
        &cfg,
        WeightSource::Dummy { seed: 0 },
        DType::I32,
        &encore_core::progress::NoProgress,
    ));
    assert!(msg.contains("i32"), "{msg}");
}
