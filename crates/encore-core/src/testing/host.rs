//! Host-side helpers the checks need beyond `dyn Backend`'s: writing f32 data into a
//! tensor of any float dtype, reading one back as f64, and poisoning outputs.

use half::{bf16, f16};

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

/// Overwrite a float tensor with f32 values (rounded to its dtype).
pub(crate) fn write_f32(b: &dyn Backend, dst: &Tensor, data: &[f32]) -> Result<()> {
    crate::ops::check_len("write_f32", "data", data.len(), dst.numel())?;
    let bytes: Vec<u8> = match dst.dtype() {
        DType::BF16 => data
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
        DType::F16 => data
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        DType::F32 => bytemuck::cast_slice(data).to_vec(),
        other => return Err(not_float("write_f32", other)),
    };
    b.write_bytes(dst, &bytes)
}

/// A float tensor read back as f64 (exact: every float dtype widens exactly to f32).
pub(crate) fn download_f64(b: &dyn Backend, src: &Tensor) -> Result<Vec<f64>> {
    Ok(b.download_f32(src)?.into_iter().map(f64::from).collect())
}

/// Fill `t` with garbage an op must overwrite: NaN in every float dtype (the bytes
/// `c0 7f` repeated are a NaN as bf16, f16 and f32), -1 for integers.
pub(crate) fn poison(b: &dyn Backend, t: &Tensor) -> Result<()> {
    let bytes: Vec<u8> = if t.dtype().is_float() {
        [0xc0u8, 0x7f]
            .into_iter()
            .cycle()
            .take(t.size_bytes())
            .collect()
    } else {
        vec![0xff; t.size_bytes()]
    };
    b.write_bytes(t, &bytes)
}

fn not_float(op: &'static str, dtype: DType) -> Error {
    Error::DType {
        op,
        name: "dtype",
        found: dtype,
        expected: "a float dtype".into(),
    }
}
