//! GEMM through cuBLASLt: bf16/f16/f32 inputs, or FP8 E4M3 with one f32 scale per 128
//! values of k on both operands (Hopper's block-scaled FP8 GEMM) or one a row of each
//! (row-wise: per token and per output channel, ~1.4x faster), f32 accumulation, a fixed
//! workspace allocated once (so matmuls are capture-safe), and one plan per shape —
//! descriptors and the heuristic's algorithm chosen on first use and cached, never
//! re-chosen per call (with `ENCORE_GEMM_TUNE=1`, the fastest of its first candidates,
//! timed on that first call outside a capture).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::{result as lt, sys};
use cudarc::driver::{CudaContext, CudaStream};

use crate::error::{Error, Result};
use crate::storage::CudaBuffer;
use crate::tensor::DType;

/// cuBLASLt's recommended workspace on Hopper.
pub const WORKSPACE_BYTES: usize = 32 << 20;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct PlanKey {
    m: usize,
    n: usize,
    k: usize,
    dtype: DType,
    out: DType,
    bias: bool,
    /// Alignment (bytes, power of two up to 256) of the x, w, out pointers the plan
    /// was chosen for; a less aligned call gets its own plan.
    align: [u32; 3],
    /// FP8 operands: w's leading dimension in bytes (0: x and w are in `dtype`).
    fp8_ld: usize,
    /// FP8 scaled per row (OUTER_VEC_32F) instead of per 128 values (VEC128_32F).
    fp8_rows: bool,
}

/// Descriptors and algorithm for one shape. Destroyed with the `Lt`.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
    /// The heuristic's candidates, best first (`algo` is the first until timed).
    candidates: Vec<sys::cublasLtMatmulAlgo_t>,
}

/// The heuristic's candidates asked for when the GEMMs are timed ([`gemm_tune`]).
const TUNE_CANDIDATES: usize = 8;
/// Timed calls a candidate (after one untimed).
const TUNE_CALLS: usize = 3;
/// Smallest m·n·k timed: below it a GEMM takes a few microseconds and the heuristic's
/// first choice stands.
const TUNE_MIN_WORK: usize = 1 << 30;

/// Whether a new shape's GEMM times the heuristic's candidates on its first call (outside
/// a capture) and keeps the fastest: `ENCORE_GEMM_TUNE=1`. Off by default: on the 8B FP8
/// prefill and decode steps on an H200 it moved the step by less than the noise
/// (BENCHMARKS.md), and a timed choice can differ from run to run.
fn gemm_tune() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("ENCORE_GEMM_TUNE").is_ok_and(|v| v.trim() == "1"))
}

// SAFETY: the plan's descriptors are immutable after creation except the bias pointer,
// which is only set under the `Lt` mutex right before the matmul that uses it.
unsafe impl Send for Plan {}

pub struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: CudaBuffer,
    plans: Mutex<HashMap<PlanKey, Plan>>,
}

// SAFETY: the handle is used under the `plans` mutex only.
unsafe impl Send for Lt {}
unsafe impl Sync for Lt {}

fn data_type(d: DType) -> sys::cudaDataType {
    match d {
        DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
        DType::F16 => sys::cudaDataType::CUDA_R_16F,
        _ => sys::cudaDataType::CUDA_R_32F,
    }
}

fn err(call: &str) -> impl Fn(lt::CublasError) -> Error + '_ {
    move |e| Error::cuda(call, e)
}

/// Largest power of two (<= 256) dividing `ptr`.
fn alignment(ptr: u64) -> u32 {
    if ptr == 0 {
        256
    } else {
        (1u64 << ptr.trailing_zeros().min(8)) as u32
    }
}

/// Pointers and sizes of one `out = x·wᵀ (+bias)`.
pub struct MatmulCall {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub dtype: DType,
    pub out_dtype: DType,
    pub x: u64,
    pub w: u64,
    pub bias: Option<u64>,
    pub out: u64,
    /// x and w in FP8 E4M3 (`dtype` stays the bias's type), each with its scales.
    pub fp8: Option<Fp8Operands>,
}

/// The FP8 operands of a [`MatmulCall`]: w's rows are `w_ld` bytes apart (its E4M3 values
/// first). Per 128 values (`rows` false): `w_scales` is `[k / 128][n]` f32 and `x_scales`
/// `[k / 128][m]` f32, rows contiguous (cuBLASLt's VEC128_32F layout; m a multiple of 4, n
/// of 8). Per row (`rows`): `w_scales` `[n]` and `x_scales` `[m]` (OUTER_VEC_32F).
#[derive(Clone, Copy)]
pub struct Fp8Operands {
    pub w_ld: usize,
    pub w_scales: u64,
    pub x_scales: u64,
    pub rows: bool,
}

