//! The [`Backend`] trait on [`CudaBackend`]: each op checks its tensors' devices and
//! shapes (`ops::check_*`), then launches its kernels (`kernels`) or cuBLASLt (`blas`)
//! on the compute stream.

use super::*;

impl Backend for CudaBackend {
    fn device_name(&self) -> String {
        format!("cuda:{}", self.info.ordinal)
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        self.mem_info().ok()
    }

    fn gemm_plans(&self) -> usize {
        self.lt.num_plans()
    }

    fn vmm(&self) -> Result<Arc<dyn Vmm>> {
        let mut v = self.vmm.lock().unwrap_or_else(|e| e.into_inner());
        if v.is_none() {
            *v = Some(Arc::new(CudaVmm::new(&self.ctx)?));
        }
        Ok(v.clone().expect("set above"))
    }

    fn alloc(&self, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        self.forbid_in_capture("alloc")?;
        let bytes = crate::tensor::shape_bytes("alloc", shape, dtype)?;
        let buf = CudaBuffer::new(&self.ctx, bytes, &format!("tensor {shape:?} {dtype}"))?;
        Tensor::new(Storage::Cuda(Arc::new(buf)), 0, shape, dtype)
    }

    fn write_bytes(&self, dst: &Tensor, src: &[u8]) -> Result<()> {
        self.forbid_in_capture("write_bytes (host->device copy)")?;
        self.check_device("write_bytes", &[("dst", dst)])?;
        ops::check_len("write_bytes", "src", src.len(), dst.size_bytes())?;
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: dst spans src.len() bytes. For pageable `src`, cuMemcpyHtoDAsync returns
        // only after the bytes are staged, so `src` may be reused when this returns.
        unsafe { drv::memcpy_htod_async(dptr(dst), src, self.stream.cu_stream()) }
            .map_err(|e| Error::cuda("cuMemcpyHtoDAsync", e))
    }

    fn alloc_staging(&self, bytes: usize) -> Result<HostStaging> {
        self.forbid_in_capture("alloc_staging")?;
        Ok(HostStaging(Staging::Pinned(PinnedStaging::new(
            &self.ctx, bytes,
        )?)))
    }

    fn upload_staging(&self, src: &mut HostStaging, dst: &Tensor) -> Result<()> {
        self.forbid_in_capture("upload_staging (host->device copy)")?;
        self.check_device("upload_staging", &[("dst", dst)])?;
        let n = src.prefix_for(dst)?.len();
        let Staging::Pinned(p) = &mut src.0 else {
            return self.write_bytes(dst, src.prefix_for(dst)?);
        };
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: dst spans n bytes; the staging holds at least n page-locked bytes that
        // stay allocated and unwritten until the event recorded below has passed
        // (`HostStaging::bytes_mut` waits for it; dropping the staging waits too).
        unsafe {
            drv_sys::cuMemcpyHtoDAsync_v2(
                dptr(dst),
                p.ptr() as *const c_void,
                n,
                self.stream.cu_stream(),
            )
        }
        .result()
        .map_err(|e| Error::cuda("cuMemcpyHtoDAsync (pinned)", e))?;
        p.mark_uploaded(self.stream.cu_stream())
    }

    fn download_staging(&self, src: &Tensor, dst: &mut HostStaging) -> Result<()> {
        self.forbid_in_capture("download_staging (device->host copy)")?;
        self.check_device("download_staging", &[("src", src)])?;
        let n = src.size_bytes();
        if n > dst.len() {
            return Err(Error::invalid(
                "download_staging",
                format!(
                    "staging of {} bytes is smaller than src ({n} bytes)",
                    dst.len()
                ),
            ));
        }
        let Staging::Pinned(p) = &mut dst.0 else {
            return self.read_bytes(src, &mut dst.bytes_mut()?[..n]);
        };
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: src spans n bytes and the staging at least n page-locked bytes, which
        // stay allocated and untouched until the event recorded below has passed
        // (`HostStaging::bytes_mut` waits for it; dropping the staging waits too).
        unsafe {
            drv_sys::cuMemcpyDtoHAsync_v2(
                p.ptr() as *mut c_void,
                dptr(src),
                n,
                self.stream.cu_stream(),
            )
        }
        .result()
        .map_err(|e| Error::cuda("cuMemcpyDtoHAsync (pinned)", e))?;
        p.mark_uploaded(self.stream.cu_stream())
    }

