//! The NVRTC kernel sources of the CUDA backend and one launcher per op.
//!
//! Sources live in `crates/encore-backend/kernels/`: `common.cuh` is prepended to every `.cu`
//! file before compiling (see [`COMMON`]), and [`SOURCES`] lists every file with every
//! `extern "C"` entry point it defines (nvrtc.rs's tests and `scripts/check-kernels.py` check
//! both lists against NVRTC's output). The backend validates shapes, dtypes and devices and then calls the
//! launchers here (the attention launchers in `attention`), which only choose launch
//! shapes (from tensor shapes alone: graphs replay them with new buffer contents), pick
//! the function from the handles resolved at load (`super::handles`), check alignment and
//! pass pointers.

use cudarc::driver::LaunchConfig;

use super::handles::Kernel;
use super::{dptr, CudaBackend};
use crate::backend::{LogitBias, QkvRope, Sampling};
use crate::error::{Error, Result};
use crate::ops::{EmbeddingDims, MatmulDims, QkvRopeDims, RowDims, SampleDims};
use crate::tensor::{DType, Tensor};

/// One kernel file: its name, its text and the entry points it defines.
pub(super) struct KernelSource {
    pub file: &'static str,
    pub src: &'static str,
    pub functions: &'static [&'static str],
}

/// Prepended to every kernel file before NVRTC compiles it.
pub(super) const COMMON: &str = include_str!("../../../../kernels/common.cuh");

