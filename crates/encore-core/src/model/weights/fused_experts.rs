//! gpt-oss's fused expert tensors read as one tensor an expert: a layer's
//! `mlp.experts.gate_up_proj` `[E, hidden, 2 I]` (gate and up interleaved along the last
//! dimension: `[..., ::2]` is gate, `[..., 1::2]` up, transformers' `GptOssExperts`),
//! `gate_up_proj_bias` `[E, 2 I]`, `down_proj` `[E, I, hidden]` and `down_proj_bias`
//! `[E, hidden]` stand for the per-expert names the declaration gives the stacks
//! (`mlp.experts.{x}.gate_proj.weight` `[I, hidden]`, `up_proj`, `down_proj` `[hidden,
//! I]`, and their `.bias`), each a transposed and de-interleaved block of its expert,
//! converted on the host when it is read.
//!
//! The published checkpoints (`quantization_config.quant_method: "mxfp4"`) store the two
//! matrices as MXFP4 instead: `gate_up_proj_blocks` `[E, 2 I, hidden / 32, 16]` and
//! `gate_up_proj_scales` `[E, 2 I, hidden / 32]` (uint8; row `r` of the expert's `[2 I,
//! hidden]` matrix quantized along hidden, gate and up interleaved by rows: gate row j is
//! row 2 j, up row j is 2 j + 1), `down_proj_blocks` `[E, hidden, I / 32, 16]` and
//! `down_proj_scales` `[E, hidden, I / 32]` (already `[hidden, I]`, no transpose).
//! [`FusedExperts::mxfp4_rows`] gives a per-expert name's rows as MXFP4 device rows
//! (`encore_backend::quant::mxfp4::hf_row`: transformers' nibble order repacked), and
//! [`FusedExperts::read_f32`] their decoded values (any other storage format).

use std::collections::{HashMap, HashSet};

use encore_backend::quant::{self, mxfp4, QuantFormat};
use safetensors::Dtype;

use super::checkpoint::{dtype_of, Checkpoint};
use super::host;
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use crate::tensor::DType;

/// Which part of an expert's block of a fused tensor a per-expert name reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pick {
    /// Columns `offset, offset + 2, ...` of the expert's `[hidden, 2 I]` matrix,
    /// transposed: `[I, hidden]` (gate: offset 0, up: 1).
    GateUp(usize),
    /// Elements `offset, offset + 2, ...` of the expert's `[2 I]` bias row.
    GateUpBias(usize),
    /// The expert's `[I, hidden]` matrix transposed: `[hidden, I]`.
    Down,
    /// The expert's `[hidden]` bias row.
    DownBias,
}

/// One per-expert tensor of a fused one.
#[derive(Clone, Debug)]
struct Part {
    /// The fused tensor's name.
    source: String,
    expert: usize,
    pick: Pick,
    /// Its shape as the declaration gives it.
    shape: Vec<usize>,
    /// The source is MXFP4 blocks (`*_blocks`) with these scales (`*_scales`).
    scales: Option<String>,
}

/// The per-expert names a checkpoint's fused expert tensors stand for.
#[derive(Default)]
pub(super) struct FusedExperts {
    parts: HashMap<String, Part>,
    /// Every fused tensor some part reads (MXFP4 scales included).
    sources: HashSet<String>,
}

