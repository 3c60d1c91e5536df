//! GGUF tensors as the HF tensors the loader asks for: llama.cpp's names mapped to HF's
//! (the mapping is declared beside the tensors, [`crate::model::decl::Role::sources`]),
//! shapes checked (GGUF dims are reversed), values dequantized to f32 and, for
//! architecture `llama`, q/k rows put back in HF order.

use std::collections::HashSet;

use super::config::{gguf_arch, ROPE_FREQS};
use super::reader::{GgufFile, TensorInfo};
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use crate::model::decl::TensorSpec;
pub use crate::model::decl::{gguf_name, gguf_source, gguf_source_of};
use crate::model::formats::WeightFormats;
use encore_backend::quant::QuantFormat;

/// The formats a GGUF file keeps on the device for `cfg`: each projection whose parts the
/// file stores in one block format encore runs (a merged q/k/v whose v is Q6_K beside Q4_K
/// q and k, as Q4_K_M files store some layers, is dequantized instead).
pub fn stored_formats(file: &GgufFile, cfg: &ModelConfig) -> WeightFormats {
    let mut formats = WeightFormats::default();
    let mut plain = cfg.clone();
    plain.weights = WeightFormats::default();
    for t in plain.decl().tensors() {
        if !t.role.is_projection() {
            continue;
        }
        let types: Vec<Option<QuantFormat>> = t
            .parts
            .iter()
            .map(|p| {
                let info = gguf_source_of(&p.name, post_norm_names(cfg))
                    .and_then(|(n, _)| file.tensor(&n));
                info.and_then(|i| i.ggml_type.quant_format())
            })
            .collect();
        if let Some(Some(f)) = types.first() {
            if types.iter().all(|x| *x == Some(*f)) {
                formats.per_tensor.insert(t.name(), *f);
            }
        }
    }
    formats
}

/// Whether HF's `post_attention_layernorm` is llama.cpp's `post_attention_norm`: Gemma's
/// post norms, and gpt-oss's MLP input norm (llama.cpp's `gpt-oss` names it so).
fn post_norm_names(cfg: &ModelConfig) -> bool {
    cfg.post_norms || cfg.arch.family().sinks
}

/// A GGUF file serving HF tensors.
pub struct GgufWeights {
    file: GgufFile,
    /// Heads of q and of k whose rows llama.cpp interleaved (architecture `llama`).
    permuted_heads: Option<(usize, usize)>,
    /// Experts per stacked `*_exps` tensor (0 without experts).
    experts: usize,
    /// Gemma's post norms ([`gguf_source_of`]'s names).
    post_norms: bool,
}

impl GgufWeights {
    pub fn new(file: GgufFile, cfg: &ModelConfig) -> Result<GgufWeights> {
        let (_, arch) = gguf_arch(&file)?;
        let permuted_heads = arch.family().gguf_permuted_qk.then_some(cfg.whole_heads());
        Ok(GgufWeights {
            file,
            permuted_heads,
            experts: cfg.moe.as_ref().map_or(0, |m| m.num_experts),
            post_norms: post_norm_names(cfg),
        })
    }

    /// The GGUF tensor holding HF tensor `spec` and its bytes (one expert's slice of a
    /// stacked tensor), after checking the tensor's shape: `spec`'s, `[experts, ..spec]`
    /// for an expert, or `spec`'s without a leading 1 (llama.cpp stores Qwen2-MoE's
    /// `[1, hidden]` shared-expert gate as a vector).
    fn locate(&self, spec: &TensorSpec) -> Result<(String, &TensorInfo, &[u8])> {
        let (name, expert) = gguf_source_of(&spec.name, self.post_norms)
            .ok_or_else(|| self.err(&spec.name, "has no GGUF counterpart".into()))?;
        let info = self
            .file
            .tensor(&name)
            .ok_or_else(|| self.err(&spec.name, format!("is missing: no GGUF tensor `{name}`")))?;
        let shape = info.shape();
        let (fits, expected) = match expert {
            Some(x) => {
                let mut want = vec![self.experts];
                want.extend(&spec.shape);
                (shape == want && x < self.experts, want)
            }
            None => {
                let flat = spec.shape.first() == Some(&1) && shape == spec.shape[1..];
                (shape == spec.shape || flat, spec.shape.clone())
            }
        };
        if !fits {
            let whose = expert.map_or(String::new(), |x| format!(" (expert {x})"));
            return Err(self.err(
                &spec.name,
                format!(
                    "GGUF tensor `{name}`{whose} has dims {:?} (shape {shape:?}), expected \
                     shape {expected:?}",
                    info.dims
                ),
            ));
        }
        let bytes = self.file.tensor_bytes(info);
        let bytes = match expert {
            // Whole rows of whole blocks: each expert's slice is an equal share.
            Some(x) => {
                let each = bytes.len() / self.experts;
                &bytes[x * each..(x + 1) * each]
            }
            None => bytes,
        };
        Ok((name, info, bytes))
    }

    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    fn err(&self, hf: &str, what: String) -> Error {
        Error::Weights {
            tensor: hf.to_string(),
            what: format!("{what} (in `{}`)", self.file.path().display()),
        }
    }

