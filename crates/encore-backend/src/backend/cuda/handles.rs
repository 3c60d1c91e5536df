//! Every kernel entry point, resolved once at load into typed handles. A launcher picks
//! its function by indexing (op, element type, variant); no kernel name is built or
//! looked up while a step runs, and a missing entry point fails `CudaBackend::new`.

use cudarc::driver::CudaFunction;

use crate::error::{Error, Result};
use crate::quant::QuantFormat;
use crate::tensor::DType;

/// The element types the kernels are instantiated for, in handle order.
const DTYPES: [DType; 3] = [DType::BF16, DType::F16, DType::F32];

/// One loaded entry point and its name (for launch errors).
pub(super) struct Kernel {
    pub f: CudaFunction,
    pub name: Box<str>,
}

/// A kernel instantiated per element type: `<op>_bf16`, `<op>_f16`, `<op>_f32`. `K` is
/// what a name resolves to: a [`Kernel`] in the backend, the name itself in the tests.
pub(super) struct PerDType<K = Kernel> {
    op: &'static str,
    f: [K; 3],
}

impl<K> PerDType<K> {
    /// `<op>_<dt><suffix>` for each element type (the suffix names a variant: `_m1`).
    fn names(op: &str, suffix: &str) -> [String; 3] {
        DTYPES.map(|dt| format!("{op}_{}{suffix}", dt.kernel_suffix()))
    }

    fn resolve(take: &mut impl FnMut(&str) -> Result<K>, op: &'static str) -> Result<Self> {
        Self::resolve_variant(take, op, "")
    }

    fn resolve_variant(
        take: &mut impl FnMut(&str) -> Result<K>,
        op: &'static str,
        suffix: &str,
    ) -> Result<Self> {
        let f = Self::names(op, suffix).map(|name| take(&name));
        let [a, b, c] = f;
        Ok(PerDType {
            op,
            f: [a?, b?, c?],
        })
    }

    /// The instantiation for `dt` (the ops' validation admits no other element type).
    pub(super) fn get(&self, dt: DType) -> Result<&K> {
        dtype_index(dt)
            .map(|i| &self.f[i])
            .ok_or_else(|| Error::invalid(self.op, format!("no {dt} kernel")))
    }
}

/// Rows of the gemv variants (`_m1`, `_m2`, `_m4`, `_m8`).
pub(super) const GEMV_VARIANTS: [usize; 4] = [1, 2, 4, 8];
/// Heads per CTA of the split attention variants (`attention_split_g1` .. `_g8`).
pub(super) const SPLIT_VARIANTS: [usize; 4] = [1, 2, 4, 8];
/// Head sizes of the tensor-core prefill kernel (`attention_prefill_hd64`, `_hd128`).
pub(super) const PREFILL_HEAD_DIMS: [usize; 2] = [64, 128];

/// The quantized weight formats of the `quant_*.cu` kernels, in handle order.
const QUANT_FORMATS: [QuantFormat; NF] = QuantFormat::ALL;
/// How many formats [`QUANT_FORMATS`] holds.
const NF: usize = QuantFormat::ALL.len();
/// `qgemv_act_<fmt>` and `dequant_<fmt>` for each of [`QUANT_FORMATS`] (a [`PerDType`]'s op
/// name is static).
const QGEMV_SILU_OPS: [&str; NF] = [
    "qgemv_act_q8_0",
    "qgemv_act_q4_0",
    "qgemv_act_q4_1",
    "qgemv_act_q5_0",
    "qgemv_act_q5_1",
    "qgemv_act_q4_k",
    "qgemv_act_q5_k",
    "qgemv_act_q6_k",
    "qgemv_act_fp8",
    "qgemv_act_mxfp4",
];
const DEQUANT_OPS: [&str; NF] = [
    "dequant_q8_0",
    "dequant_q4_0",
    "dequant_q4_1",
    "dequant_q5_0",
    "dequant_q5_1",
    "dequant_q4_k",
    "dequant_q5_k",
    "dequant_q6_k",
    "dequant_fp8",
    "dequant_mxfp4",
];

