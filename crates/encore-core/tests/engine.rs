//! Engine start-up on the CPU backend: the boot order's checks (memory, context length)
//! fail before anything loads, with the run named; a started engine has every bucket
//! captured and its first requests replay without capturing.

use encore_core::backend::cpu::CpuBackend;
use encore_core::engine::{Engine, EngineConfig, KvSizing};
use encore_core::graph::{BucketPolicy, Phase};
use encore_core::kv::SeqId;
use encore_core::memory::GraphMemory;
use encore_core::model::open_model;
use encore_core::progress::{Progress, Unit};
use encore_core::request::SamplingParams;
use encore_core::runner::{GraphConfig, RunnerBuilder, RunnerConfig, SeqStep, Seqs};
use encore_core::DType;
use std::sync::Mutex;

mod common;

fn config() -> EngineConfig {
    EngineConfig {
        graphs: Some(GraphConfig {
            decode: BucketPolicy::PowersOfTwo { max: 4 },
            mixed: BucketPolicy::SglangLike { max: 128 },
            verify: 0,
        }),
        capture_all: true,
        run_name: "engine test".into(),
        fix_hint: "use a smaller test".into(),
        ..EngineConfig::new(DType::F32, 16, 128, 4, 256, KvSizing::Blocks(1 + 4 * 16))
    }
}

/// Records what progress reports.
#[derive(Default)]
struct Log(Mutex<Vec<String>>);

impl Progress for Log {
    fn start(&self, what: &str, total: u64, unit: Unit) {
        self.0
            .lock()
            .unwrap()
            .push(format!("start {what} {total} {unit:?}"));
    }
    fn set(&self, _: u64) {}
    fn finish(&self) {
        self.0.lock().unwrap().push("finish".into());
    }
}

#[test]
fn start_up_captures_everything_and_the_first_requests_replay() {
    let cpu = CpuBackend::new();
    let log = Log::default();
    let files = open_model("dummy:tiny").unwrap();
    let Engine { mut runner, report } = Engine::new(&cpu, files, &config(), &log).unwrap();
    let mut seqs = Seqs::for_runner(&runner).unwrap();
    let events = log.0.lock().unwrap().clone();
    assert!(
        events[0].starts_with("start generating dummy weights") && events[0].ends_with("Bytes"),
        "{events:?}"
    );
    // 3 decode buckets (1, 2, 4) and 4..32 step 4 + 48..128 step 16 token buckets.
    assert!(
        events.contains(&"start capturing graphs 17 Graphs".to_string()),
        "{events:?}"
    );
    assert_eq!(events.iter().filter(|e| *e == "finish").count(), 2);
    assert_eq!(report.kv_blocks, 65);
    assert!(report.capture_secs > 0.0 && report.total_secs >= report.capture_secs);
    let before = runner.graph_stats().unwrap();
    assert_eq!((before.captures, before.misses), (17, 0));
    // A prefill of two prompts, then decode steps: all hits.
    let prompts = [vec![3u32; 37], vec![5u32; 20]];
    for (i, p) in prompts.iter().enumerate() {
        seqs.blocks.allocate(SeqId(i as u64), p.len()).unwrap();
    }
    let steps: Vec<SeqStep<'_>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| SeqStep {
            seq: SeqId(i as u64),
            tokens: p,
            sampling: SamplingParams::default(),
            masked: false,
            score: None,
            verify: false,
            logit_bias: &[],
        })
        .collect();
    let mut last = runner.step(&mut seqs, &steps).unwrap();
    for _ in 1..4 {
        last = common::decode_step(&mut runner, &mut seqs, &last, SamplingParams::default());
    }
    let after = runner.graph_stats().unwrap();
    assert_eq!(
        (after.captures, after.misses, after.hits),
        (17, 0, 4),
        "{after:?}"
    );
    assert_eq!(runner.phase_stats(Phase::Mixed).unwrap().hits, 1);
}

#[test]
fn start_up_refuses_what_cannot_fit_before_loading() {
    let cpu = CpuBackend::new();
    let log = Log::default();
    let mut cfg = config();
    cfg.kv = KvSizing::Blocks(1 << 40);
    let e = Engine::new(&cpu, open_model("dummy:tiny").unwrap(), &cfg, &log)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("engine test") && e.contains("use a smaller test"),
        "{e}"
    );
    assert!(log.0.lock().unwrap().is_empty(), "nothing loaded");
    let mut cfg = config();
    cfg.max_seq_len = 1 << 20;
    let e = Engine::new(&cpu, open_model("dummy:tiny").unwrap(), &cfg, &log)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("max_seq_len") && e.contains("positions"), "{e}");
}

#[test]
fn on_demand_capture_leaves_buckets_for_first_use() {
    let cpu = CpuBackend::new();
    let mut cfg = config();
    cfg.capture_all = false;
    let Engine { runner, report } = Engine::new(
        &cpu,
        open_model("dummy:tiny").unwrap(),
        &cfg,
        &encore_core::progress::NoProgress,
    )
    .unwrap();
    assert_eq!(report.capture_secs, 0.0);
    assert_eq!(runner.graph_stats().unwrap().captures, 0);
}

#[test]
fn the_kv_cache_is_built_once_after_the_measuring_step() {
    let cpu = CpuBackend::new();
    let cfg = RunnerConfig {
        block_size: common::BLOCK,
        num_blocks: 4,
        max_tokens_per_step: 64,
        max_seqs: 4,
        max_seq_len: 128,
        penalty_slots: 4,
        kv_dtype: None,
    };
    let mut b =
        RunnerBuilder::new(&cpu, common::tiny_model(&cpu), cfg, GraphMemory::Arena).unwrap();
    // The CPU reports no device memory: the step runs, and nothing is measured.
    assert_eq!(b.measure_free(4).unwrap(), None);
    let runner = b.build(100).unwrap();
    assert_eq!(
        (runner.kv().num_blocks(), runner.config().num_blocks),
        (100, 100)
    );
    let seqs = Seqs::for_runner(&runner).unwrap();
    assert_eq!(seqs.blocks.num_blocks(), 100);
}
