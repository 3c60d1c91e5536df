//! The offload executor on CUDA (`#[ignore = "needs a CUDA device"]`).

use std::sync::{Mutex, MutexGuard, OnceLock};

use encore_core::backend::cuda::CudaBackend;

use super::copy_queue::check_copy_queue;
use super::failures::huge;
use super::*;

/// One test at a time on one backend (a capture must not see another test's work).
pub(super) fn cuda() -> (MutexGuard<'static, ()>, &'static CudaBackend) {
    static LOCK: Mutex<()> = Mutex::new(());
    static BE: OnceLock<CudaBackend> = OnceLock::new();
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let be = BE.get_or_init(|| CudaBackend::new(0).unwrap_or_else(|e| panic!("{e}")));
    (guard, be)
}

pub(super) fn bf16_config(graphs: bool, offload: Option<OffloadConfig>) -> EngineConfig {
    EngineConfig {
        dtype: DType::BF16,
        ..config(graphs, offload)
    }
}

/// 138M parameters (276 MB in bf16): 8 layers of hidden 1024, heads of 64, untied; a
/// 30% budget streams most of every layer.
fn model() -> ModelFiles {
    let tiny = ModelConfig::dummy("tiny").unwrap();
    let config = ModelConfig {
        vocab_size: 8192,
        hidden_size: 1024,
        intermediate_size: 4096,
        num_layers: 8,
        num_heads: 16,
        num_kv_heads: 4,
        head_dim: 64,
        rope: encore_core::ops::RopeConfig {
            rot_dim: 64,
            ..tiny.rope
        },
        ..tiny
    };
    ModelFiles {
        config,
        source: WeightSource::Dummy { seed: 5 },
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_budgets_give_the_resident_tokens_eager_and_in_graphs() {
    let (_g, be) = cuda();
    let files = model();
    for graphs in [false, true] {
        let (want, _) = run_files(be, &files, &bf16_config(graphs, None)).unwrap();
        for p in [75.0, 50.0, 30.0] {
            let (got, boot) =
                run_files(be, &files, &bf16_config(graphs, budget(p, Policy::Planned))).unwrap();
            assert_eq!(got, want, "planned, {p}%, graphs {graphs}");
            let r = boot.offload.unwrap();
            assert!(r.streamed_bytes_per_step > 0 && r.copied_bytes > 0, "{r:?}");
            if !graphs {
                let (got, _) =
                    run_files(be, &files, &bf16_config(false, budget(p, Policy::Lru))).unwrap();
                assert_eq!(got, want, "LRU, {p}%");
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_a_budget_one_byte_under_the_floor_fails_and_at_the_floor_runs() {
    let (_g, be) = cuda();
    let files = model();
    let floor = offload::executor_order(&files.config, DType::BF16)
        .unwrap()
        .floor()
        .bytes;
    let at = |bytes: usize, graphs: bool| {
        bf16_config(
            graphs,
            Some(OffloadConfig {
                budget: WeightBudget::Bytes(bytes),
                policy: Policy::Planned,
                expert_prefetch: false,
            }),
        )
    };
    let err = run_files(be, &files, &at(floor - 1, true))
        .expect_err("below the floor")
        .to_string();
    assert!(err.contains(&format!("minimum of {floor} bytes")), "{err}");
    for graphs in [false, true] {
        let (want, _) = run_files(be, &files, &bf16_config(graphs, None)).unwrap();
        let (got, _) = run_files(be, &files, &at(floor, graphs)).unwrap();
        assert_eq!(got, want, "at the floor, graphs {graphs}");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_a_bf16_checkpoint_is_registered_in_place() {
    let (_g, be) = cuda();
    // head_dim 64, 4 layers; stored in bf16 and run in bf16.
    let json = llama_json(512, 256, 704, 4, 4);
    let cfg = ModelConfig::from_json(&json, "test").unwrap();
    let dir = model_dir("offload-cuda-bf16", &json, &checkpoint(&cfg, Dtype::BF16));
    let files = dir_files(dir.path());
    for graphs in [false, true] {
        let (want, _) = run_files(be, &files, &bf16_config(graphs, None)).unwrap();
        let (got, boot) = run_files(
            be,
            &files,
            &bf16_config(graphs, budget(50.0, Policy::Planned)),
        )
        .unwrap();
        assert_eq!(got, want, "graphs {graphs}");
        let r = boot.offload.unwrap();
        assert!(r.registered_bytes > 0 && r.copied_bytes == 0, "{r:?}");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_registering_a_range_twice_is_refused_with_the_cause() {
    let (_g, be) = cuda();
    let mem: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(vec![7u8; 1 << 20]);
    let first = be.register_host(mem.clone()).unwrap();
    assert!(first.is_page_locked());
    let err = be
        .register_host(mem.clone())
        .err()
        .expect("the driver refuses a registered range");
    let msg = err.to_string();
    assert!(
        msg.contains("cuMemHostRegister") && msg.contains("ALREADY_REGISTERED"),
        "{msg}"
    );
    drop(first);
    // Unregistered on drop: the range can be registered again.
    assert!(be.register_host(mem).is_ok());
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_a_pool_beyond_the_device_is_refused() {
    let (_g, be) = cuda();
    let (_, total) = be.memory_info().unwrap();
    // Layers of 7.6 GB in bf16, twice the device in all; an LRU pool 8 GiB over the
    // device is above the floor and below the model.
    let layer = huge(16384, 65536, 1).weight_bytes(DType::BF16);
    let cfg = huge(16384, 65536, (2 * total).div_ceil(layer));
    let pool = total + (8 << 30);
    let order = AccessOrder::llama(&cfg, DType::BF16)
        .unwrap()
        .aligned(SLOT_ALIGN);
    assert!(order.floor().bytes < pool && pool < cfg.weight_bytes(DType::BF16));
    let lru = OffloadConfig {
        budget: WeightBudget::Bytes(pool),
        policy: Policy::Lru,
        expert_prefetch: false,
    };
    let err = Prepared::new(be, &cfg, DType::BF16, &lru, 64)
        .err()
        .expect("a pool larger than the device");
    let msg = err.to_string();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{msg}");
    assert!(
        msg.contains("the weight offload LRU pool") && msg.contains("device pool was refused"),
        "{msg}"
    );
    // Through the engine the memory check refuses it first, before any allocation.
    let files = ModelFiles {
        config: cfg.clone(),
        source: WeightSource::Dummy { seed: 0 },
    };
    let err = Engine::new(be, files, &bf16_config(false, Some(lru)), &NoProgress)
        .err()
        .expect("over the device");
    let msg = err.to_string();
    assert!(matches!(err, Error::MemoryBudget { .. }), "{msg}");
    assert!(msg.contains("free memory of cuda"), "{msg}");
    // A planned ring beyond the device: one gate/up projection of 256 GiB.
    let cfg = huge(1 << 16, 1 << 20, 2);
    let floor = AccessOrder::llama(&cfg, DType::BF16)
        .unwrap()
        .aligned(SLOT_ALIGN)
        .floor()
        .bytes;
    let planned = OffloadConfig {
        budget: WeightBudget::Bytes(floor),
        policy: Policy::Planned,
        expert_prefetch: false,
    };
    let ring = offload::device_bytes(&cfg, DType::BF16, &planned, 64)
        .unwrap()
        .unwrap()
        .streaming_bytes;
    assert!(ring > total, "a ring of {ring} bytes fits the device");
    let err = Prepared::new(be, &cfg, DType::BF16, &planned, 64)
        .err()
        .expect("a ring larger than the device");
    let msg = err.to_string();
    assert!(
        matches!(err, Error::OutOfMemory { .. })
            && msg.contains("the weight offload ring")
            && msg.contains("device pool was refused"),
        "{msg}"
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_copy_queue_orders_copies_waits_and_joins_eagerly_and_captured() {
    let (_g, be) = cuda();
    check_copy_queue(be, Duration::ZERO);
}

/// A Qwen3-MoE of 32 experts (top 4) of width 256 over 4 layers of hidden 512: the experts
/// are most of its bytes, so budgets of half and a quarter of them are above the cache's
/// floor.
pub(super) fn moe_model() -> ModelFiles {
    let tiny = ModelConfig::dummy("tiny-qwen3-moe").unwrap();
    let moe = tiny.moe.clone().unwrap();
    let config = ModelConfig {
        vocab_size: 2048,
        hidden_size: 512,
        num_layers: 4,
        num_heads: 8,
        num_kv_heads: 2,
        moe: Some(encore_core::model::config::MoeConfig {
            num_experts: 32,
            top_k: 4,
            expert_intermediate: 256,
            sparse: vec![true; 4],
            ..moe
        }),
        ..tiny
    };
    ModelFiles {
        config,
        source: WeightSource::Dummy { seed: 9 },
    }
}

/// The expert cache on CUDA, bf16: budgets of the resident weights and 100 / 50 / 25% of
/// the experts and the exact floor give the resident tokens, eager and in graphs.
#[test]
#[ignore = "needs a CUDA device"]
fn cuda_the_expert_cache_gives_the_resident_tokens() {
    let (_g, be) = cuda();
    let files = moe_model();
    let l = super::budgets::expert_layout(&files.config, DType::BF16);
    assert!(
        l.resident_bytes + l.pool_bytes(l.total_experts / 4) >= l.floor_bytes,
        "{l:?}"
    );
    super::budgets::check_expert_cache_budgets(be, &files, DType::BF16, bf16_config);
}
