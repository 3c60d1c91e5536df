//! `encore bench offload`: decode-step latency under weight budgets, per offload policy
//! (planned, LRU) and mode (graph, eager), beside the PCIe bound: the bytes streamed per
//! step over the measured page-locked host-to-device bandwidth. One engine per (budget,
//! policy), freed before the next; each batch prefills `--context` tokens per sequence
//! then times decode steps with `bench decode`'s helpers.

use anyhow::{bail, Result};
use clap::Args;
use encore_core::bench;
use encore_core::engine::Engine;
use encore_core::graph::BucketPolicy;
use encore_core::model::config::ModelConfig;
use encore_core::offload::{self, AccessOrder, OffloadConfig, Policy, WeightBudget};
use encore_core::runner::{Runner, Seqs};
use encore_core::{Backend, DType};
use serde_json::json;

use crate::bench_decode::{self, DecodeRuns};
use crate::model_arg::ModelArgs;
use crate::offload_arg::{self, human};
use crate::out::{errln, outln};

#[derive(Args)]
#[command(
    mut_arg("batch", |a| a.default_value("1,64")),
    mut_arg("steps", |a| a.default_value("10"))
)]
pub struct BenchOffloadArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Weight budgets in percent of the weights, comma-separated, each in (0, 100] (a
    /// trailing % is allowed); 100, or any budget that holds every weight, is the
    /// resident reference row.
    #[arg(
        long,
        default_value = "100,75,50,25",
        value_delimiter = ',',
        value_parser = percent,
        allow_negative_numbers = true
    )]
    budgets: Vec<f64>,
    #[command(flatten)]
    runs: DecodeRuns,
    /// Offload policies, comma-separated: auto, planned, lru, experts [default: auto,lru;
    /// auto with --graphs-only].
    #[arg(long, value_delimiter = ',', value_parser = offload_arg::policy)]
    policy: Vec<Policy>,
    /// Time eager steps only (by default the planned policy and the resident rows are
    /// timed replayed from captured graphs and eagerly; LRU only eagerly).
    #[arg(long, conflicts_with = "graphs_only")]
    eager: bool,
    /// Time graph replays only (the planned policy and the resident rows; LRU decides its
    /// copies at run time and cannot be captured).
    #[arg(long)]
    graphs_only: bool,
    /// One JSON object per row.
    #[arg(long)]
    json: bool,
}

/// `--budgets`: a percentage in (0, 100], optionally followed by `%`.
fn percent(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let t = t.strip_suffix('%').unwrap_or(t).trim();
    match t.parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 100.0 => Ok(p),
        _ => Err("must be a percentage of the weights in (0, 100]".into()),
    }
}

/// Host-to-device bytes per bandwidth measurement: 256 MiB on a GPU (PCIe needs large
/// copies to reach its rate), 16 MiB on the CPU twin (a memcpy, and CI time).
fn h2d_bytes(on_gpu: bool) -> usize {
    if on_gpu {
        256 << 20
    } else {
        16 << 20
    }
}

/// One engine of the benchmark: a budget and, unless every weight stays resident, its
/// policy.
struct Run {
    percent: f64,
    config: OffloadConfig,
    /// `None`: the budget holds every weight.
    offloaded: Option<Policy>,
}

/// The policies to time: `--policy` without repeats, or planned and LRU (planned alone
/// with `--graphs-only`, which refuses LRU).
fn policies(a: &BenchOffloadArgs) -> Result<Vec<Policy>> {
    let mut policies: Vec<Policy> = Vec::new();
    for &p in &a.policy {
        if !policies.contains(&p) {
            policies.push(p);
        }
    }
    if policies.is_empty() {
        policies.push(Policy::Auto);
        if !a.graphs_only {
            policies.push(Policy::Lru);
        }
    }
    for p in policies.iter().filter(|_| a.graphs_only) {
        p.check_graphs(true)
            .map_err(|e| anyhow::anyhow!("--graphs-only with --policy {}: {e}", p.name()))?;
    }
    Ok(policies)
}

/// One engine per (budget, policy), one resident run per budget that holds every weight.
/// Every budget is checked (floor, plan) before anything is allocated.
fn plan_runs(
    budgets: &[f64],
    policies: &[Policy],
    cfg: &ModelConfig,
    dtype: DType,
    max_tokens: usize,
) -> Result<Vec<Run>> {
    let mut runs: Vec<Run> = Vec::new();
    for &percent in budgets {
        for &policy in policies {
            let config = OffloadConfig {
                budget: WeightBudget::Percent(percent),
                policy,
                expert_prefetch: false,
            };
            let offloaded = offload::device_bytes(cfg, dtype, &config, max_tokens)
                .map_err(|e| anyhow::anyhow!("--budgets {percent}: {e}"))?
                .map(|_| policy.resolve(cfg));
            if offloaded.is_none() && runs.iter().any(|r| r.percent == percent) {
                continue; // one resident row per budget, whatever the policy
            }
            runs.push(Run {
                percent,
                config,
                offloaded,
            });
        }
    }
    Ok(runs)
}

