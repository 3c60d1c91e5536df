//! The CUDA backend: cudarc with dynamic loading (the crate builds with no CUDA
//! installed), one non-blocking compute stream (the legacy default stream cannot be
//! captured), encore-owned device buffers (cudarc's per-buffer event tracking is off, so
//! nothing records events behind a capture's back), NVRTC-compiled kernels loaded at
//! start-up and resolved into typed handles (`handles`), cuBLASLt GEMMs, and CUDA graphs
//! for capture/replay.

mod backend_impl;
mod blas;
mod collective;
use collective::P2p;
mod copy_queue;
mod handles;
mod kernels;
pub mod nccl;
pub mod nvrtc;
mod open;

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::driver::{
    result as drv, sys as drv_sys, CudaContext, CudaModule, CudaStream, LaunchConfig,
};

pub use crate::storage::cuda::{CudaBuffer, PinnedStaging};
pub use kernels::quant::{qgemv_default_rows, QuantGemm, FP8_ROWWISE_MIN_ROWS};
pub use nvrtc::CompileReport;

use crate::backend::staging::Staging;
use crate::backend::{
    Activation, Attention, Backend, Graph, HostStaging, LogitBias, Mlp, Moe, Norm, NormMatmul,
    PreNorm, QkvRope, Sampling,
};
use crate::error::{Error, Result};
use crate::ops;
use crate::tensor::{DType, Storage, Tensor};
use crate::vmm::{cuda::CudaVmm, Vmm};

/// Which CUDA libraries can be loaded on this machine.
#[derive(Clone, Debug)]
pub struct CudaLibraries {
    pub driver: bool,
    pub nvrtc: bool,
    pub cublaslt: bool,
}

impl CudaLibraries {
    /// Probe with dlopen only: cudarc panics on first use of a missing library.
    pub fn probe() -> Self {
        // SAFETY: each call only attempts to dlopen the library.
        unsafe {
            CudaLibraries {
                driver: drv_sys::is_culib_present(),
                nvrtc: cudarc::nvrtc::sys::is_culib_present(),
                cublaslt: cudarc::cublaslt::sys::is_culib_present(),
            }
        }
    }

    pub fn missing(&self) -> Vec<&'static str> {
        let mut m = Vec::new();
        if !self.driver {
            m.push("libcuda (the NVIDIA driver)");
        }
        if !self.nvrtc {
            m.push("libnvrtc");
        }
        if !self.cublaslt {
            m.push("libcublasLt");
        }
        m
    }
}

/// Number of CUDA devices, or why there are none.
pub fn device_count() -> Result<usize> {
    let libs = CudaLibraries::probe();
    if !libs.driver {
        return Err(Error::DeviceUnavailable {
            device: "cuda".into(),
            why: "libcuda (the NVIDIA driver) is not installed or not on the library path".into(),
        });
    }
    drv::init().map_err(|e| Error::DeviceUnavailable {
        device: "cuda".into(),
        why: format!("cuInit failed: {e:?}"),
    })?;
    drv::device::get_count()
        .map(|n| n as usize)
        .map_err(|e| Error::cuda("cuDeviceGetCount", e))
}

/// Facts about the device, read once at start-up.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub sm_count: usize,
    pub total_memory: usize,
}

