//! Every kernel entry point, resolved once at load into typed handles. A launcher picks
//! its function by indexing (op, element type, variant); no kernel name is built or
//! looked up while a step runs, and a missing entry point fails `CudaBackend::new`.

use std::collections::HashMap;

use cudarc::driver::CudaFunction;

use crate::error::{Error, Result};
use crate::tensor::DType;

/// The element types the kernels are instantiated for, in handle order.
const DTYPES: [DType; 3] = [DType::BF16, DType::F16, DType::F32];

/// One loaded entry point and its name (for launch errors).
pub(super) struct Kernel {
    pub f: CudaFunction,
    pub name: Box<str>,
}

/// A kernel instantiated per element type: `<op>_bf16`, `<op>_f16`, `<op>_f32`.
pub(super) struct PerDType {
    op: &'static str,
    f: [Kernel; 3],
}

impl PerDType {
    fn resolve(fns: &HashMap<&'static str, CudaFunction>, op: &'static str) -> Result<Self> {
        let f = [0, 1, 2].map(|i| take(fns, &format!("{op}_{}", DTYPES[i].kernel_suffix())));
        let [a, b, c] = f;
        Ok(PerDType {
            op,
            f: [a?, b?, c?],
        })
    }

    /// The instantiation for `dt` (the ops' validation admits no other element type).
    pub(super) fn get(&self, dt: DType) -> Result<&Kernel> {
        dtype_index(dt)
            .map(|i| &self.f[i])
            .ok_or_else(|| Error::invalid(self.op, format!("no {dt} kernel")))
    }
}

/// Rows of the gemv variants (`_m1`, `_m2`, `_m4`, `_m8`).
pub(super) const GEMV_VARIANTS: [usize; 4] = [1, 2, 4, 8];
/// Heads per CTA of the split attention variants (`attention_split_g1` .. `_g8`).
pub(super) const SPLIT_VARIANTS: [usize; 4] = [1, 2, 4, 8];
/// Head sizes of the tensor-core prefill kernel (`attention_prefill_hd64`, `_hd128`).
pub(super) const PREFILL_HEAD_DIMS: [usize; 2] = [64, 128];

/// Every kernel of `kernels/*.cu`, by op.
pub(super) struct Kernels {
    pub embedding: PerDType,
    pub rms_norm: PerDType,
    pub silu_mul: PerDType,
    pub qkv_rope: PerDType,
    /// By [`SPLIT_VARIANTS`] index.
    pub attention_split: [PerDType; 4],
    pub attention_combine: PerDType,
    /// By [`PREFILL_HEAD_DIMS`] index, then bf16 / f16.
    pub attention_prefill: [[Kernel; 2]; 2],
    /// By input element type, output (0: the input's type, 1: f32), [`GEMV_VARIANTS`] index.
    pub gemv: [[[Kernel; 4]; 2]; 3],
    /// The one-row fused gate/up projection and SiLU·mul.
    pub gemv_silu: PerDType,
    pub sample_f32: Kernel,
}

impl Kernels {
    /// Take every handle from the loaded functions (by their `extern "C"` names).
    pub(super) fn resolve(fns: &HashMap<&'static str, CudaFunction>) -> Result<Self> {
        let per = |op| PerDType::resolve(fns, op);
        let split = |i: usize| PerDType::resolve(fns, SPLIT_NAMES[i]);
        let prefill = |h: usize, d: usize| {
            take(
                fns,
                &format!(
                    "attention_prefill_hd{}_{}",
                    PREFILL_HEAD_DIMS[h],
                    DTYPES[d].kernel_suffix()
                ),
            )
        };
        let gemv = |x: usize, o: usize, v: usize| {
            let xs = DTYPES[x].kernel_suffix();
            let os = if o == 1 { "f32" } else { xs };
            take(fns, &format!("gemv_{xs}_{os}_m{}", GEMV_VARIANTS[v]))
        };
        let gemv_out = |x: usize, o: usize| -> Result<[Kernel; 4]> {
            Ok([
                gemv(x, o, 0)?,
                gemv(x, o, 1)?,
                gemv(x, o, 2)?,
                gemv(x, o, 3)?,
            ])
        };
        let gemv_in =
            |x: usize| -> Result<[[Kernel; 4]; 2]> { Ok([gemv_out(x, 0)?, gemv_out(x, 1)?]) };
        Ok(Kernels {
            embedding: per("embedding")?,
            rms_norm: per("rms_norm")?,
            silu_mul: per("silu_mul")?,
            qkv_rope: per("qkv_rope")?,
            attention_split: [split(0)?, split(1)?, split(2)?, split(3)?],
            attention_combine: per("attention_combine")?,
            attention_prefill: [
                [prefill(0, 0)?, prefill(0, 1)?],
                [prefill(1, 0)?, prefill(1, 1)?],
            ],
            gemv: [gemv_in(0)?, gemv_in(1)?, gemv_in(2)?],
            gemv_silu: per("gemv_silu")?,
            sample_f32: take(fns, "sample_f32")?,
        })
    }

    /// `gemv_<x>_<out>_m<rows>` for `rows` in [`GEMV_VARIANTS`] and `out` either `x`'s type
    /// or f32.
    pub(super) fn gemv(&self, x: DType, out: DType, rows: usize) -> Result<&Kernel> {
        const OP: &str = "matmul (gemv)";
        let xi = dtype_index(x).ok_or_else(|| Error::invalid(OP, format!("no {x} kernel")))?;
        let oi = match out {
            o if o == x => 0,
            DType::F32 => 1,
            o => return Err(Error::invalid(OP, format!("no {x} -> {o} kernel"))),
        };
        let vi = variant(&GEMV_VARIANTS, rows, OP)?;
        Ok(&self.gemv[xi][oi][vi])
    }

    /// `attention_split_g<heads>_<dt>` for `heads` in [`SPLIT_VARIANTS`].
    pub(super) fn attention_split(&self, heads: usize, dt: DType) -> Result<&Kernel> {
        self.attention_split[variant(&SPLIT_VARIANTS, heads, "attention")?].get(dt)
    }

    /// `attention_prefill_hd<head_dim>_<dt>`, if that instantiation exists.
    pub(super) fn attention_prefill(&self, head_dim: usize, dt: DType) -> Option<&Kernel> {
        let h = PREFILL_HEAD_DIMS.iter().position(|&d| d == head_dim)?;
        let d = match dt {
            DType::BF16 => 0,
            DType::F16 => 1,
            _ => return None,
        };
        Some(&self.attention_prefill[h][d])
    }
}

const SPLIT_NAMES: [&str; 4] = [
    "attention_split_g1",
    "attention_split_g2",
    "attention_split_g4",
    "attention_split_g8",
];

fn dtype_index(dt: DType) -> Option<usize> {
    DTYPES.iter().position(|&d| d == dt)
}

fn variant(list: &[usize], v: usize, op: &'static str) -> Result<usize> {
    list.iter()
        .position(|&x| x == v)
        .ok_or_else(|| Error::invalid(op, format!("no kernel variant for {v}")))
}

fn take(fns: &HashMap<&'static str, CudaFunction>, name: &str) -> Result<Kernel> {
    let f = fns.get(name).cloned().ok_or_else(|| Error::Cuda {
        call: "kernel lookup".into(),
        message: format!("kernel `{name}` is not loaded (not listed in kernels/mod.rs SOURCES?)"),
    })?;
    Ok(Kernel {
        f,
        name: name.into(),
    })
}
