//! FP8 checkpoints in Hugging Face's layout (`quantization_config.quant_method = "fp8"`,
//! E4M3 weights with 128x128 blocks of `weight_scale_inv` or a per-tensor
//! `weight_scale`) and compressed-tensors' `float-quantized` (per-channel `[rows, 1]` or
//! per-tensor `weight_scale`, the LM head ignored): they load with their projections kept
//! in FP8 and run exactly as their dequantized twin (the same values in f32), and a
//! missing or misshapen scale is an error naming the tensor.

use super::*;
use encore_core::model::config::ModelConfig;
use encore_core::model::formats::Quantization;
use encore_core::model::llama::Model;
use encore_core::model::{open_model, ModelFiles};
use encore_core::quant::{e4m3_to_f32, QuantFormat};
use encore_core::runner::{Runner, RunnerConfig};

/// A Llama of 2 layers with every matrix width a multiple of 128 (FP8 blocks).
pub(super) fn fp8_json(extra: &str) -> String {
    format!(
        r#"{{
  "architectures": ["LlamaForCausalLM"],
  "vocab_size": 96, "hidden_size": 256, "intermediate_size": 384,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256,
  "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"{extra}
}}"#
    )
}

const QUANT: &str = r#", "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}"#;

/// The load error of `tensors` under `config`'s JSON (shared with the packed-integer
/// tests).
pub(super) fn load_error(config: &str, tensors: &[Ck]) -> String {
    let dir = model_dir("quant-bad", config, tensors);
    let ModelFiles { config, source } = open_model(dir.path().to_str().unwrap()).unwrap();
    let r = weights::load(
        &CpuBackend::new(),
        &config,
        source,
        DType::F32,
        &encore_core::progress::NoProgress,
    );
    err_text(r).1
}

/// The FP8 checkpoint (projections as E4M3 codes with scales: 128x128 blocks, or one
/// per-tensor scale for layer 1's MLP) and its twin (every tensor in f32, projections
/// decoded). Codes are drawn uniformly from the finite E4M3 values.
fn checkpoints(cfg: &ModelConfig) -> (Vec<Ck>, Vec<Ck>) {
    checkpoints_as(cfg, false)
}

/// [`checkpoints`], or with `ct` as compressed-tensors writes FP8: a bf16 scale a row
/// (`[rows, 1]`) where the blocks were, and the LM head plain (ignored).
fn checkpoints_as(cfg: &ModelConfig, ct: bool) -> (Vec<Ck>, Vec<Ck>) {
    let (mut fp8, mut twin) = (Vec::new(), Vec::new());
    for (i, spec) in weights::hf_tensors(cfg).iter().enumerate() {
        let v = values(100 + i as u64, spec.numel());
        let projection = spec.shape.len() == 2
            && !spec.name.contains("embed_tokens")
            && !(ct && spec.name == "lm_head.weight");
        if !projection {
            let t = plain(&spec.name, &spec.shape, &v);
            fp8.push(t.clone());
            twin.push(t);
            continue;
        }
        let (rows, cols) = (spec.shape[0], spec.shape[1]);
        // E4M3 values in about [-0.9, 0.9] (codes well inside the range).
        let codes: Vec<f32> = v
            .iter()
            .map(|&x| e4m3_to_f32(encore_core::quant::f32_to_e4m3(x * 0.9)))
            .collect();
        let per_tensor = spec.name.starts_with("model.layers.1.mlp");
        let grid = (rows.div_ceil(128), cols.div_ceil(128));
        let scales: Vec<f32> = if per_tensor {
            vec![0.07]
        } else if ct {
            // Exact in bf16.
            (0..rows).map(|r| (16 + r % 9) as f32 / 512.0).collect()
        } else {
            (0..grid.0 * grid.1)
                .map(|b| 0.02 + 0.01 * (b % 7) as f32)
                .collect()
        };
        let scale = |r: usize, c: usize| match (per_tensor, ct) {
            (true, _) => scales[0],
            (false, true) => scales[r],
            (false, false) => scales[(r / 128) * grid.1 + c / 128],
        };
        let decoded: Vec<f32> = (0..rows * cols)
            .map(|i| codes[i] * scale(i / cols, i % cols))
            .collect();
        fp8.push(Ck {
            name: spec.name.clone(),
            dtype: Dtype::F8_E4M3,
            shape: spec.shape.clone(),
            values: codes,
        });
        fp8.push(match (per_tensor, ct) {
            (true, true) => Ck::f32(&format!("{}_scale", spec.name), &[1], &scales),
            (true, false) => Ck::f32(&format!("{}_scale", spec.name), &[], &scales),
            (false, true) => Ck {
                name: format!("{}_scale", spec.name),
                dtype: Dtype::BF16,
                shape: vec![rows, 1],
                values: scales.clone(),
            },
            (false, false) => Ck::f32(
                &format!("{}_scale_inv", spec.name),
                &[grid.0, grid.1],
                &scales,
            ),
        });
        twin.push(Ck::f32(&spec.name, &spec.shape, &decoded));
    }
    (fp8, twin)
}

