//! gpt-oss's MXFP4 checkpoints (`quantization_config.quant_method: "mxfp4"`, the experts'
//! fused tensors as `*_blocks` / `*_scales`): a tiny gpt-oss stored so loads with its
//! experts kept in MXFP4, holding exactly the values of its twin (the same model with the
//! experts dequantized into transformers' dense fused tensors, f32), and runs as the twin:
//! the same next-token log-probabilities at every position (teacher forced) and the same
//! greedy tokens on the CPU. `--quantization none` decodes the experts at load (the twin's
//! weights exactly), `--quantization mxfp4` quantizes the twin's experts back to MXFP4
//! (exact here: every block's values are on the grid of llama.cpp's scale for them).
//!
//! The twin's values are computed here from first principles, as transformers' dequantizer
//! (`transformers.integrations.mxfp4.convert_moe_packed_tensors`, 5.17) computes them:
//! value `2 i` of a 32-value group is `FP4_VALUES[byte_i & 0xF]`, value `2 i + 1`
//! `FP4_VALUES[byte_i >> 4]`, times `2^(scale - 127)`; the `[E, R, G * 32]` result is
//! transposed to `[E, G * 32, R]`, so `gate_up_proj[e, :, 2 j]` is gate row j.

use super::fp8::{greedy, load};
use super::*;
use common::teacher_forced_on;
use encore_core::model::config::ModelConfig;
use encore_core::model::decl::Role;
use encore_core::model::formats::Quantization;
use encore_core::model::llama::Model;
use encore_core::model::{open_model, ModelFiles};
use encore_core::quant::QuantFormat;
use encore_core::runner::{Runner, RunnerConfig};

const FP4_VALUES: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

const LAYERS: usize = 2;
const V: usize = 96;
const H: usize = 64;
const I: usize = 32;
const E: usize = 3;
const HEADS: usize = 2;
const HD: usize = 16;

fn config(quant: &str) -> String {
    format!(
        r#"{{"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": {V},
  "hidden_size": {H}, "intermediate_size": {I}, "num_hidden_layers": {LAYERS},
  "num_attention_heads": {HEADS}, "num_key_value_heads": 1, "head_dim": {HD},
  "num_local_experts": {E}, "num_experts_per_tok": 2, "sliding_window": 4,
  "layer_types": ["sliding_attention", "full_attention"], "max_position_embeddings": 64,
  "rope_parameters": {{"rope_type": "yarn", "rope_theta": 150000.0, "factor": 2.0,
    "original_max_position_embeddings": 32}}, "swiglu_limit": 7.0,
  "torch_dtype": "float32"{quant}}}"#
    )
}

/// The published checkpoints' `quantization_config` (gpt-oss-20b's).
const QUANT: &str = r#", "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}"#;

/// MXFP4 `blocks` `[E, R, G, 16]` and `scales` `[E, R, G]` dequantized as transformers does:
/// `[E, G * 32, R]`.
fn dequantize_hf(blocks: &[f32], scales: &[f32], r: usize, g: usize) -> Vec<f32> {
    let k = 32 * g;
    let mut out = vec![0f32; E * k * r];
    for e in 0..E {
        for row in 0..r {
            for gi in 0..g {
                let at = (e * r + row) * g + gi;
                let scale = 2f32.powi(scales[at] as i32 - 127);
                for b in 0..16 {
                    let byte = blocks[at * 16 + b] as u8;
                    for (half, code) in [(0, byte & 0xF), (1, byte >> 4)] {
                        let c = 32 * gi + 2 * b + half;
                        out[(e * k + c) * r + row] = FP4_VALUES[code as usize] * scale;
                    }
                }
            }
        }
    }
    out
}