pub(super) const SOURCES: &[KernelSource] = &[
    KernelSource {
        file: "allreduce.cu",
        src: include_str!("../../../../kernels/allreduce.cu"),
        functions: &[
            "allreduce_bf16",
            "allreduce_f16",
            "allreduce_f32",
            "allreduce_rms_norm_bf16",
            "allreduce_rms_norm_f16",
            "allreduce_rms_norm_f32",
            "pushed_rms_norm_bf16",
            "pushed_rms_norm_f16",
            "pushed_rms_norm_f32",
        ],
    },
    KernelSource {
        file: "embedding.cu",
        src: include_str!("../../../../kernels/embedding.cu"),
        functions: &["embedding_bf16", "embedding_f16", "embedding_f32"],
    },
    KernelSource {
        file: "rms_norm.cu",
        src: include_str!("../../../../kernels/rms_norm.cu"),
        functions: &["rms_norm_bf16", "rms_norm_f16", "rms_norm_f32"],
    },
    KernelSource {
        file: "moe.cu",
        src: include_str!("../../../../kernels/moe.cu"),
        functions: &[
            "moe_route_bf16",
            "moe_route_f16",
            "moe_route_f32",
            "moe_gate_up_bf16",
            "moe_gate_up_f16",
            "moe_gate_up_f32",
            "moe_down_bf16",
            "moe_down_f16",
            "moe_down_f32",
            "moe_shared_add_bf16",
            "moe_shared_add_f16",
            "moe_shared_add_f32",
            "gmoe_gate_up_dense_bf16_bm32",
            "gmoe_gate_up_dense_bf16_bm64",
            "gmoe_gate_up_dense_f16_bm32",
            "gmoe_gate_up_dense_f16_bm64",
            "gmoe_down_dense_bf16_bm32",
            "gmoe_down_dense_bf16_bm64",
            "gmoe_down_dense_f16_bm32",
            "gmoe_down_dense_f16_bm64",
            "moe_align",
            "moe_cache_plan",
            "moe_cache_fill",
            "moe_cache_fill_bulk",
            "moe_combine_bf16",
            "moe_combine_f16",
            "moe_combine_f32",
        ],
    },
    KernelSource {
        file: "silu_mul.cu",
        src: include_str!("../../../../kernels/silu_mul.cu"),
        functions: &["silu_mul_bf16", "silu_mul_f16", "silu_mul_f32"],
    },
    KernelSource {
        file: "qkv_rope.cu",
        src: include_str!("../../../../kernels/qkv_rope.cu"),
        functions: &[
            "qkv_rope_bf16",
            "qkv_rope_f16",
            "qkv_rope_f32",
            "qkv_rope_bf16_kv8",
            "qkv_rope_f16_kv8",
            "qkv_rope_f32_kv8",
        ],
    },
    KernelSource {
        file: "attention.cu",
        src: include_str!("../../../../kernels/attention.cu"),
        functions: &[
            "attention_split_g1_bf16",
            "attention_split_g2_bf16",
            "attention_split_g4_bf16",
            "attention_split_g8_bf16",
            "attention_split_g1_bf16_kv8",
            "attention_split_g2_bf16_kv8",
            "attention_split_g4_bf16_kv8",
            "attention_split_g8_bf16_kv8",
            "attention_split_g1_f16",
            "attention_split_g2_f16",
            "attention_split_g4_f16",
            "attention_split_g8_f16",
            "attention_split_g1_f16_kv8",
            "attention_split_g2_f16_kv8",
            "attention_split_g4_f16_kv8",
            "attention_split_g8_f16_kv8",
            "attention_split_g1_f32",
            "attention_split_g2_f32",
            "attention_split_g4_f32",
            "attention_split_g8_f32",
            "attention_split_g1_f32_kv8",
            "attention_split_g2_f32_kv8",
            "attention_split_g4_f32_kv8",
            "attention_split_g8_f32_kv8",
            "attention_combine_bf16",
            "attention_combine_f16",
            "attention_combine_f32",
        ],
    },
    KernelSource {
        file: "attention_prefill.cu",
        src: include_str!("../../../../kernels/attention_prefill.cu"),
        functions: &[
            "attention_prefill_hd64_bf16",
            "attention_prefill_hd128_bf16",
            "attention_prefill_hd64_f16",
            "attention_prefill_hd128_f16",
            "attention_prefill_hd64_bf16_kv8",
            "attention_prefill_hd128_bf16_kv8",
            "attention_prefill_hd64_f16_kv8",
            "attention_prefill_hd128_f16_kv8",
        ],
    },
    KernelSource {
        file: "attention_decode.cu",
        src: include_str!("../../../../kernels/attention_decode.cu"),
        functions: &[
            "attention_decode_hd64_bf16",
            "attention_decode_hd128_bf16",
            "attention_decode_hd64_f16",
            "attention_decode_hd128_f16",
            "attention_decode_hd64_bf16_kv8",
            "attention_decode_hd128_bf16_kv8",
            "attention_decode_hd64_f16_kv8",
            "attention_decode_hd128_f16_kv8",
        ],
    },
    KernelSource {
        file: "gemv.cu",
        src: include_str!("../../../../kernels/gemv.cu"),
        functions: &[
            "gemv_bf16_bf16_m1",
            "gemv_bf16_bf16_m2",
            "gemv_bf16_bf16_m4",
            "gemv_bf16_bf16_m8",
            "gemv_bf16_f32_m1",
            "gemv_bf16_f32_m2",
            "gemv_bf16_f32_m4",
            "gemv_bf16_f32_m8",
            "gemv_f16_f16_m1",
            "gemv_f16_f16_m2",
            "gemv_f16_f16_m4",
            "gemv_f16_f16_m8",
            "gemv_f16_f32_m1",
            "gemv_f16_f32_m2",
            "gemv_f16_f32_m4",
            "gemv_f16_f32_m8",
            "gemv_f32_f32_m1",
            "gemv_f32_f32_m2",
            "gemv_f32_f32_m4",
            "gemv_f32_f32_m8",
            "gemv_push_bf16_m1",
            "gemv_push_bf16_m2",
            "gemv_push_bf16_m4",
            "gemv_push_bf16_m8",
            "gemv_push_f16_m1",
            "gemv_push_f16_m2",
            "gemv_push_f16_m4",
            "gemv_push_f16_m8",
            "gemv_push_f32_m1",
            "gemv_push_f32_m2",
            "gemv_push_f32_m4",
            "gemv_push_f32_m8",
            "gemv_silu_bf16_m1",
            "gemv_silu_f16_m1",
            "gemv_silu_f32_m1",
            "qmma_reduce_bf16_bf16",
            "qmma_reduce_bf16_f32",
            "qmma_reduce_f16_f16",
            "qmma_reduce_f16_f32",
        ],
    },
    KernelSource {
        file: "quant_q8_0.cu",
        src: include_str!("../../../../kernels/quant_q8_0.cu"),
        functions: &[
            "qgemv_q8_0_bf16_bf16_m1",
            "qgemv_q8_0_bf16_bf16_m2",
            "qgemv_q8_0_bf16_bf16_m4",
            "qgemv_q8_0_bf16_bf16_m8",
            "qgemv_q8_0_bf16_f32_m1",
            "qgemv_q8_0_bf16_f32_m2",
            "qgemv_q8_0_bf16_f32_m4",
            "qgemv_q8_0_bf16_f32_m8",
            "qgemv_q8_0_f16_f16_m1",
            "qgemv_q8_0_f16_f16_m2",
            "qgemv_q8_0_f16_f16_m4",
            "qgemv_q8_0_f16_f16_m8",
            "qgemv_q8_0_f16_f32_m1",
            "qgemv_q8_0_f16_f32_m2",
            "qgemv_q8_0_f16_f32_m4",
            "qgemv_q8_0_f16_f32_m8",
            "qgemv_q8_0_f32_f32_m1",
            "qgemv_q8_0_f32_f32_m2",
            "qgemv_q8_0_f32_f32_m4",
            "qgemv_q8_0_f32_f32_m8",
            "qgemv_silu_q8_0_bf16_m1",
            "qgemv_silu_q8_0_f16_m1",
            "qgemv_silu_q8_0_f32_m1",
            "dequant_q8_0_bf16",
            "dequant_q8_0_f16",
            "dequant_q8_0_f32",
            "qmoe_gate_up_q8_0_bf16",
            "qmoe_gate_up_q8_0_f16",
            "qmoe_gate_up_q8_0_f32",
            "qmoe_down_q8_0_bf16",
            "qmoe_down_q8_0_f16",
            "qmoe_down_q8_0_f32",
            "gmoe_gate_up_q8_0_bf16_bm32",
            "gmoe_gate_up_q8_0_bf16_bm64",
            "gmoe_gate_up_q8_0_f16_bm32",
            "gmoe_gate_up_q8_0_f16_bm64",
            "gmoe_down_q8_0_bf16_bm32",
            "gmoe_down_q8_0_bf16_bm64",
            "gmoe_down_q8_0_f16_bm32",
            "gmoe_down_q8_0_f16_bm64",
            "qmma_q8_0_bf16_bf16_bm32",
            "qmma_q8_0_bf16_bf16_bm64",
            "qmma_q8_0_bf16_bf16_bm128",
            "qmma_q8_0_bf16_f32_bm32",
            "qmma_q8_0_bf16_f32_bm64",
            "qmma_q8_0_bf16_f32_bm128",
            "qmma_q8_0_f16_f16_bm32",
            "qmma_q8_0_f16_f16_bm64",
            "qmma_q8_0_f16_f16_bm128",
            "qmma_q8_0_f16_f32_bm32",
            "qmma_q8_0_f16_f32_bm64",
            "qmma_q8_0_f16_f32_bm128",
        ],
    },
    KernelSource {
        file: "quant_q4_0.cu",
        src: include_str!("../../../../kernels/quant_q4_0.cu"),
        functions: &[
            "qgemv_q4_0_bf16_bf16_m1",
            "qgemv_q4_0_bf16_bf16_m2",
            "qgemv_q4_0_bf16_bf16_m4",
            "qgemv_q4_0_bf16_bf16_m8",
            "qgemv_q4_0_bf16_f32_m1",
            "qgemv_q4_0_bf16_f32_m2",
            "qgemv_q4_0_bf16_f32_m4",
            "qgemv_q4_0_bf16_f32_m8",
            "qgemv_q4_0_f16_f16_m1",
            "qgemv_q4_0_f16_f16_m2",
            "qgemv_q4_0_f16_f16_m4",
            "qgemv_q4_0_f16_f16_m8",
            "qgemv_q4_0_f16_f32_m1",
            "qgemv_q4_0_f16_f32_m2",
            "qgemv_q4_0_f16_f32_m4",
            "qgemv_q4_0_f16_f32_m8",
            "qgemv_q4_0_f32_f32_m1",
            "qgemv_q4_0_f32_f32_m2",
            "qgemv_q4_0_f32_f32_m4",
            "qgemv_q4_0_f32_f32_m8",
            "qgemv_silu_q4_0_bf16_m1",
            "qgemv_silu_q4_0_f16_m1",
            "qgemv_silu_q4_0_f32_m1",
            "dequant_q4_0_bf16",
            "dequant_q4_0_f16",
            "dequant_q4_0_f32",
            "qmoe_gate_up_q4_0_bf16",
            "qmoe_gate_up_q4_0_f16",
            "qmoe_gate_up_q4_0_f32",
            "qmoe_down_q4_0_bf16",
            "qmoe_down_q4_0_f16",
            "qmoe_down_q4_0_f32",
            "gmoe_gate_up_q4_0_bf16_bm32",
            "gmoe_gate_up_q4_0_bf16_bm64",
            "gmoe_gate_up_q4_0_f16_bm32",
            "gmoe_gate_up_q4_0_f16_bm64",
            "gmoe_down_q4_0_bf16_bm32",
            "gmoe_down_q4_0_bf16_bm64",
            "gmoe_down_q4_0_f16_bm32",
            "gmoe_down_q4_0_f16_bm64",
            "qmma_q4_0_bf16_bf16_bm32",
            "qmma_q4_0_bf16_bf16_bm64",
            "qmma_q4_0_bf16_bf16_bm128",
            "qmma_q4_0_bf16_f32_bm32",
            "qmma_q4_0_bf16_f32_bm64",
            "qmma_q4_0_bf16_f32_bm128",
            "qmma_q4_0_f16_f16_bm32",
            "qmma_q4_0_f16_f16_bm64",
            "qmma_q4_0_f16_f16_bm128",
            "qmma_q4_0_f16_f32_bm32",
            "qmma_q4_0_f16_f32_bm64",
            "qmma_q4_0_f16_f32_bm128",
        ],
    },
    KernelSource {
        file: "quant_q4_1.cu",
        src: include_str!("../../../../kernels/quant_q4_1.cu"),
        functions: &[
            "qgemv_q4_1_bf16_bf16_m1",
            "qgemv_q4_1_bf16_bf16_m2",
            "qgemv_q4_1_bf16_bf16_m4",
            "qgemv_q4_1_bf16_bf16_m8",
            "qgemv_q4_1_bf16_f32_m1",
            "qgemv_q4_1_bf16_f32_m2",
            "qgemv_q4_1_bf16_f32_m4",
            "qgemv_q4_1_bf16_f32_m8",
            "qgemv_q4_1_f16_f16_m1",
            "qgemv_q4_1_f16_f16_m2",
            "qgemv_q4_1_f16_f16_m4",
            "qgemv_q4_1_f16_f16_m8",
            "qgemv_q4_1_f16_f32_m1",
            "qgemv_q4_1_f16_f32_m2",
            "qgemv_q4_1_f16_f32_m4",
            "qgemv_q4_1_f16_f32_m8",
            "qgemv_q4_1_f32_f32_m1",
            "qgemv_q4_1_f32_f32_m2",
            "qgemv_q4_1_f32_f32_m4",
            "qgemv_q4_1_f32_f32_m8",
            "qgemv_silu_q4_1_bf16_m1",
            "qgemv_silu_q4_1_f16_m1",
            "qgemv_silu_q4_1_f32_m1",
            "dequant_q4_1_bf16",
            "dequant_q4_1_f16",
            "dequant_q4_1_f32",
            "qmoe_gate_up_q4_1_bf16",
            "qmoe_gate_up_q4_1_f16",
            "qmoe_gate_up_q4_1_f32",
            "qmoe_down_q4_1_bf16",
            "qmoe_down_q4_1_f16",
            "qmoe_down_q4_1_f32",
            "gmoe_gate_up_q4_1_bf16_bm32",
            "gmoe_gate_up_q4_1_bf16_bm64",
            "gmoe_gate_up_q4_1_f16_bm32",
            "gmoe_gate_up_q4_1_f16_bm64",
            "gmoe_down_q4_1_bf16_bm32",
            "gmoe_down_q4_1_bf16_bm64",
            "gmoe_down_q4_1_f16_bm32",
            "gmoe_down_q4_1_f16_bm64",
            "qmma_q4_1_bf16_bf16_bm32",
            "qmma_q4_1_bf16_bf16_bm64",
            "qmma_q4_1_bf16_bf16_bm128",
            "qmma_q4_1_bf16_f32_bm32",
            "qmma_q4_1_bf16_f32_bm64",
            "qmma_q4_1_bf16_f32_bm128",
            "qmma_q4_1_f16_f16_bm32",
            "qmma_q4_1_f16_f16_bm64",
            "qmma_q4_1_f16_f16_bm128",
            "qmma_q4_1_f16_f32_bm32",
            "qmma_q4_1_f16_f32_bm64",
            "qmma_q4_1_f16_f32_bm128",
        ],
    },
    KernelSource {
        file: "quant_q5_0.cu",
        src: include_str!("../../../../kernels/quant_q5_0.cu"),
        functions: &[
            "qgemv_q5_0_bf16_bf16_m1",
            "qgemv_q5_0_bf16_bf16_m2",
            "qgemv_q5_0_bf16_bf16_m4",
            "qgemv_q5_0_bf16_bf16_m8",
            "qgemv_q5_0_bf16_f32_m1",
            "qgemv_q5_0_bf16_f32_m2",
            "qgemv_q5_0_bf16_f32_m4",
            "qgemv_q5_0_bf16_f32_m8",
            "qgemv_q5_0_f16_f16_m1",
            "qgemv_q5_0_f16_f16_m2",
            "qgemv_q5_0_f16_f16_m4",
            "qgemv_q5_0_f16_f16_m8",
            "qgemv_q5_0_f16_f32_m1",
            "qgemv_q5_0_f16_f32_m2",
            "qgemv_q5_0_f16_f32_m4",
            "qgemv_q5_0_f16_f32_m8",
            "qgemv_q5_0_f32_f32_m1",
            "qgemv_q5_0_f32_f32_m2",
            "qgemv_q5_0_f32_f32_m4",
            "qgemv_q5_0_f32_f32_m8",
            "qgemv_silu_q5_0_bf16_m1",
            "qgemv_silu_q5_0_f16_m1",
            "qgemv_silu_q5_0_f32_m1",
            "dequant_q5_0_bf16",
            "dequant_q5_0_f16",
            "dequant_q5_0_f32",
            "qmoe_gate_up_q5_0_bf16",
            "qmoe_gate_up_q5_0_f16",
            "qmoe_gate_up_q5_0_f32",
            "qmoe_down_q5_0_bf16",
            "qmoe_down_q5_0_f16",
            "qmoe_down_q5_0_f32",
            "gmoe_gate_up_q5_0_bf16_bm32",
            "gmoe_gate_up_q5_0_bf16_bm64",
            "gmoe_gate_up_q5_0_f16_bm32",
            "gmoe_gate_up_q5_0_f16_bm64",
            "gmoe_down_q5_0_bf16_bm32",
            "gmoe_down_q5_0_bf16_bm64",
            "gmoe_down_q5_0_f16_bm32",
            "gmoe_down_q5_0_f16_bm64",
            "qmma_q5_0_bf16_bf16_bm32",
            "qmma_q5_0_bf16_bf16_bm64",
            "qmma_q5_0_bf16_bf16_bm128",
            "qmma_q5_0_bf16_f32_bm32",
            "qmma_q5_0_bf16_f32_bm64",
            "qmma_q5_0_bf16_f32_bm128",
            "qmma_q5_0_f16_f16_bm32",
            "qmma_q5_0_f16_f16_bm64",
            "qmma_q5_0_f16_f16_bm128",
            "qmma_q5_0_f16_f32_bm32",
            "qmma_q5_0_f16_f32_bm64",
            "qmma_q5_0_f16_f32_bm128",
        ],
    },
    KernelSource {
        file: "quant_q5_1.cu",
        src: include_str!("../../../../kernels/quant_q5_1.cu"),
        functions: &[
            "qgemv_q5_1_bf16_bf16_m1",
            "qgemv_q5_1_bf16_bf16_m2",
            "qgemv_q5_1_bf16_bf16_m4",
            "qgemv_q5_1_bf16_bf16_m8",
            "qgemv_q5_1_bf16_f32_m1",
            "qgemv_q5_1_bf16_f32_m2",
            "qgemv_q5_1_bf16_f32_m4",
            "qgemv_q5_1_bf16_f32_m8",
            "qgemv_q5_1_f16_f16_m1",
            "qgemv_q5_1_f16_f16_m2",
            "qgemv_q5_1_f16_f16_m4",
            "qgemv_q5_1_f16_f16_m8",
            "qgemv_q5_1_f16_f32_m1",
            "qgemv_q5_1_f16_f32_m2",
            "qgemv_q5_1_f16_f32_m4",
            "qgemv_q5_1_f16_f32_m8",
            "qgemv_q5_1_f32_f32_m1",
            "qgemv_q5_1_f32_f32_m2",
            "qgemv_q5_1_f32_f32_m4",
            "qgemv_q5_1_f32_f32_m8",
            "qgemv_silu_q5_1_bf16_m1",
            "qgemv_silu_q5_1_f16_m1",
            "qgemv_silu_q5_1_f32_m1",
            "dequant_q5_1_bf16",
            "dequant_q5_1_f16",
            "dequant_q5_1_f32",
            "qmoe_gate_up_q5_1_bf16",
            "qmoe_gate_up_q5_1_f16",
            "qmoe_gate_up_q5_1_f32",
            "qmoe_down_q5_1_bf16",
            "qmoe_down_q5_1_f16",
            "qmoe_down_q5_1_f32",
            "gmoe_gate_up_q5_1_bf16_bm32",
            "gmoe_gate_up_q5_1_bf16_bm64",
            "gmoe_gate_up_q5_1_f16_bm32",
            "gmoe_gate_up_q5_1_f16_bm64",
            "gmoe_down_q5_1_bf16_bm32",
            "gmoe_down_q5_1_bf16_bm64",
            "gmoe_down_q5_1_f16_bm32",
            "gmoe_down_q5_1_f16_bm64",
            "qmma_q5_1_bf16_bf16_bm32",
            "qmma_q5_1_bf16_bf16_bm64",
            "qmma_q5_1_bf16_bf16_bm128",
            "qmma_q5_1_bf16_f32_bm32",
            "qmma_q5_1_bf16_f32_bm64",
            "qmma_q5_1_bf16_f32_bm128",
            "qmma_q5_1_f16_f16_bm32",
            "qmma_q5_1_f16_f16_bm64",
            "qmma_q5_1_f16_f16_bm128",
            "qmma_q5_1_f16_f32_bm32",
            "qmma_q5_1_f16_f32_bm64",
            "qmma_q5_1_f16_f32_bm128",
        ],
    },
    KernelSource {
        file: "quant_q4_k.cu",
        src: include_str!("../../../../kernels/quant_q4_k.cu"),
        functions: &[
            "qgemv_q4_k_bf16_bf16_m1",
            "qgemv_q4_k_bf16_bf16_m2",
            "qgemv_q4_k_bf16_bf16_m4",
            "qgemv_q4_k_bf16_bf16_m8",
            "qgemv_q4_k_bf16_f32_m1",
            "qgemv_q4_k_bf16_f32_m2",
            "qgemv_q4_k_bf16_f32_m4",
            "qgemv_q4_k_bf16_f32_m8",
            "qgemv_q4_k_f16_f16_m1",
            "qgemv_q4_k_f16_f16_m2",
            "qgemv_q4_k_f16_f16_m4",
            "qgemv_q4_k_f16_f16_m8",
            "qgemv_q4_k_f16_f32_m1",
            "qgemv_q4_k_f16_f32_m2",
            "qgemv_q4_k_f16_f32_m4",
            "qgemv_q4_k_f16_f32_m8",
            "qgemv_q4_k_f32_f32_m1",
            "qgemv_q4_k_f32_f32_m2",
            "qgemv_q4_k_f32_f32_m4",
            "qgemv_q4_k_f32_f32_m8",
            "qgemv_silu_q4_k_bf16_m1",
            "qgemv_silu_q4_k_f16_m1",
            "qgemv_silu_q4_k_f32_m1",
            "dequant_q4_k_bf16",
            "dequant_q4_k_f16",
            "dequant_q4_k_f32",
            "qmoe_gate_up_q4_k_bf16",
            "qmoe_gate_up_q4_k_f16",
            "qmoe_gate_up_q4_k_f32",
            "qmoe_down_q4_k_bf16",
            "qmoe_down_q4_k_f16",
            "qmoe_down_q4_k_f32",
            "gmoe_gate_up_q4_k_bf16_bm32",
            "gmoe_gate_up_q4_k_bf16_bm64",
            "gmoe_gate_up_q4_k_f16_bm32",
            "gmoe_gate_up_q4_k_f16_bm64",
            "gmoe_down_q4_k_bf16_bm32",
            "gmoe_down_q4_k_bf16_bm64",
            "gmoe_down_q4_k_f16_bm32",
            "gmoe_down_q4_k_f16_bm64",
            "qmma_q4_k_bf16_bf16_bm32",
            "qmma_q4_k_bf16_bf16_bm64",
            "qmma_q4_k_bf16_bf16_bm128",
            "qmma_q4_k_bf16_f32_bm32",
            "qmma_q4_k_bf16_f32_bm64",
            "qmma_q4_k_bf16_f32_bm128",
            "qmma_q4_k_f16_f16_bm32",
            "qmma_q4_k_f16_f16_bm64",
            "qmma_q4_k_f16_f16_bm128",
            "qmma_q4_k_f16_f32_bm32",
            "qmma_q4_k_f16_f32_bm64",
            "qmma_q4_k_f16_f32_bm128",
        ],
    },
    KernelSource {
        file: "quant_q5_k.cu",
        src: include_str!("../../../../kernels/quant_q5_k.cu"),
        functions: &[
            "qgemv_q5_k_bf16_bf16_m1",
            "qgemv_q5_k_bf16_bf16_m2",
            "qgemv_q5_k_bf16_bf16_m4",
            "qgemv_q5_k_bf16_bf16_m8",
            "qgemv_q5_k_bf16_f32_m1",
            "qgemv_q5_k_bf16_f32_m2",
            "qgemv_q5_k_bf16_f32_m4",
            "qgemv_q5_k_bf16_f32_m8",
            "qgemv_q5_k_f16_f16_m1",
            "qgemv_q5_k_f16_f16_m2",
            "qgemv_q5_k_f16_f16_m4",
            "qgemv_q5_k_f16_f16_m8",
            "qgemv_q5_k_f16_f32_m1",
            "qgemv_q5_k_f16_f32_m2",
            "qgemv_q5_k_f16_f32_m4",
            "qgemv_q5_k_f16_f32_m8",
            "qgemv_q5_k_f32_f32_m1",
            "qgemv_q5_k_f32_f32_m2",
            "qgemv_q5_k_f32_f32_m4",
            "qgemv_q5_k_f32_f32_m8",
            "qgemv_silu_q5_k_bf16_m1",
            "qgemv_silu_q5_k_f16_m1",
            "qgemv_silu_q5_k_f32_m1",
            "dequant_q5_k_bf16",
            "dequant_q5_k_f16",
            "dequant_q5_k_f32",
            "qmoe_gate_up_q5_k_bf16",
            "qmoe_gate_up_q5_k_f16",
            "qmoe_gate_up_q5_k_f32",
            "qmoe_down_q5_k_bf16",
            "qmoe_down_q5_k_f16",
            "qmoe_down_q5_k_f32",
            "gmoe_gate_up_q5_k_bf16_bm32",
            "gmoe_gate_up_q5_k_bf16_bm64",
            "gmoe_gate_up_q5_k_f16_bm32",
            "gmoe_gate_up_q5_k_f16_bm64",
            "gmoe_down_q5_k_bf16_bm32",
            "gmoe_down_q5_k_bf16_bm64",
            "gmoe_down_q5_k_f16_bm32",
            "gmoe_down_q5_k_f16_bm64",
            "qmma_q5_k_bf16_bf16_bm32",
            "qmma_q5_k_bf16_bf16_bm64",
            "qmma_q5_k_bf16_bf16_bm128",
            "qmma_q5_k_bf16_f32_bm32",
            "qmma_q5_k_bf16_f32_bm64",
            "qmma_q5_k_bf16_f32_bm128",
            "qmma_q5_k_f16_f16_bm32",
            "qmma_q5_k_f16_f16_bm64",
            "qmma_q5_k_f16_f16_bm128",
            "qmma_q5_k_f16_f32_bm32",
            "qmma_q5_k_f16_f32_bm64",
            "qmma_q5_k_f16_f32_bm128",
        ],
    },
    KernelSource {
        file: "quant_q6_k.cu",
        src: include_str!("../../../../kernels/quant_q6_k.cu"),
        functions: &[
            "qgemv_q6_k_bf16_bf16_m1",
            "qgemv_q6_k_bf16_bf16_m2",
            "qgemv_q6_k_bf16_bf16_m4",
            "qgemv_q6_k_bf16_bf16_m8",
            "qgemv_q6_k_bf16_f32_m1",
            "qgemv_q6_k_bf16_f32_m2",
            "qgemv_q6_k_bf16_f32_m4",
            "qgemv_q6_k_bf16_f32_m8",
            "qgemv_q6_k_f16_f16_m1",
            "qgemv_q6_k_f16_f16_m2",
            "qgemv_q6_k_f16_f16_m4",
            "qgemv_q6_k_f16_f16_m8",
            "qgemv_q6_k_f16_f32_m1",
            "qgemv_q6_k_f16_f32_m2",
            "qgemv_q6_k_f16_f32_m4",
            "qgemv_q6_k_f16_f32_m8",
            "qgemv_q6_k_f32_f32_m1",
            "qgemv_q6_k_f32_f32_m2",
            "qgemv_q6_k_f32_f32_m4",
            "qgemv_q6_k_f32_f32_m8",
            "qgemv_silu_q6_k_bf16_m1",
            "qgemv_silu_q6_k_f16_m1",
            "qgemv_silu_q6_k_f32_m1",
            "dequant_q6_k_bf16",
            "dequant_q6_k_f16",
            "dequant_q6_k_f32",
            "qmoe_gate_up_q6_k_bf16",
            "qmoe_gate_up_q6_k_f16",
            "qmoe_gate_up_q6_k_f32",
            "qmoe_down_q6_k_bf16",
            "qmoe_down_q6_k_f16",
            "qmoe_down_q6_k_f32",
            "gmoe_gate_up_q6_k_bf16_bm32",
            "gmoe_gate_up_q6_k_bf16_bm64",
            "gmoe_gate_up_q6_k_f16_bm32",
            "gmoe_gate_up_q6_k_f16_bm64",
            "gmoe_down_q6_k_bf16_bm32",
            "gmoe_down_q6_k_bf16_bm64",
            "gmoe_down_q6_k_f16_bm32",
            "gmoe_down_q6_k_f16_bm64",
            "qmma_q6_k_bf16_bf16_bm32",
            "qmma_q6_k_bf16_bf16_bm64",
            "qmma_q6_k_bf16_bf16_bm128",
            "qmma_q6_k_bf16_f32_bm32",
            "qmma_q6_k_bf16_f32_bm64",
            "qmma_q6_k_bf16_f32_bm128",
            "qmma_q6_k_f16_f16_bm32",
            "qmma_q6_k_f16_f16_bm64",
            "qmma_q6_k_f16_f16_bm128",
            "qmma_q6_k_f16_f32_bm32",
            "qmma_q6_k_f16_f32_bm64",
            "qmma_q6_k_f16_f32_bm128",
        ],
    },
    KernelSource {
        file: "quant_fp8.cu",
        src: include_str!("../../../../kernels/quant_fp8.cu"),
        functions: &[
            "qgemv_fp8_bf16_bf16_m1",
            "qgemv_fp8_bf16_bf16_m2",
            "qgemv_fp8_bf16_bf16_m4",
            "qgemv_fp8_bf16_bf16_m8",
            "qgemv_fp8_bf16_f32_m1",
            "qgemv_fp8_bf16_f32_m2",
            "qgemv_fp8_bf16_f32_m4",
            "qgemv_fp8_bf16_f32_m8",
            "qgemv_fp8_f16_f16_m1",
            "qgemv_fp8_f16_f16_m2",
            "qgemv_fp8_f16_f16_m4",
            "qgemv_fp8_f16_f16_m8",
            "qgemv_fp8_f16_f32_m1",
            "qgemv_fp8_f16_f32_m2",
            "qgemv_fp8_f16_f32_m4",
            "qgemv_fp8_f16_f32_m8",
            "qgemv_fp8_f32_f32_m1",
            "qgemv_fp8_f32_f32_m2",
            "qgemv_fp8_f32_f32_m4",
            "qgemv_fp8_f32_f32_m8",
            "qgemv_silu_fp8_bf16_m1",
            "qgemv_silu_fp8_f16_m1",
            "qgemv_silu_fp8_f32_m1",
            "dequant_fp8_bf16",
            "dequant_fp8_f16",
            "dequant_fp8_f32",
            "qmoe_gate_up_fp8_bf16",
            "qmoe_gate_up_fp8_f16",
            "qmoe_gate_up_fp8_f32",
            "qmoe_down_fp8_bf16",
            "qmoe_down_fp8_f16",
            "qmoe_down_fp8_f32",
            "gmoe_gate_up_fp8_bf16_bm32",
            "gmoe_gate_up_fp8_bf16_bm64",
            "gmoe_gate_up_fp8_f16_bm32",
            "gmoe_gate_up_fp8_f16_bm64",
            "gmoe_down_fp8_bf16_bm32",
            "gmoe_down_fp8_bf16_bm64",
            "gmoe_down_fp8_f16_bm32",
            "gmoe_down_fp8_f16_bm64",
            "qmma_fp8_bf16_bf16_bm32",
            "qmma_fp8_bf16_bf16_bm64",
            "qmma_fp8_bf16_bf16_bm128",
            "qmma_fp8_bf16_f32_bm32",
            "qmma_fp8_bf16_f32_bm64",
            "qmma_fp8_bf16_f32_bm128",
            "qmma_fp8_f16_f16_bm32",
            "qmma_fp8_f16_f16_bm64",
            "qmma_fp8_f16_f16_bm128",
            "qmma_fp8_f16_f32_bm32",
            "qmma_fp8_f16_f32_bm64",
            "qmma_fp8_f16_f32_bm128",
            "fp8_quant_rows_bf16",
            "fp8_quant_rows_f16",
            "fp8_weight_scales",
        ],
    },
    KernelSource {
        file: "sampling.cu",
        src: include_str!("../../../../kernels/sampling.cu"),
        functions: &["sample_f32", "logit_bias_f32", "penalty_count_i32"],
    },
];

