//! Checkpoints whose projections are packed in integers (GPTQ, compressed-tensors'
//! pack-quantized) beside their dequantized twins, shared by the loader and
//! tensor-parallel tests.

use encore_core::model::config::ModelConfig;
use encore_core::model::weights;
use half::bf16;
use safetensors::tensor::Dtype;

use super::checkpoint::{plain, values, Ck};

/// A packed 32-bit word as the f32 of the same bits (`Dtype::U32` writes its bits).
pub fn word(w: u32) -> f32 {
    f32::from_bits(w)
}

/// Which packing a test checkpoint uses.
#[derive(Clone, Copy)]
pub enum Scheme {
    /// GPTQ, zeros stored as v2 (`true`, with bf16 scales) or v1 (f16 scales) store them.
    Gptq { v2: bool },
    /// compressed-tensors' pack-quantized, bf16 scales, the LM head packed too.
    PackQuantized,
}

/// The packed checkpoint (every projection packed in `bits`, groups of 128; GPTQ leaves
/// the LM head plain) and its twin (every tensor in f32, projections decoded: scale *
/// (code - 2^(bits - 1))). Codes and scales are drawn from a seed.
pub fn checkpoints(cfg: &ModelConfig, bits: u32, scheme: Scheme) -> (Vec<Ck>, Vec<Ck>) {
    let (mut packed, mut twin) = (Vec::new(), Vec::new());
    let per_word = (32 / bits) as usize;
    let zero = 1u32 << (bits - 1);
    let gptq = matches!(scheme, Scheme::Gptq { .. });
    for (i, spec) in weights::hf_tensors(cfg).iter().enumerate() {
        let v = values(300 + i as u64, spec.numel());
        // Routers stay plain, as the quantizers leave them.
        let plain_kept = spec.name.contains("embed_tokens")
            || spec.name.ends_with("mlp.gate.weight")
            || (gptq && spec.name == "lm_head.weight");
        let projection = spec.shape.len() == 2 && !plain_kept;
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
        // Scales by (group, row), exact in f16 and in bf16.
        let scale = |g: usize, r: usize| {
            bf16::from_f32(0.004 + 0.001 * ((g * rows + r) % 11) as f32).to_f32()
        };
        let base = spec.name.strip_suffix(".weight").unwrap();
        let w32 = |name: &str, shape: &[usize], w: &[u32]| Ck {
            name: format!("{base}.{name}"),
            dtype: Dtype::U32,
            shape: shape.to_vec(),
            values: w.iter().map(|&x| word(x)).collect(),
        };
        match scheme {
            Scheme::Gptq { v2 } => {
                let stored_zero = zero - (!v2) as u32;
                let mut qweight = vec![0u32; cols / per_word * rows];
                for r in 0..rows {
                    for c in 0..cols {
                        qweight[(c / per_word) * rows + r] |=
                            codes[r * cols + c] << (bits as usize * (c % per_word));
                    }
                }
                let zw = rows.div_ceil(per_word);
                let mut qzeros = vec![0u32; groups * zw];
                for g in 0..groups {
                    for r in 0..rows {
                        qzeros[g * zw + r / per_word] |=
                            stored_zero << (bits as usize * (r % per_word));
                    }
                }
                packed.push(w32("qweight", &[cols / per_word, rows], &qweight));
                packed.push(w32("qzeros", &[groups, zw], &qzeros));
                packed.push(Ck {
                    name: format!("{base}.scales"),
                    // v2 writers may keep the model's bf16 (exact in f16 here).
                    dtype: if v2 { Dtype::BF16 } else { Dtype::F16 },
                    shape: vec![groups, rows],
                    values: (0..groups * rows)
                        .map(|j| scale(j / rows, j % rows))
                        .collect(),
                });
                packed.push(Ck {
                    name: format!("{base}.g_idx"),
                    dtype: Dtype::I32,
                    shape: vec![cols],
                    values: (0..cols).map(|c| (c / 128) as f32).collect(),
                });
            }
            Scheme::PackQuantized => {
                let wpr = cols / per_word;
                let mut w = vec![0u32; rows * wpr];
                for r in 0..rows {
                    for c in 0..cols {
                        w[r * wpr + c / per_word] |=
                            codes[r * cols + c] << (bits as usize * (c % per_word));
                    }
                }
                packed.push(w32("weight_packed", &[rows, wpr], &w));
                packed.push(Ck {
                    name: format!("{base}.weight_scale"),
                    dtype: Dtype::BF16,
                    shape: vec![rows, groups],
                    values: (0..rows * groups)
                        .map(|j| scale(j % groups, j / groups))
                        .collect(),
                });
                packed.push(Ck {
                    name: format!("{base}.weight_shape"),
                    dtype: Dtype::I32,
                    shape: vec![2],
                    values: vec![rows as f32, cols as f32],
                });
            }
        }
        let decoded: Vec<f32> = (0..rows * cols)
            .map(|k| {
                let (r, c) = (k / cols, k % cols);
                scale(c / 128, r) * (codes[k] as f32 - zero as f32)
            })
            .collect();
        twin.push(Ck::f32(&spec.name, &spec.shape, &decoded));
    }
    (packed, twin)
}