/// The measured host-to-device bandwidths (GB/s): queued, and captured into a graph.
struct Bandwidth {
    h2d_gbs: f64,
    h2d_graph_gbs: f64,
}

/// The table's title line and column heads (none with `--json`).
fn print_header(
    a: &BenchOffloadArgs,
    be: &dyn Backend,
    weight_bytes: usize,
    bw: &Bandwidth,
) -> Result<()> {
    if a.json {
        return Ok(());
    }
    outln!(
        "{} on {}: {} of weights ({}); page-locked host-to-device {:.1} GB/s ({:.1} GB/s captured in a graph); context {}, median of {} steps",
        a.model.model,
        be.device_name(),
        human(weight_bytes),
        a.model.dtype,
        bw.h2d_gbs,
        bw.h2d_graph_gbs,
        a.runs.context,
        a.runs.steps
    )?;
    outln!(
        "{:>8} {:>5} {:>6} {:>7} {:>11} {:>11} {:>11} {:>11} {:>10} {:>11} {:>10} {:>8} {:>6}",
        "policy",
        "mode",
        "batch",
        "budget",
        "budget B",
        "resident",
        "ring/pool",
        "streamed",
        "step ms",
        "tok/s",
        "pcie ms",
        "x bound",
        "hit %"
    )?;
    Ok(())
}

pub fn run(a: BenchOffloadArgs) -> Result<()> {
    let max_batch = a.runs.max_batch()?;
    if a.budgets.is_empty() {
        bail!("--budgets: give at least one percentage");
    }
    let policies = policies(&a)?;
    let dtype = a.model.dtype;
    let (opened, cfg, source) = a.model.open_one("bench offload")?;
    let be = opened.backend();
    let be = be.as_ref();
    let max_seq_len = a.runs.eager_and_graph_positions(&cfg)?;
    let weight_bytes = cfg.weight_bytes(dtype);
    let runs = plan_runs(
        &a.budgets,
        &policies,
        &cfg,
        dtype,
        bench_decode::max_tokens(max_batch),
    )?;
    // Bytes each planned stream copies per step: the weights' own sizes (the plan's slots
    // are rounded up to the slot alignment; the copies are not).
    let true_sizes: Vec<usize> = AccessOrder::llama(&cfg, dtype)?
        .weights()
        .iter()
        .map(|w| w.bytes)
        .collect();
    let bw = Bandwidth {
        h2d_gbs: bench::h2d_bandwidth(be, h2d_bytes(be.memory_info().is_some()))?,
        // The same copies captured into a graph: what a captured copy costs against a
        // queued one (graph rows copy that way).
        h2d_graph_gbs: bench::h2d_bandwidth_captured(be, h2d_bytes(be.memory_info().is_some()))?,
    };
    print_header(&a, be, weight_bytes, &bw)?;
    for r in &runs {
        let policy_name = r.offloaded.map_or("resident", Policy::name);
        let engine_cfg = bench_decode::engine_config(
            dtype,
            max_batch,
            max_seq_len,
            Some(r.config),
            format!(
                "bench offload --budgets {} --policy {policy_name} --batch {max_batch} --context {}",
                r.percent, a.runs.context
            ),
            "lower --batch or --context",
        );
        let Engine { mut runner, report } =
            bench_decode::start_engine(be, &cfg, source.clone(), &engine_cfg, a.json)?;
        let bytes = match &report.offload {
            Some(o) => (o.budget_bytes, o.resident_bytes, o.streaming_bytes),
            None => (r.config.budget.bytes(weight_bytes), weight_bytes, 0),
        };
        let planned_per_step = runner.model().offload().and_then(|o| o.plan()).map(|p| {
            p.streams
                .iter()
                .map(|s| true_sizes[s.weight])
                .sum::<usize>()
        });
        let engine = EngineRows {
            run: r,
            bytes,
            planned_per_step,
        };
        time_rows(&a, &bw, &mut runner, &engine, max_batch)?;
        // Free this engine's device memory before the next one starts.
        release(be, runner)?;
    }
    if !a.json && runs.iter().all(|r| r.offloaded.is_none()) {
        errln!("note: every budget holds all the weights; nothing was offloaded");
    }
    Ok(())
}

/// One engine's run and what its start-up said.
struct EngineRows<'r> {
    run: &'r Run,
    /// The budget's, the resident weights' and the streaming buffers' bytes.
    bytes: (usize, usize, usize),
    /// The plan's bytes streamed per step (the planned policy).
    planned_per_step: Option<usize>,
}