/// `[*mut c_void; N]` of pointers to the (local, named) kernel arguments, in order.
macro_rules! args {
    ($($a:ident),* $(,)?) => {
        [$(&$a as *const _ as *mut std::ffi::c_void),*]
    };
}

mod attention;
pub(super) use attention::{attention, attention_scratch_len, dynamic_smem_limit};
pub(super) mod quant;

fn cfg(grid: (u32, u32, u32), block: (u32, u32, u32)) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: block,
        shared_mem_bytes: 0,
    }
}

/// A launch dimension or scalar kernel argument as i32, or an error naming it.
fn int(op: &'static str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| Error::invalid(op, format!("{what} = {v} exceeds the kernels' i32 range")))
}

/// Grid dimension x (at most 2^31 - 1).
fn grid_x(op: &'static str, what: &str, v: usize) -> Result<u32> {
    int(op, what, v).map(|v| v as u32)
}

fn aligned16(t: &Tensor) -> bool {
    dptr(t).is_multiple_of(16)
}

/// Threads for a block that strides over `work` items: a multiple of 32 in 32..=max.
fn threads_for(work: usize, max: u32) -> u32 {
    (work.div_ceil(32) * 32).clamp(32, max as usize) as u32
}

/// The one-shot all-reduce's most blocks (`AR_MAX_BLOCKS` in allreduce.cu) and ranks.
pub(super) const AR_MAX_BLOCKS: usize = 64;
pub(super) const AR_MAX_RANKS: usize = 8;

