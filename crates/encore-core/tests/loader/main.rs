//! The model loader at its boundaries: HF `config.json` parsing (shaped like the real
//! configs), safetensors checkpoints written to a temp dir and loaded on the CPU backend
//! (round trip with dtype conversion and q/k/v, gate/up merging, sharding, tying), the
//! errors for broken checkpoints and configs, and the seeded dummy weights.

use std::path::{Path, PathBuf};

use encore_core::backend::cpu::CpuBackend;
use encore_core::model::config::{Arch, ModelConfig, SlidingWindow};
use encore_core::model::weights::{self, ModelWeights, WeightSource};
use encore_core::ops::{Llama3Scaling, RopeConfig, RopeScaling};
use encore_core::{DType, Error, Tensor};
use half::{bf16, f16};
use safetensors::tensor::Dtype;

#[path = "../common/mod.rs"]
mod common;

use common::checkpoint::{
    all_values, download, err_text, model_dir, plain, values, write_safetensors, Ck,
};
use common::temp_dir::TempDir;

mod act_order;
mod config;
mod dummy;
mod errors;
mod families;
mod fp8;
mod gpt_oss;
mod moe;
mod mxfp4;
mod packed_int;
mod round_trip;

// ---------------------------------------------------------------------------------------
// Helpers: temp dirs, checkpoints, comparisons.

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

/// The HF tensor names and shapes of `cfg`, written out here independently of the loader.
fn hf_layout(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, hd, i) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
    let (q, kv) = (cfg.num_heads * hd, cfg.num_kv_heads * hd);
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![cfg.vocab_size, h],
    )];
    // StableLM's LayerNorms: a bias beside each norm's weight.
    let ln = cfg.norm_kind == encore_core::model::config::NormKind::LayerBias;
    for l in 0..cfg.num_layers {
        let p = format!("model.layers.{l}.");
        let mut add = |s: &str, shape: Vec<usize>| out.push((format!("{p}{s}"), shape));
        // OLMo 2 has no norm before attention or the MLP.
        let pre = cfg.arch != Arch::Olmo2;
        if pre {
            add("input_layernorm.weight", vec![h]);
            if ln {
                add("input_layernorm.bias", vec![h]);
            }
        }
        // Phi-3 keeps q/k/v and gate/up fused.
        let fused = cfg.arch == Arch::Phi3;
        if fused {
            add("self_attn.qkv_proj.weight", vec![q + 2 * kv, h]);
        } else {
            add("self_attn.q_proj.weight", vec![q, h]);
            add("self_attn.k_proj.weight", vec![kv, h]);
            add("self_attn.v_proj.weight", vec![kv, h]);
        }
        if cfg.qkv_bias {
            add("self_attn.q_proj.bias", vec![q]);
            add("self_attn.k_proj.bias", vec![kv]);
            add("self_attn.v_proj.bias", vec![kv]);
        }
        // gpt-oss: a sink per head, o_proj's bias, the router's and the experts' biases.
        let oss = cfg.arch == Arch::GptOss;
        if oss {
            add("self_attn.sinks", vec![cfg.num_heads]);
        }
        if cfg.qk_norm {
            // OLMo 2's span every head.
            let (qn, kn) = if pre { (hd, hd) } else { (q, kv) };
            add("self_attn.q_norm.weight", vec![qn]);
            add("self_attn.k_norm.weight", vec![kn]);
        }
        add("self_attn.o_proj.weight", vec![h, q]);
        if cfg.o_bias {
            add("self_attn.o_proj.bias", vec![h]);
        }
        if cfg.post_norms {
            // Gemma: the attention's output norm, then the MLP's input norm.
            add("post_attention_layernorm.weight", vec![h]);
            if pre {
                add("pre_feedforward_layernorm.weight", vec![h]);
            }
        } else {
            add("post_attention_layernorm.weight", vec![h]);
            if ln {
                add("post_attention_layernorm.bias", vec![h]);
            }
        }
        match &cfg.moe {
            Some(m) if m.is_sparse(l) => {
                // The loader's order: the router, every expert's gate, every expert's up,
                // the experts' down projections, then the shared expert's gate, up, gate
                // and down.
                let (e, ei) = (m.num_experts, m.expert_intermediate);
                let (base, names) = match cfg.arch {
                    Arch::Mixtral => ("block_sparse_moe", ["w1", "w3", "w2"]),
                    _ => ("mlp", ["gate_proj", "up_proj", "down_proj"]),
                };
                let router = if oss { "router" } else { "gate" };
                add(&format!("{base}.{router}.weight"), vec![e, h]);
                if oss {
                    add(&format!("{base}.{router}.bias"), vec![e]);
                }
                let kinds: &[&str] = if oss {
                    &["weight", "bias"]
                } else {
                    &["weight"]
                };
                for kind in kinds {
                    for w in &names[..2] {
                        for x in 0..e {
                            let shape = if *kind == "weight" {
                                vec![ei, h]
                            } else {
                                vec![ei]
                            };
                            add(&format!("{base}.experts.{x}.{w}.{kind}"), shape);
                        }
                    }
                }
                for kind in kinds {
                    for x in 0..e {
                        let shape = if *kind == "weight" {
                            vec![h, ei]
                        } else {
                            vec![h]
                        };
                        add(&format!("{base}.experts.{x}.{}.{kind}", names[2]), shape);
                    }
                }
                if let Some(s) = m.shared_expert_intermediate {
                    add("mlp.shared_expert.gate_proj.weight", vec![s, h]);
                    add("mlp.shared_expert.up_proj.weight", vec![s, h]);
                    add("mlp.shared_expert_gate.weight", vec![1, h]);
                    add("mlp.shared_expert.down_proj.weight", vec![h, s]);
                }
            }
            _ if fused => {
                add("mlp.gate_up_proj.weight", vec![2 * i, h]);
                add("mlp.down_proj.weight", vec![h, i]);
            }
            _ => {
                add("mlp.gate_proj.weight", vec![i, h]);
                add("mlp.up_proj.weight", vec![i, h]);
                add("mlp.down_proj.weight", vec![h, i]);
                if cfg.post_norms {
                    add("post_feedforward_layernorm.weight", vec![h]);
                }
            }
        }
    }
    out.push(("model.norm.weight".into(), vec![h]));
    if ln {
        out.push(("model.norm.bias".into(), vec![h]));
    }
    if !cfg.tie_word_embeddings {
        out.push(("lm_head.weight".into(), vec![cfg.vocab_size, h]));
    }
    out
}