/// The MXFP4 checkpoint and its dequantized twin.
fn checkpoints() -> (Vec<Ck>, Vec<Ck>) {
    let mut seed = 0;
    let mut t = |name: String, shape: &[usize]| {
        seed += 1;
        plain(&name, shape, &values(seed, shape.iter().product()))
    };
    let mut both = vec![
        t("model.embed_tokens.weight".into(), &[V, H]),
        t("lm_head.weight".into(), &[V, H]),
        t("model.norm.weight".into(), &[H]),
    ];
    let (mut mx, mut twin) = (Vec::new(), Vec::new());
    let mut draw = 1000u64;
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}.");
        both.extend([
            t(format!("{p}input_layernorm.weight"), &[H]),
            t(format!("{p}post_attention_layernorm.weight"), &[H]),
            t(format!("{p}self_attn.q_proj.weight"), &[HEADS * HD, H]),
            t(format!("{p}self_attn.k_proj.weight"), &[HD, H]),
            t(format!("{p}self_attn.v_proj.weight"), &[HD, H]),
            t(format!("{p}self_attn.q_proj.bias"), &[HEADS * HD]),
            t(format!("{p}self_attn.k_proj.bias"), &[HD]),
            t(format!("{p}self_attn.v_proj.bias"), &[HD]),
            t(format!("{p}self_attn.o_proj.weight"), &[H, HEADS * HD]),
            t(format!("{p}self_attn.o_proj.bias"), &[H]),
            t(format!("{p}self_attn.sinks"), &[HEADS]),
            t(format!("{p}mlp.router.weight"), &[E, H]),
            t(format!("{p}mlp.router.bias"), &[E]),
            t(format!("{p}mlp.experts.gate_up_proj_bias"), &[E, 2 * I]),
            t(format!("{p}mlp.experts.down_proj_bias"), &[E, H]),
        ]);
        // (stem, rows R, values a row K): gate/up [E, 2 I, H], down [E, H, I].
        for (stem, r, k) in [("gate_up_proj", 2 * I, H), ("down_proj", H, I)] {
            let g = k / 32;
            let bytes: Vec<f32> = values(draw, E * r * g * 16)
                .iter()
                .map(|v| ((v + 1.0) * 128.0).floor().clamp(0.0, 255.0))
                .collect();
            // Scales 2^-6 .. 2^-3 (values up to 0.75), every row its own.
            let scales: Vec<f32> = values(draw + 500, E * r * g)
                .iter()
                .map(|v| 121.0 + ((v + 1.0) * 2.0).floor().clamp(0.0, 3.0))
                .collect();
            draw += 1;
            let name = |s: &str| format!("{p}mlp.experts.{stem}{s}");
            let as_u8 = |n: String, shape: &[usize], v: Vec<f32>| Ck {
                dtype: Dtype::U8,
                ..Ck::f32(&n, shape, &v)
            };
            let dense = dequantize_hf(&bytes, &scales, r, g);
            mx.push(as_u8(name("_blocks"), &[E, r, g, 16], bytes));
            mx.push(as_u8(name("_scales"), &[E, r, g], scales));
            twin.push(Ck::f32(&name(""), &[E, k, r], &dense));
        }
    }
    mx.extend(both.iter().cloned());
    twin.extend(both);
    (mx, twin)
}

/// Next-token log-probabilities after every prefix of a prompt (teacher forced).
fn log_probs(cfg: &ModelConfig, w: ModelWeights) -> Vec<Vec<f64>> {
    let be = CpuBackend::new();
    let model = Model::new(&be, cfg.clone(), w, 64).unwrap();
    let rc = RunnerConfig {
        block_size: 4,
        num_blocks: 40,
        max_tokens_per_step: 64,
        max_seqs: 2,
        max_seq_len: 64,
        penalty_slots: 0,
        kv_dtype: None,
    };
    let mut runner = Runner::new(&be, model, rc).unwrap();
    teacher_forced_on(&mut runner, &[1, 5, 9, 40, 17, 3, 22, 8, 30, 2, 11], 3)
}

#[test]
fn an_mxfp4_gpt_oss_checkpoint_runs_as_its_dequantized_twin() {
    let (mx, twin) = checkpoints();
    let dir = model_dir("gpt-oss-mxfp4", &config(QUANT), &mx);
    let twin_dir = model_dir("gpt-oss-mxfp4-twin", &config(""), &twin);
    let twin_cfg = ModelConfig::from_file(&twin_dir.path().join("config.json")).unwrap();

    let ModelFiles { config: cfg, .. } = open_model(dir.path().to_str().unwrap()).unwrap();
    assert_eq!(cfg.weights.experts, Some(QuantFormat::Mxfp4));
    assert_eq!(cfg.weights.projections, None);
    let kept: Vec<Role> = cfg
        .decl()
        .tensors()
        .iter()
        .filter(|t| t.dtype(DType::F32) == DType::Q(QuantFormat::Mxfp4))
        .map(|t| t.role)
        .collect();
    let stacks = [Role::ExpertsGateUp, Role::ExpertsDown];
    assert_eq!(kept, stacks.repeat(LAYERS), "only the experts are MXFP4");

    let w = load(&cfg, dir.path());
    assert_eq!(w.layers[0].gate_up().dtype(), DType::Q(QuantFormat::Mxfp4));
    assert_eq!(w.layers[1].down().dtype(), DType::Q(QuantFormat::Mxfp4));
    // The kept blocks hold the twin's values exactly.
    let twin_w = load(&twin_cfg, twin_dir.path());
    let decoded = weights::dequantized(&CpuBackend::new(), &w).unwrap();
    assert_eq!(all_values(&decoded), all_values(&twin_w));

    // The same log-probabilities at every position (f32 sums in another order: within
    // rounding) and the same greedy tokens.
    let (got, want) = (log_probs(&cfg, w), log_probs(&twin_cfg, twin_w));
    for (p, (g, t)) in got.iter().zip(&want).enumerate() {
        let worst = g.iter().zip(t).fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            worst < 1e-5,
            "position {p}: log-probabilities differ by {worst}"
        );
    }
    let w = load(&cfg, dir.path());
    let twin_w = load(&twin_cfg, twin_dir.path());
    assert_eq!(greedy(&cfg, w), greedy(&twin_cfg, twin_w));

    // `--quantization none`: the experts decoded at load, the twin's weights exactly.
    let mut files = open_model(dir.path().to_str().unwrap()).unwrap();
    files.quantize(Quantization::None).unwrap();
    assert!(files.config.weights.is_dense());
    let dense = load(&files.config, dir.path());
    let twin_w = load(&twin_cfg, twin_dir.path());
    assert_eq!(all_values(&dense), all_values(&twin_w));

    // `--quantization mxfp4` on the dense twin: its experts (alone) quantized back, exactly.
    let mut files = open_model(twin_dir.path().to_str().unwrap()).unwrap();
    files
        .quantize(Quantization::To(QuantFormat::Mxfp4))
        .unwrap();
    assert_eq!(files.config.weights.experts, Some(QuantFormat::Mxfp4));
    assert_eq!(files.config.weights.projections, None);
    let requantized = load(&files.config, twin_dir.path());
    assert_eq!(requantized.layers[0].qkv().dtype(), DType::F32);
    assert_eq!(
        requantized.layers[0].gate_up().dtype(),
        DType::Q(QuantFormat::Mxfp4)
    );
    let decoded = weights::dequantized(&CpuBackend::new(), &requantized).unwrap();
    assert_eq!(all_values(&decoded), all_values(&twin_w));
}