/// The one-shot peer-memory all-reduce of `x` (allreduce.cu): `peers` is this rank's
/// `ArPeers` table, `count` its per-block call counters; x's bytes a multiple of 16, at
/// most `cap`.
pub(super) fn allreduce(
    be: &CudaBackend,
    x: &Tensor,
    peers: u64,
    count: u64,
    (rank, ranks): (usize, usize),
    cap: usize,
) -> Result<()> {
    const OP: &str = "all_reduce";
    let nv = (x.size_bytes() / 16) as i64;
    if nv == 0 {
        return Ok(());
    }
    // Blocks of 256 threads, one 16-byte vector each per pass, at most AR_MAX_BLOCKS:
    // a function of the shape alone, the same on every rank.
    let blocks = (nv as usize).div_ceil(256).clamp(1, AR_MAX_BLOCKS);
    // Each block stages its chunk in its own slot of the staging buffer.
    if (nv as usize).div_ceil(blocks) * 16 > cap / AR_MAX_BLOCKS {
        return Err(Error::invalid(
            OP,
            format!(
                "{} bytes exceed the one-shot all-reduce's {cap}",
                x.size_bytes()
            ),
        ));
    }
    let blocks = blocks as u32;
    let c = cfg((blocks, 1, 1), (256, 1, 1));
    let xp = dptr(x);
    let (rank, ranks) = (int(OP, "rank", rank)?, int(OP, "ranks", ranks)?);
    let cap = cap as i64;
    be.launch(
        be.kernels().allreduce.get(x.dtype())?,
        c,
        &mut args![xp, nv, peers, count, rank, ranks, cap],
    )
}

/// The pushed all-reduce: tensor parallelism's row-parallel projection `x · wᵀ` summed over
/// the ranks into `hidden`, then the residual RMSNorm, as two kernels: `gemv_push_*`
/// (gemv.cu: each CTA stores its outputs straight into every rank's staging), then
/// `pushed_rms_norm_*` (allreduce.cu: waits on the data from every rank, sums in rank
/// order, adds and normalises). `push` is this rank's `ArPush` table and call counter,
/// `cap` a slot's bytes. `None` when the shapes do not suit it (not the gemv's rows, not
/// 16-byte rows, more than a slot): the caller runs matmul, then all_reduce_rms_norm.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemv_push_rms_norm(
    be: &CudaBackend,
    (x, w, hidden): (&Tensor, &Tensor, &Tensor),
    (residual, norm_w, out): (&Tensor, &Tensor, &Tensor),
    eps: f32,
    d: &MatmulDims,
    push: (u64, u64),
    (rank, ranks): (usize, usize),
    (cap, max_rows): (usize, usize),
) -> Option<Result<()>> {
    const OP: &str = "matmul_all_reduce_rms_norm";
    let dt = x.dtype();
    let variant = d.m.next_power_of_two();
    let (ksplit, ctas) = gemv_layout(be, dt, d.n, d.k, variant.min(4));
    let fits = gemv_fits(x, w, d, max_rows)
        && w.dtype() == dt
        && hidden.dtype() == dt
        && (d.n * dt.size()).is_multiple_of(16)
        && d.m * d.n * dt.size() <= cap
        && [hidden, residual, norm_w, out].iter().all(|t| aligned16(t));
    if !fits || d.n == 0 {
        return None;
    }
    // pushed_rms_norm handles up to PUSH_MAX_ROWS (8) rows: the gemv's most.
    debug_assert!(d.m <= GEMV_MAX_ROWS && GEMV_MAX_ROWS <= 8);
    let run = || {
        let kernel = be.kernels().gemv_push(dt, variant)?;
        let c = cfg(
            (grid_x(OP, "n", ctas)?, 1, 1),
            ((GEMV_WARPS * 32) as u32, 1, 1),
        );
        let (xp, wp, bp) = (dptr(x), dptr(w), 0u64);
        let (m, n, k) = (d.m as i32, int(OP, "n", d.n)?, int(OP, "k", d.k)?);
        let ksplit = ksplit as i32;
        let (peers, count) = push;
        let (rank, ranks) = (int(OP, "rank", rank)?, int(OP, "ranks", ranks)?);
        let cap = cap as i64;
        be.launch(
            kernel,
            c,
            &mut args![xp, wp, bp, m, n, k, ksplit, peers, count, rank, ranks, cap],
        )?;
        let nv = d.n * dt.size() / 16;
        // rms_norm's block size, so each thread sums the same elements in the same order.
        let c = cfg((1, 1, 1), (threads_for(nv, 1024), 1, 1));
        let (hp, rp, gp, op) = (dptr(hidden), dptr(residual), dptr(norm_w), dptr(out));
        be.launch(
            be.kernels().pushed_rms_norm.get(dt)?,
            c,
            &mut args![hp, rp, gp, op, m, n, eps, peers, count, rank, ranks, cap],
        )
    };
    Some(run())
}

