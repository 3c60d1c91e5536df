//! GPTQ with groups in activation order (`desc_act: true` with a group size): each dense
//! layer's projections load with their input columns sorted by group (kept in their bits:
//! Q4_0, Q4_1 with zero points, Q8_0), the layer holds the permutations, and the model
//! runs as its dequantized twin in file order (the same values; only the order of the sums
//! differs). q/k/v (or gate/up) with different orders, a group that is not whole blocks, and
//! act order where encore does not run it (experts) are refused naming the tensor.

use super::fp8::{greedy, load, load_error};
use super::*;
use common::packed::{checkpoints_ordered, exact_scale, Scheme};
use encore_core::model::config::ModelConfig;
use encore_core::model::decl::Role;
use encore_core::model::formats::Quantization;
use encore_core::model::{open_model, ModelFiles};
use encore_core::quant::QuantFormat;

/// A Llama of 2 layers whose inputs (384: hidden and 6 heads of 64; 640: the MLP) are 3
/// and 5 groups of 128, 6 and 10 of 64, 12 and 20 of 32.
fn json(extra: &str) -> String {
    format!(
        r#"{{
  "architectures": ["LlamaForCausalLM"],
  "vocab_size": 96, "hidden_size": 384, "intermediate_size": 640,
  "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256,
  "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"{extra}
}}"#
    )
}

fn gptq(bits: u32, group: usize, v2: bool, sym: bool) -> String {
    let format = if v2 { "gptq_v2" } else { "gptq" };
    format!(
        r#", "quantization_config": {{"quant_method": "gptq", "bits": {bits}, "group_size": {group}, "sym": {sym}, "desc_act": true, "checkpoint_format": "{format}"}}"#
    )
}

/// A seeded shuffle of `0..n`.
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for j in (1..n).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        p.swap(j, (s % (j as u64 + 1)) as usize);
    }
    p
}

/// The projection input `name` reads, as GPTQ orders it: q/k/v share the attention's
/// input (one Hessian), gate/up the MLP's; o and down their own. With the layer number.
fn input_of(name: &str) -> u64 {
    let layer: u64 = name
        .split('.')
        .nth(2)
        .and_then(|l| l.parse().ok())
        .unwrap_or(99);
    let kind = ["q_proj", "o_proj", "gate_proj", "down_proj"]
        .iter()
        .position(|k| name.contains(k))
        .or_else(|| name.contains("k_proj").then_some(0))
        .or_else(|| name.contains("v_proj").then_some(0))
        .or_else(|| name.contains("up_proj").then_some(2))
        .unwrap_or(9) as u64;
    layer * 16 + kind
}

/// GPTQ's g_idx under `desc_act`: the columns quantized in a random order (by input), the
/// i-th of them in group i / group_size.
fn act_order(name: &str, cols: usize, group: usize) -> Vec<usize> {
    let order = shuffled(cols, 7 + input_of(name));
    let mut g = vec![0; cols];
    for (i, &c) in order.iter().enumerate() {
        g[c] = i / group;
    }
    g
}

/// Like [`act_order`], but k_proj's own order (not q's and v's).
fn k_apart(name: &str, cols: usize, group: usize) -> Vec<usize> {
    match name.contains("k_proj") {
        true => act_order(&name.replace("k_proj", "o_proj"), cols, group),
        false => act_order(name, cols, group),
    }
}

/// Layer `l`'s permutation of `role` and the columns of its projection's weight.
fn perm_of(w: &ModelWeights, l: usize, role: Role) -> Vec<usize> {
    let t = w.layers[l]
        .get(role)
        .expect("an act-order layer holds its permutations");
    assert_eq!(t.dtype(), DType::I32);
    let be = CpuBackend::new();
    let be: &dyn encore_core::Backend = &be;
    be.download::<i32>(t)
        .unwrap()
        .into_iter()
        .map(|p| p as usize)
        .collect()
}

/// Values of a loaded (dense or decoded) matrix.
fn matrix(t: &Tensor) -> (usize, usize, Vec<f32>) {
    let be = CpuBackend::new();
    let be: &dyn encore_core::Backend = &be;
    (t.dim(0), t.dim(1), be.download_f32(t).unwrap())
}

