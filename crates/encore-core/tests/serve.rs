//! The engine loop on its own thread (CPU backend): requests submitted from other threads
//! stream their tokens back; results equal a direct scheduler run; a sink whose reader
//! left aborts its request and frees its KV blocks; refused requests get an error event;
//! the prefix-cache counters reach the metrics.

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use encore_core::backend::cpu::CpuBackend;
use encore_core::engine::{EngineConfig, KvSizing};
use encore_core::progress::NoProgress;
use encore_core::request::SamplingParams;
use encore_core::request::{Event, FinishReason, Param, Request};
use encore_core::scheduler::SchedulerConfig;

mod common;
use encore_core::serve::EngineHandle;
use encore_core::DType;

/// Boot an engine loop on `model` (eager, f32, 8 sequences of up to 128 tokens).
fn boot(model: &str, num_blocks: usize) -> encore_core::Result<EngineHandle> {
    let cfg = EngineConfig::new(DType::F32, 4, 64, 8, 128, KvSizing::Blocks(num_blocks));
    let sched = SchedulerConfig::new(32, 8);
    EngineHandle::start(
        Arc::new(CpuBackend::new()),
        encore_core::model::open_model(model)?,
        cfg,
        sched,
        Box::new(NoProgress),
    )
}

fn start(num_blocks: usize) -> EngineHandle {
    boot("dummy:tiny", num_blocks).unwrap()
}

/// A request whose prompt and seed depend on `len` only (not on the id).
fn request(id: u64, len: usize, max_tokens: usize) -> Request {
    let prompt = (0..len).map(|j| ((len * 7 + j * 3) % 200) as u32).collect();
    let sampling = SamplingParams {
        temperature: 0.8,
        top_k: 0,
        top_p: 1.0,
        seed: len as u64,
        ..Default::default()
    };
    common::request(id, prompt, sampling, max_tokens)
}

fn sink(tx: mpsc::Sender<Event>) -> encore_core::serve::Sink {
    Box::new(move |e| tx.send(e).is_ok())
}

