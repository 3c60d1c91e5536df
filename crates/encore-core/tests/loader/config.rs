//! `config.json` parsing: real configs, parameter counts, HF defaults and errors.

use super::*;

pub(crate) const LLAMA_3_2_1B: &str = r#"{
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
                scaling: Some(RopeScaling::Llama3(Llama3Scaling {
                    factor: 32.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: 8192,
                })),
            },
            rms_norm_eps: 1e-5,
            tie_word_embeddings: true,
            qkv_bias: false,
            o_bias: false,
            qk_norm: false,
            hidden_act: Default::default(),
            post_norms: false,
            embed_scale: false,
            rope_local: None,
            norm_plus_one: false,
            norm_kind: encore_core::model::config::NormKind::Rms,
            query_scale: 1.0,
            attn_softcap: None,
            final_softcap: None,
            no_rope_layers: vec![],
            max_position_embeddings: 131_072,
            torch_dtype: DType::BF16,
            bos_token_id: Some(128_000),
            eos_token_ids: vec![128_001],
            sliding_window: None,
            full_attention_layers: vec![],
            weights: Default::default(),
            moe: None,
            tp: None,
            eagle: None,
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
    assert_eq!(qwen2.rope.scaling, None);
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
    assert_eq!(llama3.rope.scaling, None);
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
    assert_eq!(cfg.rope.scaling, None);
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
            r#", "rope_scaling": {"type": "yarn", "factor": -4.0}"#,
            &["rope_scaling.factor", "-4", "positive"],
        ),
        (
            "LlamaForCausalLM",
            r#", "rope_scaling": {"type": "longrope", "factor": 4.0}"#,
            &["rope_scaling.short_factor", "missing"],
        ),
        (
            "LlamaForCausalLM",
            r#", "rope_scaling": {"rope_type": "ntk-by-parts", "factor": 2.0}"#,
            &["ntk-by-parts", "not supported", "longrope", "dynamic"],
        ),
        (
            "Qwen2ForCausalLM",
            r#", "rope_parameters": {"rope_type": "linear"}"#,
            &["rope_parameters.factor", "missing"],
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
            r#", "hidden_act": "gelu_fast""#,
            &["hidden_act", "gelu_fast", "gelu_pytorch_tanh"],
        ),
        (
            "MixtralForCausalLM",
            r#", "hidden_act": "gelu", "num_local_experts": 4, "num_experts_per_tok": 2"#,
            &["hidden_act", "gelu", "experts"],
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

/// An EAGLE-3 head's config (the published `LlamaForCausalLMEagle3` layout): the draft
/// vocabulary becomes `vocab_size`, the target's is kept; pinned layers in vLLM's
/// top-level field are the inputs read, in SGLang's `eagle_config` the outputs (so the
/// next layers' inputs); a head of two layers or a draft vocabulary over the target's is
/// refused naming the field.
#[test]
fn eagle3_heads_parse() {
    let head = |extra: &str| {
        format!(
            r#"{{"architectures": ["LlamaForCausalLMEagle3"], "vocab_size": 128256,
            "draft_vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 1, "num_attention_heads": 32, "num_key_value_heads": 8,
            "max_position_embeddings": 2048, "rope_theta": 500000.0 {extra}}}"#
        )
    };
    let c = parse(&head(""));
    let e = c.eagle.as_ref().expect("an EAGLE head");
    assert_eq!(
        (c.vocab_size, e.target_vocab, e.target_hidden),
        (32000, 128256, 4096)
    );
    assert_eq!(e.aux_layers, None);
    assert_eq!(e.aux_layers_for(32).unwrap(), [2, 16, 29]);
    let c = parse(&head(
        r#", "eagle_aux_hidden_state_layer_ids": [1, 23, 44]"#,
    ));
    assert_eq!(c.eagle.unwrap().aux_layers, Some([1, 23, 44]));
    let c = parse(&head(
        r#", "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 23, 44]}"#,
    ));
    assert_eq!(c.eagle.unwrap().aux_layers, Some([2, 24, 45]));
    let e = parse_err(&head(r#", "eagle_aux_hidden_state_layer_ids": [1, 2]"#));
    assert!(e.contains("eagle_aux_hidden_state_layer_ids"), "{e}");
    let e = parse_err(
        &head(r#", "draft_vocab_size": 200000"#).replace(r#""draft_vocab_size": 32000, "#, ""),
    );
    assert!(e.contains("draft_vocab_size"), "{e}");
    let e = parse_err(&head("").replace(r#""num_hidden_layers": 1"#, r#""num_hidden_layers": 2"#));
    assert!(e.contains("one layer"), "{e}");
}

/// SmolLM3 (Llama's layer, no rotary in every fourth layer): its NoPE layers from the
/// per-layer `no_rope_layers` list, or from the interval; a bad list or a sliding window is
/// refused by name.
#[test]
fn smollm3_configs_give_their_nope_layers() {
    let base = r#""architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3",
        "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 11008,
        "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4,
        "rope_theta": 5000000.0, "max_position_embeddings": 65536, "rms_norm_eps": 1e-06,
        "tie_word_embeddings": true, "use_sliding_window": false, "sliding_window": null,
        "attention_bias": false, "mlp_bias": false, "torch_dtype": "bfloat16""#;
    let with = |extra: &str| ModelConfig::from_json(&format!("{{{base}{extra}}}"), "config.json");
    let listed = with(r#", "no_rope_layers": [1, 0, 1, 1, 0, 1, 1, 1]"#).unwrap();
    assert_eq!(listed.arch, Arch::SmolLM3);
    assert_eq!(listed.no_rope_layers, vec![1, 4]);
    assert!(listed.tie_word_embeddings && !listed.qkv_bias && !listed.qk_norm);
    assert_eq!(with("").unwrap().no_rope_layers, vec![3, 7]);
    assert_eq!(
        with(r#", "no_rope_layer_interval": 3"#)
            .unwrap()
            .no_rope_layers,
        vec![2, 5]
    );
    for (extra, want) in [
        (
            r#", "no_rope_layers": [1, 0]"#,
            "no_rope_layers has 2 entries for 8 layers",
        ),
        (
            r#", "no_rope_layers": [1, 2, 1, 1, 1, 1, 1, 1]"#,
            "no_rope_layers",
        ),
        (
            r#", "no_rope_layer_interval": 0"#,
            "no_rope_layer_interval` must be positive",
        ),
        (
            r#", "use_sliding_window": true, "sliding_window": 4096"#,
            "use_sliding_window = true is not supported for smollm3",
        ),
        (r#", "mlp_bias": true"#, "mlp_bias"),
    ] {
        let e = with(extra).unwrap_err().to_string();
        assert!(e.contains(want), "{extra}: {e}");
    }
}

/// `hidden_act` names the gated MLP's activation: SiLU by default, Gemma's tanh GELU, the
/// erf GELU and ReLU^2 by their HF names.
#[test]
fn hidden_act_names_the_activation() {
    use encore_core::backend::Activation;
    for (name, act) in [
        ("silu", Activation::Silu),
        ("swish", Activation::Silu),
        ("gelu_pytorch_tanh", Activation::GeluTanh),
        ("gelu_new", Activation::GeluTanh),
        ("gelu", Activation::Gelu),
        ("relu2", Activation::Relu2),
    ] {
        let json = tiny_json("LlamaForCausalLM", &format!(r#", "hidden_act": "{name}""#));
        assert_eq!(
            ModelConfig::from_json(&json, "t").unwrap().hidden_act,
            act,
            "{name}"
        );
    }
    let json = tiny_json("LlamaForCausalLM", "");
    assert_eq!(
        ModelConfig::from_json(&json, "t").unwrap().hidden_act,
        Activation::Silu
    );
}

/// `linear` and `yarn` rope scaling parse as transformers reads them (YaRN's defaults:
/// beta 32 / 1, the attention factor from the factor, the original context from the
/// config's top level first); `dynamic` and `longrope` are refused by name.
#[test]
fn linear_and_yarn_rope_scaling_parse() {
    use encore_core::ops::{RopeScaling, YarnScaling};
    let with = |extra: &str| ModelConfig::from_json(&tiny_json("Qwen2ForCausalLM", extra), "t");
    let linear = with(r#", "rope_scaling": {"rope_type": "linear", "factor": 8.0}"#).unwrap();
    assert_eq!(
        linear.rope.scaling,
        Some(RopeScaling::Linear { factor: 8.0 })
    );
    // Qwen2.5's long-context setting, in transformers 5's `rope_parameters`.
    let yarn = with(
        r#", "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
            "original_max_position_embeddings": 32768}"#,
    )
    .unwrap();
    let Some(RopeScaling::Yarn(y)) = yarn.rope.scaling else {
        panic!("{:?}", yarn.rope)
    };
    assert_eq!(
        (
            y.factor,
            y.original_max_position_embeddings,
            y.beta_fast,
            y.beta_slow,
            y.truncate
        ),
        (4.0, 32768, 32.0, 1.0, true)
    );
    assert!((y.attention_factor - (0.1 * 4f32.ln() + 1.0)).abs() < 1e-6);
    // gpt-oss's: explicit betas, no truncation; DeepSeek's mscale ratio.
    let g = with(
        r#", "max_position_embeddings": 131072, "rope_scaling": {"rope_type": "yarn",
            "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": false,
            "original_max_position_embeddings": 4096}"#,
    )
    .unwrap();
    assert!(matches!(
        g.rope.scaling,
        Some(RopeScaling::Yarn(YarnScaling {
            truncate: false,
            ..
        }))
    ));
    let d = with(
        r#", "rope_scaling": {"type": "yarn", "factor": 40.0, "mscale": 1.0,
            "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}"#,
    )
    .unwrap();
    let Some(RopeScaling::Yarn(d)) = d.rope.scaling else {
        panic!()
    };
    assert_eq!(d.attention_factor, 1.0);
    // The factor defaults to max_position_embeddings / the original context.
    let f = with(
        r#", "max_position_embeddings": 1024, "rope_scaling": {"rope_type": "yarn",
            "original_max_position_embeddings": 256}"#,
    )
    .unwrap();
    let Some(RopeScaling::Yarn(f)) = f.rope.scaling else {
        panic!()
    };
    assert_eq!(f.factor, 4.0);
    // Dynamic NTK is the default rotary within the model's positions; LongRoPE needs
    // its factor lists.
    let dynamic = with(r#", "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}"#).unwrap();
    assert_eq!(dynamic.rope.scaling, None);
    let e = with(r#", "rope_scaling": {"rope_type": "longrope", "factor": 2.0}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("short_factor"), "{e}");
    let e = with(r#", "rope_scaling": {"rope_type": "linear", "factor": 0}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("factor") && e.contains("positive"), "{e}");
}

/// transformers 5's `layer_types` lifts the window from the layers it names
/// `full_attention` (an alternation `max_window_layers` cannot give); without a window it
/// changes nothing; a bad list is refused naming it.
#[test]
fn layer_types_choose_the_windowed_layers() {
    let with = |extra: &str| {
        ModelConfig::from_json(
            &tiny_json(
                "Qwen2ForCausalLM",
                &format!(
                    r#", "num_hidden_layers": 4, "use_sliding_window": true, "sliding_window": 8{extra}"#
                ),
            ),
            "t",
        )
    };
    let alt = with(
        r#", "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]"#,
    )
    .unwrap();
    assert_eq!(alt.full_attention_layers, vec![1, 3]);
    let windows: Vec<_> = (0..4).map(|l| alt.layer_window(l)).collect();
    assert_eq!(windows, vec![Some(8), None, Some(8), None]);
    // The list wins over `max_window_layers` (as in transformers).
    let over = with(
        r#", "max_window_layers": 28, "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]"#,
    )
    .unwrap();
    let windows: Vec<_> = (0..4).map(|l| over.layer_window(l)).collect();
    assert_eq!(windows, vec![Some(8), None, Some(8), Some(8)]);
    // Every layer full: no window at all.
    let full = with(r#", "layer_types": ["full_attention", "full_attention", "full_attention", "full_attention"]"#).unwrap();
    assert!(full.sliding_window.is_none() && (0..4).all(|l| full.layer_window(l).is_none()));
    // No window (Llama): the list changes nothing.
    let llama = ModelConfig::from_json(
        &tiny_json(
            "LlamaForCausalLM",
            r#", "layer_types": ["full_attention", "sliding_attention"]"#,
        ),
        "t",
    )
    .unwrap();
    assert!(llama.full_attention_layers.is_empty() && llama.layer_window(1).is_none());
    for (extra, want) in [
        (
            r#", "layer_types": ["sliding_attention"]"#,
            "layer_types has 1 entries for 4 layers",
        ),
        (
            r#", "layer_types": ["sliding_attention", "chunked_attention", "full_attention", "full_attention"]"#,
            "layer_types",
        ),
    ] {
        let e = with(extra).unwrap_err().to_string();
        assert!(e.contains(want), "{extra}: {e}");
    }
}
