//! Mixture-of-experts configs (Qwen3-MoE, Qwen2-MoE, Mixtral): parsed as transformers
//! reads them, declared tensor by tensor (exact parameter counts of the real checkpoints,
//! the per-expert HF names), and refused where they do not run.

use super::*;
use encore_core::model::config::MoeConfig;
use encore_core::model::decl::Role;

const QWEN3_30B_A3B: &str = r#"{
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
  "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
  "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
  "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
  "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936
}"#;

const QWEN1_5_MOE_A2_7B: &str = r#"{
  "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151643,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21,
  "model_type": "qwen2_moe", "moe_intermediate_size": 1408, "norm_topk_prob": false,
  "num_attention_heads": 16, "num_experts": 60, "num_experts_per_tok": 4,
  "num_hidden_layers": 24, "num_key_value_heads": 16, "output_router_logits": false,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
  "shared_expert_intermediate_size": 5632, "sliding_window": 32768,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.0.dev0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936
}"#;

const MIXTRAL_8X7B: &str = r#"{
  "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
  "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000
}"#;

fn parse(json: &str) -> ModelConfig {
    ModelConfig::from_json(json, "config.json").unwrap()
}

/// `json` with `key` set to the JSON text `value` (added, or replacing the old value).
fn with(json: &str, key: &str, value: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_str(json).unwrap();
    v[key] = serde_json::from_str(value).unwrap();
    v.to_string()
}

#[test]
fn real_moe_configs_parse_as_transformers_reads_them() {
    let q3 = parse(QWEN3_30B_A3B);
    assert_eq!(q3.arch, Arch::Qwen3Moe);
    assert!(q3.qk_norm && !q3.qkv_bias && q3.sliding_window.is_none());
    assert_eq!(
        q3.moe,
        Some(MoeConfig {
            num_experts: 128,
            top_k: 8,
            expert_intermediate: 768,
            norm_topk_prob: true,
            sparse: vec![true; 48],
            shared_expert_intermediate: None,
        })
    );
    let q2 = parse(QWEN1_5_MOE_A2_7B);
    assert_eq!(q2.arch, Arch::Qwen2Moe);
    assert!(q2.qkv_bias && !q2.qk_norm);
    let m = q2.moe.as_ref().unwrap();
    assert_eq!(
        (m.num_experts, m.top_k, m.expert_intermediate),
        (60, 4, 1408)
    );
    assert_eq!(m.shared_expert_intermediate, Some(5632));
    assert!(!m.norm_topk_prob);
    let mx = parse(MIXTRAL_8X7B);
    assert_eq!(mx.arch, Arch::Mixtral);
    assert!(!mx.qkv_bias && mx.sliding_window.is_none());
    let m = mx.moe.as_ref().unwrap();
    assert_eq!(
        (m.num_experts, m.top_k, m.expert_intermediate),
        (8, 2, 14336)
    );
    assert!(m.norm_topk_prob, "Mixtral always renormalises");
    // transformers' defaults where a field is absent.
    let bare = r#"{"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 64,
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}"#;
    let m = parse(bare).moe.unwrap();
    assert_eq!(
        (m.num_experts, m.top_k, m.expert_intermediate),
        (128, 8, 768)
    );
    assert!(!m.norm_topk_prob);
    // transformers 5.17 saves Qwen3-MoE's expert count as `num_local_experts`; either name
    // is read for either architecture.
    let q3 = QWEN3_30B_A3B.replace("\"num_experts\": 128,", "");
    assert_eq!(
        parse(&with(&q3, "num_local_experts", "16"))
            .moe
            .unwrap()
            .num_experts,
        16
    );
    let mx = MIXTRAL_8X7B.replace("\"num_local_experts\": 8,", "");
    assert_eq!(
        parse(&with(&mx, "num_experts", "4"))
            .moe
            .unwrap()
            .num_experts,
        4
    );
}

#[test]
fn moe_parameter_counts_match_the_published_ones() {
    // Exact counts of the HF checkpoints (sum of numel over the safetensors).
    for (json, n) in [
        (QWEN3_30B_A3B, 30_532_122_624usize),
        (QWEN1_5_MOE_A2_7B, 14_315_784_192),
        (MIXTRAL_8X7B, 46_702_792_704),
    ] {
        let cfg = parse(json);
        assert_eq!(cfg.num_params(), n, "{:?}", cfg.arch);
        assert_eq!(cfg.weight_bytes(DType::BF16), 2 * n);
    }
}

