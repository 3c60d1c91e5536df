//! GPTQ act order in the forward: a projection's input gathered into its weight's column
//! order (`y = W[:, perm] · x[perm]`).

use super::{Model, StepBuffers};
use crate::backend::Backend;
use crate::error::Result;
use crate::tensor::Tensor;

impl Model {
    /// `x` `[n, k]` with its columns in the order `perm` gives, in `buf.perm_x` (one
    /// projection's input at a time: each is read by its matmul before the next gather);
    /// `x` itself without a permutation.
    pub(super) fn in_order(
        &self,
        be: &dyn Backend,
        buf: &StepBuffers,
        x: &Tensor,
        perm: Option<&Tensor>,
    ) -> Result<Tensor> {
        let Some(p) = perm else {
            return Ok(x.clone());
        };
        let (n, k) = (x.dim(0), p.dim(0));
        let out = buf.perm_x.prefix(n * k)?.reshape(&[n, k])?;
        be.gather_columns(x, p, &out)?;
        Ok(out)
    }
}
