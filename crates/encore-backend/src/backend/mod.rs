//! The backend abstraction: the narrow set of ops one LLM forward step needs, plus memory,
//! copies and the capture primitives the graph runtime is built on.
//!
//! Two implementations: [`cpu::CpuBackend`] (the reference) and [`cuda::CudaBackend`]
//! (cudarc, NVRTC kernels, cuBLASLt, CUDA graphs). Both implement exactly the semantics
//! written on each method below; `crate::testing::reference` holds a naive f64 version
//! of each op that the tests and `encore info` compare against.
//!
//! Conventions shared by every op:
//! - Ops are asynchronous with respect to the host on CUDA (they are queued on the
//!   backend's one compute stream) and synchronous on CPU. Reading results goes through
//!   [`Backend::read_bytes`], which waits.
//! - Float tensors of one op share one dtype `T` (bf16, f16 or f32) unless stated; all
//!   arithmetic is in f32 and each output element is rounded to its dtype once.
//! - Index tensors are i32 (seeds i64). Every per-step quantity (positions, lengths,
//!   slots, block tables, sampling parameters) is read from a tensor at run time, so a
//!   captured graph replays correctly when only the tensor *contents* change.
//! - Out-of-range indices never read or write out of bounds: the op's doc says what
//!   happens instead (zeros, skip, leave untouched).
//! - Shapes and dtypes are validated by `crate::ops` before any work; a mismatch is an
//!   [`Error::Shape`] or [`Error::DType`] naming the tensor.

pub mod cpu;
pub mod cuda;
mod expert_slots;
mod host;
mod staging;

pub use expert_slots::{ExpertSlots, STATS as EXPERT_STATS};
pub(crate) use host::{check_copy as check_host_copy, check_view as check_host_view};
pub use host::{CopyQueue, HostMemory};
pub use staging::HostStaging;

pub use crate::args::{
    Activation, Attention, ExpertCache, ExpertPrefetch, KvScale, LogitBias, Mlp, Moe, MoeBias,
    Norm, NormMatmul, Penalties, PreNorm, QkvRope, SampleLogprobs, Sampling, TokenMask,
    MAX_TOP_LOGPROBS, PROMPT_BIT, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT,
};

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::tensor::{DType, Element, Tensor};
use crate::vmm::Vmm;

/// Shared handle to a backend.
pub type BackendRef = Arc<dyn Backend>;

/// [`Backend::all_reduce_rms_norm`] as its two ops (the default, and a backend's fallback
/// where its fused kernel does not apply).
pub(crate) fn all_reduce_then_rms_norm<B: Backend + ?Sized>(
    be: &B,
    x: &Tensor,
    residual: &Tensor,
    norm: Norm<'_>,
    eps: f32,
    out: &Tensor,
) -> Result<()> {
    be.all_reduce(x)?;
    be.rms_norm(x, Some(residual), norm, eps, out)
}

/// [`Backend::norm_add_norm`] as its ops (the default, and a backend's fallback where its
/// fused kernel does not apply).
pub(crate) fn norm_then_add_norm<B: Backend + ?Sized>(
    be: &B,
    x: &Tensor,
    x_norm: Norm<'_>,
    residual: &Tensor,
    norm: Option<Norm<'_>>,
    eps: f32,
    out: &Tensor,
) -> Result<()> {
    be.rms_norm(x, None, x_norm, eps, x)?;
    match norm {
        Some(n) => be.rms_norm(x, Some(residual), n, eps, out),
        None => be.residual_add(x, residual, out),
    }
}

/// A captured, replayable sequence of ops (a CUDA graph, or a CPU tape).
pub trait Graph: Send {
    /// Re-run every captured op. Kernel arguments (pointers, launch scalars) are those of
    /// the capture; buffer *contents* are read at replay time.
    fn replay(&self) -> Result<()>;
    /// Number of ops (kernels, copies) recorded.
    fn num_ops(&self) -> usize;
}

/// One device's memory, ops and capture.
pub trait Backend: Send + Sync {
    /// `cpu` or `cuda:N`.
    fn device_name(&self) -> String;

    /// Free and total device memory in bytes; `None` where it is not tracked (CPU).
    fn memory_info(&self) -> Option<(usize, usize)>;

