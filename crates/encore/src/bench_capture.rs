//! `encore bench capture`: the memory of captured graphs — decode buckets and the pieces of
//! prefill token buckets — under each graph-memory strategy (`private`, `multi-va`,
//! `arena`), in the same engine on the same buckets: physical bytes, reserved virtual
//! bytes, capture time and mapping cost, beside the largest single bucket's need (its
//! measured arena peak) and the sum of all needs.

use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use encore_core::graph::{BucketPolicy, Key, Phase};
use encore_core::memory::GraphMemory;
use encore_core::model::llama::Model;
use encore_core::model::weights;
use encore_core::runner::{GraphConfig, Runner, RunnerConfig};
use encore_core::DType;

use crate::out::outln;
use crate::{parse, DeviceArg};

#[derive(Args)]
pub struct BenchCaptureArgs {
    /// A Hugging Face model directory, a `.gguf` file, or `dummy:NAME`.
    #[arg(long, default_value = "dummy:tiny")]
    model: String,
    /// `vllm` (vLLM's default sizes up to --max-batch), `pow2`, or a comma-separated list.
    #[arg(long, default_value = "vllm")]
    buckets: String,
    /// The largest batch (caps `vllm` and `pow2`; a list's largest size wins if larger).
    #[arg(long, default_value = "256", value_parser = parse::count::<1, { MAX_BATCH }>, allow_negative_numbers = true)]
    max_batch: usize,
    /// Prefill token buckets captured as pieces beside the decode buckets: sglang, pow2,
    /// none, or a comma-separated list, up to --max-tokens.
    #[arg(long, default_value = "sglang")]
    prefill_buckets: String,
    /// The largest prefill token bucket (caps `sglang` and `pow2`).
    #[arg(long, default_value = "2048", value_parser = parse::count::<1, { MAX_BATCH }>, allow_negative_numbers = true)]
    max_tokens: usize,
    /// Capture order: ascending (every capture grows the memory), descending, shuffled.
    #[arg(long, default_value = "ascending", value_parser = ["ascending", "descending", "shuffled"])]
    order: String,
    /// Strategies to measure, comma-separated.
    #[arg(long, default_value = "private,multi-va,arena", value_delimiter = ',')]
    strategies: Vec<GraphMemory>,
    /// Longest sequence the block tables cover (shapes the attention scratch).
    #[arg(long, default_value = "2048", value_parser = parse::count::<1, { usize::MAX }>, allow_negative_numbers = true)]
    max_seq_len: usize,
    #[command(flatten)]
    device: DeviceArg,
    /// Run dtype: bf16, f16 or f32 (also bfloat16, fp16, float16, half, fp32, float32;
    /// any case).
    #[arg(long, default_value = "bf16", value_parser = parse::dtype)]
    dtype: DType,
    /// One JSON object per strategy.
    #[arg(long)]
    json: bool,
}

fn mib(b: usize) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

/// The largest `--max-batch` (and bucket).
const MAX_BATCH: usize = 1 << 24;

