//! Opening a device and a tensor-parallel group: the libraries, context and streams, the
//! kernels (compiled or from the cache), cuBLASLt, peer access and the one-shot
//! all-reduce's buffers, and the `ENCORE_*` settings read at that time.

use super::*;

/// A count knob `var` in `lo..=hi` (`default` when unset); an error names the variable
/// and the range, `what` the count's unit.
fn count_from_env<T>(var: &'static str, lo: T, hi: T, default: T, what: &str) -> Result<T>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    match std::env::var(var) {
        Err(_) => Ok(default),
        Ok(v) => v
            .trim()
            .parse()
            .ok()
            .filter(|c| (lo..=hi).contains(c))
            .ok_or_else(|| Error::invalid(var, format!("`{v}`: expected {lo} to {hi} {what}"))),
    }
}

/// `ENCORE_SKIP_OPS`, a measurement knob only: a comma-separated list of `norm`
/// (`rms_norm`, `norm_add_norm`, `residual_add`, `rms_norm_columns`), `qkv_rope`,
/// `attention` and `matmul` (`matmul`, `matmul_act_mul`) whose calls return without
/// launching anything, so that a step's time without them can be read beside the real one
/// (`bench decode`). Results are wrong.
fn skip_ops_from_env() -> Result<SkipOps> {
    let mut s = SkipOps::default();
    let Ok(v) = std::env::var("ENCORE_SKIP_OPS") else {
        return Ok(s);
    };
    for op in v.split(',').map(str::trim).filter(|o| !o.is_empty()) {
        match op {
            "norm" => s.norm = true,
            "qkv_rope" => s.qkv_rope = true,
            "attention" => s.attention = true,
            "matmul" => s.matmul = true,
            other => {
                return Err(Error::Config {
                    path: "ENCORE_SKIP_OPS".into(),
                    what: format!("`{other}`: expected norm, qkv_rope, attention or matmul"),
                })
            }
        }
    }
    tracing::warn!(
        "ENCORE_SKIP_OPS={v}: those ops are left out (a measurement knob; results are wrong)"
    );
    Ok(s)
}

/// `ENCORE_EXPERT_FILL` (`bulk` or `threads`; unset: `threads`) and
/// `ENCORE_EXPERT_FILL_CTAS` (the bulk copies' CTAs, default 64): how the expert cache
/// copies experts into its slots. Bulk copies need sm_90.
fn bulk_fill_from_env(sm90: bool) -> Result<Option<u32>> {
    let bulk = match std::env::var("ENCORE_EXPERT_FILL") {
        Err(_) => false,
        Ok(v) => match v.trim() {
            "bulk" => true,
            "threads" => false,
            _ => {
                return Err(Error::invalid(
                    "ENCORE_EXPERT_FILL",
                    format!("`{v}`: expected bulk or threads"),
                ))
            }
        },
    };
    if !bulk {
        return Ok(None);
    }
    if !sm90 {
        return Err(Error::invalid(
            "ENCORE_EXPERT_FILL",
            "bulk copies need compute capability 9.0 or later",
        ));
    }
    count_from_env("ENCORE_EXPERT_FILL_CTAS", 1, 4096, 64, "CTAs").map(Some)
}

/// `ENCORE_GEMV_MAX_ROWS` (a tuning and comparison knob: 0 sends every matmul to cuBLASLt)
/// or `ENCORE_QGEMV_MAX_ROWS` (the same for quantized weights: 0 sends every one to the
/// many-row paths), `default` when unset.
fn gemv_max_rows_from_env(var: &str, default: usize) -> Result<usize> {
    match std::env::var(var) {
        Err(_) => Ok(default),
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&r| r <= kernels::GEMV_MAX_ROWS)
            .ok_or_else(|| Error::Config {
                path: var.into(),
                what: format!(
                    "`{v}`: expected an integer in 0..={}",
                    kernels::GEMV_MAX_ROWS
                ),
            }),
    }
}

