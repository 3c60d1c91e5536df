//! The model loader at its boundaries: HF `config.json` parsing (shaped like the real
//! configs), safetensors checkpoints written to a temp dir and loaded on the CPU backend
//! (round trip with dtype conversion and q/k/v, gate/up merging, sharding, tying), the
//! errors for broken checkpoints and configs, and the seeded dummy weights.

use std::path::{Path, PathBuf};

use encore_core::backend::cpu::CpuBackend;
use encore_core::model::config::{Arch, ModelConfig, SlidingWindow};
use encore_core::model::weights::{self, ModelWeights, WeightSource};
use encore_core::ops::{Llama3Scaling, RopeConfig};
use encore_core::{Backend, DType, Error, Tensor};
use half::{bf16, f16};
use safetensors::tensor::{Dtype, TensorView};

#[path = "common/temp_dir.rs"]
mod temp_dir;
use temp_dir::TempDir;

// ---------------------------------------------------------------------------------------
// Helpers: temp dirs, checkpoints, comparisons.

/// One checkpoint tensor; `values` are exact in `dtype` (ignored for integer dtypes).
#[derive(Clone)]
struct Tw {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    values: Vec<f32>,
}

fn bytes_of(t: &Tw) -> Vec<u8> {
    match t.dtype {
        Dtype::F32 => t.values.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Dtype::BF16 => t
            .values
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
            .collect(),
        Dtype::F16 => t
            .values
            .iter()
            .flat_map(|&x| f16::from_f32(x).to_le_bytes())
            .collect(),
        Dtype::I32 => t
            .values
            .iter()
            .flat_map(|&x| (x as i32).to_le_bytes())
            .collect(),
        other => panic!("test writes no {other:?}"),
    }
}

fn write_safetensors(path: &Path, tensors: &[Tw]) {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(bytes_of).collect();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|(t, b)| {
            (
                t.name.clone(),
                TensorView::new(t.dtype, t.shape.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// The value `x` (exact in the source dtype) becomes after loading in `run`.
fn round_to(run: DType, x: f32) -> f32 {
    match run {
        DType::BF16 => bf16::from_f32(x).to_f32(),
        DType::F16 => f16::from_f32(x).to_f32(),
        _ => x,
    }
}

fn exact_in(dtype: Dtype, x: f32) -> f32 {
    match dtype {
        Dtype::BF16 => bf16::from_f32(x).to_f32(),
        Dtype::F16 => f16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// splitmix64 values in [-1, 1).
fn values(seed: u64, n: usize) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let mut z = seed
                .wrapping_mul(0x2545_F491_4F6C_DD1D)
                .wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// The HF tensor names and shapes of `cfg`, written out here independently of the loader.
fn hf_layout(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, hd, i) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
    let (q, kv) = (cfg.num_heads * hd, cfg.num_kv_heads * hd);
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![cfg.vocab_size, h],
    )];
    for l in 0..cfg.num_layers {
        let p = format!("model.layers.{l}.");
        let mut add = |s: &str, shape: Vec<usize>| out.push((format!("{p}{s}"), shape));
        add("input_layernorm.weight", vec![h]);
        add("self_attn.q_proj.weight", vec![q, h]);
        add("self_attn.k_proj.weight", vec![kv, h]);
        add("self_attn.v_proj.weight", vec![kv, h]);
        if cfg.qkv_bias {
            add("self_attn.q_proj.bias", vec![q]);
            add("self_attn.k_proj.bias", vec![kv]);
            add("self_attn.v_proj.bias", vec![kv]);
        }
        if cfg.qk_norm {
            add("self_attn.q_norm.weight", vec![hd]);
            add("self_attn.k_norm.weight", vec![hd]);
        }
        add("self_attn.o_proj.weight", vec![h, q]);
        add("post_attention_layernorm.weight", vec![h]);
        add("mlp.gate_proj.weight", vec![i, h]);
        add("mlp.up_proj.weight", vec![i, h]);
        add("mlp.down_proj.weight", vec![h, i]);
    }
    out.push(("model.norm.weight".into(), vec![h]));
    if !cfg.tie_word_embeddings {
        out.push(("lm_head.weight".into(), vec![cfg.vocab_size, h]));
    }
    out
}

/// A full random checkpoint for `cfg` in `dtype`.
fn checkpoint(cfg: &ModelConfig, dtype: Dtype, seed: u64) -> Vec<Tw> {
    hf_layout(cfg)
        .into_iter()
        .enumerate()
        .map(|(k, (name, shape))| {
            let n = shape.iter().product();
            let values = values(seed * 1000 + k as u64, n)
                .into_iter()
                .map(|x| exact_in(dtype, x))
                .collect();
            Tw {
                name,
                dtype,
                shape,
                values,
            }
        })
        .collect()
}

fn find<'a>(ts: &'a [Tw], name: &str) -> &'a Tw {
    ts.iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("{name}"))
}

