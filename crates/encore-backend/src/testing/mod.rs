//! Kernel-level test support shared by the test suites, the GPU tests and `encore info`'s
//! self-check.
//!
//! - [`reference`](mod@reference): a naive f64 version of every op on host data.
//! - [`inputs`]: seeded random inputs for every op, index edge cases included.
//! - [`compare`]: normalised error, per-dtype tolerances, [`CheckResult`].
//! - `cases` (the op cases), `run_case` (one on a backend), `expect` (its reference and
//!   the comparison).
//! - [`check`]: the checks themselves, for any `&dyn Backend`: every op against the CPU
//!   backend, the CPU backend against the reference, and the operations a capture must
//!   refuse. (The runner's capture/replay check lives in `encore_core::testing`.)

mod case_builders;
mod cases;
pub mod check;
pub mod compare;
mod expect;
mod host;
pub mod inputs;
pub mod kv8;
pub mod reference;
mod run_case;

pub use check::{check_backend_against_cpu, check_capture_forbidden, check_cpu_against_reference};
pub use compare::{all_passed, CheckResult};
