//! Budgets on the dummies: planned and LRU give the resident tokens, the floor is exact,
//! planned streams less than LRU.

use super::*;

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
    let msg = err.to_string();
    assert!(
        msg.contains("cannot run inside graphs; add --eager"),
        "{msg}"
    );
}

#[test]
fn a_budget_one_byte_under_the_floor_fails_and_at_the_floor_runs() {
    let cpu = slow_cpu();
    // Tied embeddings (a device weight) and untied ones (read in place from host memory,
    // so the floor is set by the LM head and its neighbours).
    for model in [MODEL, "dummy:tiny-llama3"] {
        let files = open_model(model).unwrap();
        let floor = order(&files.config).floor().bytes;
        let at = |bytes: usize| {
            config(
                true,
                Some(OffloadConfig {
                    budget: WeightBudget::Bytes(bytes),
                    policy: Policy::Planned,
                    expert_prefetch: false,
                }),
            )
        };
        let err = run_files(&cpu, &files, &at(floor - 1))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("minimum of {floor} bytes")),
            "{model}: {err}"
        );
        let (want, _) = run_files(&cpu, &files, &config(false, None)).unwrap();
        let (got, _) = run_files(&cpu, &files, &at(floor)).unwrap();
        assert_eq!(got, want, "{model}");
    }
}

#[test]
fn planned_streams_less_than_lru_below_the_whole_model() {
    let cfg = open_model(MODEL).unwrap().config;
    for p in [90.0, 75.0, 50.0, 30.0] {
        let planned =
            offload::device_bytes(&cfg, DType::F32, &budget(p, Policy::Planned).unwrap(), 64)
                .unwrap()
                .unwrap();
        let lru = offload::device_bytes(&cfg, DType::F32, &budget(p, Policy::Lru).unwrap(), 64)
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

/// Mixtures of experts under budgets (whole expert stacks stream like any weight for now,
/// so the floor holds two layers' stacks: 25% is below it on these dummies): 100 / 50% and
/// the floor give the resident tokens, eager and in graphs.
#[test]
fn mixtures_of_experts_under_budgets_give_the_resident_tokens() {
    let cpu = slow_cpu();
    for model in [
        "dummy:tiny-qwen3-moe",
        "dummy:tiny-qwen2-moe",
        "dummy:tiny-mixtral",
    ] {
        let files = open_model(model).unwrap();
        let (want, _) = run_files(&cpu, &files, &config(false, None)).unwrap();
        let floor = order(&files.config).floor().bytes;
        let budgets = [
            WeightBudget::Percent(100.0),
            WeightBudget::Percent(50.0),
            WeightBudget::Bytes(floor),
        ];
        for b in budgets {
            for graphs in [false, true] {
                let oc = OffloadConfig {
                    budget: b,
                    policy: Policy::Planned,
                    expert_prefetch: false,
                };
                let (got, _) = run_files(&cpu, &files, &config(graphs, Some(oc))).unwrap();
                assert_eq!(got, want, "{model}, budget {b:?}, graphs {graphs}");
            }
        }
    }
}

/// The expert cache's layout for `cfg` in `dtype` with steps of [`config`]'s 64 tokens.
pub(super) fn expert_layout(cfg: &ModelConfig, dtype: DType) -> offload::ExpertLayout {
    let bytes: Vec<usize> = offload::executor_order(cfg, dtype)
        .unwrap()
        .weights()
        .iter()
        .map(|w| w.bytes)
        .collect();
    offload::experts::layout(cfg, &bytes, usize::MAX, 64).unwrap()
}

/// The expert cache on `be` for `files` run by `config_of(graphs, offload)` in `dtype`:
/// budgets that hold the resident weights and 100 / 50 / 25% of the routed experts, and
/// the exact floor (one layer's experts: a 64-token step can need them all), give the
/// resident tokens, eager and in graphs (the cache's decisions run inside the captured
/// graphs); one byte under the floor is refused with the minimum; the cache misses more at
/// the floor than with room; with the prefetch on, the same tokens, and below 100% each
/// sparse layer fetches the next one's experts ahead.
pub(super) fn check_expert_cache_budgets(
    be: &dyn Backend,
    files: &ModelFiles,
    dtype: DType,
    config_of: impl Fn(bool, Option<OffloadConfig>) -> EngineConfig,
) {
    let model = files.config.arch.model_type();
    let (want, _) = run_files(be, files, &config_of(false, None)).unwrap();
    let l = expert_layout(&files.config, dtype);
    let floor = l.floor_bytes;
    let at = |b: usize, graphs: bool, prefetch: bool| {
        config_of(
            graphs,
            Some(OffloadConfig {
                budget: WeightBudget::Bytes(b),
                policy: Policy::Auto,
                expert_prefetch: prefetch,
            }),
        )
    };
    let err = run_files(be, files, &at(floor - 1, false, false))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("minimum of {floor} bytes")) && err.contains("expert slots"),
        "{model}: {err}"
    );
    let with = |pct: usize| l.resident_bytes + l.pool_bytes(l.total_experts * pct / 100);
    let mut hit_rates = Vec::new();
    for (name, b) in [
        ("100%", with(100)),
        ("50%", with(50)),
        ("25%", with(25)),
        ("floor", floor),
    ] {
        if b < floor {
            continue; // fewer slots than one layer's experts
        }
        for (graphs, prefetch) in [(false, false), (true, false), (false, true), (true, true)] {
            let Engine { mut runner, report } =
                Engine::new(be, files.clone(), &at(b, graphs, prefetch), &NoProgress).unwrap();
            let got = greedy(&mut runner, &prompts()).unwrap();
            assert_eq!(
                got, want,
                "{model}, budget {name}, graphs {graphs}, prefetch {prefetch}"
            );
            let Some(r) = &report.offload else {
                continue; // the budget holds every weight
            };
            assert_eq!(r.policy, Some(Policy::Experts), "{model}");
            assert!(r.resident_bytes + r.streaming_bytes <= r.budget_bytes);
            let s = runner.expert_stats().unwrap().expect("the expert cache");
            assert!(s.needed > 0 && s.hits + s.misses == s.needed, "{s:?}");
            // Prefetching, with part of the experts cached: each sparse layer fetches the
            // next one's.
            if prefetch && matches!(name, "50%" | "25%") {
                assert!(s.prefetched > 0, "{model}, budget {name}: {s:?}");
            }
            if !prefetch || name == "100%" {
                assert_eq!(
                    s.prefetched, 0,
                    "{model}, budget {name}: nothing prefetched"
                );
            }
            if !prefetch {
                hit_rates.push((name, graphs, s.hit_rate()));
            }
        }
    }
    let rate = |n: &str| hit_rates.iter().find(|r| r.0 == n && !r.1).unwrap().2;
    assert!(
        rate("floor") < rate("50%"),
        "{model}: hit rates {hit_rates:?}"
    );
}