/// `qmoe_gate_up_<fmt>` and `qmoe_down_<fmt>`: a mixture of experts' quantized experts.
const QMOE_GATE_UP_OPS: [&str; NF] = [
    "qmoe_gate_up_q8_0",
    "qmoe_gate_up_q4_0",
    "qmoe_gate_up_q4_1",
    "qmoe_gate_up_q5_0",
    "qmoe_gate_up_q5_1",
    "qmoe_gate_up_q4_k",
    "qmoe_gate_up_q5_k",
    "qmoe_gate_up_q6_k",
    "qmoe_gate_up_fp8",
    "qmoe_gate_up_mxfp4",
];
const QMOE_DOWN_OPS: [&str; NF] = [
    "qmoe_down_q8_0",
    "qmoe_down_q4_0",
    "qmoe_down_q4_1",
    "qmoe_down_q5_0",
    "qmoe_down_q5_1",
    "qmoe_down_q4_k",
    "qmoe_down_q5_k",
    "qmoe_down_q6_k",
    "qmoe_down_fp8",
    "qmoe_down_mxfp4",
];

/// Every kernel of `kernels/*.cu`, by op.
pub(super) struct Kernels<K = Kernel> {
    pub embedding: PerDType<K>,
    /// A GPTQ act-order projection's input in its weight's column order (gather.cu).
    pub gather_columns: PerDType<K>,
    /// Asynchronous scheduling's token ids from the samples of the step before (gather.cu).
    pub fill_rows_i32: K,
    pub rms_norm: PerDType<K>,
    /// LayerNorm with a bias (rms_norm.cu's `norm_impl` with LN).
    pub layer_norm: PerDType<K>,
    pub silu_mul: PerDType<K>,
    pub scale: PerDType<K>,
    /// Mixture-of-experts layers (moe.cu): routing, the experts' gate/up + SiLU, down.
    pub moe_route: PerDType<K>,
    pub moe_gate_up: PerDType<K>,
    pub moe_down: PerDType<K>,
    pub moe_shared_add: PerDType<K>,
    pub allreduce: PerDType<K>,
    pub allreduce_rms_norm: PerDType<K>,
    /// The pushed all-reduce: the row-parallel gemv that pushes its outputs to every rank
    /// (by [`GEMV_VARIANTS`] index), and the sum + residual RMSNorm after it.
    pub gemv_push: [PerDType<K>; 4],
    pub pushed_rms_norm: PerDType<K>,
    /// By KV cache: of the activations' type, then FP8 (`_kv8`).
    pub qkv_rope: [PerDType<K>; 2],
    /// By KV cache (as `qkv_rope`), then [`SPLIT_VARIANTS`] index.
    attention_split: [[PerDType<K>; 4]; 2],
    pub attention_combine: PerDType<K>,
    /// By KV cache (as `qkv_rope`), [`PREFILL_HEAD_DIMS`] index, then bf16 / f16.
    attention_prefill: [[[K; 2]; 2]; 2],
    /// The warpgroup-MMA prefill kernel (sm_90a), indexed as `attention_prefill`.
    attention_prefill_wg: [[[K; 2]; 2]; 2],
    /// The tensor-core decode kernel, indexed as `attention_prefill`.
    attention_decode: [[[K; 2]; 2]; 2],
    /// By input element type, output (0: the input's type, 1: f32), [`GEMV_VARIANTS`] index.
    pub gemv: [[[K; 4]; 2]; 3],
    /// The one-row fused gate/up projection and SiLU·mul.
    pub gemv_act: PerDType<K>,
    /// Quantized-weight gemv: by [`QUANT_FORMATS`] index, then as `gemv`.
    pub qgemv: [[[[K; 4]; 2]; 3]; NF],
    /// Quantized-weight fused gate/up + SiLU·mul (one row), by [`QUANT_FORMATS`] index.
    pub qgemv_act: [PerDType<K>; NF],
    /// Dense T from a quantized weight, by [`QUANT_FORMATS`] index.
    pub dequant: [PerDType<K>; NF],
    /// Quantized experts' gate/up + SiLU and weighted down (a mixture of experts' few-row
    /// path), by [`QUANT_FORMATS`] index.
    pub qmoe_gate_up: [PerDType<K>; NF],
    pub qmoe_down: [PerDType<K>; NF],
    /// The same on the tensor cores (`quant_moe_mma.cuh`, x in bf16): by
    /// [`QUANT_FORMATS`] index, gate/up then down.
    pub qmoe_mma: [[K; 2]; NF],
    /// The grouped MoE GEMM: by weight format ([`QUANT_FORMATS`] index, then dense), x in
    /// bf16 / f16, gate/up then down, [`GMOE_TILES`]; the pairs' sort and the slots' sum.
    pub gmoe: [[[[K; 2]; 2]; 2]; NF + 1],
    pub moe_align: K,
    pub moe_cache_plan: K,
    pub moe_cache_fill: K,
    pub moe_cache_fill_bulk: K,
    pub moe_combine: PerDType<K>,
    /// Quantized-weight tensor-core matmul: by [`QUANT_FORMATS`] index, x in bf16 / f16,
    /// out in x's type / f32, then [`QMMA_TILES`].
    pub qmma: [[[[K; 3]; 2]; 2]; NF],
    /// Its split-K sum: x in bf16 / f16, out in x's type / f32.
    pub qmma_reduce: [[K; 2]; 2],
    /// The mixed-input GEMM on repacked weights: 4- / 8-bit codes, x in bf16 / f16, then
    /// [`MARLIN_MBS`] (16-row blocks a CTA).
    pub marlin: [[[K; 4]; 2]; 2],
    /// The FP8 GEMM's operands: x to E4M3 with per-128 scales (bf16 / f16 x), and the
    /// weight's scales transposed; row-wise, x with one scale a row and the weight's one
    /// scale a row.
    pub fp8_quant_rows: [K; 2],
    pub fp8_weight_scales: K,
    pub fp8_quant_tokens: [K; 2],
    pub fp8_row_scales: K,
    /// The same quantizations of the gated MLP's activation, computed from gate_up.
    pub fp8_act_quant_rows: [K; 2],
    pub fp8_act_quant_tokens: [K; 2],
    /// The residual add and RMSNorm into either quantization (`per_row` an argument).
    pub fp8_norm_quant: [K; 2],
    pub sample_f32: K,
    pub logit_bias_f32: K,
    pub penalty_count_i32: K,
}

