//! A tensor-parallel group's collectives on CUDA: the one-shot all-reduce through peer
//! memory (`P2p`: every rank's buffer mapped, a counter a call) where it fits, else
//! NCCL; the all-reduce fused with the next RMSNorm, the o/down matmul pushing its
//! partial sums to the peers, the all-gather and the logits' unsharding.

use super::*;

/// One rank's part of the one-shot all-reduce (kernels/allreduce.cu): its `ArPeers` table
/// (every rank's staging and flag addresses), its per-block call counters, and its own
/// staging and flags (which the peers' tables point at).
pub(super) struct P2p {
    pub(super) peers: Tensor,
    pub(super) count: Tensor,
    /// Bytes of the largest tensor it reduces (larger ones go through NCCL).
    pub(super) cap: usize,
    pub(super) _staging: Tensor,
    pub(super) _flags: Tensor,
    /// The pushed all-reduce (`matmul_all_reduce_rms_norm`): the `ArPush` table of every
    /// rank's staging, this rank's call counter, and its own staging
    /// `[3][AR_MAX_RANKS][PUSH_CAP]` bytes (all-ones where not written).
    pub(super) push_peers: Tensor,
    pub(super) push_count: Tensor,
    pub(super) _push_staging: Tensor,
    /// The group's abort word (one for every rank; page-locked, mapped by every device,
    /// its address at the end of both tables): set by `abort_group`, it ends the
    /// kernels' waits on their peers (common.cuh's `ar_aborted`).
    pub(super) abort: Option<Arc<crate::backend::HostMemory>>,
}

impl P2p {
    /// The group's abort word, seen from the host.
    pub(super) fn abort_word(&self) -> Option<&std::sync::atomic::AtomicU32> {
        // SAFETY: the word is 4 aligned (page-aligned), writable, page-locked bytes that
        // live as long as `self.abort`; the devices only read it.
        self.abort
            .as_ref()
            .map(|a| unsafe { std::sync::atomic::AtomicU32::from_ptr(a.as_ptr() as *mut u32) })
    }

    /// Whether the group's abort word is set (the group failed): the peer-memory
    /// collectives then refuse, as NCCL's do once aborted.
    pub(super) fn check_live(&self, op: &'static str, device: &str) -> Result<()> {
        if self
            .abort_word()
            .is_some_and(|w| w.load(Ordering::SeqCst) != 0)
        {
            return Err(Error::DeviceUnavailable {
                device: device.to_string(),
                why: format!("{op}: the group's collectives were aborted (a rank failed)"),
            });
        }
        Ok(())
    }

    /// Tell every rank's spinning kernels that the group failed.
    pub(super) fn set_abort(&self) {
        if let Some(w) = self.abort_word() {
            w.store(1, Ordering::SeqCst);
        }
    }
}

impl CudaBackend {
    pub(super) fn tp_all_reduce(&self, x: &Tensor) -> Result<()> {
        self.check_device("all_reduce", &[("x", x)])?;
        let n = ops::check_all_reduce(x)?;
        let Some(comm) = &self.comm else {
            return Ok(());
        };
        if n == 0 || self.skip_all_reduce {
            return Ok(());
        }
        self.bind()?;
        if let Some(p) = self
            .p2p
            .as_ref()
            .filter(|_| self.p2p_on.load(Ordering::Relaxed))
        {
            let bytes = x.size_bytes();
            if bytes <= p.cap && bytes.is_multiple_of(16) && dptr(x).is_multiple_of(16) {
                p.check_live("all_reduce", &self.device_name())?;
                let (peers, count) = (dptr(&p.peers), dptr(&p.count));
                return kernels::allreduce(self, x, peers, count, (comm.rank, comm.size), p.cap);
            }
        }
        // SAFETY: x spans n elements of its dtype on this device; the stream is ours.
        unsafe { comm.all_reduce(dptr(x), n, x.dtype(), self.stream.cu_stream() as _) }
    }

    pub(super) fn tp_all_reduce_rms_norm(
        &self,
        x: &Tensor,
        residual: &Tensor,
        norm: Norm<'_>,
        eps: f32,
        out: &Tensor,
    ) -> Result<()> {
        let tensors = [("x", x), ("residual", residual), ("out", out)];
        self.check_device("all_reduce_rms_norm", &tensors)?;
        if self.skip_all_reduce {
            return self.rms_norm(x, Some(residual), norm, eps, out);
        }
        // The fused kernel is RMSNorm's: a LayerNorm takes the two ops (on every rank).
        let w = match norm {
            Norm::Rms(w) => w,
            Norm::Layer { .. } => {
                return crate::backend::all_reduce_then_rms_norm(self, x, residual, norm, eps, out)
            }
        };
        self.check_device("all_reduce_rms_norm", &[("w", w)])?;
        let d = ops::check_rms_norm(x, Some(residual), norm, eps, out)?;
        if let (Some(comm), Some(p)) = (&self.comm, self.p2p.as_ref()) {
            if self.p2p_on.load(Ordering::Relaxed) {
                p.check_live("all_reduce_rms_norm", &self.device_name())?;
                self.bind()?;
                let (peers, count) = (dptr(&p.peers), dptr(&p.count));
                if let Some(r) = kernels::allreduce_rms_norm(
                    self,
                    (x, residual, w, out),
                    eps,
                    &d,
                    peers,
                    count,
                    (comm.rank, comm.size),
                    p.cap,
                ) {
                    return r;
                }
            }
        }
        crate::backend::all_reduce_then_rms_norm(self, x, residual, norm, eps, out)
    }

