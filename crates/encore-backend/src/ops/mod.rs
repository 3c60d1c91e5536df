//! What both backends share about the ops: argument validation (so a bad call fails the
//! same way everywhere, naming the tensor), the rotary table, and the sampling RNG.

use crate::args::{Attention, KvScale, LogitBias, Norm, QkvRope, Sampling, MAX_TOP_LOGPROBS};
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

pub(crate) mod gather;
mod moe;
mod rope;
pub use gather::{check_fill_rows, check_gather_columns, gather_columns_ref, GatherDims};
pub use moe::{check_moe, check_sigmoid_gate_add, CacheDims, MoeDims, PrefetchDims};
pub use rope::{
    Llama3Scaling, LongRopeScaling, RopeConfig, RopeScaling, YarnScaling, LONGROPE_MAX_FREQS,
};

pub const FLOAT_DTYPES: &[DType] = &[DType::BF16, DType::F16, DType::F32];

pub fn check_len(
    op: &'static str,
    name: &'static str,
    found: usize,
    expected: usize,
) -> Result<()> {
    if found != expected {
        return Err(Error::Shape {
            op,
            name,
            found: vec![found],
            expected: format!("{expected} elements"),
        });
    }
    Ok(())
}

pub fn check_dtype(
    op: &'static str,
    name: &'static str,
    t: &Tensor,
    allowed: &[DType],
) -> Result<()> {
    if !allowed.contains(&t.dtype()) {
        let expected = allowed
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(" or ");
        return Err(Error::DType {
            op,
            name,
            found: t.dtype(),
            expected,
        });
    }
    Ok(())
}

fn same_dtype(op: &'static str, name: &'static str, t: &Tensor, dtype: DType) -> Result<()> {
    check_dtype(op, name, t, &[dtype])
}

/// `t` must have exactly `shape`; `desc` is how the expected shape reads in the error.
pub fn check_shape(
    op: &'static str,
    name: &'static str,
    t: &Tensor,
    shape: &[usize],
    desc: &str,
) -> Result<()> {
    if t.shape() != shape {
        return Err(Error::Shape {
            op,
            name,
            found: t.shape().to_vec(),
            expected: format!("{shape:?} ({desc})"),
        });
    }
    Ok(())
}

fn check_rank(
    op: &'static str,
    name: &'static str,
    t: &Tensor,
    rank: usize,
    desc: &str,
) -> Result<()> {
    if t.rank() != rank {
        return Err(Error::Shape {
            op,
            name,
            found: t.shape().to_vec(),
            expected: desc.to_string(),
        });
    }
    Ok(())
}

pub struct EmbeddingDims {
    pub n: usize,
    pub vocab: usize,
    pub hidden: usize,
    /// The id of the table's first row (a vocabulary shard's offset).
    pub first: usize,
}

pub fn check_embedding(
    ids: &Tensor,
    table: &Tensor,
    first: usize,
    out: &Tensor,
) -> Result<EmbeddingDims> {
    const OP: &str = "embedding";
    check_dtype(OP, "ids", ids, &[DType::I32])?;
    check_rank(OP, "ids", ids, 1, "[n]")?;
    check_dtype(OP, "table", table, FLOAT_DTYPES)?;
    check_rank(OP, "table", table, 2, "[vocab, hidden]")?;
    same_dtype(OP, "out", out, table.dtype())?;
    let (n, vocab, hidden) = (ids.dim(0), table.dim(0), table.dim(1));
    check_shape(OP, "out", out, &[n, hidden], "[n, hidden]")?;
    if first > i32::MAX as usize {
        return Err(Error::invalid(OP, format!("first row {first} exceeds i32")));
    }
    Ok(EmbeddingDims {
        n,
        vocab,
        hidden,
        first,
    })
}

pub struct RowDims {
    pub rows: usize,
    pub dim: usize,
}