fn collect(rx: &mpsc::Receiver<Event>) -> (Vec<u32>, FinishReason) {
    let mut toks = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(60)).unwrap() {
            Event::Token(o) => {
                toks.push(o.token);
                if let Some(f) = o.finish {
                    return (toks, f);
                }
            }
            Event::Refused(r) => panic!("{r}"),
            Event::Failed(e) => panic!("{e}"),
        }
    }
}

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn concurrent_requests_stream_their_alone_tokens() {
    let engine = Arc::new(start(1 + 8 * 32));
    // Each request alone first.
    let alone: Vec<(Vec<u32>, FinishReason)> = (0..6u64)
        .map(|i| {
            let (tx, rx) = mpsc::channel();
            engine
                .submit(request(i, 5 + 9 * i as usize, 10 + i as usize), sink(tx))
                .unwrap();
            collect(&rx)
        })
        .collect();
    // Then all at once, from six threads.
    let handles: Vec<_> = (0..6u64)
        .map(|i| {
            let engine = Arc::clone(&engine);
            std::thread::spawn(move || {
                let (tx, rx) = mpsc::channel();
                engine
                    .submit(
                        request(100 + i, 5 + 9 * i as usize, 10 + i as usize),
                        sink(tx),
                    )
                    .unwrap();
                collect(&rx)
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        // Same prompt and seed: the same tokens whatever ran beside them.
        assert_eq!(h.join().unwrap(), alone[i], "request {i}");
        assert_eq!(alone[i].0.len(), 10 + i);
    }
    let m = &engine.metrics;
    wait_until("idle", || m.requests_running.load(Ordering::Relaxed) == 0);
    assert_eq!(m.kv_blocks_used.load(Ordering::Relaxed), 0);
    assert_eq!(m.requests_finished_total.load(Ordering::Relaxed), 12);
    // The second wave found each prompt cached but its last token (whole blocks of 4):
    // lengths 5, 14, .., 50 hit 4, 12, 20, 28, 40, 48.
    let queried: u64 = (0..6).map(|i| 5 + 9 * i).sum::<u64>() * 2;
    assert_eq!(
        m.prefix_cache_queries_total.load(Ordering::Relaxed),
        queried
    );
    assert_eq!(m.prefix_cache_hits_total.load(Ordering::Relaxed), 152);
    assert_eq!(m.prefix_cache_hit_ratio(), 152.0 / queried as f64);
}

#[test]
fn a_gone_reader_aborts_its_request_and_frees_its_blocks() {
    let engine = start(1 + 8 * 32);
    let (tx, rx) = mpsc::channel();
    engine.submit(request(1, 40, 100), sink(tx)).unwrap();
    // Read two tokens, then leave.
    for _ in 0..2 {
        assert!(matches!(
            rx.recv_timeout(Duration::from_secs(30)).unwrap(),
            Event::Token(_)
        ));
    }
    drop(rx);
    let m = &engine.metrics;
    wait_until("the abort", || {
        m.requests_aborted_total.load(Ordering::Relaxed) == 1
    });
    wait_until("freed blocks", || {
        m.kv_blocks_used.load(Ordering::Relaxed) == 0
    });
    // Abort by id, mid-flight.
    let (tx, rx) = mpsc::channel();
    engine.submit(request(2, 10, 100), sink(tx)).unwrap();
    assert!(matches!(
        rx.recv_timeout(Duration::from_secs(30)).unwrap(),
        Event::Token(_)
    ));
    engine.abort(2);
    wait_until("the second abort", || {
        m.requests_aborted_total.load(Ordering::Relaxed) == 2
    });
    wait_until("freed blocks", || {
        m.kv_blocks_used.load(Ordering::Relaxed) == 0
    });
    engine.shutdown();
}

#[test]
fn refused_requests_get_an_error_event_and_boot_errors_return() {
    let engine = start(1 + 8 * 32);
    let (tx, rx) = mpsc::channel();
    engine.submit(request(1, 0, 5), sink(tx)).unwrap();
    match rx.recv_timeout(Duration::from_secs(30)).unwrap() {
        Event::Refused(r) => {
            assert!(r.to_string().contains("empty"), "{r}");
            assert_eq!(r.param, Param::Prompt);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(engine.vocab_size, 512);
    assert_eq!(engine.max_seq_len, 128);
    drop(engine);
    let e = boot("dummy:no-such-model", 10).err().unwrap().to_string();
    assert!(e.contains("no-such-model"), "{e}");
}

/// A draft model (`EngineConfig::draft`) boots beside the target in the engine loop and
/// the tokens stream as without it; a draft of another vocabulary or of fewer positions
/// than the run holds is a boot error naming `--draft-model`.
#[test]
fn a_draft_model_boots_in_the_engine_loop_and_bad_ones_are_refused() {
    use encore_core::spec::Proposer;
    let boot_with = |draft: encore_core::model::ModelFiles| {
        let cfg = EngineConfig {
            draft: Some(draft),
            ..EngineConfig::new(
                DType::F32,
                4,
                64,
                8 + 3 * 8,
                128,
                KvSizing::Blocks(1 + 8 * 32),
            )
        };
        let sched = SchedulerConfig {
            speculative: Some(Proposer::Draft { k: 3 }),
            ..SchedulerConfig::new(32, 8)
        };
        EngineHandle::start(
            Arc::new(CpuBackend::new()),
            encore_core::model::open_model("dummy:tiny").unwrap(),
            cfg,
            sched,
            Box::new(NoProgress),
        )
    };
    let run = |engine: &EngineHandle| {
        let (tx, rx) = mpsc::channel();
        engine.submit(request(1, 9, 20), sink(tx)).unwrap();
        collect(&rx)
    };
    let plain = run(&start(1 + 8 * 32));
    let engine = boot_with(encore_core::model::open_model("dummy:tiny").unwrap()).unwrap();
    assert_eq!(run(&engine), plain);
    // The metrics are published when the loop goes idle.
    wait_until("the draft's kept tokens in the metrics", || {
        engine.metrics.spec_accepted_total.load(Ordering::Relaxed) > 0
    });
    drop(engine);
    let mut other = encore_core::model::open_model("dummy:tiny").unwrap();
    other.config.vocab_size = 600;
    let e = boot_with(other).err().unwrap().to_string();
    assert!(e.contains("--draft-model") && e.contains("600"), "{e}");
    let mut short = encore_core::model::open_model("dummy:tiny").unwrap();
    short.config.max_position_embeddings = 64;
    let e = boot_with(short).err().unwrap().to_string();
    assert!(
        e.contains("--draft-model") && e.contains("64 positions"),
        "{e}"
    );
}

/// The next event of `rx`: a failure's message (panics on anything else).
fn failure(rx: &mpsc::Receiver<Event>) -> String {
    match rx.recv_timeout(Duration::from_secs(30)).unwrap() {
        Event::Failed(e) => e,
        Event::Token(o) => panic!("a token: {o:?}"),
        Event::Refused(r) => panic!("refused: {r}"),
    }
}

#[test]
fn a_failed_tensor_parallel_group_fails_later_requests_at_once_naming_the_cause() {
    use common::hooked::{FailArmed, Hooked};
    use encore_core::backend::BackendRef;
    use encore_core::engine::TpBackends;
    // Two CPU ranks; rank 1 fails its first matmul once armed.
    let ranks: Vec<Arc<Hooked<FailArmed>>> = CpuBackend::group(2)
        .into_iter()
        .map(|inner| {
            let hooks = FailArmed::default();
            Arc::new(Hooked { inner, hooks })
        })
        .collect();
    let refs: Vec<BackendRef> = ranks.iter().map(|r| r.clone() as BackendRef).collect();
    let cfg = EngineConfig {
        tp: TpBackends(refs.clone()),
        ..EngineConfig::new(DType::F32, 4, 64, 8, 128, KvSizing::Blocks(1 + 8 * 32))
    };
    let model = encore_core::model::open_model("dummy:tiny").unwrap();
    let sched = SchedulerConfig::new(32, 8);
    let engine =
        EngineHandle::start(refs[0].clone(), model, cfg, sched, Box::new(NoProgress)).unwrap();
    let (tx, rx) = mpsc::channel();
    engine.submit(request(1, 10, 4), sink(tx)).unwrap();
    assert_eq!(collect(&rx).0.len(), 4);
    assert_eq!(engine.unhealthy(), None);
    // The failing step fails its request naming the rank and the cause.
    ranks[1].hooks.arm();
    let (tx, rx) = mpsc::channel();
    engine.submit(request(2, 10, 4), sink(tx)).unwrap();
    let e = failure(&rx);
    assert!(
        e.contains("rank 1 (") && e.contains("the injected fault"),
        "{e}"
    );
    // The group is broken: the engine says why, and a new request fails at once with it.
    wait_until("unhealthy", || engine.unhealthy().is_some());
    let why = engine.unhealthy().unwrap();
    assert!(why.contains("restart") && why.contains("rank 1 ("), "{why}");
    let (tx, rx) = mpsc::channel();
    engine.submit(request(3, 10, 4), sink(tx)).unwrap();
    assert_eq!(failure(&rx), why);
}
