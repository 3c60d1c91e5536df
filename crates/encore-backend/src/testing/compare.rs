//! Comparing an op's output with the expected one: normalised error, per-dtype
//! tolerances, and the [`CheckResult`] every check reports.

use std::fmt;

use crate::tensor::DType;

/// One comparison: which op on which shape and dtype, the error and the bound it met.
#[derive(Clone, Debug)]
pub struct CheckResult {
    /// The op and variant, e.g. `matmul(bias, out f32)`.
    pub op: String,
    /// The launch shape, e.g. `m=17 k=64 n=257`.
    pub shape: String,
    pub dtype: DType,
    /// [`normalized_error`] for float outputs ([`max_row_error`] per head for attention);
    /// the number of differing tokens for ids.
    pub error: f64,
    pub tolerance: f64,
    pub pass: bool,
    /// Why the check could not compare (the op itself returned an error), if it could not.
    pub note: Option<String>,
}

impl CheckResult {
    pub fn new(
        op: impl Into<String>,
        shape: impl Into<String>,
        dtype: DType,
        error: f64,
        tolerance: f64,
    ) -> Self {
        CheckResult {
            op: op.into(),
            shape: shape.into(),
            dtype,
            error,
            tolerance,
            // NaN never passes: `NaN <= tol` is false.
            pass: error <= tolerance,
            note: None,
        }
    }

    /// A check that failed before comparing anything: the op returned `err`.
    pub fn errored(
        op: impl Into<String>,
        shape: impl Into<String>,
        dtype: DType,
        err: &crate::Error,
    ) -> Self {
        CheckResult {
            note: Some(err.to_string()),
            ..CheckResult::new(op, shape, dtype, f64::NAN, 0.0)
        }
    }
}

impl fmt::Display for CheckResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} [{}] {} error {:.3e} (tolerance {:.1e})",
            if self.pass { "ok  " } else { "FAIL" },
            self.op,
            self.shape,
            self.dtype,
            self.error,
            self.tolerance
        )?;
        match &self.note {
            Some(note) => write!(f, ": {note}"),
            None => Ok(()),
        }
    }
}

/// `Err` listing every failed check (for `assert!`-style use), `Ok` when all passed.
pub fn all_passed(results: &[CheckResult]) -> Result<(), String> {
    let failed: Vec<String> = results
        .iter()
        .filter(|r| !r.pass)
        .map(|r| r.to_string())
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} of {} checks failed:\n{}",
            failed.len(),
            results.len(),
            failed.join("\n")
        ))
    }
}

/// `‖out − reference‖₂ / ‖reference‖₂`, or the largest absolute difference when the
/// reference is all zeros. A NaN anywhere in either, or a length mismatch, gives NaN
/// (which fails every tolerance); infinities must match exactly.
pub fn normalized_error(out: &[f64], reference: &[f64]) -> f64 {
    if out.len() != reference.len() {
        return f64::NAN;
    }
    let (mut diff, mut norm, mut max_abs) = (0.0f64, 0.0f64, 0.0f64);
    for (&o, &r) in out.iter().zip(reference) {
        if o.is_nan() || r.is_nan() {
            return f64::NAN;
        }
        if o.is_infinite() || r.is_infinite() {
            if o != r {
                return f64::NAN;
            }
            continue;
        }
        diff += (o - r) * (o - r);
        norm += r * r;
        max_abs = max_abs.max((o - r).abs());
    }
    if norm == 0.0 {
        max_abs
    } else {
        (diff / norm).sqrt()
    }
}

/// The largest [`normalized_error`] over consecutive rows of `row_len` elements: for
/// outputs whose rows differ in scale (attention over 1 vs 1000 keys), where one error
/// over the whole tensor would hide a wrong small row behind exact large ones.
pub fn max_row_error(out: &[f64], reference: &[f64], row_len: usize) -> f64 {
    if out.len() != reference.len() || row_len == 0 {
        return f64::NAN;
    }
    let mut worst = 0.0f64;
    for (o, r) in out.chunks(row_len).zip(reference.chunks(row_len)) {
        let e = normalized_error(o, r);
        if e.is_nan() {
            return e;
        }
        worst = worst.max(e);
    }
    worst
}

