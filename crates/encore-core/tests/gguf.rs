//! GGUF loading at its boundaries: GGUF twins of HF checkpoints (F32/F16 exact, Q8_0 on
//! exactly representable weights, llama's q/k permutation) load to the same weights and
//! the same greedy tokens as the safetensors originals; the dequantizers match gguf-py's
//! bit for bit (fixture from `scripts/gguf_reference.py`); config keys map as llama.cpp
//! writes them; and every malformed file is an error naming what is wrong, never a panic.

use std::path::{Path, PathBuf};

use encore_core::backend::cpu::CpuBackend;
use encore_core::generate::{generate, GenerateOptions};
use encore_core::model::config::{Arch, ModelConfig, SlidingWindow};
use encore_core::model::gguf::{
    config_from_gguf, dequantize, vocab_from_gguf, GgmlType, GgufFile, GgufWriter, Value,
};
use encore_core::model::llama::Model;
use encore_core::model::weights::{self, ModelWeights, WeightSource};
use encore_core::model::{open_model, ModelFiles};
use encore_core::ops::{Llama3Scaling, RopeConfig};
use encore_core::request::SamplingParams;
use encore_core::runner::{Runner, RunnerConfig};
use encore_core::{Backend, DType, Error};
use half::f16;
use safetensors::tensor::{Dtype, TensorView};

#[path = "common/temp_dir.rs"]
mod temp_dir;
use temp_dir::TempDir;

// ---------------------------------------------------------------------------------------
// Helpers.

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

