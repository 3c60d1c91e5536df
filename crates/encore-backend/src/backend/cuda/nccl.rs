//! The CUDA backend's tensor-parallel group: one NCCL communicator per device, created
//! together from one thread (`ncclCommInitAll`), each owned by its rank's backend and
//! used on that backend's one stream, so collectives are captured into its graphs like
//! any other op. NCCL is loaded at run time (cudarc's `nccl` bindings); NVLink
//! multicast (NVLS) is off unless `NCCL_NVLS_ENABLE` says otherwise.

use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::nccl::{result as nccl, sys};

use crate::error::{Error, Result};
use crate::tensor::DType;

/// One rank's communicator.
pub(super) struct Comm {
    raw: sys::ncclComm_t,
    pub rank: usize,
    pub size: usize,
    /// `ncclCommAbort` frees the communicator: after it `raw` is not aborted again nor
    /// destroyed, and collectives issued later are refused. Not guarded: a collective
    /// this rank's thread issues while another thread aborts, and the NCCL kernels of a
    /// graph replayed after the abort (the group is broken then; the step fails).
    aborted: AtomicBool,
}

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it are not
// concurrent; each is owned by one backend, whose ops are issued by its rank's thread.
unsafe impl Send for Comm {}
// SAFETY: as above (the backend's `&self` ops are not issued concurrently on one rank).
unsafe impl Sync for Comm {}

impl Drop for Comm {
    fn drop(&mut self) {
        if !*self.aborted.get_mut() {
            // SAFETY: `raw` came from ncclCommInitAll, was not aborted (which frees it) and
            // is destroyed once.
            let _ = unsafe { nccl::comm_destroy(self.raw) };
        }
    }
}

/// Whether libnccl can be loaded.
pub fn available() -> bool {
    // SAFETY: only tries to load the library.
    unsafe { sys::is_culib_present() }
}

/// Communicators for `devices` (rank `k` on `devices[k]`).
pub(super) fn init_all(devices: &[usize]) -> Result<Vec<Comm>> {
    if !available() {
        return Err(Error::DeviceUnavailable {
            device: format!("cuda:{devices:?}"),
            why: "libnccl.so not found: tensor parallelism on CUDA needs NCCL (e.g. the \
                  nvidia-nccl wheel's lib directory, with libnccl.so linked to libnccl.so.2, \
                  on LD_LIBRARY_PATH)"
                .into(),
        });
    }
    // NVLink multicast off; every connection made at init, not lazily at a collective's
    // first call (which may be inside a graph capture, where NCCL cannot set up peers).
    for (var, value) in [("NCCL_NVLS_ENABLE", "0"), ("NCCL_RUNTIME_CONNECT", "0")] {
        if std::env::var_os(var).is_none() {
            // SAFETY: called while opening the group, before any rank thread exists (the
            // engine's threads are spawned after the backends are open).
            unsafe { std::env::set_var(var, value) };
        }
    }
    let n = devices.len();
    let mut raw: Vec<sys::ncclComm_t> = vec![std::ptr::null_mut(); n];
    let ordinals: Vec<i32> = devices.iter().map(|&d| d as i32).collect();
    // SAFETY: `raw` has room for n communicators; `ordinals` names n devices.
    unsafe { nccl::comm_init_all(raw.as_mut_ptr(), n as i32, ordinals.as_ptr()) }.map_err(|e| {
        Error::DeviceUnavailable {
            device: format!("cuda devices {devices:?}"),
            why: format!("ncclCommInitAll: {e:?}"),
        }
    })?;
    Ok(raw
        .into_iter()
        .enumerate()
        .map(|(rank, raw)| Comm {
            raw,
            rank,
            size: n,
            aborted: AtomicBool::new(false),
        })
        .collect())
}

fn data_type(dtype: DType) -> Result<sys::ncclDataType_t> {
    Ok(match dtype {
        DType::BF16 => sys::ncclDataType_t::ncclBfloat16,
        DType::F16 => sys::ncclDataType_t::ncclFloat16,
        DType::F32 => sys::ncclDataType_t::ncclFloat32,
        other => return Err(Error::invalid("collective", format!("dtype {other}"))),
    })
}

impl Comm {
    /// An error of `what` on this rank's communicator.
    fn err(&self, what: &str, why: impl std::fmt::Display) -> Error {
        Error::DeviceUnavailable {
            device: format!("nccl rank {} of {}", self.rank, self.size),
            why: format!("{what}: {why}"),
        }
    }

    /// The error of a collective on an aborted communicator.
    fn live(&self, what: &str) -> Result<()> {
        if self.aborted.load(Ordering::Acquire) {
            let why = "the group's communicators were aborted (a rank failed)";
            return Err(self.err(what, why));
        }
        Ok(())
    }

    /// Sum `count` elements at `ptr` over the ranks, in place, on `stream`.
    ///
    /// # Safety
    /// `ptr` holds `count` elements of `dtype` on this rank's device; `stream` is on it.
    pub unsafe fn all_reduce(
        &self,
        ptr: u64,
        count: usize,
        dtype: DType,
        stream: sys::cudaStream_t,
    ) -> Result<()> {
        self.live("ncclAllReduce")?;
        let p = ptr as *mut std::ffi::c_void;
        nccl::all_reduce(
            p,
            p,
            count,
            data_type(dtype)?,
            sys::ncclRedOp_t::ncclSum,
            self.raw,
            stream,
        )
        .map(|_| ())
        .map_err(|e| self.err("ncclAllReduce", format!("{e:?}")))
    }

    /// Gather `count` elements at `src` of every rank into `dst` (rank order).
    ///
    /// # Safety
    /// `src` holds `count` and `dst` `size * count` elements of `dtype` on this rank's
    /// device; `stream` is on it.
    pub unsafe fn all_gather(
        &self,
        src: u64,
        dst: u64,
        count: usize,
        dtype: DType,
        stream: sys::cudaStream_t,
    ) -> Result<()> {
        self.live("ncclAllGather")?;
        nccl::all_gather(
            src as *const std::ffi::c_void,
            dst as *mut std::ffi::c_void,
            count,
            data_type(dtype)?,
            self.raw,
            stream,
        )
        .map(|_| ())
        .map_err(|e| self.err("ncclAllGather", format!("{e:?}")))
    }

    /// End the communicator's pending and future collectives on every rank (a peer
    /// failed).
    pub fn abort(&self) {
        if self.aborted.swap(true, Ordering::AcqRel) {
            return;
        }
        // SAFETY: `raw` is live (not aborted before: the swap above lets one caller
        // through); NCCL allows abort from any thread.
        let _ = unsafe { nccl::comm_abort(self.raw) };
    }
}