impl RowDims {
    /// The same rows as [`ColumnDims`]: every column of rows `dim` apart.
    pub fn whole_rows(&self) -> ColumnDims {
        ColumnDims {
            rows: self.rows,
            dim: self.dim,
            ld: self.dim,
            col0: 0,
        }
    }
}

/// `rows` rows of `dim` values from column `col0` of rows `ld` apart.
pub struct ColumnDims {
    pub rows: usize,
    pub dim: usize,
    pub ld: usize,
    pub col0: usize,
}

/// `residual_add`: x, residual and out T `[.., d]`, one shape.
pub fn check_residual_add(x: &Tensor, residual: &Tensor, out: &Tensor) -> Result<RowDims> {
    const OP: &str = "residual_add";
    check_dtype(OP, "x", x, FLOAT_DTYPES)?;
    if x.rank() == 0 {
        return Err(Error::invalid(OP, "x must have at least one dimension"));
    }
    for (name, t) in [("residual", residual), ("out", out)] {
        same_dtype(OP, name, t, x.dtype())?;
        check_shape(OP, name, t, x.shape(), "same as x")?;
    }
    Ok(RowDims {
        rows: x.rows(),
        dim: x.dim(-1),
    })
}

/// `rms_norm_columns`: x T `[.., ld]`, weight T `[d]` with `col0 + d <= ld`.
pub fn check_rms_norm_columns(
    x: &Tensor,
    col0: usize,
    weight: &Tensor,
    eps: f32,
) -> Result<ColumnDims> {
    const OP: &str = "rms_norm_columns";
    check_dtype(OP, "x", x, FLOAT_DTYPES)?;
    if x.rank() == 0 {
        return Err(Error::invalid(OP, "x must have at least one dimension"));
    }
    same_dtype(OP, "weight", weight, x.dtype())?;
    if weight.rank() != 1 {
        return Err(Error::invalid(OP, "weight must be [d]"));
    }
    let (ld, dim) = (x.dim(-1), weight.dim(0));
    if col0.checked_add(dim).is_none_or(|end| end > ld) {
        return Err(Error::invalid(
            OP,
            format!("columns {col0}..{col0} + {dim} exceed the row of {ld}"),
        ));
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::invalid(
            OP,
            format!("eps must be finite and >= 0, got {eps}"),
        ));
    }
    Ok(ColumnDims {
        rows: x.rows(),
        dim,
        ld,
        col0,
    })
}

/// `rms_norm` of either [`Norm`] kind: x, residual, out T `[.., d]`, weight (and
/// LayerNorm's bias) T `[d]`.
pub fn check_rms_norm(
    x: &Tensor,
    residual: Option<&Tensor>,
    norm: Norm<'_>,
    eps: f32,
    out: &Tensor,
) -> Result<RowDims> {
    const OP: &str = "rms_norm";
    check_dtype(OP, "x", x, FLOAT_DTYPES)?;
    if x.rank() == 0 {
        return Err(Error::invalid(OP, "x must have at least one dimension"));
    }
    let dim = x.dim(-1);
    let bias = norm.bias().map(|b| ("bias", b));
    for (name, t) in [("weight", norm.weight())].into_iter().chain(bias) {
        same_dtype(OP, name, t, x.dtype())?;
        check_shape(OP, name, t, &[dim], "[d]")?;
    }
    same_dtype(OP, "out", out, x.dtype())?;
    check_shape(OP, "out", out, x.shape(), "same as x")?;
    if let Some(r) = residual {
        same_dtype(OP, "residual", r, x.dtype())?;
        check_shape(OP, "residual", r, x.shape(), "same as x")?;
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::invalid(
            OP,
            format!("eps must be finite and >= 0, got {eps}"),
        ));
    }
    Ok(RowDims {
        rows: x.rows(),
        dim,
    })
}