/// Time and print every batch size and mode (graph unless `--eager` or LRU, eager unless
/// `--graphs-only`) of one engine.
fn time_rows(
    a: &BenchOffloadArgs,
    bw: &Bandwidth,
    runner: &mut Runner<'_>,
    e: &EngineRows<'_>,
    max_batch: usize,
) -> Result<()> {
    let r = e.run;
    let mut held = Seqs::for_runner(runner)?;
    let mut modes: Vec<&str> = Vec::new();
    if !a.eager && r.offloaded != Some(Policy::Lru) {
        modes.push("graph");
    }
    if !a.graphs_only {
        modes.push("eager");
    }
    for &b in &a.runs.batch {
        let seqs = bench_decode::prefill(runner, &mut held, b, a.runs.context)?;
        let mut last = vec![1u32; b];
        for &mode in &modes {
            let graph = mode == "graph";
            if graph {
                runner.set_graph_mode(Some(BucketPolicy::VllmLike { max: max_batch }));
            }
            let timed =
                bench_decode::time_decode(runner, &mut held, &seqs, &mut last, a.runs.steps);
            if graph {
                runner.set_graph_mode(None);
            }
            let timed = timed?;
            let steps = a.runs.steps as f64;
            let measured = match timed.experts {
                Some(x) => Some(x.bytes as f64 / steps),
                None => timed.copied_bytes.map(|c| c as f64 / steps),
            };
            let row = Row {
                run: r,
                mode,
                batch: b,
                bytes: e.bytes,
                streamed: streamed_per_step(r, graph, e.planned_per_step, measured)?,
                step_ms: timed.median_s * 1e3,
                hit_rate: timed.experts.map(|x| x.hit_rate()),
            };
            print_row(a, bw, &row)?;
        }
        bench_decode::free(&mut held, &seqs)?;
    }
    Ok(())
}

/// Bytes run `r` streamed per step: none when resident, the plan's for the planned
/// policy (checked against the executor's count in eager mode; in graph mode the host
/// does not see the copies), else what the executor counted.
fn streamed_per_step(
    r: &Run,
    graph: bool,
    planned_per_step: Option<usize>,
    measured: Option<f64>,
) -> Result<usize> {
    Ok(match (r.offloaded, planned_per_step, measured) {
        (None, ..) => 0,
        (Some(Policy::Planned), Some(plan), m) => {
            if let (false, Some(m)) = (graph, m) {
                if m != plan as f64 {
                    bail!(
                        "the planned offload at {}% copied {m} bytes per step in eager mode; its plan streams {plan}",
                        r.percent
                    );
                }
            }
            plan
        }
        (Some(_), _, Some(m)) => m.round() as usize,
        (Some(p), ..) => bail!(
            "the engine at {}% ({}) reports no offload executor",
            r.percent,
            p.name()
        ),
    })
}

/// One measured row.
struct Row<'r> {
    run: &'r Run,
    mode: &'r str,
    batch: usize,
    /// The budget's, the resident weights' and the streaming buffers' bytes.
    bytes: (usize, usize, usize),
    /// Bytes streamed per step.
    streamed: usize,
    /// The median step.
    step_ms: f64,
    /// The expert cache's hits over needed experts (the experts policy).
    hit_rate: Option<f64>,
}

/// A row of the table, or a JSON object with `--json`.
fn print_row(a: &BenchOffloadArgs, bw: &Bandwidth, row: &Row<'_>) -> Result<()> {
    let r = row.run;
    let policy_name = r.offloaded.map_or("resident", Policy::name);
    let (budget_bytes, resident_bytes, streaming_bytes) = row.bytes;
    let (mode, b, streamed, step_ms) = (row.mode, row.batch, row.streamed, row.step_ms);
    let pcie_bound_ms = streamed as f64 / (bw.h2d_gbs * 1e9) * 1e3;
    let bound_ratio =
        (r.offloaded.is_some() && pcie_bound_ms > 0.0).then(|| step_ms / pcie_bound_ms);
    let tok_s = b as f64 / step_ms * 1e3;
    if a.json {
        outln!(
            "{}",
            json!({
                "policy": policy_name, "mode": mode, "batch": b,
                "budget_fraction": r.percent / 100.0, "budget_bytes": budget_bytes,
                "resident_bytes": resident_bytes, "streaming_bytes": streaming_bytes,
                "streamed_bytes_per_step": streamed, "step_ms": step_ms,
                "tok_s": tok_s, "pcie_bound_ms": pcie_bound_ms,
                "bound_ratio": bound_ratio, "h2d_gbs": bw.h2d_gbs,
                "h2d_graph_gbs": bw.h2d_graph_gbs, "expert_hit_rate": row.hit_rate,
            })
        )?;
    } else {
        outln!(
            "{:>8} {:>5} {:>6} {:>6}% {:>11} {:>11} {:>11} {:>11} {:>10.3} {:>11.1} {:>10.3} {:>8} {:>6}",
            policy_name,
            mode,
            b,
            r.percent,
            human(budget_bytes),
            human(resident_bytes),
            human(streaming_bytes),
            human(streamed),
            step_ms,
            tok_s,
            pcie_bound_ms,
            bound_ratio.map_or("-".into(), |x| format!("{x:.2}")),
            row.hit_rate
                .map_or("-".into(), |h| format!("{:.1}", h * 100.0))
        )?;
    }
    Ok(())
}

/// Drop a runner (its weights, ring, cache and graphs) once the device is idle.
fn release(be: &dyn encore_core::Backend, runner: Runner<'_>) -> Result<()> {
    be.synchronize()?;
    drop(runner);
    Ok(())
}