impl CudaBackend {
    /// Open device `ordinal`: create the context and stream, compile (or load from the
    /// cache) and load every kernel, create the cuBLASLt handle and workspace.
    pub fn new(ordinal: usize) -> Result<Self> {
        let device = format!("cuda:{ordinal}");
        let libs = CudaLibraries::probe();
        let missing = libs.missing();
        if !missing.is_empty() {
            return Err(Error::DeviceUnavailable {
                device,
                why: format!(
                    "missing {} (set LD_LIBRARY_PATH, e.g. /usr/local/cuda/lib64)",
                    missing.join(", ")
                ),
            });
        }
        let count = device_count()?;
        if ordinal >= count {
            return Err(Error::DeviceUnavailable {
                device,
                why: format!("{count} CUDA device(s) present"),
            });
        }
        let unavailable = |what: &str, e: drv::DriverError| Error::DeviceUnavailable {
            device: format!("cuda:{ordinal}"),
            why: format!("{what}: {e:?}"),
        };
        let ctx = CudaContext::new(ordinal).map_err(|e| unavailable("creating the context", e))?;
        // SAFETY: encore never uses cudarc's CudaSlice; all memory is raw and ordered on
        // our one stream, so event tracking has nothing to protect (and it would record
        // events inside captures).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(|e| unavailable("creating a stream", e))?;
        let attr = |a| {
            ctx.attribute(a)
                .map_err(|e| Error::cuda("cuDeviceGetAttribute", e))
        };
        use drv_sys::CUdevice_attribute as A;
        let cc = (
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let info = DeviceInfo {
            ordinal,
            name: ctx.name().unwrap_or_else(|_| "unknown".into()),
            compute_capability: cc,
            sm_count: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize,
            total_memory: drv::mem_get_info().map(|(_, t)| t).unwrap_or(0),
        };

        // Hopper compiles for sm_90a: the architecture-specific features (wgmma) that
        // attention_prefill_wg.cu uses; its cubins run on sm_90 devices only, which is
        // what they are compiled for.
        let arch = if cc == (9, 0) {
            "sm_90a".to_string()
        } else {
            format!("sm_{}{}", cc.0, cc.1)
        };
        let (compiled, compile) = nvrtc::compile_all(&arch)?;
        let mut functions = HashMap::new();
        let mut modules = Vec::new();
        for m in compiled {
            let module = ctx
                .load_module(cudarc::nvrtc::Ptx::from_binary(m.cubin))
                .map_err(|e| Error::cuda(format!("cuModuleLoadData({})", m.file), e))?;
            for &name in m.functions {
                let f = module.load_function(name).map_err(|e| {
                    Error::cuda(format!("cuModuleGetFunction({name} in {})", m.file), e)
                })?;
                if let Some(bytes) = kernels::dynamic_smem_limit(name) {
                    f.set_attribute(
                        drv_sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        bytes as i32,
                    )
                    .map_err(|e| Error::cuda(format!("cuFuncSetAttribute({name})"), e))?;
                }
                functions.insert(name, f);
            }
            modules.push(module);
        }
        let lt = blas::Lt::new(&ctx)?;
        tracing::info!(
            "cuda:{ordinal} {} (sm_{}{}, {} SMs): {} kernels from {} files in {:.2}s ({} cached)",
            info.name,
            cc.0,
            cc.1,
            info.sm_count,
            compile.functions,
            compile.files,
            compile.seconds,
            compile.cache_hits
        );
        let kernels = handles::Kernels::resolve(|name: &str| handles::take(&functions, name))?;
        Ok(CudaBackend {
            ctx,
            stream,
            kernels,
            num_kernels: functions.len(),
            _modules: modules,
            lt,
            info,
            compile,
            capturing: AtomicBool::new(false),
            gemv_max_rows: gemv_max_rows_from_env(
                "ENCORE_GEMV_MAX_ROWS",
                kernels::GEMV_DEFAULT_ROWS,
            )?,
            gemv_ctas_per_sm: count_from_env(
                "ENCORE_GEMV_CTAS_PER_SM",
                1,
                16,
                kernels::GEMV_CTAS_PER_SM,
                "CTAs per SM",
            )?,
            qgemv_max_rows: match std::env::var_os("ENCORE_QGEMV_MAX_ROWS") {
                None => None,
                Some(_) => Some(gemv_max_rows_from_env("ENCORE_QGEMV_MAX_ROWS", 0)?),
            },
            pdl: cc.0 >= 9 && std::env::var("ENCORE_PDL").map_or(true, |v| v.trim() != "0"),
            flash_prefill: std::env::var("ENCORE_PREFILL_ATTENTION")
                .map_or(true, |v| v.trim() != "split"),
            wgmma_prefill: cc == (9, 0)
                && std::env::var("ENCORE_PREFILL_ATTENTION")
                    .map_or(true, |v| !matches!(v.trim(), "split" | "mma")),
            tc_decode: std::env::var("ENCORE_DECODE_ATTENTION")
                .map_or(true, |v| v.trim() != "split"),
            vmm: Mutex::new(None),
            dequant_scratch: Mutex::new(Default::default()),
            quant_gemm: kernels::quant::QuantGemm::from_env()?,
            moe_gemm_min_tokens: match std::env::var("ENCORE_MOE_GEMM_MIN_TOKENS") {
                Err(_) => None,
                Ok(v) => Some(v.trim().parse().map_err(|_| {
                    Error::invalid(
                        "ENCORE_MOE_GEMM_MIN_TOKENS",
                        format!("`{v}` is not a token count"),
                    )
                })?),
            },
            moe_pairs_mma: match std::env::var("ENCORE_MOE_PAIRS") {
                Err(_) => None,
                Ok(v) => match v.trim() {
                    "auto" => None,
                    "mma" => Some(true),
                    "gemv" => Some(false),
                    other => {
                        return Err(Error::invalid(
                            "ENCORE_MOE_PAIRS",
                            format!("`{other}`: expected `auto`, `mma` or `gemv`"),
                        ))
                    }
                },
            },
            prefetch_ctas_per_sm: count_from_env(
                "ENCORE_EXPERT_PREFETCH_CTAS",
                1,
                8,
                kernels::MOE_PREFETCH_CTAS_PER_SM,
                "CTAs per SM",
            )?,
            bulk_fill: bulk_fill_from_env(cc.0 >= 9)?,
            comm: None,
            p2p: None,
            expert_side: Mutex::new(None),
            p2p_on: AtomicBool::new(true),
            skip_all_reduce: false,
            push_on: true,
            skip_ops: skip_ops_from_env()?,
        })
    }

    /// Backends on devices `first..first + size`, ranks of one tensor-parallel group
    /// joined by NCCL. A device that cannot be opened is an error naming it.
    pub fn group(first: usize, size: usize) -> Result<Vec<CudaBackend>> {
        let devices: Vec<usize> = (first..first + size).collect();
        let mut bes = devices
            .iter()
            .map(|&d| CudaBackend::new(d))
            .collect::<Result<Vec<_>>>()?;
        if size > 1 {
            for (be, comm) in bes.iter_mut().zip(nccl::init_all(&devices)?) {
                be.comm = Some(comm);
            }
            let mode = std::env::var("ENCORE_ALLREDUCE").unwrap_or_default();
            let nccl_only = match mode.trim() {
                "" | "auto" => false,
                "oneshot" => {
                    for be in bes.iter_mut() {
                        be.push_on = false;
                    }
                    false
                }
                "nccl" => true,
                "skip" => {
                    tracing::warn!(
                        "ENCORE_ALLREDUCE=skip: all-reduces left out (a measurement knob; results are wrong)"
                    );
                    for be in bes.iter_mut() {
                        be.skip_all_reduce = true;
                    }
                    false
                }
                other => {
                    return Err(Error::Config {
                        path: "ENCORE_ALLREDUCE".into(),
                        what: format!("`{other}`: expected auto, oneshot, nccl or skip"),
                    })
                }
            };
            if !nccl_only && size <= kernels::AR_MAX_RANKS {
                match Self::peer_access(&bes) {
                    Ok(()) => Self::set_up_p2p(&mut bes)?,
                    Err(why) => tracing::info!("one-shot all-reduce off: {why}; NCCL only"),
                }
            }
        }
        Ok(bes)
    }

    /// Route all-reduces that fit through the one-shot peer-memory kernel (`true`, the
    /// default where the group's devices reach each other's memory) or all through NCCL
    /// (for comparisons: `bench allreduce`). Takes effect for ops issued afterwards
    /// (captured graphs keep the path of their capture).
    pub fn set_one_shot_allreduce(&self, on: bool) {
        self.p2p_on.store(on, Ordering::Relaxed);
    }

    /// Whether this rank has the one-shot all-reduce (its group's devices map each
    /// other's memory and `ENCORE_ALLREDUCE` is not `nccl`).
    pub fn has_one_shot_allreduce(&self) -> bool {
        self.p2p.is_some()
    }

    /// Map every device of the group into every other's address space (P2P over NVLink
    /// or PCIe), or say why not.
    fn peer_access(bes: &[CudaBackend]) -> std::result::Result<(), String> {
        for a in bes {
            for b in bes {
                if std::ptr::eq(a, b) {
                    continue;
                }
                let mut can = 0;
                // SAFETY: plain queries on valid devices.
                unsafe {
                    drv_sys::cuDeviceCanAccessPeer(&mut can, a.ctx.cu_device(), b.ctx.cu_device())
                }
                .result()
                .map_err(|e| format!("cuDeviceCanAccessPeer: {e:?}"))?;
                if can == 0 {
                    return Err(format!(
                        "cuda:{} cannot access cuda:{}'s memory",
                        a.ctx.ordinal(),
                        b.ctx.ordinal()
                    ));
                }
                a.bind().map_err(|e| e.to_string())?;
                // SAFETY: `b`'s context is live; enabling twice is reported and ignored.
                let r = unsafe { drv_sys::cuCtxEnablePeerAccess(b.ctx.cu_ctx(), 0) };
                if r != drv_sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
                    r.result()
                        .map_err(|e| format!("cuCtxEnablePeerAccess: {e:?}"))?;
                }
            }
        }
        Ok(())
    }