impl FusedExperts {
    /// Every layer's fused expert tensors of `ck` (those it holds; a missing one is
    /// reported by name as the declaration's per-expert names are checked), each checked
    /// for the config's shape.
    pub(super) fn of(ck: &Checkpoint, cfg: &ModelConfig) -> Result<FusedExperts> {
        let Some(moe) = &cfg.moe else {
            return Ok(FusedExperts::default());
        };
        let (e, i, h) = (moe.num_experts, moe.expert_intermediate, cfg.hidden_size);
        let mut parts = HashMap::new();
        let mut sources = HashSet::new();
        let shape_err = |tensor: String, found: &[usize], shape: &[usize]| Error::Weights {
            tensor,
            what: format!("has shape {found:?}, expected {shape:?}"),
        };
        for l in 0..cfg.num_layers {
            let base = format!("model.layers.{l}.mlp.experts.");
            let fused: [(&str, Vec<usize>); 6] = [
                ("gate_up_proj", vec![e, h, 2 * i]),
                ("gate_up_proj_bias", vec![e, 2 * i]),
                ("down_proj", vec![e, i, h]),
                ("down_proj_bias", vec![e, h]),
                ("gate_up_proj_blocks", vec![e, 2 * i, h / 32, 16]),
                ("down_proj_blocks", vec![e, h, i / 32, 16]),
            ];
            for (name, shape) in fused {
                let source = format!("{base}{name}");
                let Some((dtype, found, _)) = ck.raw(&source) else {
                    continue;
                };
                let scales = match name.strip_suffix("_blocks") {
                    Some(stem) => {
                        let k = if stem == "gate_up_proj" { h } else { i };
                        if !k.is_multiple_of(32) {
                            return Err(Error::Weights {
                                tensor: source,
                                what: format!(
                                    "is MXFP4 over rows of {k} values, not whole blocks of 32"
                                ),
                            });
                        }
                        let scales = format!("{base}{stem}_scales");
                        let want = &shape[..3];
                        match ck.raw(&scales) {
                            None => {
                                return Err(Error::Weights {
                                    tensor: scales,
                                    what: format!("is missing (the scales of {source})"),
                                })
                            }
                            Some((d, _, _)) if d != Dtype::U8 => {
                                return Err(Error::Weights {
                                    tensor: scales,
                                    what: format!("has dtype {d:?}, expected U8 (E8M0)"),
                                })
                            }
                            Some((_, f, _)) if f != want => {
                                return Err(shape_err(scales, &f, want))
                            }
                            Some(_) => {}
                        }
                        if dtype != Dtype::U8 {
                            return Err(Error::Weights {
                                tensor: source,
                                what: format!("has dtype {dtype:?}, expected U8 (MXFP4)"),
                            });
                        }
                        sources.insert(scales.clone());
                        Some(scales)
                    }
                    None => {
                        if dtype_of(dtype).is_none() {
                            return Err(Error::Weights {
                                tensor: source,
                                what: format!("has dtype {dtype:?}, expected BF16, F16 or F32"),
                            });
                        }
                        None
                    }
                };
                if found != shape {
                    return Err(shape_err(source, &found, &shape));
                }
                sources.insert(source.clone());
                for x in 0..e {
                    let mut add = |w: &str, kind: &str, pick: Pick, shape: Vec<usize>| {
                        let part = Part {
                            source: source.clone(),
                            expert: x,
                            pick,
                            shape,
                            scales: scales.clone(),
                        };
                        parts.insert(format!("{base}{x}.{w}.{kind}"), part);
                    };
                    match name {
                        "gate_up_proj" | "gate_up_proj_blocks" => {
                            add("gate_proj", "weight", Pick::GateUp(0), vec![i, h]);
                            add("up_proj", "weight", Pick::GateUp(1), vec![i, h]);
                        }
                        "gate_up_proj_bias" => {
                            add("gate_proj", "bias", Pick::GateUpBias(0), vec![i]);
                            add("up_proj", "bias", Pick::GateUpBias(1), vec![i]);
                        }
                        "down_proj" | "down_proj_blocks" => {
                            add("down_proj", "weight", Pick::Down, vec![h, i])
                        }
                        _ => add("down_proj", "bias", Pick::DownBias, vec![h]),
                    }
                }
            }
        }
        Ok(FusedExperts { parts, sources })
    }