/// The rotary table f32 `[max_positions, rot]`, rot even and at most `head_dim`:
/// returns `(rot, max_positions)`.
fn check_cos_sin(op: &'static str, cos_sin: &Tensor, head_dim: usize) -> Result<(usize, usize)> {
    check_dtype(op, "cos_sin", cos_sin, &[DType::F32])?;
    check_rank(op, "cos_sin", cos_sin, 2, "[max_positions, rot]")?;
    let rot = cos_sin.dim(1);
    if rot == 0 || !rot.is_multiple_of(2) || rot > head_dim {
        return Err(Error::Shape {
            op,
            name: "cos_sin",
            found: cos_sin.shape().to_vec(),
            expected: format!("[max_positions, rot] with rot even and <= head_dim {head_dim}"),
        });
    }
    Ok((rot, cos_sin.dim(0)))
}

pub fn check_silu_mul(gate_up: &Tensor, out: &Tensor) -> Result<RowDims> {
    const OP: &str = "silu_mul";
    check_dtype(OP, "gate_up", gate_up, FLOAT_DTYPES)?;
    check_rank(OP, "gate_up", gate_up, 2, "[n, 2*inter]")?;
    if !gate_up.dim(1).is_multiple_of(2) {
        return Err(Error::Shape {
            op: OP,
            name: "gate_up",
            found: gate_up.shape().to_vec(),
            expected: "[n, 2*inter] (even last dimension)".into(),
        });
    }
    same_dtype(OP, "out", out, gate_up.dtype())?;
    let (n, inter) = (gate_up.dim(0), gate_up.dim(1) / 2);
    check_shape(OP, "out", out, &[n, inter], "[n, inter]")?;
    Ok(RowDims {
        rows: n,
        dim: inter,
    })
}