    /// GEMM plans made so far (CUDA: cuBLASLt descriptors and heuristic queries, one per
    /// new matmul shape; the first use of a plan also loads its library kernel). A warm
    /// engine makes none during a request. 0 where matmuls need no planning (CPU).
    fn gemm_plans(&self) -> usize {
        0
    }

    /// This device's virtual memory manager (reserve / create / map), one per backend, so
    /// its usage counts cover every arena of the backend. An error when the device has
    /// none (a GPU without VMM support).
    fn vmm(&self) -> Result<Arc<dyn Vmm>>;

    /// Allocate an uninitialised tensor. Forbidden during capture (captures allocate from
    /// the capture arena, `crate::arena::Arena`).
    fn alloc(&self, dtype: DType, shape: &[usize]) -> Result<Tensor>;

    /// Copy host bytes into `dst` (`src.len() == dst.size_bytes()`). `src` may be reused
    /// as soon as this returns. Forbidden during capture.
    fn write_bytes(&self, dst: &Tensor, src: &[u8]) -> Result<()>;

    /// Host staging of `bytes` bytes for [`Backend::upload_staging`]: page-locked where
    /// the device has DMA (CUDA), ordinary memory otherwise.
    fn alloc_staging(&self, bytes: usize) -> Result<HostStaging> {
        if self.is_capturing() {
            return Err(Error::CaptureViolation {
                op: "alloc_staging",
            });
        }
        Ok(HostStaging::heap(bytes))
    }

    /// Copy the first `dst.size_bytes()` bytes of `src` into `dst`, queued on the stream
    /// (ordered before every later op). The copy may still be reading `src` when this
    /// returns; `src.bytes_mut()` waits for it. Forbidden during capture.
    fn upload_staging(&self, src: &mut HostStaging, dst: &Tensor) -> Result<()> {
        if self.is_capturing() {
            return Err(Error::CaptureViolation {
                op: "upload_staging (host->device copy)",
            });
        }
        self.write_bytes(dst, src.prefix_for(dst)?)
    }

    /// Copy `src` to host bytes, after all queued work. Forbidden during capture.
    fn read_bytes(&self, src: &Tensor, dst: &mut [u8]) -> Result<()>;

    /// Copy `src` into the first `src.size_bytes()` bytes of `dst`, queued on the stream
    /// after all queued work; `dst.bytes_mut()` waits for the copy before it hands the
    /// bytes out (page-locked staging: an asynchronous DMA, so the host may queue more
    /// work meanwhile). The default copies at once. Forbidden during capture.
    fn download_staging(&self, src: &Tensor, dst: &mut HostStaging) -> Result<()> {
        let n = src.size_bytes();
        let len = dst.len();
        let bytes = dst.bytes_mut()?.get_mut(..n).ok_or_else(|| {
            Error::invalid(
                "download_staging",
                format!("staging of {len} bytes is smaller than src ({n} bytes)"),
            )
        })?;
        self.read_bytes(src, bytes)
    }

    /// Device-to-device copy of equal-sized tensors (dtype-agnostic bytes). Capturable.
    fn copy(&self, src: &Tensor, dst: &Tensor) -> Result<()>;

    /// Wait for all queued work. Forbidden during capture.
    fn synchronize(&self) -> Result<()>;

    /// `out[i, :] = table[ids[i], :]`; an id outside `0..vocab` writes a zero row.
    /// ids i32 `[n]`, table T `[vocab, hidden]`, out T `[n, hidden]`.
    fn embedding(&self, ids: &Tensor, table: &Tensor, out: &Tensor) -> Result<()> {
        self.embedding_rows(ids, table, 0, out)
    }

    /// [`Backend::embedding`] over rows `first..first + vocab` of a larger table (one
    /// rank's shard of a vocabulary-parallel embedding): `out[i, :] = table[ids[i] -
    /// first, :]`, and an id outside `first..first + vocab` writes a zero row, so the
    /// shards' outputs sum to the whole table's. `first` at most `i32::MAX`.
    fn embedding_rows(
        &self,
        ids: &Tensor,
        table: &Tensor,
        first: usize,
        out: &Tensor,
    ) -> Result<()>;