/// The CUDA backend of one device.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: handles::Kernels,
    num_kernels: usize,
    _modules: Vec<Arc<CudaModule>>,
    lt: blas::Lt,
    info: DeviceInfo,
    compile: CompileReport,
    capturing: AtomicBool,
    /// Matmuls with at most this many rows run the gemv kernels instead of cuBLASLt
    /// (`ENCORE_GEMV_MAX_ROWS`, default `kernels::GEMV_DEFAULT_ROWS`; 0 turns gemv off).
    gemv_max_rows: usize,
    /// The gemv splits k over more warps until it has this many CTAs per SM
    /// (`ENCORE_GEMV_CTAS_PER_SM`, 1 to 16, default `kernels::GEMV_CTAS_PER_SM`; a tuning
    /// knob).
    gemv_ctas_per_sm: usize,
    /// Rows of x up to which a quantized weight's matmul runs the quantized gemv
    /// (`ENCORE_QGEMV_MAX_ROWS`; `None`: `kernels::quant::qgemv_default_rows` per format).
    qgemv_max_rows: Option<usize>,
    /// Launch kernels with programmatic dependent launch (sm_90+, unless `ENCORE_PDL=0`).
    pdl: bool,
    /// Prefill / mixed attention in bf16 / f16 with head_dim 64 or 128 runs the
    /// tensor-core kernel (unless `ENCORE_PREFILL_ATTENTION=split`, which keeps the
    /// split-K kernel, for comparisons).
    flash_prefill: bool,
    /// On sm_90 the tensor-core prefill kernel is the warpgroup-MMA one
    /// (`attention_prefill_wg_*`), unless `ENCORE_PREFILL_ATTENTION=mma` keeps the
    /// mma.sync one (`attention_prefill_*`), for comparisons.
    wgmma_prefill: bool,
    /// Decode attention of a GQA model in bf16 / f16 with head_dim 64 or 128 runs the
    /// tensor-core kernel (unless `ENCORE_DECODE_ATTENTION=split`, for comparisons).
    tc_decode: bool,
    vmm: Mutex<Option<Arc<CudaVmm>>>,
    /// Where matmuls with a quantized weight and many rows decode it before the GEMM
    /// (`Backend::reserve_dequant_scratch`; `kernels::quant`).
    dequant_scratch: Mutex<kernels::quant::DequantScratch>,
    /// How matmuls with a quantized weight and more rows than the gemv takes run
    /// (`ENCORE_QUANT_GEMM`: `auto`, `mma` or `dequant`; `kernels::quant`).
    quant_gemm: QuantGemm,
    /// Mixture-of-experts layers of at least this many token rows run the grouped GEMM
    /// (`ENCORE_MOE_GEMM_MIN_TOKENS`); `None`: those averaging
    /// `kernels::MOE_GEMM_MIN_PAIRS_PER_EXPERT` pairs an expert.
    moe_gemm_min_tokens: Option<usize>,
    /// Whether a few-token mixture-of-experts layer's quantized experts run on the tensor
    /// cores (`quant_moe_mma.cuh`, x in bf16) or the f32 pair kernels (`ENCORE_MOE_PAIRS`:
    /// `mma` or `gemv`); `None` (`auto`, the default): the tensor cores for MXFP4.
    moe_pairs_mma: Option<bool>,
    /// CTAs per SM of an expert prefetch's copy kernel (`ENCORE_EXPERT_PREFETCH_CTAS`,
    /// default `kernels::MOE_PREFETCH_CTAS_PER_SM`).
    prefetch_ctas_per_sm: u32,
    /// The expert cache's copies by the bulk-copy engine (`moe_cache_fill_bulk`) over this
    /// many CTAs (`ENCORE_EXPERT_FILL=bulk`, `ENCORE_EXPERT_FILL_CTAS`); `None`: by
    /// threads (`moe_cache_fill`).
    bulk_fill: Option<u32>,
    /// The tensor-parallel group's communicator (`None`: alone).
    comm: Option<nccl::Comm>,
    /// The one-shot all-reduce's peer memory (`None`: alone, no peer access between the
    /// group's devices, or `ENCORE_ALLREDUCE=nccl`).
    p2p: Option<P2p>,
    /// Whether all-reduces that fit take the one-shot kernel (`set_one_shot_allreduce`).
    p2p_on: AtomicBool,
    /// `ENCORE_ALLREDUCE=skip`, a measurement knob only: every all-reduce is left out (an
    /// all-reduce + RMSNorm is the norm alone), so a step's time without its collectives
    /// can be read beside the real one. The ranks' results are wrong.
    skip_all_reduce: bool,
    /// Whether a row-parallel projection + norm may take the pushed all-reduce
    /// (`matmul_all_reduce_rms_norm`; off with `ENCORE_ALLREDUCE=oneshot`, for comparisons).
    push_on: bool,
    /// The expert prefetch's stream (`args::ExpertPrefetch`), made at its first use.
    expert_side: Mutex<Option<SideStream>>,
    /// `ENCORE_SKIP_OPS` (open.rs): ops left out, a measurement knob.
    skip_ops: SkipOps,
}

/// Ops a measurement leaves out (`ENCORE_SKIP_OPS`).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct SkipOps {
    pub(super) norm: bool,
    pub(super) qkv_rope: bool,
    pub(super) attention: bool,
    pub(super) matmul: bool,
}

/// Queues a prefetch's copies on the side stream, at the given launch priority.
pub(in crate::backend::cuda) type SideCopies<'a> = dyn Fn(&CudaStream, i32) -> Result<()> + 'a;

