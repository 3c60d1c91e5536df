//! gpt-oss (`gpt_oss`): its config as gpt-oss-20b's `config.json` gives it (its MXFP4
//! `quantization_config` in `mxfp4.rs`), its declaration (sinks, o_proj and
//! router biases, the experts' biases, per-expert names with llama.cpp's), what it refuses,
//! and its fused 3-D expert tensors loaded per expert (transposed, gate and up
//! de-interleaved).

use super::*;
use encore_core::model::decl::Role;
use encore_core::model::gguf::gguf_name;

/// gpt-oss-20b's `config.json` (transformers 4.55), `quantization_config` left out.
fn gpt_oss_20b() -> serde_json::Value {
    let layer_types: Vec<&str> = (0..24)
        .map(|l| match l % 2 {
            0 => "sliding_attention",
            _ => "full_attention",
        })
        .collect();
    serde_json::json!({
        "architectures": ["GptOssForCausalLM"], "attention_bias": true,
        "attention_dropout": 0.0, "eos_token_id": 200002, "experts_per_token": 4,
        "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
        "initial_context_length": 4096, "initializer_range": 0.02,
        "intermediate_size": 2880, "layer_types": layer_types,
        "max_position_embeddings": 131072, "model_type": "gpt_oss",
        "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24,
        "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": false,
        "pad_token_id": 199999, "rms_norm_eps": 1e-05,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
            "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false},
        "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
        "swiglu_limit": 7.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
        "transformers_version": "4.55.0.dev0", "use_cache": true, "vocab_size": 201088
    })
}

fn parse_value(v: &serde_json::Value) -> encore_core::Result<ModelConfig> {
    ModelConfig::from_json(&v.to_string(), "config.json")
}

#[test]
fn gpt_oss_configs_parse_and_declare_its_tensors() {
    use encore_core::backend::Activation;
    let c = parse_value(&gpt_oss_20b()).unwrap();
    assert_eq!(c.arch, Arch::GptOss);
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (64, 8, 64));
    assert!(c.qkv_bias && c.o_bias && !c.tie_word_embeddings && !c.qk_norm);
    assert_eq!(c.rms_norm_eps, 1e-5);
    // Windows of 128 on the even layers, full attention on the odd ones.
    assert_eq!(c.layer_window(0), Some(128));
    assert_eq!(c.layer_window(1), None);
    assert_eq!(c.layer_window(22), Some(128));
    assert_eq!(c.layer_window(23), None);
    assert_eq!(c.rope.theta, 150_000.0);
    match c.rope.scaling {
        Some(RopeScaling::Yarn(y)) => {
            assert_eq!((y.factor, y.original_max_position_embeddings), (32.0, 4096));
            assert!(!y.truncate);
        }
        other => panic!("expected YaRN, got {other:?}"),
    }
    let moe = c.moe.as_ref().unwrap();
    assert_eq!(
        (moe.num_experts, moe.top_k, moe.expert_intermediate),
        (32, 4, 2880)
    );
    // The softmax of the top-k logits is the renormalised softmax of them all.
    assert!(moe.norm_topk_prob && moe.sparse.iter().all(|&s| s));
    let rules = c.arch.family().experts.unwrap();
    assert_eq!(rules.act, Activation::SwigluOai);
    assert!(rules.biases && rules.fused_interleaved);

    // Without `layer_types`, transformers' default: layer 0 slides, layer 1 does not.
    let mut v = gpt_oss_20b();
    v.as_object_mut().unwrap().remove("layer_types");
    let d = parse_value(&v).unwrap();
    assert_eq!((d.layer_window(0), d.layer_window(1)), (Some(128), None));

    let decl = c.decl();
    let layer0: Vec<(Role, Vec<usize>)> = decl
        .tensors()
        .iter()
        .filter(|t| t.layer == Some(0))
        .map(|t| (t.role, t.shape.clone()))
        .collect();
    let shape = |r: Role| layer0.iter().find(|(x, _)| *x == r).map(|(_, s)| s.clone());
    assert_eq!(shape(Role::Sinks), Some(vec![64]));
    assert_eq!(shape(Role::OProjBias), Some(vec![2880]));
    assert_eq!(shape(Role::QkvBias), Some(vec![64 * 64 + 2 * 8 * 64]));
    assert_eq!(shape(Role::Router), Some(vec![32, 2880]));
    assert_eq!(shape(Role::RouterBias), Some(vec![32]));
    assert_eq!(shape(Role::ExpertsGateUp), Some(vec![2 * 32 * 2880, 2880]));
    assert_eq!(shape(Role::ExpertsGateUpBias), Some(vec![2 * 32 * 2880]));
    assert_eq!(shape(Role::ExpertsDown), Some(vec![32 * 2880, 2880]));
    assert_eq!(shape(Role::ExpertsDownBias), Some(vec![32 * 2880]));
    // The HF names the declaration reads (fused tensors stand for the per-expert ones)
    // and llama.cpp's.
    let names: Vec<&str> = decl.hf_tensors().map(|t| t.name.as_str()).collect();
    for (hf, gguf) in [
        ("model.layers.0.self_attn.sinks", "blk.0.attn_sinks.weight"),
        (
            "model.layers.0.self_attn.o_proj.bias",
            "blk.0.attn_output.bias",
        ),
        (
            "model.layers.0.mlp.router.weight",
            "blk.0.ffn_gate_inp.weight",
        ),
        ("model.layers.0.mlp.router.bias", "blk.0.ffn_gate_inp.bias"),
        (
            "model.layers.3.mlp.experts.31.gate_proj.weight",
            "blk.3.ffn_gate_exps.weight",
        ),
        (
            "model.layers.3.mlp.experts.0.up_proj.bias",
            "blk.3.ffn_up_exps.bias",
        ),
        (
            "model.layers.3.mlp.experts.5.down_proj.bias",
            "blk.3.ffn_down_exps.bias",
        ),
    ] {
        assert!(names.contains(&hf), "{hf} is not declared");
        assert_eq!(gguf_name(hf).as_deref(), Some(gguf), "{hf}");
    }
}