    /// The MXFP4 device rows (`encore_backend::quant`'s layout) of a per-expert weight
    /// stored as MXFP4 blocks (`None`: not one).
    pub(super) fn mxfp4_rows(&self, ck: &Checkpoint, name: &str) -> Result<Option<Vec<u8>>> {
        let Some(p) = self.parts.get(name) else {
            return Ok(None);
        };
        let Some(scales_name) = &p.scales else {
            return Ok(None);
        };
        let missing = |t: &str| Error::Weights {
            tensor: t.to_string(),
            what: "is missing".into(),
        };
        let (_, shape, blocks) = ck.raw(&p.source).ok_or_else(|| missing(&p.source))?;
        let (_, _, scales) = ck.raw(scales_name).ok_or_else(|| missing(scales_name))?;
        // The expert's [R, G] groups of its matrix, R = 2 I (gate/up) or hidden (down).
        let (r_all, g) = (shape[1], shape[2]);
        let rows: Vec<usize> = match p.pick {
            Pick::GateUp(offset) => (offset..r_all).step_by(2).collect(),
            Pick::Down => (0..r_all).collect(),
            Pick::GateUpBias(_) | Pick::DownBias => return Ok(None),
        };
        let rb = QuantFormat::Mxfp4
            .row_bytes(32 * g)
            .expect("checked: whole blocks");
        let mut out = vec![0u8; rows.len() * rb];
        for (o, &r) in out.chunks_exact_mut(rb).zip(&rows) {
            let row = p.expert * r_all + r;
            mxfp4::hf_row(
                &blocks[row * g * 16..(row + 1) * g * 16],
                &scales[row * g..(row + 1) * g],
                o,
            );
        }
        Ok(Some(out))
    }

    /// The shape of a per-expert name (`None`: not one of a fused tensor's).
    pub(super) fn shape(&self, name: &str) -> Option<&[usize]> {
        self.parts.get(name).map(|p| p.shape.as_slice())
    }

    /// Whether `name` is a fused tensor some per-expert name reads.
    pub(super) fn is_source(&self, name: &str) -> bool {
        self.sources.contains(name)
    }

    /// The values of a per-expert name, row-major in its declared shape (`None`: not one
    /// of a fused tensor's).
    pub(super) fn read_f32(&self, ck: &Checkpoint, name: &str) -> Result<Option<Vec<f32>>> {
        let Some(p) = self.parts.get(name) else {
            return Ok(None);
        };
        if let Some(rows) = self.mxfp4_rows(ck, name)? {
            // MXFP4 blocks: their exact values.
            let k = p.shape[1];
            let rb = QuantFormat::Mxfp4
                .row_bytes(k)
                .expect("checked: whole blocks");
            let mut out = vec![0f32; rows.len() / rb * k];
            for (o, row) in out.chunks_exact_mut(k).zip(rows.chunks_exact(rb)) {
                quant::dequantize_row(QuantFormat::Mxfp4, row, o);
            }
            return Ok(Some(out));
        }
        let (dtype, shape, bytes) = ck.raw(&p.source).ok_or_else(|| Error::Weights {
            tensor: p.source.clone(),
            what: "is missing".into(),
        })?;
        let dtype: DType = dtype_of(dtype).expect("checked when the parts were made");
        // The expert's block: its rows of the fused tensor.
        let per_expert: usize = shape[1..].iter().product();
        let size = dtype.size();
        let block = &bytes[p.expert * per_expert * size..(p.expert + 1) * per_expert * size];
        let v = host::to_f32(block, dtype);
        Ok(Some(match p.pick {
            Pick::GateUp(offset) => {
                // [hidden, 2 I] -> [I, hidden] of columns offset, offset + 2, ...
                let (h, two_i) = (shape[1], shape[2]);
                let i = two_i / 2;
                let mut out = vec![0f32; i * h];
                for r in 0..h {
                    for j in 0..i {
                        out[j * h + r] = v[r * two_i + 2 * j + offset];
                    }
                }
                out
            }
            Pick::GateUpBias(offset) => v.iter().skip(offset).step_by(2).copied().collect(),
            Pick::Down => {
                // [I, hidden] -> [hidden, I].
                let (i, h) = (shape[1], shape[2]);
                let mut out = vec![0f32; h * i];
                for j in 0..i {
                    for r in 0..h {
                        out[r * i + j] = v[j * h + r];
                    }
                }
                out
            }
            Pick::DownBias => v,
        }))
    }
}