/// The log-softmax after each prefix of a prompt (one token a step after the first 3).
fn logprobs(cfg: &ModelConfig, w: ModelWeights) -> Vec<Vec<f64>> {
    use encore_core::model::llama::Model;
    use encore_core::runner::{Runner, RunnerConfig};
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
    let mut r = Runner::new(&be, model, rc).unwrap();
    common::teacher_forced_on(&mut r, &[1, 5, 9, 40, 77, 3, 60, 11], 3)
}

#[test]
fn gptq_act_order_checkpoints_run_in_their_bits_as_their_dequantized_twins() {
    let twin_cfg = ModelConfig::from_json(&json(""), "twin").unwrap();
    for (bits, group, v2, asym, kept) in [
        (4, 128, true, false, QuantFormat::Q4_0),
        (4, 64, false, true, QuantFormat::Q4_1),
        (8, 32, false, false, QuantFormat::Q8_0),
    ] {
        let what = format!("{kept}, groups of {group}");
        let scheme = Scheme::Gptq { v2, asym };
        let (packed, twin) = checkpoints_ordered(
            &twin_cfg,
            bits,
            scheme,
            exact_scale,
            Some(group),
            Some(act_order),
        );
        let q = gptq(bits, group, v2, !asym);
        let dir = model_dir("gptq-desc-act", &json(&q), &packed);
        let twin_dir = model_dir("gptq-desc-act-twin", &json(""), &twin);
        let ModelFiles { config, .. } = open_model(dir.path().to_str().unwrap()).unwrap();
        assert_eq!(config.weights.projections, Some(kept), "{what}");
        assert!(config.weights.int_packing.unwrap().act_order);
        let w = load(&config, dir.path());
        let twin_w = load(&twin_cfg, twin_dir.path());
        assert_eq!(w.layers[0].qkv().dtype(), DType::Q(kept), "{what}");
        // Each kept projection holds the twin's values with its columns in the layer's
        // permutation (and the permutation is one: not the identity).
        let decoded = weights::dequantized(&CpuBackend::new(), &w).unwrap();
        for l in 0..2 {
            for (proj, perm) in [
                (Role::Qkv, Role::QkvPerm),
                (Role::OProj, Role::OProjPerm),
                (Role::GateUp, Role::GateUpPerm),
                (Role::Down, Role::DownPerm),
            ] {
                let p = perm_of(&w, l, perm);
                let (rows, cols, got) = matrix(decoded.layers[l].get(proj).unwrap());
                let (_, _, want) = matrix(twin_w.layers[l].get(proj).unwrap());
                assert_eq!(p.len(), cols);
                assert!(
                    p.iter().enumerate().any(|(j, &c)| j != c),
                    "{what}: {perm:?}"
                );
                let mut sorted = p.clone();
                sorted.sort();
                assert!(sorted.iter().enumerate().all(|(j, &c)| j == c), "{perm:?}");
                for r in 0..rows {
                    for (j, &c) in p.iter().enumerate() {
                        assert_eq!(
                            got[r * cols + j],
                            want[r * cols + c],
                            "{what} {proj:?} {r} {j}"
                        );
                    }
                }
            }
        }
        // The same logits (the sums in another order) and greedy tokens as the twin.
        let (a, b) = (
            logprobs(&config, w),
            logprobs(&twin_cfg, load(&twin_cfg, twin_dir.path())),
        );
        for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
            assert!((x - y).abs() < 1e-4, "{what}: {x} vs {y}");
        }
        let w = load(&config, dir.path());
        let want = greedy(&twin_cfg, load(&twin_cfg, twin_dir.path()));
        assert_eq!(greedy(&config, w), want, "{what} vs its twin");
        // `--quantization none` decodes the sorted codes (the layer keeps its order).
        let mut files = open_model(dir.path().to_str().unwrap()).unwrap();
        files.quantize(Quantization::None).unwrap();
        let dense = load(&files.config, dir.path());
        assert_eq!(dense.layers[1].qkv().dtype(), DType::F32);
        assert_eq!(
            greedy(&files.config, dense),
            want,
            "{what}, decoded at load"
        );
    }
}

