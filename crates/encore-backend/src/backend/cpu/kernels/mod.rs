//! CPU kernels: the reference implementations of every op (semantics on `Backend`).
//! Each runs when called (eagerly or from a tape) and reads its buffers at that moment.
//!
//! Float kernels are generic over [`Float`] (bf16, f16, f32): every value is widened to
//! f32, all arithmetic is f32, and each output element is rounded to its dtype once.
//! Rows are spread over rayon's pool; a kernel never reads or writes outside its tensors,
//! whatever the index data says.
//!
//! NOTE: outputs must not overlap inputs unless the op says so (only `rms_norm` allows
//! `out` to alias `x`): the kernels build Rust slices over the buffers, and overlapping
//! `&` and `&mut` slices would be undefined behaviour.

mod attention;
mod gather;
mod qkv_rope;
mod sample;

use std::borrow::Cow;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;

use super::ptr_of;
use crate::args::Activation;
use crate::ops::{ColumnDims, EmbeddingDims, MatmulDims, MoeDims, RowDims};
use crate::quant::{self, QuantFormat};
use crate::tensor::{DType, Tensor};
pub(super) use gather::{fill_rows, gather_columns};

pub(super) use attention::{attention, AttentionArgs};
pub(super) use qkv_rope::{qkv_rope_write, QkvRopeArgs};
pub(super) use sample::{
    logit_bias, penalty_count, sample, LogprobArgs, MaskArgs, PenaltyArgs, SampleArgs,
};

/// A float element type the kernels compute with (always through f32).
trait Float: Copy + Send + Sync + 'static {
    /// Whether `to_f32` is a few instructions (f32, bf16; f16 needs `half`'s slice
    /// conversion to be fast).
    const CHEAP_TO_F32: bool;
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
    /// The slice itself when `Self` is f32 (so f32 inputs are not copied).
    fn as_f32(s: &[Self]) -> Option<&[f32]>;
    /// `dst[i] = src[i].to_f32()` for a whole slice, as fast as the type allows.
    fn widen(src: &[Self], dst: &mut [f32]);
}

impl Float for f32 {
    const CHEAP_TO_F32: bool = true;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
    fn as_f32(s: &[Self]) -> Option<&[f32]> {
        Some(s)
    }
    fn widen(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
}

impl Float for bf16 {
    const CHEAP_TO_F32: bool = true;
    fn to_f32(self) -> f32 {
        // Exact (bf16 is the top half of an f32); branch-free, so loops vectorise.
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn as_f32(_: &[Self]) -> Option<&[f32]> {
        None
    }
    fn widen(src: &[Self], dst: &mut [f32]) {
        // `half`'s slice conversion for bf16 is scalar with a NaN branch; this vectorises.
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }
}

impl Float for f16 {
    const CHEAP_TO_F32: bool = false;
    fn to_f32(self) -> f32 {
        f32::from(self)
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn as_f32(_: &[Self]) -> Option<&[f32]> {
        None
    }
    fn widen(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst)
    }
}

/// Call `$f::<T>(args)` with `T` the Rust type of the float dtype `$dtype`.
macro_rules! dispatch_float {
    ($dtype:expr, $f:ident ( $($arg:expr),* $(,)? )) => {
        match $dtype {
            DType::BF16 => $f::<bf16>($($arg),*),
            DType::F16 => $f::<f16>($($arg),*),
            DType::F32 => $f::<f32>($($arg),*),
            other => unreachable!("ops validation admits only float dtypes here, got {other}"),
        }
    };
}

mod moe;
use dispatch_float;
pub(super) use moe::{moe, MoeArgs, PrefetchArgs};

/// The elements of `t` as a shared slice. Panics on a misaligned view (only a
/// hand-made `Tensor::new` with an odd offset produces one).
///
/// # Safety
/// `t`'s dtype is `T`'s, and no mutable slice over any of its bytes is alive while the
/// returned slice is.
unsafe fn view<T>(t: &Tensor) -> &[T] {
    let p = ptr_of(t) as *const T;
    assert!(p.is_aligned(), "{t:?} is not aligned for its dtype");
    // SAFETY: the tensor's view lies inside its buffer (`Tensor::new`), is aligned
    // (checked above) and holds `numel` elements of `T` (caller); no `&mut` aliases it.
    unsafe { std::slice::from_raw_parts(p, t.numel()) }
}

/// The elements of `t` as a mutable slice.
///
/// # Safety
/// As [`view`], and no other slice over any of its bytes is alive while this one is.
#[allow(clippy::mut_from_ref)]
unsafe fn view_mut<T>(t: &Tensor) -> &mut [T] {
    let p = ptr_of(t) as *mut T;
    assert!(p.is_aligned(), "{t:?} is not aligned for its dtype");
    // SAFETY: as in `view`, and the caller guarantees exclusive access.
    unsafe { std::slice::from_raw_parts_mut(p, t.numel()) }
}

/// A raw pointer that parallel workers share to write disjoint elements.
#[derive(Clone, Copy)]
struct SyncPtr<T>(*mut T);

// SAFETY: workers only ever touch disjoint elements through it (each use says why).
unsafe impl<T> Send for SyncPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    /// The pointer (a method, so closures capture the `Sync` wrapper, not the field).
    fn get(self) -> *mut T {
        self.0
    }
}

/// `s` widened to f32 (borrowed when it already is f32).
fn to_f32<T: Float>(s: &[T]) -> Cow<'_, [f32]> {
    match T::as_f32(s) {
        Some(f) => Cow::Borrowed(f),
        None => {
            let mut out = vec![0f32; s.len()];
            T::widen(s, &mut out);
            Cow::Owned(out)
        }
    }
}