/// A small config.json of `arch` with the tiny shapes; `extra` is spliced in.
fn tiny_json(arch: &str, extra: &str) -> String {
    format!(
        r#"{{
  "architectures": ["{arch}"],
  "vocab_size": 96, "hidden_size": 64, "intermediate_size": 80,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256,
  "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"{extra}
}}"#
    )
}

/// Write `config.json` and `tensors` as one `model.safetensors` into a fresh dir.
fn model_dir(tag: &str, config: &str, tensors: &[Tw]) -> TempDir {
    let dir = TempDir::new(tag);
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    write_safetensors(&dir.path().join("model.safetensors"), tensors);
    dir
}

fn cpu() -> CpuBackend {
    CpuBackend::new()
}

fn load_dir(dir: &Path, dtype: DType) -> encore_core::Result<(ModelConfig, ModelWeights)> {
    let be = cpu();
    let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
    let w = weights::load(
        &be,
        &cfg,
        WeightSource::Dir(PathBuf::from(dir)),
        dtype,
        &encore_core::progress::NoProgress,
    )?;
    Ok((cfg, w))
}

fn download(t: &Tensor) -> Vec<f32> {
    let be = cpu();
    let be: &dyn Backend = &be;
    be.download_f32(t).unwrap()
}

/// `t` holds exactly the rows of `parts`, in order, rounded to the run dtype.
fn check_rows(t: &Tensor, parts: &[&Tw], run: DType) {
    let expected: Vec<f32> = parts
        .iter()
        .flat_map(|p| p.values.iter().map(|&x| round_to(run, x)))
        .collect();
    let names: Vec<&str> = parts.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(t.dtype(), run, "{names:?}");
    let got = download(t);
    assert_eq!(got.len(), expected.len(), "{names:?}");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != expected[i].to_bits()) {
        panic!(
            "{names:?}: element {i} is {}, expected {}",
            got[i], expected[i]
        );
    }
}

