//! The CPU backend: the reference every other backend is checked against.
//!
//! Plain Rust, f32 accumulation, rayon for row parallelism and the `gemm` crate for
//! matmul. Capture records each op as a closure (pointers and launch scalars fixed at
//! capture, buffer contents read when it runs) into a tape; replay runs the tape. That
//! gives CPU graphs the same semantics as CUDA graphs, so the graph runtime is tested
//! for real in CI: a kernel that baked a per-step host value replays wrong here too.

mod copy_queue;
mod group;
mod kernels;

pub use group::CpuGroup;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::backend::{
    Activation, Attention, Backend, Graph, LogitBias, Moe, Norm, QkvRope, Sampling,
};
use crate::error::{Error, Result};
use crate::ops;
pub use crate::storage::CpuBuffer;
use crate::tensor::{DType, Storage, Tensor};
use crate::vmm::{cpu::CpuVmm, Vmm};

/// Raw pointer to the first element of a CPU tensor.
///
/// Panics if the tensor is not on the CPU; backends call `check_device` first.
pub(crate) fn ptr_of(t: &Tensor) -> *mut u8 {
    match t.storage() {
        // SAFETY: `Tensor::new` guarantees offset + size is within the buffer.
        Storage::Cpu(b) => unsafe { b.as_ptr().add(t.offset()) },
        Storage::Cuda(_) => unreachable!("ptr_of on a CUDA tensor (check_device first)"),
    }
}

/// A recorded op.
type TapeOp = Box<dyn Fn() + Send + Sync>;

/// A CPU graph: the ops recorded during a capture, in order.
pub struct CpuGraph {
    ops: Vec<TapeOp>,
}

impl Graph for CpuGraph {
    fn replay(&self) -> Result<()> {
        for op in &self.ops {
            op();
        }
        Ok(())
    }
    fn num_ops(&self) -> usize {
        self.ops.len()
    }
}

/// Runs ops at once, or records them on a tape while capturing (shared with the copy
/// queue, whose ops are recorded on the same tape).
#[derive(Default)]
pub(crate) struct Recorder {
    capturing: AtomicBool,
    tape: Mutex<Vec<TapeOp>>,
}

impl Recorder {
    /// Run `op` now, or record it when capturing.
    pub(crate) fn submit(&self, op: impl Fn() + Send + Sync + 'static) {
        if self.capturing.load(Ordering::Acquire) {
            self.tape.lock().unwrap().push(Box::new(op));
        } else {
            op();
        }
    }

    pub(crate) fn capturing(&self) -> bool {
        self.capturing.load(Ordering::Acquire)
    }
}

/// The CPU backend.
pub struct CpuBackend {
    rec: Arc<Recorder>,
    vmm: OnceLock<Arc<CpuVmm>>,
    /// Added before each copy of the copy queue (a test knob: it makes a missing wait
    /// read stale weights every time instead of sometimes).
    copy_delay: std::time::Duration,
    /// The tensor-parallel group this backend is rank `.1` of (`None`: alone).
    group: Option<(Arc<CpuGroup>, usize)>,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend {
            rec: Arc::new(Recorder::default()),
            vmm: OnceLock::new(),
            copy_delay: std::time::Duration::ZERO,
            group: None,
        }
    }

    /// `size` backends, ranks `0..size` of one tensor-parallel group (the CPU twin of a
    /// multi-GPU group: each rank runs in its own thread).
    pub fn group(size: usize) -> Vec<CpuBackend> {
        let g = Arc::new(CpuGroup::new(size));
        (0..size)
            .map(|r| CpuBackend {
                group: (size > 1).then(|| (g.clone(), r)),
                ..Self::new()
            })
            .collect()
    }

    /// A backend whose copy queue ([`Backend::copy_queue`]) sleeps `delay` before each
    /// copy, as a slow link would: ordering mistakes then show every time.
    pub fn with_copy_delay(delay: std::time::Duration) -> Self {
        CpuBackend {
            copy_delay: delay,
            ..Self::new()
        }
    }

    /// Run `op` now, or record it when capturing.
    fn submit(&self, op: impl Fn() + Send + Sync + 'static) {
        self.rec.submit(op)
    }

    fn forbid_in_capture(&self, op: &'static str) -> Result<()> {
        if self.rec.capturing() {
            return Err(Error::CaptureViolation { op });
        }
        Ok(())
    }
}