/// Minimum rows per rayon task so that tiny rows are not split into tiny tasks.
fn min_rows(row_len: usize) -> usize {
    (4096 / row_len.max(1)).max(1)
}

pub(super) fn embedding(ids: &Tensor, table: &Tensor, out: &Tensor, d: &EmbeddingDims) {
    dispatch_float!(table.dtype(), embedding_t(ids, table, out, d))
}

fn embedding_t<T: Float>(ids: &Tensor, table: &Tensor, out: &Tensor, d: &EmbeddingDims) {
    if d.hidden == 0 {
        return;
    }
    // SAFETY: dtypes validated (ids i32, table and out T); out is distinct from the inputs.
    let (ids, table, out) = unsafe { (view::<i32>(ids), view::<T>(table), view_mut::<T>(out)) };
    out.par_chunks_mut(d.hidden)
        .zip(ids.par_iter())
        .with_min_len(min_rows(d.hidden))
        .for_each(
            |(row, &id)| match usize::try_from(id as i64 - d.first as i64) {
                Ok(id) if id < d.vocab => {
                    row.copy_from_slice(&table[id * d.hidden..(id + 1) * d.hidden])
                }
                _ => row.fill(T::from_f32(0.0)),
            },
        );
}

pub(super) fn rms_norm(
    x: &Tensor,
    residual: Option<&Tensor>,
    norm: NormWeights<'_>,
    eps: f32,
    out: &Tensor,
    d: &RowDims,
) {
    norm_rows(x, residual, Some(norm), eps, out, &d.whole_rows())
}

/// A norm's weight and, for LayerNorm, its bias (`None`: RMSNorm).
pub(super) type NormWeights<'a> = (&'a Tensor, Option<&'a Tensor>);

/// The norm by `w` (RMSNorm, or LayerNorm with a bias; after the residual add, with a
/// residual) of `d`'s columns of x into the same columns of out; without `w` the
/// residual add alone (out = the sum).
pub(super) fn norm_rows(
    x: &Tensor,
    residual: Option<&Tensor>,
    w: Option<NormWeights<'_>>,
    eps: f32,
    out: &Tensor,
    d: &ColumnDims,
) {
    dispatch_float!(x.dtype(), norm_rows_t(x, residual, w, eps, out, d))
}