    fn read_bytes(&self, src: &Tensor, dst: &mut [u8]) -> Result<()> {
        self.forbid_in_capture("read_bytes (device->host copy)")?;
        self.check_device("read_bytes", &[("src", src)])?;
        ops::check_len("read_bytes", "dst", dst.len(), src.size_bytes())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: src spans dst.len() bytes; we synchronise before `dst` is released.
        unsafe { drv::memcpy_dtoh_async(dst, dptr(src), self.stream.cu_stream()) }
            .map_err(|e| Error::cuda("cuMemcpyDtoHAsync", e))?;
        self.stream
            .synchronize()
            .map_err(|e| Error::cuda("cuStreamSynchronize", e))
    }

    fn copy(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        self.check_device("copy", &[("src", src), ("dst", dst)])?;
        ops::check_copy(src, dst)?;
        if src.size_bytes() == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both views span size_bytes() bytes on this device.
        unsafe {
            drv::memcpy_dtod_async(
                dptr(dst),
                dptr(src),
                src.size_bytes(),
                self.stream.cu_stream(),
            )
        }
        .map_err(|e| Error::cuda("cuMemcpyDtoDAsync", e))
    }

    fn synchronize(&self) -> Result<()> {
        self.forbid_in_capture("synchronize")?;
        self.stream
            .synchronize()
            .map_err(|e| Error::cuda("cuStreamSynchronize", e))
    }

    fn fill_rows(&self, src: &Tensor, rows: &Tensor, dst: &Tensor) -> Result<()> {
        self.check_device("fill_rows", &[("src", src), ("rows", rows), ("dst", dst)])?;
        let (s, n) = ops::check_fill_rows(src, rows, dst)?;
        kernels::fill_rows(self, src, rows, dst, s, n)
    }

    fn gather_columns(&self, x: &Tensor, perm: &Tensor, out: &Tensor) -> Result<()> {
        self.check_device("gather_columns", &[("x", x), ("perm", perm), ("out", out)])?;
        let d = ops::check_gather_columns(x, perm, out)?;
        kernels::gather_columns(self, x, perm, out, &d)
    }

    fn embedding_rows(
        &self,
        ids: &Tensor,
        table: &Tensor,
        first: usize,
        out: &Tensor,
    ) -> Result<()> {
        self.check_device("embedding", &[("ids", ids), ("table", table), ("out", out)])?;
        let d = ops::check_embedding(ids, table, first, out)?;
        kernels::embedding(self, ids, table, out, &d)
    }

    fn group(&self) -> (usize, usize) {
        self.comm.as_ref().map_or((0, 1), |c| (c.rank, c.size))
    }

    fn all_reduce(&self, x: &Tensor) -> Result<()> {
        self.tp_all_reduce(x)
    }

    fn all_reduce_rms_norm(
        &self,
        x: &Tensor,
        residual: &Tensor,
        norm: Norm<'_>,
        eps: f32,
        out: &Tensor,
    ) -> Result<()> {
        self.tp_all_reduce_rms_norm(x, residual, norm, eps, out)
    }

    fn matmul_all_reduce_rms_norm(
        &self,
        x: &Tensor,
        w: &Tensor,
        hidden: &Tensor,
        residual: &Tensor,
        norm: Norm<'_>,
        eps: f32,
        out: &Tensor,
    ) -> Result<()> {
        self.tp_matmul_all_reduce_rms_norm(x, w, hidden, residual, norm, eps, out)
    }

    fn all_gather(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        self.tp_all_gather(src, dst)
    }

    fn unshard_columns(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        self.tp_unshard_columns(src, dst)
    }

    fn abort_group(&self, why: &str) {
        // The peer-memory kernels' waits first (NCCL's abort does not reach them).
        if let Some(p) = &self.p2p {
            p.set_abort();
        }
        if let Some(c) = &self.comm {
            tracing::warn!(
                "{}: aborting the group's collectives: {why}",
                self.device_name()
            );
            c.abort();
        }
    }