impl Lt {
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        ctx.bind_to_thread()
            .map_err(|e| Error::cuda("cuCtxSetCurrent", e))?;
        let handle = lt::create_handle().map_err(err("cublasLtCreate"))?;
        let workspace = CudaBuffer::new(ctx, WORKSPACE_BYTES, "cuBLASLt workspace")?;
        Ok(Lt {
            handle,
            workspace,
            plans: Mutex::new(HashMap::new()),
        })
    }

    /// Number of distinct shapes planned so far.
    pub fn num_plans(&self) -> usize {
        self.plans.lock().unwrap().len()
    }

    pub fn matmul(&self, stream: &CudaStream, c: &MatmulCall) -> Result<()> {
        if c.m == 0 || c.n == 0 {
            return Ok(());
        }
        let key = PlanKey {
            m: c.m,
            n: c.n,
            k: c.k,
            dtype: c.dtype,
            out: c.out_dtype,
            bias: c.bias.is_some(),
            align: [alignment(c.x), alignment(c.w), alignment(c.out)],
            fp8_ld: c.fp8.map_or(0, |f| f.w_ld),
            fp8_rows: c.fp8.is_some_and(|f| f.rows),
        };
        let mut plans = self.plans.lock().unwrap();
        let (plan, fresh) = match plans.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => (e.into_mut(), false),
            std::collections::hash_map::Entry::Vacant(e) => (e.insert(self.plan(&key)?), true),
        };
        // SAFETY: descriptors are live (owned by `plans`); pointers were validated as
        // tensors of the planned shapes by `ops::check_matmul`.
        unsafe {
            if let Some(b) = c.bias {
                lt::set_matmul_desc_attribute(
                    plan.desc,
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    &b as *const u64 as *const c_void,
                    std::mem::size_of::<u64>(),
                )
                .map_err(err("cublasLtMatmulDescSetAttribute(BIAS_POINTER)"))?;
            }
            if let Some(f) = &c.fp8 {
                for (attr, p) in [
                    (
                        sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                        f.w_scales,
                    ),
                    (
                        sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                        f.x_scales,
                    ),
                ] {
                    lt::set_matmul_desc_attribute(
                        plan.desc,
                        attr,
                        &p as *const u64 as *const c_void,
                        std::mem::size_of::<u64>(),
                    )
                    .map_err(err("cublasLtMatmulDescSetAttribute(SCALE_POINTER)"))?;
                }
            }
            if fresh && plan.candidates.len() > 1 {
                let capturing = stream
                    .capture_status()
                    .map_err(|e| Error::cuda("cuStreamIsCapturing", e))?;
                if capturing
                    == cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
                {
                    plan.algo = self.fastest(stream, plan, c)?;
                }
            }
            self.run(stream, plan, &plan.algo, c).map_err(|e| {
                Error::cuda(
                    format!("cublasLtMatmul [{}x{}x{}] {}", c.m, c.n, c.k, c.dtype),
                    e,
                )
            })
        }
    }

    /// One `cublasLtMatmul` of `c` by `plan`'s descriptors (its pointers set) with `algo`.
    ///
    /// # Safety
    /// The plan's descriptors are live and `c`'s pointers are tensors of its shape.
    unsafe fn run(
        &self,
        stream: &CudaStream,
        plan: &Plan,
        algo: &sys::cublasLtMatmulAlgo_t,
        c: &MatmulCall,
    ) -> std::result::Result<(), lt::CublasError> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        lt::matmul(
            self.handle,
            plan.desc,
            &alpha as *const f32 as *const c_void,
            &beta as *const f32 as *const c_void,
            c.w as *const c_void,
            plan.a,
            c.x as *const c_void,
            plan.b,
            c.out as *const c_void,
            plan.d,
            c.out as *mut c_void,
            plan.d,
            algo,
            self.workspace.dptr() as *mut c_void,
            WORKSPACE_BYTES,
            stream.cu_stream() as sys::cudaStream_t,
        )
    }

    /// The fastest of the plan's candidates on `c`'s own operands (one untimed call, then
    /// [`TUNE_CALLS`] between two events; a candidate that fails is skipped), as vLLM and
    /// PyTorch's tunable ops time cuBLASLt's heuristics. The stream is synchronised: called
    /// only outside a capture, on a shape's first call. `out` is overwritten; the caller's
    /// call after it writes the result.
    ///
    /// # Safety
    /// As [`Lt::run`].
    unsafe fn fastest(
        &self,
        stream: &CudaStream,
        plan: &Plan,
        c: &MatmulCall,
    ) -> Result<sys::cublasLtMatmulAlgo_t> {
        use cudarc::driver::result::event;
        let flags = cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
        let ev = |call| move |e| Error::cuda(call, e);
        let (e0, e1) = (
            event::create(flags).map_err(ev("cuEventCreate"))?,
            event::create(flags).map_err(ev("cuEventCreate"))?,
        );
        let cs = stream.cu_stream();
        let mut best: Option<(f32, usize)> = None;
        let mut times = Vec::with_capacity(plan.candidates.len());
        for (i, algo) in plan.candidates.iter().enumerate() {
            if self.run(stream, plan, algo, c).is_err() {
                times.push(f32::NAN);
                continue;
            }
            event::record(e0, cs).map_err(ev("cuEventRecord"))?;
            let ok = (0..TUNE_CALLS).all(|_| self.run(stream, plan, algo, c).is_ok());
            event::record(e1, cs).map_err(ev("cuEventRecord"))?;
            event::synchronize(e1).map_err(ev("cuEventSynchronize"))?;
            let ms = event::elapsed(e0, e1).map_err(ev("cuEventElapsedTime"))?;
            times.push(if ok { ms } else { f32::NAN });
            if ok && best.is_none_or(|(b, _)| ms < b) {
                best = Some((ms, i));
            }
        }
        let _ = event::destroy(e0);
        let _ = event::destroy(e1);
        let pick = best.map_or(0, |(_, i)| i);
        tracing::debug!(
            "GEMM [{}x{}x{}] {}{}: candidates {:?} ms for {} calls, picked {}",
            c.m,
            c.n,
            c.k,
            c.dtype,
            if c.fp8.is_some() { " FP8" } else { "" },
            times,
            TUNE_CALLS,
            pick
        );
        Ok(plan.candidates[pick])
    }

    /// Row-major `out[m,n] = x[m,k] · w[n,k]ᵀ` is column-major `outᵀ[n,m] = w · xᵀ`:
    /// A = w (stored k×n column-major, transposed), B = x (k×m, not transposed), D n×m.
    /// FP8: A and B in E4M3 (the "TN" layout Hopper's FP8 GEMM needs), A's leading
    /// dimension the row bytes, both scaled per 128 values of k (VEC128_32F) or per row
    /// (OUTER_VEC_32F: A's scales over its n rows, B's over its m columns).
    fn plan(&self, key: &PlanKey) -> Result<Plan> {
        let (m, n, k) = (key.m as u64, key.n as u64, key.k as u64);
        let fp8 = key.fp8_ld > 0;
        let t_in = if fp8 {
            sys::cudaDataType::CUDA_R_8F_E4M3
        } else {
            data_type(key.dtype)
        };
        let a_ld = if fp8 { key.fp8_ld as i64 } else { k as i64 };
        let t_out = data_type(key.out);
        // SAFETY: every descriptor created here is either returned in the plan or
        // destroyed on the error path by `Plan`'s cleanup below.
        unsafe {
            let desc = lt::create_matmul_desc(
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cudaDataType::CUDA_R_32F,
            )
            .map_err(err("cublasLtMatmulDescCreate"))?;
            let a = lt::create_matrix_layout(t_in, k, n, a_ld)
                .map_err(err("cublasLtMatrixLayoutCreate(A)"))?;
            let b = lt::create_matrix_layout(t_in, k, m, k as i64)
                .map_err(err("cublasLtMatrixLayoutCreate(B)"))?;
            let d = lt::create_matrix_layout(t_out, n, m, n as i64)
                .map_err(err("cublasLtMatrixLayoutCreate(D)"))?;
            let mut plan = Plan {
                desc,
                a,
                b,
                d,
                algo: std::mem::zeroed(),
                candidates: Vec::new(),
            };
            let set_desc = |attr, v: *const c_void, size| {
                lt::set_matmul_desc_attribute(desc, attr, v, size)
                    .map_err(err("cublasLtMatmulDescSetAttribute"))
            };
            let op_t = cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T;
            if let Err(e) = set_desc(
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &op_t as *const _ as *const c_void,
                std::mem::size_of_val(&op_t),
            ) {
                plan.destroy();
                return Err(e);
            }
            if fp8 {
                let mode = if key.fp8_rows {
                    sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                } else {
                    sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                };
                let r = set_desc(
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                    &mode as *const _ as *const c_void,
                    std::mem::size_of_val(&mode),
                )
                .and_then(|_| {
                    set_desc(
                        sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                        &mode as *const _ as *const c_void,
                        std::mem::size_of_val(&mode),
                    )
                });
                // Placeholder scale pointers (16-byte aligned) for the heuristic, which
                // refuses block scaling without them; each call sets its own.
                let placeholder = self.workspace.dptr();
                let r = r
                    .and_then(|_| {
                        set_desc(
                        sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                        &placeholder as *const u64 as *const c_void,
                        8,
                    )
                    })
                    .and_then(|_| {
                        set_desc(
                        sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                        &placeholder as *const u64 as *const c_void,
                        8,
                    )
                    });
                if let Err(e) = r {
                    plan.destroy();
                    return Err(e);
                }
            }
            if key.bias {
                let epi = sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS;
                let bias_t = data_type(key.dtype);
                let r = set_desc(
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
                    &epi as *const _ as *const c_void,
                    std::mem::size_of_val(&epi),
                )
                .and_then(|_| {
                    set_desc(
                        sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                        &bias_t as *const _ as *const c_void,
                        std::mem::size_of_val(&bias_t),
                    )
                });
                if let Err(e) = r {
                    plan.destroy();
                    return Err(e);
                }
            }
            let pref = match lt::create_matmul_pref() {
                Ok(p) => p,
                Err(e) => {
                    plan.destroy();
                    return Err(Error::cuda("cublasLtMatmulPreferenceCreate", e));
                }
            };
            let ws = WORKSPACE_BYTES as u64;
            let mut r = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as *const c_void,
                8,
            );
            let aligns = [
                (sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align[1]),
                (sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align[0]),
                (sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align[2]),
                (sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align[2]),
            ];
            for (attr, v) in aligns {
                r = r.and_then(|_| {
                    lt::set_matmul_pref_attribute(pref, attr, &v as *const u32 as *const c_void, 4)
                });
            }
            let want = if gemm_tune() && key.m * key.n * key.k >= TUNE_MIN_WORK {
                TUNE_CANDIDATES
            } else {
                1
            };
            let heur = r.and_then(|_| heuristics(self.handle, desc, a, b, d, pref, want));
            let _ = lt::destroy_matmul_pref(pref);
            match heur {
                Ok(h) => {
                    plan.algo = h[0];
                    plan.candidates = h;
                    Ok(plan)
                }
                Err(e) => {
                    plan.destroy();
                    Err(Error::Cuda {
                        call: "cublasLtMatmulAlgoGetHeuristic".into(),
                        message: format!(
                            "no algorithm for [{}x{}x{}] {}{} -> {}{}: {e:?}",
                            key.m,
                            key.n,
                            key.k,
                            key.dtype,
                            match (fp8, key.fp8_rows) {
                                (false, _) => "",
                                (true, false) => " (FP8 E4M3 operands, 128-value scales)",
                                (true, true) => " (FP8 E4M3 operands, row scales)",
                            },
                            key.out,
                            if key.bias { " with bias" } else { "" }
                        ),
                    })
                }
            }
        }
    }
}

