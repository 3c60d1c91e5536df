//! A CPU backend with hooks, for tests of how the engine and the checks meet a broken
//! backend: every op runs on the CPU backend unless its hook (where there is one) answers
//! it instead.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use encore_core::backend::cpu::CpuBackend;
use encore_core::backend::{Activation, CopyQueue, HostMemory, Moe, Norm};
use encore_core::memory::vmm::Vmm;
use encore_core::{
    Attention, Backend, DType, Error, Graph, LogitBias, QkvRope, Result, Sampling, Tensor,
};

/// What a [`Hooked`] backend does instead of the CPU backend's op (`None`: the op runs
/// as it is). Each hook sees the CPU backend.
pub trait Hooks: Send + Sync {
    fn alloc(
        &self,
        _inner: &CpuBackend,
        _dtype: DType,
        _shape: &[usize],
    ) -> Option<Result<Tensor>> {
        None
    }
    fn matmul(&self, _inner: &CpuBackend, _out: &Tensor) -> Option<Result<()>> {
        None
    }
    fn begin_capture(&self, _inner: &CpuBackend) -> Option<Result<()>> {
        None
    }
    fn end_capture(&self, _inner: &CpuBackend) -> Option<Result<Box<dyn Graph>>> {
        None
    }
    fn is_capturing(&self, _inner: &CpuBackend) -> Option<bool> {
        None
    }
}

/// Hooks that fail the first matmul after [`FailArmed::arm`]: an error ("the injected
/// fault") or, with `panic`, a panic ("the injected panic").
#[derive(Default)]
pub struct FailArmed {
    pub armed: AtomicBool,
    pub panic: bool,
}

impl FailArmed {
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }
}

impl Hooks for FailArmed {
    fn matmul(&self, _: &CpuBackend, _: &Tensor) -> Option<Result<()>> {
        if !self.armed.swap(false, Ordering::SeqCst) {
            return None;
        }
        if self.panic {
            panic!("the injected panic");
        }
        Some(Err(Error::invalid("matmul", "the injected fault")))
    }
}

/// A CPU backend (`inner`, which may be a rank of a CPU group) whose ops go through
/// `hooks`.
pub struct Hooked<H> {
    pub inner: CpuBackend,
    pub hooks: H,
}