    fn rms_norm(
        &self,
        x: &Tensor,
        residual: Option<&Tensor>,
        norm: Norm<'_>,
        eps: f32,
        out: &Tensor,
    ) -> Result<()> {
        let t = [("x", x), ("weight", norm.weight()), ("out", out)];
        self.check_device("rms_norm", &t)?;
        for (name, t) in [("residual", residual), ("bias", norm.bias())] {
            if let Some(t) = t {
                self.check_device("rms_norm", &[(name, t)])?;
            }
        }
        let d = ops::check_rms_norm(x, residual, norm, eps, out)?;
        if self.skip_ops.norm {
            return Ok(());
        }
        kernels::rms_norm(self, x, residual, norm, eps, out, &d)
    }

    fn residual_add(&self, x: &Tensor, residual: &Tensor, out: &Tensor) -> Result<()> {
        let t = [("x", x), ("residual", residual), ("out", out)];
        self.check_device("residual_add", &t)?;
        let rows = ops::check_residual_add(x, residual, out)?.whole_rows();
        if self.skip_ops.norm {
            return Ok(());
        }
        kernels::norm_rows(self, x, None, Some(residual), None, 0.0, out, &rows)
    }

    fn norm_add_norm(
        &self,
        x: &Tensor,
        x_norm: Norm<'_>,
        residual: &Tensor,
        norm: Option<Norm<'_>>,
        eps: f32,
        out: &Tensor,
    ) -> Result<()> {
        // The fused kernel is RMSNorm's: a LayerNorm (either norm) takes the ops.
        let x_weight = match (x_norm, norm) {
            (Norm::Rms(w), None | Some(Norm::Rms(_))) => w,
            _ => {
                return crate::backend::norm_then_add_norm(
                    self, x, x_norm, residual, norm, eps, out,
                )
            }
        };
        let t = [("x", x), ("x_weight", x_weight), ("residual", residual)];
        self.check_device("norm_add_norm", &t)?;
        self.check_device("norm_add_norm", &[("out", out)])?;
        if let Some(n) = norm {
            self.check_device("norm_add_norm", &[("weight", n.weight())])?;
            if let Some(b) = n.bias() {
                self.check_device("norm_add_norm", &[("bias", b)])?;
            }
            ops::check_rms_norm(residual, None, n, eps, out)?;
        }
        let rows = ops::check_rms_norm(x, Some(residual), x_norm, eps, out)?.whole_rows();
        if self.skip_ops.norm {
            return Ok(());
        }
        kernels::norm_rows(
            self,
            x,
            Some(x_weight),
            Some(residual),
            norm,
            eps,
            out,
            &rows,
        )
    }

    fn rms_norm_columns(&self, x: &Tensor, col0: usize, weight: &Tensor, eps: f32) -> Result<()> {
        self.check_device("rms_norm_columns", &[("x", x), ("weight", weight)])?;
        let d = ops::check_rms_norm_columns(x, col0, weight, eps)?;
        if self.skip_ops.norm {
            return Ok(());
        }
        kernels::norm_rows(self, x, None, None, Some(Norm::Rms(weight)), eps, x, &d)
    }

    fn silu_mul(&self, gate_up: &Tensor, out: &Tensor) -> Result<()> {
        self.act_mul(Activation::Silu, gate_up, out)
    }

    fn act_mul(&self, act: Activation, gate_up: &Tensor, out: &Tensor) -> Result<()> {
        self.check_device("act_mul", &[("gate_up", gate_up), ("out", out)])?;
        let d = ops::check_silu_mul(gate_up, out)?;
        kernels::act_mul(self, act, gate_up, out, &d)
    }

    fn matmul(&self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>, out: &Tensor) -> Result<()> {
        self.check_device("matmul", &[("x", x), ("w", w), ("out", out)])?;
        if let Some(b) = bias {
            self.check_device("matmul", &[("bias", b)])?;
        }
        let d = ops::check_matmul(x, w, bias, out)?;
        if d.k == 0 {
            return Err(Error::invalid("matmul", "k must be > 0"));
        }
        if self.skip_ops.matmul {
            return Ok(());
        }
        self.bind()?;
        if let DType::Q(fmt) = w.dtype() {
            return kernels::quant::matmul(self, fmt, x, w, bias, out, &d);
        }
        if kernels::gemv_fits(x, w, &d, self.gemv_max_rows) {
            return kernels::gemv(self, x, w, bias, out, &d);
        }
        self.lt.matmul(
            &self.stream,
            &blas::MatmulCall {
                m: d.m,
                n: d.n,
                k: d.k,
                dtype: x.dtype(),
                out_dtype: out.dtype(),
                x: dptr(x),
                w: dptr(w),
                bias: bias.map(dptr),
                out: dptr(out),
                fp8: None,
            },
        )
    }