impl<K> Kernels<K> {
    /// Take every handle, by its `extern "C"` name, from `take` (the backend's: a loaded
    /// function, or an error naming the missing one).
    pub(super) fn resolve(mut take: impl FnMut(&str) -> Result<K>) -> Result<Self> {
        let t = &mut take;
        let embedding = PerDType::resolve(t, "embedding")?;
        let gather_columns = PerDType::resolve(t, "gather_columns")?;
        let rms_norm = PerDType::resolve(t, "rms_norm")?;
        let layer_norm = PerDType::resolve(t, "layer_norm")?;
        let silu_mul = PerDType::resolve(t, "silu_mul")?;
        let scale = PerDType::resolve(t, "scale")?;
        let moe_route = PerDType::resolve(t, "moe_route")?;
        let moe_gate_up = PerDType::resolve(t, "moe_gate_up")?;
        let moe_down = PerDType::resolve(t, "moe_down")?;
        let moe_shared_add = PerDType::resolve(t, "moe_shared_add")?;
        let allreduce = PerDType::resolve(t, "allreduce")?;
        let allreduce_rms_norm = PerDType::resolve(t, "allreduce_rms_norm")?;
        let mut push = |r: usize| {
            let suffix = format!("_m{}", GEMV_VARIANTS[r]);
            PerDType::resolve_variant(t, "gemv_push", &suffix)
        };
        let gemv_push = [push(0)?, push(1)?, push(2)?, push(3)?];
        let pushed_rms_norm = PerDType::resolve(t, "pushed_rms_norm")?;
        let qkv_rope = [
            PerDType::resolve(t, "qkv_rope")?,
            PerDType::resolve_variant(t, "qkv_rope", KV8)?,
        ];
        let mut split = |kv: &str| -> Result<[PerDType<K>; 4]> {
            let mut one = |i: usize| PerDType::resolve_variant(t, SPLIT_NAMES[i], kv);
            Ok([one(0)?, one(1)?, one(2)?, one(3)?])
        };
        let attention_split = [split("")?, split(KV8)?];
        let attention_combine = PerDType::resolve(t, "attention_combine")?;
        let mut tiled = |op: &str, kv: &str| -> Result<[[K; 2]; 2]> {
            let mut one = |h: usize, d: usize| {
                t(&format!(
                    "{op}_hd{}_{}{kv}",
                    PREFILL_HEAD_DIMS[h],
                    DTYPES[d].kernel_suffix()
                ))
            };
            Ok([[one(0, 0)?, one(0, 1)?], [one(1, 0)?, one(1, 1)?]])
        };
        let attention_prefill = [
            tiled("attention_prefill", "")?,
            tiled("attention_prefill", KV8)?,
        ];
        let attention_prefill_wg = [
            tiled("attention_prefill_wg", "")?,
            tiled("attention_prefill_wg", KV8)?,
        ];
        let attention_decode = [
            tiled("attention_decode", "")?,
            tiled("attention_decode", KV8)?,
        ];
        let mut gemv = |x: usize, o: usize| -> Result<[K; 4]> {
            let xs = DTYPES[x].kernel_suffix();
            let os = if o == 1 { "f32" } else { xs };
            let mut v = |r: usize| t(&format!("gemv_{xs}_{os}_m{}", GEMV_VARIANTS[r]));
            Ok([v(0)?, v(1)?, v(2)?, v(3)?])
        };
        let gemv = [
            [gemv(0, 0)?, gemv(0, 1)?],
            [gemv(1, 0)?, gemv(1, 1)?],
            [gemv(2, 0)?, gemv(2, 1)?],
        ];
        let mut qgemv = |f: usize| -> Result<[[[K; 4]; 2]; 3]> {
            let mut one = |x: usize, o: usize| -> Result<[K; 4]> {
                let xs = DTYPES[x].kernel_suffix();
                let os = if o == 1 { "f32" } else { xs };
                let fname = QUANT_FORMATS[f].name();
                let mut v = |r: usize| t(&format!("qgemv_{fname}_{xs}_{os}_m{}", GEMV_VARIANTS[r]));
                Ok([v(0)?, v(1)?, v(2)?, v(3)?])
            };
            Ok([
                [one(0, 0)?, one(0, 1)?],
                [one(1, 0)?, one(1, 1)?],
                [one(2, 0)?, one(2, 1)?],
            ])
        };
        let qgemv = per_format(&mut qgemv)?;
        let qgemv_act = per_format(|f| PerDType::resolve_variant(t, QGEMV_SILU_OPS[f], "_m1"))?;
        let dequant = per_format(|f| PerDType::resolve(t, DEQUANT_OPS[f]))?;
        let qmoe_gate_up = per_format(|f| PerDType::resolve(t, QMOE_GATE_UP_OPS[f]))?;
        let qmoe_down = per_format(|f| PerDType::resolve(t, QMOE_DOWN_OPS[f]))?;
        let qmoe_mma = per_format(|f| {
            let fname = QUANT_FORMATS[f].name();
            Ok([
                t(&format!("qmoe_mma_gate_up_{fname}_bf16"))?,
                t(&format!("qmoe_mma_down_{fname}_bf16"))?,
            ])
        })?;
        let mut gmoe_one = |fname: &str| -> Result<[[[K; 2]; 2]; 2]> {
            let mut one = |x: usize, op: &str| -> Result<[K; 2]> {
                let xs = DTYPES[x].kernel_suffix();
                let mut v = |b: usize| t(&format!("gmoe_{op}_{fname}_{xs}_bm{}", GMOE_TILES[b]));
                Ok([v(0)?, v(1)?])
            };
            Ok([
                [one(0, "gate_up")?, one(0, "down")?],
                [one(1, "gate_up")?, one(1, "down")?],
            ])
        };
        let [a, b, c, d, e, f, g, h, i, j] = per_format(|f| gmoe_one(QUANT_FORMATS[f].name()))?;
        let gmoe = [a, b, c, d, e, f, g, h, i, j, gmoe_one("dense")?];
        let mut qmma = |f: usize| -> Result<[[[K; 3]; 2]; 2]> {
            let fname = QUANT_FORMATS[f].name();
            let mut one = |x: usize, o: usize| -> Result<[K; 3]> {
                let xs = DTYPES[x].kernel_suffix();
                let os = if o == 1 { "f32" } else { xs };
                let mut v = |b: usize| t(&format!("qmma_{fname}_{xs}_{os}_bm{}", QMMA_TILES[b]));
                Ok([v(0)?, v(1)?, v(2)?])
            };
            Ok([[one(0, 0)?, one(0, 1)?], [one(1, 0)?, one(1, 1)?]])
        };
        let qmma = per_format(&mut qmma)?;
        let mut reduce = |x: usize, o: usize| {
            let xs = DTYPES[x].kernel_suffix();
            t(&format!(
                "qmma_reduce_{xs}_{}",
                if o == 1 { "f32" } else { xs }
            ))
        };
        let qmma_reduce = [
            [reduce(0, 0)?, reduce(0, 1)?],
            [reduce(1, 0)?, reduce(1, 1)?],
        ];
        let mut marlin = |b: usize, x: usize| -> Result<[K; 4]> {
            let xs = DTYPES[x].kernel_suffix();
            let bits = [4, 8][b];
            let mut v = |i: usize| t(&format!("marlin_q{bits}_{xs}_mb{}", MARLIN_MBS[i]));
            Ok([v(0)?, v(1)?, v(2)?, v(3)?])
        };
        let marlin = [
            [marlin(0, 0)?, marlin(0, 1)?],
            [marlin(1, 0)?, marlin(1, 1)?],
        ];
        let fp8_quant_rows = [t("fp8_quant_rows_bf16")?, t("fp8_quant_rows_f16")?];
        Ok(Kernels {
            embedding,
            gather_columns,
            rms_norm,
            layer_norm,
            silu_mul,
            scale,
            moe_route,
            moe_gate_up,
            moe_down,
            moe_shared_add,
            allreduce,
            allreduce_rms_norm,
            gemv_push,
            pushed_rms_norm,
            qkv_rope,
            attention_split,
            attention_combine,
            attention_prefill,
            attention_prefill_wg,
            attention_decode,
            gemv,
            gemv_act: PerDType::resolve_variant(t, "gemv_act", "_m1")?,
            qgemv,
            qgemv_act,
            dequant,
            qmoe_gate_up,
            qmoe_down,
            qmoe_mma,
            gmoe,
            moe_align: t("moe_align")?,
            moe_cache_plan: t("moe_cache_plan")?,
            moe_cache_fill: t("moe_cache_fill")?,
            moe_cache_fill_bulk: t("moe_cache_fill_bulk")?,
            moe_combine: PerDType::resolve(t, "moe_combine")?,
            qmma,
            qmma_reduce,
            marlin,
            fp8_quant_rows,
            fp8_weight_scales: t("fp8_weight_scales")?,
            fp8_quant_tokens: [t("fp8_quant_tokens_bf16")?, t("fp8_quant_tokens_f16")?],
            fp8_row_scales: t("fp8_row_scales")?,
            fp8_act_quant_rows: [t("fp8_act_quant_rows_bf16")?, t("fp8_act_quant_rows_f16")?],
            fp8_act_quant_tokens: [
                t("fp8_act_quant_tokens_bf16")?,
                t("fp8_act_quant_tokens_f16")?,
            ],
            fp8_norm_quant: [t("fp8_norm_quant_bf16")?, t("fp8_norm_quant_f16")?],
            sample_f32: t("sample_f32")?,
            fill_rows_i32: t("fill_rows_i32")?,
            logit_bias_f32: t("logit_bias_f32")?,
            penalty_count_i32: t("penalty_count_i32")?,
        })
    }

