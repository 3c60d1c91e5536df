//! gpt-oss's fused expert tensors read as one tensor an expert: a layer's
//! `mlp.experts.gate_up_proj` `[E, hidden, 2 I]` (gate and up interleaved along the last
//! dimension: `[..., ::2]` is gate, `[..., 1::2]` up, transformers' `GptOssExperts`),
//! `gate_up_proj_bias` `[E, 2 I]`, `down_proj` `[E, I, hidden]` and `down_proj_bias`
//! `[E, hidden]` stand for the per-expert names the declaration gives the stacks
//! (`mlp.experts.{x}.gate_proj.weight` `[I, hidden]`, `up_proj`, `down_proj` `[hidden,
//! I]`, and their `.bias`), each a transposed and de-interleaved block of its expert,
//! converted on the host when it is read.

use std::collections::HashMap;

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
}

/// The per-expert names a checkpoint's fused expert tensors stand for.
#[derive(Default)]
pub(super) struct FusedExperts {
    parts: HashMap<String, Part>,
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
        for l in 0..cfg.num_layers {
            let base = format!("model.layers.{l}.mlp.experts.");
            let fused: [(&str, Vec<usize>); 4] = [
                ("gate_up_proj", vec![e, h, 2 * i]),
                ("gate_up_proj_bias", vec![e, 2 * i]),
                ("down_proj", vec![e, i, h]),
                ("down_proj_bias", vec![e, h]),
            ];
            for (name, shape) in fused {
                let source = format!("{base}{name}");
                let Some((dtype, found, _)) = ck.raw(&source) else {
                    continue;
                };
                if found != shape {
                    return Err(Error::Weights {
                        tensor: source,
                        what: format!("has shape {found:?}, expected {shape:?}"),
                    });
                }
                if dtype_of(dtype).is_none() {
                    return Err(Error::Weights {
                        tensor: source,
                        what: format!("has dtype {dtype:?}, expected BF16, F16 or F32"),
                    });
                }
                for x in 0..e {
                    let mut add = |w: &str, kind: &str, pick: Pick, shape: Vec<usize>| {
                        let part = Part {
                            source: source.clone(),
                            expert: x,
                            pick,
                            shape,
                        };
                        parts.insert(format!("{base}{x}.{w}.{kind}"), part);
                    };
                    match name {
                        "gate_up_proj" => {
                            add("gate_proj", "weight", Pick::GateUp(0), vec![i, h]);
                            add("up_proj", "weight", Pick::GateUp(1), vec![i, h]);
                        }
                        "gate_up_proj_bias" => {
                            add("gate_proj", "bias", Pick::GateUpBias(0), vec![i]);
                            add("up_proj", "bias", Pick::GateUpBias(1), vec![i]);
                        }
                        "down_proj" => add("down_proj", "weight", Pick::Down, vec![h, i]),
                        _ => add("down_proj", "bias", Pick::DownBias, vec![h]),
                    }
                }
            }
        }
        Ok(FusedExperts { parts })
    }

    /// The shape of a per-expert name (`None`: not one of a fused tensor's).
    pub(super) fn shape(&self, name: &str) -> Option<&[usize]> {
        self.parts.get(name).map(|p| p.shape.as_slice())
    }

    /// Whether `name` is a fused tensor some per-expert name reads.
    pub(super) fn is_source(&self, name: &str) -> bool {
        self.parts.values().any(|p| p.source == name)
    }

    /// The values of a per-expert name, row-major in its declared shape (`None`: not one
    /// of a fused tensor's).
    pub(super) fn read_f32(&self, ck: &Checkpoint, name: &str) -> Result<Option<Vec<f32>>> {
        let Some(p) = self.parts.get(name) else {
            return Ok(None);
        };
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