    fn prepare_weight(&self, w: Tensor) -> Result<Tensor> {
        self.check_device("prepare_weight", &[("w", &w)])?;
        kernels::marlin::prepare(self, w)
    }

    fn reserve_dequant_scratch(&self, bytes: usize) -> Result<()> {
        self.bind()?;
        kernels::quant::reserve_scratch(self, bytes)
    }

    fn matmul_act_mul(
        &self,
        act: Activation,
        x: &Tensor,
        w: &Tensor,
        gate_up: &Tensor,
        out: &Tensor,
    ) -> Result<()> {
        self.check_device(
            "matmul_act_mul",
            &[("x", x), ("w", w), ("gate_up", gate_up), ("out", out)],
        )?;
        let d = ops::check_matmul(x, w, None, gate_up)?;
        ops::check_silu_mul(gate_up, out)?;
        if self.skip_ops.matmul {
            return Ok(());
        }
        if let DType::Q(fmt) = w.dtype() {
            if d.m == 1
                && out.dtype() == x.dtype()
                && kernels::quant::qgemv_fits(self, fmt, x, w, &d)
            {
                self.bind()?;
                return kernels::quant::qgemv_act(self, act, fmt, x, w, out, &d);
            }
            self.matmul(x, w, None, gate_up)?;
            return self.act_mul(act, gate_up, out);
        }
        if d.m == 1 && out.dtype() == x.dtype() && kernels::gemv_fits(x, w, &d, self.gemv_max_rows)
        {
            self.bind()?;
            return kernels::gemv_act(self, act, x, w, out, &d);
        }
        self.matmul(x, w, None, gate_up)?;
        self.act_mul(act, gate_up, out)
    }

    fn mlp(&self, a: &Mlp<'_>) -> Result<()> {
        let named = [("x", a.x), ("gate_up", a.gate_up), ("down", a.down)];
        self.check_device("mlp", &named)?;
        let scratch = [("gate_up_out", a.gate_up_out), ("act_out", a.act_out)];
        self.check_device("mlp", &scratch)?;
        self.check_device("mlp", &[("out", a.out)])?;
        if let Some(n) = &a.norm {
            self.check_pre_norm("mlp", a.x, n)?;
        }
        let d_gu = ops::check_matmul(a.x, a.gate_up, None, a.gate_up_out)?;
        ops::check_silu_mul(a.gate_up_out, a.act_out)?;
        let d = ops::check_matmul(a.act_out, a.down, None, a.out)?;
        // The pre-norm fused into the gate/up projection's FP8 operand, the activation into
        // the down projection's (m > 1: one row takes the gemvs, the activation in their
        // epilogue); either falls back to the ops it fuses.
        let skip = self.skip_ops.matmul || self.skip_ops.norm;
        let mut gate_up_done = false;
        let x = match &a.norm {
            Some(n) if !skip && d.m > 1 => {
                self.bind()?;
                let gu = (a.gate_up, a.gate_up_out);
                gate_up_done = kernels::quant::norm_matmul(self, a.x, n, gu.0, None, gu.1, &d_gu)?;
                if !gate_up_done {
                    self.rms_norm(a.x, Some(n.residual), n.norm, n.eps, n.normed)?;
                }
                n.normed
            }
            Some(n) => {
                self.rms_norm(a.x, Some(n.residual), n.norm, n.eps, n.normed)?;
                n.normed
            }
            None => a.x,
        };
        let fused_down = d.m > 1 && !skip && matches!(a.down.dtype(), DType::Q(_));
        if gate_up_done || fused_down {
            if !gate_up_done {
                self.matmul(x, a.gate_up, None, a.gate_up_out)?;
            }
            if fused_down
                && kernels::quant::act_mul_matmul(self, a.act, a.gate_up_out, a.down, a.out, &d)?
            {
                return Ok(());
            }
            self.act_mul(a.act, a.gate_up_out, a.act_out)?;
            return self.matmul(a.act_out, a.down, None, a.out);
        }
        self.matmul_act_mul(a.act, x, a.gate_up, a.gate_up_out, a.act_out)?;
        self.matmul(a.act_out, a.down, None, a.out)
    }