    /// `gemv_<x>_<out>_m<rows>` for `rows` in [`GEMV_VARIANTS`] and `out` either `x`'s type
    /// or f32.
    pub(super) fn gemv(&self, x: DType, out: DType, rows: usize) -> Result<&K> {
        const OP: &str = "matmul (gemv)";
        let xi = dtype_index(x).ok_or_else(|| Error::invalid(OP, format!("no {x} kernel")))?;
        let oi = match out {
            o if o == x => 0,
            DType::F32 => 1,
            o => return Err(Error::invalid(OP, format!("no {x} -> {o} kernel"))),
        };
        let vi = variant(&GEMV_VARIANTS, rows, OP)?;
        Ok(&self.gemv[xi][oi][vi])
    }

    /// `gemv_push_<x>_m<rows>` for `rows` in [`GEMV_VARIANTS`].
    pub(super) fn gemv_push(&self, x: DType, rows: usize) -> Result<&K> {
        let vi = variant(&GEMV_VARIANTS, rows, "matmul_all_reduce_rms_norm (gemv)")?;
        self.gemv_push[vi].get(x)
    }

    /// `qgemv_<fmt>_<x>_<out>_m<rows>` for `rows` in [`GEMV_VARIANTS`] and `out` either
    /// `x`'s type or f32.
    pub(super) fn qgemv(&self, fmt: QuantFormat, x: DType, out: DType, rows: usize) -> Result<&K> {
        const OP: &str = "matmul (quantized gemv)";
        let fi = format_index(fmt);
        let xi = dtype_index(x).ok_or_else(|| Error::invalid(OP, format!("no {x} kernel")))?;
        let oi = match out {
            o if o == x => 0,
            DType::F32 => 1,
            o => return Err(Error::invalid(OP, format!("no {x} -> {o} kernel"))),
        };
        let vi = variant(&GEMV_VARIANTS, rows, OP)?;
        Ok(&self.qgemv[fi][xi][oi][vi])
    }

