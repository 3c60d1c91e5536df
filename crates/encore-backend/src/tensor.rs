//! A small, explicit tensor view: buffer + byte offset + shape + dtype. Always contiguous,
//! row-major. Slicing along the first dimension is a cheap view. Not an autograd framework:
//! a `Tensor` is a typed pointer into backend memory that ops read and write.

use std::fmt;
use std::sync::Arc;

pub use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
pub use crate::storage::Storage;

/// A contiguous view of `shape` elements of `dtype` starting `offset` bytes into `storage`.
#[derive(Clone)]
pub struct Tensor {
    storage: Storage,
    offset: usize,
    shape: Vec<usize>,
    dtype: DType,
    /// What the loader knows of a quantized weight's values beyond its format: every row's
    /// block scales are equal (an FP8 weight scaled per output channel or per tensor), so a
    /// GEMM may take one scale a row. A hint: views keep it, a new tensor has none, and a
    /// kernel that ignores it stays exact.
    row_scale: bool,
    /// A repacked copy of this quantized weight for the mixed-input tensor-core GEMM
    /// ([`crate::quant::marlin`]'s layout of the whole `[n, k]` tensor), made once at load
    /// by `Backend::prepare_weight`. Only a view of the whole tensor keeps it (a narrower
    /// view runs the kernels of the block layout).
    packed: Option<Storage>,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({}, {:?}, {}, +{})",
            self.storage.device_name(),
            self.shape,
            self.dtype,
            self.offset
        )
    }
}

/// Bytes of a `shape` tensor of `dtype`, or an error naming `op` (a quantized shape whose
/// rows are not whole blocks, or an overflow).
pub fn shape_bytes(op: &'static str, shape: &[usize], dtype: DType) -> Result<usize> {
    dtype.bytes(shape).ok_or_else(|| {
        Error::invalid(
            op,
            match dtype {
                DType::Q(f) => format!(
                    "{shape:?} {dtype}: rows of {} values are not whole {f} blocks of {}",
                    shape.last().copied().unwrap_or(0),
                    f.block_elems()
                ),
                _ => format!("{shape:?} {dtype} overflows"),
            },
        )
    })
}

impl Tensor {
    /// A view of `storage`. Fails if the view does not fit in the buffer.
    pub fn new(storage: Storage, offset: usize, shape: &[usize], dtype: DType) -> Result<Self> {
        let bytes = shape_bytes("Tensor::new", shape, dtype)?;
        if offset + bytes > storage.len_bytes() {
            return Err(Error::invalid(
                "Tensor::new",
                format!(
                    "view of {bytes} bytes at offset {offset} exceeds buffer of {} bytes",
                    storage.len_bytes()
                ),
            ));
        }
        Ok(Tensor {
            storage,
            offset,
            shape: shape.to_vec(),
            dtype,
            row_scale: false,
            packed: None,
        })
    }

    /// The same view, marked as holding one scale a row (see [`Tensor::row_scale`]); the
    /// caller checked the bytes (`quant::rows_share_one_scale`).
    pub fn with_row_scale(mut self) -> Self {
        self.row_scale = self.dtype.is_quantized();
        self
    }
    /// Whether every row's block scales are known to be equal (a quantized weight whose
    /// loader checked it); false when unknown.
    pub fn row_scale(&self) -> bool {
        self.row_scale
    }

    /// The same view with `packed`, the repacked copy of its bytes (see
    /// [`Tensor::packed`]; the caller made it from this tensor's bytes).
    pub fn with_packed(mut self, packed: Storage) -> Self {
        self.packed = self.dtype.is_quantized().then_some(packed);
        self
    }
    /// The repacked copy of this quantized weight ([`crate::quant::marlin`]'s layout), if
    /// the backend made one at load.
    pub fn packed(&self) -> Option<&Storage> {
        self.packed.as_ref()
    }

    pub fn storage(&self) -> &Storage {
        &self.storage
    }
    pub fn offset(&self) -> usize {
        self.offset
    }
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn size_bytes(&self) -> usize {
        // Every constructor checked that the shape has a size in the dtype.
        self.dtype.bytes(&self.shape).unwrap_or(0)
    }
    /// Size of dimension `i`; negative indices count from the end.
    pub fn dim(&self, i: isize) -> usize {
        let i = if i < 0 { self.rank() as isize + i } else { i };
        self.shape[i as usize]
    }
    /// Product of all dimensions but the last (the "rows" of a row-wise op).
    pub fn rows(&self) -> usize {
        self.shape[..self.rank().saturating_sub(1)].iter().product()
    }
    pub fn device_name(&self) -> String {
        self.storage.device_name()
    }

