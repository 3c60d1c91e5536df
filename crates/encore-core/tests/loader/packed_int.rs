//! Checkpoints packed in integers, GPTQ (`qweight` / `scales` / `qzeros` / `g_idx`), AWQ
//! (the GEMM layout: `qweight` / `qzeros` / `scales`) and compressed-tensors'
//! pack-quantized (`weight_packed` / `weight_scale` / `weight_shape`), groups in column
//! order: each projection loads as GGUF blocks of the same values (symmetric 4 bits as
//! Q4_0, 8 as Q8_0, 4 bits with zero points as Q4_1), runs as its dequantized twin (the
//! same values in f32), decodes to exactly the twin's weights with `--quantization none`,
//! and what encore does not run (zero points at 8 bits or in pack-quantized,
//! compressed-tensors' groups in activation order, other widths, layouts and formats) is an
//! error naming the field or the tensor. GPTQ's groups in activation order: `act_order.rs`.

use super::fp8::{fp8_json, greedy, load, load_error};
use super::*;
use common::packed::{
    checkpoints, checkpoints_grouped, checkpoints_scaled, exact_scale, word, Scheme,
};
use encore_core::model::config::ModelConfig;
use encore_core::model::formats::Quantization;
use encore_core::model::{open_model, ModelFiles};
use encore_core::quant::QuantFormat;

/// A Llama of 2 layers whose projection widths (256, 384) are whole groups of 128.
fn llama_json(extra: &str) -> String {
    fp8_json(extra)
}

fn quant(bits: u32, v2: bool, more: &str) -> String {
    let format = if v2 { "gptq_v2" } else { "gptq" };
    format!(
        r#", "quantization_config": {{"quant_method": "gptq", "bits": {bits}, "group_size": 128, "sym": true, "desc_act": false, "checkpoint_format": "{format}"{more}}}"#
    )
}

/// compressed-tensors' `quantization_config` (llm-compressor's W4A16 / W8A16 layout),
/// `weights` overridden by `more` (JSON members) and `top` added at the top level.
fn pack_quantized(bits: u32, more: &str, top: &str) -> String {
    format!(
        r#", "quantization_config": {{"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {{"group_0": {{"targets": ["Linear"], "weights": {{"num_bits": {bits}, "type": "int", "symmetric": true, "strategy": "group", "group_size": 128, "dynamic": false, "actorder": null{more}}}, "input_activations": null, "output_activations": null}}}}, "ignore": [], "quantization_status": "compressed"{top}}}"#
    )
}

/// `config`'s checkpoint in `dir` loads with `kept` projections (`count` of them) equal to
/// the twin's values, runs greedy as the twin, and decodes to exactly the twin's weights
/// under `--quantization none`.
fn runs_as_twin(
    dir: &Path,
    twin_dir: &Path,
    twin_cfg: &ModelConfig,
    kept: QuantFormat,
    count: usize,
) {
    let ModelFiles { config, .. } = open_model(dir.to_str().unwrap()).unwrap();
    assert_eq!(config.weights.projections, Some(kept));
    let decl = config.decl();
    let n = decl
        .tensors()
        .iter()
        .filter(|t| t.dtype(DType::F32) == DType::Q(kept))
        .count();
    assert_eq!(n, count, "{kept} tensors");
    let w = load(&config, dir);
    assert_eq!(w.layers[0].qkv().dtype(), DType::Q(kept));
    // The kept blocks hold the twin's values exactly.
    let twin_w = load(twin_cfg, twin_dir);
    let decoded = weights::dequantized(&CpuBackend::new(), &w).unwrap();
    assert_eq!(all_values(&decoded), all_values(&twin_w), "{kept}");
    assert_eq!(
        greedy(&config, w),
        greedy(twin_cfg, twin_w),
        "{kept} vs its twin"
    );
    // `--quantization none` decodes the codes at load: the twin's weights exactly.
    let mut files = open_model(dir.to_str().unwrap()).unwrap();
    files.quantize(Quantization::None).unwrap();
    let dense = load(&files.config, dir);
    assert_eq!(all_values(&dense), all_values(&load(twin_cfg, twin_dir)));
}