/// The one-shot all-reduce fused with the residual RMSNorm after it
/// (allreduce.cu's `allreduce_rms_norm`); `None` when the shapes do not suit it (not
/// 16-byte vectors, or more than `cap` bytes): the caller runs the two ops.
#[allow(clippy::too_many_arguments)]
pub(super) fn allreduce_rms_norm(
    be: &CudaBackend,
    (x, residual, w, out): (&Tensor, &Tensor, &Tensor, &Tensor),
    eps: f32,
    d: &RowDims,
    peers: u64,
    count: u64,
    (rank, ranks): (usize, usize),
    cap: usize,
) -> Option<Result<()>> {
    const OP: &str = "all_reduce_rms_norm";
    let dt = x.dtype();
    // Block b stages its rows (b, b + grid, ...) in its own slot of the staging buffer.
    let grid = d.rows.min(AR_MAX_BLOCKS);
    let fits = (d.dim * dt.size()).is_multiple_of(16)
        && [x, residual, w, out].iter().all(|t| aligned16(t))
        && d.rows > 0
        && d.rows.div_ceil(grid.max(1)) * d.dim * dt.size() <= cap / AR_MAX_BLOCKS;
    if !fits {
        return None;
    }
    let run = || {
        let nv = d.dim * dt.size() / 16;
        // rms_norm's block size, so each thread sums the same elements in the same order.
        let c = cfg((grid as u32, 1, 1), (threads_for(nv, 1024), 1, 1));
        let (xp, rp, wp, op) = (dptr(x), dptr(residual), dptr(w), dptr(out));
        let (rows, dim) = (int(OP, "rows", d.rows)?, int(OP, "dim", d.dim)?);
        let (rank, ranks) = (int(OP, "rank", rank)?, int(OP, "ranks", ranks)?);
        let cap = cap as i64;
        be.launch(
            be.kernels().allreduce_rms_norm.get(dt)?,
            c,
            &mut args![xp, rp, wp, op, rows, dim, eps, peers, count, rank, ranks, cap],
        )
    };
    Some(run())
}

pub(super) fn embedding(
    be: &CudaBackend,
    ids: &Tensor,
    table: &Tensor,
    out: &Tensor,
    d: &EmbeddingDims,
) -> Result<()> {
    const OP: &str = "embedding";
    if d.n == 0 || d.hidden == 0 {
        return Ok(());
    }
    let dt = table.dtype();
    let vec = (d.hidden * dt.size()).is_multiple_of(16) && aligned16(table) && aligned16(out);
    let work = if vec {
        d.hidden * dt.size() / 16
    } else {
        d.hidden
    };
    let c = cfg(
        (grid_x(OP, "n", d.n)?, 1, 1),
        (threads_for(work, 256), 1, 1),
    );
    let (ids, table, out) = (dptr(ids), dptr(table), dptr(out));
    let vocab = int(OP, "vocab", d.vocab)?;
    let hidden = int(OP, "hidden", d.hidden)?;
    let vec = vec as i32;
    let first = int(OP, "first", d.first)?;
    be.launch(
        be.kernels().embedding.get(dt)?,
        c,
        &mut args![ids, table, out, vocab, hidden, vec, first],
    )
}

pub(super) fn rms_norm(
    be: &CudaBackend,
    x: &Tensor,
    residual: Option<&Tensor>,
    w: &Tensor,
    eps: f32,
    out: &Tensor,
    d: &RowDims,
) -> Result<()> {
    const OP: &str = "rms_norm";
    if d.rows == 0 || d.dim == 0 {
        return Ok(());
    }
    let dt = x.dtype();
    let vec = (d.dim * dt.size()).is_multiple_of(16)
        && aligned16(x)
        && aligned16(w)
        && aligned16(out)
        && residual.is_none_or(aligned16);
    let work = if vec { d.dim * dt.size() / 16 } else { d.dim };
    let c = cfg(
        (grid_x(OP, "rows", d.rows)?, 1, 1),
        (threads_for(work, 1024), 1, 1),
    );
    let has_res = residual.is_some() as i32;
    let (x, res, w, out) = (dptr(x), residual.map_or(0, dptr), dptr(w), dptr(out));
    let dim = int(OP, "dim", d.dim)?;
    let vec = vec as i32;
    be.launch(
        be.kernels().rms_norm.get(dt)?,
        c,
        &mut args![x, res, w, out, dim, eps, has_res, vec],
    )
}

/// Warps of a `moe.cu` CTA (`MOE_WARPS`), and the experts and chosen experts its router
/// kernel holds (32 lanes x `MOE_PER_LANE`; one lane per chosen expert).
const MOE_WARPS: usize = 8;
const MOE_MAX_EXPERTS: usize = 32 * 16;
const MOE_MAX_TOP_K: usize = 32;

/// A mixture-of-experts layer (`moe.cu`): the router's top k into `ids` / `weights`, the
/// chosen experts' gate/up + SiLU into the scratch, their down projections summed by
/// weight into `out`. Three launches that read the routing from device memory.
pub(super) fn moe(
    be: &CudaBackend,
    a: &crate::args::Moe<'_>,
    d: &crate::ops::MoeDims,
) -> Result<()> {
    const OP: &str = "moe";
    if d.experts > MOE_MAX_EXPERTS || d.top_k > MOE_MAX_TOP_K {
        return Err(Error::invalid(
            OP,
            format!(
                "{} experts, top {}: the CUDA kernels take at most {MOE_MAX_EXPERTS} experts and \
                 top {MOE_MAX_TOP_K}",
                d.experts, d.top_k
            ),
        ));
    }
    for (name, w) in [("gate_up", a.gate_up), ("down", a.down)] {
        if w.dtype().is_quantized() && !aligned16(w) {
            return Err(Error::invalid(
                OP,
                format!("a quantized {name} must start 16-byte aligned"),
            ));
        }
    }
    if d.n == 0 {
        return Ok(());
    }
    let dt = a.x.dtype();
    let k = be.kernels();
    let threads = ((MOE_WARPS * 32) as u32, 1, 1);
    let (n, hidden, inter) = (
        int(OP, "n", d.n)?,
        int(OP, "hidden", d.hidden)?,
        int(OP, "inter", d.inter)?,
    );
    let (experts, top_k) = (d.experts as i32, d.top_k as i32);
    let (ids, wts) = (dptr(a.ids), dptr(a.weights));
    let renorm = a.renormalize as i32;
    let logits = dptr(a.logits);
    // The router's logits are in x's dtype (the launcher of f32 logits is the f32 one).
    let route = k.moe_route.get(a.logits.dtype())?;
    be.launch(
        route,
        cfg(
            (grid_x(OP, "rows", d.n.div_ceil(MOE_WARPS))?, 1, 1),
            threads,
        ),
        &mut args![logits, n, experts, top_k, renorm, ids, wts],
    )?;
    let pairs = d.n * d.top_k;
    // Where the experts are read: the stacks, or the expert cache's slots once filled.
    let (ex, gu_t, dn_t) = match (&a.cache, &d.cache) {
        (Some(c), Some(cd)) => (
            expert_cache(be, a, c, cd, d)?,
            c.gate_up_slots,
            c.down_slots,
        ),
        _ => {
            let half = (a.gate_up.size_bytes() / (2 * d.experts)) as i64;
            let ex = MoeExpertsArg {
                gu: dptr(a.gate_up),
                dn: dptr(a.down),
                slot_of: 0,
                gu_stride: half,
                up_off: half * d.experts as i64,
                dn_stride: (a.down.size_bytes() / d.experts) as i64,
            };
            (ex, a.gate_up, a.down)
        }
    };
    let grouped = match be.moe_gemm_min_tokens() {
        Some(min) => d.n >= min,
        None => pairs >= MOE_GEMM_MIN_PAIRS_PER_EXPERT * d.experts,
    };
    if grouped && grouped_fits(a, d, gu_t, dn_t) {
        return moe_grouped(be, a, d, ex);
    }
    let (x, act) = (dptr(a.x), dptr(a.scratch));
    // 16-byte loads when every row starts 16-byte aligned.
    let rows16 = |len: usize, ts: &[&Tensor]| {
        (len * dt.size()).is_multiple_of(16) && ts.iter().all(|t| aligned16(t))
    };
    let vec_in = rows16(d.hidden, &[a.x, gu_t]) as i32;
    let vec_down = rows16(d.inter, &[a.scratch, dn_t]) as i32;
    let grid_y = |what, v: usize| {
        u32::try_from(v)
            .ok()
            .filter(|&v| v <= 65_535)
            .ok_or_else(|| Error::invalid(OP, format!("{v} {what} (at most 65535)")))
    };
    // A quantized expert tensor's x (x, then the scratch) is read in 16-byte pieces.
    let x_aligned = |w: &Tensor, x: &Tensor| {
        if aligned16(x) {
            Ok(())
        } else {
            Err(Error::invalid(
                OP,
                format!(
                    "{} experts need a 16-byte aligned input",
                    w.dtype().kernel_suffix()
                ),
            ))
        }
    };
    if let DType::Q(fmt) = a.gate_up.dtype() {
        x_aligned(a.gate_up, a.x)?;
        x_aligned(a.gate_up, a.scratch)?;
        let (g, per_cta) = quant::moe_groups(fmt, d.hidden);
        be.launch(
            k.qmoe_gate_up[quant::format_slot(fmt)].get(dt)?,
            cfg(
                (
                    grid_x(OP, "inter", d.inter.div_ceil(per_cta))?,
                    grid_y("(token, expert) pairs", pairs)?,
                    1,
                ),
                threads,
            ),
            &mut args![x, ex, ids, act, hidden, inter, experts, top_k, g],
        )?;
    } else {
        be.launch(
            k.moe_gate_up.get(dt)?,
            cfg(
                (
                    grid_x(OP, "inter", d.inter.div_ceil(MOE_WARPS))?,
                    grid_y("(token, expert) pairs", pairs)?,
                    1,
                ),
                threads,
            ),
            &mut args![x, ex, ids, act, hidden, inter, experts, top_k, vec_in],
        )?;
    }
    let out = dptr(a.out);
    if let DType::Q(fmt) = a.down.dtype() {
        x_aligned(a.down, a.scratch)?;
        // Two outputs per lane group, the lane groups of one warp per CTA.
        let (g, _) = quant::moe_groups(fmt, d.inter);
        be.launch(
            k.qmoe_down[quant::format_slot(fmt)].get(dt)?,
            cfg(
                (
                    grid_x(OP, "hidden", d.hidden.div_ceil(2 * 32 / g as usize))?,
                    grid_y("tokens", d.n)?,
                    1,
                ),
                threads,
            ),
            &mut args![act, ex, ids, wts, out, hidden, inter, experts, top_k, g],
        )
    } else {
        be.launch(
            k.moe_down.get(dt)?,
            cfg(
                (
                    grid_x(OP, "hidden", d.hidden.div_ceil(MOE_WARPS))?,
                    grid_y("tokens", d.n)?,
                    1,
                ),
                threads,
            ),
            &mut args![act, ex, ids, wts, out, hidden, inter, experts, top_k, vec_down],
        )
    }
}

