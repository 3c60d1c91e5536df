//! gpt-oss under weight budgets. The expert cache keeps its sinks, router and biases
//! resident and streams its routed experts, MXFP4 or dense, through the slots inside the
//! graphs: every budget of [`check_expert_cache_budgets`] gives the resident tokens. The
//! planned policy streams its layers (the sinks and biases with the ops that read them)
//! and gives them too; the LRU policy is refused naming the sinks. On CUDA
//! (`#[ignore = "needs a CUDA device"]`): the expert cache with MXFP4 experts, on the small
//! model and on four layers of gpt-oss-20b's shapes, and the planned policy.

use super::budgets::{check_expert_cache_budgets, expert_layout};
use super::*;
use common::gpt_oss::splittable;

/// A small gpt-oss whose 16 experts a layer (MXFP4 with `mxfp4`) are most of its bytes.
fn files(mxfp4: bool) -> ModelFiles {
    ModelFiles {
        config: splittable(16, mxfp4),
        source: WeightSource::Dummy { seed: 13 },
    }
}

#[test]
fn gpt_oss_experts_under_the_expert_cache_give_the_resident_tokens() {
    for mxfp4 in [true, false] {
        check_expert_cache_budgets(&slow_cpu(), &files(mxfp4), DType::F32, config);
    }
}

#[test]
fn gpt_oss_under_planned_budgets_gives_the_resident_tokens() {
    check_planned(&slow_cpu(), config);
}

/// The planned policy on `be` at half the weights and at the floor, dense and MXFP4
/// experts, eagerly and in graphs: the resident tokens (attention reads the sinks from
/// their ring slot after q/k/v's op; o_proj's bias comes with its announcement).
fn check_planned(be: &dyn Backend, config: impl Fn(bool, Option<OffloadConfig>) -> EngineConfig) {
    for mxfp4 in [false, true] {
        let files = files(mxfp4);
        let (want, _) = run_files(be, &files, &config(false, None)).unwrap();
        let floor = order(&files.config).floor().bytes;
        for b in [WeightBudget::Percent(50.0), WeightBudget::Bytes(floor)] {
            for graphs in [false, true] {
                let oc = OffloadConfig {
                    budget: b,
                    policy: Policy::Planned,
                    expert_prefetch: false,
                };
                let (got, boot) = run_files(be, &files, &config(graphs, Some(oc))).unwrap();
                assert_eq!(boot.offload.unwrap().policy, Some(Policy::Planned));
                assert_eq!(got, want, "mxfp4 {mxfp4}, budget {b:?}, graphs {graphs}");
            }
        }
    }
}

#[test]
fn gpt_oss_under_the_lru_policy_is_refused_naming_its_sinks() {
    let cfg = config(false, budget(50.0, Policy::Lru));
    let err = run_files(&CpuBackend::new(), &files(false), &cfg)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("attention sinks") && err.contains("--offload-policy lru"),
        "{err}"
    );
}

/// The expert cache on CUDA, bf16, MXFP4 experts: see [`check_expert_cache_budgets`].
#[test]
#[ignore = "needs a CUDA device"]
fn cuda_gpt_oss_mxfp4_experts_under_the_expert_cache_give_the_resident_tokens() {
    let (_g, be) = super::cuda::cuda();
    check_expert_cache_budgets(be, &files(true), DType::BF16, super::cuda::bf16_config);
}

/// The planned policy on CUDA, bf16: see [`check_planned`].
#[test]
#[ignore = "needs a CUDA device"]
fn cuda_gpt_oss_under_planned_budgets_gives_the_resident_tokens() {
    let (_g, be) = super::cuda::cuda();
    check_planned(be, super::cuda::bf16_config);
}

/// Four layers of gpt-oss-20b's shapes (32 MXFP4 experts of 2,880, top 4, 64 heads over
/// 8 KV heads, windows of 128) in bf16 under budgets of the resident weights and half,
/// then a quarter of the experts: the resident tokens, eagerly and in graphs.
#[test]
#[ignore = "needs a CUDA device"]
fn cuda_gpt_oss_20b_shaped_mxfp4_experts_stream_through_the_expert_cache() {
    let (_g, be) = super::cuda::cuda();
    let mut config = ModelConfig::dummy("gpt-oss-20b").unwrap();
    config.num_layers = 4;
    config.full_attention_layers = vec![1, 3];
    let moe = config.moe.as_mut().unwrap();
    moe.sparse = vec![true; 4];
    config.weights.experts = Some(encore_core::quant::QuantFormat::Mxfp4);
    let files = ModelFiles {
        config,
        source: WeightSource::Dummy { seed: 17 },
    };
    let l = expert_layout(&files.config, DType::BF16);
    for graphs in [false, true] {
        let (want, _) = run_files(be, &files, &super::cuda::bf16_config(graphs, None)).unwrap();
        for share in [2, 4] {
            let bytes =
                (l.resident_bytes + l.pool_bytes(l.total_experts / share)).max(l.floor_bytes);
            let oc = OffloadConfig {
                budget: WeightBudget::Bytes(bytes),
                policy: Policy::Experts,
                expert_prefetch: false,
            };
            let cfg = super::cuda::bf16_config(graphs, Some(oc));
            let Engine { mut runner, report } =
                Engine::new(be, files.clone(), &cfg, &NoProgress).unwrap();
            assert_eq!(report.offload.unwrap().policy, Some(Policy::Experts));
            let got = greedy(&mut runner, &prompts()).unwrap();
            assert_eq!(got, want, "1/{share} of the experts, graphs {graphs}");
            let s = runner.expert_stats().unwrap().expect("the expert cache");
            assert!(s.misses > 0, "{s:?}");
        }
    }
}
