//! The kernel checks, for any backend: every op against the CPU backend, the CPU backend
//! against the f64 reference, and the operations a capture must refuse.

use crate::backend::cpu::CpuBackend;
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::tensor::DType;

use super::cases::cases;
use super::compare::CheckResult;
use super::expect::{compare, reference};
use super::host::poison;
use super::run_case::run;

/// Every op on fresh random inputs from `seed`, run on `backend` and on a fresh
/// [`CpuBackend`] with poisoned outputs, compared within [`tolerance`] (exactly when
/// `backend` is itself a CPU backend). Sampled ids may differ in 1 row per 100 (draws at
/// float-rounding distance from a CDF boundary); greedy rows must match exactly. An op
/// that returns an error on `backend` gives a failed result carrying the message.
pub fn check_backend_against_cpu(backend: &dyn Backend, seed: u64) -> Result<Vec<CheckResult>> {
    let cpu = CpuBackend::new();
    let exact = backend.device_name() == cpu.device_name();
    let mut results = Vec::new();
    for case in cases(seed) {
        // An op that fails on `backend` is a failed check, not the end of the report.
        let got = match run(backend, &case) {
            Ok(got) => got,
            Err(err) => {
                results.push(CheckResult::errored(
                    &case.name,
                    &case.shape,
                    case.dtype,
                    &err,
                ));
                continue;
            }
        };
        let want = run(&cpu, &case)?;
        results.extend(compare(&case, &got, &want, exact));
    }
    Ok(results)
}

/// Every op on fresh random inputs from `seed`, run on the CPU backend and compared with
/// the naive f64 reference ([`super::reference`]).
pub fn check_cpu_against_reference(seed: u64) -> Result<Vec<CheckResult>> {
    let cpu = CpuBackend::new();
    let mut results = Vec::new();
    for case in cases(seed) {
        let got = run(&cpu, &case)?;
        results.extend(compare(&case, &got, &reference(&case), false));
    }
    Ok(results)
}
/// `alloc`, `write_bytes`, `read_bytes` and `synchronize` during a capture must each fail
/// with [`Error::CaptureViolation`] naming the operation; ops recorded around them still
/// replay, and after `end_capture` the backend works normally.
pub fn check_capture_forbidden(backend: &dyn Backend) -> Result<()> {
    const OP: &str = "check_capture_forbidden";
    let input = [-2.0f32, -0.5, 0.0, 1.0, 3.0, 0.5, 2.0, -1.0];
    let expected: Vec<f32> = (0..4)
        .map(|j| {
            let g = input[j] as f64;
            (g / (1.0 + (-g).exp()) * input[4 + j] as f64) as f32
        })
        .collect();
    let gate_up = backend.upload(&input, &[1, 8])?;
    let out = backend.alloc(DType::F32, &[1, 4])?;
    let bytes = backend.alloc(DType::F32, &[4])?;
    let mut staging = backend.alloc_staging(16)?;

    backend.begin_capture()?;
    let capturing = backend.is_capturing();
    let recorded_before = backend.silu_mul(&gate_up, &out);
    let attempts: [(&str, Result<()>); 6] = [
        ("alloc", backend.alloc(DType::F32, &[4]).map(drop)),
        ("write_bytes", backend.write_bytes(&bytes, &[0u8; 16])),
        ("read_bytes", backend.read_bytes(&bytes, &mut [0u8; 16])),
        ("synchronize", backend.synchronize()),
        ("alloc_staging", backend.alloc_staging(16).map(drop)),
        (
            "upload_staging",
            backend.upload_staging(&mut staging, &bytes),
        ),
    ];
    let recorded_after = backend.silu_mul(&gate_up, &out);
    let graph = backend.end_capture();

    if !capturing {
        return Err(Error::invalid(
            OP,
            "is_capturing() was false after begin_capture",
        ));
    }
    if backend.is_capturing() {
        return Err(Error::invalid(
            OP,
            "is_capturing() still true after end_capture",
        ));
    }
    for (name, result) in attempts {
        match result {
            Err(Error::CaptureViolation { op }) if op.contains(name) => {}
            other => {
                return Err(Error::invalid(
                    OP,
                    format!(
                    "`{name}` during capture gave {other:?}, expected CaptureViolation naming it"
                ),
                ))
            }
        }
    }
    recorded_before?;
    recorded_after?;
    let graph = graph?;

    // The recorded ops replay; the backend copies, allocates and synchronises again.
    poison(backend, &out)?;
    graph.replay()?;
    check_close(
        OP,
        "replayed silu_mul",
        &backend.download::<f32>(&out)?,
        &expected,
    )?;
    let fresh = backend.alloc(DType::F32, &[1, 4])?;
    poison(backend, &fresh)?;
    backend.silu_mul(&gate_up, &fresh)?;
    backend.synchronize()?;
    check_close(
        OP,
        "eager silu_mul after capture",
        &backend.download::<f32>(&fresh)?,
        &expected,
    )?;
    Ok(())
}

fn check_close(op: &'static str, what: &str, got: &[f32], want: &[f32]) -> Result<()> {
    let ok = got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| (g - w).abs() <= 1e-5 * (1.0 + w.abs()));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            op,
            format!("{what}: got {got:?}, expected {want:?}"),
        ))
    }
}
