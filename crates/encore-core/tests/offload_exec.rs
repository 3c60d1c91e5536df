//! The weight offload executor end to end on the CPU twin (a worker thread copying into a
//! device pool in host memory, with a delay per copy so an ordering mistake reads stale
//! weights every time): greedy tokens under budgets equal fully resident ones, eager and
//! in graphs (decode graphs and piecewise prefill), planned and LRU; the floor is exact;
//! planned copies less than LRU; bad budgets fail at load time with a clear error.

use std::ops::ControlFlow;
use std::time::Duration;

use encore_core::backend::cpu::CpuBackend;
use encore_core::backend::Backend;
use encore_core::engine::{Engine, EngineConfig, KvSizing};
use encore_core::generate::{generate, GenerateOptions};
use encore_core::graph::BucketPolicy;
use encore_core::model::config::ModelConfig;
use encore_core::model::open_model;
use encore_core::offload::{self, AccessOrder, OffloadConfig, Policy, WeightBudget, SLOT_ALIGN};
use encore_core::progress::NoProgress;
use encore_core::runner::GraphConfig;
use encore_core::{DType, Error};

const MODEL: &str = "dummy:tiny-qwen3";

fn config(graphs: bool, offload: Option<OffloadConfig>) -> EngineConfig {
    EngineConfig {
        graphs: graphs.then_some(GraphConfig {
            decode: BucketPolicy::PowersOfTwo { max: 4 },
            mixed: BucketPolicy::SglangLike { max: 64 },
        }),
        capture_all: graphs,
        offload,
        ..EngineConfig::new(DType::F32, 16, 64, 4, 256, KvSizing::Blocks(64))
    }
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        (0..45).map(|i| (i * 7 + 3) % 250).collect(),
        (0..9).map(|i| (i * 13 + 1) % 250).collect(),
        (0..70).map(|i| (i * 5 + 11) % 250).collect(),
    ]
}

/// Greedy tokens of [`prompts`] (chunked prefill: 64 tokens a step) under `cfg`.
fn run(be: &dyn Backend, cfg: &EngineConfig) -> Result<Vec<Vec<u32>>, Error> {
    let files = open_model(MODEL)?;
    let Engine { mut runner, .. } = Engine::new(be, files, cfg, &NoProgress)?;
    let opts = GenerateOptions {
        max_tokens: 12,
        ignore_eos: true,
        sampling: Default::default(),
    };
    let out = generate(&mut runner, &prompts(), &[], &opts, &NoProgress, |_, _| {
        ControlFlow::Continue(())
    })?;
    Ok(out.into_iter().map(|g| g.output_ids).collect())
}

fn budget(p: f64, policy: Policy) -> Option<OffloadConfig> {
    Some(OffloadConfig {
        budget: WeightBudget::Percent(p),
        policy,
    })
}

fn slow_cpu() -> CpuBackend {
    CpuBackend::with_copy_delay(Duration::from_micros(300))
}

#[test]
fn planned_budgets_give_the_resident_tokens_eager_and_in_graphs() {
    let cpu = slow_cpu();
    let want = run(&cpu, &config(false, None)).unwrap();
    assert_eq!(run(&cpu, &config(true, None)).unwrap(), want);
    for p in [75.0, 50.0, 30.0] {
        for graphs in [false, true] {
            let got = run(&cpu, &config(graphs, budget(p, Policy::Planned))).unwrap();
            assert_eq!(got, want, "planned, {p}% budget, graphs {graphs}");
        }
    }
}

#[test]
fn lru_budgets_give_the_resident_tokens_and_refuse_graphs() {
    let cpu = slow_cpu();
    let want = run(&cpu, &config(false, None)).unwrap();
    for p in [75.0, 50.0, 30.0] {
        let got = run(&cpu, &config(false, budget(p, Policy::Lru))).unwrap();
        assert_eq!(got, want, "LRU, {p}% budget");
    }
    let err = run(&cpu, &config(true, budget(50.0, Policy::Lru))).unwrap_err();
    assert!(err.to_string().contains("--eager"), "{err}");
}

fn order(cfg: &ModelConfig) -> AccessOrder {
    AccessOrder::llama(cfg, DType::F32)
        .unwrap()
        .aligned(SLOT_ALIGN)
}

#[test]
fn a_budget_one_byte_under_the_floor_fails_and_at_the_floor_runs() {
    let cpu = slow_cpu();
    let files = open_model(MODEL).unwrap();
    let floor = order(&files.config).floor().bytes;
    let at = |bytes: usize| {
        config(
            true,
            Some(OffloadConfig {
                budget: WeightBudget::Bytes(bytes),
                policy: Policy::Planned,
            }),
        )
    };
    let err = run(&cpu, &at(floor - 1)).unwrap_err().to_string();
    assert!(err.contains(&format!("minimum of {floor} bytes")), "{err}");
    let want = run(&cpu, &config(false, None)).unwrap();
    assert_eq!(run(&cpu, &at(floor)).unwrap(), want);
}

#[test]
fn planned_streams_less_than_lru_below_the_whole_model() {
    let cfg = open_model(MODEL).unwrap().config;
    for p in [90.0, 75.0, 50.0, 30.0] {
        let planned = offload::device_bytes(&cfg, DType::F32, &budget(p, Policy::Planned).unwrap())
            .unwrap()
            .unwrap();
        let lru = offload::device_bytes(&cfg, DType::F32, &budget(p, Policy::Lru).unwrap())
            .unwrap()
            .unwrap();
        assert!(
            planned.streamed_bytes_per_step < lru.streamed_bytes_per_step,
            "{p}%: planned {} vs LRU {}",
            planned.streamed_bytes_per_step,
            lru.streamed_bytes_per_step
        );
        assert!(planned.resident_bytes + planned.streaming_bytes <= planned.budget_bytes);
    }
}