/// The llama.cpp name of an HF tensor, written out here independently of the loader.
fn llama_cpp_name(hf: &str) -> String {
    match hf {
        "model.embed_tokens.weight" => return "token_embd.weight".into(),
        "model.norm.weight" => return "output_norm.weight".into(),
        "lm_head.weight" => return "output.weight".into(),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.").unwrap();
    let (layer, rest) = rest.split_once('.').unwrap();
    let table = [
        ("input_layernorm.weight", "attn_norm.weight"),
        ("self_attn.q_proj.weight", "attn_q.weight"),
        ("self_attn.k_proj.weight", "attn_k.weight"),
        ("self_attn.v_proj.weight", "attn_v.weight"),
        ("self_attn.q_proj.bias", "attn_q.bias"),
        ("self_attn.k_proj.bias", "attn_k.bias"),
        ("self_attn.v_proj.bias", "attn_v.bias"),
        ("self_attn.o_proj.weight", "attn_output.weight"),
        ("self_attn.q_norm.weight", "attn_q_norm.weight"),
        ("self_attn.k_norm.weight", "attn_k_norm.weight"),
        ("post_attention_layernorm.weight", "ffn_norm.weight"),
        ("mlp.gate_proj.weight", "ffn_gate.weight"),
        ("mlp.up_proj.weight", "ffn_up.weight"),
        ("mlp.down_proj.weight", "ffn_down.weight"),
    ];
    let short = table.iter().find(|(h, _)| *h == rest).unwrap().1;
    format!("blk.{layer}.{short}")
}

/// llama.cpp's `permute` (convert_hf_to_gguf.py): each head's rows reshaped
/// `(2, head_dim / 2)` and transposed, so GGUF row `2j + i` is HF row `i * half + j`.
fn llama_cpp_permute(v: &[f32], rows: usize, heads: usize) -> Vec<f32> {
    let cols = v.len() / rows;
    let hd = rows / heads;
    let half = hd / 2;
    let mut out = vec![0f32; v.len()];
    for h in 0..heads {
        for i in 0..2 {
            for j in 0..half {
                let src = h * hd + i * half + j;
                let dst = h * hd + 2 * j + i;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&v[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// How the twin stores its matrices (norms and biases are always F32, as llama.cpp does).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Store {
    F32,
    F16,
    /// Values are `d * q` with `d` a power of two and `|q| <= 127`, so Q8_0 is lossless.
    Q8_0,
}

/// An HF checkpoint of `cfg` (values exact in the store type), as (name, shape, values).
fn hf_checkpoint(
    cfg: &ModelConfig,
    store: Store,
    seed: u64,
) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    weights::hf_tensors(cfg)
        .into_iter()
        .enumerate()
        .map(|(k, spec)| {
            let n = spec.numel();
            let raw = values(seed * 1000 + k as u64, n);
            let matrix = spec.shape.len() == 2;
            let v = if spec.name.ends_with("norm.weight") {
                raw.iter().map(|x| 1.0 + 0.1 * x).collect()
            } else if !matrix {
                raw.iter().map(|x| 0.05 * x).collect()
            } else {
                match store {
                    Store::F32 => raw.iter().map(|x| 0.2 * x).collect(),
                    Store::F16 => raw
                        .iter()
                        .map(|&x| f16::from_f32(0.2 * x).to_f32())
                        .collect(),
                    Store::Q8_0 => q8_exact(&raw, k),
                }
            };
            (spec.name, spec.shape, v)
        })
        .collect()
}

/// Per block of 32: `d = 2^-(7 + k % 3)`, `q = round(127 x)` with one element at ±127.
fn q8_exact(raw: &[f32], k: usize) -> Vec<f32> {
    let d = 2f32.powi(-(7 + (k % 3) as i32));
    raw.chunks(32)
        .flat_map(|b| {
            b.iter().enumerate().map(move |(i, &x)| {
                // `+ 0.0`: no -0, which Q8_0 cannot store.
                let q = if i == 5 {
                    127.0
                } else {
                    (127.0 * x).round() + 0.0
                };
                d * q
            })
        })
        .collect()
}

fn q8_blocks(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in v.chunks(32) {
        let d = b.iter().fold(0f32, |a, x| a.max(x.abs())) / 127.0;
        out.extend(f16::from_f32(d).to_le_bytes());
        out.extend(b.iter().map(|&x| (x / d).round() as i8 as u8));
    }
    out
}

/// The config.json the test models share (small, every inner dim a multiple of 32).
fn tiny_json(arch: &str, extra: &str) -> String {
    format!(
        r#"{{
  "architectures": ["{arch}"],
  "vocab_size": 96, "hidden_size": 64, "intermediate_size": 96,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256,
  "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"{extra}
}}"#
    )
}

/// The metadata llama.cpp's converter writes for `cfg`, with a placeholder vocabulary.
fn metadata(w: &mut GgufWriter, cfg: &ModelConfig) {
    w.model_metadata(cfg);
    w.kv("general.file_type", Value::U32(1));
    w.kv("tokenizer.ggml.model", Value::String("gpt2".into()));
    let tokens = (0..cfg.vocab_size)
        .map(|i| Value::String(format!("t{i}")))
        .collect();
    w.kv("tokenizer.ggml.tokens", Value::Array(8, tokens));
    w.kv(
        "tokenizer.ggml.token_type",
        Value::Array(5, vec![Value::I32(1); cfg.vocab_size]),
    );
    w.kv(
        "tokenizer.ggml.merges",
        Value::Array(8, vec![Value::String("t 1".into())]),
    );
    w.kv("tokenizer.ggml.bos_token_id", Value::U32(1));
    w.kv("tokenizer.ggml.eos_token_id", Value::U32(2));
    w.kv("tokenizer.ggml.add_bos_token", Value::Bool(false));
    w.kv("tokenizer.chat_template", Value::String("{{ x }}".into()));
}

/// A GGUF twin of an HF checkpoint, as llama.cpp's converter would write it.
fn gguf_twin(cfg: &ModelConfig, ts: &[(String, Vec<usize>, Vec<f32>)], store: Store) -> GgufWriter {
    let mut w = GgufWriter::new();
    metadata(&mut w, cfg);
    for (name, shape, v) in ts {
        let heads = if name.contains("q_proj") {
            cfg.num_heads
        } else {
            cfg.num_kv_heads
        };
        let permute = matches!(cfg.arch, Arch::Llama | Arch::Mistral)
            && (name.contains("q_proj") || name.contains("k_proj"));
        let v = if permute {
            llama_cpp_permute(v, shape[0], heads)
        } else {
            v.clone()
        };
        let g = llama_cpp_name(name);
        match (store, shape.len()) {
            (_, 1) | (Store::F32, _) => w.tensor_f32(&g, shape, &v),
            (Store::F16, _) => w.tensor_f16(&g, shape, &v),
            (Store::Q8_0, _) => w.tensor(&g, shape, GgmlType::Q8_0, q8_blocks(&v)),
        };
    }
    w
}

fn write_safetensors(path: &Path, ts: &[(String, Vec<usize>, Vec<f32>)]) {
    let bytes: Vec<Vec<u8>> = ts
        .iter()
        .map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let views: Vec<(String, TensorView<'_>)> = ts
        .iter()
        .zip(&bytes)
        .map(|((n, s, _), b)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn load(cfg: &ModelConfig, source: WeightSource) -> encore_core::Result<ModelWeights> {
    weights::load(
        &CpuBackend::new(),
        cfg,
        source,
        DType::F32,
        &encore_core::progress::NoProgress,
    )
}

fn all_values(w: &ModelWeights) -> Vec<Vec<f32>> {
    let be = CpuBackend::new();
    let be: &dyn Backend = &be;
    let mut ts = vec![&w.embed, &w.norm, &w.lm_head];
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
    ts.iter().map(|t| be.download_f32(t).unwrap()).collect()
}

/// Greedy tokens of two prompts, 8 new tokens each.
fn greedy(cfg: &ModelConfig, w: ModelWeights) -> Vec<Vec<u32>> {
    let be = CpuBackend::new();
    let model = Model::new(&be, cfg.clone(), w, 64).unwrap();
    let mut runner = Runner::new(
        &be,
        model,
        RunnerConfig {
            block_size: 4,
            num_blocks: 1 + 2 * 16,
            max_tokens_per_step: 64,
            max_seqs: 2,
            max_seq_len: 64,
            penalty_slots: 0,
        },
    )
    .unwrap();
    let prompts = vec![vec![1, 5, 9, 40, 77], vec![1, 90, 3]];
    let opts = GenerateOptions {
        max_tokens: 8,
        sampling: SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
            ..Default::default()
        },
        ignore_eos: true,
    };
    generate(
        &mut runner,
        &prompts,
        &[],
        &opts,
        &encore_core::progress::NoProgress,
        |_, _| std::ops::ControlFlow::Continue(()),
    )
    .unwrap()
    .into_iter()
    .map(|g| g.output_ids)
    .collect()
}

fn err_text<T>(r: encore_core::Result<T>) -> (Error, String) {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => {
            let s = e.to_string();
            (e, s)
        }
    }
}

fn assert_mentions(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "`{msg}` does not mention `{p}`");
    }
}

// ---------------------------------------------------------------------------------------
// Twins of HF checkpoints.

#[test]
fn gguf_twins_load_the_same_weights_and_tokens_as_safetensors() {
    let cases: &[(&str, &str, Store)] = &[
        ("LlamaForCausalLM", "", Store::F32),
        (
            "LlamaForCausalLM",
            r#", "tie_word_embeddings": true"#,
            Store::F16,
        ),
        ("LlamaForCausalLM", "", Store::Q8_0),
        (
            "Qwen2ForCausalLM",
            r#", "tie_word_embeddings": true"#,
            Store::F32,
        ),
        ("Qwen2ForCausalLM", "", Store::Q8_0),
        ("Qwen3ForCausalLM", r#", "head_dim": 32"#, Store::F32),
        (
            "Qwen3ForCausalLM",
            r#", "head_dim": 32, "tie_word_embeddings": true"#,
            Store::Q8_0,
        ),
    ];
    for (k, &(arch, extra, store)) in cases.iter().enumerate() {
        let what = format!("{arch}{extra} {store:?}");
        let dir = TempDir::new("twin");
        let json = tiny_json(arch, extra);
        std::fs::write(dir.file("config.json"), &json).unwrap();
        let cfg = ModelConfig::from_json(&json, "test").unwrap();
        let ts = hf_checkpoint(&cfg, store, k as u64 + 1);
        write_safetensors(&dir.file("model.safetensors"), &ts);
        let gguf = dir.file("model.gguf");
        gguf_twin(&cfg, &ts, store).write(&gguf).unwrap();

        let spec = gguf.to_str().unwrap();
        let ModelFiles { config, source } = open_model(spec).unwrap();
        assert_eq!(source, WeightSource::Gguf(PathBuf::from(&gguf)));
        assert_eq!(config, cfg, "{what}: config from metadata");

        let from_st = load(&cfg, WeightSource::Dir(PathBuf::from(dir.path()))).unwrap();
        let from_gguf = load(&config, source).unwrap();
        let (a, b) = (all_values(&from_st), all_values(&from_gguf));
        for (t, (a, b)) in a.iter().zip(&b).enumerate() {
            assert_eq!(a.len(), b.len(), "{what}: tensor {t}");
            if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
                panic!("{what}: tensor {t} element {i}: {} vs {}", a[i], b[i]);
            }
        }
        if k < 3 || store == Store::Q8_0 {
            let a = greedy(&cfg, from_st);
            let b = greedy(&config, from_gguf);
            assert_eq!(a, b, "{what}: greedy tokens");
        }
    }
}

#[test]
fn open_model_resolves_every_kind_of_spec() {
    let dir = TempDir::new("open");
    let json = tiny_json("LlamaForCausalLM", "");
    std::fs::write(dir.file("config.json"), &json).unwrap();
    let cfg = ModelConfig::from_json(&json, "test").unwrap();
    let ts = hf_checkpoint(&cfg, Store::F32, 7);
    write_safetensors(&dir.file("model.safetensors"), &ts);
    // A GGUF file without the extension is recognised by its magic.
    let gguf = dir.file("model.bin");
    gguf_twin(&cfg, &ts, Store::F32).write(&gguf).unwrap();

    let m = open_model("dummy:tiny").unwrap();
    assert_eq!(m.source, WeightSource::Dummy { seed: 0 });
    assert_eq!(m.tokenizer().unwrap().vocab_size(), 258);
    let d = dir.path().to_str().unwrap().to_string();
    assert_eq!(open_model(&d).unwrap().config, cfg);
    let st = dir.file("model.safetensors");
    let m = open_model(st.to_str().unwrap()).unwrap();
    assert_eq!(
        (m.config, m.source),
        (cfg.clone(), WeightSource::Dir(PathBuf::from(&st)))
    );
    let m = open_model(gguf.to_str().unwrap()).unwrap();
    assert_eq!(m.source, WeightSource::Gguf(PathBuf::from(&gguf)));
    assert_eq!(m.config, cfg);
    // The tokenizer comes from the metadata (built by Tokenizer::from_gguf_vocab).
    let vocab = vocab_from_gguf(&GgufFile::open(&gguf).unwrap()).unwrap();
    assert_eq!(vocab.model, "gpt2");
    assert_eq!(vocab.tokens.len(), 96);
    assert_eq!(vocab.tokens[5], "t5");
    assert_eq!(vocab.token_types.as_deref().map(|t| t.len()), Some(96));
    assert_eq!(vocab.merges, Some(vec!["t 1".to_string()]));
    assert_eq!((vocab.bos_token_id, vocab.eos_token_id), (Some(1), Some(2)));
    assert_eq!(vocab.add_bos_token, Some(false));
    assert_eq!(vocab.chat_template.as_deref(), Some("{{ x }}"));
    assert!(open_model("/nonexistent/model.gguf").is_err());
}

// ---------------------------------------------------------------------------------------
// Dequantizers against gguf-py.

#[test]
fn dequantizers_match_gguf_py_bit_for_bit() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf_blocks.gguf");
    let file = GgufFile::open(&path).unwrap();
    for ty in GgmlType::SUPPORTED {
        let q = format!("q.{ty}");
        let info = file
            .tensor(&q)
            .unwrap_or_else(|| panic!("fixture lacks {q}"));
        assert_eq!(info.ggml_type, ty);
        let got = file.tensor_f32(&q).unwrap();
        let want = file.tensor_f32(&format!("f.{ty}")).unwrap();
        assert_eq!(got.len(), want.len(), "{ty}");
        assert!(want.iter().all(|x| x.is_finite()), "{ty}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{ty} element {i}: {g} vs gguf-py {w}"
            );
        }
    }
}