    /// `qgemv_act_<fmt>_<dt>_m1`.
    pub(super) fn qgemv_act(&self, fmt: QuantFormat, dt: DType) -> Result<&K> {
        self.qgemv_act[format_index(fmt)].get(dt)
    }

    /// `qmma_<fmt>_<x>_<out>_bm<rows>` for x in bf16 / f16, `out` either `x`'s type or f32
    /// and `rows` in [`QMMA_TILES`].
    pub(super) fn qmma(&self, fmt: QuantFormat, x: DType, out: DType, rows: usize) -> Result<&K> {
        const OP: &str = "matmul (quantized mma)";
        let (xi, oi) = qmma_types(x, out, OP)?;
        let bi = variant(&QMMA_TILES, rows, OP)?;
        Ok(&self.qmma[format_index(fmt)][xi][oi][bi])
    }

    /// `marlin_q<bits>_<x>_mb<mb>` for 4- or 8-bit codes, x in bf16 / f16, `mb` in
    /// [`MARLIN_MBS`].
    pub(super) fn marlin(&self, bits: usize, x: DType, mb: usize) -> Result<&K> {
        const OP: &str = "matmul (quantized, marlin)";
        let (xi, _) = qmma_types(x, x, OP)?;
        let bi = match bits {
            4 => 0,
            8 => 1,
            b => return Err(Error::invalid(OP, format!("no {b}-bit kernel"))),
        };
        Ok(&self.marlin[bi][xi][variant(&MARLIN_MBS, mb, OP)?])
    }