#[test]
fn gpt_oss_refuses_what_does_not_run() {
    let refused = |edit: &dyn Fn(&mut serde_json::Map<String, serde_json::Value>)| {
        let mut v = gpt_oss_20b();
        edit(v.as_object_mut().unwrap());
        parse_value(&v).unwrap_err().to_string()
    };
    // MXFP4 experts load (tests/loader/mxfp4.rs); other methods stay refused.
    let mut v = gpt_oss_20b();
    v.as_object_mut().unwrap().insert(
        "quantization_config".into(),
        serde_json::json!({"quant_method": "mxfp4", "modules_to_not_convert": []}),
    );
    let c = parse_value(&v).unwrap();
    assert_eq!(
        c.weights.experts,
        Some(encore_core::quant::QuantFormat::Mxfp4)
    );
    let e = refused(&|m| {
        m.insert(
            "quantization_config".into(),
            serde_json::json!({"quant_method": "bitsandbytes"}),
        );
    });
    assert!(
        e.contains("quant_method = \"bitsandbytes\" is not supported"),
        "{e}"
    );
    let e = refused(&|m| {
        m.insert("swiglu_limit".into(), serde_json::json!(8.0));
    });
    assert!(e.contains("swiglu_limit = 8 is not supported"), "{e}");
    let e = refused(&|m| {
        m.remove("rope_scaling");
    });
    assert!(e.contains("gpt_oss without `rope_parameters`"), "{e}");
    // Tensor parallelism splits it (tests/tensor_parallel/gpt_oss.rs); the LRU offload
    // policy refuses its sinks (tests/offload_exec/gpt_oss.rs).
    let c = parse_value(&gpt_oss_20b()).unwrap();
    assert_eq!(c.shard(1, 8).unwrap().num_heads, 8);
    assert_eq!(c.unstreamed(), Some("attention sinks"));
}

