//! Host<->backend copies for `&dyn Backend` of any lifetime (the helpers on
//! `dyn Backend` need `'static`), and output poisoning.

use half::{bf16, f16};

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::tensor::{DType, Element, Tensor};

pub(crate) fn upload<T: Element>(b: &dyn Backend, data: &[T], shape: &[usize]) -> Result<Tensor> {
    let t = b.alloc(T::DTYPE, shape)?;
    crate::ops::check_len("upload", "data", data.len(), t.numel())?;
    b.write_bytes(&t, bytemuck::cast_slice(data))?;
    Ok(t)
}

/// Upload f32 values as a tensor of float dtype `dtype` (rounded once).
pub(crate) fn upload_f32_as(
    b: &dyn Backend,
    data: &[f32],
    shape: &[usize],
    dtype: DType,
) -> Result<Tensor> {
    match dtype {
        DType::BF16 => upload(
            b,
            &data.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>(),
            shape,
        ),
        DType::F16 => upload(
            b,
            &data.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>(),
            shape,
        ),
        DType::F32 => upload(b, data, shape),
        other => Err(not_float("upload_f32_as", other)),
    }
}

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

pub(crate) fn write<T: Element>(b: &dyn Backend, dst: &Tensor, data: &[T]) -> Result<()> {
    crate::ops::check_dtype("write", "dst", dst, &[T::DTYPE])?;
    crate::ops::check_len("write", "data", data.len(), dst.numel())?;
    b.write_bytes(dst, bytemuck::cast_slice(data))
}

pub(crate) fn download<T: Element>(b: &dyn Backend, src: &Tensor) -> Result<Vec<T>> {
    crate::ops::check_dtype("download", "src", src, &[T::DTYPE])?;
    let mut out = vec![T::zeroed(); src.numel()];
    b.read_bytes(src, bytemuck::cast_slice_mut(&mut out))?;
    Ok(out)
}

/// A float tensor read back as f64.
pub(crate) fn download_f64(b: &dyn Backend, src: &Tensor) -> Result<Vec<f64>> {
    Ok(match src.dtype() {
        DType::BF16 => download::<bf16>(b, src)?
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::F16 => download::<f16>(b, src)?
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::F32 => download::<f32>(b, src)?
            .into_iter()
            .map(f64::from)
            .collect(),
        other => return Err(not_float("download_f64", other)),
    })
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
