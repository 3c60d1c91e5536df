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
    /// The format of the routed experts' stacks (`mlp.experts.gate_up_proj`,
    /// `mlp.experts.down_proj`), before `projections`: MXFP4 checkpoints
    /// (`quant_method: "mxfp4"`, gpt-oss) and `--quantization mxfp4` keep the experts in
    /// MXFP4 and every other projection dense.
    pub experts: Option<QuantFormat>,
    /// By device tensor name (`model.layers.0.self_attn.qkv_proj`, `lm_head`): the
    /// formats a GGUF file stores.
    pub per_tensor: BTreeMap<String, QuantFormat>,
    /// How a GPTQ, AWQ or compressed-tensors checkpoint packs its projections in integers
    /// (`None`: it does not). Kept by every `--quantization` choice: it says how to read
    /// the file, not how to store it.
    pub int_packing: Option<IntPacking>,
    /// The checkpoint keeps its LM head unquantized beside quantized projections
    /// (compressed-tensors' `ignore: ["lm_head"]` over FP8 weights): it stays dense.
    pub dense_lm_head: bool,
    /// Projections whose rows the format cannot hold in whole blocks stay dense (decoded
    /// at load) instead of being refused: an FP8 checkpoint's partial 128-value blocks
    /// (an MLP of 344, a hidden size of 576), whose published scale grids are
    /// ceil-divided.
    pub dense_partial_blocks: bool,
}

/// A checkpoint whose projections are integers of `bits` with one f16 / bf16 scale per row
/// and group of columns, groups in column order: symmetric (the value is `scale * (u -
/// 2^(bits - 1))` for the stored unsigned `u`), exactly GGUF's Q4_0 (4 bits) and Q8_0 (8
/// bits) blocks, or with a zero point `z` per row and group (`scale * (u - z)`, 4 bits),
/// kept as Q4_1 blocks (`d = scale`, `m = -scale * z` rounded to f16: exact when the
/// product has at most 11 significant bits, else within half an f16 ulp of it, under 1%
/// of a step). Groups in activation order (GPTQ's `desc_act`: [`IntPacking::act_order`])
/// load with each dense layer's projection's input columns sorted by group; with one group
/// a row the order does not matter and they load as they are (g_idx checked to say so).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntPacking {
    /// 4 or 8.
    pub bits: u32,
    /// Columns a group of one scale (`None`: a scale a row).
    pub group_size: Option<usize>,
    pub scheme: IntScheme,
    /// Zero points per row and group are read from the file (asymmetric, 4 bits only);
    /// otherwise every zero must be the symmetric `2^(bits - 1)`.
    pub zero_points: bool,
    /// The LM head is packed too (else it is a plain `lm_head.weight`, kept dense).
    pub lm_head: bool,
    /// GPTQ's `desc_act` with groups: input column `k` of a projection is in group
    /// `g_idx[k]`, groups not contiguous. At load each dense layer's q/k/v, o, gate/up and
    /// down weight has its input columns sorted by group (a stable sort, `perm`; every
    /// group's member count a multiple of 32, each block within one group) and the layer
    /// holds the permutation ([`crate::model::decl::Role::QkvPerm`] ..); the forward
    /// gathers the activation's columns by it before the matmul (`y = W[:, perm] ·
    /// x[perm]`). Other projections (experts, the LM head) must have g_idx in column order.
    pub act_order: bool,
}

/// Where an [`IntPacking`] keeps its integers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntScheme {
    /// `quant_method = "gptq"`: projection `P` as `P.qweight` (int32 `[in * bits / 32,
    /// out]`, packed along the input dimension, low bits first), `P.scales` (f16
    /// `[groups, out]`), `P.qzeros` (int32 `[groups, out * bits / 32]`, every one the
    /// symmetric zero; v1, `checkpoint_format = "gptq"`, stores each zero minus one) and
    /// `P.g_idx` (int32 `[in]`, optional).
    Gptq { zeros_minus_one: bool },
    /// `quant_method = "compressed-tensors"`, `format = "pack-quantized"` (llm-compressor's
    /// W4A16 / W8A16): `P.weight_packed` (int32 `[out, in * bits / 32]`, each row packed
    /// along its columns, low bits first), `P.weight_scale` (`[out, groups]`) and
    /// `P.weight_shape` (`[out, in]`); with zero points `P.weight_zero_point` (int32
    /// `[out * bits / 32, groups]`, packed along the output dimension).
    PackQuantized,
    /// `quant_method = "awq"`, `version = "gemm"` (AutoAWQ's GEMM layout, 4 bits, zero
    /// points): `P.qweight` (int32 `[in, out / 8]`, packed along the output dimension in
    /// the order 0, 2, 4, 6, 1, 3, 5, 7), `P.qzeros` (int32 `[groups, out / 8]`, packed
    /// the same) and `P.scales` (f16 `[groups, out]`).
    Awq,
}

impl IntPacking {
    /// The block format the projections are kept in (exactly their values).
    pub fn kept_as(&self) -> QuantFormat {
        match (self.bits, self.zero_points) {
            (4, true) => QuantFormat::Q4_1,
            (4, false) => QuantFormat::Q4_0,
            _ => QuantFormat::Q8_0,
        }
    }
}

impl IntScheme {
    /// The tensor that holds projection `base`'s packed integers (`base.qweight`,
    /// `base.weight_packed`), and the scheme's name for messages.
    pub fn packed_tensor(&self, base: &str) -> (String, &'static str) {
        match self {
            IntScheme::Gptq { .. } => (format!("{base}.qweight"), "GPTQ"),
            IntScheme::PackQuantized => (format!("{base}.weight_packed"), "pack-quantized"),
            IntScheme::Awq => (format!("{base}.qweight"), "AWQ"),
        }
    }
}

impl WeightFormats {
    /// The format of projection `name`, `None` for dense.
    pub fn projection(&self, name: &str) -> Option<QuantFormat> {
        let expert_stack =
            name.ends_with(".mlp.experts.gate_up_proj") || name.ends_with(".mlp.experts.down_proj");
        match (self.per_tensor.get(name), self.int_packing) {
            (Some(f), _) => Some(*f),
            (None, _) if expert_stack && self.experts.is_some() => self.experts,
            // A packed checkpoint's LM head may be stored plainly (`IntPacking::lm_head`).
            (None, Some(g)) if name == "lm_head" && !g.lm_head => None,
            (None, _) if name == "lm_head" && self.dense_lm_head => None,
            (None, _) => self.projections,
        }
    }

    pub fn is_dense(&self) -> bool {
        self.projections.is_none() && self.experts.is_none() && self.per_tensor.is_empty()
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
    /// Quantize every projection to this format at load; MXFP4 quantizes a model's routed
    /// experts alone (every other projection stays dense, as gpt-oss is published), and
    /// every projection of a model without experts.
    To(QuantFormat),
}

impl Quantization {
    /// The formats `--quantization` takes for in-situ quantization.
    pub const IN_SITU: [QuantFormat; 4] = [
        QuantFormat::F8E4M3,
        QuantFormat::Q8_0,
        QuantFormat::Q4K,
        QuantFormat::Mxfp4,
    ];

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