/// Every loaded tensor equals the checkpoint's, merged and converted.
fn check_model(cfg: &ModelConfig, w: &ModelWeights, ts: &[Tw], run: DType) {
    let t = |n: &str| find(ts, n);
    assert_eq!(w.dtype, run);
    check_rows(&w.embed, &[t("model.embed_tokens.weight")], run);
    check_rows(&w.norm, &[t("model.norm.weight")], run);
    if cfg.tie_word_embeddings {
        assert!(w.lm_head.same_start(&w.embed), "tied lm_head is embed");
    } else {
        assert!(!w.lm_head.same_start(&w.embed));
        check_rows(&w.lm_head, &[t("lm_head.weight")], run);
    }
    assert_eq!(w.layers.len(), cfg.num_layers);
    for (i, l) in w.layers.iter().enumerate() {
        let n = |s: &str| format!("model.layers.{i}.{s}");
        let t = |s: &str| find(ts, &n(s));
        let qkv_rows = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim;
        assert_eq!(l.qkv.shape(), &[qkv_rows, cfg.hidden_size]);
        assert_eq!(
            l.gate_up.shape(),
            &[2 * cfg.intermediate_size, cfg.hidden_size]
        );
        check_rows(&l.input_norm, &[t("input_layernorm.weight")], run);
        check_rows(
            &l.qkv,
            &[
                t("self_attn.q_proj.weight"),
                t("self_attn.k_proj.weight"),
                t("self_attn.v_proj.weight"),
            ],
            run,
        );
        match &l.qkv_bias {
            Some(b) => check_rows(
                b,
                &[
                    t("self_attn.q_proj.bias"),
                    t("self_attn.k_proj.bias"),
                    t("self_attn.v_proj.bias"),
                ],
                run,
            ),
            None => assert!(!cfg.qkv_bias),
        }
        match (&l.q_norm, &l.k_norm) {
            (Some(q), Some(k)) => {
                check_rows(q, &[t("self_attn.q_norm.weight")], run);
                check_rows(k, &[t("self_attn.k_norm.weight")], run);
            }
            (None, None) => assert!(!cfg.qk_norm),
            _ => panic!("q_norm and k_norm come together"),
        }
        check_rows(&l.o_proj, &[t("self_attn.o_proj.weight")], run);
        check_rows(&l.post_norm, &[t("post_attention_layernorm.weight")], run);
        check_rows(
            &l.gate_up,
            &[t("mlp.gate_proj.weight"), t("mlp.up_proj.weight")],
            run,
        );
        check_rows(&l.down, &[t("mlp.down_proj.weight")], run);
    }
}

fn err_text(r: encore_core::Result<impl Sized>) -> (Error, String) {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => {
            let s = e.to_string();
            (e, s)
        }
    }
}

// ---------------------------------------------------------------------------------------
// Round trips.

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
        ts.push(Tw {
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
        assert_eq!(w.layers[0].qkv_bias.is_some(), expect_bias, "{arch}");
        assert_eq!(w.layers[0].q_norm.is_some(), arch == "Qwen3ForCausalLM");
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
        let part: Vec<Tw> = ts.iter().skip(s).step_by(3).cloned().collect();
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
    ts.push(Tw {
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
    let o_bias = |v: f32| Tw {
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

// ---------------------------------------------------------------------------------------
// Checkpoint errors.

/// Load a tiny Llama checkpoint after `edit`; return the error and its message.
fn broken(tag: &str, edit: impl FnOnce(&mut Vec<Tw>)) -> (Error, String) {
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
        ts.push(Tw {
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
        msg.contains("`model.layers.2.input_layernorm.weight`")
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

// ---------------------------------------------------------------------------------------
// Config parsing.

const LLAMA_3_2_1B: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256
}"#;

const LLAMA_3_8B: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": null, "rope_theta": 500000.0, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0", "use_cache": true,
  "vocab_size": 128256
}"#;

const QWEN2_5_0_5B: &str = r#"{
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896,
  "initializer_range": 0.02, "intermediate_size": 4864, "max_position_embeddings": 32768,
  "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
  "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": true,
  "use_mrope": false, "use_sliding_window": false, "vocab_size": 151936
}"#;

const QWEN3_0_6B: &str = r#"{
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936
}"#;

const MISTRAL_7B_V0_1: &str = r#"{
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 32000
}"#;

/// Llama-3.2-1B-Instruct as transformers 5 writes it: `rope_parameters`, `dtype`, eos list.
const LLAMA_3_2_1B_TF5: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009], "head_dim": 64, "hidden_size": 2048,
  "intermediate_size": 8192, "max_position_embeddings": 131072, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "dtype": "bfloat16", "tie_word_embeddings": true,
  "rope_parameters": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192, "rope_type": "llama3", "rope_theta": 500000.0},
  "vocab_size": 128256
}"#;

