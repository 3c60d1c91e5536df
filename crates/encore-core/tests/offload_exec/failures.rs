//! The failure table: each a load-time error naming the thing.

use super::*;

/// The HF name of a weight the planned policy streams at `budget` for `cfg` (one HF
/// tensor per device tensor: not a merged q/k/v or gate/up).
fn a_streamed_hf_tensor(cfg: &ModelConfig, p: f64) -> String {
    let order = order(cfg);
    let bytes = WeightBudget::Percent(p).bytes(cfg.weight_bytes(DType::F32));
    let plan = offload::plan(&order, bytes).unwrap();
    plan.streams
        .iter()
        .map(|s| &order.weights()[s.weight].name)
        .find(|n| n.ends_with("down_proj"))
        .map(|n| format!("{n}.weight"))
        .expect("a down projection is streamed")
}

#[test]
fn a_broken_checkpoint_under_a_budget_fails_at_load_naming_the_tensor() {
    let cpu = CpuBackend::new();
    let json = cpu_json();
    let cfg = ModelConfig::from_json(&json, "test").unwrap();
    let name = a_streamed_hf_tensor(&cfg, 50.0);
    type Edit = Box<dyn Fn(&mut Vec<Ck>, &str)>;
    let cases: [(&str, Edit, &[&str]); 3] = [
        (
            "missing",
            Box::new(|ts, n| ts.retain(|t| t.name != n)),
            &["missing"],
        ),
        (
            "shape",
            Box::new(|ts, n| ts.iter_mut().find(|t| t.name == n).unwrap().shape.reverse()),
            &["[224, 128]", "expected [128, 224]"],
        ),
        (
            "dtype",
            Box::new(|ts, n| ts.iter_mut().find(|t| t.name == n).unwrap().dtype = Dtype::I32),
            &["I32"],
        ),
    ];
    for (what, edit, says) in cases {
        let mut ts = checkpoint(&cfg, Dtype::F32);
        edit(&mut ts, &name);
        let dir = model_dir(&format!("offload-{what}"), &json, &ts);
        for policy in [Policy::Planned, Policy::Lru] {
            let err = run_files(
                &cpu,
                &dir_files(dir.path()),
                &config(false, budget(50.0, policy)),
            )
            .err()
            .unwrap_or_else(|| panic!("{what}: a broken checkpoint loaded"));
            let msg = err.to_string();
            assert!(matches!(err, Error::Weights { .. }), "{what}: {msg}");
            assert!(msg.contains(&format!("`{name}`")), "{what}: {msg}");
            for s in says {
                assert!(msg.contains(s), "{what}: {msg}");
            }
        }
    }
}

/// `tiny` with other sizes (heads of 128, 8 KV heads), for budgets no machine holds.
pub(super) fn huge(hidden: usize, inter: usize, layers: usize) -> ModelConfig {
    let tiny = ModelConfig::dummy("tiny").unwrap();
    ModelConfig {
        hidden_size: hidden,
        intermediate_size: inter,
        num_layers: layers,
        num_heads: hidden / 128,
        num_kv_heads: 8,
        head_dim: 128,
        rope: encore_core::ops::RopeConfig {
            rot_dim: 128,
            ..tiny.rope
        },
        ..tiny
    }
}

#[test]
fn a_ring_or_pool_the_device_cannot_allocate_is_a_clear_error() {
    // Weights of 2^50 bytes: the ring (or pool) is beyond any address space, so the
    // allocation fails however the host overcommits.
    let cpu = CpuBackend::new();
    let cfg = huge(1 << 17, 1 << 30, 2);
    let floor = order(&cfg).floor().bytes;
    assert!(floor < cfg.weight_bytes(DType::F32), "the floor streams");
    for (policy, what) in [(Policy::Planned, "ring"), (Policy::Lru, "LRU pool")] {
        let oc = OffloadConfig {
            budget: WeightBudget::Bytes(floor),
            policy,
            expert_prefetch: false,
        };
        let err = Prepared::new(&cpu, &cfg, DType::F32, &oc, 64)
            .err()
            .expect("a PiB ring is refused");
        let msg = err.to_string();
        assert!(matches!(err, Error::OutOfMemory { .. }), "{msg}");
        assert!(
            msg.contains(&format!("the weight offload {what}"))
                && msg.contains("device pool was refused"),
            "{msg}"
        );
    }
}

#[test]
fn a_budget_beyond_host_memory_fails_the_memory_check_before_loading() {
    // 8 layers of 1.5 TiB each: half of it is more than any CI host has.
    let Some(_) = encore_core::memory::host_memory() else {
        eprintln!("no /proc/meminfo: the CPU backend has no memory limit to check");
        return;
    };
    let cpu = CpuBackend::new();
    let cfg = huge(1 << 17, 1 << 20, 8);
    let files = ModelFiles {
        config: cfg.clone(),
        source: WeightSource::Dummy { seed: 0 },
    };
    let oc = budget(50.0, Policy::Planned).unwrap();
    let r = offload::device_bytes(&cfg, DType::F32, &oc, 64)
        .unwrap()
        .unwrap();
    let t = Instant::now();
    let err = Engine::new(&cpu, files, &config(false, Some(oc)), &NoProgress)
        .err()
        .expect("a budget of TiBs is refused");
    assert!(t.elapsed() < Duration::from_secs(10), "it allocated first");
    let msg = err.to_string();
    assert!(matches!(err, Error::MemoryBudget { .. }), "{msg}");
    // The weights are the budget's resident set and ring, plus, on the CPU twin whose
    // "device" is host memory, the streamed weights' host copies.
    let gib = |b: usize| format!("weights {:.2} GiB", b as f64 / (1u64 << 30) as f64);
    let host_copies = r.total_bytes - r.resident_bytes;
    assert!(
        msg.contains(&gib(r.resident_bytes + r.streaming_bytes + host_copies)),
        "{msg}"
    );
    assert!(msg.contains("host memory"), "{msg}");
}
