//! GPTQ checkpoints (`quantization_config.quant_method = "gptq"`, symmetric, groups in
//! column order): each projection's packed `qweight` / `scales` / `qzeros` / `g_idx` load
//! as GGUF blocks of the same values (4 bits as Q4_0, 8 as Q8_0), run as their dequantized
//! twin (the same values in f32), decode to exactly the twin's weights with
//! `--quantization none`, and what encore does not run (zero points, `desc_act`) is an
//! error naming the field or the tensor.

use super::fp8::{fp8_json, greedy, load, plain};
use super::*;
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

/// A packed 32-bit word as the f32 of the same bits (`Dtype::U32` writes its bits).
fn word(w: u32) -> f32 {
    f32::from_bits(w)
}

/// The GPTQ checkpoint (every projection but the LM head packed in `bits`, groups of 128,
/// zeros stored as v1 or v2 store them) and its twin (every tensor in f32, projections
/// decoded: scale * (code - 2^(bits - 1))). Codes and scales are drawn from a seed.
fn checkpoints(cfg: &ModelConfig, bits: u32, v2: bool) -> (Vec<Ck>, Vec<Ck>) {
    let (mut packed, mut twin) = (Vec::new(), Vec::new());
    let per_word = (32 / bits) as usize;
    let zero = 1u32 << (bits - 1);
    let stored_zero = zero - (!v2) as u32;
    for (i, spec) in weights::hf_tensors(cfg).iter().enumerate() {
        let v = values(300 + i as u64, spec.numel());
        let projection = spec.shape.len() == 2
            && !spec.name.contains("embed_tokens")
            && spec.name != "lm_head.weight";
        if !projection {
            let t = plain(&spec.name, &spec.shape, &v);
            packed.push(t.clone());
            twin.push(t);
            continue;
        }
        let (rows, cols) = (spec.shape[0], spec.shape[1]);
        let groups = cols / 128;
        let top = 1u32 << bits;
        // `values` lie in about [-1, 1]: spread them over the codes.
        let codes: Vec<u32> = v
            .iter()
            .map(|&x| (((x + 1.0) * 0.5 * top as f32) as u32).min(top - 1))
            .collect();
        let scales: Vec<f32> = (0..groups * rows)
            .map(|j| f16::from_f32(0.004 + 0.001 * (j % 11) as f32).to_f32())
            .collect();
        let base = spec.name.strip_suffix(".weight").unwrap();
        let mut qweight = vec![0u32; cols / per_word * rows];
        for r in 0..rows {
            for c in 0..cols {
                qweight[(c / per_word) * rows + r] |=
                    codes[r * cols + c] << (bits as usize * (c % per_word));
            }
        }
        let mut qzeros = vec![0u32; groups * rows.div_ceil(per_word)];
        for g in 0..groups {
            for r in 0..rows {
                qzeros[g * rows.div_ceil(per_word) + r / per_word] |=
                    stored_zero << (bits as usize * (r % per_word));
            }
        }
        let w32 = |name: &str, shape: &[usize], w: &[u32]| Ck {
            name: format!("{base}.{name}"),
            dtype: Dtype::U32,
            shape: shape.to_vec(),
            values: w.iter().map(|&x| word(x)).collect(),
        };
        packed.push(w32("qweight", &[cols / per_word, rows], &qweight));
        packed.push(w32("qzeros", &[groups, rows.div_ceil(per_word)], &qzeros));
        packed.push(Ck {
            name: format!("{base}.scales"),
            dtype: Dtype::F16,
            shape: vec![groups, rows],
            values: scales.clone(),
        });
        packed.push(Ck {
            name: format!("{base}.g_idx"),
            dtype: Dtype::I32,
            shape: vec![cols],
            values: (0..cols).map(|c| (c / 128) as f32).collect(),
        });
        let decoded: Vec<f32> = (0..rows * cols)
            .map(|k| {
                let (r, c) = (k / cols, k % cols);
                scales[(c / 128) * rows + r] * (codes[k] as f32 - zero as f32)
            })
            .collect();
        twin.push(Ck::f32(&spec.name, &spec.shape, &decoded));
    }
    (packed, twin)
}