/// Every tensor argument must live on the CPU.
fn check_device(op: &'static str, tensors: &[(&'static str, &Tensor)]) -> Result<()> {
    for (name, t) in tensors {
        if !matches!(t.storage(), Storage::Cpu(_)) {
            return Err(Error::WrongDevice {
                op,
                name,
                found: t.device_name(),
                expected: "cpu".into(),
            });
        }
    }
    Ok(())
}

impl Backend for CpuBackend {
    fn device_name(&self) -> String {
        "cpu".into()
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        None
    }

    fn vmm(&self) -> Result<Arc<dyn Vmm>> {
        Ok(self.vmm.get_or_init(|| Arc::new(CpuVmm::new())).clone())
    }

    fn alloc(&self, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        self.forbid_in_capture("alloc")?;
        let bytes = crate::tensor::shape_bytes("alloc", shape, dtype)?;
        let buf = CpuBuffer::new(bytes)?;
        Tensor::new(Storage::Cpu(Arc::new(buf)), 0, shape, dtype)
    }

    fn write_bytes(&self, dst: &Tensor, src: &[u8]) -> Result<()> {
        self.forbid_in_capture("write_bytes (host->device copy)")?;
        check_device("write_bytes", &[("dst", dst)])?;
        ops::check_len("write_bytes", "src", src.len(), dst.size_bytes())?;
        // SAFETY: dst spans size_bytes() valid bytes; src has the same length.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ptr_of(dst), src.len()) };
        Ok(())
    }