fn parse(json: &str) -> ModelConfig {
    ModelConfig::from_json(json, "config.json").unwrap()
}

fn parse_err(json: &str) -> String {
    let (e, msg) = err_text(ModelConfig::from_json(json, "some/config.json"));
    assert!(matches!(e, Error::Config { .. }), "{msg}");
    assert!(msg.contains("some/config.json"), "{msg}");
    msg
}

#[test]
fn real_configs_parse_to_the_expected_values() {
    let llama32 = parse(LLAMA_3_2_1B);
    assert_eq!(
        llama32,
        ModelConfig {
            arch: Arch::Llama,
            vocab_size: 128_256,
            hidden_size: 2048,
            intermediate_size: 8192,
            num_layers: 16,
            num_heads: 32,
            num_kv_heads: 8,
            head_dim: 64,
            rope: RopeConfig {
                rot_dim: 64,
                theta: 500_000.0,
                llama3: Some(Llama3Scaling {
                    factor: 32.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: 8192,
                }),
            },
            rms_norm_eps: 1e-5,
            tie_word_embeddings: true,
            qkv_bias: false,
            qk_norm: false,
            max_position_embeddings: 131_072,
            torch_dtype: DType::BF16,
            bos_token_id: Some(128_000),
            eos_token_ids: vec![128_001],
            sliding_window: None,
        }
    );
    let tf5 = parse(LLAMA_3_2_1B_TF5);
    assert_eq!(
        tf5,
        ModelConfig {
            eos_token_ids: vec![128_001, 128_008, 128_009],
            ..llama32.clone()
        }
    );

    let qwen2 = parse(QWEN2_5_0_5B);
    assert_eq!(qwen2.arch, Arch::Qwen2);
    assert_eq!(
        (qwen2.num_heads, qwen2.num_kv_heads, qwen2.head_dim),
        (14, 2, 64)
    );
    assert!(qwen2.qkv_bias && qwen2.tie_word_embeddings && !qwen2.qk_norm);
    assert_eq!(qwen2.rope.theta, 1e6);
    assert_eq!(qwen2.rope.llama3, None);
    assert_eq!(qwen2.rms_norm_eps, 1e-6);
    assert_eq!(qwen2.eos_token_ids, vec![151_643]);

    let qwen3 = parse(QWEN3_0_6B);
    assert_eq!(qwen3.arch, Arch::Qwen3);
    // Explicit head_dim: 16 * 128 != 1024.
    assert_eq!(
        (qwen3.num_heads, qwen3.num_kv_heads, qwen3.head_dim),
        (16, 8, 128)
    );
    assert_eq!(qwen3.rope.rot_dim, 128);
    assert!(qwen3.qk_norm && !qwen3.qkv_bias && qwen3.tie_word_embeddings);
    assert_eq!(qwen3.max_position_embeddings, 40960);
    assert_eq!(qwen3.rope.theta, 1e6);

    let mistral = parse(MISTRAL_7B_V0_1);
    assert_eq!(mistral.arch, Arch::Mistral);
    assert_eq!(mistral.head_dim, 128);
    assert!(!mistral.qkv_bias && !mistral.tie_word_embeddings && !mistral.qk_norm);
    assert_eq!(mistral.rope.theta, 10_000.0);
    assert_eq!(mistral.bos_token_id, Some(1));

    let llama3 = parse(LLAMA_3_8B);
    assert_eq!(llama3.rope.llama3, None);
    assert_eq!(llama3.head_dim, 128);
}