/// What an MXFP4 checkpoint may not be: a family without fused experts, scales missing or
/// of another shape or dtype, blocks over rows that are not whole blocks; each refused
/// naming the field or tensor.
#[test]
fn mxfp4_checkpoints_encore_cannot_read_are_refused_by_name() {
    let llama = r#"{"architectures": ["LlamaForCausalLM"], "vocab_size": 32, "hidden_size": 64,
      "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
      "num_key_value_heads": 1, "quantization_config": {"quant_method": "mxfp4"}}"#;
    let (_, msg) = err_text(ModelConfig::from_json(llama, "config.json"));
    assert!(
        msg.contains("\"mxfp4\" is supported for gpt-oss only"),
        "{msg}"
    );

    let (mx, _) = checkpoints();
    let scales = "model.layers.1.mlp.experts.down_proj_scales";
    let load_err = |ts: &[Ck]| super::fp8::load_error(&config(QUANT), ts);
    let without: Vec<Ck> = mx.iter().filter(|t| t.name != scales).cloned().collect();
    let msg = load_err(&without);
    assert!(msg.contains(scales) && msg.contains("is missing"), "{msg}");
    let mut bad = mx.clone();
    let s = bad.iter_mut().find(|t| t.name == scales).unwrap();
    s.shape = vec![E, H, 2];
    s.values = vec![127.0; E * H * 2];
    let msg = load_err(&bad);
    assert!(
        msg.contains(scales) && msg.contains("has shape [3, 64, 2]"),
        "{msg}"
    );
    let mut bad = mx.clone();
    bad.iter_mut().find(|t| t.name == scales).unwrap().dtype = Dtype::F32;
    let msg = load_err(&bad);
    assert!(msg.contains(scales) && msg.contains("expected U8"), "{msg}");
}

/// tiny-gpt-oss's dummy weights with the experts quantized to MXFP4 at load (the CUDA twin
/// test's model, `tests/cuda/gpt_oss.rs`) run on the CPU as their decoded weights do.
#[test]
fn dummy_mxfp4_experts_run_as_their_decoded_weights() {
    let mut cfg = ModelConfig::dummy("tiny-gpt-oss").unwrap();
    cfg.hidden_size = 128;
    cfg.moe.as_mut().unwrap().expert_intermediate = 64;
    cfg.weights.experts = Some(QuantFormat::Mxfp4);
    cfg.check_formats().unwrap();
    let load = |cfg: &ModelConfig| {
        weights::load(
            &CpuBackend::new(),
            cfg,
            WeightSource::Dummy { seed: 3 },
            DType::F32,
            &encore_core::progress::NoProgress,
        )
        .unwrap()
    };
    let w = load(&cfg);
    assert_eq!(w.layers[0].gate_up().dtype(), DType::Q(QuantFormat::Mxfp4));
    let decoded = weights::dequantized(&CpuBackend::new(), &w).unwrap();
    let mut dense_cfg = cfg.clone();
    dense_cfg.weights.experts = None;
    let (got, want) = (log_probs(&cfg, w), log_probs(&dense_cfg, decoded));
    for (p, (g, t)) in got.iter().zip(&want).enumerate() {
        let worst = g.iter().zip(t).fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            worst < 1e-5,
            "position {p}: log-probabilities differ by {worst}"
        );
    }
}
