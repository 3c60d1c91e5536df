//! GGML tensor types and their dequantization to f32.
//!
//! Each supported type is a block of `block_elems` values stored in `block_bytes` bytes
//! (1 and the element size for the float types). The block types are
//! [`encore_backend::quant::QuantFormat`]s, whose decoders follow the block layouts of
//! ggml (`ggml-common.h`) and compute every value in the same order of f32 operations as
//! ggml's reference dequantizer and gguf-py's `quants.py`, so the results are
//! bit-identical to theirs (`tests/gguf/twins.rs` checks a fixture made by gguf-py).

use encore_backend::quant::{self, QuantFormat};
use half::{bf16, f16};
use rayon::prelude::*;

/// A GGML tensor type id (`ggml_type`), known or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

impl GgmlType {
    pub const F32: GgmlType = GgmlType(0);
    pub const F16: GgmlType = GgmlType(1);
    pub const Q4_0: GgmlType = GgmlType(2);
    pub const Q4_1: GgmlType = GgmlType(3);
    pub const Q5_0: GgmlType = GgmlType(6);
    pub const Q5_1: GgmlType = GgmlType(7);
    pub const Q8_0: GgmlType = GgmlType(8);
    pub const Q2_K: GgmlType = GgmlType(10);
    pub const Q4_K: GgmlType = GgmlType(12);
    pub const Q5_K: GgmlType = GgmlType(13);
    pub const Q6_K: GgmlType = GgmlType(14);
    pub const IQ2_XXS: GgmlType = GgmlType(16);
    pub const BF16: GgmlType = GgmlType(30);
    pub const MXFP4: GgmlType = GgmlType(39);

    /// The types encore dequantizes.
    pub const SUPPORTED: [GgmlType; 12] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::MXFP4,
    ];

    /// `(name, elements per block, bytes per block)` of every type ggml defines.
    fn info(self) -> Option<(&'static str, usize, usize)> {
        Some(match self.0 {
            0 => ("F32", 1, 4),
            1 => ("F16", 1, 2),
            2 => ("Q4_0", 32, 18),
            3 => ("Q4_1", 32, 20),
            6 => ("Q5_0", 32, 22),
            7 => ("Q5_1", 32, 24),
            8 => ("Q8_0", 32, 34),
            9 => ("Q8_1", 32, 40),
            10 => ("Q2_K", 256, 84),
            11 => ("Q3_K", 256, 110),
            12 => ("Q4_K", 256, 144),
            13 => ("Q5_K", 256, 176),
            14 => ("Q6_K", 256, 210),
            15 => ("Q8_K", 256, 292),
            16 => ("IQ2_XXS", 256, 66),
            17 => ("IQ2_XS", 256, 74),
            18 => ("IQ3_XXS", 256, 98),
            19 => ("IQ1_S", 256, 50),
            20 => ("IQ4_NL", 32, 18),
            21 => ("IQ3_S", 256, 110),
            22 => ("IQ2_S", 256, 82),
            23 => ("IQ4_XS", 256, 136),
            24 => ("I8", 1, 1),
            25 => ("I16", 1, 2),
            26 => ("I32", 1, 4),
            27 => ("I64", 1, 8),
            28 => ("F64", 1, 8),
            29 => ("IQ1_M", 256, 56),
            30 => ("BF16", 1, 2),
            34 => ("TQ1_0", 256, 54),
            35 => ("TQ2_0", 256, 66),
            39 => ("MXFP4", 32, 17),
            _ => return None,
        })
    }

    /// The ggml name (`Q4_K`, `IQ2_XXS`, ...), or `type N` for an id ggml does not define.
    pub fn name(self) -> String {
        match self.info() {
            Some((name, _, _)) => name.to_string(),
            None => format!("type {}", self.0),
        }
    }

    /// `(elements, bytes)` of one block, `None` for an unknown id.
    pub fn block(self) -> Option<(usize, usize)> {
        self.info().map(|(_, e, b)| (e, b))
    }

    /// The block format of a quantized type (what the device keeps), `None` for the float
    /// types and the types encore does not run.
    pub fn quant_format(self) -> Option<QuantFormat> {
        Some(match self {
            GgmlType::Q8_0 => QuantFormat::Q8_0,
            GgmlType::Q4_0 => QuantFormat::Q4_0,
            GgmlType::Q4_1 => QuantFormat::Q4_1,
            GgmlType::Q5_0 => QuantFormat::Q5_0,
            GgmlType::Q5_1 => QuantFormat::Q5_1,
            GgmlType::Q4_K => QuantFormat::Q4K,
            GgmlType::Q5_K => QuantFormat::Q5K,
            GgmlType::Q6_K => QuantFormat::Q6K,
            GgmlType::MXFP4 => QuantFormat::Mxfp4,
            _ => return None,
        })
    }

    /// The GGML type of a block format (`None` for FP8, which GGUF does not define).
    pub fn of_format(fmt: QuantFormat) -> Option<GgmlType> {
        Self::SUPPORTED
            .into_iter()
            .find(|t| t.quant_format() == Some(fmt))
    }

    /// Whether [`dequantize`] decodes this type.
    pub fn is_supported(self) -> bool {
        Self::SUPPORTED.contains(&self)
    }

    /// Bytes of `n` elements (`None` when `n` is not a whole number of blocks or the id is
    /// unknown, or on overflow).
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let (e, b) = self.block()?;
        if !n.is_multiple_of(e as u64) {
            return None;
        }
        (n / e as u64).checked_mul(b as u64)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// Blocks per rayon task.