impl<H: Hooks> Backend for Hooked<H> {
    fn device_name(&self) -> String {
        self.inner.device_name()
    }
    fn memory_info(&self) -> Option<(usize, usize)> {
        self.inner.memory_info()
    }
    fn vmm(&self) -> Result<Arc<dyn Vmm>> {
        self.inner.vmm()
    }
    fn alloc(&self, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        match self.hooks.alloc(&self.inner, dtype, shape) {
            Some(r) => r,
            None => self.inner.alloc(dtype, shape),
        }
    }
    fn write_bytes(&self, dst: &Tensor, src: &[u8]) -> Result<()> {
        self.inner.write_bytes(dst, src)
    }
    fn read_bytes(&self, src: &Tensor, dst: &mut [u8]) -> Result<()> {
        self.inner.read_bytes(src, dst)
    }
    fn copy(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        self.inner.copy(src, dst)
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    fn embedding_rows(&self, ids: &Tensor, t: &Tensor, first: usize, out: &Tensor) -> Result<()> {
        self.inner.embedding_rows(ids, t, first, out)
    }
    fn group(&self) -> (usize, usize) {
        self.inner.group()
    }
    fn all_reduce(&self, x: &Tensor) -> Result<()> {
        self.inner.all_reduce(x)
    }
    fn all_gather(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        self.inner.all_gather(src, dst)
    }
    fn unshard_columns(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        self.inner.unshard_columns(src, dst)
    }
    fn abort_group(&self, why: &str) {
        self.inner.abort_group(why)
    }
    fn rms_norm(
        &self,
        x: &Tensor,
        r: Option<&Tensor>,
        w: Norm<'_>,
        eps: f32,
        out: &Tensor,
    ) -> Result<()> {
        self.inner.rms_norm(x, r, w, eps, out)
    }
    fn residual_add(&self, x: &Tensor, residual: &Tensor, out: &Tensor) -> Result<()> {
        self.inner.residual_add(x, residual, out)
    }
    fn rms_norm_columns(&self, x: &Tensor, col0: usize, w: &Tensor, eps: f32) -> Result<()> {
        self.inner.rms_norm_columns(x, col0, w, eps)
    }
    fn silu_mul(&self, gate_up: &Tensor, out: &Tensor) -> Result<()> {
        self.inner.silu_mul(gate_up, out)
    }
    fn act_mul(&self, act: Activation, gate_up: &Tensor, out: &Tensor) -> Result<()> {
        self.inner.act_mul(act, gate_up, out)
    }
    fn scale(&self, x: &Tensor, s: f32) -> Result<()> {
        self.inner.scale(x, s)
    }

    fn gather_columns(&self, x: &Tensor, perm: &Tensor, out: &Tensor) -> Result<()> {
        self.inner.gather_columns(x, perm, out)
    }

    fn fill_rows(&self, src: &Tensor, rows: &Tensor, dst: &Tensor) -> Result<()> {
        self.inner.fill_rows(src, rows, dst)
    }

    fn prepare_weight(&self, w: Tensor) -> Result<Tensor> {
        self.inner.prepare_weight(w)
    }

    fn softcap(&self, x: &Tensor, cap: f32) -> Result<()> {
        self.inner.softcap(x, cap)
    }
    fn matmul(&self, x: &Tensor, w: &Tensor, b: Option<&Tensor>, out: &Tensor) -> Result<()> {
        match self.hooks.matmul(&self.inner, out) {
            Some(r) => r,
            None => self.inner.matmul(x, w, b, out),
        }
    }
    fn sigmoid_gate_add(&self, x: &Tensor, gate: &Tensor, y: &Tensor) -> Result<()> {
        self.inner.sigmoid_gate_add(x, gate, y)
    }
    fn runs_moe(&self) -> bool {
        self.inner.runs_moe()
    }
    fn moe(&self, a: &Moe<'_>) -> Result<()> {
        self.inner.moe(a)
    }
    fn qkv_rope_write(&self, a: &QkvRope<'_>) -> Result<()> {
        self.inner.qkv_rope_write(a)
    }
    fn attention(&self, a: &Attention<'_>) -> Result<()> {
        self.inner.attention(a)
    }
    fn attention_scratch_len(&self, a: usize, b: usize, c: usize, d: usize, e: usize) -> usize {
        self.inner.attention_scratch_len(a, b, c, d, e)
    }
    fn sample(&self, logits: &Tensor, p: &Sampling<'_>, out: &Tensor) -> Result<()> {
        self.inner.sample(logits, p, out)
    }
    fn logit_bias(&self, logits: &Tensor, b: &LogitBias<'_>) -> Result<()> {
        self.inner.logit_bias(logits, b)
    }
    fn penalty_count(&self, counts: &Tensor, slots: &Tensor, tokens: &Tensor) -> Result<()> {
        self.inner.penalty_count(counts, slots, tokens)
    }
    fn begin_capture(&self) -> Result<()> {
        match self.hooks.begin_capture(&self.inner) {
            Some(r) => r,
            None => self.inner.begin_capture(),
        }
    }
    fn end_capture(&self) -> Result<Box<dyn Graph>> {
        match self.hooks.end_capture(&self.inner) {
            Some(r) => r,
            None => self.inner.end_capture(),
        }
    }
    fn is_capturing(&self) -> bool {
        match self.hooks.is_capturing(&self.inner) {
            Some(c) => c,
            None => self.inner.is_capturing(),
        }
    }
    fn host_view(
        &self,
        mem: &Arc<HostMemory>,
        offset: usize,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Tensor> {
        self.inner.host_view(mem, offset, shape, dtype)
    }
    fn copy_queue(&self, events: usize) -> Result<Box<dyn CopyQueue>> {
        self.inner.copy_queue(events)
    }
}
