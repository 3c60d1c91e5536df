//! `gather_columns`: the activation's columns in a weight's column order (GPTQ's
//! activation order), and `fill_rows`: a step's token ids taken from the samples of the
//! step before (asynchronous scheduling); checked alike on every backend.

use super::{check_dtype, check_rank, check_shape, same_dtype, FLOAT_DTYPES};
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

/// The launch shape of a `gather_columns`: `rows` rows of `k` input and `n` output
/// columns.
pub struct GatherDims {
    pub rows: usize,
    pub k: usize,
    pub n: usize,
}

/// `gather_columns`: x T `[rows, k]`, perm i32 `[n]`, out T `[rows, n]` (T bf16, f16 or
/// f32), k and n within i32.
pub fn check_gather_columns(x: &Tensor, perm: &Tensor, out: &Tensor) -> Result<GatherDims> {
    const OP: &str = "gather_columns";
    check_dtype(OP, "x", x, FLOAT_DTYPES)?;
    check_rank(OP, "x", x, 2, "[rows, k]")?;
    check_dtype(OP, "perm", perm, &[DType::I32])?;
    check_rank(OP, "perm", perm, 1, "[n]")?;
    same_dtype(OP, "out", out, x.dtype())?;
    let (rows, k, n) = (x.dim(0), x.dim(1), perm.dim(0));
    check_shape(OP, "out", out, &[rows, n], "[rows, n]")?;
    if k > i32::MAX as usize || n > i32::MAX as usize {
        return Err(Error::invalid(OP, format!("{k} or {n} columns exceed i32")));
    }
    Ok(GatherDims { rows, k, n })
}

/// The reference of `gather_columns` on host rows: `out[r, j] = x[r, perm[j]]`, 0 where
/// `perm[j]` is outside `0..k`.
pub fn gather_columns_ref<T: Copy + Default>(x: &[T], k: usize, perm: &[i32], out: &mut [T]) {
    let n = perm.len();
    for (i, o) in out.iter_mut().enumerate() {
        let (r, p) = (i / n, perm[i % n]);
        *o = match usize::try_from(p) {
            Ok(p) if p < k => x[r * k + p],
            _ => T::default(),
        };
    }
}

/// `fill_rows`: src i32 `[s]`, rows i32 `[n]`, dst i32 `[n]`; returns `(s, n)`, each
/// within i32.
pub fn check_fill_rows(src: &Tensor, rows: &Tensor, dst: &Tensor) -> Result<(usize, usize)> {
    const OP: &str = "fill_rows";
    check_dtype(OP, "src", src, &[DType::I32])?;
    check_rank(OP, "src", src, 1, "[s]")?;
    check_dtype(OP, "rows", rows, &[DType::I32])?;
    check_rank(OP, "rows", rows, 1, "[n]")?;
    same_dtype(OP, "dst", dst, DType::I32)?;
    let (s, n) = (src.dim(0), rows.dim(0));
    check_shape(OP, "dst", dst, &[n], "[n]")?;
    if s > i32::MAX as usize || n > i32::MAX as usize {
        return Err(Error::invalid(OP, format!("{s} or {n} entries exceed i32")));
    }
    Ok((s, n))
}

/// The reference of `fill_rows` on host values: `dst[t] = src[rows[t]]` where `rows[t]` is
/// in `0..src.len()`, the rest of `dst` kept.
pub fn fill_rows_ref(src: &[i32], rows: &[i32], dst: &mut [i32]) {
    for (d, &r) in dst.iter_mut().zip(rows) {
        if let Some(&v) = usize::try_from(r).ok().and_then(|r| src.get(r)) {
            *d = v;
        }
    }
}
