//! GGUF twins of HF checkpoints load the same weights and tokens; `open_model` resolves
//! every kind of spec; the dequantizers match gguf-py and the quantizers round-trip.

use super::*;

/// A tiny gpt-oss's config beyond `tiny_json`'s.
const GPT_OSS: &str = r#", "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
    "sliding_window": 4, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
    "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
    "truncate": false}"#;

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
        // Linear rope scaling: llama.cpp's `rope.scaling.type` / `rope.scaling.factor`.
        (
            "LlamaForCausalLM",
            r#", "rope_scaling": {"rope_type": "linear", "factor": 4.0}"#,
            Store::F32,
        ),
        (
            "Qwen2ForCausalLM",
            r#", "tie_word_embeddings": true"#,
            Store::F32,
        ),
        // YaRN (Qwen2.5's long-context configs): `rope.scaling.type yarn` and its keys.
        (
            "Qwen2ForCausalLM",
            r#", "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
               "original_max_position_embeddings": 64}"#,
            Store::Q8_0,
        ),
        ("Qwen2ForCausalLM", "", Store::Q8_0),
        ("Qwen3ForCausalLM", r#", "head_dim": 32"#, Store::F32),
        (
            "Qwen3ForCausalLM",
            r#", "head_dim": 32, "tie_word_embeddings": true"#,
            Store::Q8_0,
        ),
        // Mixtures of experts: stacked `*_exps` tensors; layer 1 dense (no router).
        (
            "Qwen3MoeForCausalLM",
            r#", "head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2,
               "moe_intermediate_size": 32, "norm_topk_prob": true, "mlp_only_layers": [1]"#,
            Store::Q8_0,
        ),
        // Not renormalised: the file says so (`expert_weights_norm`).
        (
            "Qwen3MoeForCausalLM",
            r#", "head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2,
               "moe_intermediate_size": 32, "norm_topk_prob": false"#,
            Store::F16,
        ),
        (
            "Qwen2MoeForCausalLM",
            r#", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
               "shared_expert_intermediate_size": 64"#,
            Store::Q8_0,
        ),
        // SmolLM3: layer 3 of 4 without rotary (llama.cpp's hard-coded every fourth; q/k
        // permuted as Llama's).
        (
            "SmolLM3ForCausalLM",
            r#", "num_hidden_layers": 4, "tie_word_embeddings": true"#,
            Store::Q8_0,
        ),
        // Phi-3: fused `attn_qkv` and `ffn_up` (gate rows, then up rows), half a head's
        // rotary dims (`rope.dimension_count`), a window over every layer; not permuted.
        (
            "Phi3ForCausalLM",
            r#", "partial_rotary_factor": 0.5, "sliding_window": 16"#,
            Store::Q8_0,
        ),
        ("Phi3ForCausalLM", "", Store::F16),
        // Phi-3.5's LongRoPE: the factor tensors, the original context and the attention
        // factor in the metadata (half of 16 rotary dims: 4 factors each).
        (
            "Phi3ForCausalLM",
            r#", "partial_rotary_factor": 0.5, "original_max_position_embeddings": 64,
               "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.5, 2.0, 2.5],
               "long_factor": [1.0, 3.0, 5.0, 9.0]}"#,
            Store::Q8_0,
        ),
        // Gemma 3: q/k head norms, post norms, norms stored as 1 + w, a window of 8 on
        // layer 0 (the sliding-window pattern's flags) with the local base (freq_base_swa).
        (
            "Gemma3ForCausalLM",
            r#", "query_pre_attn_scalar": 16, "sliding_window": 8, "rope_local_base_freq": 5000.0,
               "layer_types": ["sliding_attention", "full_attention"]"#,
            Store::Q8_0,
        ),
        // Gemma 2: no head norms, its logit caps in the metadata.
        (
            "Gemma2ForCausalLM",
            r#", "query_pre_attn_scalar": 16, "sliding_window": 8,
               "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0"#,
            Store::F16,
        ),
        // OLMo 2: no pre-norms, post norms (llama.cpp's `post_attention_norm` and
        // `post_ffw_norm`), q and k norms across the heads; not permuted.
        ("Olmo2ForCausalLM", r#", "rms_norm_eps": 1e-5"#, Store::Q8_0),
        // StableLM: LayerNorms with a bias (`attn_norm.bias`, `ffn_norm.bias`,
        // `output_norm.bias`; `attention.layer_norm_epsilon`), a quarter of each head's
        // rotary dims, q/k/v biases; not permuted.
        (
            "StableLmForCausalLM",
            r#", "layer_norm_eps": 1e-5, "partial_rotary_factor": 0.25, "use_qkv_bias": true"#,
            Store::Q8_0,
        ),
        (
            "StableLmForCausalLM",
            r#", "partial_rotary_factor": 0.5"#,
            Store::F16,
        ),
        // gpt-oss (`gpt-oss`): sinks, q/k/v/o, router and expert biases (stacked
        // `ffn_*_exps.bias`), windows of 4 on the even layers, YaRN (truncate false).
        ("GptOssForCausalLM", GPT_OSS, Store::Q8_0),
        ("GptOssForCausalLM", GPT_OSS, Store::F32),
        // Its experts as MXFP4 (GGML type 39, ggml's nibble order).
        ("GptOssForCausalLM", GPT_OSS, Store::Mxfp4),
        // llama.cpp writes Mixtral as `llama` with experts (q/k permuted).
        (
            "MixtralForCausalLM",
            r#", "num_local_experts": 4, "num_experts_per_tok": 2"#,
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
        // gpt-oss's safetensors twin holds transformers' fused expert tensors.
        let hf = hf_fused_layout(&cfg, &ts);
        write_safetensors(&dir.file("model.safetensors"), &f32_tensors(&hf));
        let gguf = dir.file("model.gguf");
        gguf_twin(&cfg, &ts, store).write(&gguf).unwrap();

        let spec = gguf.to_str().unwrap();
        let mut files = open_model(spec).unwrap();
        let stored = files.config.weights.clone();
        assert_eq!(
            stored.per_tensor.is_empty(),
            !matches!(store, Store::Q8_0 | Store::Mxfp4),
            "{what}: a block-format file keeps its projections quantized"
        );
        // The values, bit for bit: decoded at load (`--quantization none`).
        files.quantize(Quantization::None).unwrap();
        let ModelFiles { config, source } = files;
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
        if k < 3 || store == Store::Q8_0 || cfg.moe.is_some() {
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
    write_safetensors(&dir.file("model.safetensors"), &f32_tensors(&ts));
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

/// A MoE file whose stacked experts are missing or of the wrong shape is an error naming
/// the HF tensor (its layer and expert), the GGUF tensor and the shapes.
#[test]
fn moe_files_with_bad_expert_tensors_are_errors_naming_them() {
    let dir = TempDir::new("moe-bad");
    let json = tiny_json(
        "Qwen3MoeForCausalLM",
        r#", "head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 32, "norm_topk_prob": true"#,
    );
    let cfg = ModelConfig::from_json(&json, "test").unwrap();
    let ts = hf_checkpoint(&cfg, Store::F32, 3);
    let path = dir.file("moe.gguf");
    let open = |w: &GgufWriter| {
        w.write(&path).unwrap();
        let files = open_model(path.to_str().unwrap())?;
        load(&files.config, files.source)
    };
    // Three experts in a four-expert stack.
    let mut w = gguf_twin(&cfg, &ts, Store::F32);
    let name = "blk.1.ffn_down_exps.weight";
    let (_, dims, _, bytes) = w.tensors.iter().find(|t| t.0 == name).unwrap().clone();
    let keep = bytes.len() / 4 * 3;
    w.remove_tensor(name);
    let shape: Vec<usize> = [3, dims[1] as usize, dims[0] as usize].to_vec();
    w.tensor(name, &shape, GgmlType::F32, bytes[..keep].to_vec());
    let (_, msg) = err_text(open(&w));
    assert_mentions(
        &msg,
        &[
            "model.layers.1.mlp.experts.0.down_proj.weight",
            name,
            "expert 0",
            "[4, 64, 32]",
        ],
    );
    // No gate stack at all.
    let mut w = gguf_twin(&cfg, &ts, Store::F32);
    w.remove_tensor("blk.0.ffn_gate_exps.weight");
    let (_, msg) = err_text(open(&w));
    assert_mentions(
        &msg,
        &[
            "model.layers.0.mlp.experts.0.gate_proj.weight",
            "blk.0.ffn_gate_exps.weight",
            "missing",
        ],
    );
    // The experts' key missing.
    let mut w = gguf_twin(&cfg, &ts, Store::F32);
    w.remove_kv("qwen3moe.expert_feed_forward_length");
    let (_, msg) = err_text(open(&w));
    assert_mentions(&msg, &["qwen3moe.expert_feed_forward_length", "missing"]);
}

/// A stablelm file llama.cpp would run with what encore does not build is refused by what
/// it is, before any tensor loads: per-head q/k norms (`attn_q_norm`), and the parallel
/// residual (layers without `ffn_norm`).
#[test]
fn stablelm_files_with_qk_norms_or_a_parallel_residual_are_refused() {
    let json = tiny_json("StableLmForCausalLM", "");
    let cfg = ModelConfig::from_json(&json, "test").unwrap();
    let ts = hf_checkpoint(&cfg, Store::F32, 5);
    let dir = TempDir::new("stablelm-refused");
    let hd = cfg.head_dim;
    let qk = |l: usize| {
        (
            format!("model.layers.{l}.self_attn.q_norm.weight"),
            vec![hd],
            vec![1.0; hd],
        )
    };
    let cases = [
        (
            ts.iter().cloned().chain([qk(0), qk(1)]).collect::<Vec<_>>(),
            "q/k norms",
        ),
        (
            ts.iter()
                .filter(|(n, ..)| !n.contains("post_attention_layernorm"))
                .cloned()
                .collect(),
            "a parallel residual",
        ),
    ];
    for (k, (ts, want)) in cases.iter().enumerate() {
        let path = dir.file(&format!("m{k}.gguf"));
        gguf_twin(&cfg, ts, Store::F32).write(&path).unwrap();
        let Err(e) = open_model(path.to_str().unwrap()) else {
            panic!("a stablelm file with {want} opened");
        };
        let e = e.to_string();
        assert!(
            e.contains(want) && e.contains("not supported for stablelm"),
            "{e}"
        );
    }
    // The file itself is fine without them.
    let path = dir.file("ok.gguf");
    gguf_twin(&cfg, &ts, Store::F32).write(&path).unwrap();
    assert_eq!(open_model(path.to_str().unwrap()).unwrap().config, cfg);
}

/// A gpt-oss file reads its window pattern and YaRN from the metadata; what it does not
/// run (llama.cpp's fused `ffn_gate_up_exps`) is refused by name.
#[test]
fn gpt_oss_files_map_their_keys_and_refuse_fused_gate_up() {
    let json = tiny_json("GptOssForCausalLM", GPT_OSS);
    let cfg = ModelConfig::from_json(&json, "test").unwrap();
    let ts = hf_checkpoint(&cfg, Store::F32, 5);
    let dir = TempDir::new("gpt-oss");
    let path = dir.file("gpt-oss.gguf");
    let mut w = gguf_twin(&cfg, &ts, Store::F32);
    w.write(&path).unwrap();
    let got = config_from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    assert_eq!((got.layer_window(0), got.layer_window(1)), (Some(4), None));
    assert!(got.o_bias && got.qkv_bias);
    match got.rope.scaling {
        Some(RopeScaling::Yarn(y)) => assert!(!y.truncate && y.factor == 4.0),
        other => panic!("expected YaRN, got {other:?}"),
    }
    w.tensor_f32("blk.0.ffn_gate_up_exps.weight", &[1], &[0.0]);
    w.write(&path).unwrap();
    let (_, msg) = err_text(config_from_gguf(&GgufFile::open(&path).unwrap()));
    assert_mentions(
        &msg,
        &["blk.0.ffn_gate_up_exps.weight", "not supported", "gpt-oss"],
    );
}