    /// Rows `start..start+len` of the first dimension: a view, no copy.
    pub fn narrow(&self, start: usize, len: usize) -> Result<Tensor> {
        let d0 = *self.shape.first().ok_or_else(|| {
            Error::invalid(
                "Tensor::narrow",
                "cannot narrow a rank-0 tensor".to_string(),
            )
        })?;
        if start + len > d0 {
            return Err(Error::invalid(
                "Tensor::narrow",
                format!(
                    "rows {start}..{} out of range for {:?}",
                    start + len,
                    self.shape
                ),
            ));
        }
        if self.dtype.is_quantized() && self.rank() < 2 {
            return Err(Error::invalid(
                "Tensor::narrow",
                format!("a {} tensor narrows by whole rows (rank >= 2)", self.dtype),
            ));
        }
        let row_bytes = shape_bytes("Tensor::narrow", &self.shape[1..], self.dtype)?;
        let mut shape = self.shape.clone();
        shape[0] = len;
        let whole = start == 0 && len == d0;
        Ok(Tensor {
            storage: self.storage.clone(),
            offset: self.offset + start * row_bytes,
            shape,
            dtype: self.dtype,
            row_scale: self.row_scale,
            packed: self.packed.clone().filter(|_| whole),
        })
    }

    /// The first `len` rows (what a bucket's graph sees of a max-shape buffer).
    pub fn prefix(&self, len: usize) -> Result<Tensor> {
        self.narrow(0, len)
    }

    /// The same elements under another shape of equal element count.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        let same_rows = !self.dtype.is_quantized() || shape.last() == self.shape.last();
        if shape.iter().product::<usize>() != self.numel() || !same_rows {
            return Err(Error::invalid(
                "Tensor::reshape",
                format!("cannot reshape {:?} to {:?}", self.shape, shape),
            ));
        }
        Ok(Tensor {
            storage: self.storage.clone(),
            offset: self.offset,
            shape: shape.to_vec(),
            dtype: self.dtype,
            row_scale: self.row_scale,
            packed: self
                .packed
                .clone()
                .filter(|_| shape == self.shape.as_slice()),
        })
    }

    /// Reinterpret the same bytes as a view of another dtype and shape (for arenas).
    pub fn view_as(&self, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        Tensor::new(self.storage.clone(), self.offset, shape, dtype).and_then(|t| {
            if t.size_bytes() > self.size_bytes() {
                Err(Error::invalid(
                    "Tensor::view_as",
                    format!(
                        "{shape:?} {dtype} needs {} bytes, the view has {}",
                        t.size_bytes(),
                        self.size_bytes()
                    ),
                ))
            } else {
                Ok(t)
            }
        })
    }

    /// Whether the two views point at the same first byte of the same buffer.
    pub fn same_start(&self, other: &Tensor) -> bool {
        let same_buf = match (&self.storage, &other.storage) {
            (Storage::Cpu(a), Storage::Cpu(b)) => Arc::ptr_eq(a, b),
            (Storage::Cuda(a), Storage::Cuda(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        same_buf && self.offset == other.offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;

    #[test]
    fn float_dtype_names_in_any_case() {
        for (names, want) in [
            (&["bf16", "BF16", "bfloat16", "BFloat16"][..], DType::BF16),
            (
                &["f16", "fp16", "FP16", "float16", "half", "Half"][..],
                DType::F16,
            ),
            (
                &["f32", "fp32", "float32", "Float32", "float"][..],
                DType::F32,
            ),
        ] {
            for n in names {
                assert_eq!(DType::parse_float(n), Some(want), "{n}");
            }
        }
        for bad in ["int4", "i32", "", "bf 16", "fp8"] {
            assert_eq!(DType::parse_float(bad), None, "{bad}");
        }
    }

    #[test]
    fn narrow_prefix_reshape_are_views() {
        let cpu: &dyn Backend = &crate::backend::cpu::CpuBackend::new();
        let data: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let t = cpu.upload(&data, &[4, 6]).unwrap();
        let rows = t.narrow(1, 2).unwrap();
        assert_eq!(rows.shape(), &[2, 6]);
        assert_eq!(rows.offset(), 24);
        assert_eq!(cpu.download::<f32>(&rows).unwrap(), data[6..18].to_vec());
        let p = t.prefix(3).unwrap().reshape(&[18]).unwrap();
        assert_eq!(cpu.download::<f32>(&p).unwrap(), data[..18].to_vec());
        assert!(t.narrow(3, 2).is_err());
        assert!(t.reshape(&[5, 5]).is_err());
        assert!(t.prefix(0).unwrap().numel() == 0);
    }

    #[test]
    fn view_as_checks_size() {
        let cpu = crate::backend::cpu::CpuBackend::new();
        let t = cpu.alloc(DType::F32, &[8]).unwrap();
        assert!(t.view_as(DType::BF16, &[16]).is_ok());
        assert!(t.view_as(DType::BF16, &[17]).is_err());
    }
}