    /// `qmma_reduce_<x>_<out>`.
    pub(super) fn qmma_reduce(&self, x: DType, out: DType) -> Result<&K> {
        let (xi, oi) = qmma_types(x, out, "matmul (quantized mma)")?;
        Ok(&self.qmma_reduce[xi][oi])
    }

    /// `fp8_quant_rows_<x>` (per 128 values) or `fp8_quant_tokens_<x>` (per row, `rows`)
    /// for x in bf16 / f16.
    pub(super) fn fp8_quant_rows(&self, x: DType, rows: bool) -> Result<&K> {
        let (xi, _) = qmma_types(x, x, "matmul (FP8 GEMM)")?;
        Ok(if rows {
            &self.fp8_quant_tokens[xi]
        } else {
            &self.fp8_quant_rows[xi]
        })
    }

    /// `fp8_act_quant_rows_<x>` or `fp8_act_quant_tokens_<x>` (`rows`): as
    /// [`Kernels::fp8_quant_rows`], of the gated MLP's activation.
    pub(super) fn fp8_act_quant(&self, x: DType, rows: bool) -> Result<&K> {
        let (xi, _) = qmma_types(x, x, "matmul (FP8 GEMM)")?;
        Ok(if rows {
            &self.fp8_act_quant_tokens[xi]
        } else {
            &self.fp8_act_quant_rows[xi]
        })
    }

    /// `fp8_norm_quant_<x>` for x in bf16 / f16.
    pub(super) fn fp8_norm_quant(&self, x: DType) -> Result<&K> {
        let (xi, _) = qmma_types(x, x, "matmul (FP8 GEMM)")?;
        Ok(&self.fp8_norm_quant[xi])
    }

    /// `gmoe_{gate_up,down}_<fmt>_<x>_bm<tile>`: `fmt` the experts' format (`None`:
    /// dense, in x's type), x in bf16 / f16, `tile` in [`GMOE_TILES`].
    pub(super) fn gmoe(
        &self,
        fmt: Option<QuantFormat>,
        x: DType,
        gate_up: bool,
        tile: usize,
    ) -> Result<&K> {
        const OP: &str = "moe (grouped GEMM)";
        let (xi, _) = qmma_types(x, x, OP)?;
        let fi = fmt.map_or(QUANT_FORMATS.len(), format_index);
        let bi = variant(&GMOE_TILES, tile, OP)?;
        Ok(&self.gmoe[fi][xi][usize::from(!gate_up)][bi])
    }

    /// `dequant_<fmt>_<dt>`.
    pub(super) fn dequant(&self, fmt: QuantFormat, dt: DType) -> Result<&K> {
        self.dequant[format_index(fmt)].get(dt)
    }

    /// `attention_split_g<heads>_<dt>[_kv8]` for `heads` in [`SPLIT_VARIANTS`] (`_kv8`:
    /// over an FP8 cache).
    pub(super) fn attention_split(&self, heads: usize, dt: DType, kv8: bool) -> Result<&K> {
        self.attention_split[usize::from(kv8)][variant(&SPLIT_VARIANTS, heads, "attention")?]
            .get(dt)
    }

    /// `attention_prefill_hd<head_dim>_<dt>[_kv8]`, if that instantiation exists.
    pub(super) fn attention_prefill(&self, head_dim: usize, dt: DType, kv8: bool) -> Option<&K> {
        let (h, d) = tiled_index(head_dim, dt)?;
        Some(&self.attention_prefill[usize::from(kv8)][h][d])
    }

    /// `attention_prefill_wg_hd<head_dim>_<dt>[_kv8]`, if that instantiation exists.
    pub(super) fn attention_prefill_wg(&self, head_dim: usize, dt: DType, kv8: bool) -> Option<&K> {
        let (h, d) = tiled_index(head_dim, dt)?;
        Some(&self.attention_prefill_wg[usize::from(kv8)][h][d])
    }