pub struct MatmulDims {
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

pub fn check_matmul(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
) -> Result<MatmulDims> {
    const OP: &str = "matmul";
    check_dtype(OP, "x", x, FLOAT_DTYPES)?;
    check_rank(OP, "x", x, 2, "[m, k]")?;
    // w is in x's dtype, or quantized (the kernels decode it; see `crate::quant`).
    if !w.dtype().is_quantized() {
        same_dtype(OP, "w", w, x.dtype())?;
    }
    check_rank(OP, "w", w, 2, "[n, k]")?;
    let (m, k, n) = (x.dim(0), x.dim(1), w.dim(0));
    if w.dim(1) != k {
        return Err(Error::Shape {
            op: OP,
            name: "w",
            found: w.shape().to_vec(),
            expected: format!("[n, {k}] (k of x)"),
        });
    }
    if let Some(b) = bias {
        same_dtype(OP, "bias", b, x.dtype())?;
        check_shape(OP, "bias", b, &[n], "[n]")?;
        // cuBLASLt's bias epilogue has no algorithm for bf16/f16 in, f32 out.
        same_dtype(OP, "out (with bias)", out, x.dtype())?;
    }
    check_dtype(OP, "out", out, &[x.dtype(), DType::F32])?;
    check_shape(OP, "out", out, &[m, n], "[m, n]")?;
    Ok(MatmulDims { m, n, k })
}

pub struct QkvRopeDims {
    pub n: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rot: usize,
    pub max_positions: usize,
    pub num_blocks: usize,
    pub block_size: usize,
}

pub fn check_qkv_rope(a: &QkvRope<'_>) -> Result<QkvRopeDims> {
    const OP: &str = "qkv_rope_write";
    let q = a.q_out;
    check_dtype(OP, "q_out", q, FLOAT_DTYPES)?;
    check_rank(OP, "q_out", q, 3, "[n, num_heads, head_dim]")?;
    let (n, nh, hd) = (q.dim(0), q.dim(1), q.dim(2));
    let dt = q.dtype();
    check_kv_cache(OP, a.k_cache, a.v_cache, dt, a.kv_scale)?;
    check_rank(
        OP,
        "k_cache",
        a.k_cache,
        4,
        "[num_blocks, block_size, num_kv_heads, head_dim]",
    )?;
    let kvh = a.k_cache.dim(2);
    if a.k_cache.dim(3) != hd {
        return Err(Error::Shape {
            op: OP,
            name: "k_cache",
            found: a.k_cache.shape().to_vec(),
            expected: format!("[num_blocks, block_size, num_kv_heads, {hd}]"),
        });
    }
    check_shape(
        OP,
        "v_cache",
        a.v_cache,
        a.k_cache.shape(),
        "same as k_cache",
    )?;
    same_dtype(OP, "qkv", a.qkv, dt)?;
    check_shape(
        OP,
        "qkv",
        a.qkv,
        &[n, (nh + 2 * kvh) * hd],
        "[n, (num_heads + 2 * num_kv_heads) * head_dim]",
    )?;
    if let Some((qn, kn)) = a.head_norm {
        same_dtype(OP, "q_norm", qn, dt)?;
        check_shape(OP, "q_norm", qn, &[hd], "[head_dim]")?;
        same_dtype(OP, "k_norm", kn, dt)?;
        check_shape(OP, "k_norm", kn, &[hd], "[head_dim]")?;
    }
    check_dtype(OP, "positions", a.positions, &[DType::I32])?;
    check_shape(OP, "positions", a.positions, &[n], "[n]")?;
    check_dtype(OP, "slot_mapping", a.slot_mapping, &[DType::I32])?;
    check_shape(OP, "slot_mapping", a.slot_mapping, &[n], "[n]")?;
    let (rot, max_positions) = check_cos_sin(OP, a.cos_sin, hd)?;
    Ok(QkvRopeDims {
        n,
        num_heads: nh,
        num_kv_heads: kvh,
        head_dim: hd,
        rot,
        max_positions,
        num_blocks: a.k_cache.dim(0),
        block_size: a.k_cache.dim(1),
    })
}

/// A KV cache pair: both of the activations' dtype `dt`, or both FP8 with valid scales.
fn check_kv_cache(
    op: &'static str,
    k: &Tensor,
    v: &Tensor,
    dt: DType,
    scale: KvScale,
) -> Result<()> {
    let kdt = if k.dtype() == DType::F8E4M3 {
        DType::F8E4M3
    } else {
        dt
    };
    same_dtype(op, "k_cache", k, kdt)?;
    same_dtype(op, "v_cache", v, kdt)?;
    if kdt == DType::F8E4M3 && !scale.is_valid() {
        return Err(Error::invalid(
            op,
            format!("kv_scale {scale:?}: the FP8 cache's scales must be finite and positive"),
        ));
    }
    Ok(())
}

pub struct AttentionDims {
    pub rows: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_seqs: usize,
    pub table_width: usize,
}

pub fn check_attention(a: &Attention<'_>) -> Result<AttentionDims> {
    const OP: &str = "attention";
    check_dtype(OP, "q", a.q, FLOAT_DTYPES)?;
    check_rank(OP, "q", a.q, 3, "[rows, num_heads, head_dim]")?;
    let (rows, nh, hd) = (a.q.dim(0), a.q.dim(1), a.q.dim(2));
    check_kv_cache(OP, a.k_cache, a.v_cache, a.q.dtype(), a.kv_scale)?;
    check_rank(
        OP,
        "k_cache",
        a.k_cache,
        4,
        "[num_blocks, block_size, num_kv_heads, head_dim]",
    )?;
    let (nb, bs, kvh) = (a.k_cache.dim(0), a.k_cache.dim(1), a.k_cache.dim(2));
    if a.k_cache.dim(3) != hd || kvh == 0 || nh % kvh != 0 || bs == 0 {
        return Err(Error::Shape {
            op: OP,
            name: "k_cache",
            found: a.k_cache.shape().to_vec(),
            expected: format!("[num_blocks, block_size > 0, num_kv_heads dividing {nh}, {hd}]"),
        });
    }
    check_shape(
        OP,
        "v_cache",
        a.v_cache,
        a.k_cache.shape(),
        "same as k_cache",
    )?;
    check_dtype(OP, "block_tables", a.block_tables, &[DType::I32])?;
    check_rank(
        OP,
        "block_tables",
        a.block_tables,
        2,
        "[num_seqs, table_width]",
    )?;
    let (num_seqs, width) = (a.block_tables.dim(0), a.block_tables.dim(1));
    check_dtype(OP, "seq_lens", a.seq_lens, &[DType::I32])?;
    check_shape(OP, "seq_lens", a.seq_lens, &[num_seqs], "[num_seqs]")?;
    match a.cu_seqlens_q {
        None => {
            if rows != num_seqs {
                return Err(Error::Shape {
                    op: OP,
                    name: "q",
                    found: a.q.shape().to_vec(),
                    expected: format!("[{num_seqs}, {nh}, {hd}] (decode: one row per sequence)"),
                });
            }
        }
        Some(cu) => {
            check_dtype(OP, "cu_seqlens_q", cu, &[DType::I32])?;
            check_shape(OP, "cu_seqlens_q", cu, &[num_seqs + 1], "[num_seqs + 1]")?;
        }
    }
    same_dtype(OP, "out", a.out, a.q.dtype())?;
    check_shape(OP, "out", a.out, a.q.shape(), "same as q")?;
    check_dtype(OP, "scratch", a.scratch, &[DType::F32])?;
    if !a.scale.is_finite() {
        return Err(Error::invalid(
            OP,
            format!("scale must be finite, got {}", a.scale),
        ));
    }
    if let Some(c) = a.softcap.filter(|c| !(c.is_finite() && *c > 0.0)) {
        return Err(Error::invalid(
            OP,
            format!("softcap must be finite and > 0 (None for none), got {c}"),
        ));
    }
    if a.window == Some(0) {
        return Err(Error::invalid(
            OP,
            "window must be >= 1 positions (None for full attention)",
        ));
    }
    if let Some(s) = a.sinks {
        same_dtype(OP, "sinks", s, a.q.dtype())?;
        check_shape(OP, "sinks", s, &[nh], "[num_heads]")?;
    }
    Ok(AttentionDims {
        rows,
        num_heads: nh,
        num_kv_heads: kvh,
        head_dim: hd,
        num_blocks: nb,
        block_size: bs,
        num_seqs,
        table_width: width,
    })
}

pub fn check_scratch(scratch: &Tensor, needed: usize) -> Result<()> {
    if scratch.numel() < needed {
        return Err(Error::Shape {
            op: "attention",
            name: "scratch",
            found: scratch.shape().to_vec(),
            expected: format!("at least {needed} f32 elements (Backend::attention_scratch_len)"),
        });
    }
    Ok(())
}

pub struct SampleDims {
    pub batch: usize,
    pub vocab: usize,
    /// Penalty slots (rows of `counts`); 0 without penalties.
    pub slots: usize,
    /// Top log-probability entries per row (`N`); 0 without log-probabilities.
    pub top_n: usize,
    /// Words per row of the allowed-token mask (`W`); 0 without one.
    pub mask_words: usize,
}

fn check_logits(op: &'static str, logits: &Tensor, out: &Tensor) -> Result<SampleDims> {
    check_dtype(op, "logits", logits, &[DType::F32])?;
    check_rank(op, "logits", logits, 2, "[batch, vocab]")?;
    let (batch, vocab) = (logits.dim(0), logits.dim(1));
    if vocab == 0 {
        return Err(Error::invalid(op, "vocab must be > 0"));
    }
    check_dtype(op, "out", out, &[DType::I32])?;
    check_shape(op, "out", out, &[batch], "[batch]")?;
    Ok(SampleDims {
        batch,
        vocab,
        slots: 0,
        top_n: 0,
        mask_words: 0,
    })
}

pub fn check_sample(logits: &Tensor, p: &Sampling<'_>, out: &Tensor) -> Result<SampleDims> {
    const OP: &str = "sample";
    let mut d = check_logits(OP, logits, out)?;
    let b = [d.batch];
    let per_row = |name: &'static str, t: &Tensor, dtype: DType| -> Result<()> {
        check_dtype(OP, name, t, &[dtype])?;
        check_shape(OP, name, t, &b, "[batch]")
    };
    per_row("temperature", p.temperature, DType::F32)?;
    per_row("top_k", p.top_k, DType::I32)?;
    per_row("top_p", p.top_p, DType::F32)?;
    per_row("min_p", p.min_p, DType::F32)?;
    per_row("seeds", p.seeds, DType::I64)?;
    if let Some(pen) = &p.penalties {
        check_dtype(OP, "counts", pen.counts, &[DType::I32])?;
        check_rank(OP, "counts", pen.counts, 2, "[slots, vocab]")?;
        if pen.counts.dim(1) != d.vocab {
            return Err(Error::Shape {
                op: OP,
                name: "counts",
                found: pen.counts.shape().to_vec(),
                expected: format!("[slots, {}] (the logits' vocab)", d.vocab),
            });
        }
        d.slots = pen.counts.dim(0);
        per_row("slot", pen.slot, DType::I32)?;
        per_row("repetition", pen.repetition, DType::F32)?;
        per_row("frequency", pen.frequency, DType::F32)?;
        per_row("presence", pen.presence, DType::F32)?;
    }
    if let Some(l) = &p.logprobs {
        per_row("num_logprobs", l.num, DType::I32)?;
        per_row("token_logprob", l.token, DType::F32)?;
        if let Some(t) = l.target {
            per_row("logprob_target", t, DType::I32)?;
        }
        check_dtype(OP, "top_ids", l.top_ids, &[DType::I32])?;
        check_rank(OP, "top_ids", l.top_ids, 2, "[batch, N]")?;
        let n = l.top_ids.dim(1);
        let shape = [d.batch, n];
        if l.top_ids.dim(0) != d.batch || n > MAX_TOP_LOGPROBS {
            return Err(Error::Shape {
                op: OP,
                name: "top_ids",
                found: l.top_ids.shape().to_vec(),
                expected: format!("[batch, N] with N <= {}", MAX_TOP_LOGPROBS),
            });
        }
        check_dtype(OP, "top_logprobs", l.top, &[DType::F32])?;
        check_shape(OP, "top_logprobs", l.top, &shape, "[batch, N] like top_ids")?;
        d.top_n = n;
    }
    if let Some(m) = &p.mask {
        check_dtype(OP, "mask_bits", m.bits, &[DType::I32])?;
        check_rank(OP, "mask_bits", m.bits, 2, "[batch, W]")?;
        let words = d.vocab.div_ceil(32);
        if m.bits.dim(0) != d.batch || m.bits.dim(1) < words {
            return Err(Error::Shape {
                op: OP,
                name: "mask_bits",
                found: m.bits.shape().to_vec(),
                expected: format!("[batch, W] with W >= {words} (vocab / 32, rounded up)"),
            });
        }
        d.mask_words = m.bits.dim(1);
        per_row("mask_on", m.on, DType::I32)?;
    }
    Ok(d)
}

