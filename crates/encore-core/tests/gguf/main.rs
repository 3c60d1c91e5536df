//! GGUF loading at its boundaries: GGUF twins of HF checkpoints (F32/F16 exact, Q8_0 on
//! exactly representable weights, llama's q/k permutation) load to the same weights and
//! the same greedy tokens as the safetensors originals; the dequantizers match gguf-py's
//! bit for bit (fixture from `scripts/gguf_reference.py`); config keys map as llama.cpp
//! writes them; and every malformed file is an error naming what is wrong, never a panic.

use std::path::{Path, PathBuf};

use encore_core::backend::cpu::CpuBackend;
use encore_core::model::config::{Arch, ModelConfig, SlidingWindow};
use encore_core::model::formats::Quantization;
use encore_core::model::gguf::{
    config_from_gguf, dequantize, quantize, vocab_from_gguf, GgmlType, GgufFile, GgufWriter, Value,
};
use encore_core::model::llama::Model;
use encore_core::model::weights::{self, ModelWeights, WeightSource};
use encore_core::model::{open_model, ModelFiles};
use encore_core::ops::{Llama3Scaling, RopeConfig, RopeScaling};
use encore_core::runner::{Runner, RunnerConfig};
use encore_core::{DType, Error};
use half::f16;

#[path = "../common/mod.rs"]
mod common;

use common::checkpoint::{
    all_values, assert_mentions, err_text, f32_tensors, values, write_safetensors,
};
use common::temp_dir::TempDir;

mod malformed;
mod metadata;
mod real;
mod twins;

// ---------------------------------------------------------------------------------------
// Helpers.

/// The llama.cpp tensor of an HF tensor and, for one expert's matrix, its index in the
/// stacked `*_exps` tensor, written out here independently of the loader.
fn llama_cpp_source(hf: &str) -> (String, Option<usize>) {
    if let Some(rest) = hf.strip_prefix("model.layers.") {
        let (layer, rest) = rest.split_once('.').unwrap();
        let rest = rest
            .strip_prefix("block_sparse_moe.")
            .or(rest.strip_prefix("mlp."))
            .unwrap_or(rest);
        if let Some(e) = rest.strip_prefix("experts.") {
            let (x, w) = e.split_once('.').unwrap();
            let stacked = match w {
                "gate_proj.weight" | "w1.weight" => "gate",
                "up_proj.weight" | "w3.weight" => "up",
                // gpt-oss's expert biases, stacked `[experts, rows]`.
                "gate_proj.bias" | "up_proj.bias" | "down_proj.bias" => {
                    let (p, _) = w.split_once('_').unwrap();
                    return (
                        format!("blk.{layer}.ffn_{p}_exps.bias"),
                        Some(x.parse().unwrap()),
                    );
                }
                _ => "down",
            };
            return (
                format!("blk.{layer}.ffn_{stacked}_exps.weight"),
                Some(x.parse().unwrap()),
            );
        }
        let moe = [
            ("gate.weight", "ffn_gate_inp.weight"),
            ("router.weight", "ffn_gate_inp.weight"),
            ("router.bias", "ffn_gate_inp.bias"),
            ("shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"),
            ("shared_expert.up_proj.weight", "ffn_up_shexp.weight"),
            ("shared_expert.down_proj.weight", "ffn_down_shexp.weight"),
            ("shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"),
        ];
        if let Some((_, g)) = moe.iter().find(|(h, _)| *h == rest) {
            return (format!("blk.{layer}.{g}"), None);
        }
    }
    (llama_cpp_name(hf), None)
}

