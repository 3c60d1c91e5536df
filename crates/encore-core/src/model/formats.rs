//! How a model's weights are stored on the device: [`WeightFormats`], part of the
//! [`crate::model::config::ModelConfig`] (so every byte count derived from the config's
//! declaration, [`crate::model::decl::Decl`], counts the stored bytes), and
//! [`Quantization`], the `--quantization` choice that sets it.

use std::collections::BTreeMap;

use encore_backend::quant::QuantFormat;

/// The quantized device tensors of a model; every tensor not named is dense, in the run
/// dtype. Embeddings and norms are always dense (the embedding lookup and the norms read
/// elements); the projections (q/k/v, o, gate/up, down and an untied LM head) may be
/// quantized.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WeightFormats {
    /// The format of every projection not in `per_tensor` (in-situ quantization).
    pub projections: Option<QuantFormat>,
    /// By device tensor name (`model.layers.0.self_attn.qkv_proj`, `lm_head`): the
    /// formats a GGUF file stores.
    pub per_tensor: BTreeMap<String, QuantFormat>,
    /// How a GPTQ checkpoint packs its projections (`None`: not GPTQ). Kept by every
    /// `--quantization` choice: it says how to read the file, not how to store it.
    pub gptq: Option<GptqFormat>,
}

/// A GPTQ checkpoint's packing (`quantization_config.quant_method = "gptq"`): each
/// projection `P` as `P.qweight` (int32 `[k * bits / 32, n]`, values packed along k, low
/// bits first), `P.scales` (f16 `[groups, n]`), `P.qzeros` (int32 `[groups, n * bits /
/// 32]`) and `P.g_idx` (int32 `[k]`, optional), the value at (row j, column c) being
/// `scales[g, j] * (q - zero[g, j])` with g = c's group. encore runs the symmetric
/// packings of whole groups in order (zero = 2^(bits - 1) everywhere, groups of a multiple
/// of 32 columns, `desc_act` false), which are exactly GGUF's Q4_0 (4 bits) and Q8_0 (8
/// bits) blocks: kept in those bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GptqFormat {
    /// 4 or 8.
    pub bits: u32,
    /// Columns a group of one scale (`group_size`; `None`: -1, a scale a row).
    pub group_size: Option<usize>,
    /// `checkpoint_format = "gptq"` (v1) stores each zero minus one; `"gptq_v2"` as is.
    pub zeros_minus_one: bool,
    /// `lm_head = true`: the LM head is packed too (else it is a plain `lm_head.weight`,
    /// kept dense).
    pub lm_head: bool,
}

impl GptqFormat {
    /// The block format the projections are kept in.
    pub fn kept_as(&self) -> QuantFormat {
        match self.bits {
            4 => QuantFormat::Q4_0,
            _ => QuantFormat::Q8_0,
        }
    }
}

impl WeightFormats {
    /// The format of projection `name`, `None` for dense.
    pub fn projection(&self, name: &str) -> Option<QuantFormat> {
        match (self.per_tensor.get(name), self.gptq) {
            (Some(f), _) => Some(*f),
            // A GPTQ checkpoint's LM head is stored plainly unless it says otherwise.
            (None, Some(g)) if name == "lm_head" && !g.lm_head => None,
            (None, _) => self.projections,
        }
    }

    pub fn is_dense(&self) -> bool {
        self.projections.is_none() && self.per_tensor.is_empty()
    }
}

/// What `--quantization` asks of the weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Quantization {
    /// Keep what the checkpoint stores: a GGUF file's block formats stay quantized on the
    /// device; dense checkpoints stay dense.
    #[default]
    Auto,
    /// Decode everything to the run dtype at load (the dense path).
    None,
    /// Quantize every projection to this format at load.
    To(QuantFormat),
}

impl Quantization {
    /// The formats `--quantization` takes for in-situ quantization.
    pub const IN_SITU: [QuantFormat; 3] =
        [QuantFormat::F8E4M3, QuantFormat::Q8_0, QuantFormat::Q4K];

    /// Parse `auto`, `none` or a format name (`fp8`, `q8_0`, `q4_k`, or any other block
    /// format encore runs).
    pub fn parse(s: &str) -> Result<Quantization, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Quantization::Auto),
            "none" => Ok(Quantization::None),
            other => QuantFormat::parse(other)
                .map(Quantization::To)
                .ok_or_else(|| {
                    format!(
                        "unknown quantization `{s}`: expected auto, none, {}",
                        QuantFormat::ALL.map(QuantFormat::name).join(", ")
                    )
                }),
        }
    }
}

impl std::fmt::Display for Quantization {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Quantization::Auto => f.write_str("auto"),
            Quantization::None => f.write_str("none"),
            Quantization::To(q) => f.write_str(q.name()),
        }
    }
}