    /// Each rank's staging and flags, and its table of every rank's.
    fn set_up_p2p(bes: &mut [CudaBackend]) -> Result<()> {
        // The abort word: page-locked host memory every device maps (zeroed). Where the
        // driver refuses it, the kernels get a null address and do not poll (the waits
        // then end only with their peers, as NCCL's abort does not reach them).
        let abort = copy_queue::alloc(&bes[0].ctx, 64)
            .map_err(|e| tracing::warn!("no abort word for the peer-memory all-reduce: {e}"))
            .ok()
            .map(Arc::new);
        let mut staging = Vec::new();
        let mut flags = Vec::new();
        for be in bes.iter() {
            staging.push(be.alloc(DType::I32, &[2 * P2P_CAP / 4])?);
            let f = be.alloc(
                DType::I32,
                &[kernels::AR_MAX_BLOCKS * kernels::AR_MAX_RANKS],
            )?;
            be.write_bytes(&f, &vec![0u8; f.size_bytes()])?;
            flags.push(f);
        }
        // ArPeers: every rank's staging, every rank's flags, then the abort word's address
        // on the rank's device (the last entry, written per rank below).
        let mut table = [0u64; 2 * kernels::AR_MAX_RANKS + 1];
        for (r, (s, f)) in staging.iter().zip(&flags).enumerate() {
            table[r] = dptr(s);
            table[kernels::AR_MAX_RANKS + r] = dptr(f);
        }
        let mut push_staging = Vec::new();
        // ArPush: every rank's staging, then the abort word's address.
        let mut push_table = [0u64; kernels::AR_MAX_RANKS + 1];
        for (r, be) in bes.iter().enumerate() {
            let s = be.alloc(DType::I32, &[3 * kernels::AR_MAX_RANKS * PUSH_CAP / 4])?;
            be.write_bytes(&s, &vec![0xFFu8; s.size_bytes()])?;
            push_table[r] = dptr(&s);
            push_staging.push(s);
        }
        for (r, be) in bes.iter_mut().enumerate() {
            let word = abort.as_ref().map_or(0, |a| {
                copy_queue::device_pointer(&be.ctx, a).unwrap_or_else(|e| {
                    tracing::warn!("{}: the abort word is not mapped: {e}", be.device_name());
                    0
                })
            });
            table[2 * kernels::AR_MAX_RANKS] = word;
            push_table[kernels::AR_MAX_RANKS] = word;
            let bytes: Vec<u8> = table.iter().flat_map(|p| p.to_le_bytes()).collect();
            let push_bytes: Vec<u8> = push_table.iter().flat_map(|p| p.to_le_bytes()).collect();
            let peers = be.alloc(DType::I64, &[table.len()])?;
            be.write_bytes(&peers, &bytes)?;
            let count = be.alloc(DType::I32, &[kernels::AR_MAX_BLOCKS])?;
            be.write_bytes(&count, &vec![0u8; count.size_bytes()])?;
            let push_peers = be.alloc(DType::I64, &[push_table.len()])?;
            be.write_bytes(&push_peers, &push_bytes)?;
            let push_count = be.alloc(DType::I32, &[1])?;
            be.write_bytes(&push_count, &[0u8; 4])?;
            be.synchronize()?;
            be.p2p = Some(P2p {
                peers,
                count,
                cap: P2P_CAP,
                _staging: staging[r].clone(),
                _flags: flags[r].clone(),
                push_peers,
                push_count,
                _push_staging: push_staging[r].clone(),
                abort: abort.clone(),
            });
        }
        Ok(())
    }
}