/// `dummy:gpt-oss-120b` is openai/gpt-oss-120b's `config.json` (gpt-oss-20b's with 36
/// layers and 128 experts), and with its experts in MXFP4 (`--quantization mxfp4`) its
/// weights are ~65 GB: one H200 holds them. The dummy load quantizes one HF tensor at a
/// time (an expert's matrix, never a layer's stack in bf16), so the largest part it draws
/// is the embedding.
#[test]
fn gpt_oss_120b_dummy_has_its_shapes_and_fits_one_h200_in_mxfp4() {
    use encore_core::model::formats::Quantization;
    use encore_core::model::open_model;
    use encore_core::quant::QuantFormat;
    let mut v = gpt_oss_20b();
    let m = v.as_object_mut().unwrap();
    let types: Vec<&str> = (0..36)
        .map(|l| ["sliding_attention", "full_attention"][l % 2])
        .collect();
    m.insert("num_hidden_layers".into(), 36.into());
    m.insert("num_local_experts".into(), 128.into());
    m.insert("layer_types".into(), serde_json::json!(types));
    let hf = parse_value(&v).unwrap();
    let mut files = open_model("dummy:gpt-oss-120b").unwrap();
    let d = &files.config;
    let shapes = |c: &ModelConfig| {
        (
            (
                c.arch,
                c.vocab_size,
                c.hidden_size,
                c.intermediate_size,
                c.num_layers,
            ),
            (
                c.num_heads,
                c.num_kv_heads,
                c.head_dim,
                c.qkv_bias,
                c.o_bias,
            ),
            (c.rope, c.tie_word_embeddings, c.rms_norm_eps, c.moe.clone()),
            (0..36).map(|l| c.layer_window(l)).collect::<Vec<_>>(),
        )
    };
    assert_eq!(shapes(d), shapes(&hf));
    assert_eq!(
        (d.num_layers, d.moe.as_ref().unwrap().num_experts),
        (36, 128)
    );
    assert_eq!((d.layer_window(34), d.layer_window(35)), (Some(128), None));
    files
        .quantize(Quantization::To(QuantFormat::Mxfp4))
        .unwrap();
    let c = &files.config;
    assert_eq!(c.weights.experts, Some(QuantFormat::Mxfp4));
    assert_eq!(c.weights.projections, None);
    let bytes = c.weight_bytes(DType::BF16) as f64;
    assert!((64e9..66e9).contains(&bytes), "{bytes}");
    // Experts: 36 layers x 128 x 3 matrices of 2,880 rows of 2,880 values in MXFP4 (17
    // bytes per 32 values, a device row padded to 16 bytes): 61.1 GB.
    let row = QuantFormat::Mxfp4.row_bytes(2880).unwrap();
    assert_eq!(row, (2880 / 32 * 17usize).next_multiple_of(16));
    let experts = c.decl().expert_bytes(DType::BF16);
    assert_eq!(experts, 36 * 128 * 3 * 2880 * row);
    assert!(bytes < 139.0 * (1u64 << 30) as f64 * 0.6, "{bytes}");
    let largest = c.decl().hf_tensors().map(|t| t.numel()).max().unwrap();
    assert_eq!(largest, 201_088 * 2880);
}