/// A stream forked from the compute stream and joined back by events: the expert
/// prefetch's copies run there, one after another, beside the compute stream's work.
/// Inside a capture the fork brings it into the graph and the join adds the edges back.
struct SideStream {
    stream: Arc<CudaStream>,
    /// Its priority (the highest).
    priority: i32,
    fork: drv_sys::CUevent,
    /// Recorded after each prefetch's copies, alternately.
    done: [drv_sys::CUevent; 2],
    next: usize,
    /// The `done` event of the prefetch not joined yet.
    pending: Option<usize>,
}

// SAFETY: driver handles used from the thread driving the backend, under its mutex.
unsafe impl Send for SideStream {}

impl Drop for SideStream {
    fn drop(&mut self) {
        // SAFETY: our events; nothing waits on them any more (the backend is dropping).
        unsafe {
            let _ = drv_sys::cuEventDestroy_v2(self.fork);
            let _ = drv_sys::cuEventDestroy_v2(self.done[0]);
            let _ = drv_sys::cuEventDestroy_v2(self.done[1]);
        }
    }
}

impl CudaBackend {
    /// An expert cache's call, between its plans and its own fill: queue `copies` (a
    /// prefetch's, for a later layer) on the side stream (made at its first use), forked
    /// from the compute stream here; then the compute stream waits for the prefetch
    /// queued before (for this layer: its slots are read next, and this call's fill may
    /// take one of them). The new one stays pending until the next call or
    /// [`Backend::join_expert_prefetch`].
    pub(in crate::backend::cuda) fn expert_side(
        &self,
        copies: Option<&SideCopies<'_>>,
    ) -> Result<()> {
        let mut side = self.expert_side.lock().unwrap_or_else(|e| e.into_inner());
        if side.is_none() && copies.is_none() {
            return Ok(());
        }
        if side.is_none() {
            self.bind()?;
            // The highest priority: the block scheduler places its copy CTAs as soon as a
            // compute kernel's CTA leaves an SM, instead of after that kernel's whole grid
            // (the copies would otherwise wait behind each large compute grid).
            let (_, greatest) = drv::stream::get_priority_range()
                .map_err(|e| Error::cuda("cuCtxGetStreamPriorityRange", e))?;
            let stream = self
                .ctx
                .new_stream_with_priority(greatest)
                .map_err(|e| Error::cuda("cuStreamCreateWithPriority (expert prefetch)", e))?;
            let event = || {
                drv::event::create(drv_sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                    .map_err(|e| Error::cuda("cuEventCreate", e))
            };
            *side = Some(SideStream {
                stream,
                priority: greatest,
                fork: event()?,
                done: [event()?, event()?],
                next: 0,
                pending: None,
            });
        }
        let s = side.as_mut().expect("made above");
        let older = s.pending.take();
        if let Some(copies) = copies {
            self.bind()?;
            copy_queue::order(s.fork, &self.stream, &s.stream, "expert prefetch fork")?;
            copies(&s.stream, s.priority)?;
            let done = s.done[s.next];
            // SAFETY: our event, our live stream.
            unsafe { drv_sys::cuEventRecord(done, s.stream.cu_stream()) }
                .result()
                .map_err(|e| Error::cuda("cuEventRecord (expert prefetch)", e))?;
            s.pending = Some(s.next);
            s.next ^= 1;
        }
        if let Some(o) = older {
            self.wait_side(s, o)?;
        }
        Ok(())
    }

    /// The compute stream waits for `s`'s `done[i]`.
    fn wait_side(&self, s: &SideStream, i: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: our event (recorded on the side stream), our live compute stream.
        unsafe { drv_sys::cuStreamWaitEvent(self.stream.cu_stream(), s.done[i], 0) }
            .result()
            .map_err(|e| Error::cuda("cuStreamWaitEvent (expert prefetch join)", e))
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // A rank of a group: let its stream drain before its part of the group's memory
        // (staging the peers write, the abort word its kernels poll) is freed. After an
        // abort every wait on a peer ends, so this returns.
        if self.p2p.is_some() {
            let _ = self.bind();
            let _ = self.stream.synchronize();
        }
    }
}

/// Bytes one rank's pushed outputs may take in a peer's staging (a call's `[rows, n]`):
/// 8 rows of an 8192-wide f32 hidden state.
const PUSH_CAP: usize = 256 << 10;

/// The one-shot all-reduce takes tensors up to this size (decode's hidden states up to a
/// few hundred rows); NCCL the rest.
const P2P_CAP: usize = 2 << 20;

/// Device address of a CUDA tensor's first element.
///
/// Panics on a CPU tensor; every op checks devices first.
pub(super) fn dptr(t: &Tensor) -> u64 {
    match t.storage() {
        Storage::Cuda(b) => b.dptr() + t.offset() as u64,
        Storage::Cpu(_) => unreachable!("dptr of a CPU tensor (check_device first)"),
    }
}

impl CudaBackend {
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// How the kernels were obtained at start-up (compiled or cached, time).
    pub fn compile_report(&self) -> &CompileReport {
        &self.compile
    }