    /// The norm `norm` names ([`Norm`]: RMSNorm, or LayerNorm with its bias) over the last
    /// dimension, optionally fused with the residual add.
    /// Without `residual`: `out = norm(x)` (RMSNorm: `x / sqrt(mean(x^2) + eps) * weight`).
    /// With `residual`: first `residual = residual + x` (rounded to T and stored back into
    /// `residual`), then `out = norm(residual)` computed from the stored value.
    /// x, residual, out T `[.., d]` (same shape), weight and bias T `[d]`. `out` may alias
    /// `x`.
    fn rms_norm(
        &self,
        x: &Tensor,
        residual: Option<&Tensor>,
        norm: Norm<'_>,
        eps: f32,
        out: &Tensor,
    ) -> Result<()>;

    /// `residual = residual + x` (rounded to T and stored back), then `out = residual`:
    /// the residual add of a layer with no norm before its next block (OLMo 2). x,
    /// residual, out T `[.., d]` (same shape).
    fn residual_add(&self, x: &Tensor, residual: &Tensor, out: &Tensor) -> Result<()>;

    /// A block's output norm, the residual add and the next norm in one op (Gemma's and
    /// OLMo 2's post norms): `x = x_norm(x)` rounded to T, `residual = residual + x`
    /// rounded to T, then `out = norm(residual)` (without `norm`, `out = residual`); each
    /// norm of either kind, as [`Backend::rms_norm`]. x, residual, out T `[.., d]`, the
    /// weights and biases T `[d]`. x's contents afterwards are unspecified (the default
    /// writes the normed x back; a fused kernel leaves it).
    fn norm_add_norm(
        &self,
        x: &Tensor,
        x_norm: Norm<'_>,
        residual: &Tensor,
        norm: Option<Norm<'_>>,
        eps: f32,
        out: &Tensor,
    ) -> Result<()> {
        norm_then_add_norm(self, x, x_norm, residual, norm, eps, out)
    }

    /// RMSNorm in place of columns `col0 .. col0 + d` of every row of x (T `[.., ld]`) by
    /// weight (T `[d]`): OLMo 2's q and k norms, each across its heads, on the fused
    /// q/k/v projection's rows.
    fn rms_norm_columns(&self, x: &Tensor, col0: usize, weight: &Tensor, eps: f32) -> Result<()>;

    /// `out[i, j] = silu(gate_up[i, j]) * gate_up[i, inter + j]`, gate_up T `[n, 2*inter]`,
    /// out T `[n, inter]`, silu(x) = x / (1 + exp(-x)).
    fn silu_mul(&self, gate_up: &Tensor, out: &Tensor) -> Result<()>;

    /// `out[i, j] = act(gate_up[i, j]) * gate_up[i, inter + j]` in f32, rounded to T once:
    /// [`Backend::silu_mul`] for [`Activation::Silu`], the same shapes. The default runs
    /// SiLU only (an error naming any other activation); the CPU and CUDA run them all.
    fn act_mul(&self, act: Activation, gate_up: &Tensor, out: &Tensor) -> Result<()> {
        match act {
            Activation::Silu => self.silu_mul(gate_up, out),
            other => Err(Error::invalid(
                "act_mul",
                format!(
                    "the {} activation does not run on {}",
                    other.hf_name(),
                    self.device_name()
                ),
            )),
        }
    }

    /// `out = x · wᵀ (+ bias)`: x T `[m, k]`, w T `[n, k]` (the HF `[out, in]` layout),
    /// bias T `[n]`, out T or f32 `[m, n]` (T only when there is a bias). f32 accumulation.
    /// NOTE: with a bias, CUDA (cuBLASLt's bias epilogue, as PyTorch's `addmm`) may round
    /// `x · wᵀ` to T before adding the bias: a second rounding the CPU does not do.
    ///
    /// `w` may also be quantized ([`DType::Q`], `[n, k]` in `crate::quant`'s device
    /// layout): the result is the matmul of its decoded values (the CPU decodes with
    /// `quant::dequantize_row`, the reference the CUDA kernels are checked against).
    ///
    /// `w` is a weight: no kernel op writes it (uploads and copies may). CUDA's gemvs
    /// start reading it before the op before them on the stream has finished.
    fn matmul(&self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>, out: &Tensor) -> Result<()>;

    /// `out[i, j] = x[i, perm[j]]`: the activation's columns in a weight's column order (a
    /// GPTQ act-order projection, whose input columns were sorted by group at load), a
    /// pure copy; a `perm[j]` outside `0..k` writes 0. x T `[m, k]`, perm i32 `[n]`, out T
    /// `[m, n]`. Capturable (perm is read at run time). The default refuses, naming the
    /// device.
    fn gather_columns(&self, x: &Tensor, perm: &Tensor, out: &Tensor) -> Result<()> {
        let _ = (x, perm, out);
        Err(Error::invalid(
            "gather_columns",
            format!("does not run on {}", self.device_name()),
        ))
    }