/// (Token, expert) pairs per expert, on average, from which a mixture-of-experts layer runs
/// the grouped GEMM by default (unless `ENCORE_MOE_GEMM_MIN_TOKENS` sets a token count);
/// fewer run one pair at a time. Measured on the H100 under uniform routing
/// (`--router-skew 0`, BENCHMARKS.md), pair kernels against the grouped GEMM, decode step
/// ms: Qwen3-30B-A3B shapes in Q4_K (128 experts, top 8) 7.7 / 11.9 at 8 tokens (0.5 pairs
/// an expert), 11.8 / 16.0 at 16 (1), 20.3 / 21.0 at 32 (2), grouped 24.0 at 64;
/// Mixtral-8x7B shapes (8 experts, top 2) 31.8 / 26.7 at 8 tokens (2 an expert).
pub(super) const MOE_GEMM_MIN_PAIRS_PER_EXPERT: usize = 2;

/// Whether the grouped GEMM runs this layer: x in bf16 / f16, expert rows of whole 32-value
/// groups (the tile loader's unit), the experts' tensors 16-byte aligned.
fn grouped_fits(
    a: &crate::args::Moe<'_>,
    d: &crate::ops::MoeDims,
    gate_up: &Tensor,
    down: &Tensor,
) -> bool {
    matches!(a.x.dtype(), DType::BF16 | DType::F16)
        && d.hidden.is_multiple_of(32)
        && d.inter.is_multiple_of(32)
        && [a.x, gate_up, down, a.scratch].iter().all(|t| aligned16(t))
}

/// The kernels' `MoeExperts` (common.cuh): where expert `e`'s rows lie, in bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct MoeExpertsArg {
    gu: u64,
    dn: u64,
    /// Device address of this layer's `slot_of` row; 0: the stacks (slot = expert).
    slot_of: u64,
    gu_stride: i64,
    up_off: i64,
    dn_stride: i64,
}

/// CTAs per SM of `moe_cache_fill`'s grid (256 threads, 4 reads of 16 bytes in flight
/// each): megabytes in flight, far more than the bus's bandwidth-delay product.
const MOE_FILL_CTAS_PER_SM: u32 = 2;

/// CTAs per SM of a prefetch's `moe_cache_fill` (on the side stream, beside the compute
/// stream's kernels, so it leaves them most of each SM).
pub(super) const MOE_PREFETCH_CTAS_PER_SM: u32 = 1;

/// The expert cache's step (after `moe_route`): `moe_cache_plan` decides the fills,
/// `moe_cache_fill` copies them from host memory into their slots; the experts are then
/// read from the slots.
fn expert_cache(
    be: &CudaBackend,
    a: &crate::args::Moe<'_>,
    c: &crate::args::ExpertCache<'_>,
    cd: &crate::ops::CacheDims,
    d: &crate::ops::MoeDims,
) -> Result<MoeExpertsArg> {
    const OP: &str = "moe (expert cache)";
    if !cd.half_bytes.is_multiple_of(16) || !cd.down_bytes.is_multiple_of(16) {
        return Err(Error::invalid(
            OP,
            format!(
                "an expert's gate rows ({} bytes) and down rows ({} bytes) must be multiples \
                 of 16 bytes to be copied into a slot",
                cd.half_bytes, cd.down_bytes
            ),
        ));
    }
    for (name, t) in [
        ("gate_up", a.gate_up),
        ("down", a.down),
        ("gate_up_slots", c.gate_up_slots),
        ("down_slots", c.down_slots),
    ] {
        if !aligned16(t) {
            return Err(Error::invalid(
                OP,
                format!("{name} must start 16-byte aligned"),
            ));
        }
    }
    if let Some(p) = &c.prefetch {
        for (name, t) in [("prefetch.gate_up", p.gate_up), ("prefetch.down", p.down)] {
            if !aligned16(t) {
                return Err(Error::invalid(
                    OP,
                    format!("{name} must start 16-byte aligned"),
                ));
            }
        }
    }
    let k = be.kernels();
    let (ids, pairs) = (dptr(a.ids), int(OP, "pairs", d.n * d.top_k)?);
    let (experts, layer, slots) = (
        d.experts as i32,
        int(OP, "layer", cd.layer)?,
        int(OP, "slots", cd.slots)?,
    );
    let (slot_of, owner, score, fills, stats) = (
        dptr(c.slot_of),
        dptr(c.owner),
        dptr(c.score),
        dptr(c.fills),
        dptr(c.stats),
    );
    let decay = c.decay;
    // The plan (prefetch: the predicted experts of `plan_layer`, the slots of this call's
    // experts pinned).
    let plan = |stream: &cudarc::driver::CudaStream,
                pdl: bool,
                ids: u64,
                plan_layer: i32,
                fills: u64,
                expert_bytes: i64,
                prefetch: bool|
     -> Result<()> {
        let (pin_ids, pin_pairs, pin_layer) = if prefetch {
            (dptr(a.ids), pairs, layer)
        } else {
            (0u64, 0i32, -1i32)
        };
        let prefetch = prefetch as i32;
        be.launch_on(
            stream,
            pdl,
            None,
            &k.moe_cache_plan,
            cfg((1, 1, 1), (1024, 1, 1)),
            &mut args![
                ids,
                pairs,
                experts,
                plan_layer,
                slots,
                slot_of,
                owner,
                score,
                fills,
                stats,
                decay,
                expert_bytes,
                pin_ids,
                pin_pairs,
                pin_layer,
                prefetch
            ],
        )
    };
    // The fills' copies, from the host stacks `gate_up` / `down` of experts `half` and
    // `down` bytes, over `ctas` CTAs.
    let (gu_slots, dn_slots) = (dptr(c.gate_up_slots), dptr(c.down_slots));
    let (gu_slot, dn_slot) = (cd.gate_up_slot as i64, cd.down_slot as i64);
    let fill = |stream: &cudarc::driver::CudaStream,
                pdl: bool,
                priority: Option<i32>,
                fills: u64,
                gate_up: &Tensor,
                down: &Tensor,
                (half, dn): (usize, usize),
                ctas: u32|
     -> Result<()> {
        let (gu_host, dn_host, half, down) = (dptr(gate_up), dptr(down), half as i64, dn as i64);
        let (kernel, grid, block) = match be.bulk_fill {
            Some(b) => (&k.moe_cache_fill_bulk, b, 32),
            None => (&k.moe_cache_fill, ctas, 256),
        };
        be.launch_on(
            stream,
            pdl,
            priority,
            kernel,
            cfg((grid, 1, 1), (block, 1, 1)),
            &mut args![
                fills, gu_host, dn_host, gu_slots, dn_slots, experts, half, down, gu_slot, dn_slot
            ],
        )
    };
    plan(
        &be.stream,
        be.pdl,
        ids,
        layer,
        fills,
        cd.expert_bytes() as i64,
        false,
    )?;
    // The prefetch: the prediction routed and planned on the compute stream (every table
    // is written in stream order there), its copies forked onto the side stream, where
    // they run one prefetch after another, beside this call's and the next layers' work.
    // Its slots are disjoint from this call's (pinned), so only the call of its layer
    // waits for it, before its own fill (that fill may take a slot a wrong prediction is
    // still copying into) and its experts.
    let copies = match (&c.prefetch, cd.prefetch) {
        (Some(p), Some(pd)) => {
            let (n, top_k) = (int(OP, "n", d.n)?, d.top_k as i32);
            let renorm = a.renormalize as i32;
            let (logits, pids, pwts, pfills) =
                (dptr(p.logits), dptr(p.ids), dptr(p.weights), dptr(p.fills));
            be.launch(
                k.moe_route.get(p.logits.dtype())?,
                cfg(
                    (grid_x(OP, "rows", d.n.div_ceil(MOE_WARPS))?, 1, 1),
                    ((MOE_WARPS * 32) as u32, 1, 1),
                ),
                &mut args![logits, n, experts, top_k, renorm, pids, pwts],
            )?;
            let pl = int(OP, "prefetch layer", pd.layer)?;
            plan(
                &be.stream,
                be.pdl,
                pids,
                pl,
                pfills,
                pd.expert_bytes() as i64,
                true,
            )?;
            Some((p, pd, pfills))
        }
        _ => None,
    };
    let ctas = be.info.sm_count as u32 * be.prefetch_ctas_per_sm;
    let side_fill = |side: &cudarc::driver::CudaStream, priority: i32| -> Result<()> {
        let (p, pd, pfills) = copies.as_ref().expect("a prefetch");
        fill(
            side,
            false,
            Some(priority),
            *pfills,
            p.gate_up,
            p.down,
            (pd.half_bytes, pd.down_bytes),
            ctas,
        )
    };
    be.expert_side(copies.is_some().then_some(&side_fill as _))?;
    fill(
        &be.stream,
        be.pdl,
        None,
        fills,
        a.gate_up,
        a.down,
        (cd.half_bytes, cd.down_bytes),
        be.info.sm_count as u32 * MOE_FILL_CTAS_PER_SM,
    )?;
    let half = cd.half_bytes as i64;
    Ok(MoeExpertsArg {
        gu: gu_slots,
        dn: dn_slots,
        slot_of: slot_of + (cd.layer * d.experts * 4) as u64,
        gu_stride: gu_slot,
        up_off: half,
        dn_stride: dn_slot,
    })
}

/// The grouped path's workspace for `pairs` (token, expert) pairs: `(sorted, tiles, y,
/// bytes in all)`, byte offsets of the pairs sorted by expert (i32, room for every
/// expert's run padded to 64 rows), the tiles' experts (i32, room for 32-row tiles) and
/// the pairs' down products (`[pairs, hidden]` of `dt`), each 256-byte aligned.
fn moe_workspace(
    pairs: usize,
    hidden: usize,
    experts: usize,
    dt: DType,
) -> (usize, usize, usize, usize) {
    let al = |v: usize| v.div_ceil(256) * 256;
    let sorted_len = pairs + experts * (GMOE_MAX_TILE - 1);
    let tiles = (pairs + experts * (GMOE_MIN_TILE - 1)).div_ceil(GMOE_MIN_TILE);
    let t_off = al(sorted_len * 4);
    let y_off = t_off + al(tiles * 4);
    (0, t_off, y_off, y_off + al(pairs * hidden * dt.size()))
}