    fn add_norm_matmul(&self, a: &NormMatmul<'_>) -> Result<()> {
        let n = &a.norm;
        self.check_pre_norm("add_norm_matmul", a.x, n)?;
        self.check_device("add_norm_matmul", &[("w", a.w), ("out", a.out)])?;
        if let Some(b) = a.bias {
            self.check_device("add_norm_matmul", &[("bias", b)])?;
        }
        let d = ops::check_matmul(a.x, a.w, a.bias, a.out)?;
        if d.m > 1 && d.k > 0 && !self.skip_ops.matmul && !self.skip_ops.norm {
            self.bind()?;
            if kernels::quant::norm_matmul(self, a.x, n, a.w, a.bias, a.out, &d)? {
                return Ok(());
            }
        }
        self.rms_norm(a.x, Some(n.residual), n.norm, n.eps, n.normed)?;
        self.matmul(n.normed, a.w, a.bias, a.out)
    }

    fn scale(&self, x: &Tensor, s: f32) -> Result<()> {
        self.check_device("scale", &[("x", x)])?;
        ops::check_scale(x)?;
        kernels::scale_softcap(self, x, s, 0.0)
    }

    fn softcap(&self, x: &Tensor, cap: f32) -> Result<()> {
        self.check_device("softcap", &[("x", x)])?;
        ops::check_softcap(x, cap)?;
        kernels::scale_softcap(self, x, 1.0, cap)
    }

    fn sigmoid_gate_add(&self, x: &Tensor, gate: &Tensor, y: &Tensor) -> Result<()> {
        self.check_device("sigmoid_gate_add", &[("x", x), ("gate", gate), ("y", y)])?;
        let d = ops::check_sigmoid_gate_add(x, gate, y)?;
        kernels::sigmoid_gate_add(self, x, gate, y, &d)
    }

    fn runs_moe(&self) -> bool {
        true
    }

    fn moe_workspace_bytes(
        &self,
        n: usize,
        hidden: usize,
        experts: usize,
        top_k: usize,
        dtype: DType,
    ) -> usize {
        kernels::moe_workspace_bytes(n, hidden, experts, top_k, dtype)
    }

    fn moe(&self, a: &Moe<'_>) -> Result<()> {
        self.check_device("moe", &a.tensors())?;
        let d = ops::check_moe(a)?;
        kernels::moe(self, a, &d)
    }

    fn join_expert_prefetch(&self) -> Result<()> {
        let mut side = self.expert_side.lock().unwrap_or_else(|e| e.into_inner());
        match side.as_mut() {
            Some(s) => match s.pending.take() {
                Some(i) => self.wait_side(s, i),
                None => Ok(()),
            },
            None => Ok(()),
        }
    }

    fn qkv_rope_write(&self, a: &QkvRope<'_>) -> Result<()> {
        self.check_device("qkv_rope_write", &a.tensors())?;
        let d = ops::check_qkv_rope(a)?;
        if self.skip_ops.qkv_rope {
            return Ok(());
        }
        kernels::qkv_rope_write(self, a, &d)
    }

    fn attention(&self, a: &Attention<'_>) -> Result<()> {
        self.check_device("attention", &a.tensors())?;
        let d = ops::check_attention(a)?;
        ops::check_scratch(
            a.scratch,
            self.attention_scratch_len(
                d.rows,
                d.num_heads,
                d.head_dim,
                d.table_width,
                d.block_size,
            ),
        )?;
        if self.skip_ops.attention {
            return Ok(());
        }
        kernels::attention(self, a, &d)
    }

    fn attention_scratch_len(
        &self,
        rows: usize,
        num_heads: usize,
        head_dim: usize,
        table_width: usize,
        block_size: usize,
    ) -> usize {
        kernels::attention_scratch_len(
            self.info.sm_count,
            rows,
            num_heads,
            head_dim,
            table_width,
            block_size,
        )
    }

