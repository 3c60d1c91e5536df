//! `encore bench allreduce`: the latency of one all-reduce over a tensor-parallel group
//! inside a captured graph (how the forward issues them), per message size: on CUDA the
//! one-shot peer-memory kernel against NCCL, on the CPU twin its shared-memory reduce.
//! Each rank captures `--per-graph` all-reduces of one buffer into a graph; the ranks
//! replay together `--replays` times (a host barrier before each); a replay's wall time
//! on rank 0 over `--per-graph` is one all-reduce, median over the replays, the first
//! (warm-up) excluded.

use std::sync::{Arc, Barrier};
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use encore_core::device::{self, Opened};
use encore_core::DType;

use crate::model_arg::DeviceArg;
use crate::out::outln;
use crate::parse;

#[derive(Args)]
pub struct BenchAllreduceArgs {
    #[command(flatten)]
    device: DeviceArg,
    /// Message sizes in bytes (multiples of 16).
    #[arg(long, value_delimiter = ',', default_value = "8192,65536,524288,2097152,16777216", value_parser = parse::count::<16, { 1 << 30 }>)]
    bytes: Vec<usize>,
    /// All-reduces captured in one graph.
    #[arg(long, default_value = "100", value_parser = parse::count::<1, 10_000>, allow_negative_numbers = true)]
    per_graph: usize,
    /// Timed replays (after one warm-up replay).
    #[arg(long, default_value = "20", value_parser = parse::count::<1, 10_000>, allow_negative_numbers = true)]
    replays: usize,
    /// One JSON object per line instead of the table.
    #[arg(long)]
    json: bool,
}

/// Microseconds per all-reduce of `bytes` bytes (bf16) on `ranks`, median of the replays.
fn time(ranks: &[Opened], bytes: usize, per_graph: usize, replays: usize) -> Result<f64> {
    let barrier = Arc::new(Barrier::new(ranks.len()));
    let times = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|o| {
                let (be, barrier) = (o.backend(), barrier.clone());
                s.spawn(move || -> encore_core::Result<Vec<f64>> {
                    let x = be.alloc(DType::BF16, &[bytes / 2])?;
                    be.write_bytes(&x, &vec![0u8; bytes])?;
                    be.synchronize()?;
                    barrier.wait();
                    let graph = encore_core::bench::capture(&*be, || {
                        (0..per_graph).try_for_each(|_| be.all_reduce(&x))
                    })?;
                    let mut t = Vec::with_capacity(replays);
                    for _ in 0..=replays {
                        barrier.wait();
                        let t0 = Instant::now();
                        graph.replay()?;
                        be.synchronize()?;
                        t.push(t0.elapsed().as_secs_f64() * 1e6 / per_graph as f64);
                    }
                    Ok(t[1..].to_vec())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect::<Vec<_>>()
    });
    let mut rank0 = times.into_iter().next().expect("a rank")?;
    rank0.sort_by(f64::total_cmp);
    Ok(rank0[rank0.len() / 2])
}

pub fn run(a: BenchAllreduceArgs) -> Result<()> {
    let size = a.device.tensor_parallel_size;
    if size < 2 {
        bail!("bench allreduce needs --tensor-parallel-size 2 or more");
    }
    if let Some(b) = a.bytes.iter().find(|b| !b.is_multiple_of(16)) {
        bail!("--bytes {b}: not a multiple of 16");
    }
    let (ranks, note) = device::open_group(a.device.device, size)?;
    if let Some(note) = note {
        crate::out::errln!("note: {note}");
    }
    let cuda: Vec<_> = ranks
        .iter()
        .filter_map(|o| match o {
            Opened::Cuda(c) => Some(c.clone()),
            Opened::Cpu(_) => None,
        })
        .collect();
    let one_shot = !cuda.is_empty() && cuda.iter().all(|c| c.has_one_shot_allreduce());
    let device = ranks[0].backend().device_name();
    if !a.json {
        outln!(
            "all-reduce inside a graph, {size} ranks from {device}, bf16, {} per graph, median of {} replays",
            a.per_graph,
            a.replays
        )?;
        outln!(
            "{:>10}  {:>12}  {:>12}  {:>7}",
            "bytes",
            if cuda.is_empty() {
                "shared us"
            } else {
                "one-shot us"
            },
            "nccl us",
            "ratio"
        )?;
    }
    for &bytes in &a.bytes {
        let mut first = None;
        let mut nccl = None;
        if cuda.is_empty() || one_shot {
            first = Some(time(&ranks, bytes, a.per_graph, a.replays)?);
        }
        if !cuda.is_empty() {
            cuda.iter().for_each(|c| c.set_one_shot_allreduce(false));
            let t = time(&ranks, bytes, a.per_graph, a.replays);
            cuda.iter().for_each(|c| c.set_one_shot_allreduce(true));
            nccl = Some(t?);
        }
        let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        let ratio = match (first, nccl) {
            (Some(a), Some(b)) => format!("{:.2}", a / b),
            _ => "-".into(),
        };
        if a.json {
            let v = serde_json::json!({
                "bytes": bytes, "ranks": size, "device": device,
                "one_shot_us": first, "nccl_us": nccl,
            });
            outln!("{v}")?;
        } else {
            outln!(
                "{bytes:>10}  {:>12}  {:>12}  {ratio:>7}",
                fmt(first),
                fmt(nccl)
            )?;
        }
    }
    Ok(())
}
