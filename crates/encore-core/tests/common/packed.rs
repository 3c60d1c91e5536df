//! Checkpoints whose projections are packed in integers (GPTQ, AWQ, compressed-tensors'
//! pack-quantized) beside their dequantized twins, shared by the loader and
//! tensor-parallel tests.

use encore_core::model::config::ModelConfig;
use encore_core::model::weights;
use half::f16;
use safetensors::tensor::Dtype;

use super::checkpoint::{plain, values, Ck};

/// A packed 32-bit word as the f32 of the same bits (`Dtype::U32` writes its bits).
pub fn word(w: u32) -> f32 {
    f32::from_bits(w)
}

/// Which packing a test checkpoint uses.
#[derive(Clone, Copy)]
pub enum Scheme {
    /// GPTQ, zeros stored as v2 (`true`, with bf16 scales) or v1 (f16 scales) store them;
    /// `asym`: zero points that vary by row and group (`sym: false`).
    Gptq { v2: bool, asym: bool },
    /// compressed-tensors' pack-quantized, bf16 scales, the LM head packed too; `asym`:
    /// zero points in `weight_zero_point` (`symmetric: false`).
    PackQuantized { asym: bool },
    /// AutoAWQ's GEMM layout (4 bits, zero points, f16 scales).
    Awq,
}

/// A test checkpoint's scale of (group, row) among `rows`: a few significant bits, exact
/// in f16 and bf16 and times any 4-bit zero point in f16.
pub fn exact_scale(g: usize, r: usize, rows: usize) -> f32 {
    (8 + (g * rows + r) % 11) as f32 / 2048.0
}

/// The packed checkpoint (every projection packed in `bits`, groups of 128; GPTQ and AWQ
/// leave the LM head plain) and its twin (every tensor in f32, projections decoded: scale *
/// (code - zero), the zero 2^(bits - 1) unless the scheme has zero points). Codes, zeros
/// and scales are drawn from a seed; scales are [`exact_scale`]'s.
pub fn checkpoints(cfg: &ModelConfig, bits: u32, scheme: Scheme) -> (Vec<Ck>, Vec<Ck>) {
    checkpoints_scaled(cfg, bits, scheme, exact_scale)
}

/// [`checkpoints`] with the scale of (group, row, rows) from `scale` (rounded to f16).
pub fn checkpoints_scaled(
    cfg: &ModelConfig,
    bits: u32,
    scheme: Scheme,
    scale: fn(usize, usize, usize) -> f32,
) -> (Vec<Ck>, Vec<Ck>) {
    checkpoints_grouped(cfg, bits, scheme, scale, Some(128))
}

/// [`checkpoints_scaled`] with groups of `group` columns, or one group a row (`None`:
/// GPTQ's `group_size: -1`, compressed-tensors' `strategy: "channel"`).
pub fn checkpoints_grouped(
    cfg: &ModelConfig,
    bits: u32,
    scheme: Scheme,
    scale: fn(usize, usize, usize) -> f32,
    group: Option<usize>,
) -> (Vec<Ck>, Vec<Ck>) {
    checkpoints_ordered(cfg, bits, scheme, scale, group, None)
}

/// Each input column's group of a projection (`name`, `cols` columns, groups of `group`):
/// GPTQ's `g_idx` in activation order.
pub type GroupOrder = fn(name: &str, cols: usize, group: usize) -> Vec<usize>;

/// [`checkpoints_grouped`] with each projection's column groups from `order` (GPTQ's
/// `desc_act`: `g_idx` in activation order, the twin decoded by it); `None`: column order.
pub fn checkpoints_ordered(
    cfg: &ModelConfig,
    bits: u32,
    scheme: Scheme,
    scale: fn(usize, usize, usize) -> f32,
    group: Option<usize>,
    order: Option<GroupOrder>,
) -> (Vec<Ck>, Vec<Ck>) {
    let (mut packed, mut twin) = (Vec::new(), Vec::new());
    let per_word = (32 / bits) as usize;
    let gptq = matches!(scheme, Scheme::Gptq { .. } | Scheme::Awq);
    let asym = matches!(
        scheme,
        Scheme::Gptq { asym: true, .. } | Scheme::Awq | Scheme::PackQuantized { asym: true }
    );
    let top = 1u32 << bits;
    // The zero point of (group, row).
    let zero = |g: usize, r: usize| match asym {
        true => ((g * 7 + r * 3) as u32) % top,
        false => top / 2,
    };
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
        let group = group.unwrap_or(cols);
        let groups = cols / group;
        let g_idx: Vec<usize> = match order {
            Some(f) => f(&spec.name, cols, group),
            None => (0..cols).map(|c| c / group).collect(),
        };
        // `values` lie in about [-1, 1]: spread them over the codes.
        let codes: Vec<u32> = v
            .iter()
            .map(|&x| (((x + 1.0) * 0.5 * top as f32) as u32).min(top - 1))
            .collect();
        // Scales by (group, row), in f16.
        let scale = |g: usize, r: usize| f16::from_f32(scale(g, r, rows)).to_f32();
        let base = spec.name.strip_suffix(".weight").unwrap();
        let w32 = |name: &str, shape: &[usize], w: &[u32]| Ck {
            name: format!("{base}.{name}"),
            dtype: Dtype::U32,
            shape: shape.to_vec(),
            values: w.iter().map(|&x| word(x)).collect(),
        };
        match scheme {
            Scheme::Gptq { v2, .. } => {
                // v1 stores each zero minus one, modulo 2^bits.
                let stored_zero = |g: usize, r: usize| (zero(g, r) + top - (!v2) as u32) % top;
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
                            stored_zero(g, r) << (bits as usize * (r % per_word));
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
                    values: g_idx.iter().map(|&g| g as f32).collect(),
                });
            }
            Scheme::Awq => {
                const ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
                let ow = rows / 8;
                // Line i's word j: outputs 8j + ORDER[s] of line i, slot s.
                let pack = |lines: usize, v: &dyn Fn(usize, usize) -> u32| -> Vec<u32> {
                    (0..lines * ow)
                        .map(|k| {
                            let (i, j) = (k / ow, k % ow);
                            ORDER
                                .iter()
                                .enumerate()
                                .fold(0, |acc, (s, &o)| acc | v(i, 8 * j + o) << (4 * s))
                        })
                        .collect()
                };
                let qweight = pack(cols, &|c, out| codes[out * cols + c]);
                let qzeros = pack(groups, &|g, out| zero(g, out));
                packed.push(w32("qweight", &[cols, ow], &qweight));
                packed.push(w32("qzeros", &[groups, ow], &qzeros));
                packed.push(Ck {
                    name: format!("{base}.scales"),
                    dtype: Dtype::F16,
                    shape: vec![groups, rows],
                    values: (0..groups * rows)
                        .map(|j| scale(j / rows, j % rows))
                        .collect(),
                });
            }
            Scheme::PackQuantized { .. } => {
                let wpr = cols / per_word;
                if asym {
                    let zr = rows.div_ceil(per_word);
                    let mut zp = vec![0u32; zr * groups];
                    for r in 0..rows {
                        for g in 0..groups {
                            zp[(r / per_word) * groups + g] |=
                                zero(g, r) << (bits as usize * (r % per_word));
                        }
                    }
                    packed.push(w32("weight_zero_point", &[zr, groups], &zp));
                }
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
                scale(g_idx[c], r) * (codes[k] as f32 - zero(g_idx[c], r) as f32)
            })
            .collect();
        twin.push(Ck::f32(&spec.name, &spec.shape, &decoded));
    }
    (packed, twin)
}