    /// Number of loaded kernel functions.
    pub fn num_kernels(&self) -> usize {
        self.num_kernels
    }

    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        drv::mem_get_info().map_err(|e| Error::cuda("cuMemGetInfo", e))
    }

    /// Number of distinct GEMM shapes planned so far.
    pub fn num_gemm_plans(&self) -> usize {
        self.lt.num_plans()
    }

    fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| Error::cuda("cuCtxSetCurrent", e))
    }

    /// The kernels, resolved at load.
    fn kernels(&self) -> &handles::Kernels {
        &self.kernels
    }

    /// Send matmuls of at most `rows` rows (clamped to the largest gemv variant) to the
    /// gemv kernels; 0 sends every matmul to cuBLASLt. For tests and measurements.
    pub fn set_gemv_max_rows(&mut self, rows: usize) {
        self.gemv_max_rows = rows.min(kernels::GEMV_MAX_ROWS);
    }

    /// CTAs per SM the gemv's k split aims for (`ENCORE_GEMV_CTAS_PER_SM`).
    pub(in crate::backend::cuda) fn gemv_ctas_per_sm(&self) -> usize {
        self.gemv_ctas_per_sm
    }

    /// Rows up to which quantized matmuls run the quantized gemv, where set.
    pub(in crate::backend::cuda) fn qgemv_max_rows(&self) -> Option<usize> {
        self.qgemv_max_rows
    }

    /// The quantized-weight GEMM setting (`ENCORE_QUANT_GEMM`).
    pub(in crate::backend::cuda) fn quant_gemm(&self) -> QuantGemm {
        self.quant_gemm
    }

    /// This backend with quantized-weight matmuls of up to `rows` rows (at most 8) on the
    /// quantized gemv, whatever `ENCORE_QGEMV_MAX_ROWS` says.
    pub fn with_qgemv_max_rows(mut self, rows: usize) -> Self {
        self.qgemv_max_rows = Some(rows.min(kernels::GEMV_MAX_ROWS));
        self
    }

    /// This backend with quantized-weight matmuls beyond the gemv's rows run as `g` says,
    /// whatever `ENCORE_QUANT_GEMM` says (tests and comparisons pin one path).
    pub fn with_quant_gemm(mut self, g: QuantGemm) -> Self {
        self.quant_gemm = g;
        self
    }

    /// Whether a few-token mixture-of-experts layer's quantized experts run on the tensor
    /// cores (x in bf16), where set; `None`: by format.
    pub(in crate::backend::cuda) fn moe_pairs_mma(&self) -> Option<bool> {
        self.moe_pairs_mma
    }

    /// This backend with a few-token mixture-of-experts layer's quantized experts on the
    /// tensor cores (`true`) or the f32 pair kernels, whatever `ENCORE_MOE_PAIRS` says
    /// (tests and comparisons pin one path).
    pub fn with_moe_pairs_mma(mut self, on: bool) -> Self {
        self.moe_pairs_mma = Some(on);
        self
    }

    /// Token rows from which a mixture-of-experts layer runs the grouped GEMM, where set.
    pub(in crate::backend::cuda) fn moe_gemm_min_tokens(&self) -> Option<usize> {
        self.moe_gemm_min_tokens
    }

    /// This backend with mixture-of-experts layers of at least `tokens` rows on the
    /// grouped GEMM, whatever `ENCORE_MOE_GEMM_MIN_TOKENS` says (tests pin one path).
    pub fn with_moe_gemm_min_tokens(mut self, tokens: usize) -> Self {
        self.moe_gemm_min_tokens = Some(tokens);
        self
    }

    /// Whether prefill attention may use the tensor-core kernel (see `flash_prefill`).
    pub(super) fn flash_prefill(&self) -> bool {
        self.flash_prefill
    }

    /// Whether the tensor-core prefill kernel is the warpgroup-MMA one (see
    /// `wgmma_prefill`).
    pub(super) fn wgmma_prefill(&self) -> bool {
        self.wgmma_prefill
    }

    /// Whether decode attention may use the tensor-core kernel (see `tc_decode`).
    pub(super) fn tc_decode(&self) -> bool {
        self.tc_decode
    }

    pub(super) fn sm_count(&self) -> usize {
        self.info.sm_count
    }

    /// Launch `kernel` on the compute stream. `args` points at each argument value.
    fn launch(
        &self,
        kernel: &handles::Kernel,
        cfg: LaunchConfig,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        self.launch_on(&self.stream, self.pdl, None, kernel, cfg, args)
    }

    /// Launch `kernel` on `stream` (the compute stream, or a stream forked from it), with
    /// programmatic dependent launch when `pdl`, else at `priority` if given (a graph's
    /// kernel node keeps it).
    fn launch_on(
        &self,
        stream: &CudaStream,
        pdl: bool,
        priority: Option<i32>,
        kernel: &handles::Kernel,
        cfg: LaunchConfig,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        let f = &kernel.f;
        self.bind()?;
        // Programmatic dependent launch: every kernel starts with `pdl_enter()` (see
        // common.cuh; the gemvs issue their first weight loads before it), which waits for
        // its predecessor, so the attribute lets the launch, and those loads, overlap the
        // predecessor's tail (nvrtc.rs's every_kernel_waits_for_the_one_before_it).
        // SAFETY: a plain-old-data attribute; the union member written is the one its id
        // selects.
        let mut attr: drv_sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        let num_attrs = match (pdl, priority) {
            (true, _) => {
                attr.id = drv_sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
                attr.value.programmaticStreamSerializationAllowed = 1;
                1
            }
            (false, Some(p)) => {
                attr.id = drv_sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PRIORITY;
                attr.value.priority = p;
                1
            }
            (false, None) => 0,
        };
        let config = drv_sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: num_attrs,
        };
        // SAFETY: the launcher built `args` to match the kernel's parameter list; every
        // pointer argument is a validated tensor of this device; `config` and `attr` live
        // across the call.
        unsafe {
            drv_sys::cuLaunchKernelEx(
                &config,
                f.cu_function(),
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(|e| Error::cuda(format!("launch of kernel `{}`", kernel.name), e))
    }

    fn forbid_in_capture(&self, op: &'static str) -> Result<()> {
        if self.capturing.load(Ordering::Acquire) {
            return Err(Error::CaptureViolation { op });
        }
        Ok(())
    }

    fn check_device(&self, op: &'static str, tensors: &[(&'static str, &Tensor)]) -> Result<()> {
        for (name, t) in tensors {
            let ok = matches!(t.storage(), Storage::Cuda(b) if b.ordinal() == self.info.ordinal);
            if !ok {
                return Err(Error::WrongDevice {
                    op,
                    name,
                    found: t.device_name(),
                    expected: self.device_name(),
                });
            }
        }
        Ok(())
    }

    /// The device and shapes of a fused op's residual add and norm ([`PreNorm`]) of x.
    fn check_pre_norm(&self, op: &'static str, x: &Tensor, n: &PreNorm<'_>) -> Result<()> {
        let t = [
            ("residual", n.residual),
            ("norm weight", n.norm.weight()),
            ("normed", n.normed),
        ];
        self.check_device(op, &t)?;
        if let Some(b) = n.norm.bias() {
            self.check_device(op, &[("norm bias", b)])?;
        }
        ops::check_rms_norm(x, Some(n.residual), n.norm, n.eps, n.normed).map(|_| ())
    }
}

/// A CUDA graph captured on the compute stream.
pub struct CudaGraphExec {
    graph: cudarc::driver::CudaGraph,
    num_nodes: usize,
}

// SAFETY: the graph is only launched through `&self` from the thread driving the backend;
// CUDA graph execs may be launched from any thread as long as calls are serialised, which
// the engine's single step loop guarantees.
unsafe impl Send for CudaGraphExec {}

impl Graph for CudaGraphExec {
    fn replay(&self) -> Result<()> {
        self.graph
            .launch()
            .map_err(|e| Error::cuda("cuGraphLaunch", e))
    }
    fn num_ops(&self) -> usize {
        self.num_nodes
    }
}