#[test]
fn parameter_counts_match_the_published_ones() {
    // Exact counts of the HF checkpoints (sum of numel over the safetensors).
    let cases: &[(&str, usize)] = &[
        (QWEN2_5_0_5B, 494_032_768),
        (LLAMA_3_2_1B, 1_235_814_400),
        (LLAMA_3_8B, 8_030_261_248),
        (MISTRAL_7B_V0_1, 7_241_732_096),
    ];
    for &(json, n) in cases {
        let cfg = parse(json);
        assert_eq!(cfg.num_params(), n, "{:?}", cfg.arch);
        assert_eq!(cfg.weight_bytes(DType::BF16), 2 * n);
        assert_eq!(cfg.weight_bytes(DType::F32), 4 * n);
    }
    // Qwen3-0.6B: "0.6B parameters, 0.44B non-embedding".
    let q3 = parse(QWEN3_0_6B);
    let non_embedding = q3.num_params() - q3.vocab_size * q3.hidden_size;
    assert!(
        (non_embedding as f64 / 0.44e9 - 1.0).abs() < 0.01,
        "{non_embedding}"
    );
    assert!((q3.num_params() as f64 / 0.596e9 - 1.0).abs() < 0.01);
}

#[test]
fn real_shaped_dummies_match_the_real_configs() {
    for (name, json) in [
        ("qwen2.5-0.5b", QWEN2_5_0_5B),
        ("llama-3.2-1b", LLAMA_3_2_1B),
        ("llama-3-8b", LLAMA_3_8B),
    ] {
        let dummy = ModelConfig::dummy(name).unwrap();
        let real = parse(json);
        let ids = ModelConfig {
            bos_token_id: dummy.bos_token_id,
            eos_token_ids: dummy.eos_token_ids.clone(),
            ..real
        };
        assert_eq!(dummy, ids, "{name}");
        assert!(dummy.bos_token_id.unwrap() < 258 && dummy.eos_token_ids == [257]);
    }
}