fn norm_rows_t<T: Float>(
    x: &Tensor,
    residual: Option<&Tensor>,
    w: Option<NormWeights<'_>>,
    eps: f32,
    out: &Tensor,
    d: &ColumnDims,
) {
    let (dim, ld, col0) = (d.dim, d.ld, d.col0);
    if dim == 0 || d.rows == 0 {
        return;
    }
    // SAFETY: dtype validated; the weight and bias are never written.
    let w = w.map(|(w, b)| unsafe { (view::<T>(w), b.map(|b| view::<T>(b))) });
    // `out` may alias `x`, so rows are reached through raw pointers: each worker reads
    // its row of `x` (and `residual`) completely before it writes the same row of `out`.
    let xp = SyncPtr(ptr_of(x) as *mut T);
    let rp = residual.map(|r| SyncPtr(ptr_of(r) as *mut T));
    let op = SyncPtr(ptr_of(out) as *mut T);
    (0..d.rows)
        .into_par_iter()
        .with_min_len(min_rows(dim))
        .for_each_init(
            || vec![0f32; dim],
            |vals, r| {
                // SAFETY: rows are disjoint between workers and lie inside the validated
                // views (`[rows, ld]` for x and out, `[rows, dim]` for the residual); this
                // row of `x` is only read while `xr` lives, and `residual` is a distinct
                // tensor.
                unsafe {
                    let xr = std::slice::from_raw_parts(xp.get().add(r * ld + col0), dim);
                    match rp {
                        Some(rp) => {
                            let rr = std::slice::from_raw_parts_mut(rp.get().add(r * dim), dim);
                            for ((v, x), res) in vals.iter_mut().zip(xr).zip(rr.iter_mut()) {
                                *res = T::from_f32(res.to_f32() + x.to_f32());
                                *v = res.to_f32();
                            }
                        }
                        None => {
                            for (v, x) in vals.iter_mut().zip(xr) {
                                *v = x.to_f32();
                            }
                        }
                    }
                }
                // SAFETY: the reads of this row above are finished; the row is disjoint
                // from every other worker's.
                let or =
                    unsafe { std::slice::from_raw_parts_mut(op.get().add(r * ld + col0), dim) };
                match w {
                    None => {
                        for (o, v) in or.iter_mut().zip(vals.iter()) {
                            *o = T::from_f32(*v);
                        }
                    }
                    Some((w, None)) => {
                        let mean_sq = vals.iter().map(|v| v * v).sum::<f32>() / dim as f32;
                        let inv = 1.0 / (mean_sq + eps).sqrt();
                        for ((o, v), w) in or.iter_mut().zip(vals.iter()).zip(w) {
                            *o = T::from_f32(v * inv * w.to_f32());
                        }
                    }
                    Some((w, Some(b))) => layer_norm_row(vals, w, b, eps, or),
                }
            },
        );
}

/// LayerNorm of one row (`vals`, widened) into `out`: the mean, then the population
/// variance about it (two passes, as PyTorch), both in f32.
fn layer_norm_row<T: Float>(vals: &[f32], w: &[T], b: &[T], eps: f32, out: &mut [T]) {
    let n = vals.len() as f32;
    let mean = vals.iter().sum::<f32>() / n;
    let var = vals.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    let inv = 1.0 / (var + eps).sqrt();
    for (((o, v), w), b) in out.iter_mut().zip(vals).zip(w).zip(b) {
        *o = T::from_f32((v - mean) * inv * w.to_f32() + b.to_f32());
    }
}

pub(super) fn act_mul(act: Activation, gu: &Tensor, out: &Tensor, d: &RowDims) {
    dispatch_float!(gu.dtype(), act_mul_t(act, gu, out, d))
}

fn act_mul_t<T: Float>(act: Activation, gu: &Tensor, out: &Tensor, d: &RowDims) {
    let inter = d.dim;
    if inter == 0 {
        return;
    }
    // SAFETY: dtypes validated; out is distinct from gate_up.
    let (gu, out) = unsafe { (view::<T>(gu), view_mut::<T>(out)) };
    out.par_chunks_mut(inter)
        .zip(gu.par_chunks(2 * inter))
        .with_min_len(min_rows(inter))
        .for_each(|(o, gu)| {
            let (gate, up) = gu.split_at(inter);
            for ((o, g), u) in o.iter_mut().zip(gate).zip(up) {
                *o = T::from_f32(act.gated(g.to_f32(), u.to_f32()));
            }
        });
}

pub(super) fn matmul(x: &Tensor, w: &Tensor, b: Option<&Tensor>, out: &Tensor, d: &MatmulDims) {
    match w.dtype() {
        DType::Q(fmt) => dispatch_float!(x.dtype(), qmatmul_t(fmt, x, w, b, out, d)),
        _ => dispatch_float!(x.dtype(), matmul_t(x, w, b, out, d)),
    }
}

/// Up to this many rows of `x`, matmul is dot products over each row of `w` widened once
/// (the op is bound by reading `w`): `gemm` pads a small `m` to its tile and measured up
/// to ~2× slower there on the 2-core build machine (k=2048, n=8192, m=2..8).
const SMALL_M: usize = 8;

