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
                };
                let (got, _) = run_files(&cpu, &files, &config(graphs, Some(oc))).unwrap();
                assert_eq!(got, want, "{model}, budget {b:?}, graphs {graphs}");
            }
        }
    }
}