/// Checks [`crate::backend::Backend::logit_bias`]'s arguments; `(batch, vocab, K)`.
pub fn check_logit_bias(logits: &Tensor, b: &LogitBias<'_>) -> Result<(usize, usize, usize)> {
    const OP: &str = "logit_bias";
    check_dtype(OP, "logits", logits, &[DType::F32])?;
    check_rank(OP, "logits", logits, 2, "[batch, vocab]")?;
    let (batch, vocab) = (logits.dim(0), logits.dim(1));
    check_dtype(OP, "ids", b.ids, &[DType::I32])?;
    check_rank(OP, "ids", b.ids, 2, "[batch, K]")?;
    let k = b.ids.dim(1);
    check_shape(OP, "ids", b.ids, &[batch, k], "[batch, K]")?;
    check_dtype(OP, "vals", b.vals, &[DType::F32])?;
    check_shape(OP, "vals", b.vals, &[batch, k], "[batch, K] like ids")?;
    check_dtype(OP, "count", b.count, &[DType::I32])?;
    check_shape(OP, "count", b.count, &[batch], "[batch]")?;
    Ok((batch, vocab, k))
}

/// The reference [`crate::backend::Backend::logit_bias`] on host slices.
pub fn logit_bias_ref(logits: &mut [f32], vocab: usize, ids: &[i32], vals: &[f32], count: &[i32]) {
    let k = ids.len() / count.len().max(1);
    for (r, &n) in count.iter().enumerate() {
        for j in 0..(n.max(0) as usize).min(k) {
            let id = ids[r * k + j];
            if id >= 0 && (id as usize) < vocab {
                logits[r * vocab + id as usize] += vals[r * k + j];
            }
        }
    }
}