#[test]
fn quantizers_round_trip_within_their_step() {
    let v: Vec<f32> = values(11, 32 * 64);
    // Max error: half a step, except Q4_0's one-sided range [-8d, 7d] (a full step).
    for (ty, bytes, bound) in [
        (
            GgmlType::Q8_0,
            encore_core::model::gguf::quantize_q8_0(&v),
            0.5 / 127.0,
        ),
        (
            GgmlType::Q4_0,
            encore_core::model::gguf::quantize_q4_0(&v),
            1.0 / 8.0,
        ),
        (
            GgmlType::Q4_1,
            encore_core::model::gguf::quantize_q4_1(&v),
            1.0 / 15.0,
        ),
    ] {
        let mut out = vec![0f32; v.len()];
        dequantize(ty, &bytes, &mut out).unwrap();
        let worst = v
            .iter()
            .zip(&out)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        // (20% more for the scales rounded to f16.)
        assert!(worst <= bound * 1.2, "{ty}: max error {worst}");
    }
    // Unsupported types and sizes are errors that name the type.
    let mut out = vec![0f32; 256];
    let e = dequantize(GgmlType::IQ2_XXS, &[0; 66], &mut out).unwrap_err();
    assert_mentions(&e, &["IQ2_XXS", "Q4_K"]);
    let e = dequantize(GgmlType::Q8_0, &[0; 33], &mut out).unwrap_err();
    assert_mentions(&e, &["33 bytes", "Q8_0"]);
}