    /// `dst[t] = src[rows[t]]` where `rows[t]` is in `0..src.len()`; every other entry of
    /// `dst` keeps its value. src i32 `[s]`, rows and dst i32 `[n]`. Asynchronous
    /// scheduling's token ids: a step planned before the one ahead of it has finished
    /// takes its decode rows' ids from that step's samples on the device. Capturable
    /// (rows are read at run time). The default refuses, naming the device.
    fn fill_rows(&self, src: &Tensor, rows: &Tensor, dst: &Tensor) -> Result<()> {
        let _ = (src, rows, dst);
        Err(Error::invalid(
            "fill_rows",
            format!("does not run on {}", self.device_name()),
        ))
    }

    /// Reserve `bytes` of device scratch for matmuls with a quantized weight that decode
    /// it whole before multiplying (large `m` on CUDA). Called once the weights are
    /// loaded, before any capture, with the largest such weight's dense size; a backend
    /// that needs no scratch ignores it.
    fn reserve_dequant_scratch(&self, bytes: usize) -> Result<()> {
        let _ = bytes;
        Ok(())
    }

    /// Give a weight just loaded onto the device (`w`, a whole `[n, k]` matrix of its own,
    /// not an offload slot) whatever else the backend's matmul reads for it: on CUDA, a
    /// quantized weight the mixed-input tensor-core GEMM takes gets its repacked copy
    /// ([`crate::quant::marlin`], [`Tensor::with_packed`]). Not during a capture. The
    /// default keeps `w` as it is.
    fn prepare_weight(&self, w: Tensor) -> Result<Tensor> {
        Ok(w)
    }

    /// `x *= s` in place, each element rounded to T (Gemma's embedding scale). x T `[..]`
    /// (bf16, f16 or f32).
    fn scale(&self, x: &Tensor, s: f32) -> Result<()> {
        let _ = (x, s);
        Err(Error::invalid(
            "scale",
            format!("does not run on {}", self.device_name()),
        ))
    }

    /// `x = cap * tanh(x / cap)` in place, each element rounded to T (Gemma 2's final logit
    /// soft-capping), `cap` finite and > 0. x T `[..]` (bf16, f16 or f32).
    fn softcap(&self, x: &Tensor, cap: f32) -> Result<()> {
        let _ = (x, cap);
        Err(Error::invalid(
            "softcap",
            format!("does not run on {}", self.device_name()),
        ))
    }

    /// The MLP's gate/up projection and activation: `out = act_mul(act, x · wᵀ)`, x T
    /// `[m, k]`, w T `[2 * inter, k]` (gate rows then up rows), out T `[m, inter]`, the
    /// product rounded to T before the activation exactly as [`Backend::matmul`] then
    /// [`Backend::act_mul`] round it. `gate_up` T `[m, 2 * inter]` is scratch the backend
    /// may use for the product (its contents afterwards are unspecified). The default is
    /// those two ops; a backend may fuse them.
    fn matmul_act_mul(
        &self,
        act: Activation,
        x: &Tensor,
        w: &Tensor,
        gate_up: &Tensor,
        out: &Tensor,
    ) -> Result<()> {
        self.matmul(x, w, None, gate_up)?;
        self.act_mul(act, gate_up, out)
    }

    /// A dense gated MLP ([`Mlp`]): [`Backend::matmul_act_mul`] then the down
    /// [`Backend::matmul`], with exactly their roundings (the default is those two ops). CUDA
    /// quantizes the activation straight into the FP8 GEMM's operand where that GEMM runs
    /// the down projection, so the activation is never written in T.
    ///
    /// With [`Mlp::norm`], x is first added to the residual and normed
    /// ([`Backend::rms_norm`] into [`PreNorm::normed`] by default; CUDA quantizes the normed
    /// rows straight into the gate/up projection's FP8 operand where that GEMM runs it).
    fn mlp(&self, a: &Mlp<'_>) -> Result<()> {
        let x = match &a.norm {
            Some(n) => {
                self.rms_norm(a.x, Some(n.residual), n.norm, n.eps, n.normed)?;
                n.normed
            }
            None => a.x,
        };
        self.matmul_act_mul(a.act, x, a.gate_up, a.gate_up_out, a.act_out)?;
        self.matmul(a.act_out, a.down, None, a.out)
    }