    // The `Backend` method's arguments, as they are.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn tp_matmul_all_reduce_rms_norm(
        &self,
        x: &Tensor,
        w: &Tensor,
        hidden: &Tensor,
        residual: &Tensor,
        norm: Norm<'_>,
        eps: f32,
        out: &Tensor,
    ) -> Result<()> {
        let pushed = self.p2p.as_ref().zip(self.comm.as_ref()).filter(|_| {
            self.push_on && self.p2p_on.load(Ordering::Relaxed) && !self.skip_all_reduce
        });
        // (A quantized w takes the two ops: `gemv_push_rms_norm` wants w in x's type; a
        // LayerNorm too: the pushed kernel norms by RMSNorm only.)
        if let (Some((p, comm)), Norm::Rms(norm_w)) = (pushed, norm) {
            p.check_live("matmul_all_reduce_rms_norm", &self.device_name())?;
            let tensors = [
                ("x", x),
                ("w", w),
                ("hidden", hidden),
                ("residual", residual),
                ("norm_w", norm_w),
                ("out", out),
            ];
            self.check_device("matmul_all_reduce_rms_norm", &tensors)?;
            let d = ops::check_matmul(x, w, None, hidden)?;
            ops::check_rms_norm(hidden, Some(residual), norm, eps, out)?;
            self.bind()?;
            if let Some(r) = kernels::gemv_push_rms_norm(
                self,
                (x, w, hidden),
                (residual, norm_w, out),
                eps,
                &d,
                (dptr(&p.push_peers), dptr(&p.push_count)),
                (comm.rank, comm.size),
                (PUSH_CAP, self.gemv_max_rows),
            ) {
                return r;
            }
        }
        self.matmul(x, w, None, hidden)?;
        self.all_reduce_rms_norm(hidden, residual, norm, eps, out)
    }

    pub(super) fn tp_all_gather(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        self.check_device("all_gather", &[("src", src), ("dst", dst)])?;
        ops::check_all_gather(src, dst, self.group().1)?;
        let Some(comm) = &self.comm else {
            return self.copy(src, dst);
        };
        if src.numel() == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: shapes checked: dst holds size * src.numel() elements; both on this
        // device.
        unsafe {
            comm.all_gather(
                dptr(src),
                dptr(dst),
                src.numel(),
                src.dtype(),
                self.stream.cu_stream() as _,
            )
        }
    }

    pub(super) fn tp_unshard_columns(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        self.check_device("unshard_columns", &[("src", src), ("dst", dst)])?;
        let (s, rows, c) = ops::check_unshard_columns(src, dst)?;
        if s * rows * c == 0 {
            return Ok(());
        }
        self.bind()?;
        let e = src.dtype().size();
        let (w, n) = (c * e, dst.dim(1));
        for k in 0..s {
            // One strided copy per shard: its rows, `w` bytes each (the last shard's
            // columns past n, a padded vocabulary's, dropped), land at pitch `n` elements.
            let width = c.min(n - k * c) * e;
            let device = drv_sys::CUmemorytype::CU_MEMORYTYPE_DEVICE;
            let p = drv_sys::CUDA_MEMCPY2D {
                srcXInBytes: 0,
                srcY: 0,
                srcMemoryType: device,
                srcHost: std::ptr::null(),
                srcDevice: dptr(src) + (k * rows * w) as u64,
                srcArray: std::ptr::null_mut(),
                srcPitch: w,
                dstXInBytes: 0,
                dstY: 0,
                dstMemoryType: device,
                dstHost: std::ptr::null_mut(),
                dstDevice: dptr(dst) + (k * w) as u64,
                dstArray: std::ptr::null_mut(),
                dstPitch: n * e,
                WidthInBytes: width,
                Height: rows,
            };
            // SAFETY: shapes checked: the source rows lie in src, the strided destination
            // rows in dst; both on this device.
            unsafe { drv_sys::cuMemcpy2DAsync_v2(&p, self.stream.cu_stream()) }
                .result()
                .map_err(|e| Error::cuda("cuMemcpy2DAsync (unshard_columns)", e))?;
        }
        Ok(())
    }
}