/// How an op computes, which decides how far two correct implementations may differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpClass {
    /// Pure data movement (embedding, kv_write): results are bit-identical.
    Copy,
    /// Per element or per row with short reductions (rms_norm, rope, silu_mul).
    Pointwise,
    /// Long dot-product reductions (matmul, attention).
    Reduction,
    /// A matmul whose activations a backend may round to FP8 E4M3 (per row and 128
    /// values, 3-bit significand: up to 2^-4 relative per value), as the CUDA FP8 GEMM
    /// does for FP8 weights past the gemv's rows.
    Fp8Activations,
    /// An FP8 KV cache's contents after a write: each value rounded to E4M3 (3-bit
    /// significand) from the dtype's rounding of it, so a value whose two roundings
    /// differ may land one E4M3 step (up to 2^-3 relative) away.
    Fp8Cache,
}

/// The normalised error two correct implementations of an op may show.
///
/// Pointwise: one final rounding to the dtype, at most half an ulp (unit roundoff 2⁻⁸ ≈
/// 3.9e-3 relative for bf16's 8-bit significand, 2⁻¹¹ ≈ 4.9e-4 for f16), about 0.45×
/// that as a normalised RMS. Measured against the f64 reference (`encore info` on CPU
/// prints it): ≈ 1.8e-3 (bf16), 2.4e-4 (f16), 4e-7 (f32), so the bounds bf16 1e-2, f16
/// 2e-3, f32 1e-5 leave 5-25× headroom and still catch a missing or doubled rounding
/// step in f32 and any real bug in the half types.
///
/// Reduction (matmul, attention): the same rounding plus what a GPU legitimately does in
/// between — another summation order, split-K partials, attention probabilities rounded
/// to the dtype before the P·V product as flash-attention kernels do — hence twice the
/// pointwise bound for the half types (measured on CPU, attention per head row: ≤ 3.2e-3
/// bf16, 2.8e-4 f16, 1.4e-6 f32) and 5e-5 for f32 (TF32's 10-bit significand would give
/// ~5e-4 and is rightly rejected, since the ops promise f32 arithmetic).
///
/// Copy (embedding, kv_write): bit-identical.
pub fn tolerance(class: OpClass, dtype: DType) -> f64 {
    match (class, dtype) {
        (OpClass::Copy, _) => 0.0,
        (OpClass::Pointwise, DType::BF16) => 1e-2,
        (OpClass::Pointwise, DType::F16) => 2e-3,
        (OpClass::Pointwise, _) => 1e-5,
        (OpClass::Reduction, DType::BF16) => 2e-2,
        (OpClass::Reduction, DType::F16) => 4e-3,
        (OpClass::Reduction, _) => 5e-5,
        // Measured on the H100/H200: up to 2.5e-2 over fresh random inputs.
        (OpClass::Fp8Activations, _) => 8e-2,
        // A few values one step apart in thousands: measured on the CPU at most 4e-3
        // (bf16); a scale applied twice or not at all is an error of 1 or more.
        (OpClass::Fp8Cache, _) => 2e-2,
    }
}

/// Token ids compared row by row: `(mismatches among non-greedy rows, among greedy rows)`.
pub fn token_mismatches(out: &[i32], expected: &[i32], greedy: &[bool]) -> (usize, usize) {
    let (mut random, mut exact) = (0, 0);
    for ((o, e), &g) in out.iter().zip(expected).zip(greedy) {
        if o != e {
            if g {
                exact += 1;
            } else {
                random += 1;
            }
        }
    }
    (random, exact)
}

/// Sampled rows two correct backends may disagree on: at most 1 per 100 rows (a draw
/// that lands within float rounding of a CDF boundary, or a top-p cut at a boundary).
pub fn allowed_sample_mismatches(rows: usize) -> usize {
    rows.div_ceil(100)
}