const TASK_BLOCKS: usize = 512;

/// Decode `src` (whole blocks of `ty`) into `out`, in parallel. Errors (as text for the
/// caller to wrap with the tensor's name) when the type is unsupported or the sizes do
/// not match.
pub fn dequantize(ty: GgmlType, src: &[u8], out: &mut [f32]) -> Result<(), String> {
    let decode: &(dyn Fn(&[u8], &mut [f32]) + Sync) = match ty {
        GgmlType::F32 => &f32_block,
        GgmlType::F16 => &f16_block,
        GgmlType::BF16 => &bf16_block,
        other => match other.quant_format() {
            Some(fmt) => &move |b: &[u8], o: &mut [f32]| quant::decode_block(fmt, b, o),
            None => {
                return Err(format!(
                    "has GGML type {other}, which encore does not dequantize (supported: {})",
                    GgmlType::SUPPORTED.map(GgmlType::name).join(", ")
                ))
            }
        },
    };
    let (elems, bytes) = ty.block().ok_or("unknown type")?;
    if !out.len().is_multiple_of(elems) || src.len() != out.len() / elems * bytes {
        return Err(format!(
            "{} bytes of {ty} do not hold {} elements",
            src.len(),
            out.len()
        ));
    }
    // Float types have one-element "blocks": hand each task many of them at once.
    let (task_elems, task_bytes) = if elems == 1 {
        (TASK_BLOCKS * 64, TASK_BLOCKS * 64 * bytes)
    } else {
        (TASK_BLOCKS * elems, TASK_BLOCKS * bytes)
    };
    out.par_chunks_mut(task_elems)
        .zip(src.par_chunks(task_bytes))
        .for_each(|(out, src)| {
            if elems == 1 {
                decode(src, out);
            } else {
                for (o, s) in out.chunks_exact_mut(elems).zip(src.chunks_exact(bytes)) {
                    decode(s, o);
                }
            }
        });
    Ok(())
}

fn f32_block(src: &[u8], out: &mut [f32]) {
    for (o, s) in out.iter_mut().zip(src.chunks_exact(4)) {
        *o = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    }
}

fn f16_block(src: &[u8], out: &mut [f32]) {
    for (o, s) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = f16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32();
    }
}

fn bf16_block(src: &[u8], out: &mut [f32]) {
    for (o, s) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = bf16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32();
    }
}

/// f32 values (whole blocks) to ggml blocks of the quantized type `ty` (panics for a
/// float or unsupported type, or a partial block): the reference quantizers
/// [`quant::quantize_blocks`] (Q8_0, Q4_0 and Q4_1 exactly as ggml's reference).
pub fn quantize(ty: GgmlType, values: &[f32]) -> Vec<u8> {
    let fmt = ty
        .quant_format()
        .unwrap_or_else(|| panic!("quantize: {ty} is not a block format"));
    let mut out = Vec::with_capacity(values.len() / fmt.block_elems() * fmt.block_bytes());
    quant::quantize_blocks(fmt, values, &mut out);
    out
}

/// f32 values to Q8_0 blocks: `d = max|x| / 127`, `q = round(x / d)`.
pub fn quantize_q8_0(values: &[f32]) -> Vec<u8> {
    quantize(GgmlType::Q8_0, values)
}

/// f32 values to Q4_0 blocks: `d = x_max / -8`, `q = min(15, trunc(x / d + 8.5))`.
pub fn quantize_q4_0(values: &[f32]) -> Vec<u8> {
    quantize(GgmlType::Q4_0, values)
}

/// f32 values to Q4_1 blocks: `d = (max - min) / 15`, `q = min(15, trunc((x - min) / d + 0.5))`.
pub fn quantize_q4_1(values: &[f32]) -> Vec<u8> {
    quantize(GgmlType::Q4_1, values)
}
