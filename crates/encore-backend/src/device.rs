//! Device selection: `--device auto|cpu|cuda[:N]`. `auto` picks CUDA device 0 when it is
//! usable and falls back to the CPU otherwise, saying why; an explicit `cuda` that cannot
//! be opened is an error naming the reason (no driver, missing library, no such device).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::{CudaBackend, CudaLibraries};
use crate::backend::BackendRef;
use crate::error::{Error, Result};

/// What the user asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    #[default]
    Auto,
    Cpu,
    Cuda(usize),
}

impl FromStr for DeviceSpec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(DeviceSpec::Auto),
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" | "gpu" => Ok(DeviceSpec::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceSpec::Cuda)
                .ok_or_else(|| {
                    Error::invalid(
                        "--device",
                        format!("`{s}` is not one of auto, cpu, cuda, cuda:N"),
                    )
                }),
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Auto => f.write_str("auto"),
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// An opened backend, with the concrete type kept for device-specific reporting.
#[derive(Clone)]
pub enum Opened {
    Cpu(Arc<CpuBackend>),
    Cuda(Arc<CudaBackend>),
}

impl Opened {
    pub fn backend(&self) -> BackendRef {
        match self {
            Opened::Cpu(b) => b.clone(),
            Opened::Cuda(b) => b.clone(),
        }
    }
}

/// Open the backend `spec` names. For `Auto`, the returned note says why CUDA was not used.
pub fn open(spec: DeviceSpec) -> Result<(Opened, Option<String>)> {
    match spec {
        DeviceSpec::Cpu => Ok((Opened::Cpu(Arc::new(CpuBackend::new())), None)),
        DeviceSpec::Cuda(n) => Ok((Opened::Cuda(Arc::new(CudaBackend::new(n)?)), None)),
        DeviceSpec::Auto => match CudaBackend::new(0) {
            Ok(b) => Ok((Opened::Cuda(Arc::new(b)), None)),
            Err(e) => {
                tracing::info!("CUDA not used: {e}");
                let note = format!(
                    "no usable CUDA device ({}); running on the CPU",
                    short_reason(&e)
                );
                Ok((Opened::Cpu(Arc::new(CpuBackend::new())), Some(note)))
            }
        },
    }
}

/// Open `size` backends of one tensor-parallel group on `spec`: CPU ranks sharing memory
/// (the CPU twin), or CUDA devices `N..N + size` for `cuda:N` joined by NCCL. `Auto`
/// takes CUDA when device 0 opens and the CPU otherwise (the note says why). `size` 1 is
/// [`open`].
pub fn open_group(spec: DeviceSpec, size: usize) -> Result<(Vec<Opened>, Option<String>)> {
    if size <= 1 {
        let (be, note) = open(spec)?;
        return Ok((vec![be], note));
    }
    let cpu = || {
        CpuBackend::group(size)
            .into_iter()
            .map(|b| Opened::Cpu(Arc::new(b)))
            .collect()
    };
    let cuda = |first| -> Result<Vec<Opened>> {
        Ok(CudaBackend::group(first, size)?
            .into_iter()
            .map(|b| Opened::Cuda(Arc::new(b)))
            .collect())
    };
    match spec {
        DeviceSpec::Cpu => Ok((cpu(), None)),
        DeviceSpec::Cuda(n) => Ok((cuda(n)?, None)),
        DeviceSpec::Auto => match CudaBackend::new(0) {
            Ok(b) => {
                drop(b);
                Ok((cuda(0)?, None))
            }
            Err(e) => {
                tracing::info!("CUDA not used: {e}");
                let note = format!(
                    "no usable CUDA device ({}); running {size} ranks on the CPU",
                    short_reason(&e)
                );
                Ok((cpu(), Some(note)))
            }
        },
    }
}

/// A few words on why CUDA could not be opened, for the one-line fallback note (the whole
/// error goes to the `info` log).
fn short_reason(e: &Error) -> String {
    let libs = CudaLibraries::probe();
    if !libs.driver {
        return "libcuda not found".into();
    }
    let missing: Vec<&str> = [("libnvrtc", libs.nvrtc), ("libcublasLt", libs.cublaslt)]
        .iter()
        .filter(|(_, found)| !found)
        .map(|(name, _)| *name)
        .collect();
    if !missing.is_empty() {
        return format!("{} not found", missing.join(", "));
    }
    match e {
        Error::DeviceUnavailable { why, .. } => why
            .split([':', ';'])
            .next()
            .unwrap_or(why)
            .trim()
            .chars()
            .take(60)
            .collect(),
        _ => "see ENCORE_LOG=info".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_specs() {
        assert_eq!("auto".parse::<DeviceSpec>().unwrap(), DeviceSpec::Auto);
        assert_eq!("cpu".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
        assert_eq!("cuda".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(0));
        assert_eq!("cuda:3".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(3));
        let e = "tpu".parse::<DeviceSpec>().unwrap_err().to_string();
        assert!(e.contains("`tpu`"), "{e}");
        assert!("cuda:x".parse::<DeviceSpec>().is_err());
    }

    /// On a machine without a usable GPU (CI), `cuda` is a clear error and `auto` falls
    /// back to the CPU. On a GPU machine both open CUDA.
    #[test]
    fn cuda_absent_is_an_error_and_auto_falls_back() {
        let (auto, note) = open(DeviceSpec::Auto).unwrap();
        match open(DeviceSpec::Cuda(0)) {
            Ok(_) => assert!(matches!(auto, Opened::Cuda(_))),
            Err(e) => {
                assert!(matches!(e, Error::DeviceUnavailable { .. }), "{e}");
                assert!(e.to_string().starts_with("device `cuda"), "{e}");
                assert!(matches!(auto, Opened::Cpu(_)));
                let note = note.unwrap();
                assert!(note.ends_with("; running on the CPU"), "{note}");
                assert!(!note.contains('\n') && note.len() < 100, "{note}");
            }
        }
    }
}