/// Checks [`crate::backend::Backend::penalty_count`]'s arguments; `(slots, vocab, n)`.
pub fn check_penalty_count(
    counts: &Tensor,
    slots: &Tensor,
    tokens: &Tensor,
) -> Result<(usize, usize, usize)> {
    const OP: &str = "penalty_count";
    check_dtype(OP, "counts", counts, &[DType::I32])?;
    check_rank(OP, "counts", counts, 2, "[slots, vocab]")?;
    check_dtype(OP, "slots", slots, &[DType::I32])?;
    check_rank(OP, "slots", slots, 1, "[n]")?;
    let n = slots.dim(0);
    check_dtype(OP, "tokens", tokens, &[DType::I32])?;
    check_shape(OP, "tokens", tokens, &[n], "[n] like slots")?;
    Ok((counts.dim(0), counts.dim(1), n))
}

/// The reference [`crate::backend::Backend::penalty_count`] on host slices: one after the
/// other, `counts[slots[i] * vocab + tokens[i]] += 1` (wrapping) where both are in range.
pub fn penalty_count_ref(counts: &mut [i32], vocab: usize, slots: &[i32], tokens: &[i32]) {
    let rows = counts.len() / vocab.max(1);
    for (&s, &t) in slots.iter().zip(tokens) {
        if s >= 0 && (s as usize) < rows && t >= 0 && (t as usize) < vocab {
            let c = &mut counts[s as usize * vocab + t as usize];
            *c = c.wrapping_add(1);
        }
    }
}