/// Up to `want` of the heuristic's algorithms for the descriptors, best first (at least
/// one, else the heuristic's error).
///
/// # Safety
/// The handle and descriptors are live.
unsafe fn heuristics(
    handle: sys::cublasLtHandle_t,
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    pref: sys::cublasLtMatmulPreference_t,
    want: usize,
) -> std::result::Result<Vec<sys::cublasLtMatmulAlgo_t>, lt::CublasError> {
    if want <= 1 {
        return lt::get_matmul_algo_heuristic(handle, desc, a, b, d, d, pref).map(|h| vec![h.algo]);
    }
    let mut res: Vec<sys::cublasLtMatmulHeuristicResult_t> = vec![std::mem::zeroed(); want];
    let mut got = 0;
    sys::cublasLtMatmulAlgoGetHeuristic(
        handle,
        desc,
        a,
        b,
        d,
        d,
        pref,
        want as i32,
        res.as_mut_ptr(),
        &mut got,
    )
    .result()?;
    let algos: Vec<_> = res[..(got.max(0) as usize).min(want)]
        .iter()
        .filter(|h| h.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
        .map(|h| h.algo)
        .collect();
    if algos.is_empty() {
        return Err(lt::CublasError(
            sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED,
        ));
    }
    Ok(algos)
}

impl Plan {
    /// # Safety
    /// Called once, on descriptors that are live.
    unsafe fn destroy(&self) {
        let _ = lt::destroy_matrix_layout(self.a);
        let _ = lt::destroy_matrix_layout(self.b);
        let _ = lt::destroy_matrix_layout(self.d);
        let _ = lt::destroy_matmul_desc(self.desc);
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: each plan's descriptors are destroyed once; then the handle.
        unsafe {
            for plan in self.plans.get_mut().unwrap().values() {
                plan.destroy();
            }
            let _ = lt::destroy_handle(self.handle);
        }
    }
}