#[test]
fn defaults_follow_hf() {
    let cfg = parse(
        r#"{"model_type": "llama", "vocab_size": 100, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
            "head_dim": null, "num_key_value_heads": null, "rope_scaling": {"rope_type": "default"}}"#,
    );
    assert_eq!(cfg.arch, Arch::Llama);
    assert_eq!((cfg.num_kv_heads, cfg.head_dim), (4, 16));
    assert_eq!(cfg.rope.theta, 10_000.0);
    assert_eq!(cfg.rope.llama3, None);
    assert_eq!(cfg.rms_norm_eps, 1e-6);
    assert!(!cfg.tie_word_embeddings && !cfg.qkv_bias);
    assert_eq!(cfg.max_position_embeddings, 2048);
    assert_eq!(cfg.torch_dtype, DType::BF16);
    assert_eq!((cfg.bos_token_id, cfg.eos_token_ids.len()), (None, 0));
    // rope_theta from transformers 5's rope_parameters, dtype from "dtype".
    let cfg = parse(&tiny_json(
        "Qwen3ForCausalLM",
        r#", "rope_theta": null, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "torch_dtype": null, "dtype": "float16""#,
    ));
    assert_eq!(cfg.rope.theta, 1e6);
    assert_eq!(cfg.torch_dtype, DType::F16);
    // Mistral's sliding window applies to every layer.
    let mistral = parse(MISTRAL_7B_V0_1);
    assert_eq!(mistral.arch, Arch::Mistral);
    assert_eq!(
        mistral.sliding_window,
        Some(SlidingWindow {
            size: 4096,
            first_layer: 0
        })
    );
    assert_eq!(
        (mistral.layer_window(0), mistral.layer_window(31)),
        (Some(4096), Some(4096))
    );
    // Qwen's window only with use_sliding_window, from max_window_layers on.
    let qwen = |extra: &str| parse(&tiny_json("Qwen2ForCausalLM", extra));
    assert_eq!(qwen(r#", "sliding_window": 64"#).sliding_window, None);
    let windowed =
        qwen(r#", "sliding_window": 64, "use_sliding_window": true, "max_window_layers": 1"#);
    assert_eq!(
        (windowed.layer_window(0), windowed.layer_window(1)),
        (None, Some(64))
    );
    let all = qwen(r#", "sliding_window": 64, "use_sliding_window": true"#);
    assert_eq!(all.layer_window(0), Some(64));
    // Llama ignores the field, as transformers does.
    assert_eq!(
        parse(&tiny_json("LlamaForCausalLM", r#", "sliding_window": 64"#)).sliding_window,
        None
    );
}

#[test]
fn config_errors_name_the_field_or_value() {
    let cases: &[(&str, &str, &[&str])] = &[
        ("GPT2LMHeadModel", "", &["GPT2LMHeadModel", "architecture"]),
        (
            "LlamaForCausalLM",
            r#", "rope_scaling": {"type": "yarn", "factor": 4.0}"#,
            &["yarn"],
        ),
        (
            "LlamaForCausalLM",
            r#", "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}"#,
            &["dynamic"],
        ),
        (
            "Qwen2ForCausalLM",
            r#", "rope_parameters": {"rope_type": "linear", "factor": 2.0}"#,
            &["linear"],
        ),
        (
            "LlamaForCausalLM",
            r#", "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}"#,
            &["rope_scaling.original_max_position_embeddings", "missing"],
        ),
        (
            "LlamaForCausalLM",
            r#", "num_key_value_heads": 3"#,
            &["num_key_value_heads", "3"],
        ),
        ("LlamaForCausalLM", r#", "head_dim": 7"#, &["head_dim", "7"]),
        ("LlamaForCausalLM", r#", "mlp_bias": true"#, &["mlp_bias"]),
        (
            "MistralForCausalLM",
            r#", "sliding_window": 0"#,
            &["sliding_window", "positive"],
        ),
        (
            "LlamaForCausalLM",
            r#", "num_hidden_layers": 1000000000"#,
            &["num_hidden_layers", "1000000000", "beyond"],
        ),
        (
            "LlamaForCausalLM",
            r#", "hidden_size": 4611686018427387904, "head_dim": 64"#,
            &["hidden_size", "4611686018427387904", "beyond"],
        ),
        (
            "LlamaForCausalLM",
            r#", "hidden_act": "gelu""#,
            &["hidden_act", "gelu"],
        ),
        (
            "LlamaForCausalLM",
            r#", "partial_rotary_factor": 0.5"#,
            &["partial_rotary_factor"],
        ),
        (
            "LlamaForCausalLM",
            r#", "hidden_size": "64""#,
            &["hidden_size"],
        ),
        (
            "LlamaForCausalLM",
            r#", "hidden_size": 0"#,
            &["hidden_size"],
        ),
        (
            "LlamaForCausalLM",
            r#", "torch_dtype": "float8_e4m3fn""#,
            &["float8_e4m3fn"],
        ),
        (
            "LlamaForCausalLM",
            r#", "eos_token_id": [2, "x"]"#,
            &["eos_token_id"],
        ),
    ];
    for &(arch, extra, needles) in cases {
        // Later duplicate keys win in serde_json, so `extra` overrides tiny_json's fields.
        let msg = parse_err(&tiny_json(arch, extra));
        for n in needles {
            assert!(msg.contains(n), "{extra}: `{n}` not in: {msg}");
        }
    }
    // A missing required field.
    let no_hidden = LLAMA_3_8B.replace(r#""hidden_size": 4096,"#, "");
    let msg = parse_err(&no_hidden);
    assert!(
        msg.contains("hidden_size") && msg.contains("missing"),
        "{msg}"
    );
    let msg = parse_err(r#"{"vocab_size": 10}"#);
    assert!(msg.contains("architectures"), "{msg}");
    let msg = parse_err("{not json");
    assert!(msg.contains("JSON"), "{msg}");
    let (_, msg) = err_text(ModelConfig::dummy("huge"));
    assert!(
        msg.contains("dummy:huge") && msg.contains("tiny-qwen3"),
        "{msg}"
    );
}

// ---------------------------------------------------------------------------------------
// Dummy weights.

#[test]
fn every_dummy_has_consistent_shapes_and_counts() {
    for &name in ModelConfig::dummy_names() {
        let cfg = ModelConfig::dummy(name).unwrap();
        // The loader's layout is the HF layout, and it adds up to num_params.
        let specs = weights::hf_tensors(&cfg);
        let layout = hf_layout(&cfg);
        assert_eq!(specs.len(), layout.len(), "{name}");
        for (s, (n, shape)) in specs.iter().zip(&layout) {
            assert_eq!((&s.name, &s.shape), (n, shape), "{name}");
        }
        let total: usize = specs.iter().map(|s| s.numel()).sum();
        assert_eq!(total, cfg.num_params(), "{name}");
        assert!((cfg.bos_token_id.unwrap() as usize) < cfg.vocab_size);
        if name.starts_with("tiny") {
            assert!(cfg.num_params() < 5_000_000, "{name}");
            assert_eq!(
                (cfg.bos_token_id, &cfg.eos_token_ids[..]),
                (Some(256), &[257][..])
            );
            let be = cpu();
            let w = weights::load(
                &be,
                &cfg,
                WeightSource::Dummy { seed: 1 },
                DType::BF16,
                &encore_core::progress::NoProgress,
            )
            .unwrap();
            check_shapes(&cfg, &w);
        }
    }
    // Published sizes (within 1%): Qwen2.5-0.5B 494M, Llama-3.2-1B 1.236B, Llama-3-8B 8.03B.
    for (name, n) in [
        ("qwen2.5-0.5b", 494e6),
        ("llama-3.2-1b", 1.236e9),
        ("llama-3-8b", 8.03e9),
    ] {
        let p = ModelConfig::dummy(name).unwrap().num_params() as f64;
        assert!((p / n - 1.0).abs() < 0.01, "{name}: {p}");
    }
    let t3 = ModelConfig::dummy("tiny-llama3").unwrap();
    assert!(t3.rope.llama3.is_some());
    let q3 = ModelConfig::dummy("tiny-qwen3").unwrap();
    assert!(q3.qk_norm && q3.num_heads * q3.head_dim != q3.hidden_size);
    let q2 = ModelConfig::dummy("tiny-qwen2").unwrap();
    assert!(q2.qkv_bias && q2.tie_word_embeddings);
}

fn check_shapes(cfg: &ModelConfig, w: &ModelWeights) {
    assert_eq!(w.embed.shape(), &[cfg.vocab_size, cfg.hidden_size]);
    assert_eq!(w.lm_head.shape(), w.embed.shape());
    assert_eq!(w.lm_head.same_start(&w.embed), cfg.tie_word_embeddings);
    let qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim;
    for l in &w.layers {
        assert_eq!(l.qkv.shape(), &[qkv, cfg.hidden_size]);
        assert_eq!(
            l.qkv_bias.as_ref().map(|b| b.shape().to_vec()),
            cfg.qkv_bias.then(|| vec![qkv])
        );
        assert_eq!(
            l.q_norm.as_ref().map(|b| b.shape().to_vec()),
            cfg.qk_norm.then(|| vec![cfg.head_dim])
        );
        assert_eq!(l.k_norm.is_some(), cfg.qk_norm);
        assert_eq!(
            l.o_proj.shape(),
            &[cfg.hidden_size, cfg.num_heads * cfg.head_dim]
        );
        assert_eq!(
            l.gate_up.shape(),
            &[2 * cfg.intermediate_size, cfg.hidden_size]
        );
        assert_eq!(l.down.shape(), &[cfg.hidden_size, cfg.intermediate_size]);
        assert_eq!(l.input_norm.shape(), &[cfg.hidden_size]);
        assert_eq!(l.post_norm.shape(), &[cfg.hidden_size]);
    }
    assert_eq!(w.norm.shape(), &[cfg.hidden_size]);
}

/// All weights of a model as f32, in order.
fn all_values(w: &ModelWeights) -> Vec<Vec<f32>> {
    let mut ts = vec![&w.embed];
    for l in &w.layers {
        ts.extend([
            &l.input_norm,
            &l.qkv,
            &l.o_proj,
            &l.post_norm,
            &l.gate_up,
            &l.down,
        ]);
        ts.extend(l.qkv_bias.iter().chain(&l.q_norm).chain(&l.k_norm));
    }
    ts.extend([&w.norm, &w.lm_head]);
    ts.into_iter().map(download).collect()
}

#[test]
fn dummy_weights_are_deterministic_per_seed_and_dtype_independent() {
    let cfg = ModelConfig::dummy("tiny-qwen3").unwrap();
    let be = cpu();
    let load = |seed, dtype| {
        weights::load(
            &be,
            &cfg,
            WeightSource::Dummy { seed },
            dtype,
            &encore_core::progress::NoProgress,
        )
        .unwrap()
    };
    let a = all_values(&load(7, DType::BF16));
    let b = all_values(&load(7, DType::BF16));
    let c = all_values(&load(8, DType::BF16));
    assert_eq!(a, b);
    for (x, y) in a.iter().zip(&c) {
        assert_ne!(x, y, "another seed gives other values");
    }
    // The f32 draw rounded to bf16 is the bf16 draw.
    let f = all_values(&load(7, DType::F32));
    for (x, y) in a.iter().zip(&f) {
        let rounded: Vec<f32> = y.iter().map(|&v| round_to(DType::BF16, v)).collect();
        assert_eq!(x, &rounded);
    }
    // Different tensors (and q vs k rows of one merged tensor) are not copies.
    let w = load(7, DType::F32);
    let qkv = download(&w.layers[0].qkv);
    let q_rows = cfg.num_heads * cfg.head_dim * cfg.hidden_size;
    assert_ne!(qkv[..100], qkv[q_rows..q_rows + 100]);
    assert_ne!(download(&w.layers[0].qkv), download(&w.layers[1].qkv));
}

fn mean_std(v: &[f32]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[test]
fn dummy_scales_keep_activations_near_unit_size() {
    let cfg = ModelConfig::dummy("tiny-qwen2").unwrap();
    let be = cpu();
    let w = weights::load(
        &be,
        &cfg,
        WeightSource::Dummy { seed: 3 },
        DType::F32,
        &encore_core::progress::NoProgress,
    )
    .unwrap();
    let h = cfg.hidden_size as f64;
    // Four standard errors of the mean and of the standard deviation.
    let check = |t: &Tensor, mean: f64, std: f64, what: &str| {
        let v = download(t);
        let n = v.len() as f64;
        let (m, s) = mean_std(&v);
        assert!((m - mean).abs() < 4.0 * std / n.sqrt(), "{what}: mean {m}");
        assert!(
            (s / std - 1.0).abs() < 4.0 / (2.0 * n).sqrt(),
            "{what}: std {s}, expected {std}"
        );
    };
    check(&w.embed, 0.0, 1.0 / h.sqrt(), "embed");
    let l = &w.layers[2];
    check(&l.qkv, 0.0, 1.0 / h.sqrt(), "qkv");
    check(
        &l.o_proj,
        0.0,
        1.0 / ((cfg.num_heads * cfg.head_dim) as f64).sqrt(),
        "o_proj",
    );
    check(&l.gate_up, 0.0, 1.0 / h.sqrt(), "gate_up");
    check(
        &l.down,
        0.0,
        1.0 / (cfg.intermediate_size as f64).sqrt(),
        "down",
    );
    check(&l.input_norm, 1.0, 0.02, "input_norm");
    check(l.qkv_bias.as_ref().unwrap(), 0.0, 0.02, "qkv_bias");
    let max = download(&l.qkv).iter().fold(0f32, |m, x| m.max(x.abs()));
    assert!(max <= 2.5 / (h as f32).sqrt(), "bounded draws: {max}");
}