    fn read_bytes(&self, src: &Tensor, dst: &mut [u8]) -> Result<()> {
        self.forbid_in_capture("read_bytes (device->host copy)")?;
        check_device("read_bytes", &[("src", src)])?;
        ops::check_len("read_bytes", "dst", dst.len(), src.size_bytes())?;
        // SAFETY: src spans size_bytes() valid bytes; dst has the same length.
        unsafe { std::ptr::copy_nonoverlapping(ptr_of(src), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn copy(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        check_device("copy", &[("src", src), ("dst", dst)])?;
        ops::check_copy(src, dst)?;
        let (src, dst) = (src.clone(), dst.clone());
        self.submit(move || {
            // SAFETY: both views span the same number of valid bytes; `copy` (memmove)
            // tolerates overlap.
            unsafe { std::ptr::copy(ptr_of(&src), ptr_of(&dst), src.size_bytes()) }
        });
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        self.forbid_in_capture("synchronize")
    }

    fn embedding_rows(
        &self,
        ids: &Tensor,
        table: &Tensor,
        first: usize,
        out: &Tensor,
    ) -> Result<()> {
        check_device("embedding", &[("ids", ids), ("table", table), ("out", out)])?;
        let d = ops::check_embedding(ids, table, first, out)?;
        let (ids, table, out) = (ids.clone(), table.clone(), out.clone());
        self.submit(move || kernels::embedding(&ids, &table, &out, &d));
        Ok(())
    }

    fn group(&self) -> (usize, usize) {
        self.group.as_ref().map_or((0, 1), |(g, r)| (*r, g.size()))
    }

    fn all_reduce(&self, x: &Tensor) -> Result<()> {
        check_device("all_reduce", &[("x", x)])?;
        let n = ops::check_all_reduce(x)?;
        let Some((g, rank)) = self.group.clone() else {
            return Ok(());
        };
        let x = x.clone();
        self.submit(move || g.all_reduce(rank, ptr_of(&x) as usize, n, x.dtype()));
        Ok(())
    }

    fn all_gather(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        check_device("all_gather", &[("src", src), ("dst", dst)])?;
        ops::check_all_gather(src, dst, self.group().1)?;
        let Some((g, rank)) = self.group.clone() else {
            return self.copy(src, dst);
        };
        let (src, dst) = (src.clone(), dst.clone());
        self.submit(move || {
            g.all_gather(
                rank,
                ptr_of(&src) as usize,
                ptr_of(&dst) as usize,
                src.size_bytes(),
            )
        });
        Ok(())
    }

    fn unshard_columns(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        check_device("unshard_columns", &[("src", src), ("dst", dst)])?;
        let (s, rows, c) = ops::check_unshard_columns(src, dst)?;
        let n = dst.dim(1);
        let (src, dst) = (src.clone(), dst.clone());
        let e = src.dtype().size();
        self.submit(move || {
            let (src, dst) = (ptr_of(&src) as *const u8, ptr_of(&dst));
            for k in 0..s {
                // The last shard's columns past n (a padded vocabulary) are dropped.
                let w = c.min(n - k * c);
                for r in 0..rows {
                    // SAFETY: shapes checked: src holds s * rows * c and dst rows * n
                    // elements of `e` bytes (k * c + w <= n), distinct buffers.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            src.add((k * rows + r) * c * e),
                            dst.add((r * n + k * c) * e),
                            w * e,
                        )
                    }
                }
            }
        });
        Ok(())
    }

    fn abort_group(&self, why: &str) {
        if let Some((g, _)) = &self.group {
            g.abort(why);
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
        check_device(
            "rms_norm",
            &[("x", x), ("weight", norm.weight()), ("out", out)],
        )?;
        for (name, t) in [("residual", residual), ("bias", norm.bias())] {
            if let Some(t) = t {
                check_device("rms_norm", &[(name, t)])?;
            }
        }
        let d = ops::check_rms_norm(x, residual, norm, eps, out)?;
        let (x, residual, out) = (x.clone(), residual.cloned(), out.clone());
        let (w, b) = (norm.weight().clone(), norm.bias().cloned());
        self.submit(move || {
            kernels::rms_norm(&x, residual.as_ref(), (&w, b.as_ref()), eps, &out, &d)
        });
        Ok(())
    }

    fn residual_add(&self, x: &Tensor, residual: &Tensor, out: &Tensor) -> Result<()> {
        let t = [("x", x), ("residual", residual), ("out", out)];
        check_device("residual_add", &t)?;
        let d = ops::check_residual_add(x, residual, out)?.whole_rows();
        let (x, residual, out) = (x.clone(), residual.clone(), out.clone());
        self.submit(move || kernels::norm_rows(&x, Some(&residual), None, 0.0, &out, &d));
        Ok(())
    }

    fn rms_norm_columns(&self, x: &Tensor, col0: usize, weight: &Tensor, eps: f32) -> Result<()> {
        check_device("rms_norm_columns", &[("x", x), ("weight", weight)])?;
        let d = ops::check_rms_norm_columns(x, col0, weight, eps)?;
        let (x, weight) = (x.clone(), weight.clone());
        self.submit(move || kernels::norm_rows(&x, None, Some((&weight, None)), eps, &x, &d));
        Ok(())
    }

    fn silu_mul(&self, gate_up: &Tensor, out: &Tensor) -> Result<()> {
        self.act_mul(Activation::Silu, gate_up, out)
    }

    fn act_mul(&self, act: Activation, gate_up: &Tensor, out: &Tensor) -> Result<()> {
        check_device("act_mul", &[("gate_up", gate_up), ("out", out)])?;
        let d = ops::check_silu_mul(gate_up, out)?;
        let (gate_up, out) = (gate_up.clone(), out.clone());
        self.submit(move || kernels::act_mul(act, &gate_up, &out, &d));
        Ok(())
    }

    fn matmul(&self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>, out: &Tensor) -> Result<()> {
        check_device("matmul", &[("x", x), ("w", w), ("out", out)])?;
        if let Some(b) = bias {
            check_device("matmul", &[("bias", b)])?;
        }
        let d = ops::check_matmul(x, w, bias, out)?;
        let (x, w, bias, out) = (x.clone(), w.clone(), bias.cloned(), out.clone());
        self.submit(move || kernels::matmul(&x, &w, bias.as_ref(), &out, &d));
        Ok(())
    }

    fn fill_rows(&self, src: &Tensor, rows: &Tensor, dst: &Tensor) -> Result<()> {
        check_device("fill_rows", &[("src", src), ("rows", rows), ("dst", dst)])?;
        let (s, n) = ops::check_fill_rows(src, rows, dst)?;
        let (src, rows, dst) = (src.clone(), rows.clone(), dst.clone());
        self.submit(move || kernels::fill_rows(&src, &rows, &dst, s, n));
        Ok(())
    }

    fn gather_columns(&self, x: &Tensor, perm: &Tensor, out: &Tensor) -> Result<()> {
        check_device("gather_columns", &[("x", x), ("perm", perm), ("out", out)])?;
        let d = ops::check_gather_columns(x, perm, out)?;
        let (x, perm, out) = (x.clone(), perm.clone(), out.clone());
        self.submit(move || kernels::gather_columns(&x, &perm, &out, &d));
        Ok(())
    }

    fn scale(&self, x: &Tensor, s: f32) -> Result<()> {
        check_device("scale", &[("x", x)])?;
        ops::check_scale(x)?;
        let x = x.clone();
        self.submit(move || kernels::scale(&x, s));
        Ok(())
    }

    fn softcap(&self, x: &Tensor, cap: f32) -> Result<()> {
        check_device("softcap", &[("x", x)])?;
        ops::check_softcap(x, cap)?;
        let x = x.clone();
        self.submit(move || kernels::softcap(&x, cap));
        Ok(())
    }

    fn sigmoid_gate_add(&self, x: &Tensor, gate: &Tensor, y: &Tensor) -> Result<()> {
        check_device("sigmoid_gate_add", &[("x", x), ("gate", gate), ("y", y)])?;
        let d = ops::check_sigmoid_gate_add(x, gate, y)?;
        let (x, gate, y) = (x.clone(), gate.clone(), y.clone());
        self.submit(move || kernels::sigmoid_gate_add(&x, &gate, &y, &d));
        Ok(())
    }

    fn runs_moe(&self) -> bool {
        true
    }

    fn moe(&self, a: &Moe<'_>) -> Result<()> {
        check_device("moe", &a.tensors())?;
        let d = ops::check_moe(a)?;
        let args = kernels::MoeArgs {
            x: a.x.clone(),
            logits: a.logits.clone(),
            renormalize: a.renormalize,
            act: a.act,
            bias: a.bias.map(|b| (b.gate_up.clone(), b.down.clone())),
            gate_up: a.gate_up.clone(),
            down: a.down.clone(),
            ids: a.ids.clone(),
            weights: a.weights.clone(),
            out: a.out.clone(),
            cache: a
                .cache
                .as_ref()
                .map(|c| (crate::backend::ExpertSlots::of(c), c.decay)),
            prefetch: a.cache.as_ref().and_then(|c| c.prefetch.as_ref()).map(|p| {
                kernels::PrefetchArgs {
                    logits: p.logits.clone(),
                    ids: p.ids.clone(),
                    weights: p.weights.clone(),
                    gate_up: p.gate_up.clone(),
                    down: p.down.clone(),
                    fills: p.fills.clone(),
                }
            }),
        };
        self.submit(move || kernels::moe(&args, &d));
        Ok(())
    }

    fn qkv_rope_write(&self, a: &QkvRope<'_>) -> Result<()> {
        check_device("qkv_rope_write", &a.tensors())?;
        let d = ops::check_qkv_rope(a)?;
        let args = kernels::QkvRopeArgs {
            qkv: a.qkv.clone(),
            head_norm: a.head_norm.map(|(q, k)| (q.clone(), k.clone())),
            eps: a.eps,
            positions: a.positions.clone(),
            cos_sin: a.cos_sin.clone(),
            slot_mapping: a.slot_mapping.clone(),
            q_out: a.q_out.clone(),
            k_cache: a.k_cache.clone(),
            v_cache: a.v_cache.clone(),
            kv_scale: a.kv_scale,
        };
        self.submit(move || kernels::qkv_rope_write(&args, &d));
        Ok(())
    }

    fn attention(&self, a: &Attention<'_>) -> Result<()> {
        check_device("attention", &a.tensors())?;
        let d = ops::check_attention(a)?;
        let owned = kernels::AttentionArgs {
            q: a.q.clone(),
            k_cache: a.k_cache.clone(),
            v_cache: a.v_cache.clone(),
            kv_scale: a.kv_scale,
            block_tables: a.block_tables.clone(),
            seq_lens: a.seq_lens.clone(),
            cu_seqlens_q: a.cu_seqlens_q.cloned(),
            scale: a.scale,
            softcap: a.softcap,
            window: a.window,
            sinks: a.sinks.cloned(),
            out: a.out.clone(),
            dims: d,
        };
        self.submit(move || kernels::attention(&owned));
        Ok(())
    }

    fn attention_scratch_len(&self, _: usize, _: usize, _: usize, _: usize, _: usize) -> usize {
        0
    }

    fn sample(&self, logits: &Tensor, p: &Sampling<'_>, out: &Tensor) -> Result<()> {
        check_device("sample", &[("logits", logits), ("out", out)])?;
        check_device("sample", &p.tensors())?;
        let d = ops::check_sample(logits, p, out)?;
        let args = kernels::SampleArgs {
            logits: logits.clone(),
            temperature: p.temperature.clone(),
            top_k: p.top_k.clone(),
            top_p: p.top_p.clone(),
            min_p: p.min_p.clone(),
            seeds: p.seeds.clone(),
            out: out.clone(),
            penalties: p.penalties.as_ref().map(|q| kernels::PenaltyArgs {
                counts: q.counts.clone(),
                slot: q.slot.clone(),
                repetition: q.repetition.clone(),
                frequency: q.frequency.clone(),
                presence: q.presence.clone(),
            }),
            logprobs: p.logprobs.as_ref().map(|l| kernels::LogprobArgs {
                num: l.num.clone(),
                token: l.token.clone(),
                top_ids: l.top_ids.clone(),
                top: l.top.clone(),
                target: l.target.cloned(),
            }),
            mask: p.mask.as_ref().map(|m| kernels::MaskArgs {
                bits: m.bits.clone(),
                on: m.on.clone(),
            }),
            dims: d,
        };
        self.submit(move || kernels::sample(&args));
        Ok(())
    }

    fn logit_bias(&self, logits: &Tensor, b: &LogitBias<'_>) -> Result<()> {
        let t = [
            ("logits", logits),
            ("ids", b.ids),
            ("vals", b.vals),
            ("count", b.count),
        ];
        check_device("logit_bias", &t)?;
        let (batch, vocab, _) = ops::check_logit_bias(logits, b)?;
        if batch == 0 {
            return Ok(());
        }
        let (logits, ids, vals, count) = (
            logits.clone(),
            b.ids.clone(),
            b.vals.clone(),
            b.count.clone(),
        );
        self.submit(move || kernels::logit_bias(&logits, &ids, &vals, &count, vocab));
        Ok(())
    }

    fn penalty_count(&self, counts: &Tensor, slots: &Tensor, tokens: &Tensor) -> Result<()> {
        let t = [("counts", counts), ("slots", slots), ("tokens", tokens)];
        check_device("penalty_count", &t)?;
        let (_, vocab, n) = ops::check_penalty_count(counts, slots, tokens)?;
        if n == 0 {
            return Ok(());
        }
        let (counts, slots, tokens) = (counts.clone(), slots.clone(), tokens.clone());
        self.submit(move || kernels::penalty_count(&counts, &slots, &tokens, vocab));
        Ok(())
    }

    fn begin_capture(&self) -> Result<()> {
        if self.rec.capturing.swap(true, Ordering::AcqRel) {
            return Err(Error::Capture(
                "begin_capture while already capturing".into(),
            ));
        }
        self.rec.tape.lock().unwrap().clear();
        Ok(())
    }

    fn end_capture(&self) -> Result<Box<dyn Graph>> {
        if !self.rec.capturing.swap(false, Ordering::AcqRel) {
            return Err(Error::Capture("end_capture without begin_capture".into()));
        }
        let ops = std::mem::take(&mut *self.rec.tape.lock().unwrap());
        Ok(Box::new(CpuGraph { ops }))
    }

    fn is_capturing(&self) -> bool {
        self.rec.capturing()
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
        let len = mem.len() - offset;
        // SAFETY: `offset <= mem.len()`; the buffer keeps `mem` alive, and the view is only
        // read (see `Backend::host_view`), so read-only mapped memory is never written.
        let ptr = unsafe { mem.as_ptr().add(offset) } as *mut u8;
        let keep: Arc<dyn Send + Sync> = mem.clone();
        let buf = CpuBuffer::mapped(ptr, len, keep);
        Tensor::new(Storage::Cpu(Arc::new(buf)), 0, shape, dtype)
    }

    fn copy_queue(&self, events: usize) -> Result<Box<dyn crate::backend::CopyQueue>> {
        self.forbid_in_capture("copy_queue")?;
        Ok(Box::new(copy_queue::CpuCopyQueue::new(
            self.rec.clone(),
            events,
            self.copy_delay,
        )?))
    }
}