/// The llama.cpp name of an HF tensor, written out here independently of the loader.
fn llama_cpp_name(hf: &str) -> String {
    match hf {
        "model.embed_tokens.weight" => return "token_embd.weight".into(),
        "model.norm.weight" => return "output_norm.weight".into(),
        "model.norm.bias" => return "output_norm.bias".into(),
        "lm_head.weight" => return "output.weight".into(),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.").unwrap();
    let (layer, rest) = rest.split_once('.').unwrap();
    let table = [
        ("input_layernorm.weight", "attn_norm.weight"),
        // StableLM's LayerNorm biases.
        ("input_layernorm.bias", "attn_norm.bias"),
        ("post_attention_layernorm.bias", "ffn_norm.bias"),
        ("self_attn.q_proj.weight", "attn_q.weight"),
        ("self_attn.k_proj.weight", "attn_k.weight"),
        ("self_attn.v_proj.weight", "attn_v.weight"),
        ("self_attn.q_proj.bias", "attn_q.bias"),
        ("self_attn.k_proj.bias", "attn_k.bias"),
        ("self_attn.v_proj.bias", "attn_v.bias"),
        ("self_attn.o_proj.weight", "attn_output.weight"),
        // gpt-oss's o_proj bias and sinks.
        ("self_attn.o_proj.bias", "attn_output.bias"),
        ("self_attn.sinks", "attn_sinks.weight"),
        ("self_attn.q_norm.weight", "attn_q_norm.weight"),
        ("self_attn.k_norm.weight", "attn_k_norm.weight"),
        ("post_attention_layernorm.weight", "ffn_norm.weight"),
        ("mlp.gate_proj.weight", "ffn_gate.weight"),
        ("mlp.up_proj.weight", "ffn_up.weight"),
        ("mlp.down_proj.weight", "ffn_down.weight"),
        // Phi-3's fused projections (llama.cpp keeps them fused: gate rows, then up rows).
        ("self_attn.qkv_proj.weight", "attn_qkv.weight"),
        ("mlp.gate_up_proj.weight", "ffn_up.weight"),
        // Gemma's MLP norms (its `post_attention_layernorm`: `llama_cpp_gemma_name`).
        ("pre_feedforward_layernorm.weight", "ffn_norm.weight"),
        ("post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
    ];
    let short = table.iter().find(|(h, _)| *h == rest).unwrap().1;
    format!("blk.{layer}.{short}")
}

/// The llama.cpp names of Gemma's norms around attention and the MLP.
fn llama_cpp_gemma_name(hf: &str) -> Option<String> {
    let (layer, rest) = hf.strip_prefix("model.layers.")?.split_once('.')?;
    let short = match rest {
        "post_attention_layernorm.weight" => "post_attention_norm.weight",
        "pre_feedforward_layernorm.weight" => "ffn_norm.weight",
        "post_feedforward_layernorm.weight" => "post_ffw_norm.weight",
        _ => return None,
    };
    Some(format!("blk.{layer}.{short}"))
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
    /// The stacked experts as MXFP4 (values `2^e * q`, `q` an E2M1 value and 6 in every
    /// block, so lossless), every other matrix F32.
    Mxfp4,
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
                    Store::Mxfp4 if spec.name.contains(".experts.") => mxfp4_exact(&raw, k),
                    Store::Mxfp4 => raw.iter().map(|x| 0.2 * x).collect(),
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

/// Per block of 32: `2^-(2 + k % 3)` times the E2M1 value nearest `6 x`, one element 6.
fn mxfp4_exact(raw: &[f32], k: usize) -> Vec<f32> {
    const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let d = 2f32.powi(-(2 + (k % 3) as i32));
    raw.chunks(32)
        .flat_map(|b| {
            b.iter().enumerate().map(move |(i, &x)| {
                let a = (6.0 * x.abs()).min(6.0);
                let q = E2M1
                    .iter()
                    .copied()
                    .min_by(|p, q| (p - a).abs().total_cmp(&(q - a).abs()))
                    .unwrap();
                match (i, x < 0.0 && q != 0.0) {
                    (5, _) => 6.0 * d,
                    (_, true) => -q * d,
                    _ => q * d,
                }
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
    common::checkpoint::tiny_json(arch, 96, extra)
}

/// The metadata llama.cpp's converter writes for `cfg`, with a placeholder vocabulary.
fn metadata(w: &mut GgufWriter, cfg: &ModelConfig) {
    w.model_metadata(cfg);
    w.longrope_tensors(cfg);
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

/// A GGUF twin of an HF checkpoint, as llama.cpp's converter would write it: each layer's
/// experts stacked `[experts, rows, k]`, Qwen2-MoE's `[1, hidden]` shared-expert gate as a
/// vector.
fn gguf_twin(cfg: &ModelConfig, ts: &[(String, Vec<usize>, Vec<f32>)], store: Store) -> GgufWriter {
    let mut w = GgufWriter::new();
    metadata(&mut w, cfg);
    // (GGUF name, one expert's shape, (expert, values) of each expert).
    type Stack = (String, Vec<usize>, Vec<(usize, Vec<f32>)>);
    let mut stacks: Vec<Stack> = Vec::new();
    for (name, shape, v) in ts {
        let (g, expert) = llama_cpp_source(name);
        if let Some(x) = expert {
            match stacks.iter_mut().find(|(n, ..)| *n == g) {
                Some((_, _, parts)) => parts.push((x, v.clone())),
                None => stacks.push((g, shape.clone(), vec![(x, v.clone())])),
            }
        }
    }
    let mut stacked = Vec::new();
    for (g, shape, mut parts) in stacks {
        parts.sort_by_key(|(x, _)| *x);
        let mut full = vec![parts.len()];
        full.extend(shape);
        let v: Vec<f32> = parts.into_iter().flat_map(|(_, v)| v).collect();
        stacked.push((g, full, v));
    }
    let plain = ts.iter().filter(|(n, ..)| llama_cpp_source(n).1.is_none());
    let plain = plain.map(|(n, shape, v)| {
        let shape = if n.ends_with("shared_expert_gate.weight") {
            shape[1..].to_vec()
        } else {
            shape.clone()
        };
        // Gemma: llama.cpp's converter stores the norms as 1 + w, and names the post
        // norms apart (HF's `post_attention_layernorm` is the attention's output norm).
        // gpt-oss's MLP input norm is llama.cpp's `post_attention_norm` too.
        let post = cfg.post_norms || cfg.arch == Arch::GptOss;
        let gemma = post.then(|| llama_cpp_gemma_name(n)).flatten();
        let v = match cfg.norm_plus_one && n.ends_with("norm.weight") {
            true => v.iter().map(|x| 1.0 + x).collect(),
            false => v.clone(),
        };
        (
            gemma.unwrap_or_else(|| llama_cpp_source(n).0),
            n.clone(),
            shape,
            v,
        )
    });
    let all: Vec<(String, String, Vec<usize>, Vec<f32>)> = plain
        .chain(stacked.into_iter().map(|(g, s, v)| (g.clone(), g, s, v)))
        .collect();
    for (g, name, shape, v) in &all {
        let heads = if name.contains("q_proj") {
            cfg.num_heads
        } else {
            cfg.num_kv_heads
        };
        let permute = matches!(cfg.arch.base(), Arch::Llama | Arch::Mistral | Arch::SmolLM3)
            && (name.contains("q_proj") || name.contains("k_proj"));
        let v = if permute {
            llama_cpp_permute(v, shape[0], heads)
        } else {
            v.clone()
        };
        // Biases stay F32 (gpt-oss's stacked expert biases are 2-D).
        match (store, shape.len()) {
            _ if g.ends_with(".bias") => w.tensor_f32(g, shape, &v),
            (_, 1) | (Store::F32, _) => w.tensor_f32(g, shape, &v),
            (Store::F16, _) => w.tensor_f16(g, shape, &v),
            (Store::Q8_0, _) => w.tensor(g, shape, GgmlType::Q8_0, q8_blocks(&v)),
            (Store::Mxfp4, _) if g.contains("_exps.") => {
                w.tensor(g, shape, GgmlType::MXFP4, quantize(GgmlType::MXFP4, &v))
            }
            (Store::Mxfp4, _) => w.tensor_f32(g, shape, &v),
        };
    }
    w
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

/// Greedy tokens of two prompts, 8 new tokens each.
fn greedy(cfg: &ModelConfig, w: ModelWeights) -> Vec<Vec<u32>> {
    let prompts = vec![vec![1, 5, 9, 40, 77], vec![1, 90, 3]];
    greedy_on_cpu(cfg, w, &prompts, 4, 1 + 2 * 16)
}

/// Greedy tokens (8 new, EOS ignored) of `prompts`, f32 on the CPU, with `num_blocks` KV
/// blocks of `block_size`.
fn greedy_on_cpu(
    cfg: &ModelConfig,
    w: ModelWeights,
    prompts: &[Vec<u32>],
    block_size: usize,
    num_blocks: usize,
) -> Vec<Vec<u32>> {
    let be = CpuBackend::new();
    let model = Model::new(&be, cfg.clone(), w, 64).unwrap();
    let mut runner = Runner::new(
        &be,
        model,
        RunnerConfig {
            block_size,
            num_blocks,
            max_tokens_per_step: 64,
            max_seqs: prompts.len(),
            max_seq_len: 64,
            penalty_slots: 0,
            kv_dtype: None,
        },
    )
    .unwrap();
    common::generate_greedy(&mut runner, prompts, &[], 8, true)
}

/// gpt-oss's checkpoint as transformers stores it (`tests/loader/gpt_oss.rs`): each
/// layer's per-expert tensors fused into `mlp.experts.gate_up_proj` `[E, hidden, 2 I]`
/// (gate and up interleaved), `gate_up_proj_bias` `[E, 2 I]`, `down_proj` `[E, I, hidden]`
/// and `down_proj_bias` `[E, hidden]`; other models' tensors as they are.
fn hf_fused_layout(
    cfg: &ModelConfig,
    ts: &[(String, Vec<usize>, Vec<f32>)],
) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let Some(moe) = cfg.moe.as_ref().filter(|_| cfg.arch == Arch::GptOss) else {
        return ts.to_vec();
    };
    let (e, h, i) = (moe.num_experts, cfg.hidden_size, moe.expert_intermediate);
    let mut out: Vec<_> = ts
        .iter()
        .filter(|(n, ..)| !n.contains(".experts."))
        .cloned()
        .collect();
    for l in 0..cfg.num_layers {
        let get = |x: usize, w: &str| {
            let name = format!("model.layers.{l}.mlp.experts.{x}.{w}");
            &ts.iter().find(|(n, ..)| *n == name).unwrap().2
        };
        let (mut gu, mut gub) = (vec![0f32; e * h * 2 * i], vec![0f32; e * 2 * i]);
        let (mut dn, mut dnb) = (vec![0f32; e * i * h], Vec::new());
        for x in 0..e {
            let (g, u, d) = (
                get(x, "gate_proj.weight"),
                get(x, "up_proj.weight"),
                get(x, "down_proj.weight"),
            );
            for j in 0..i {
                for r in 0..h {
                    gu[(x * h + r) * 2 * i + 2 * j] = g[j * h + r];
                    gu[(x * h + r) * 2 * i + 2 * j + 1] = u[j * h + r];
                    dn[(x * i + j) * h + r] = d[r * i + j];
                }
                gub[x * 2 * i + 2 * j] = get(x, "gate_proj.bias")[j];
                gub[x * 2 * i + 2 * j + 1] = get(x, "up_proj.bias")[j];
            }
            dnb.extend_from_slice(get(x, "down_proj.bias"));
        }
        let p = format!("model.layers.{l}.mlp.experts.");
        out.push((format!("{p}gate_up_proj"), vec![e, h, 2 * i], gu));
        out.push((format!("{p}gate_up_proj_bias"), vec![e, 2 * i], gub));
        out.push((format!("{p}down_proj"), vec![e, i, h], dn));
        out.push((format!("{p}down_proj_bias"), vec![e, h], dnb));
    }
    out
}