/// A full random checkpoint for `cfg` in `dtype`.
fn checkpoint(cfg: &ModelConfig, dtype: Dtype, seed: u64) -> Vec<Ck> {
    hf_layout(cfg)
        .into_iter()
        .enumerate()
        .map(|(k, (name, shape))| {
            let n = shape.iter().product();
            let values = values(seed * 1000 + k as u64, n)
                .into_iter()
                .map(|x| exact_in(dtype, x))
                .collect();
            Ck {
                name,
                dtype,
                shape,
                values,
            }
        })
        .collect()
}

fn find<'a>(ts: &'a [Ck], name: &str) -> &'a Ck {
    ts.iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("{name}"))
}

/// A small config.json of `arch` with the tiny shapes (intermediate size 80); `extra` is
/// spliced in.
fn tiny_json(arch: &str, extra: &str) -> String {
    common::checkpoint::tiny_json(arch, 80, extra)
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

/// `t` holds exactly the rows of `parts`, in order, rounded to the run dtype.
fn check_rows(t: &Tensor, parts: &[&Ck], run: DType) {
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
fn check_model(cfg: &ModelConfig, w: &ModelWeights, ts: &[Ck], run: DType) {
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
        assert_eq!(l.qkv().shape(), &[qkv_rows, cfg.hidden_size]);
        assert_eq!(
            l.gate_up().shape(),
            &[2 * cfg.intermediate_size, cfg.hidden_size]
        );
        check_rows(l.input_norm().unwrap(), &[t("input_layernorm.weight")], run);
        check_rows(
            l.qkv(),
            &[
                t("self_attn.q_proj.weight"),
                t("self_attn.k_proj.weight"),
                t("self_attn.v_proj.weight"),
            ],
            run,
        );
        match l.qkv_bias() {
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
        match (l.q_norm(), l.k_norm()) {
            (Some(q), Some(k)) => {
                check_rows(q, &[t("self_attn.q_norm.weight")], run);
                check_rows(k, &[t("self_attn.k_norm.weight")], run);
            }
            (None, None) => assert!(!cfg.qk_norm),
            _ => panic!("q_norm and k_norm come together"),
        }
        check_rows(l.o_proj(), &[t("self_attn.o_proj.weight")], run);
        check_rows(
            l.post_norm().unwrap(),
            &[t("post_attention_layernorm.weight")],
            run,
        );
        check_rows(
            l.gate_up(),
            &[t("mlp.gate_proj.weight"), t("mlp.up_proj.weight")],
            run,
        );
        check_rows(l.down(), &[t("mlp.down_proj.weight")], run);
    }
}