#[test]
fn sparse_layers_follow_hf_and_experts_are_declared_by_name() {
    let json = with(
        &with(QWEN3_30B_A3B, "decoder_sparse_step", "2"),
        "mlp_only_layers",
        "[3]",
    );
    let cfg = parse(&with(&json, "num_hidden_layers", "6"));
    // Sparse when (layer + 1) % 2 == 0 and not in mlp_only_layers.
    let sparse = &cfg.moe.as_ref().unwrap().sparse;
    assert_eq!(sparse, &[false, true, false, false, false, true]);
    let decl = cfg.decl();
    let of = |layer: usize, role: Role| {
        decl.tensors()
            .iter()
            .find(|t| t.layer == Some(layer) && t.role == role)
    };
    // A dense layer keeps the dense MLP of `intermediate_size`.
    assert_eq!(of(0, Role::GateUp).unwrap().shape, vec![2 * 6144, 2048]);
    assert!(of(0, Role::ExpertsGateUp).is_none() && of(1, Role::GateUp).is_none());
    let router = of(1, Role::Router).unwrap();
    assert_eq!(router.shape, vec![128, 2048]);
    assert_eq!(router.parts[0].name, "model.layers.1.mlp.gate.weight");
    // Every expert's gate rows, then every expert's up rows.
    let gu = of(1, Role::ExpertsGateUp).unwrap();
    assert_eq!(gu.shape, vec![2 * 128 * 768, 2048]);
    assert_eq!(gu.parts.len(), 256);
    assert_eq!(
        gu.parts[0].name,
        "model.layers.1.mlp.experts.0.gate_proj.weight"
    );
    assert_eq!(
        gu.parts[127].name,
        "model.layers.1.mlp.experts.127.gate_proj.weight"
    );
    assert_eq!(
        gu.parts[128].name,
        "model.layers.1.mlp.experts.0.up_proj.weight"
    );
    let down = of(5, Role::ExpertsDown).unwrap();
    assert_eq!(down.shape, vec![128 * 2048, 768]);
    assert_eq!(
        down.parts[3].name,
        "model.layers.5.mlp.experts.3.down_proj.weight"
    );
    // Quantized in situ like every projection; the router stays dense.
    let mut q = cfg.clone();
    q.weights.projections = Some(encore_backend::quant::QuantFormat::Q4K);
    let qd = q.decl();
    let fmt = |role| {
        let t = qd.tensors().iter().find(|t| t.role == role).unwrap();
        t.format.to_string()
    };
    assert_eq!(fmt(Role::ExpertsGateUp), "q4_k");
    assert_eq!(fmt(Role::Router), "dense");
    // Mixtral's names: block_sparse_moe, w1 gate, w3 up, w2 down.
    let mx = parse(MIXTRAL_8X7B).decl();
    let t = |role| mx.tensors().iter().find(|t| t.role == role).unwrap();
    assert_eq!(
        t(Role::Router).parts[0].name,
        "model.layers.0.block_sparse_moe.gate.weight"
    );
    let gu = t(Role::ExpertsGateUp);
    assert_eq!(
        gu.parts[0].name,
        "model.layers.0.block_sparse_moe.experts.0.w1.weight"
    );
    assert_eq!(
        gu.parts[8].name,
        "model.layers.0.block_sparse_moe.experts.0.w3.weight"
    );
    let down = &t(Role::ExpertsDown).parts[7].name;
    assert_eq!(down, "model.layers.0.block_sparse_moe.experts.7.w2.weight");
    // Qwen2-MoE's shared expert and its gate.
    let q2 = parse(QWEN1_5_MOE_A2_7B).decl();
    let t = |role| q2.tensors().iter().find(|t| t.role == role).unwrap();
    assert_eq!(t(Role::SharedGateUp).shape, vec![2 * 5632, 2048]);
    assert_eq!(
        t(Role::SharedGateUp).parts[1].name,
        "model.layers.0.mlp.shared_expert.up_proj.weight"
    );
    assert_eq!(t(Role::SharedGate).shape, vec![1, 2048]);
    assert_eq!(t(Role::SharedDown).shape, vec![2048, 5632]);
}

#[test]
fn moe_config_errors_name_the_field() {
    let err = |json: &str| {
        let (e, msg) = err_text(ModelConfig::from_json(json, "some/config.json"));
        assert!(matches!(e, Error::Config { .. }), "{msg}");
        msg
    };
    let cases = [
        (
            with(QWEN3_30B_A3B, "num_experts_per_tok", "129"),
            "num_experts_per_tok",
        ),
        (with(QWEN3_30B_A3B, "num_experts", "0"), "num_experts"),
        (
            with(QWEN3_30B_A3B, "use_sliding_window", "true"),
            "use_sliding_window",
        ),
        (
            with(QWEN3_30B_A3B, "mlp_only_layers", "\"all\""),
            "mlp_only_layers",
        ),
        (
            with(QWEN3_30B_A3B, "moe_intermediate_size", "4194304"),
            "moe_intermediate_size",
        ),
        (
            with(MIXTRAL_8X7B, "decoder_sparse_step", "2"),
            "decoder_sparse_step",
        ),
    ];
    for (json, field) in cases {
        let msg = err(&json);
        assert!(msg.contains(field), "{field}: {msg}");
    }
}

#[test]
fn moe_models_are_refused_where_they_do_not_run_yet() {
    let cfg = parse(QWEN3_30B_A3B);
    cfg.check_runs(true).unwrap();
    let (_, msg) = err_text(cfg.check_runs(false));
    assert!(
        msg.contains("qwen3_moe") && msg.contains("128 experts"),
        "{msg}"
    );
    assert!(msg.contains("does not run mixture-of-experts"), "{msg}");
    // Over tensor-parallel ranks each rank holds its share of every expert.
    let rank = cfg.shard(1, 4).unwrap();
    assert_eq!(rank.moe.as_ref().unwrap().expert_intermediate, 192);
    assert_eq!(rank.whole_expert_widths(), Some((768, None)));
    // Qwen2-MoE, its shared expert too, runs where experts run.
    parse(QWEN1_5_MOE_A2_7B).check_runs(true).unwrap();
}