/// Greedy tokens of two prompts on the CPU (shared with the GPTQ tests).
pub(super) fn greedy(cfg: &ModelConfig, w: ModelWeights) -> Vec<Vec<u32>> {
    greedy_with(&CpuBackend::new(), cfg, w)
}

/// [`greedy`] on backend `be` (the weights loaded on it).
pub(super) fn greedy_with(
    be: &dyn encore_core::Backend,
    cfg: &ModelConfig,
    w: ModelWeights,
) -> Vec<Vec<u32>> {
    let model = Model::new(be, cfg.clone(), w, 64).unwrap();
    let cfg = RunnerConfig {
        block_size: 4,
        num_blocks: 40,
        max_tokens_per_step: 64,
        max_seqs: 2,
        max_seq_len: 64,
        penalty_slots: 0,
        kv_dtype: None,
    };
    let mut runner = Runner::new(be, model, cfg).unwrap();
    let prompts = vec![vec![1, 5, 9, 40, 77], vec![1, 90, 3]];
    common::generate_greedy(&mut runner, &prompts, &[], 8, true)
}

/// `dir`'s weights for `cfg` on the CPU in f32.
pub(super) fn load(cfg: &ModelConfig, dir: &Path) -> ModelWeights {
    weights::load(
        &CpuBackend::new(),
        cfg,
        WeightSource::Dir(dir.to_path_buf()),
        DType::F32,
        &encore_core::progress::NoProgress,
    )
    .unwrap()
}

#[test]
fn an_fp8_checkpoint_runs_in_fp8_as_its_dequantized_twin() {
    let twin_cfg = ModelConfig::from_json(&fp8_json(""), "twin").unwrap();
    let (fp8, twin) = checkpoints(&twin_cfg);
    let fp8_dir = model_dir("fp8", &fp8_json(QUANT), &fp8);
    let twin_dir = model_dir("fp8-twin", &fp8_json(""), &twin);

    let ModelFiles { config, .. } = open_model(fp8_dir.path().to_str().unwrap()).unwrap();
    assert_eq!(config.weights.projections, Some(QuantFormat::F8E4M3));
    let decl = config.decl();
    let kept: Vec<_> = decl
        .tensors()
        .iter()
        .filter(|t| t.dtype(DType::F32) == DType::Q(QuantFormat::F8E4M3))
        .collect();
    assert_eq!(
        kept.len(),
        4 * 2,
        "q/k/v, o, gate/up, down per layer; the LM head (stored in FP8 here) is decoded"
    );
    assert!(config.weight_bytes(DType::F32) < twin_cfg.weight_bytes(DType::F32) / 2);

    let w = load(&config, fp8_dir.path());
    assert_eq!(w.layers[0].qkv().dtype(), DType::Q(QuantFormat::F8E4M3));
    assert_eq!(
        w.lm_head.dtype(),
        DType::F32,
        "the method leaves the LM head unquantized"
    );
    let expected = greedy(&twin_cfg, load(&twin_cfg, twin_dir.path()));
    assert_eq!(greedy(&config, w), expected, "FP8 kept vs its twin");

    // `--quantization none` decodes the FP8 values at load: the twin's weights exactly.
    let mut files = open_model(fp8_dir.path().to_str().unwrap()).unwrap();
    files.quantize(Quantization::None).unwrap();
    let dense = load(&files.config, fp8_dir.path());
    let twin_w = load(&twin_cfg, twin_dir.path());
    assert_eq!(all_values(&dense), all_values(&twin_w));
}

