//! Drive the engine loop (serve::EngineHandle) directly, without HTTP: N requests of P
//! prompt tokens and M greedy output tokens submitted at once; prints the wall time and
//! output tokens/s. For telling the engine loop's cost from the server's.
//!
//!     cargo run --release --example engine_loop -- MODEL N P M [cpu|cuda]

use std::sync::{mpsc, Arc};
use std::time::Instant;

use encore_core::engine::{EngineConfig, KvSizing};
use encore_core::request::{Event, Request, RequestParams};
use encore_core::runner::GraphConfig;
use encore_core::scheduler::SchedulerConfig;
use encore_core::serve::EngineHandle;

fn main() -> encore_core::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: &str| a.get(i).cloned().unwrap_or_else(|| d.to_string());
    let model = arg(1, "dummy:tiny");
    let n: usize = arg(2, "64").parse().unwrap_or(64);
    let p: usize = arg(3, "128").parse().unwrap_or(128);
    let m: usize = arg(4, "256").parse().unwrap_or(256);
    let spec = match arg(5, "cuda").as_str() {
        "cpu" => encore_core::device::DeviceSpec::Cpu,
        _ => encore_core::device::DeviceSpec::Cuda(0),
    };
    let (opened, _) = encore_core::device::open(spec)?;
    let be = opened.backend();
    let cuda = be.memory_info().is_some();
    let kv = if cuda {
        KvSizing::DeviceFraction {
            fraction: 0.5,
            at_least: 2,
        }
    } else {
        KvSizing::Blocks(1 + n * (p + m + 16).div_ceil(16))
    };
    let max_seq_len = (p + m + 16).next_multiple_of(16);
    let cfg = EngineConfig {
        graphs: Some(GraphConfig {
            decode: encore_core::graph::BucketPolicy::VllmLike { max: n.max(1) },
            mixed: if cuda {
                encore_core::graph::BucketPolicy::SglangLike { max: 2048 }
            } else {
                encore_core::graph::BucketPolicy::None
            },
            verify: 0,
        }),
        capture_all: true,
        ..EngineConfig::new(
            encore_core::DType::BF16,
            16,
            2048,
            n.max(1),
            max_seq_len,
            kv,
        )
    };
    let sched = SchedulerConfig::new(2048, n.max(1));
    let engine = Arc::new(EngineHandle::start(
        be,
        encore_core::model::open_model(&model)?,
        cfg,
        sched,
        Box::new(encore_core::progress::NoProgress),
    )?);
    let t = Instant::now();
    let (tx, rx) = mpsc::channel::<Event>();
    for i in 0..n {
        let tx = tx.clone();
        engine.submit(
            Request {
                id: i as u64,
                prompt: (0..p).map(|j| ((i * 31 + j * 7) % 250) as u32).collect(),
                params: RequestParams {
                    sampling: Default::default(),
                    max_tokens: m,
                    stop_token_ids: Vec::new(),
                    ignore_eos: true,
                    fit_context: false,
                    constraint: None,
                    share_prompt: None,
                    logit_bias: Vec::new(),
                },
            },
            Box::new(move |e| tx.send(e).is_ok()),
        )?;
    }
    drop(tx);
    let (mut tokens, mut done) = (0usize, 0usize);
    while done < n {
        match rx.recv() {
            Ok(Event::Token(o)) => {
                tokens += 1;
                done += o.finish.is_some() as usize;
            }
            Ok(Event::Refused(r)) => panic!("{r}"),
            Ok(Event::Failed(e)) => panic!("{e}"),
            Err(_) => break,
        }
    }
    let wall = t.elapsed().as_secs_f64();
    let steps = engine
        .metrics
        .steps_total
        .load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "{n} requests x ({p} prompt + {m} output): {wall:.3} s, {:.0} output tok/s, {steps} steps, {:.3} ms/step",
        tokens as f64 / wall,
        wall * 1e3 / steps.max(1) as f64
    );
    Ok(())
}