pub fn check_copy(src: &Tensor, dst: &Tensor) -> Result<()> {
    if src.size_bytes() != dst.size_bytes() {
        return Err(Error::Shape {
            op: "copy",
            name: "dst",
            found: dst.shape().to_vec(),
            expected: format!("{} bytes like src {:?}", src.size_bytes(), src.shape()),
        });
    }
    Ok(())
}

/// `all_reduce`: a float tensor. Returns its element count.
pub fn check_all_reduce(x: &Tensor) -> Result<usize> {
    check_dtype("all_reduce", "x", x, FLOAT_DTYPES)?;
    Ok(x.numel())
}

/// `all_gather` over `size` ranks: dst `[size, ..src]` of src's dtype.
pub fn check_all_gather(src: &Tensor, dst: &Tensor, size: usize) -> Result<()> {
    const OP: &str = "all_gather";
    check_dtype(OP, "src", src, FLOAT_DTYPES)?;
    same_dtype(OP, "dst", dst, src.dtype())?;
    let expected: Vec<usize> = std::iter::once(size)
        .chain(src.shape().iter().copied())
        .collect();
    check_shape(OP, "dst", dst, &expected, "[ranks, ..src]")
}

/// `scale`: x in a float type.
pub fn check_scale(x: &Tensor) -> Result<()> {
    check_dtype("scale", "x", x, &[DType::F32, DType::BF16, DType::F16])
}

/// `softcap`: x in a float type, the cap finite and > 0.
pub fn check_softcap(x: &Tensor, cap: f32) -> Result<()> {
    check_dtype("softcap", "x", x, &[DType::F32, DType::BF16, DType::F16])?;
    if !(cap.is_finite() && cap > 0.0) {
        return Err(Error::invalid(
            "softcap",
            format!("cap must be finite and > 0, got {cap}"),
        ));
    }
    Ok(())
}