    /// Check that every spec has its GGUF tensor with the right shape and a supported
    /// type, then that the file holds no tensor the config does not use; the first
    /// failure names the tensor (both names where there are two).
    pub fn validate(&self, specs: &[&TensorSpec]) -> Result<()> {
        let mut used = HashSet::new();
        for spec in specs {
            let (name, info, _) = self.locate(spec)?;
            if !info.ggml_type.is_supported() {
                return Err(Error::Weights {
                    tensor: name.clone(),
                    what: format!(
                        "(HF `{}`) has GGML type {}, which encore does not dequantize \
                         (supported: {}; in `{}`)",
                        spec.name,
                        info.ggml_type,
                        super::GgmlType::SUPPORTED.map(|t| t.name()).join(", "),
                        self.file.path().display()
                    ),
                });
            }
            used.insert(name);
        }
        let mut unused = Vec::new();
        for t in self.file.tensors() {
            let n = t.name.as_str();
            // The rotary's tensors are read into the config (Llama-3's divisors, LongRoPE's
            // factors).
            let rotary = [
                ROPE_FREQS,
                "rope_factors_long.weight",
                "rope_factors_short.weight",
            ];
            if used.contains(n) || rotary.contains(&n) || self.zero_output_bias(n)? {
                continue;
            }
            unused.push(n);
        }
        unused.sort_by_key(|n| crate::model::weights::natural_key(n));
        if let Some(name) = unused.first() {
            return Err(Error::Weights {
                tensor: name.to_string(),
                what: format!(
                    "is in `{}` but the config does not use it ({} unused tensors)",
                    self.file.path().display(),
                    unused.len()
                ),
            });
        }
        Ok(())
    }

    /// Whether `name` is an attention output bias of zeros, which encore may ignore
    /// (llama.cpp writes one for "llamafied" Qwen files); a non-zero one is an error,
    /// as encore does not apply an `o_proj` bias.
    fn zero_output_bias(&self, name: &str) -> Result<bool> {
        if !(name.starts_with("blk.") && name.ends_with(".attn_output.bias")) {
            return Ok(false);
        }
        if self.file.tensor_f32(name)?.iter().any(|&x| x != 0.0) {
            return Err(Error::Weights {
                tensor: name.to_string(),
                what: format!(
                    "is not all zeros, and encore does not apply an attention output bias \
                     (in `{}`)",
                    self.file.path().display()
                ),
            });
        }
        Ok(true)
    }

    /// The values of HF tensor `spec` in HF layout, as f32.
    pub fn tensor_f32(&self, spec: &TensorSpec) -> Result<Vec<f32>> {
        let (name, info, bytes) = self.locate(spec)?;
        let mut values = vec![0f32; spec.numel()];
        super::quants::dequantize(info.ggml_type, bytes, &mut values)
            .map_err(|what| self.err(&spec.name, format!("GGUF tensor `{name}`: {what}")))?;
        let heads = match self.permuted_heads {
            Some((q, _)) if spec.name.contains(".q_proj.") => q,
            Some((_, k)) if spec.name.contains(".k_proj.") => k,
            _ => return Ok(values),
        };
        Ok(unpermute_rows(&values, spec.shape[0], heads))
    }
}

impl GgufWeights {
    /// The file's own blocks of HF tensor `spec` in HF row order, when the file stores it
    /// in the block format `fmt` (`None` when it stores another type: the caller decodes
    /// and quantizes).
    pub fn tensor_blocks(&self, spec: &TensorSpec, fmt: QuantFormat) -> Result<Option<Vec<u8>>> {
        let (_, info, bytes) = self.locate(spec)?;
        if info.ggml_type.quant_format() != Some(fmt) {
            return Ok(None);
        }
        let rows = spec.shape[0];
        let heads = match self.permuted_heads {
            Some((q, _)) if spec.name.contains(".q_proj.") => q,
            Some((_, k)) if spec.name.contains(".k_proj.") => k,
            _ => return Ok(Some(bytes.to_vec())),
        };
        Ok(Some(unpermute_rows(bytes, rows, heads)))
    }
}

/// Undo llama.cpp's q/k permutation. Its converter reorders each head's `head_dim` rows
/// from HF's rotate-half layout (first half, then second half of the rotary pairs) to
/// interleaved pairs: GGUF row `2j + i` of a head is HF row `i * head_dim / 2 + j`. Works
/// for weights (`rows x cols`) and biases (`cols = 1`).
pub fn unpermute_rows<T: Copy + Default>(values: &[T], rows: usize, heads: usize) -> Vec<T> {
    let cols = values.len() / rows.max(1);
    let head_dim = rows / heads.max(1);
    let half = head_dim / 2;
    let mut out = vec![T::default(); values.len()];
    for (r, dst) in out.chunks_exact_mut(cols).enumerate() {
        let (h, within) = (r / head_dim, r % head_dim);
        let (i, j) = (within / half, within % half);
        let src = h * head_dim + 2 * j + i;
        dst.copy_from_slice(&values[src * cols..(src + 1) * cols]);
    }
    out
}