#[test]
fn a_gptq_checkpoint_runs_in_its_bits_as_its_dequantized_twin() {
    let twin_cfg = ModelConfig::from_json(&llama_json(""), "twin").unwrap();
    for (bits, v2, kept) in [(4, false, QuantFormat::Q4_0), (8, true, QuantFormat::Q8_0)] {
        let (packed, twin) = checkpoints(&twin_cfg, bits, v2);
        let dir = model_dir("gptq", &llama_json(&quant(bits, v2, "")), &packed);
        let twin_dir = model_dir("gptq-twin", &llama_json(""), &twin);

        let ModelFiles { config, .. } = open_model(dir.path().to_str().unwrap()).unwrap();
        assert_eq!(config.weights.projections, Some(kept), "{bits} bits");
        let decl = config.decl();
        let kept_tensors = decl
            .tensors()
            .iter()
            .filter(|t| t.dtype(DType::F32) == DType::Q(kept))
            .count();
        assert_eq!(
            kept_tensors,
            4 * 2,
            "q/k/v, o, gate/up, down per layer; not the LM head"
        );

        let w = load(&config, dir.path());
        assert_eq!(w.layers[0].qkv().dtype(), DType::Q(kept));
        // The kept blocks hold the twin's values exactly.
        let twin_w = load(&twin_cfg, twin_dir.path());
        let be = CpuBackend::new();
        let decoded = weights::dequantized(&be, &w).unwrap();
        assert_eq!(all_values(&decoded), all_values(&twin_w), "{bits} bits");
        assert_eq!(
            greedy(&config, w),
            greedy(&twin_cfg, twin_w),
            "GPTQ {bits} bits kept vs its twin"
        );

        // `--quantization none` decodes the codes at load: the twin's weights exactly.
        let mut files = open_model(dir.path().to_str().unwrap()).unwrap();
        files.quantize(Quantization::None).unwrap();
        let dense = load(&files.config, dir.path());
        assert_eq!(
            all_values(&dense),
            all_values(&load(&twin_cfg, twin_dir.path()))
        );
    }
}

#[test]
fn gptq_packings_encore_does_not_run_are_refused_by_name() {
    let cfg_err = |q: &str| err_text(ModelConfig::from_json(&llama_json(q), "config.json")).1;
    let msg = cfg_err(&quant(4, false, "").replace(r#""sym": true"#, r#""sym": false"#));
    assert!(msg.contains("sym = false"), "{msg}");
    let msg = cfg_err(&quant(4, false, "").replace(r#""desc_act": false"#, r#""desc_act": true"#));
    assert!(msg.contains("desc_act"), "{msg}");
    let msg = cfg_err(&quant(3, false, ""));
    assert!(msg.contains("bits = 3"), "{msg}");
    let msg = cfg_err(&quant(4, false, "").replace(r#""group_size": 128"#, r#""group_size": 48"#));
    assert!(msg.contains("group_size = 48"), "{msg}");

    // A zero point other than the symmetric one, in the file: named with its tensor.
    let twin_cfg = ModelConfig::from_json(&llama_json(""), "twin").unwrap();
    let (mut packed, _) = checkpoints(&twin_cfg, 4, false);
    let name = "model.layers.1.mlp.down_proj.qzeros";
    let z = packed.iter_mut().find(|t| t.name == name).unwrap();
    z.values[3] = word(z.values[3].to_bits() ^ 0x10);
    let dir = model_dir("gptq-asym", &llama_json(&quant(4, false, "")), &packed);
    let ModelFiles { config, source } = open_model(dir.path().to_str().unwrap()).unwrap();
    let r = weights::load(
        &CpuBackend::new(),
        &config,
        source,
        DType::F32,
        &encore_core::progress::NoProgress,
    );
    let msg = err_text(r).1;
    assert!(msg.contains(name) && msg.contains("zero point"), "{msg}");
}