    /// `attention_decode_hd<head_dim>_<dt>[_kv8]`, if that instantiation exists.
    pub(super) fn attention_decode(&self, head_dim: usize, dt: DType, kv8: bool) -> Option<&K> {
        let (h, d) = tiled_index(head_dim, dt)?;
        Some(&self.attention_decode[usize::from(kv8)][h][d])
    }
}

/// The (head size, dtype) index of the tensor-core attention kernels: head_dim in
/// [`PREFILL_HEAD_DIMS`], bf16 or f16.
fn tiled_index(head_dim: usize, dt: DType) -> Option<(usize, usize)> {
    let h = PREFILL_HEAD_DIMS.iter().position(|&d| d == head_dim)?;
    let d = match dt {
        DType::BF16 => 0,
        DType::F16 => 1,
        _ => return None,
    };
    Some((h, d))
}

/// The suffix of the kernels that read or write an FP8 KV cache.
const KV8: &str = "_kv8";

const SPLIT_NAMES: [&str; 4] = [
    "attention_split_g1",
    "attention_split_g2",
    "attention_split_g4",
    "attention_split_g8",
];

/// Rows per tile of the grouped MoE GEMM variants (`gmoe_*_bm32`, `_bm64`).
pub(super) const GMOE_TILES: [usize; 2] = [32, 64];

/// 16-row blocks of x per CTA of the `marlin` variants (`_mb1` .. `_mb8`).
pub(super) const MARLIN_MBS: [usize; 4] = super::kernels::marlin::MBS;

/// Rows of x per CTA of the `qmma` variants (`_bm32`, `_bm64`, `_bm128`).
pub(super) const QMMA_TILES: [usize; 3] = [32, 64, 128];

/// Indices of x (bf16, f16) and out (x's type, f32) in the `qmma` handles.
fn qmma_types(x: DType, out: DType, op: &'static str) -> Result<(usize, usize)> {
    let xi = match x {
        DType::BF16 => 0,
        DType::F16 => 1,
        x => return Err(Error::invalid(op, format!("no {x} kernel"))),
    };
    let oi = match out {
        o if o == x => 0,
        DType::F32 => 1,
        o => return Err(Error::invalid(op, format!("no {x} -> {o} kernel"))),
    };
    Ok((xi, oi))
}

fn format_index(fmt: QuantFormat) -> usize {
    QUANT_FORMATS
        .iter()
        .position(|&f| f == fmt)
        .expect("QUANT_FORMATS is QuantFormat::ALL")
}

/// `[f(0), .., f(NF - 1)]`, one per [`QUANT_FORMATS`] entry.
fn per_format<T>(mut f: impl FnMut(usize) -> Result<T>) -> Result<[T; NF]> {
    let v = (0..QUANT_FORMATS.len())
        .map(&mut f)
        .collect::<Result<Vec<T>>>()?;
    Ok(v.try_into()
        .unwrap_or_else(|_| unreachable!("one per format")))
}

fn dtype_index(dt: DType) -> Option<usize> {
    DTYPES.iter().position(|&d| d == dt)
}

fn variant(list: &[usize], v: usize, op: &'static str) -> Result<usize> {
    list.iter()
        .position(|&x| x == v)
        .ok_or_else(|| Error::invalid(op, format!("no kernel variant for {v}")))
}