pub fn run(a: BenchCaptureArgs) -> Result<()> {
    let dtype = a.dtype;
    if a.strategies.is_empty() {
        bail!("--strategies: name at least one of private, multi-va, arena");
    }
    let listed = BucketPolicy::parse(
        "--buckets",
        &a.buckets,
        a.max_batch,
        BucketPolicy::VllmLike { max: a.max_batch },
    )?;
    let buckets = listed.buckets();
    let max_batch = buckets.iter().copied().max().unwrap_or(1).max(a.max_batch);
    if max_batch > MAX_BATCH {
        bail!("--buckets: the largest bucket {max_batch} exceeds {MAX_BATCH}");
    }
    let policy = BucketPolicy::Explicit(buckets.clone());
    let prefill = BucketPolicy::parse(
        "--prefill-buckets",
        &a.prefill_buckets,
        a.max_tokens,
        BucketPolicy::SglangLike { max: a.max_tokens },
    )?;
    let token_buckets = prefill.buckets();
    let max_tokens = token_buckets.iter().copied().max().unwrap_or(0);
    if max_tokens > MAX_BATCH {
        bail!("--prefill-buckets: the largest bucket {max_tokens} exceeds {MAX_BATCH}");
    }
    let graphs = GraphConfig {
        decode: policy.clone(),
        mixed: BucketPolicy::Explicit(token_buckets.clone()),
    };
    // Decode buckets, then token buckets, each ascending; then put in --order.
    let mut keys: Vec<Key> = buckets
        .iter()
        .map(|&bucket| Key {
            phase: Phase::Decode,
            bucket,
        })
        .chain(token_buckets.iter().map(|&bucket| Key {
            phase: Phase::Mixed,
            bucket,
        }))
        .collect();
    match a.order.as_str() {
        "ascending" => {}
        "descending" => keys.reverse(),
        "shuffled" => {
            // A fixed permutation (reproducible): an LCG-driven Fisher-Yates.
            let mut s = 0x9e37_79b9_7f4a_7c15u64;
            for i in (1..keys.len()).rev() {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                keys.swap(i, (s >> 33) as usize % (i + 1));
            }
        }
        o => bail!("--order `{o}`: expected ascending, descending or shuffled"),
    }
    let opened = crate::model_arg::open_device(a.device.device)?;
    let be = opened.backend();
    let be = be.as_ref();
    let (cfg, source) = crate::model_arg::resolve(&a.model)?;
    if a.max_seq_len == 0 || a.max_seq_len > cfg.max_position_embeddings {
        bail!(
            "--max-seq-len {} must be in 1..={} (the model's max_position_embeddings)",
            a.max_seq_len,
            cfg.max_position_embeddings
        );
    }
    // Captures run padding rows only: the KV cache needs the null block and little else.
    let runner_cfg = RunnerConfig {
        block_size: 16,
        num_blocks: 1 + max_batch,
        max_tokens_per_step: max_batch.max(max_tokens),
        max_seqs: max_batch,
        max_seq_len: a.max_seq_len,
        penalty_slots: 0,
    };
    // `private` holds every bucket's need at once (the others hold the largest).
    let mut need = runner_cfg.memory_need(be, &cfg, dtype);
    if a.strategies.contains(&GraphMemory::Private) {
        let table_width = a.max_seq_len.div_ceil(runner_cfg.block_size);
        need.activations = buckets
            .iter()
            .map(|&b| Model::arena_bytes_for(&cfg, dtype, be, b, b, table_width, 16))
            .chain(token_buckets.iter().map(|&t| {
                Model::arena_bytes_for(&cfg, dtype, be, t, t.min(max_batch), table_width, 16)
            }))
            .fold(need.activations, usize::saturating_add);
    }
    crate::model_arg::check_memory(
        be,
        &need,
        &format!(
            "bench capture --max-batch {max_batch} --max-tokens {max_tokens} ({} decode and {} token buckets)",
            buckets.len(),
            token_buckets.len()
        ),
        "lower --max-batch, --max-tokens or --max-seq-len, or leave out the private strategy",
    )?;
    let w = weights::load(
        be,
        &cfg,
        source,
        dtype,
        &crate::progress::Bars::new(!a.json),
    )?;
    let model = Model::new(be, cfg, w, a.max_seq_len)?;
    let mut runner = Runner::new(be, model, runner_cfg)?;
    let granularity = be.vmm()?.granularity();
    if !a.json {
        outln!(
            "{} on {}, {dtype}: {} decode buckets ({} .. {}) and {} token buckets (.. {max_tokens}), captured {}, granularity {} KiB",
            a.model,
            be.device_name(),
            buckets.len(),
            buckets.iter().min().unwrap_or(&0),
            max_batch,
            token_buckets.len(),
            a.order,
            granularity >> 10
        )?;
        outln!(
            "{:<9} {:>12} {:>12} {:>7} {:>7} {:>10} {:>10} {:>9} {:>9} {:>13} {:>13}",
            "strategy",
            "physical MiB",
            "virtual MiB",
            "chunks",
            "ranges",
            "capture s",
            "total s",
            "map ms",
            "remap ms",
            "largest MiB",
            "sum MiB"
        )?;
    }
    for &strategy in &a.strategies {
        // A fresh arena (and no graphs) per strategy: the previous one is released first.
        runner.set_graphs(None);
        runner.set_graph_memory(strategy)?;
        runner.set_graphs(Some(graphs.clone()));
        be.synchronize()?;
        let free_before = be.memory_info().map(|(f, _)| f);
        let t = Instant::now();
        for &k in &keys {
            runner.capture_key(k)?;
        }
        be.synchronize()?;
        let total_secs = t.elapsed().as_secs_f64();
        let free_after = be.memory_info().map(|(f, _)| f);
        let device_bytes = free_before
            .zip(free_after)
            .map(|(b, a)| b.saturating_sub(a));
        let m = runner.graph_memory_stats();
        let g = runner.graph_stats().unwrap_or_default();
        let needs = runner.captured();
        let largest = needs.iter().map(|&(_, n)| n).max().unwrap_or(0);
        let sum: usize = needs.iter().map(|&(_, n)| n).sum();
        if a.json {
            outln!(
                "{}",
                serde_json::json!({
                    "strategy": strategy.name(), "model": a.model, "device": be.device_name(),
                    "dtype": dtype.to_string(), "order": a.order, "buckets": buckets,
                    "token_buckets": token_buckets, "pieces": g.pieces,
                    "physical_bytes": m.physical_bytes, "virtual_bytes": m.virtual_bytes,
                    "chunks": m.chunks, "ranges": m.ranges, "granularity": m.granularity,
                    "capture_seconds": g.capture_secs, "total_seconds": total_secs,
                    "map_seconds": m.map_secs, "remap_seconds": m.remap_secs,
                    "remapped_chunks": m.remaps,
                    "remap_seconds_per_capture": m.remap_secs / g.captures.max(1) as f64,
                    "largest_bucket_bytes": largest, "sum_bucket_bytes": sum,
                    "peak_bytes": m.peak_bytes, "device_bytes": device_bytes,
                })
            )?;
        } else {
            outln!(
                "{:<9} {:>12.1} {:>12.1} {:>7} {:>7} {:>10.3} {:>10.3} {:>9.2} {:>9.2} {:>13.1} {:>13.1}",
                strategy.name(),
                mib(m.physical_bytes),
                mib(m.virtual_bytes),
                m.chunks,
                m.ranges,
                g.capture_secs,
                total_secs,
                m.map_secs * 1e3,
                m.remap_secs * 1e3,
                mib(largest),
                mib(sum)
            )?;
        }
    }
    if !a.json {
        outln!(
            "capture s: the captures themselves (incl. the arena's range switch and remap); total s adds one eager warm-up step per bucket"
        )?;
    }
    Ok(())
}
