//! `gather_columns` on the CPU: each row's columns in the permutation's order (a pure
//! copy, bit-exact); `fill_rows`: entries taken from another tensor's rows.

use half::{bf16, f16};
use rayon::prelude::*;

use super::ptr_of;
use crate::ops::{gather_columns_ref, GatherDims};
use crate::tensor::{DType, Tensor};

/// `out[r, j] = x[r, perm[j]]`, 0 where `perm[j]` is outside `0..k` (shapes checked by
/// `ops::check_gather_columns`).
pub(crate) fn gather_columns(x: &Tensor, perm: &Tensor, out: &Tensor, d: &GatherDims) {
    // SAFETY: shapes checked: x holds rows * k, perm n and out rows * n elements of their
    // dtypes; out is a buffer of its own (written here only).
    let perm = unsafe { std::slice::from_raw_parts(ptr_of(perm) as *const i32, d.n) };
    fn run<T: Copy + Default + Send + Sync>(
        x: &Tensor,
        perm: &[i32],
        out: &Tensor,
        d: &GatherDims,
    ) {
        // SAFETY: as above.
        let (x, out) = unsafe {
            (
                std::slice::from_raw_parts(ptr_of(x) as *const T, d.rows * d.k),
                std::slice::from_raw_parts_mut(ptr_of(out) as *mut T, d.rows * d.n),
            )
        };
        if d.n == 0 {
            return;
        }
        out.par_chunks_mut(d.n).enumerate().for_each(|(r, o)| {
            gather_columns_ref(&x[r * d.k..(r + 1) * d.k], d.k, perm, o);
        });
    }
    match x.dtype() {
        DType::BF16 => run::<bf16>(x, perm, out, d),
        DType::F16 => run::<f16>(x, perm, out, d),
        _ => run::<f32>(x, perm, out, d),
    }
}

/// `dst[t] = src[rows[t]]` where `rows[t]` is in `0..s`, the rest of `dst` kept (shapes
/// checked by `ops::check_fill_rows`).
pub(crate) fn fill_rows(src: &Tensor, rows: &Tensor, dst: &Tensor, s: usize, n: usize) {
    // SAFETY: shapes checked: src holds s, rows and dst n i32 values; dst is a buffer of
    // its own (written here only).
    let (src, rows, dst) = unsafe {
        (
            std::slice::from_raw_parts(ptr_of(src) as *const i32, s),
            std::slice::from_raw_parts(ptr_of(rows) as *const i32, n),
            std::slice::from_raw_parts_mut(ptr_of(dst) as *mut i32, n),
        )
    };
    crate::ops::gather::fill_rows_ref(src, rows, dst);
}