    fn sample(&self, logits: &Tensor, p: &Sampling<'_>, out: &Tensor) -> Result<()> {
        self.check_device("sample", &[("logits", logits), ("out", out)])?;
        self.check_device("sample", &p.tensors())?;
        let d = ops::check_sample(logits, p, out)?;
        kernels::sample(self, logits, p, out, &d)
    }

    fn penalty_count(&self, counts: &Tensor, slots: &Tensor, tokens: &Tensor) -> Result<()> {
        let t = [("counts", counts), ("slots", slots), ("tokens", tokens)];
        self.check_device("penalty_count", &t)?;
        let d = ops::check_penalty_count(counts, slots, tokens)?;
        kernels::penalty_count(self, counts, slots, tokens, d)
    }

    fn logit_bias(&self, logits: &Tensor, b: &LogitBias<'_>) -> Result<()> {
        let t = [
            ("logits", logits),
            ("ids", b.ids),
            ("vals", b.vals),
            ("count", b.count),
        ];
        self.check_device("logit_bias", &t)?;
        let d = ops::check_logit_bias(logits, b)?;
        kernels::logit_bias(self, logits, b, d)
    }

    fn begin_capture(&self) -> Result<()> {
        if self.capturing.swap(true, Ordering::AcqRel) {
            return Err(Error::Capture(
                "begin_capture while already capturing".into(),
            ));
        }
        // Thread-local mode: an unsafe API call (e.g. cuMemAlloc) from this thread while
        // capturing is an error rather than silently breaking the capture.
        let r = self
            .stream
            .begin_capture(drv_sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| Error::cuda("cuStreamBeginCapture", e));
        if r.is_err() {
            self.capturing.store(false, Ordering::Release);
        }
        r
    }

    fn end_capture(&self) -> Result<Box<dyn Graph>> {
        if !self.capturing.swap(false, Ordering::AcqRel) {
            return Err(Error::Capture("end_capture without begin_capture".into()));
        }
        let start = Instant::now();
        let graph = self
            .stream
            .end_capture(drv_sys::CUgraphInstantiate_flags(0))
            .map_err(|e| {
                Error::cuda(
                    "cuStreamEndCapture/cuGraphInstantiate (was an op invalid during capture?)",
                    e,
                )
            })?
            .ok_or_else(|| Error::Capture("the capture recorded no graph".into()))?;
        let mut num_nodes = 0usize;
        // SAFETY: the graph is live; passing a null node array asks only for the count.
        unsafe {
            let _ =
                drv_sys::cuGraphGetNodes(graph.cu_graph(), std::ptr::null_mut(), &mut num_nodes);
        }
        graph
            .upload()
            .map_err(|e| Error::cuda("cuGraphUpload", e))?;
        tracing::debug!(
            "captured graph of {num_nodes} nodes in {:?}",
            start.elapsed()
        );
        Ok(Box::new(CudaGraphExec { graph, num_nodes }))
    }

    fn is_capturing(&self) -> bool {
        self.capturing.load(Ordering::Acquire)
    }

    fn alloc_host(&self, bytes: usize) -> Result<crate::backend::HostMemory> {
        self.forbid_in_capture("alloc_host")?;
        copy_queue::alloc(&self.ctx, bytes)
    }

    fn register_host(
        &self,
        mem: Arc<dyn AsRef<[u8]> + Send + Sync>,
    ) -> Result<crate::backend::HostMemory> {
        self.forbid_in_capture("register_host")?;
        copy_queue::register(&self.ctx, mem)
    }

    fn host_view(
        &self,
        mem: &Arc<crate::backend::HostMemory>,
        offset: usize,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Tensor> {
        self.forbid_in_capture("host_view")?;
        crate::backend::check_host_view(mem, offset)?;
        let base = copy_queue::device_pointer(&self.ctx, mem)?;
        let keep: Arc<dyn Send + Sync> = mem.clone();
        let buf = CudaBuffer::mapped(&self.ctx, base + offset as u64, mem.len() - offset, keep);
        Tensor::new(Storage::Cuda(Arc::new(buf)), 0, shape, dtype)
    }

    fn copy_queue(&self, events: usize) -> Result<Box<dyn crate::backend::CopyQueue>> {
        self.forbid_in_capture("copy_queue")?;
        Ok(Box::new(copy_queue::CudaCopyQueue::new(
            &self.ctx,
            &self.stream,
            self.info.ordinal,
            events,
        )?))
    }
}