    /// The residual add, its RMSNorm and the projection after it ([`NormMatmul`]):
    /// [`Backend::rms_norm`] with the residual into [`PreNorm::normed`], then
    /// [`Backend::matmul`], with exactly their roundings (the default is those two ops).
    /// CUDA quantizes the normed rows straight into the FP8 GEMM's operand where that GEMM
    /// runs the projection, so they are never written in T.
    fn add_norm_matmul(&self, a: &NormMatmul<'_>) -> Result<()> {
        let n = &a.norm;
        self.rms_norm(a.x, Some(n.residual), n.norm, n.eps, n.normed)?;
        self.matmul(n.normed, a.w, a.bias, a.out)
    }

    /// Whether [`Backend::moe`] runs here, dense and quantized experts alike (a model with
    /// experts is refused at load where it does not).
    fn runs_moe(&self) -> bool {
        false
    }

    /// Bytes of [`Moe::workspace`] a layer of `n` token rows needs (`hidden` wide, of
    /// `experts`, `top_k` per row, x in `dtype`); 0 where the backend needs none. Never
    /// less for more rows, so a buffer sized for the largest step serves every step.
    fn moe_workspace_bytes(
        &self,
        n: usize,
        hidden: usize,
        experts: usize,
        top_k: usize,
        dtype: DType,
    ) -> usize {
        let _ = (n, hidden, experts, top_k, dtype);
        0
    }

    /// A sparse MLP layer: see [`Moe`]. Each expert's gate and up products are rounded to
    /// T as [`Backend::matmul`] rounds them, its SiLU·mul as [`Backend::silu_mul`], its down
    /// product to T; the weighted sum over the chosen experts is f32, rounded to T once.
    fn moe(&self, args: &Moe<'_>) -> Result<()> {
        let _ = args;
        Err(Error::invalid(
            "moe",
            format!(
                "mixture-of-experts layers do not run on {} yet",
                self.device_name()
            ),
        ))
    }

    /// The compute stream waits for an expert prefetch still in flight
    /// ([`crate::args::ExpertPrefetch`]); nothing where none is. Called where a segment
    /// ends (a captured piece must join every stream it forked).
    fn join_expert_prefetch(&self) -> Result<()> {
        Ok(())
    }

    /// Qwen2-MoE's shared expert joining the routed ones: `x[i, j] += sigmoid(gate[i]) *
    /// y[i, j]`, x and y T `[n, d]`, gate T `[n, 1]`, the sigmoid, the product and the sum
    /// each rounded to T (as transformers computes it in T).
    fn sigmoid_gate_add(&self, x: &Tensor, gate: &Tensor, y: &Tensor) -> Result<()> {
        let _ = (x, gate, y);
        Err(Error::invalid(
            "sigmoid_gate_add",
            format!("not implemented on {}", self.device_name()),
        ))
    }