/// The backend's resolver: the loaded function named `name`, or an error naming it.
pub(super) fn take(
    fns: &std::collections::HashMap<&'static str, CudaFunction>,
    name: &str,
) -> Result<Kernel> {
    let f = fns.get(name).cloned().ok_or_else(|| Error::Cuda {
        call: "kernel lookup".into(),
        message: format!(
            "kernel `{name}` is not loaded (not listed in kernels/sources.rs SOURCES?)"
        ),
    })?;
    Ok(Kernel {
        f,
        name: name.into(),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::kernels::SOURCES;
    use super::*;

    /// Without a GPU: [`Kernels::resolve`] asks for exactly the entry points the kernel
    /// files define (one it asks for that is not listed would fail `CudaBackend::new`),
    /// each once, and the accessors find the instantiations the launchers use.
    #[test]
    fn handles_name_exactly_the_listed_kernels() {
        let mut asked = Vec::new();
        let k = Kernels::resolve(|name: &str| {
            asked.push(name.to_string());
            Ok(name.to_string())
        })
        .unwrap();
        let listed: BTreeSet<&str> = SOURCES
            .iter()
            .flat_map(|s| s.functions.iter().copied())
            .collect();
        let unique: BTreeSet<&str> = asked.iter().map(String::as_str).collect();
        assert_eq!(unique, listed);
        // f32 -> f32 gemv and qgemv are asked for twice (their "same type" and "f32 out"
        // slots): 4 variants, and 4 per quantized format.
        assert_eq!(asked.len(), listed.len() + 4 + 4 * QUANT_FORMATS.len());
        for (f, fmt) in QUANT_FORMATS.iter().enumerate() {
            assert_eq!(QGEMV_SILU_OPS[f], format!("qgemv_act_{}", fmt.name()));
            assert_eq!(DEQUANT_OPS[f], format!("dequant_{}", fmt.name()));
            assert_eq!(QMOE_GATE_UP_OPS[f], format!("qmoe_gate_up_{}", fmt.name()));
            assert_eq!(QMOE_DOWN_OPS[f], format!("qmoe_down_{}", fmt.name()));
        }
        assert_eq!(
            k.qgemv(QuantFormat::Q4K, DType::BF16, DType::F32, 2)
                .unwrap(),
            "qgemv_q4_k_bf16_f32_m2"
        );
        assert_eq!(
            k.qgemv(QuantFormat::F8E4M3, DType::F32, DType::F32, 8)
                .unwrap(),
            "qgemv_fp8_f32_f32_m8"
        );
        assert!(k
            .qgemv(QuantFormat::Q8_0, DType::BF16, DType::F16, 1)
            .is_err());
        assert_eq!(
            k.qgemv_act(QuantFormat::Q6K, DType::F16).unwrap(),
            "qgemv_act_q6_k_f16_m1"
        );
        assert_eq!(
            k.dequant(QuantFormat::Q5_1, DType::BF16).unwrap(),
            "dequant_q5_1_bf16"
        );
        assert_eq!(
            k.qmma(QuantFormat::Q4K, DType::F16, DType::F32, 128)
                .unwrap(),
            "qmma_q4_k_f16_f32_bm128"
        );
        assert!(k
            .qmma(QuantFormat::Q4K, DType::F32, DType::F32, 64)
            .is_err());
        assert_eq!(
            k.gmoe(Some(QuantFormat::Q6K), DType::F16, false, 64)
                .unwrap(),
            "gmoe_down_q6_k_f16_bm64"
        );
        assert_eq!(
            k.gmoe(None, DType::BF16, true, 32).unwrap(),
            "gmoe_gate_up_dense_bf16_bm32"
        );
        assert!(k.gmoe(None, DType::F32, true, 32).is_err());
        assert_eq!(
            k.qmma_reduce(DType::BF16, DType::BF16).unwrap(),
            "qmma_reduce_bf16_bf16"
        );
        assert_eq!(
            k.gemv(DType::BF16, DType::F32, 4).unwrap(),
            "gemv_bf16_f32_m4"
        );
        assert_eq!(
            k.gemv(DType::F16, DType::F16, 1).unwrap(),
            "gemv_f16_f16_m1"
        );
        assert_eq!(
            k.gemv(DType::F32, DType::F32, 8).unwrap(),
            "gemv_f32_f32_m8"
        );
        assert!(k.gemv(DType::BF16, DType::F16, 1).is_err());
        assert!(k.gemv(DType::BF16, DType::BF16, 3).is_err());
        assert_eq!(k.gemv_act.get(DType::F16).unwrap(), "gemv_act_f16_m1");
        assert_eq!(
            k.attention_split(4, DType::F32, false).unwrap(),
            "attention_split_g4_f32"
        );
        assert_eq!(
            k.attention_split(8, DType::BF16, true).unwrap(),
            "attention_split_g8_bf16_kv8"
        );
        assert_eq!(
            k.attention_prefill(128, DType::BF16, false).unwrap(),
            "attention_prefill_hd128_bf16"
        );
        assert_eq!(
            k.attention_prefill(64, DType::F16, true).unwrap(),
            "attention_prefill_hd64_f16_kv8"
        );
        assert_eq!(k.qkv_rope[1].get(DType::F32).unwrap(), "qkv_rope_f32_kv8");
        assert_eq!(
            k.attention_decode(128, DType::BF16, true).unwrap(),
            "attention_decode_hd128_bf16_kv8"
        );
        assert!(k.attention_decode(96, DType::F16, false).is_none());
        assert!(k.attention_prefill(128, DType::F32, true).is_none());
        assert!(k.attention_prefill(96, DType::BF16, false).is_none());
        assert!(k.embedding.get(DType::I32).is_err());
    }
}
