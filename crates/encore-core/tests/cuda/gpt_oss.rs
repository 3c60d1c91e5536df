//! gpt-oss on CUDA: the kernel checks of `encore info` that name its variants (attention
//! with sinks, decode / prefill / split-K / FP8 cache; the clamped SwiGLU), and the
//! tiny-gpt-oss model on CUDA, eager and replayed from graphs, against the CPU backend;
//! dummy:gpt-oss-120b in MXFP4 on one GPU, resident and under the expert cache.

use encore_core::model::config::ModelConfig;

use super::*;

/// Every check of `testing::cases` with attention sinks or the clamped SwiGLU (`act_mul
/// swiglu_oai`, `matmul_act_mul swiglu_oai`) on fresh inputs, bf16/f16/f32.
#[test]
#[ignore = "needs a CUDA device"]
fn gpt_oss_kernels_match_cpu() {
    let _serial = serial();
    let be = cuda();
    let results = testing::check_backend_against_cpu(be.as_ref(), fresh_seed()).unwrap();
    let ours: Vec<_> = results
        .into_iter()
        .filter(|r| r.op.contains("sinks") || r.op.contains("swiglu_oai"))
        .collect();
    for op in [
        "attention(decode, sinks)",
        "attention(prefill, sinks)",
        "attention(decode, sinks, fp8 cache)",
        "attention(prefill, window, sinks)",
    ] {
        assert!(
            ours.iter().any(|r| r.op.starts_with(op)),
            "no check named `{op}`"
        );
    }
    assert!(ours.iter().any(|r| r.op.contains("act_mul swiglu_oai")));
    assert_all_pass(&ours);
}

/// tiny-gpt-oss (attention sinks, windows of 6 alternating with full layers, YaRN, q/k/v
/// and o biases, 5 biased experts top 3 with the clamped SwiGLU) on CUDA, eager and in
/// decode graphs, against the CPU backend's eager run: a mixed prefill of prompts of 3,
/// 10 and 17 tokens (past the window), then decode steps; every step's logits within f32
/// rounding.
#[test]
#[ignore = "needs a CUDA device"]
fn gpt_oss_on_cuda_matches_cpu_eager_and_in_graphs() {
    super::family::runs_on_cuda_as_on_cpu(ModelConfig::dummy("tiny-gpt-oss").unwrap());
}

/// The same with its experts in MXFP4 (`--quantization mxfp4`: dummy weights quantized at
/// load; the CPU decodes the same blocks): `quant_mxfp4.cu`'s expert kernels with the
/// biases and the clamped SwiGLU, eager and in graphs.
#[test]
#[ignore = "needs a CUDA device"]
fn gpt_oss_with_mxfp4_experts_on_cuda_matches_cpu_eager_and_in_graphs() {
    super::family::runs_on_cuda_as_on_cpu(tiny_gpt_oss_mxfp4());
}

/// tiny-gpt-oss with rows of whole MXFP4 blocks (hidden 128, experts 64 wide) and its
/// experts in MXFP4.
pub fn tiny_gpt_oss_mxfp4() -> ModelConfig {
    let mut cfg = ModelConfig::dummy("tiny-gpt-oss").unwrap();
    cfg.hidden_size = 128;
    cfg.moe.as_mut().unwrap().expert_intermediate = 64;
    cfg.weights.experts = Some(encore_core::quant::QuantFormat::Mxfp4);
    cfg.check_formats().unwrap();
    cfg
}

/// `dummy:gpt-oss-120b` with MXFP4 experts (`--quantization mxfp4`) on one GPU: its ~65 GB
/// of weights load (each expert quantized on the host as it is drawn) and decode in
/// graphs (a GPU of 80 GB or more); then with a budget of 24 GiB the expert cache streams
/// its experts and gives the same greedy tokens.
#[test]
#[ignore = "needs a CUDA device"]
fn gpt_oss_120b_in_mxfp4_fits_one_gpu_and_streams_its_experts_with_the_same_tokens() {
    use encore_core::engine::{Engine, EngineConfig, KvSizing};
    use encore_core::graph::BucketPolicy;
    use encore_core::model::formats::Quantization;
    use encore_core::model::open_model;
    use encore_core::offload::{OffloadConfig, Policy, WeightBudget};
    use encore_core::progress::NoProgress;
    use encore_core::quant::QuantFormat;
    use encore_core::runner::GraphConfig;
    let _serial = serial();
    let be = cuda();
    let mut files = open_model("dummy:gpt-oss-120b").unwrap();
    files
        .quantize(Quantization::To(QuantFormat::Mxfp4))
        .unwrap();
    let prompts: Vec<Vec<u32>> = vec![
        (0..150).map(|i| (i * 7 + 3) % 250).collect(),
        (0..9).map(|i| (i * 13 + 1) % 250).collect(),
    ];
    let run = |offload: Option<OffloadConfig>| {
        let cfg = EngineConfig {
            graphs: Some(GraphConfig {
                decode: BucketPolicy::PowersOfTwo { max: 4 },
                mixed: BucketPolicy::SglangLike { max: 256 },
                verify: 0,
            }),
            offload,
            ..EngineConfig::new(DType::BF16, 16, 256, 4, 512, KvSizing::Blocks(256))
        };
        let Engine { mut runner, report } =
            Engine::new(be.as_ref(), files.clone(), &cfg, &NoProgress).unwrap();
        let tokens = common::generate_greedy(&mut runner, &prompts, &[], 16, true);
        (tokens, report)
    };
    let (want, report) = run(None);
    let weights = report.need.weights as f64;
    assert!((64e9..66e9).contains(&weights), "{weights}");
    let budget = OffloadConfig {
        budget: WeightBudget::Bytes(24 << 30),
        policy: Policy::Experts,
        expert_prefetch: false,
    };
    let (got, report) = run(Some(budget));
    let r = report.offload.expect("a budget below the weights");
    assert_eq!(r.policy, Some(Policy::Experts));
    assert!(r.expert_slots < 36 * 128, "{r:?}");
    assert_eq!(got, want);
}