/// Rows of the grouped GEMM's tiles (`GMOE_TILES`).
const GMOE_MIN_TILE: usize = 32;
const GMOE_MAX_TILE: usize = 64;

/// `Backend::moe_workspace_bytes` on CUDA.
pub(super) fn moe_workspace_bytes(
    n: usize,
    hidden: usize,
    experts: usize,
    top_k: usize,
    dt: DType,
) -> usize {
    match dt {
        DType::BF16 | DType::F16 => moe_workspace(n * top_k, hidden, experts, dt).3,
        _ => 0,
    }
}

/// The grouped path (after `moe_route`): `moe_align` sorts the pairs by expert into tiles
/// of `bm` rows (64 where an expert averages more than 32 pairs, else 32), `gmoe_gate_up`
/// writes the activations into the scratch, `gmoe_down` each pair's down product into the
/// workspace, and `moe_combine` sums each token's slots in order.
fn moe_grouped(
    be: &CudaBackend,
    a: &crate::args::Moe<'_>,
    d: &crate::ops::MoeDims,
    ex: MoeExpertsArg,
) -> Result<()> {
    const OP: &str = "moe (grouped GEMM)";
    let dt = a.x.dtype();
    let pairs = d.n * d.top_k;
    let (s_off, t_off, y_off, need) = moe_workspace(pairs, d.hidden, d.experts, dt);
    if a.workspace.size_bytes() < need || !aligned16(a.workspace) {
        return Err(Error::invalid(
            OP,
            format!(
                "{} tokens need a 16-byte aligned workspace of {need} bytes \
                 (Backend::moe_workspace_bytes), got {}",
                d.n,
                a.workspace.size_bytes()
            ),
        ));
    }
    let bm = if pairs > 32 * d.experts {
        GMOE_MAX_TILE
    } else {
        GMOE_MIN_TILE
    };
    let sorted_len = pairs + d.experts * (bm - 1);
    let max_tiles = sorted_len.div_ceil(bm);
    let base = dptr(a.workspace);
    let (sorted, tiles, y) = (
        base + s_off as u64,
        base + t_off as u64,
        base + y_off as u64,
    );
    let k = be.kernels();
    let (experts, top_k) = (d.experts as i32, d.top_k as i32);
    let (np, nsorted, ntiles) = (
        int(OP, "pairs", pairs)?,
        int(OP, "sorted rows", sorted_len)?,
        int(OP, "tiles", max_tiles)?,
    );
    let bmi = bm as i32;
    let ids = dptr(a.ids);
    be.launch(
        &k.moe_align,
        cfg((1, 1, 1), (1024, 1, 1)),
        &mut args![ids, np, experts, bmi, sorted, nsorted, tiles, ntiles],
    )?;
    let tiles_y = u32::try_from(max_tiles)
        .ok()
        .filter(|&v| v <= 65_535)
        .ok_or_else(|| Error::invalid(OP, format!("{max_tiles} tiles (at most 65535)")))?;
    let fmt = |t: &Tensor| match t.dtype() {
        DType::Q(f) => Some(f),
        _ => None,
    };
    let (hidden, inter) = (int(OP, "hidden", d.hidden)?, int(OP, "inter", d.inter)?);
    let smem = quant::qmma_smem_bytes(bm) as u32;
    let (x, act) = (dptr(a.x), dptr(a.scratch));
    let mut c = cfg(
        (grid_x(OP, "inter", d.inter.div_ceil(64))?, tiles_y, 1),
        (256, 1, 1),
    );
    c.shared_mem_bytes = smem;
    be.launch(
        k.gmoe(fmt(a.gate_up), dt, true, bm)?,
        c,
        &mut args![x, ex, sorted, tiles, act, hidden, inter, experts, top_k],
    )?;
    let mut c = cfg(
        (grid_x(OP, "hidden", d.hidden.div_ceil(128))?, tiles_y, 1),
        (256, 1, 1),
    );
    c.shared_mem_bytes = smem;
    be.launch(
        k.gmoe(fmt(a.down), dt, false, bm)?,
        c,
        &mut args![act, ex, sorted, tiles, y, inter, hidden, experts, top_k],
    )?;
    let total = d.n * d.hidden;
    let (wts, out) = (dptr(a.weights), dptr(a.out));
    let total_i = total as i64;
    be.launch(
        k.moe_combine.get(dt)?,
        cfg(
            (grid_x(OP, "elements", total.div_ceil(256))?, 1, 1),
            (256, 1, 1),
        ),
        &mut args![y, ids, wts, out, total_i, hidden, experts, top_k],
    )
}

/// `x += sigmoid(gate) * y` (`moe_shared_add`): Qwen2-MoE's shared expert.
pub(super) fn sigmoid_gate_add(
    be: &CudaBackend,
    x: &Tensor,
    gate: &Tensor,
    y: &Tensor,
    d: &RowDims,
) -> Result<()> {
    const OP: &str = "sigmoid_gate_add";
    let total = d.rows * d.dim;
    if total == 0 {
        return Ok(());
    }
    const THREADS: usize = 256;
    let c = cfg(
        (grid_x(OP, "elements", total.div_ceil(THREADS))?, 1, 1),
        (THREADS as u32, 1, 1),
    );
    let (xp, gp, yp) = (dptr(x), dptr(gate), dptr(y));
    let (total, dim) = (total as i64, int(OP, "dim", d.dim)?);
    be.launch(
        be.kernels().moe_shared_add.get(x.dtype())?,
        c,
        &mut args![xp, gp, yp, total, dim],
    )
}

pub(super) fn silu_mul(
    be: &CudaBackend,
    gate_up: &Tensor,
    out: &Tensor,
    d: &RowDims,
) -> Result<()> {
    const OP: &str = "silu_mul";
    if d.rows == 0 || d.dim == 0 {
        return Ok(());
    }
    let dt = gate_up.dtype();
    let vec = (d.dim * dt.size()).is_multiple_of(16) && aligned16(gate_up) && aligned16(out);
    let cols = if vec { d.dim * dt.size() / 16 } else { d.dim };
    const THREADS: usize = 256;
    let c = cfg(
        (cols.div_ceil(THREADS) as u32, d.rows.min(65_535) as u32, 1),
        (THREADS as u32, 1, 1),
    );
    let (gu, out) = (dptr(gate_up), dptr(out));
    let rows = int(OP, "rows", d.rows)?;
    let inter = int(OP, "inter", 2 * d.dim).map(|_| d.dim as i32)?;
    let vec = vec as i32;
    be.launch(
        be.kernels().silu_mul.get(dt)?,
        c,
        &mut args![gu, out, rows, inter, vec],
    )
}

/// Warps of one qkv_rope CTA (`QKV_WARPS` in qkv_rope.cu).
const QKV_WARPS: usize = 4;

pub(super) fn qkv_rope_write(be: &CudaBackend, a: &QkvRope<'_>, d: &QkvRopeDims) -> Result<()> {
    const OP: &str = "qkv_rope_write";
    let heads = d.num_heads + 2 * d.num_kv_heads;
    if d.n == 0 || heads == 0 || d.head_dim == 0 {
        return Ok(());
    }
    if d.head_dim > 256 {
        return Err(Error::invalid(
            OP,
            format!("head_dim = {} is not supported (at most 256)", d.head_dim),
        ));
    }
    let items = d.n * heads;
    let c = cfg(
        (grid_x(OP, "n * heads", items.div_ceil(QKV_WARPS))?, 1, 1),
        ((QKV_WARPS * 32) as u32, 1, 1),
    );
    int(OP, "n * heads * head_dim", items * d.head_dim)?;
    let (qkv, pos, cs, sm) = (
        dptr(a.qkv),
        dptr(a.positions),
        dptr(a.cos_sin),
        dptr(a.slot_mapping),
    );
    let (qn, kn) = a.head_norm.map_or((0, 0), |(q, k)| (dptr(q), dptr(k)));
    let has_norm = a.head_norm.is_some() as i32;
    let eps = a.eps;
    let (q_out, kc, vc) = (dptr(a.q_out), dptr(a.k_cache), dptr(a.v_cache));
    let kv8 = a.k_cache.dtype() == DType::F8E4M3;
    let (k_inv, v_inv) = a.kv_scale.inverse();
    let n = int(OP, "n", d.n)?;
    let nh = int(OP, "num_heads", d.num_heads)?;
    let nkv = int(OP, "num_kv_heads", d.num_kv_heads)?;
    let hd = d.head_dim as i32;
    let rot = d.rot as i32; // <= head_dim
    let maxp = int(OP, "max_positions", d.max_positions).unwrap_or(i32::MAX);
    let num_slots = (d.num_blocks as u64 * d.block_size as u64).min(i64::MAX as u64) as i64;
    be.launch(
        be.kernels().qkv_rope[usize::from(kv8)].get(a.qkv.dtype())?,
        c,
        &mut args![
            qkv, qn, kn, has_norm, eps, pos, cs, sm, q_out, kc, vc, n, nh, nkv, hd, rot, maxp,
            num_slots, k_inv, v_inv
        ],
    )
}

// ---------------------------------------------------------------------------------------
// GEMV (matmul with few rows)

/// Most rows of x the gemv kernels take (the largest `gemv_*_m*` variant).
pub(super) const GEMV_MAX_ROWS: usize = 8;
/// Rows up to which matmul takes the gemv kernels by default. Measured on H100 (decode
/// step, graph mode, BENCHMARKS.md): 1 row is 9-17% faster than cuBLASLt on the 0.5B and
/// 8B shapes; 2 rows is faster on 0.5B but 3% slower on 8B; 3..8 rows are slower (x is
/// re-read through L1 for every row pair: a tensor-core variant is future work).
pub(super) const GEMV_DEFAULT_ROWS: usize = 1;
/// Warps of one gemv CTA (`GEMV_WARPS` in gemv.cu).
const GEMV_WARPS: usize = 8;