    /// Split the merged q/k/v projection, normalise and rotate q and k, write q out and
    /// k, v into the paged cache: see [`QkvRope`].
    fn qkv_rope_write(&self, args: &QkvRope<'_>) -> Result<()>;

    /// Paged attention, decode or prefill: see [`Attention`].
    fn attention(&self, args: &Attention<'_>) -> Result<()>;

    /// f32 elements of scratch [`Backend::attention`] needs for this launch shape, with
    /// any `window` (a window never needs more than full attention).
    fn attention_scratch_len(
        &self,
        rows: usize,
        num_heads: usize,
        head_dim: usize,
        table_width: usize,
        block_size: usize,
    ) -> usize;

    /// Sample one token per row: see [`Sampling`]. logits f32 `[b, vocab]`, out i32 `[b]`.
    fn sample(&self, logits: &Tensor, params: &Sampling<'_>, out: &Tensor) -> Result<()>;

    /// Add each row's logit biases to f32 `logits` `[b, vocab]` in place: see
    /// [`LogitBias`]. Capturable.
    fn logit_bias(&self, logits: &Tensor, bias: &LogitBias<'_>) -> Result<()>;

    /// Count tokens into a penalty table (see [`Penalties`]): for each `i` in order,
    /// `counts[slots[i], tokens[i]] += 1` (an output occurrence, wrapping), skipping a pair
    /// outside the table. counts i32 `[slots, vocab]`, slots and tokens i32 `[n]`.
    /// Capturable. (Speculative decoding counts a row's drafts into a copy of its
    /// sequence's row.)
    fn penalty_count(&self, counts: &Tensor, slots: &Tensor, tokens: &Tensor) -> Result<()>;

    /// This backend's place in its tensor-parallel group, `(rank, size)`: `(0, 1)` for a
    /// backend opened alone. The group's backends are opened together
    /// ([`crate::device::open_group`]); each rank runs its collectives from its own thread.
    fn group(&self) -> (usize, usize) {
        (0, 1)
    }

    /// Sum `x` over the group's ranks in place: afterwards every rank holds the same
    /// values (f32 arithmetic, rounded to T once). Alone: nothing. Capturable (a graph
    /// replays the collective). Every rank of a group must issue the same collectives
    /// in the same order, with tensors of the same shape. x T `[..]`.
    fn all_reduce(&self, x: &Tensor) -> Result<()>;

    /// [`Backend::all_reduce`] of `x`, then [`Backend::rms_norm`] of it with `residual`
    /// (`residual = T(residual + x)` stored back, `out = norm(residual)`): the norm
    /// that follows a row-parallel projection. Fused into one kernel where the backend
    /// can (CUDA's one-shot peer-memory all-reduce, RMSNorm only), with the same results;
    /// the two ops otherwise. x, residual, out T `[rows, d]`, the norm's tensors T `[d]`.
    fn all_reduce_rms_norm(
        &self,
        x: &Tensor,
        residual: &Tensor,
        norm: Norm<'_>,
        eps: f32,
        out: &Tensor,
    ) -> Result<()> {
        all_reduce_then_rms_norm(self, x, residual, norm, eps, out)
    }

    /// Tensor parallelism's row-parallel projection and the residual RMSNorm after it:
    /// `hidden = sum over the ranks of x · wᵀ` (x T `[m, k]`, w this rank's `[n, k]`,
    /// hidden T `[m, n]`), then, as [`Backend::all_reduce_rms_norm`], the residual adds
    /// hidden and `out = norm(residual)` (CUDA fuses the sum into the gemv for RMSNorm
    /// only). The default is [`Backend::matmul`]
    /// then [`Backend::all_reduce_rms_norm`]; a backend may move the sum into the matmul
    /// (CUDA: its gemv stores its outputs straight into every rank's memory). Collective:
    /// every rank issues it in the same order on the same shapes, and the ranks' backends
    /// must be set alike (e.g. the CUDA gemv's row limit), so that all take the same path.
    #[allow(clippy::too_many_arguments)]
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
        self.matmul(x, w, None, hidden)?;
        self.all_reduce_rms_norm(hidden, residual, norm, eps, out)
    }

    /// Gather every rank's `src` into `dst`: `dst[k] = src` of rank k, on every rank.
    /// Alone: a copy. Capturable; collective like [`Backend::all_reduce`].
    /// src T `[..]`, dst T `[size, ..src]`.
    fn all_gather(&self, src: &Tensor, dst: &Tensor) -> Result<()>;

    /// Interleave column shards (an all-gathered vocabulary-parallel LM head's logits;
    /// EAGLE's concatenated hidden states): `dst[r, k * c + j] = src[k, r, j]` for the
    /// columns `k * c + j < n`. A pure copy. src T `[s, rows, c]`, dst T `[rows, n]` with
    /// `n = s * c`, or fewer by less than a shard (a padded vocabulary's last columns
    /// dropped), T f32, bf16, f16 or i32.
    fn unshard_columns(&self, src: &Tensor, dst: &Tensor) -> Result<()>;

    /// A rank of this group failed: release every rank waiting in (or later entering) a
    /// collective, which then returns without its result, so no rank hangs. Alone:
    /// nothing.
    fn abort_group(&self, _why: &str) {}

    /// Start recording ops instead of running them. Until [`Backend::end_capture`],
    /// host<->device copies, synchronisation and [`Backend::alloc`] fail with
    /// [`Error::CaptureViolation`](crate::Error::CaptureViolation) naming the op.
    fn begin_capture(&self) -> Result<()>;

    /// Stop recording and return the replayable graph.
    fn end_capture(&self) -> Result<Box<dyn Graph>>;

    /// Whether a capture is in progress.
    fn is_capturing(&self) -> bool;

    /// `bytes` zeroed bytes of host memory for weights streamed by weight offload:
    /// page-locked on CUDA (an error naming the system cause when the driver refuses),
    /// ordinary memory on the CPU. Forbidden during capture.
    fn alloc_host(&self, bytes: usize) -> Result<HostMemory> {
        if self.is_capturing() {
            return Err(Error::CaptureViolation { op: "alloc_host" });
        }
        Ok(HostMemory::heap(bytes))
    }

    /// Make `mem` (a mapped safetensors file) a copy source in place: registered
    /// page-locked and read-only with the driver on CUDA (an error with the system cause
    /// when refused), read as is on the CPU. Forbidden during capture.
    fn register_host(&self, mem: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Result<HostMemory> {
        if self.is_capturing() {
            return Err(Error::CaptureViolation {
                op: "register_host",
            });
        }
        Ok(HostMemory::borrowed(mem))
    }

    /// A tensor of `shape` and `dtype` over the bytes of `mem` from `offset`, which ops
    /// read in place (zero-copy: on CUDA through the page-locked memory's device mapping,
    /// each read crossing the bus). Only ever read (the embedding table of an offloaded
    /// model, whose op reads a few rows per step). Forbidden during capture.
    fn host_view(
        &self,
        mem: &Arc<HostMemory>,
        offset: usize,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Tensor>;

    /// A queue for host-to-device weight copies beside the compute stream, with `events`
    /// events (see [`CopyQueue`]). Forbidden during capture.
    fn copy_queue(&self, events: usize) -> Result<Box<dyn CopyQueue>>;
}

impl dyn Backend + '_ {
    /// Allocate a tensor holding `data` with `shape`.
    pub fn upload<T: Element>(&self, data: &[T], shape: &[usize]) -> Result<Tensor> {
        let t = self.alloc(T::DTYPE, shape)?;
        crate::ops::check_len("upload", "data", data.len(), t.numel())?;
        self.write_bytes(&t, bytemuck::cast_slice(data))?;
        Ok(t)
    }

    /// Overwrite `dst` with `data`.
    pub fn write<T: Element>(&self, dst: &Tensor, data: &[T]) -> Result<()> {
        crate::ops::check_dtype("write", "dst", dst, &[T::DTYPE])?;
        crate::ops::check_len("write", "data", data.len(), dst.numel())?;
        self.write_bytes(dst, bytemuck::cast_slice(data))
    }

    /// Read a tensor back to the host.
    pub fn download<T: Element>(&self, src: &Tensor) -> Result<Vec<T>> {
        crate::ops::check_dtype("download", "src", src, &[T::DTYPE])?;
        let mut out = vec![T::zeroed(); src.numel()];
        self.read_bytes(src, bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }

    /// Read a float tensor (any float dtype) back as f32.
    pub fn download_f32(&self, src: &Tensor) -> Result<Vec<f32>> {
        Ok(match src.dtype() {
            DType::F32 => self.download::<f32>(src)?,
            DType::BF16 => self
                .download::<half::bf16>(src)?
                .into_iter()
                .map(f32::from)
                .collect(),
            DType::F16 => self
                .download::<half::f16>(src)?
                .into_iter()
                .map(f32::from)
                .collect(),
            other => {
                return Err(crate::Error::DType {
                    op: "download_f32",
                    name: "src",
                    found: other,
                    expected: "a float dtype".into(),
                })
            }
        })
    }

    /// Upload f32 values converted to the float dtype `dtype`.
    pub fn upload_f32_as(&self, data: &[f32], shape: &[usize], dtype: DType) -> Result<Tensor> {
        match dtype {
            DType::F32 => self.upload(data, shape),
            DType::BF16 => {
                let v: Vec<half::bf16> = data.iter().map(|&x| half::bf16::from_f32(x)).collect();
                self.upload(&v, shape)
            }
            DType::F16 => {
                let v: Vec<half::f16> = data.iter().map(|&x| half::f16::from_f32(x)).collect();
                self.upload(&v, shape)
            }
            other => Err(crate::Error::DType {
                op: "upload_f32_as",
                name: "dtype",
                found: other,
                expected: "a float dtype".into(),
            }),
        }
    }
}