#[test]
fn a_pack_quantized_checkpoint_runs_in_its_bits_as_its_dequantized_twin() {
    let twin_cfg = ModelConfig::from_json(&llama_json(""), "twin").unwrap();
    for (bits, kept) in [(4, QuantFormat::Q4_0), (8, QuantFormat::Q8_0)] {
        let (packed, twin) = checkpoints(&twin_cfg, bits, Scheme::PackQuantized { asym: false });
        let dir = model_dir("ct", &llama_json(&pack_quantized(bits, "", "")), &packed);
        let twin_dir = model_dir("ct-twin", &llama_json(""), &twin);
        let count = 4 * 2 + 1; // q/k/v, o, gate/up, down per layer, and the LM head
        runs_as_twin(dir.path(), twin_dir.path(), &twin_cfg, kept, count);
    }
}

#[test]
fn pack_quantized_options_encore_does_not_run_are_refused_by_name() {
    let cfg_err = |q: &str| err_text(ModelConfig::from_json(&llama_json(q), "config.json")).1;
    for (q, want) in [
        (
            pack_quantized(8, r#", "symmetric": false"#, ""),
            "symmetric = false is not supported with num_bits = 8",
        ),
        (
            pack_quantized(4, r#", "actorder": "group""#, ""),
            "actorder",
        ),
        (pack_quantized(3, "", ""), "num_bits"),
        (
            pack_quantized(4, "", r#", "ignore": ["model.layers.0.mlp.down_proj"]"#),
            "ignore lists",
        ),
        (
            pack_quantized(4, "", "").replace(
                r#""input_activations": null"#,
                r#""input_activations": {"num_bits": 8}"#,
            ),
            "input_activations",
        ),
        (
            pack_quantized(4, "", "").replace("\"pack-quantized\"", "\"float-quantized\""),
            "float-quantized",
        ),
    ] {
        let msg = cfg_err(&q);
        assert!(msg.contains(want), "{want}: {msg}");
    }
    // A zero point in the file: named with its tensor.
    let twin_cfg = ModelConfig::from_json(&llama_json(""), "twin").unwrap();
    let (mut packed, _) = checkpoints(&twin_cfg, 4, Scheme::PackQuantized { asym: false });
    let name = "model.layers.1.self_attn.o_proj.weight_zero_point";
    packed.push(Ck {
        name: name.into(),
        dtype: Dtype::I32,
        shape: vec![32, 2],
        values: vec![0.0; 64],
    });
    let msg = load_error(&llama_json(&pack_quantized(4, "", "")), &packed);
    assert!(msg.contains(name) && msg.contains("zero point"), "{msg}");
    // A bf16 scale below f16's normal range (an f16 block scale would round it).
    packed.pop();
    let name = "model.layers.0.mlp.up_proj.weight_scale";
    packed.iter_mut().find(|t| t.name == name).unwrap().values[5] = 1.0e-6;
    let msg = load_error(&llama_json(&pack_quantized(4, "", "")), &packed);
    assert!(
        msg.contains(name) && msg.contains("f16 scale cannot hold"),
        "{msg}"
    );
}

#[test]
fn a_gptq_checkpoint_runs_in_its_bits_as_its_dequantized_twin() {
    let twin_cfg = ModelConfig::from_json(&llama_json(""), "twin").unwrap();
    for (bits, v2, kept) in [(4, false, QuantFormat::Q4_0), (8, true, QuantFormat::Q8_0)] {
        let (packed, twin) = checkpoints(&twin_cfg, bits, Scheme::Gptq { v2, asym: false });
        let dir = model_dir("gptq", &llama_json(&quant(bits, v2, "")), &packed);
        let twin_dir = model_dir("gptq-twin", &llama_json(""), &twin);
        // q/k/v, o, gate/up, down per layer; not the LM head
        runs_as_twin(dir.path(), twin_dir.path(), &twin_cfg, kept, 4 * 2);
    }
}

/// Activation order with one group a row (`desc_act: true`, `group_size: -1`, g_idx all
/// zero): every column has its row's scale whatever the order, so the checkpoint loads and
/// runs as its twin; a g_idx that puts a column in another group is an error naming it.
/// compressed-tensors' `actorder` with `strategy: "channel"` loads the same way.
#[test]
fn activation_order_with_one_group_a_row_runs_as_its_twin() {
    let twin_cfg = ModelConfig::from_json(&llama_json(""), "twin").unwrap();
    let gptq = Scheme::Gptq {
        v2: false,
        asym: false,
    };
    let (packed, twin) = checkpoints_grouped(&twin_cfg, 4, gptq, exact_scale, None);
    let q = quant(4, false, "")
        .replace(r#""group_size": 128"#, r#""group_size": -1"#)
        .replace(r#""desc_act": false"#, r#""desc_act": true"#);
    let dir = model_dir("gptq-act-order", &llama_json(&q), &packed);
    let twin_dir = model_dir("gptq-act-order-twin", &llama_json(""), &twin);
    runs_as_twin(
        dir.path(),
        twin_dir.path(),
        &twin_cfg,
        QuantFormat::Q4_0,
        4 * 2,
    );

    let mut bad = packed.clone();
    let g = bad
        .iter_mut()
        .find(|t| t.name.ends_with(".g_idx"))
        .expect("a g_idx");
    g.values[7] = 1.0;
    let name = g.name.clone();
    let msg = load_error(&llama_json(&q), &bad);
    assert!(msg.contains(&name) && msg.contains("column 7"), "{msg}");

    let channel = Scheme::PackQuantized { asym: false };
    let (packed, twin) = checkpoints_grouped(&twin_cfg, 4, channel, exact_scale, None);
    let q = pack_quantized(4, r#", "strategy": "channel", "actorder": "weight""#, "");
    let dir = model_dir("ct-act-order", &llama_json(&q), &packed);
    let twin_dir = model_dir("ct-act-order-twin", &llama_json(""), &twin);
    runs_as_twin(
        dir.path(),
        twin_dir.path(),
        &twin_cfg,
        QuantFormat::Q4_0,
        4 * 2 + 1,
    );
}

/// An AutoGPTQ export that keeps its packing in `quantize_config.json` (no
/// `quantization_config` in config.json, no `quant_method`) loads as GPTQ.
#[test]
fn a_gptq_export_with_quantize_config_json_loads_as_gptq() {
    let twin_cfg = ModelConfig::from_json(&llama_json(""), "twin").unwrap();
    let (packed, twin) = checkpoints(
        &twin_cfg,
        4,
        Scheme::Gptq {
            v2: false,
            asym: false,
        },
    );
    let dir = model_dir("gptq-side", &llama_json(""), &packed);
    std::fs::write(
        dir.path().join("quantize_config.json"),
        r#"{"bits": 4, "group_size": 128, "desc_act": false, "sym": true, "true_sequential": true}"#,
    )
    .unwrap();
    let twin_dir = model_dir("gptq-side-twin", &llama_json(""), &twin);
    runs_as_twin(
        dir.path(),
        twin_dir.path(),
        &twin_cfg,
        QuantFormat::Q4_0,
        4 * 2,
    );
}

#[test]
fn gptq_packings_encore_does_not_run_are_refused_by_name() {
    let cfg_err = |q: &str| err_text(ModelConfig::from_json(&llama_json(q), "config.json")).1;
    let msg = cfg_err(&quant(8, false, "").replace(r#""sym": true"#, r#""sym": false"#));
    assert!(
        msg.contains("sym = false") && msg.contains("bits = 8"),
        "{msg}"
    );
    // Groups in activation order load (`act_order.rs` runs them).
    let act = quant(4, false, "").replace(r#""desc_act": false"#, r#""desc_act": true"#);
    let cfg = ModelConfig::from_json(&llama_json(&act), "config.json").unwrap();
    assert!(cfg.weights.int_packing.unwrap().act_order);
    let msg = cfg_err(&quant(3, false, ""));
    assert!(msg.contains("bits = 3"), "{msg}");
    let msg = cfg_err(&quant(4, false, "").replace(r#""group_size": 128"#, r#""group_size": 48"#));
    assert!(msg.contains("group_size = 48"), "{msg}");

    // A zero point other than the symmetric one, in the file: named with its tensor.
    let twin_cfg = ModelConfig::from_json(&llama_json(""), "twin").unwrap();
    let (mut packed, _) = checkpoints(
        &twin_cfg,
        4,
        Scheme::Gptq {
            v2: false,
            asym: false,
        },
    );
    let name = "model.layers.1.mlp.down_proj.qzeros";
    let z = packed.iter_mut().find(|t| t.name == name).unwrap();
    z.values[3] = word(z.values[3].to_bits() ^ 0x10);
    let msg = load_error(&llama_json(&quant(4, false, "")), &packed);
    assert!(msg.contains(name) && msg.contains("zero point"), "{msg}");
}

/// A mixture of experts packed by GPTQ, AWQ or compressed-tensors (each expert's
/// projections, as AutoGPTQ, AutoAWQ and llm-compressor write them; the router plain): the
/// experts load kept in 4 bits and run as the twin.
#[test]
fn packed_mixtures_of_experts_run_as_their_dequantized_twins() {
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
    let twin_cfg = ModelConfig::from_json(&json(""), "twin").unwrap();
    let gptq = quant(4, false, "");
    // AutoAWQ leaves the routers unconverted (`modules_to_not_convert: ["gate"]`).
    let awq = awq("").replace("null", r#"["gate"]"#);
    let gptq_scheme = Scheme::Gptq {
        v2: false,
        asym: false,
    };
    // llm-compressor leaves the routers in `ignore` and packs the LM head.
    let ct = |more: &str| {
        pack_quantized(4, more, r#", "ignore": ["re:.*mlp.gate$"]"#).replacen(
            r#""ignore": [], "#,
            "",
            1,
        )
    };
    for (name, q, scheme, kept, count) in [
        ("gptq-moe", gptq, gptq_scheme, QuantFormat::Q4_0, 4 * 2),
        ("awq-moe", awq, Scheme::Awq, QuantFormat::Q4_1, 4 * 2),
        (
            "ct-moe",
            ct(""),
            Scheme::PackQuantized { asym: false },
            QuantFormat::Q4_0,
            4 * 2 + 1,
        ),
        (
            "ct-moe-zeros",
            ct(r#", "symmetric": false"#),
            Scheme::PackQuantized { asym: true },
            QuantFormat::Q4_1,
            4 * 2 + 1,
        ),
    ] {
        let (packed, twin) = checkpoints(&twin_cfg, 4, scheme);
        let dir = model_dir(name, &json(&q), &packed);
        let twin_dir = model_dir("moe-twin", &json(""), &twin);
        // q/k/v, o, the experts' gate/up and down per layer (and a packed LM head)
        runs_as_twin(dir.path(), twin_dir.path(), &twin_cfg, kept, count);
    }
}

fn awq(more: &str) -> String {
    format!(
        r#", "quantization_config": {{"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true, "version": "gemm", "modules_to_not_convert": null{more}}}"#
    )
}

/// GPTQ with zero points (`sym: false`, v1 storing each zero minus one and v2), AWQ's
/// GEMM layout and compressed-tensors' asymmetric W4A16 load as Q4_1 blocks (scale,
/// -scale * zero) and run as their twins.
#[test]
fn zero_point_checkpoints_run_in_4_bits_as_their_dequantized_twins() {
    let twin_cfg = ModelConfig::from_json(&llama_json(""), "twin").unwrap();
    for v2 in [false, true] {
        let q = quant(4, v2, "").replace(r#""sym": true"#, r#""sym": false"#);
        let (packed, twin) = checkpoints(&twin_cfg, 4, Scheme::Gptq { v2, asym: true });
        let dir = model_dir("gptq-asym", &llama_json(&q), &packed);
        let twin_dir = model_dir("gptq-asym-twin", &llama_json(""), &twin);
        runs_as_twin(
            dir.path(),
            twin_dir.path(),
            &twin_cfg,
            QuantFormat::Q4_1,
            4 * 2,
        );
    }
    let (packed, twin) = checkpoints(&twin_cfg, 4, Scheme::Awq);
    let dir = model_dir("awq", &llama_json(&awq("")), &packed);
    let twin_dir = model_dir("awq-twin", &llama_json(""), &twin);
    runs_as_twin(
        dir.path(),
        twin_dir.path(),
        &twin_cfg,
        QuantFormat::Q4_1,
        4 * 2,
    );
    // compressed-tensors' W4A16 with zero points (`weight_zero_point`), the LM head too.
    let q = pack_quantized(4, r#", "symmetric": false"#, "");
    let (packed, twin) = checkpoints(&twin_cfg, 4, Scheme::PackQuantized { asym: true });
    let dir = model_dir("ct-asym", &llama_json(&q), &packed);
    let twin_dir = model_dir("ct-asym-twin", &llama_json(""), &twin);
    runs_as_twin(
        dir.path(),
        twin_dir.path(),
        &twin_cfg,
        QuantFormat::Q4_1,
        4 * 2 + 1,
    );
    // Its zero points missing: named.
    let kept: Vec<Ck> = packed
        .into_iter()
        .filter(|t| t.name != "model.layers.1.mlp.up_proj.weight_zero_point")
        .collect();
    let msg = load_error(&llama_json(&q), &kept);
    assert!(
        msg.contains("up_proj.weight_zero_point") && msg.contains("missing"),
        "{msg}"
    );
}

/// A scale whose product with the zero point needs more bits than an f16 holds: the Q4_1
/// block's min is that product rounded to f16 (within half an f16 ulp of it), while
/// `--quantization none` decodes `scale * (code - zero)` exactly.
#[test]
fn a_zero_point_product_an_f16_cannot_hold_is_rounded_within_half_an_ulp() {
    let twin_cfg = ModelConfig::from_json(&llama_json(""), "twin").unwrap();
    // 11 significant bits: times a zero of up to 15, up to 15 bits.
    let awkward =
        |g: usize, r: usize, rows: usize| 0.0123 + 0.000_017 * ((g * rows + r) % 97) as f32;
    let (packed, twin) = checkpoints_scaled(&twin_cfg, 4, Scheme::Awq, awkward);
    let dir = model_dir("awq-round", &llama_json(&awq("")), &packed);
    let twin_dir = model_dir("awq-round-twin", &llama_json(""), &twin);
    let ModelFiles { config, .. } = open_model(dir.path().to_str().unwrap()).unwrap();
    let w = load(&config, dir.path());
    let flat = |t: Vec<Vec<f32>>| t.concat();
    let decoded = flat(all_values(
        &weights::dequantized(&CpuBackend::new(), &w).unwrap(),
    ));
    let exact = flat(all_values(&load(&twin_cfg, twin_dir.path())));
    assert_eq!(decoded.len(), exact.len());
    let (mut rounded, mut worst) = (0, 0.0f32);
    for (a, b) in decoded.iter().zip(&exact) {
        // |m - (-s z)| <= 2^-11 |s z| < 2^-11 * 15 * 0.0140
        let d = (a - b).abs();
        rounded += (d > 0.0) as usize;
        worst = worst.max(d);
    }
    assert!(rounded > 0, "the scales were meant to need rounding");
    assert!(worst <= 15.0 * 0.0140 / 2048.0, "worst {worst}");
    let mut files = open_model(dir.path().to_str().unwrap()).unwrap();
    files.quantize(Quantization::None).unwrap();
    assert_eq!(flat(all_values(&load(&files.config, dir.path()))), exact);
}

#[test]
fn awq_options_encore_does_not_run_are_refused_by_name() {
    let cfg_err = |q: &str| err_text(ModelConfig::from_json(&llama_json(q), "config.json")).1;
    for (q, want) in [
        (
            awq("").replace(r#""version": "gemm""#, r#""version": "gemv""#),
            "version = \"gemv\"",
        ),
        (awq("").replace(r#""bits": 4"#, r#""bits": 8"#), "bits = 8"),
        (
            awq("").replace(r#""zero_point": true"#, r#""zero_point": false"#),
            "zero_point = false",
        ),
        (
            awq("").replace(r#""group_size": 128"#, r#""group_size": 100"#),
            "group_size = 100",
        ),
        (
            awq("").replace(
                r#""modules_to_not_convert": null"#,
                r#""modules_to_not_convert": ["self_attn.o_proj"]"#,
            ),
            "modules_to_not_convert",
        ),
    ] {
        let msg = cfg_err(&q);
        assert!(msg.contains(want), "{want}: {msg}");
    }
    // AutoAWQ's own key names and a router left unconverted are read.
    let own = awq("")
        .replace(r#""bits": 4"#, r#""w_bit": 4"#)
        .replace(r#""group_size": 128"#, r#""q_group_size": 128"#)
        .replace(r#""version": "gemm""#, r#""version": "GEMM""#)
        .replace(
            r#""modules_to_not_convert": null"#,
            r#""modules_to_not_convert": ["gate"]"#,
        );
    let cfg = ModelConfig::from_json(&llama_json(&own), "config.json").unwrap();
    assert_eq!(cfg.weights.projections, Some(QuantFormat::Q4_1));
    // A qzeros tensor of the wrong shape is named.
    let twin_cfg = ModelConfig::from_json(&llama_json(""), "twin").unwrap();
    let (mut packed, _) = checkpoints(&twin_cfg, 4, Scheme::Awq);
    let name = "model.layers.0.mlp.gate_proj.qzeros";
    let z = packed.iter_mut().find(|t| t.name == name).unwrap();
    z.shape = vec![z.shape[1], z.shape[0]];
    let msg = load_error(&llama_json(&awq("")), &packed);
    assert!(msg.contains(name), "{msg}");
}

/// Greedy tokens of `cfg` loaded from `dir` on `be` in `dtype` (as `fp8::greedy`).
pub(super) fn greedy_on(
    be: &dyn encore_core::Backend,
    dtype: DType,
    cfg: &ModelConfig,
    dir: &Path,
) -> Vec<Vec<u32>> {
    let source = WeightSource::Dir(dir.to_path_buf());
    let progress = &encore_core::progress::NoProgress;
    let w = weights::load(be, cfg, source, dtype, progress).unwrap();
    super::fp8::greedy_with(be, cfg, w)
}

/// On the GPU, every packing kept in its bits (GPTQ symmetric in 4 and 8 bits and with
/// zero points, AWQ, pack-quantized with and without zero points) runs in f32 as its
/// dequantized twin runs dense.
#[test]
#[ignore = "needs a CUDA device"]
fn packed_checkpoints_on_the_gpu_run_as_their_twins() {
    let be = encore_core::backend::cuda::CudaBackend::new(0).unwrap();
    let twin_cfg = ModelConfig::from_json(&llama_json(""), "twin").unwrap();
    let asym = |v2| quant(4, v2, "").replace(r#""sym": true"#, r#""sym": false"#);
    let cases = [
        (
            "gptq-4",
            quant(4, false, ""),
            4,
            Scheme::Gptq {
                v2: false,
                asym: false,
            },
            QuantFormat::Q4_0,
        ),
        (
            "gptq-8",
            quant(8, true, ""),
            8,
            Scheme::Gptq {
                v2: true,
                asym: false,
            },
            QuantFormat::Q8_0,
        ),
        (
            "gptq-zeros",
            asym(false),
            4,
            Scheme::Gptq {
                v2: false,
                asym: true,
            },
            QuantFormat::Q4_1,
        ),
        ("awq", awq(""), 4, Scheme::Awq, QuantFormat::Q4_1),
        (
            "ct-4",
            pack_quantized(4, "", ""),
            4,
            Scheme::PackQuantized { asym: false },
            QuantFormat::Q4_0,
        ),
        (
            "ct-4-zeros",
            pack_quantized(4, r#", "symmetric": false"#, ""),
            4,
            Scheme::PackQuantized { asym: true },
            QuantFormat::Q4_1,
        ),
    ];
    for (name, q, bits, scheme, kept) in cases {
        let (packed, twin) = checkpoints(&twin_cfg, bits, scheme);
        gpu_runs_as_twin(&be, name, &q, (&packed, &twin), kept);
    }
    // GPTQ act order (`desc_act` with groups): the layers gather their inputs.
    super::act_order::on_the_gpu(&be);
}

/// `q`'s checkpoint `packed` (config `llama_json(q)`) runs greedy on `be` in f32 as its
/// `twin` there, and as the CPU runs it.
fn gpu_runs_as_twin(
    be: &dyn encore_core::Backend,
    name: &str,
    q: &str,
    (packed, twin): (&[Ck], &[Ck]),
    kept: QuantFormat,
) {
    let twin_cfg = ModelConfig::from_json(&llama_json(""), "twin").unwrap();
    let dir = model_dir(name, &llama_json(q), packed);
    let twin_dir = model_dir("twin", &llama_json(""), twin);
    let ModelFiles { config, .. } = open_model(dir.path().to_str().unwrap()).unwrap();
    assert_eq!(config.weights.projections, Some(kept), "{name}");
    let got = greedy_on(be, DType::F32, &config, dir.path());
    let want = greedy_on(be, DType::F32, &twin_cfg, twin_dir.path());
    assert_eq!(got, want, "{name} on the GPU vs its twin");
    // And as the CPU runs it.
    assert_eq!(
        got,
        greedy_on(&CpuBackend::new(), DType::F32, &config, dir.path()),
        "{name}"
    );
}