#[test]
fn fp8_weights_without_their_scales_are_refused_naming_the_tensor() {
    let cfg = ModelConfig::from_json(&fp8_json(""), "twin").unwrap();
    let (fp8, _) = checkpoints(&cfg);
    let name = "model.layers.0.self_attn.k_proj.weight";
    let scale = format!("{name}_scale_inv");
    let load_err = |tensors: Vec<Ck>| load_error(&fp8_json(QUANT), &tensors);
    let missing: Vec<Ck> = fp8.iter().filter(|t| t.name != scale).cloned().collect();
    let msg = load_err(missing);
    assert!(msg.contains(name) && msg.contains("_scale_inv"), "{msg}");
    let mut wrong = fp8.clone();
    let s = wrong.iter_mut().find(|t| t.name == scale).unwrap();
    s.shape = vec![s.values.len(), 1];
    let msg = load_err(wrong);
    assert!(msg.contains(name) && msg.contains("128x128"), "{msg}");

    let other = fp8_json(r#", "quantization_config": {"quant_method": "bitsandbytes"}"#);
    let msg = err_text(ModelConfig::from_json(&other, "config.json")).1;
    assert!(msg.contains("bitsandbytes"), "{msg}");
}

/// A checkpoint's KV cache scales (ModelOpt's `self_attn.k_proj.k_scale`, compressed-
/// tensors' `self_attn.k_scale`): the checkpoint loads with them (they are not unused
/// tensors), an engine over an FP8 cache takes them into its cache (and one over a cache
/// of the run dtype leaves them), and a layer without them is an error naming the tensor.
#[test]
fn a_checkpoints_kv_cache_scales_reach_the_fp8_cache() {
    use encore_core::engine::{Engine, EngineConfig, KvSizing};
    use encore_core::KvScale;

    let cfg = ModelConfig::from_json(&fp8_json(""), "twin").unwrap();
    let (_, twin) = checkpoints(&cfg);
    let scales = [KvScale { k: 0.05, v: 0.5 }, KvScale { k: 2.0, v: 0.25 }];
    let mut tensors = twin.clone();
    tensors.push(Ck::f32("model.layers.0.self_attn.k_scale", &[], &[0.05]));
    tensors.push(Ck::f32("model.layers.0.self_attn.v_scale", &[], &[0.5]));
    tensors.push(Ck::f32(
        "model.layers.1.self_attn.k_proj.k_scale",
        &[1],
        &[2.0],
    ));
    tensors.push(Ck::f32(
        "model.layers.1.self_attn.v_proj.v_scale",
        &[],
        &[0.25],
    ));
    let dir = model_dir("kv-scales", &fp8_json(""), &tensors);
    assert_eq!(
        weights::read_kv_scales(dir.path(), 2).unwrap(),
        Some(scales.to_vec())
    );
    let be = CpuBackend::new();
    let boot = |kv: Option<DType>| {
        let files = open_model(dir.path().to_str().unwrap()).unwrap();
        let ecfg = EngineConfig {
            kv_cache_dtype: kv,
            ..EngineConfig::new(DType::F32, 4, 64, 2, 64, KvSizing::Blocks(40))
        };
        let Engine { runner, .. } =
            Engine::new(&be, files, &ecfg, &encore_core::progress::NoProgress).unwrap();
        (0..2).map(|l| runner.kv().scale(l)).collect::<Vec<_>>()
    };
    assert_eq!(boot(Some(DType::F8E4M3)), scales);
    assert_eq!(boot(None), [KvScale::ONE; 2]);
    // The twin without scales has none.
    let plain = model_dir("kv-scales-none", &fp8_json(""), &twin);
    assert_eq!(weights::read_kv_scales(plain.path(), 2).unwrap(), None);

    // Layer 1 without its v_scale.
    let partial: Vec<Ck> = tensors
        .iter()
        .filter(|t| !t.name.ends_with("v_proj.v_scale"))
        .cloned()
        .collect();
    let bad = model_dir("kv-scales-partial", &fp8_json(""), &partial);
    let msg = err_text(weights::read_kv_scales(bad.path(), 2)).1;
    assert!(msg.contains("model.layers.1.self_attn"), "{msg}");
    // A scale of zero.
    let mut zero = tensors.clone();
    zero.iter_mut()
        .find(|t| t.name == "model.layers.0.self_attn.v_scale")
        .unwrap()
        .values = vec![0.0];
    let bad = model_dir("kv-scales-zero", &fp8_json(""), &zero);
    let msg = err_text(weights::read_kv_scales(bad.path(), 2)).1;
    assert!(
        msg.contains("model.layers.0.self_attn.v_scale") && msg.contains("positive"),
        "{msg}"
    );
}

/// compressed-tensors' FP8 (llm-compressor's FP8-dynamic: weights per channel, activations
/// dynamic per token), `dynamic` false for static activations (their input scales unused).
fn ct_fp8(dynamic: bool, weights_more: &str) -> String {
    format!(
        r#", "quantization_config": {{"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {{"group_0": {{"targets": ["Linear"], "weights": {{"num_bits": 8, "type": "float", "symmetric": true, "strategy": "channel", "dynamic": false{weights_more}}}, "input_activations": {{"num_bits": 8, "type": "float", "symmetric": true, "strategy": "token", "dynamic": {dynamic}}}}}}}, "ignore": ["lm_head"], "quantization_status": "compressed"}}"#
    )
}

#[test]
fn a_compressed_tensors_fp8_checkpoint_runs_in_fp8_as_its_dequantized_twin() {
    let twin_cfg = ModelConfig::from_json(&fp8_json(""), "twin").unwrap();
    let (fp8, twin) = checkpoints_as(&twin_cfg, true);
    let twin_dir = model_dir("ct-fp8-twin", &fp8_json(""), &twin);
    let expected = greedy(&twin_cfg, load(&twin_cfg, twin_dir.path()));
    for dynamic in [true, false] {
        let dir = model_dir("ct-fp8", &fp8_json(&ct_fp8(dynamic, "")), &fp8);
        let ModelFiles { config, .. } = open_model(dir.path().to_str().unwrap()).unwrap();
        assert_eq!(config.weights.projections, Some(QuantFormat::F8E4M3));
        let decl = config.decl();
        let kept = decl
            .tensors()
            .iter()
            .filter(|t| t.dtype(DType::F32) == DType::Q(QuantFormat::F8E4M3))
            .count();
        assert_eq!(
            kept,
            4 * 2,
            "q/k/v, o, gate/up, down per layer; the LM head ignored"
        );
        let w = load(&config, dir.path());
        assert_eq!(w.layers[0].qkv().dtype(), DType::Q(QuantFormat::F8E4M3));
        assert_eq!(
            w.lm_head.dtype(),
            DType::F32,
            "the ignored LM head stays dense"
        );
        let twin_w = load(&twin_cfg, twin_dir.path());
        let decoded = weights::dequantized(&CpuBackend::new(), &w).unwrap();
        assert_eq!(all_values(&decoded), all_values(&twin_w));
        assert_eq!(
            greedy(&config, w),
            expected,
            "compressed-tensors FP8 vs its twin"
        );
    }
    // Refused by name: FP8 weights per 128-value group, dynamic weights, integer
    // activations over integer weights, a module ignored that is not the LM head.
    let cfg_err = |q: &str| err_text(ModelConfig::from_json(&fp8_json(q), "config.json")).1;
    for (q, want) in [
        (
            ct_fp8(true, "").replace(r#""strategy": "channel""#, r#""strategy": "block""#),
            "strategy = \"block\"",
        ),
        (
            ct_fp8(true, "").replace(
                r#""type": "float", "symmetric": true, "strategy": "channel""#,
                r#""type": "int", "symmetric": true, "strategy": "channel""#,
            ),
            "num_bits / type",
        ),
        (
            ct_fp8(true, "").replace(
                r#""ignore": ["lm_head"]"#,
                r#""ignore": ["model.layers.0.mlp.down_proj"]"#,
            ),
            "ignore lists",
        ),
        (
            ct_fp8(true, "").replace("float-quantized", "naive-quantized"),
            "naive-quantized",
        ),
    ] {
        let msg = cfg_err(&q);
        assert!(msg.contains(want), "{want}: {msg}");
    }
    // A scale of neither shape is named.
    let (mut bad, _) = checkpoints_as(&twin_cfg, true);
    let name = "model.layers.0.self_attn.o_proj.weight_scale";
    let t = bad.iter_mut().find(|t| t.name == name).unwrap();
    t.shape = vec![1, t.values.len()];
    let msg = load_error(&fp8_json(&ct_fp8(true, "")), &bad);
    assert!(
        msg.contains("o_proj.weight") && msg.contains("a row each"),
        "{msg}"
    );
}

/// An FP8 checkpoint whose MLP width (344) is not whole 128-value blocks, with the
/// ceil-divided scale grid the published format uses: `down_proj` (rows of 344) stays
/// dense, decoded at load, the rest stays FP8, and it runs as its twin; `--quantization
/// fp8` on the same widths still refuses naming the tensor.
#[test]
fn an_fp8_checkpoint_with_partial_blocks_keeps_those_projections_dense() {
    let json = |extra: &str| {
        fp8_json(extra).replace("\"intermediate_size\": 384", "\"intermediate_size\": 344")
    };
    let twin_cfg = ModelConfig::from_json(&json(""), "twin").unwrap();
    let (fp8, twin) = checkpoints(&twin_cfg);
    let down = "model.layers.0.mlp.down_proj.weight_scale_inv";
    let grid = &fp8.iter().find(|t| t.name == down).unwrap().shape;
    assert_eq!(grid, &vec![2, 3], "[ceil(256 / 128), ceil(344 / 128)]");
    let dir = model_dir("fp8-partial", &json(QUANT), &fp8);
    let twin_dir = model_dir("fp8-partial-twin", &json(""), &twin);
    let ModelFiles { config, .. } = open_model(dir.path().to_str().unwrap()).unwrap();
    let w = load(&config, dir.path());
    assert_eq!(w.layers[0].qkv().dtype(), DType::Q(QuantFormat::F8E4M3));
    assert_eq!(w.layers[0].gate_up().dtype(), DType::Q(QuantFormat::F8E4M3));
    assert_eq!(
        w.layers[0].down().dtype(),
        DType::F32,
        "rows of 344 stay dense"
    );
    let twin_w = load(&twin_cfg, twin_dir.path());
    let decoded = weights::dequantized(&CpuBackend::new(), &w).unwrap();
    assert_eq!(all_values(&decoded), all_values(&twin_w));
    assert_eq!(
        greedy(&config, w),
        greedy(&twin_cfg, twin_w),
        "partial blocks vs the twin"
    );
    let mut files = open_model(dir.path().to_str().unwrap()).unwrap();
    let e = files
        .quantize(Quantization::To(QuantFormat::F8E4M3))
        .unwrap_err()
        .to_string();
    assert!(e.contains("down_proj") && e.contains("344"), "{e}");
}
