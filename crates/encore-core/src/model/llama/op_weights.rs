//! The weights an op reads: the resident ones, or under weight offload those its
//! announcement hands back, in the op's read order (`Model::enter`).

use crate::backend::Norm;
use crate::tensor::Tensor;

/// An op's first weight and, when the layer has it, a second read under the same op (the
/// announcement's, under weight offload, else the resident ones).
pub(super) fn with_second(
    announced: Option<Vec<Tensor>>,
    first: &Tensor,
    second: Option<&Tensor>,
) -> (Tensor, Option<Tensor>) {
    match announced {
        None => (first.clone(), second.cloned()),
        Some(v) => {
            let mut it = v.into_iter();
            let a = it.next().expect("the op's first weight is read first");
            (a, second.and_then(|_| it.next()))
        }
    }
}

/// A norm's weight and, for a LayerNorm (`ModelConfig::norm_kind`), its bias, owned (the
/// resident tensors or the announcement's), lent to the backend's norm ops as a [`Norm`].
pub(super) struct NormWeights {
    w: Tensor,
    b: Option<Tensor>,
}

impl NormWeights {
    /// The norm an op reads: weight `w` then bias `b` (when the model has one), from the
    /// announcement when there is one; `None` when the model has no such norm.
    pub(super) fn take(
        announced: Option<Vec<Tensor>>,
        w: Option<&Tensor>,
        b: Option<&Tensor>,
    ) -> Option<NormWeights> {
        let w = w?;
        match announced.filter(|v| !v.is_empty()) {
            None => Some(NormWeights {
                w: w.clone(),
                b: b.cloned(),
            }),
            Some(v) => {
                let mut it = v.into_iter();
                let w = it.next().expect("the norm's weight is read first");
                // A bias the announcement lacks stays the resident one: never RMSNorm.
                let b = b.map(|b| it.next().unwrap_or_else(|| b.clone()));
                Some(NormWeights { w, b })
            }
        }
    }

    /// The backend's argument: RMSNorm by the weight, or LayerNorm with the bias.
    pub(super) fn arg(&self) -> Norm<'_> {
        Norm::new(&self.w, self.b.as_ref())
    }
}
