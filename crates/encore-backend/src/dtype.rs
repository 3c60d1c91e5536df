//! Element types: [`DType`] (what a tensor stores) and [`Element`] (the Rust types that
//! map onto one).

use std::fmt;

pub use crate::quant::QuantFormat;

/// Element types encore stores: elements of a fixed size, or a block-quantized weight
/// format ([`DType::Q`], a matrix quantized along its rows; see [`crate::quant`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    BF16,
    F16,
    F32,
    I32,
    I64,
    /// FP8 E4M3 (OCP "fn": no infinities, `0x7F`/`0xFF` NaN), one byte an element: the
    /// storage of an FP8 KV cache (its values are the keys and values divided by a
    /// per-layer scale, [`crate::args::KvScale`]). No op computes in it.
    F8E4M3,
    Q(QuantFormat),
}

impl DType {
    /// Bytes of one element. A quantized format has no element size: ask
    /// [`DType::bytes`] for a tensor's size (ops admit quantized tensors only where they
    /// say so, so the kernels of element types never see one).
    pub const fn size(self) -> usize {
        match self {
            DType::F8E4M3 => 1,
            DType::BF16 | DType::F16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::I64 => 8,
            DType::Q(_) => panic!("a quantized dtype has no element size"),
        }
    }

    /// Bytes of a tensor of `shape` in this dtype: `numel * size` for element types; for
    /// a quantized format, rows of the last dimension at [`QuantFormat::row_bytes`].
    /// `None` when a quantized shape's rows are not whole blocks (or it has no
    /// dimension), or on overflow.
    pub fn bytes(self, shape: &[usize]) -> Option<usize> {
        match self {
            DType::Q(f) => {
                let (&k, rows) = shape.split_last()?;
                let rows = rows.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
                f.bytes(rows, k)
            }
            _ => shape.iter().try_fold(self.size(), |a, &d| a.checked_mul(d)),
        }
    }

    pub const fn is_quantized(self) -> bool {
        matches!(self, DType::Q(_))
    }

    pub const fn is_float(self) -> bool {
        matches!(self, DType::BF16 | DType::F16 | DType::F32)
    }

    /// The name used in kernel symbols (`rms_norm_bf16`, ...).
    pub const fn kernel_suffix(self) -> &'static str {
        match self {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F8E4M3 => "f8e4m3",
            DType::Q(f) => f.name(),
        }
    }

    /// Parse a float run dtype, in any case: `bf16`/`bfloat16`, `f16`/`fp16`/`float16`/
    /// `half`, `f32`/`fp32`/`float32`/`float`. Used by `--dtype` and by `config.json`'s
    /// `torch_dtype`, so both accept the same names.
    pub fn parse_float(s: &str) -> Option<DType> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" | "bfloat16" => Some(DType::BF16),
            "f16" | "fp16" | "float16" | "half" => Some(DType::F16),
            "f32" | "fp32" | "float32" | "float" => Some(DType::F32),
            _ => None,
        }
    }

    /// Whether a KV cache can store this dtype: a float dtype or [`DType::F8E4M3`].
    pub const fn is_kv_cache(self) -> bool {
        self.is_float() || matches!(self, DType::F8E4M3)
    }

    /// The names [`DType::parse_float`] accepts, for messages.
    pub const FLOAT_NAMES: &'static str =
        "bf16 (bfloat16), f16 (fp16, float16, half) or f32 (fp32, float32)";
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.kernel_suffix())
    }
}

/// Rust element types that map one-to-one onto a [`DType`].
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    const DTYPE: DType;
}
impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
}
impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for i32 {
    const DTYPE: DType = DType::I32;
}
impl Element for i64 {
    const DTYPE: DType = DType::I64;
}