/// Whether [`gemv`] can run this matmul: few rows, k a whole number of 16-byte vectors,
/// 16-byte aligned x and w (so every row of both is aligned).
pub(super) fn gemv_fits(x: &Tensor, w: &Tensor, d: &MatmulDims, max_rows: usize) -> bool {
    let v = 16 / x.dtype().size();
    d.m >= 1
        && d.m <= max_rows.min(GEMV_MAX_ROWS)
        && d.k.is_multiple_of(v)
        && aligned16(x)
        && aligned16(w)
}

/// CTAs per SM the gemv's k split aims for: enough loads in flight to stream at the copy
/// rate. Eight, not two, took 1.5% off an 8B decode step on the H100 and 4.4% on the H200
/// (the o and down projections, 4096 and 8192 rows, streamed 7-17% faster; BENCHMARKS.md).
pub(super) const GEMV_CTAS_PER_SM: usize = 8;

/// Chunks of k a gemv warp keeps in flight (`GEMV_UNROLL` in gemv.cu, at one row a warp):
/// a warp with fewer left loads them one at a time.
const GEMV_ROUND: usize = 4;

/// `(ksplit, CTAs)` of a gemv over `n` rows of `k` with `rows_per_warp` rows per warp:
/// split k over more warps while there are too few CTAs to keep every SM streaming
/// ([`GEMV_CTAS_PER_SM`], `ENCORE_GEMV_CTAS_PER_SM`) and each warp still gets a
/// 16-byte-per-lane chunk of k; once there are half that many CTAs, not below a whole
/// round of loads a warp ([`GEMV_ROUND`] chunks): 8B's o projection over 2 GPUs (4,096 x
/// 2,048) streamed at 2,620-2,640 GB/s as 1,024 CTAs of 4 chunks a warp, 2,230 as 2,048
/// CTAs of 2 (H200, BENCHMARKS.md). Among Llama-3 8B and 70B shards it binds that one
/// and 8B's q/k/v, o and down over 4 GPUs, 8B's down and gate/up and 70B's o over 8.
fn gemv_layout(
    be: &CudaBackend,
    dt: DType,
    n: usize,
    k: usize,
    rows_per_warp: usize,
) -> (usize, usize) {
    let nchunks = k.div_ceil(32 * 16 / dt.size());
    let ctas = |ksplit: usize| (n * ksplit).div_ceil(GEMV_WARPS * rows_per_warp);
    let target = be.gemv_ctas_per_sm() * be.sm_count();
    let mut ksplit = 1;
    while ksplit < GEMV_WARPS
        && ctas(ksplit) < target
        && 2 * ksplit <= nchunks
        && (2 * ctas(ksplit) < target || nchunks >= 2 * ksplit * GEMV_ROUND)
    {
        ksplit *= 2;
    }
    (ksplit, n.div_ceil(GEMV_WARPS / ksplit * rows_per_warp))
}

/// `out = silu_mul(x · wᵀ)` for one row of x in one gemv pass (`gemv_silu_*`): w is the
/// merged `[2 * inter, k]` gate/up weight. The caller checked shapes and [`gemv_fits`].
pub(super) fn gemv_silu(
    be: &CudaBackend,
    x: &Tensor,
    w: &Tensor,
    out: &Tensor,
    d: &MatmulDims,
) -> Result<()> {
    const OP: &str = "matmul_silu_mul (gemv)";
    let inter = d.n / 2;
    if inter == 0 {
        return Ok(());
    }
    let dt = x.dtype();
    let layout = gemv_layout(be, dt, inter, d.k, 1);
    launch_gemv_silu(
        be,
        OP,
        be.kernels().gemv_silu.get(dt)?,
        layout,
        x,
        w,
        out,
        d,
    )
}

/// Launch a one-row fused gate/up + SiLU kernel of the gemv family (dense or quantized):
/// `layout` is its `(ksplit, CTAs)` for `d.n / 2` outputs.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch_gemv_silu(
    be: &CudaBackend,
    op_name: &'static str,
    kernel: &Kernel,
    (ksplit, ctas): (usize, usize),
    x: &Tensor,
    w: &Tensor,
    out: &Tensor,
    d: &MatmulDims,
) -> Result<()> {
    let c = cfg(
        (grid_x(op_name, "inter", ctas)?, 1, 1),
        ((GEMV_WARPS * 32) as u32, 1, 1),
    );
    let (xp, wp, op) = (dptr(x), dptr(w), dptr(out));
    let n = int(op_name, "2 * inter", d.n).map(|n| n / 2)?;
    let k = int(op_name, "k", d.k)?;
    let ksplit = ksplit as i32;
    be.launch(kernel, c, &mut args![xp, wp, op, n, k, ksplit])
}

/// `out = x · wᵀ (+ bias)` for `m <= GEMV_MAX_ROWS` rows (checked by [`gemv_fits`]).
pub(super) fn gemv(
    be: &CudaBackend,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
    d: &MatmulDims,
) -> Result<()> {
    const OP: &str = "matmul (gemv)";
    if d.n == 0 {
        return Ok(());
    }
    let dt = x.dtype();
    let variant = d.m.next_power_of_two();
    let layout = gemv_layout(be, dt, d.n, d.k, variant.min(4));
    let kernel = be.kernels().gemv(dt, out.dtype(), variant)?;
    launch_gemv(be, OP, kernel, layout, x, w, bias, out, d)
}

/// Launch a gemv-family kernel (dense or quantized) for `d.m <= GEMV_MAX_ROWS` rows:
/// `layout` is its `(ksplit, CTAs)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch_gemv(
    be: &CudaBackend,
    op_name: &'static str,
    kernel: &Kernel,
    (ksplit, ctas): (usize, usize),
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
    d: &MatmulDims,
) -> Result<()> {
    let c = cfg(
        (grid_x(op_name, "n", ctas)?, 1, 1),
        ((GEMV_WARPS * 32) as u32, 1, 1),
    );
    let (xp, wp, bp, op) = (dptr(x), dptr(w), bias.map_or(0, dptr), dptr(out));
    let m = d.m as i32; // <= GEMV_MAX_ROWS
    let n = int(op_name, "n", d.n)?;
    let k = int(op_name, "k", d.k)?;
    let ksplit = ksplit as i32;
    be.launch(kernel, c, &mut args![xp, wp, bp, op, m, n, k, ksplit])
}

// ---------------------------------------------------------------------------------------
// Sampling

/// Threads per row (`SAMPLE_THREADS` in sampling.cu).
const SAMPLE_THREADS: u32 = 1024;

pub(super) fn logit_bias(
    be: &CudaBackend,
    logits: &Tensor,
    b: &LogitBias<'_>,
    (batch, vocab, k): (usize, usize, usize),
) -> Result<()> {
    const OP: &str = "logit_bias";
    if batch == 0 || k == 0 {
        return Ok(());
    }
    let c = cfg((grid_x(OP, "batch", batch)?, 1, 1), (128, 1, 1));
    let (l, ids, vals, count) = (dptr(logits), dptr(b.ids), dptr(b.vals), dptr(b.count));
    let vocab = int(OP, "vocab", vocab)?;
    let k = int(OP, "K", k)?;
    be.launch(
        &be.kernels().logit_bias_f32,
        c,
        &mut args![l, ids, vals, count, vocab, k],
    )
}

pub(super) fn penalty_count(
    be: &CudaBackend,
    counts: &Tensor,
    slots: &Tensor,
    tokens: &Tensor,
    (rows, vocab, n): (usize, usize, usize),
) -> Result<()> {
    const OP: &str = "penalty_count";
    if n == 0 {
        return Ok(());
    }
    let c = cfg((1, 1, 1), (32, 1, 1));
    let (p, s, t) = (dptr(counts), dptr(slots), dptr(tokens));
    let (n, rows, vocab) = (
        int(OP, "n", n)?,
        int(OP, "slots", rows)?,
        int(OP, "vocab", vocab)?,
    );
    be.launch(
        &be.kernels().penalty_count_i32,
        c,
        &mut args![p, s, t, n, rows, vocab],
    )
}

pub(super) fn sample(
    be: &CudaBackend,
    logits: &Tensor,
    p: &Sampling<'_>,
    out: &Tensor,
    d: &SampleDims,
) -> Result<()> {
    const OP: &str = "sample";
    if d.batch == 0 {
        return Ok(());
    }
    let counts_aligned = p.penalties.as_ref().is_none_or(|q| aligned16(q.counts));
    let vec = (d.vocab.is_multiple_of(4) && aligned16(logits) && counts_aligned) as i32;
    let c = cfg(
        (grid_x(OP, "batch", d.batch)?, 1, 1),
        (SAMPLE_THREADS, 1, 1),
    );
    let (l, t, k, tp, mp, s, o) = (
        dptr(logits),
        dptr(p.temperature),
        dptr(p.top_k),
        dptr(p.top_p),
        dptr(p.min_p),
        dptr(p.seeds),
        dptr(out),
    );
    // Null pointers tell the kernel a feature is off.
    let (counts, slot, rep, freq, pres) = match &p.penalties {
        Some(q) => (
            dptr(q.counts),
            dptr(q.slot),
            dptr(q.repetition),
            dptr(q.frequency),
            dptr(q.presence),
        ),
        None => (0, 0, 0, 0, 0),
    };
    let (num, tok, ids, top, target) = match &p.logprobs {
        Some(q) => (
            dptr(q.num),
            dptr(q.token),
            dptr(q.top_ids),
            dptr(q.top),
            q.target.map_or(0, dptr),
        ),
        None => (0, 0, 0, 0, 0),
    };
    let (mask_bits, mask_on) = match &p.mask {
        Some(m) => (dptr(m.bits), dptr(m.on)),
        None => (0, 0),
    };
    // row * mask_words indexes the bits in i64.
    let mask_words = int(OP, "mask words", d.mask_words)?;
    let slots = int(OP, "penalty slots", d.slots)?;
    // slots * vocab indexes counts in i64; top_n <= MAX_TOP_LOGPROBS (check_sample).
    let top_n = d.top_n as i32;
    // The kernel walks the row in tiles of 4 * SAMPLE_THREADS with i32 indices.
    let vocab = int(OP, "vocab", d.vocab + 4 * SAMPLE_THREADS as usize).map(|_| d.vocab as i32)?;
    be.launch(
        &be.kernels().sample_f32,
        c,
        &mut args![
            l, t, k, tp, mp, s, o, counts, slot, rep, freq, pres, slots, num, tok, ids, top, top_n,
            target, mask_bits, mask_on, mask_words, vocab, vec
        ],
    )
}