#[test]
fn act_order_encore_cannot_run_is_refused_by_name() {
    let twin_cfg = ModelConfig::from_json(&json(""), "twin").unwrap();
    let scheme = Scheme::Gptq {
        v2: false,
        asym: false,
    };
    let q = gptq(4, 128, false, true);
    // k_proj in another order than q_proj and v_proj: one qkv matmul cannot run both.
    let (packed, _) =
        checkpoints_ordered(&twin_cfg, 4, scheme, exact_scale, Some(128), Some(k_apart));
    let msg = load_error(&json(&q), &packed);
    assert!(
        msg.contains("model.layers.0.self_attn.k_proj.weight")
            && msg.contains("another activation order"),
        "{msg}"
    );
    // A group of 48 + 80 columns (not whole blocks of 32).
    let (mut packed, _) = checkpoints_ordered(
        &twin_cfg,
        4,
        scheme,
        exact_scale,
        Some(128),
        Some(act_order),
    );
    let name = "model.layers.1.mlp.down_proj.g_idx";
    let g = packed.iter_mut().find(|t| t.name == name).unwrap();
    let moved: Vec<usize> = (0..g.values.len())
        .filter(|&c| g.values[c] == 0.0)
        .take(16)
        .collect();
    for c in moved {
        g.values[c] = 1.0;
    }
    let msg = load_error(&json(&q), &packed);
    assert!(
        msg.contains(name) && msg.contains("whole blocks of 32"),
        "{msg}"
    );
    // A group index past the scales.
    let g = packed.iter_mut().find(|t| t.name == name).unwrap();
    g.values[5] = 9.0;
    let msg = load_error(&json(&q), &packed);
    assert!(msg.contains(name) && msg.contains("group 9"), "{msg}");
}

/// On the GPU (`packed_int.rs`'s `packed_checkpoints_on_the_gpu_run_as_their_twins`): each
/// act-order checkpoint runs greedy in f32 as its twin there (the gathers in CUDA, eager and
/// in the runner's decode graphs), and as the CPU runs it.
pub(super) fn on_the_gpu(be: &dyn encore_core::Backend) {
    use super::packed_int::greedy_on;
    let twin_cfg = ModelConfig::from_json(&json(""), "twin").unwrap();
    for (bits, group, v2, asym, kept) in [
        (4, 128, true, false, QuantFormat::Q4_0),
        (4, 64, false, true, QuantFormat::Q4_1),
        (8, 32, false, false, QuantFormat::Q8_0),
    ] {
        let what = format!("act order, {kept}, groups of {group}");
        let scheme = Scheme::Gptq { v2, asym };
        let (packed, twin) = checkpoints_ordered(
            &twin_cfg,
            bits,
            scheme,
            exact_scale,
            Some(group),
            Some(act_order),
        );
        let dir = model_dir(
            "gptq-desc-act",
            &json(&gptq(bits, group, v2, !asym)),
            &packed,
        );
        let twin_dir = model_dir("gptq-desc-act-twin", &json(""), &twin);
        let ModelFiles { config, .. } = open_model(dir.path().to_str().unwrap()).unwrap();
        let got = greedy_on(be, DType::F32, &config, dir.path());
        let want = greedy_on(be, DType::F32, &twin_cfg, twin_dir.path());
        assert_eq!(got, want, "{what} on the GPU vs its twin");
        let cpu = greedy_on(&CpuBackend::new(), DType::F32, &config, dir.path());
        assert_eq!(got, cpu, "{what}: the GPU vs the CPU");
    }
}

/// A mixture of experts in act order: its attention's permutations load (a dense layer's
/// projections), but its experts' g_idx out of column order are refused naming one (one
/// stack of many experts cannot take one input order).
#[test]
fn act_order_experts_are_refused_by_name() {
    let json = |extra: &str| {
        format!(
            r#"{{
  "architectures": ["Qwen3MoeForCausalLM"],
  "vocab_size": 96, "hidden_size": 256, "intermediate_size": 384,
  "moe_intermediate_size": 128, "num_experts": 4, "num_experts_per_tok": 2,
  "norm_topk_prob": true, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "head_dim": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
  "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2,
  "torch_dtype": "bfloat16"{extra}
}}"#
        )
    };
    let cfg = ModelConfig::from_json(&json(""), "twin").unwrap();
    let scheme = Scheme::Gptq {
        v2: false,
        asym: false,
    };
    let (packed, _) = checkpoints_ordered(&cfg, 4, scheme, exact_scale, Some(128), Some(act_order));
    let msg = load_error(&json(&gptq(4, 128, false, true)), &packed);
    assert!(
        msg.contains("mlp.experts.") && msg.contains(".g_idx") && msg.contains("not here"),
        "{msg}"
    );
}