/// `Σ a_i · b_i` in f32 with 8 independent partial sums (so the loop vectorises), `b`
/// widened on the fly.
fn dot<T: Float>(a: &[f32], b: &[T]) -> f32 {
    let mut lanes = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(a, b)| a * b.to_f32())
        .sum();
    for (a, b) in a8.zip(b8) {
        for l in 0..8 {
            lanes[l] += a[l] * b[l].to_f32();
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// `out = x · wᵀ (+ bias)` through `gemm`'s f32 kernel (or [`dot`] for a few rows), in column blocks of `out` (rows
/// of `w`) spread over rayon: each block widens its rows of `w` to f32, so temporaries
/// stay small even for a large vocabulary projection.
fn matmul_t<T: Float>(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, out: &Tensor, d: &MatmulDims) {
    let MatmulDims { m, n, k } = *d;
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: dtypes validated; inputs are only read, out is written below through a raw
    // pointer, and does not overlap them.
    let (x, w, bias) = unsafe { (view::<T>(x), view::<T>(w), bias.map(|b| view::<T>(b))) };
    let xf = to_f32(x);
    let out_f32 = out.dtype() == DType::F32;
    let op = SyncPtr(ptr_of(out));
    let block = n
        .div_ceil(2 * rayon::current_num_threads())
        .clamp(16, 256)
        .min(n);
    (0..n.div_ceil(block)).into_par_iter().for_each(|bi| {
        let j0 = bi * block;
        let nb = block.min(n - j0);
        let wblock = &w[j0 * k..(j0 + nb) * k];
        let mut acc = vec![0f32; m * nb];
        if k == 0 {
            // An empty product: only the bias remains.
        } else if m <= SMALL_M {
            // One row: widen in registers. More: widen each row of `w` once, reuse it.
            let fused = m == 1 && T::CHEAP_TO_F32;
            let mut buf = vec![0f32; if fused { 0 } else { k }];
            for (j, wrow) in wblock.chunks_exact(k).enumerate() {
                if fused {
                    acc[j] = dot(&xf, wrow);
                    continue;
                }
                let wf = match T::as_f32(wrow) {
                    Some(wf) => wf,
                    None => {
                        T::widen(wrow, &mut buf);
                        &buf
                    }
                };
                for i in 0..m {
                    acc[i * nb + j] = dot(&xf[i * k..(i + 1) * k], wf);
                }
            }
        } else {
            let wf = to_f32(wblock);
            // rhs element (kk, j) is `wf[j * k + kk]`: the rows of `w` are its columns.
            gemm_f32(m, nb, k, &mut acc, &xf, &wf, (1, k), false);
        }
        store_columns(&acc, bias, &op, out_f32, (m, n), j0, nb);
    });
}

/// Write columns `j0..j0 + nb` of `out` (`m x n`, f32 or T) from `acc` (`m x nb`), each
/// plus its bias, rounded once.
fn store_columns<T: Float>(
    acc: &[f32],
    bias: Option<&[T]>,
    op: &SyncPtr<u8>,
    out_f32: bool,
    (m, n): (usize, usize),
    j0: usize,
    nb: usize,
) {
    for i in 0..m {
        for j in 0..nb {
            let v = acc[i * nb + j] + bias.map_or(0.0, |b| b[j0 + j].to_f32());
            let at = i * n + j0 + j;
            // SAFETY: `at < m * n` and column j0 + j belongs to the caller's block alone;
            // the element type is f32 or T as validated.
            unsafe {
                if out_f32 {
                    *(op.get() as *mut f32).add(at) = v;
                } else {
                    *(op.get() as *mut T).add(at) = T::from_f32(v);
                }
            }
        }
    }
}

/// [`matmul_t`] with a quantized `w` (`crate::quant`'s device layout): each block of rows
/// is decoded to f32 once ([`quant::dequantize_row`], the reference decode) and then
/// multiplied as a dense block, so the result is exactly the dense matmul of the decoded
/// weights (up to f32 summation order).
fn qmatmul_t<T: Float>(
    fmt: QuantFormat,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
    d: &MatmulDims,
) {
    let MatmulDims { m, n, k } = *d;
    if m == 0 || n == 0 {
        return;
    }
    let rb = fmt
        .row_bytes(k)
        .expect("a quantized w has whole blocks (Tensor::new)");
    // SAFETY: dtypes validated; x and bias are only read. The weight bytes are read
    // through a byte view of exactly `n * rb` bytes (its size_bytes).
    let (x, bias) = unsafe { (view::<T>(x), bias.map(|b| view::<T>(b))) };
    // SAFETY: w's view lies inside its buffer (Tensor::new) and spans size_bytes() bytes.
    let wb = unsafe { std::slice::from_raw_parts(ptr_of(w) as *const u8, w.size_bytes()) };
    let xf = to_f32(x);
    let out_f32 = out.dtype() == DType::F32;
    let op = SyncPtr(ptr_of(out));
    let block = n
        .div_ceil(2 * rayon::current_num_threads())
        .clamp(16, 256)
        .min(n);
    (0..n.div_ceil(block)).into_par_iter().for_each(|bi| {
        let j0 = bi * block;
        let nb = block.min(n - j0);
        let mut wf = vec![0f32; nb * k];
        for (j, row) in wf.chunks_exact_mut(k).enumerate() {
            quant::dequantize_row(fmt, &wb[(j0 + j) * rb..(j0 + j + 1) * rb], row);
        }
        let mut acc = vec![0f32; m * nb];
        if m <= SMALL_M {
            for (j, wrow) in wf.chunks_exact(k).enumerate() {
                for i in 0..m {
                    acc[i * nb + j] = dot(&xf[i * k..(i + 1) * k], wrow);
                }
            }
        } else {
            gemm_f32(m, nb, k, &mut acc, &xf, &wf, (1, k), false);
        }
        store_columns(&acc, bias, &op, out_f32, (m, n), j0, nb);
    });
}

/// `dst = lhs · rhs`, or `dst += lhs · rhs` with `accumulate`, in f32 on this thread:
/// `dst` is m×n and `lhs` m×k, both row-major and contiguous; element (kk, j) of the k×n
/// `rhs` is `rhs[kk * rhs_strides.0 + j * rhs_strides.1]`. Panics when a slice is too short
/// for its shape (every caller sizes them from the same dims).
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_f32(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    lhs: &[f32],
    rhs: &[f32],
    rhs_strides: (usize, usize),
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            dst[..m * n].fill(0.0);
        }
        return;
    }
    let (rs, cs) = rhs_strides;
    assert!(
        dst.len() >= m * n && lhs.len() >= m * k && rhs.len() > (k - 1) * rs + (n - 1) * cs,
        "gemm_f32: {m}x{n}x{k} does not fit dst {}, lhs {}, rhs {}",
        dst.len(),
        lhs.len(),
        rhs.len()
    );
    // SAFETY: the assert above bounds every index gemm touches: dst (i, j) at i * n + j,
    // lhs (i, kk) at i * k + kk, rhs (kk, j) at kk * rs + j * cs. With `read_dst`, alpha = 1
    // keeps dst (dst = dst + lhs·rhs); without it, dst = lhs·rhs.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.as_ptr(),
            1,
            k as isize,
            rhs.as_ptr(),
            cs as isize,
            rs as isize,
            if accumulate { 1.0f32 } else { 0.0f32 },
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

pub(super) fn scale(x: &Tensor, s: f32) {
    dispatch_float!(x.dtype(), scale_t(x, s))
}

fn scale_t<T: Float>(x: &Tensor, s: f32) {
    // SAFETY: the dtype was validated.
    let x = unsafe { view_mut::<T>(x) };
    x.par_iter_mut()
        .for_each(|v| *v = T::from_f32(v.to_f32() * s));
}

pub(super) fn softcap(x: &Tensor, cap: f32) {
    dispatch_float!(x.dtype(), softcap_t(x, cap))
}

fn softcap_t<T: Float>(x: &Tensor, cap: f32) {
    // SAFETY: the dtype was validated.
    let x = unsafe { view_mut::<T>(x) };
    x.par_iter_mut()
        .for_each(|v| *v = T::from_f32(cap * (v.to_f32() / cap).tanh()));
}

pub(super) fn sigmoid_gate_add(x: &Tensor, gate: &Tensor, y: &Tensor, d: &RowDims) {
    dispatch_float!(x.dtype(), sigmoid_gate_add_t(x, gate, y, d))
}

fn sigmoid_gate_add_t<T: Float>(x: &Tensor, gate: &Tensor, y: &Tensor, d: &RowDims) {
    if d.rows == 0 || d.dim == 0 {
        return;
    }
    // SAFETY: dtypes and shapes validated; x is the only output and distinct from the
    // inputs, each row written by its task alone.
    let (x, gate, y) = unsafe { (view_mut::<T>(x), view::<T>(gate), view::<T>(y)) };
    x.par_chunks_mut(d.dim)
        .zip(y.par_chunks(d.dim))
        .zip(gate.par_iter())
        .for_each(|((x, y), g)| {
            let g = g.to_f32();
            let s = round_to::<T>(1.0 / (1.0 + (-g).exp()));
            for (x, y) in x.iter_mut().zip(y) {
                *x = T::from_f32(x.to_f32() + round_to::<T>(s * y.to_f32()));
            }
        });
}

/// `v` rounded to T and back (the value an op that stores T would pass on).
fn round_to<T: Float>(v: f32) -> f32 {
    T::from_f32(v).to_f32()
}
