//! LayerNorm with a bias on CUDA (`layer_norm_*` of rms_norm.cu, and the unfused paths
//! `norm_add_norm` and the tensor-parallel norms take for it): the kernel checks of
//! `encore info` that name it, and a StableLM model on CUDA, eager and replayed from
//! graphs, against the CPU backend.

use encore_core::model::config::ModelConfig;

use super::*;

/// Every LayerNorm check of `testing::cases` (with and without the residual, out aliasing
/// x, odd widths, bf16/f16/f32, and `norm_add_norm` of two LayerNorms) on fresh inputs.
#[test]
#[ignore = "needs a CUDA device"]
fn layer_norm_kernels_match_cpu() {
    let _serial = serial();
    let be = cuda();
    let results = testing::check_backend_against_cpu(be.as_ref(), fresh_seed()).unwrap();
    let ln: Vec<_> = results
        .into_iter()
        .filter(|r| r.op.starts_with("layer_norm") || r.op.contains("(layer_norm)"))
        .collect();
    for op in [
        "layer_norm",
        "layer_norm(residual): out",
        "layer_norm(residual): residual",
        "layer_norm(residual, out=x): out",
        "norm_add_norm(layer_norm): out",
        "norm_add_norm(layer_norm): residual",
    ] {
        assert!(ln.iter().any(|r| r.op == op), "no check named `{op}`");
    }
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        assert!(
            ln.iter().any(|r| r.dtype == dtype),
            "no {dtype} LayerNorm check"
        );
    }
    assert_all_pass(&ln);
}

/// tiny-stablelm (LayerNorms with a bias, partial rotary, q/k/v biases) on CUDA, eager and
/// in decode graphs, against the CPU backend's eager run: a mixed prefill, then decode
/// steps of batches that are not bucket sizes; every step's logits within f32 rounding.
#[test]
#[ignore = "needs a CUDA device"]
fn stablelm_on_cuda_matches_cpu_eager_and_in_graphs() {
    super::family::runs_on_cuda_as_on_cpu(ModelConfig::dummy("tiny-stablelm").unwrap());
}