/// The expert cache (the default policy for mixtures of experts) on the CPU twin: see
/// [`check_expert_cache_budgets`].
#[test]
fn mixtures_of_experts_under_the_expert_cache_give_the_resident_tokens() {
    let cpu = slow_cpu();
    for model in [
        "dummy:tiny-qwen3-moe",
        "dummy:tiny-qwen2-moe",
        "dummy:tiny-mixtral",
    ] {
        let files = open_model(model).unwrap();
        check_expert_cache_budgets(&cpu, &files, DType::F32, config);
    }
}

/// The same on a mixture of experts whose experts are most of its bytes, so that budgets
/// of half and a quarter of them are above the floor.
#[test]
fn the_expert_cache_at_half_and_a_quarter_of_the_experts() {
    let files = super::cuda::moe_model();
    check_expert_cache_budgets(&slow_cpu(), &files, DType::F32, config);
}

/// The expert cache on a model without experts is refused naming the flag.
#[test]
fn the_expert_cache_needs_routed_experts() {
    let cfg = open_model(MODEL).unwrap().config;
    let err = offload::device_bytes(
        &cfg,
        DType::F32,
        &budget(50.0, Policy::Experts).unwrap(),
        64,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("--offload-policy experts") && err.contains("no routed experts"),
        "{err}"
    );
}