/// `unshard_columns`: src T `[s, rows, c]`, dst T `[rows, n]` with `n = s * c`, or fewer
/// by less than a shard (the padding of a vocabulary, dropped), T a float or i32 element
/// type. Returns `(s, rows, c)`.
pub fn check_unshard_columns(src: &Tensor, dst: &Tensor) -> Result<(usize, usize, usize)> {
    const OP: &str = "unshard_columns";
    let elems = [DType::F32, DType::BF16, DType::F16, DType::I32];
    check_dtype(OP, "src", src, &elems)?;
    check_rank(OP, "src", src, 3, "[shards, rows, cols]")?;
    same_dtype(OP, "dst", dst, src.dtype())?;
    let (s, rows, c) = (src.dim(0), src.dim(1), src.dim(2));
    // dst may drop the last columns (a padded vocabulary), never a whole shard.
    let n = if dst.rank() == 2 { dst.dim(1) } else { 0 };
    if !(n <= s * c && n + c > s * c) {
        check_shape(OP, "dst", dst, &[rows, s * c], "[rows, shards * cols]")?;
    }
    check_shape(
        OP,
        "dst",
        dst,
        &[rows, n],
        "[rows, n], (shards - 1) * cols < n <= shards * cols",
    )?;
    Ok((s, rows, c))
}

/// The splitmix64 increment (2^64 / golden ratio).
pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The splitmix64 output function: a bijective 64-bit mix.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One splitmix64 step from state `x`.
pub fn splitmix64(x: u64) -> u64 {
    mix64(x.wrapping_add(GOLDEN))
}

/// The uniform draw in `[0, 1)` used by [`crate::backend::Backend::sample`]: splitmix64 of
/// the seed, top 24 bits. The CUDA kernel computes exactly the same value.
pub fn uniform_from_seed(seed: i64) -> f32 {
    (splitmix64(seed as u64) >> 40) as f32 * (1.0 / 16_777_216.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_bias_needs_out_dtype_of_x() {
        use crate::backend::Backend;
        let cpu: &dyn Backend = &crate::backend::cpu::CpuBackend::new();
        let x = cpu.alloc(DType::BF16, &[2, 4]).unwrap();
        let w = cpu.alloc(DType::BF16, &[3, 4]).unwrap();
        let b = cpu.alloc(DType::BF16, &[3]).unwrap();
        let out = cpu.alloc(DType::F32, &[2, 3]).unwrap();
        let e = cpu.matmul(&x, &w, Some(&b), &out).unwrap_err();
        assert!(
            matches!(
                e,
                Error::DType {
                    name: "out (with bias)",
                    ..
                }
            ),
            "{e}"
        );
        assert!(cpu.matmul(&x, &w, None, &out).is_ok());
    }

    #[test]
    fn uniform_is_in_range_and_spread() {
        let us: Vec<f32> = (0..10_000).map(uniform_from_seed).collect();
        assert!(us.iter().all(|&u| (0.0..1.0).contains(&u)));
        let mean = us.iter().sum::<f32>() / us.len() as f32;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
        assert_ne!(uniform_from_seed(1), uniform_from_seed(2));
    }

    #[test]
    fn llama3_scaling_matches_hf_bands() {
        let base = RopeConfig {
            rot_dim: 128,
            theta: 500_000.0,
            scaling: None,
        };
        let scaled = RopeConfig {
            scaling: Some(RopeScaling::Llama3(Llama3Scaling {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192,
            })),
            ..base
        };
        let (a, b) = (base.inv_freq(), scaled.inv_freq());
        // Highest frequencies (short wavelengths) are untouched, lowest divided by factor.
        assert_eq!(a[0], b[0]);
        assert!((a[63] / b[63] - 8.0).abs() < 1e-9);
        // In between, the scaled frequency lies between f/factor and f.
        for i in 0..64 {
            assert!(b[i] <= a[i] + 1e-15 && b[i] >= a[i] / 8.0 - 1e-15, "i={i}");
        }
    }
}