/// The fused expert tensors of a small gpt-oss checkpoint load as the per-expert stacks:
/// expert `x`'s gate rows are `gate_up_proj[x, :, 0::2]` transposed, its up rows
/// `[x, :, 1::2]` transposed, its down rows `down_proj[x]` transposed; the biases likewise.
/// A fused tensor of the wrong shape is refused by name.
#[test]
fn gpt_oss_fused_experts_load_per_expert() {
    let (v, h, i, e, heads, hd) = (40usize, 16usize, 6usize, 3usize, 2usize, 8usize);
    let config = serde_json::json!({
        "architectures": ["GptOssForCausalLM"], "vocab_size": v, "hidden_size": h,
        "intermediate_size": i, "num_hidden_layers": 1, "num_attention_heads": heads,
        "num_key_value_heads": 1, "head_dim": hd, "num_local_experts": e,
        "num_experts_per_tok": 2, "sliding_window": 4, "max_position_embeddings": 64,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 2.0,
            "original_max_position_embeddings": 32},
        "torch_dtype": "float32"
    })
    .to_string();
    let p = "model.layers.0.";
    let mut seed = 0;
    let mut t = |name: &str, shape: &[usize]| {
        seed += 1;
        Ck::f32(name, shape, &values(seed, shape.iter().product()))
    };
    let gate_up = t(&format!("{p}mlp.experts.gate_up_proj"), &[e, h, 2 * i]);
    let gate_up_bias = t(&format!("{p}mlp.experts.gate_up_proj_bias"), &[e, 2 * i]);
    let down = t(&format!("{p}mlp.experts.down_proj"), &[e, i, h]);
    let down_bias = t(&format!("{p}mlp.experts.down_proj_bias"), &[e, h]);
    let mut tensors = vec![
        t("model.embed_tokens.weight", &[v, h]),
        t("lm_head.weight", &[v, h]),
        t("model.norm.weight", &[h]),
        t(&format!("{p}input_layernorm.weight"), &[h]),
        t(&format!("{p}post_attention_layernorm.weight"), &[h]),
        t(&format!("{p}self_attn.q_proj.weight"), &[heads * hd, h]),
        t(&format!("{p}self_attn.k_proj.weight"), &[hd, h]),
        t(&format!("{p}self_attn.v_proj.weight"), &[hd, h]),
        t(&format!("{p}self_attn.q_proj.bias"), &[heads * hd]),
        t(&format!("{p}self_attn.k_proj.bias"), &[hd]),
        t(&format!("{p}self_attn.v_proj.bias"), &[hd]),
        t(&format!("{p}self_attn.o_proj.weight"), &[h, heads * hd]),
        t(&format!("{p}self_attn.o_proj.bias"), &[h]),
        t(&format!("{p}self_attn.sinks"), &[heads]),
        t(&format!("{p}mlp.router.weight"), &[e, h]),
        t(&format!("{p}mlp.router.bias"), &[e]),
    ];
    tensors.extend([
        gate_up.clone(),
        gate_up_bias.clone(),
        down.clone(),
        down_bias.clone(),
    ]);
    let dir = model_dir("gpt-oss-fused", &config, &tensors);
    let cfg = ModelConfig::from_file(&dir.path().join("config.json")).unwrap();
    let w = weights::load(
        &CpuBackend::new(),
        &cfg,
        WeightSource::Dir(dir.path().to_path_buf()),
        DType::F32,
        &encore_core::progress::NoProgress,
    )
    .unwrap();
    let l = &w.layers[0];
    let (gu, dn) = (download(l.gate_up()), download(l.down()));
    let gub = download(l.get(Role::ExpertsGateUpBias).unwrap());
    let dnb = download(l.get(Role::ExpertsDownBias).unwrap());
    for x in 0..e {
        for j in 0..i {
            for r in 0..h {
                let fused = |k: usize| gate_up.values[(x * h + r) * 2 * i + 2 * j + k];
                assert_eq!(gu[((x * i) + j) * h + r], fused(0), "gate {x} {j} {r}");
                assert_eq!(
                    gu[((e * i) + x * i + j) * h + r],
                    fused(1),
                    "up {x} {j} {r}"
                );
                assert_eq!(dn[(x * h + r) * i + j], down.values[(x * i + j) * h + r]);
            }
            assert_eq!(gub[x * i + j], gate_up_bias.values[x * 2 * i + 2 * j]);
            assert_eq!(
                gub[(e + x) * i + j],
                gate_up_bias.values[x * 2 * i + 2 * j + 1]
            );
        }
        assert_eq!(
            dnb[x * h..(x + 1) * h],
            down_bias.values[x * h..(x + 1) * h]
        );
    }
    let sinks = download(l.get(Role::Sinks).unwrap());
    assert_eq!(sinks, tensors[13].values);

    // A fused tensor of another shape is refused naming it.
    let mut bad = tensors.clone();
    let last = bad.len() - 2;
    bad[last] = t(&format!("{p}mlp.experts.down_proj"), &[e, h, i]);
    let dir = model_dir("gpt-oss-bad", &config, &bad);
    let (_, msg) = err_text(weights::load(
        &CpuBackend::new(),
        &cfg,
        WeightSource::Dir(dir.path().to_path_buf()),
        DType::F32,
        &encore_core::progress::NoProgress,
    ));
    assert!(
        msg.contains("model.layers.0.mlp.experts.down_proj") && msg.contains("expected [3, 6, 16]"),
        "{msg}"
    );
}
