//! `config.json` of the families past Llama and Qwen: Phi-3, Gemma 3, Gemma 2, OLMo 2 and
//! StableLM.

use super::*;

/// Phi-3 (`phi3`): partial rotary from `partial_rotary_factor` (Phi-4-mini's 0.75), its
/// window over every layer, no biases, its fused projections cut per rank; longrope and a
/// partial rotary elsewhere are refused by name.
#[test]
fn phi3_configs_parse_and_refuse_what_does_not_run() {
    let base = r#""architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
        "vocab_size": 200064, "hidden_size": 3072, "intermediate_size": 8192,
        "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8,
        "rope_theta": 10000.0, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
        "tie_word_embeddings": true, "torch_dtype": "bfloat16""#;
    let with = |extra: &str| ModelConfig::from_json(&format!("{{{base}{extra}}}"), "config.json");
    let mini = with(r#", "partial_rotary_factor": 0.75, "sliding_window": 262144"#).unwrap();
    assert_eq!(mini.arch, Arch::Phi3);
    assert_eq!((mini.head_dim, mini.rope.rot_dim), (128, 96));
    assert_eq!(
        mini.sliding_window.map(|w| (w.size, w.first_layer)),
        Some((262144, 0))
    );
    assert!(!mini.qkv_bias && !mini.qk_norm && mini.no_rope_layers.is_empty());
    assert_eq!(with("").unwrap().rope.rot_dim, 128);
    // Phi-3.5-mini's LongRoPE (48 factors for 96 rotary dims; `su`, its early name), the
    // original context at the top level, the attention factor from 131072 / 4096.
    let factors = |v: f64| format!("[{}]", vec![v.to_string(); 48].join(", "));
    let longrope = |kind: &str| {
        format!(
            r#", "partial_rotary_factor": 0.75, "original_max_position_embeddings": 4096,
            "rope_scaling": {{"type": "{kind}", "short_factor": {}, "long_factor": {}}}"#,
            factors(1.5),
            factors(4.0)
        )
    };
    for kind in ["longrope", "su"] {
        let c = with(&longrope(kind)).unwrap();
        let Some(encore_core::ops::RopeScaling::LongRope(l)) = c.rope.scaling else {
            panic!("{kind}: {:?}", c.rope.scaling);
        };
        assert_eq!(l.original_max_position_embeddings, 4096);
        assert_eq!((l.short[47], l.long[47], l.short[48]), (1.5, 4.0, 1.0));
        let want = (1.0 + 32f64.ln() / 4096f64.ln()).sqrt() as f32;
        assert!(
            (l.attention_factor - want).abs() < 1e-6,
            "{}",
            l.attention_factor
        );
        assert_eq!(c.rope.long_rope(), Some(4096));
        // The table: the short factors' rows, then the long ones'.
        let table = c.rope.cos_sin_table(8);
        assert_eq!(table.len(), 2 * 8 * 96);
        let f = c.rope.inv_freq_of(true)[47] as f32;
        assert!(
            (table[(8 + 3) * 96 + 47 + 48] - (3.0 * f).sin() * l.attention_factor).abs() < 1e-5
        );
    }
    // Dynamic NTK is the default rotary within the model's positions.
    let dynamic = with(r#", "rope_scaling": {"type": "dynamic", "factor": 2.0}"#).unwrap();
    assert_eq!(dynamic.rope.scaling, None);
    for (extra, want) in [
        (
            r#", "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0],
                "original_max_position_embeddings": 4096}"#,
            "must hold 64 positive numbers",
        ),
        (
            r#", "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}"#,
            "must hold",
        ),
        (r#", "partial_rotary_factor": 0.31"#, "must be even"),
        (r#", "partial_rotary_factor": 1.5"#, "must be even"),
    ] {
        let e = with(extra).unwrap_err().to_string();
        assert!(e.contains(want), "{extra}: {e}");
    }
    // Over ranks, each rank cuts its q, k and v (gate and up) shares out of the fused
    // tensors: three (two) slices of one checkpoint tensor.
    let shard = with("").unwrap().shard(1, 2).unwrap();
    let decl = shard.decl();
    let qkv = decl
        .tensors()
        .iter()
        .find(|t| t.layer == Some(0) && t.parts[0].name.ends_with("qkv_proj.weight"))
        .unwrap();
    assert_eq!(qkv.parts.len(), 3);
    let rows: Vec<_> = qkv
        .parts
        .iter()
        .map(|p| p.slice.map(|s| (s.row, s.rows)))
        .collect();
    // 24 heads of 128 and 8 KV heads over 2 ranks: rank 1's 12 q heads, 4 k, 4 v.
    assert_eq!(
        rows,
        vec![
            Some((1536, 1536)),
            Some((3072 + 512, 512)),
            Some((4096 + 512, 512))
        ]
    );
    // Another family's partial rotary stays refused.
    let llama = super::config::LLAMA_3_2_1B.replacen('{', r#"{"partial_rotary_factor": 0.5,"#, 1);
    let e = ModelConfig::from_json(&llama, "config.json")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("partial_rotary_factor") && e.contains("llama"),
        "{e}"
    );
}

/// Gemma 3's text config (`gemma3_text`), both of transformers' formats: the rotary per
/// layer type in `rope_parameters` (5.x) or `rope_theta` / `rope_local_base_freq` /
/// `rope_scaling` (4.x); `layer_types` or the five-in-six pattern; soft-capping when
/// given; what it does not run (bidirectional attention, an attention bias) refused by
/// name.
#[test]
fn gemma3_text_configs_parse() {
    use encore_core::backend::Activation;
    use encore_core::ops::RopeScaling;
    let base = r#""architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "vocab_size": 262144, "hidden_size": 2560, "intermediate_size": 10240,
        "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
        "sliding_window": 1024, "max_position_embeddings": 131072, "rms_norm_eps": 1e-06,
        "final_logit_softcapping": null, "attn_logit_softcapping": null"#;
    let with = |extra: &str| ModelConfig::from_json(&format!("{{{base}{extra}}}"), "config.json");
    let v5 = with(
        r#", "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0,
            "rope_theta": 1000000.0}, "sliding_attention": {"rope_type": "default",
            "rope_theta": 10000.0}}"#,
    )
    .unwrap();
    assert_eq!(v5.arch, Arch::Gemma3);
    assert_eq!(v5.hidden_act, Activation::GeluTanh);
    assert!(v5.tie_word_embeddings && v5.qk_norm && v5.post_norms && v5.embed_scale);
    assert!(v5.norm_plus_one && !v5.qkv_bias && v5.query_scale == 1.0);
    assert_eq!(
        (v5.rope.theta, v5.rope.scaling),
        (1e6, Some(RopeScaling::Linear { factor: 8.0 }))
    );
    let local = v5.rope_local.unwrap();
    assert_eq!((local.theta, local.scaling), (1e4, None));
    // Five windowed layers, then a full one: layer 5 full.
    let windows: Vec<_> = (0..8).map(|l| v5.layer_window(l)).collect();
    assert_eq!(
        windows,
        vec![
            Some(1024),
            Some(1024),
            Some(1024),
            Some(1024),
            Some(1024),
            None,
            Some(1024),
            Some(1024)
        ]
    );
    assert_eq!(v5.layer_rope(5).theta, 1e6);
    assert_eq!(v5.layer_rope(4).theta, 1e4);
    // transformers 4's keys, a query scalar other than the head dim, an explicit pattern.
    let v4 = with(
        r#", "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "query_pre_attn_scalar": 168,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
            "full_attention", "sliding_attention", "full_attention", "sliding_attention",
            "full_attention"]"#,
    )
    .unwrap();
    assert_eq!(v4.rope.scaling, Some(RopeScaling::Linear { factor: 8.0 }));
    assert_eq!(v4.rope_local.unwrap().theta, 1e4);
    assert_eq!(v4.full_attention_layers, vec![1, 3, 5, 7]);
    assert!((v4.query_scale - (256f32 / 168.0).sqrt()).abs() < 1e-6);
    assert_eq!((v5.attn_softcap, v5.final_softcap), (None, None));
    let capped = with(r#", "rope_theta": 1e6, "final_logit_softcapping": 30.0"#).unwrap();
    assert_eq!(
        (capped.attn_softcap, capped.final_softcap),
        (None, Some(30.0))
    );
    for (extra, want) in [
        (
            r#", "attn_logit_softcapping": -1.0"#,
            "attn_logit_softcapping",
        ),
        (
            r#", "use_bidirectional_attention": true"#,
            "use_bidirectional_attention",
        ),
        (r#", "attention_bias": true"#, "attention_bias"),
        (r#", "hidden_activation": "gelu_fast""#, "hidden_activation"),
    ] {
        let e = with(extra).unwrap_err().to_string();
        assert!(e.contains(want), "{extra}: {e}");
    }
    // Over ranks: each rank its heads; the norms are replicated.
    let shard = v5.shard(1, 2).unwrap();
    assert_eq!((shard.num_heads, shard.num_kv_heads), (4, 2));
}

/// Gemma 2 (`gemma2`): transformers' defaults where a config leaves them out (logit caps
/// 50 and 30, a window of 4096 on every other layer from layer 0, the query scalar 256),
/// `null` turning a cap off, no q/k norms, one rotary, the query scalar applied in the
/// softmax scale.
#[test]
fn gemma2_configs_parse() {
    use encore_core::backend::Activation;
    let base = r#""architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
        "vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216,
        "num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "rope_theta": 10000.0"#;
    let with = |extra: &str| ModelConfig::from_json(&format!("{{{base}{extra}}}"), "config.json");
    let c = with("").unwrap();
    assert_eq!(c.arch, Arch::Gemma2);
    assert_eq!(c.hidden_act, Activation::GeluTanh);
    assert_eq!((c.attn_softcap, c.final_softcap), (Some(50.0), Some(30.0)));
    assert!(c.post_norms && c.embed_scale && c.norm_plus_one && c.tie_word_embeddings);
    assert!(!c.qk_norm && c.rope_local.is_none() && c.query_scale == 1.0);
    assert_eq!(c.max_position_embeddings, 8192);
    let windows: Vec<_> = (0..6).map(|l| c.layer_window(l)).collect();
    assert_eq!(
        windows,
        vec![Some(4096), None, Some(4096), None, Some(4096), None]
    );
    assert!((c.attention_scale() - 1.0 / 16.0).abs() < 1e-7);
    // Gemma-2-27B's scalar (hidden / heads = 144, head_dim 128), caps turned off, an
    // explicit window and layer types.
    let c = with(
        r#", "query_pre_attn_scalar": 144, "attn_logit_softcapping": null,
        "final_logit_softcapping": null, "sliding_window": 64, "layer_types":
        ["full_attention", "sliding_attention", "full_attention", "sliding_attention",
        "full_attention", "sliding_attention"]"#,
    )
    .unwrap();
    assert_eq!((c.attn_softcap, c.final_softcap), (None, None));
    assert_eq!(c.full_attention_layers, vec![0, 2, 4]);
    assert_eq!(c.layer_window(1), Some(64));
    assert!((c.attention_scale() - 1.0 / 12.0).abs() < 1e-7);
    for (extra, want) in [
        (
            r#", "final_logit_softcapping": 0.0"#,
            "final_logit_softcapping",
        ),
        (r#", "attention_bias": true"#, "attention_bias"),
    ] {
        let e = with(extra).unwrap_err().to_string();
        assert!(e.contains(want), "{extra}: {e}");
    }
}

/// OLMo 2 (`olmo2`, OLMo-2-1124-7B's config): no pre-norms, post norms, q and k normed
/// across their heads (weights as wide as the projections), epsilon 1e-5 by default;
/// tensor parallelism refused by name (the norms span every rank's heads).
#[test]
fn olmo2_configs_parse_and_refuse_tensor_parallelism() {
    let json = r#"{"architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2",
        "vocab_size": 100352, "hidden_size": 4096, "intermediate_size": 11008,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
        "rope_theta": 500000, "max_position_embeddings": 4096, "attention_bias": false,
        "tie_word_embeddings": false, "torch_dtype": "float32"}"#;
    let c = ModelConfig::from_json(json, "config.json").unwrap();
    assert_eq!(c.arch, Arch::Olmo2);
    assert!(c.qk_norm && c.qk_norm_whole() && c.post_norms && !c.pre_norms());
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert!(!c.qkv_bias && c.sliding_window.is_none() && !c.norm_plus_one);
    let names: Vec<(String, Vec<usize>)> = c
        .decl()
        .tensors()
        .iter()
        .filter(|t| t.layer == Some(0))
        .flat_map(|t| t.parts.iter().map(|p| (p.name.clone(), p.shape.clone())))
        .collect();
    let has = |n: &str| {
        names
            .iter()
            .find(|(name, _)| name.ends_with(n))
            .map(|(_, s)| s.clone())
    };
    assert_eq!(has("self_attn.q_norm.weight"), Some(vec![4096]));
    assert_eq!(has("self_attn.k_norm.weight"), Some(vec![4096]));
    assert_eq!(has("post_attention_layernorm.weight"), Some(vec![4096]));
    assert_eq!(has("post_feedforward_layernorm.weight"), Some(vec![4096]));
    assert_eq!(has("input_layernorm.weight"), None);
    assert_eq!(has("pre_feedforward_layernorm.weight"), None);
    let err = c.shard(0, 2).unwrap_err().to_string();
    assert!(
        err.contains("olmo2 norms q and k across all heads"),
        "{err}"
    );
    let biased = json.replace(r#""attention_bias": false"#, r#""attention_bias": true"#);
    let err = ModelConfig::from_json(&biased, "config.json")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("attention_bias = true is not supported for olmo2"),
        "{err}"
    );
}

/// Defaults a config may leave out are the family's own (transformers 5.17's classes):
/// Mixtral's and Phi-3's epsilon 1e-5, SmolLM3's tied embeddings.
#[test]
fn absent_fields_take_the_family_defaults() {
    let parse = |arch: &str| {
        let json = format!(
            r#"{{"architectures": ["{arch}"], "vocab_size": 64, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}}"#
        );
        ModelConfig::from_json(&json, "config.json").unwrap()
    };
    let eps = |arch| parse(arch).rms_norm_eps;
    assert_eq!(eps("MixtralForCausalLM"), 1e-5);
    assert_eq!(eps("Phi3ForCausalLM"), 1e-5);
    assert_eq!(eps("LlamaForCausalLM"), 1e-6);
    assert!(parse("SmolLM3ForCausalLM").tie_word_embeddings);
    assert!(!parse("LlamaForCausalLM").tie_word_embeddings);
}

/// StableLM (`stablelm`, StableLM-2-1.6B's config): LayerNorms with a bias (the biases
/// declared beside their weights, with llama.cpp's names), `layer_norm_eps`, a quarter of
/// each head rotating (also by default), q/k/v biases from `use_qkv_bias`, an untied head;
/// per-head q/k LayerNorms and the parallel residual refused by name.
#[test]
fn stablelm_configs_parse_and_refuse_what_does_not_run() {
    use encore_core::model::config::NormKind;
    use encore_core::model::gguf::gguf_name;
    let base = r#""architectures": ["StableLmForCausalLM"], "model_type": "stablelm",
        "vocab_size": 100352, "hidden_size": 2048, "intermediate_size": 5632,
        "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 32,
        "hidden_act": "silu", "max_position_embeddings": 4096, "rope_theta": 10000,
        "torch_dtype": "float16""#;
    let with = |extra: &str| ModelConfig::from_json(&format!("{{{base}{extra}}}"), "config.json");
    let c = with(
        r#", "layer_norm_eps": 1e-06, "partial_rotary_factor": 0.25, "use_qkv_bias": true,
        "qk_layernorm": false, "use_parallel_residual": false, "tie_word_embeddings": false"#,
    )
    .unwrap();
    assert_eq!(c.arch, Arch::StableLm);
    assert_eq!(c.norm_kind, NormKind::LayerBias);
    assert_eq!((c.rms_norm_eps, c.rope.rot_dim, c.head_dim), (1e-6, 16, 64));
    assert!(c.qkv_bias && !c.tie_word_embeddings && !c.qk_norm && !c.post_norms);
    let names: Vec<(String, Vec<usize>)> = c
        .decl()
        .tensors()
        .iter()
        .flat_map(|t| t.parts.iter().map(|p| (p.name.clone(), p.shape.clone())))
        .collect();
    for (hf, gguf) in [
        (
            "model.layers.0.input_layernorm.bias",
            "blk.0.attn_norm.bias",
        ),
        (
            "model.layers.23.post_attention_layernorm.bias",
            "blk.23.ffn_norm.bias",
        ),
        ("model.norm.bias", "output_norm.bias"),
    ] {
        let found = names.iter().find(|(n, _)| n == hf);
        assert_eq!(found.map(|(_, s)| s.clone()), Some(vec![2048]), "{hf}");
        assert_eq!(gguf_name(hf).as_deref(), Some(gguf), "{hf}");
    }
    // The defaults: epsilon 1e-5, a quarter of the head rotating, no q/k/v biases, an
    // untied head; `rms_norm_eps` is not StableLM's key.
    let d = with(r#", "rms_norm_eps": 0.5"#).unwrap();
    assert_eq!((d.rms_norm_eps, d.rope.rot_dim), (1e-5, 16));
    assert!(!d.qkv_bias && !d.tie_word_embeddings);
    assert!(!d
        .decl()
        .hf_tensors()
        .any(|t| t.name.ends_with("q_proj.bias")));
    // A RMSNorm family declares no norm biases.
    let llama = ModelConfig::from_json(super::config::LLAMA_3_2_1B, "config.json").unwrap();
    assert_eq!(llama.norm_kind, NormKind::Rms);
    assert!(!llama
        .decl()
        .hf_tensors()
        .any(|t| t.name.ends_with("norm.bias")));
    for (extra, want) in [
        (r#", "qk_layernorm": true"#, "qk_layernorm = true"),
        (
            r#", "use_parallel_residual": true"#,
            "use_parallel_residual = true",
        ),
        (r#", "partial_rotary_factor": 0.3"#, "must be even"),
    ] {
        let e = with(extra).unwrap_err().to_string();
        assert!(e.contains(want), "{extra}: {e}");
        assert!(
            want.contains("even") || e.contains("not supported for stablelm"),
            "{e}"
        );
    }
    // LayerNorms are the block norms only: beside q/k norms (or post norms) the weights
    // do not load.
    let with_qk = ModelConfig {
        qk_norm: true,
        ..ModelConfig::dummy("tiny-stablelm").unwrap()
    };
    let e = weights::load(
        &CpuBackend::new(),
        &with_qk,
        WeightSource::Dummy { seed: 1 },
        DType::F32,
        &encore_core::progress::NoProgress,
    );
    let Err(e) = e else {
        panic!("LayerNorms beside q/k norms loaded")
    };
    let e = e.to_string();
    assert!(
        e.contains("LayerNorms with q/k norms are not supported"),
        "{e}"
    );
}
