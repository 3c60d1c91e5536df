//! The one error type of encore (the backend layer and everything above it). Every message names the thing (tensor, op, file,
//! byte count) and, where there is one, the fix.

use crate::dtype::DType;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor argument of an op has the wrong shape.
    #[error("{op}: tensor `{name}` has shape {found:?}, expected {expected}")]
    Shape {
        op: &'static str,
        name: &'static str,
        found: Vec<usize>,
        expected: String,
    },
    /// A tensor argument of an op has the wrong dtype.
    #[error("{op}: tensor `{name}` has dtype {found}, expected {expected}")]
    DType {
        op: &'static str,
        name: &'static str,
        found: DType,
        expected: String,
    },
    /// Tensors of an op live on different backends.
    #[error("{op}: tensor `{name}` lives on {found}, but the op runs on {expected}")]
    WrongDevice {
        op: &'static str,
        name: &'static str,
        found: String,
        expected: String,
    },
    /// An op argument that is not a tensor is out of range.
    #[error("{op}: {what}")]
    Invalid { op: &'static str, what: String },
    /// A forbidden operation was attempted while a graph was being captured.
    #[error(
        "`{op}` is not allowed during graph capture (captures may not copy host<->device, \
         synchronise or allocate outside the capture arena)"
    )]
    CaptureViolation { op: &'static str },
    /// Capture begun twice, ended without beginning, and similar misuse.
    #[error("capture: {0}")]
    Capture(String),
    /// An allocation failed.
    #[error("out of memory on {device}: could not allocate {bytes} bytes for {what}")]
    OutOfMemory {
        device: String,
        bytes: usize,
        what: String,
    },
    /// A run would need more memory than it may use: `what` needs `need` bytes (`detail`
    /// breaks them down) but `limit` bytes are available (`limit_what` says whose); `fix`
    /// says what to lower.
    #[error(
        "{what} needs {need_gib:.2} GiB ({detail}) but the limit is {limit_gib:.2} GiB ({limit_what}); {fix}",
        need_gib = gib(*.need),
        limit_gib = gib(*.limit)
    )]
    MemoryBudget {
        what: String,
        need: usize,
        detail: String,
        limit: usize,
        limit_what: String,
        fix: String,
    },
    /// A virtual-memory call (reserve, create, map, unmap, set access) failed.
    #[error("{device}: {call} of {bytes} bytes failed: {message}")]
    Vmm {
        device: String,
        call: &'static str,
        bytes: usize,
        message: String,
    },
    /// The requested device cannot be used (no GPU, missing library, bad index).
    #[error("device `{device}` is unavailable: {why}")]
    DeviceUnavailable { device: String, why: String },
    /// A CUDA driver/NVRTC/cuBLAS call failed.
    #[error("CUDA {call} failed: {message}")]
    Cuda { call: String, message: String },
    /// A kernel failed to compile.
    #[error("compiling kernel file `{file}` failed:\n{log}")]
    KernelCompile { file: String, log: String },
    /// A model's `config.json` is missing a field, has an unsupported value, or an
    /// unknown architecture.
    #[error("model config `{path}`: {what}")]
    Config { path: String, what: String },
    /// A weight tensor is missing, has the wrong shape or dtype, or its file is malformed.
    #[error("weights: tensor `{tensor}`: {what}")]
    Weights { tensor: String, what: String },
    /// A weights file (or its index) cannot be parsed.
    #[error("weights file `{path}`: {what}")]
    WeightsFile { path: String, what: String },
    /// Tokenizer or chat-template failure.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The KV cache has too few free blocks for a request.
    #[error("KV cache: {what} needs {needed} blocks, {free} free")]
    OutOfBlocks {
        what: String,
        needed: usize,
        free: usize,
    },
    /// A request can never run as asked: admission refused it, naming the parameter (the
    /// engine's typed `encore_core::request::Refusal`, boxed: this layer knows no
    /// requests). Callers that need the parameter take the `Refusal` itself, which
    /// `Scheduler::add` returns; this variant only carries it through `?`.
    #[error("{0}")]
    Refused(Box<dyn std::error::Error + Send + Sync>),
    /// A filesystem operation failed. The OS message is the error's `source` (printed
    /// once by a chain printer such as anyhow's `{:#}`), not part of this message.
    #[error("{what} `{path}`")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Bytes in GiB, for messages.
pub fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

impl Error {
    pub fn invalid(op: &'static str, what: impl Into<String>) -> Self {
        Error::Invalid {
            op,
            what: what.into(),
        }
    }

    pub fn cuda(call: impl Into<String>, err: impl std::fmt::Debug) -> Self {
        Error::Cuda {
            call: call.into(),
            message: format!("{err:?}"),
        }
    }
}
