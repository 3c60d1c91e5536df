//! The launchers of `gather_columns` and `fill_rows` (`kernels/gather.cu`).

use super::{cfg, grid_x, int};
use crate::backend::cuda::{dptr, CudaBackend};
use crate::error::Result;
use crate::ops::GatherDims;
use crate::tensor::Tensor;

/// Threads a block and columns a thread (gather.cu's `GATHER_THREADS`,
/// `GATHER_PER_THREAD`).
const THREADS: usize = 256;
const PER_THREAD: usize = 4;

/// `out[r, j] = x[r, perm[j]]`: one block row per x row, column chunks along y.
pub(in crate::backend::cuda) fn gather_columns(
    be: &CudaBackend,
    x: &Tensor,
    perm: &Tensor,
    out: &Tensor,
    d: &GatherDims,
) -> Result<()> {
    const OP: &str = "gather_columns";
    if d.rows == 0 || d.n == 0 {
        return Ok(());
    }
    let chunks = d.n.div_ceil(THREADS * PER_THREAD);
    let c = cfg(
        (grid_x(OP, "rows", d.rows)?, grid_x(OP, "n", chunks)?, 1),
        (THREADS as u32, 1, 1),
    );
    let (xp, pp, op) = (dptr(x), dptr(perm), dptr(out));
    let (k, n) = (int(OP, "k", d.k)?, int(OP, "n", d.n)?);
    be.launch(
        be.kernels().gather_columns.get(x.dtype())?,
        c,
        &mut args![xp, pp, op, k, n],
    )
}

/// `dst[t] = src[rows[t]]` where `rows[t]` is in `0..s`: a thread an entry.
pub(in crate::backend::cuda) fn fill_rows(
    be: &CudaBackend,
    src: &Tensor,
    rows: &Tensor,
    dst: &Tensor,
    s: usize,
    n: usize,
) -> Result<()> {
    const OP: &str = "fill_rows";
    if n == 0 {
        return Ok(());
    }
    let c = cfg(
        (grid_x(OP, "n", n.div_ceil(THREADS))?, 1, 1),
        (THREADS as u32, 1, 1),
    );
    let (sp, rp, dp) = (dptr(src), dptr(rows), dptr(dst));
    let (s, n) = (int(OP, "s", s)?, int(OP, "n", n)?);
    be.launch(&be.kernels().fill_rows_i32, c, &mut args![sp, rp, dp, s, n])
}
