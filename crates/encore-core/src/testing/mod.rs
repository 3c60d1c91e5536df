//! Test support shared by the test suites, the GPU tests and `encore info`'s self-check:
//! the kernel-level support of [`encore_backend::testing`] (f64 reference, seeded inputs,
//! comparisons, every op against the CPU) and, here, the runner's capture/replay check.

pub mod check;

pub use check::check_capture_replay;
pub use encore_backend::testing::{
    all_passed, check_backend_against_cpu, check_capture_forbidden, check_cpu_against_reference,
    compare, inputs, reference, CheckResult,
};