// ---------------------------------------------------------------------------------------
// Config from metadata.

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
        llama3: None,
    };
    let plain = rope.inv_freq();
    let scaled = RopeConfig {
        llama3: Some(scaling),
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
    assert_eq!(c.rope.llama3, Some(scaling));
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
                w.kv("general.architecture", Value::String("gemma2".into()));
            }),
            vec!["gemma2", "general.architecture", "llama, qwen2, qwen3"],
        ),
        (
            Box::new(|w| {
                w.remove_kv("general.architecture");
            }),
            vec!["general.architecture", "missing"],
        ),
        (
            Box::new(|w| {
                w.kv("llama.rope.dimension_count", Value::U32(8));
            }),
            vec!["llama.rope.dimension_count", "partial rotary"],
        ),
        (
            Box::new(|w| {
                w.kv("llama.rope.scaling.type", Value::String("yarn".into()));
            }),
            vec!["llama.rope.scaling.type", "yarn"],
        ),
        (
            Box::new(|w| {
                w.kv("llama.expert_count", Value::U32(8));
            }),
            vec!["llama.expert_count", "mixture-of-experts"],
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

// ---------------------------------------------------------------------------------------
// Weights errors.

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

// ---------------------------------------------------------------------------------------
// Malformed files.

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Open `bytes` as a file; the error text, which must name the path.
fn open_err(dir: &TempDir, bytes: &[u8]) -> String {
    let path = dir.file("bad.gguf");
    std::fs::write(&path, bytes).unwrap();
    let (e, msg) = err_text(GgufFile::open(&path));
    assert!(
        matches!(e, Error::WeightsFile { .. } | Error::Weights { .. }),
        "{msg}"
    );
    assert_mentions(&msg, &["bad.gguf"]);
    msg
}

fn small_file() -> GgufWriter {
    let cfg = ModelConfig::from_json(
        &tiny_json("LlamaForCausalLM", "")
            .replace(r#""vocab_size": 96"#, r#""vocab_size": 8"#)
            .replace(r#""num_hidden_layers": 2"#, r#""num_hidden_layers": 1"#)
            .replace(r#""hidden_size": 64"#, r#""hidden_size": 32"#)
            .replace(r#""intermediate_size": 96"#, r#""intermediate_size": 32"#),
        "test",
    )
    .unwrap();
    let ts = hf_checkpoint(&cfg, Store::Q8_0, 5);
    gguf_twin(&cfg, &ts, Store::Q8_0)
}

#[test]
fn every_truncation_is_an_error_never_a_panic() {
    let dir = TempDir::new("trunc");
    let bytes = small_file().to_bytes();
    let path = dir.file("whole.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let whole = GgufFile::open(&path).unwrap();
    let data_end = whole
        .tensors()
        .iter()
        .map(|t| t.start + t.len)
        .max()
        .unwrap();
    let header_end = whole.tensors().iter().map(|t| t.start).min().unwrap();
    let cuts = (0..header_end)
        .step_by(3)
        .chain((header_end..bytes.len()).step_by(61));
    let cut_path = dir.file("cut.gguf");
    for cut in cuts {
        std::fs::write(&cut_path, &bytes[..cut]).unwrap();
        match GgufFile::open(&cut_path) {
            Ok(f) => {
                assert!(
                    cut >= data_end,
                    "a file cut at {cut} of {} opened",
                    bytes.len()
                );
                config_from_gguf(&f).unwrap();
            }
            Err(e) => {
                let msg = e.to_string();
                assert!(cut < data_end, "cut at {cut}: {msg}");
                assert_mentions(&msg, &["cut.gguf"]);
                if cut >= header_end {
                    assert_mentions(&msg, &["extend past the end"]);
                } else if cut > 24 {
                    assert!(
                        msg.contains("truncated") || msg.contains("can hold"),
                        "{msg}"
                    );
                }
            }
        }
    }
}

#[test]
fn malformed_headers_name_what_is_wrong() {
    let dir = TempDir::new("hdr");
    let good = small_file().to_bytes();

    let mut b = good.clone();
    b[..4].copy_from_slice(b"GGML");
    assert_mentions(&open_err(&dir, &b), &["not a GGUF file"]);
    for (v, hint) in [
        (1u32, "v1"),
        (4, "versions 2 and 3"),
        (3u32.swap_bytes(), "big-endian"),
    ] {
        let mut b = good.clone();
        b[4..8].copy_from_slice(&v.to_le_bytes());
        assert_mentions(&open_err(&dir, &b), &["unsupported GGUF version", hint]);
    }
    let mut b = good.clone();
    put_u64(&mut b, 8, u64::MAX);
    assert_mentions(
        &open_err(&dir, &b),
        &["tensor count", "18446744073709551615"],
    );
    let mut b = good.clone();
    put_u64(&mut b, 16, 1 << 40);
    assert_mentions(&open_err(&dir, &b), &["metadata count"]);
    let mut b = good.clone();
    put_u64(&mut b, 24, u64::MAX / 2);
    assert_mentions(
        &open_err(&dir, &b),
        &["length of the key of metadata entry 0"],
    );
    assert_mentions(&open_err(&dir, b"GGUF"), &["truncated", "version"]);
    assert_mentions(&open_err(&dir, b""), &["truncated", "magic"]);

    let writer_err = |edit: &dyn Fn(&mut GgufWriter)| {
        let mut w = small_file();
        edit(&mut w);
        open_err(&dir, &w.to_bytes())
    };
    // Metadata values.
    let deep = (0..12).fold(Value::U8(1), |v, _| Value::Array(9, vec![v]));
    assert_mentions(
        &writer_err(&|w| {
            w.kv("x.deep", deep.clone());
        }),
        &["x.deep", "nests arrays"],
    );
    assert_mentions(
        &writer_err(&|w| {
            w.kv("x.arr", Value::Array(13, vec![]));
        }),
        &["x.arr", "unknown value type 13"],
    );
    assert_mentions(
        &writer_err(&|w| {
            w.kv("general.alignment", Value::U32(24));
        }),
        &["general.alignment", "power of two"],
    );
    assert_mentions(
        &writer_err(&|w| {
            w.metadata
                .push(("general.name".into(), Value::String("again".into())));
        }),
        &["general.name", "twice"],
    );
    // Tensor infos.
    assert_mentions(
        &writer_err(&|w| {
            w.tensors
                .push(("t5".into(), vec![1; 5], GgmlType::F32, vec![0; 4]));
        }),
        &["t5", "5 dimensions"],
    );
    assert_mentions(
        &writer_err(&|w| {
            w.tensors
                .push(("huge".into(), vec![1 << 40, 1 << 40], GgmlType::F32, vec![]));
        }),
        &["huge", "too large"],
    );
    assert_mentions(
        &writer_err(&|w| {
            w.tensors
                .push(("odd".into(), vec![33], GgmlType::Q8_0, vec![0; 34]));
        }),
        &["odd", "not a multiple of the Q8_0 block"],
    );
    assert_mentions(
        &writer_err(&|w| {
            w.tensors
                .push(("alien".into(), vec![32], GgmlType(77), vec![]));
        }),
        &["alien", "type id 77"],
    );
    assert_mentions(
        &writer_err(&|w| {
            w.tensors
                .push(("t".into(), vec![4], GgmlType::F32, vec![0; 16]));
            w.tensors
                .push(("t".into(), vec![4], GgmlType::F32, vec![0; 16]));
        }),
        &["`t`", "twice"],
    );
    // Data past the end (a tensor claiming more bytes than were written).
    assert_mentions(
        &writer_err(&|w| {
            w.tensors
                .push(("big".into(), vec![1 << 20], GgmlType::F32, vec![0; 16]));
        }),
        &["big", "extend past the end"],
    );
}

#[test]
fn a_bad_bool_and_a_misaligned_offset_are_named() {
    let dir = TempDir::new("bool");
    let mut w = GgufWriter::new();
    w.kv("x.flag", Value::Bool(true));
    let mut b = w.to_bytes();
    // magic, version, counts, key (8 + 6), type (4): then the bool byte.
    let at = 4 + 4 + 8 + 8 + 8 + 6 + 4;
    assert_eq!(b[at], 1);
    b[at] = 7;
    assert_mentions(&open_err(&dir, &b), &["x.flag", "bool of value 7"]);

    let mut w = GgufWriter::new();
    w.tensor_f32("a", &[4], &[1.0; 4]);
    let mut b = w.to_bytes();
    // The offset is the last 8 bytes of the tensor info, right before the padding.
    let info_end = 4 + 4 + 8 + 8 + (8 + 1) + 4 + 8 + 4 + 8;
    put_u64(&mut b, info_end - 8, 4);
    assert_mentions(&open_err(&dir, &b), &["`a`", "offset 4", "alignment 32"]);
}

// ---------------------------------------------------------------------------------------
// The real model (not in CI).

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
    let file = GgufFile::open(Path::new(&model)).unwrap();
    if let Ok(reference) = std::env::var("ENCORE_GGUF_REFERENCE") {
        let r = GgufFile::open(Path::new(&reference)).unwrap();
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
    let be = CpuBackend::new();
    let model = Model::new(&be, cfg.clone(), w, 64).unwrap();
    let mut runner = Runner::new(
        &be,
        model,
        RunnerConfig {
            block_size: 16,
            num_blocks: 8,
            max_tokens_per_step: 64,
            max_seqs: 1,
            max_seq_len: 64,
            penalty_slots: 0,
        },
    )
    .unwrap();
    let opts = GenerateOptions {
        max_tokens: 8,
        sampling: SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
            ..Default::default()
        },
        ignore_eos: true,
    };
    let out = generate(
        &mut runner,
        &[prompt],
        &[],
        &opts,
        &encore_core::progress::NoProgress,
        |_, _| std::ops::ControlFlow::Continue(()),
    )
    .unwrap();
    let text: String = out[0]
        .output_ids
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

#[test]
fn every_value_type_round_trips_through_the_writer() {
    let dir = TempDir::new("values");
    let values = vec![
        Value::U8(200),
        Value::I8(-5),
        Value::U16(60000),
        Value::I16(-30000),
        Value::U32(4_000_000_000),
        Value::I32(-2_000_000_000),
        Value::F32(1.5),
        Value::Bool(true),
        Value::String("héllo".into()),
        Value::U64(u64::MAX),
        Value::I64(i64::MIN),
        Value::F64(-0.25),
        Value::Array(
            8,
            vec![Value::String("a".into()), Value::String(String::new())],
        ),
        Value::Array(
            9,
            vec![
                Value::Array(4, vec![Value::U32(1), Value::U32(2)]),
                Value::Array(4, vec![]),
            ],
        ),
    ];
    for version in [2, 3] {
        let mut w = GgufWriter::new();
        w.version = version;
        w.alignment = 64;
        for (i, v) in values.iter().enumerate() {
            w.kv(&format!("k.{i}"), v.clone());
        }
        w.tensor("q", &[2, 32], GgmlType::Q8_0, vec![0; 68]);
        w.tensor_f32("f", &[3], &[1.0, 2.0, 3.0]);
        let path = dir.file("values.gguf");
        w.write(&path).unwrap();
        let f = GgufFile::open(&path).unwrap();
        assert_eq!((f.version, f.alignment), (version, 64));
        for (i, v) in values.iter().enumerate() {
            assert_eq!(f.get(&format!("k.{i}")), Some(v), "k.{i}");
        }
        assert_eq!(f.get("general.alignment"), Some(&Value::U32(64)));
        assert_eq!(f.tensor("q").unwrap().shape(), vec![2, 32]);
        assert_eq!(f.tensor("q").unwrap().dims, vec![32, 2]);
        assert_eq!(f.tensor("f").unwrap().start % 64, 0);
        assert_eq!(f.tensor_f32("f").unwrap(), vec![1.0, 2.0, 3.0]);
    }
}

/// Random byte changes in the header and metadata: every outcome is an error or a file
/// that loads (or fails to load) cleanly, never a panic.
#[test]
fn corrupted_headers_never_panic() {
    let dir = TempDir::new("corrupt");
    let good = small_file().to_bytes();
    let path = dir.file("whole.gguf");
    std::fs::write(&path, &good).unwrap();
    let header_end = GgufFile::open(&path).unwrap().tensors()[0].start;
    let cut = dir.file("corrupt.gguf");
    let mut opened = 0;
    for i in 0..1500u64 {
        let r = values(i + 100, 3);
        let mut b = good.clone();
        let at = ((r[0] + 1.0) / 2.0 * header_end as f32) as usize % header_end;
        let byte = ((r[1] + 1.0) * 128.0) as u8;
        b[at] = if r[2] > 0.0 {
            byte
        } else {
            b[at] ^ (1 << (byte % 8))
        };
        std::fs::write(&cut, &b).unwrap();
        let Ok(f) = GgufFile::open(&cut) else {
            continue;
        };
        opened += 1;
        let _ = vocab_from_gguf(&f);
        if let Ok(cfg) = config_from_gguf(&f) {
            let _ = load(&cfg, WeightSource::Gguf(PathBuf::from(&cut)));
        }
    }
    assert!(
        opened > 0,
        "some corruptions (e.g. inside strings) still parse"
    );
}
