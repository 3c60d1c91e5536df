//! `encore bench capture`: the memory of captured graphs — decode buckets and the pieces of
//! prefill token buckets — under each graph-memory strategy (`private`, `multi-va`,
//! `arena`), in the same engine on the same buckets: physical bytes, reserved virtual
//! bytes, capture time and mapping cost, beside the largest single bucket's need (its
//! measured arena peak) and the sum of all needs. Each strategy runs in an engine of its
//! own, started through `Engine::new`.

use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use encore_core::engine::{Engine, EngineConfig, KvSizing};
use encore_core::graph::{BucketPolicy, Key, Phase};
use encore_core::memory::GraphMemory;
use encore_core::model::config::ModelConfig;
use encore_core::model::llama::Model;
use encore_core::model::ModelFiles;
use encore_core::runner::{GraphConfig, Runner};
use encore_core::Backend;

use crate::model_arg::ModelArgs;
use crate::out::outln;
use crate::parse;

#[derive(Args)]
pub struct BenchCaptureArgs {
    #[command(flatten)]
    model: ModelArgs,
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
    /// One JSON object per strategy.
    #[arg(long)]
    json: bool,
}

fn mib(b: usize) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

/// The largest `--max-batch` (and bucket).
const MAX_BATCH: usize = 1 << 24;

/// KV block size of the engine the captures run in.
const BLOCK_SIZE: usize = 16;

/// The buckets `spec` lists for `flag` (the named policies stop at `cap`; `default(cap)`
/// is the flag's default) and the largest of them (0 for none); refused above
/// [`MAX_BATCH`].
fn parse_buckets(
    flag: &'static str,
    spec: &str,
    cap: usize,
    default: fn(usize) -> BucketPolicy,
) -> Result<(Vec<usize>, usize)> {
    let buckets = BucketPolicy::parse(flag, spec, cap, default(cap))?.buckets();
    let largest = buckets.iter().copied().max().unwrap_or(0);
    if largest > MAX_BATCH {
        bail!("{flag}: the largest bucket {largest} exceeds {MAX_BATCH}");
    }
    Ok((buckets, largest))
}

/// Put `keys` in a fixed (reproducible) shuffled order: an LCG-driven Fisher-Yates.
fn shuffle(keys: &mut [Key]) {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..keys.len()).rev() {
        s = s
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        keys.swap(i, (s >> 33) as usize % (i + 1));
    }
}

/// The buckets of a run: decode and token buckets as parsed, the largest of each, the
/// graph configuration, and the keys in capture order.
struct Plan {
    buckets: Vec<usize>,
    token_buckets: Vec<usize>,
    max_batch: usize,
    max_tokens: usize,
    graphs: GraphConfig,
    keys: Vec<Key>,
}

impl Plan {
    fn new(a: &BenchCaptureArgs) -> Result<Self> {
        let vllm = |max| BucketPolicy::VllmLike { max };
        let (buckets, largest) = parse_buckets("--buckets", &a.buckets, a.max_batch, vllm)?;
        // A list's largest size wins if larger (--max-batch is at most MAX_BATCH).
        let max_batch = largest.max(a.max_batch);
        let sglang = |max| BucketPolicy::SglangLike { max };
        let (token_buckets, max_tokens) = parse_buckets(
            "--prefill-buckets",
            &a.prefill_buckets,
            a.max_tokens,
            sglang,
        )?;
        let graphs = GraphConfig {
            decode: BucketPolicy::Explicit(buckets.clone()),
            mixed: BucketPolicy::Explicit(token_buckets.clone()),
            verify: 0,
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
            "shuffled" => shuffle(&mut keys),
            o => bail!("--order `{o}`: expected ascending, descending or shuffled"),
        }
        Ok(Plan {
            buckets,
            token_buckets,
            max_batch,
            max_tokens,
            graphs,
            keys,
        })
    }

    /// The engine every strategy's captures run in (eager at start, nothing captured):
    /// its memory check counts, for `private`, every bucket's arena at once beside it.
    fn engine_config(
        &self,
        a: &BenchCaptureArgs,
        be: &dyn Backend,
        cfg: &ModelConfig,
    ) -> EngineConfig {
        let (dtype, max_batch) = (a.model.dtype, self.max_batch);
        let table_width = a.max_seq_len.div_ceil(BLOCK_SIZE);
        let arena = |n: usize, b: usize| {
            Model::arena_bytes_for(cfg, dtype, be, n, b, table_width, BLOCK_SIZE)
        };
        let private_bytes = if a.strategies.contains(&GraphMemory::Private) {
            let decode = self.buckets.iter().map(|&b| arena(b, b));
            let mixed = self
                .token_buckets
                .iter()
                .map(|&t| arena(t, t.min(max_batch)));
            decode.chain(mixed).fold(0, usize::saturating_add)
        } else {
            0
        };
        EngineConfig {
            graphs: Some(self.graphs.clone()),
            extra_bytes: private_bytes,
            run_name: format!(
                "bench capture --max-batch {max_batch} --max-tokens {} ({} decode and {} token buckets)",
                self.max_tokens,
                self.buckets.len(),
                self.token_buckets.len()
            ),
            fix_hint:
                "lower --max-batch, --max-tokens or --max-seq-len, or leave out the private strategy"
                    .into(),
            // Captures run padding rows only: the KV cache needs the null block and
            // little else.
            ..EngineConfig::new(
                dtype,
                BLOCK_SIZE,
                max_batch.max(self.max_tokens),
                max_batch,
                a.max_seq_len,
                KvSizing::Blocks(1 + max_batch),
            )
        }
    }
}

pub fn run(a: BenchCaptureArgs) -> Result<()> {
    if a.strategies.is_empty() {
        bail!("--strategies: name at least one of private, multi-va, arena");
    }
    let plan = Plan::new(&a)?;
    let (opened, cfg, source) = a.model.open_one("bench capture")?;
    let be = opened.backend();
    let be = be.as_ref();
    if a.max_seq_len == 0 || a.max_seq_len > cfg.max_position_embeddings {
        bail!(
            "--max-seq-len {} must be in 1..={} (the model's max_position_embeddings)",
            a.max_seq_len,
            cfg.max_position_embeddings
        );
    }
    let engine_cfg = plan.engine_config(&a, be, &cfg);
    let files = ModelFiles {
        config: cfg,
        source,
    };
    let granularity = be.vmm()?.granularity();
    for (i, &strategy) in a.strategies.iter().enumerate() {
        // A fresh engine (its arena, no graphs) per strategy: the previous one was
        // dropped first.
        let cfg = EngineConfig {
            graph_memory: strategy,
            ..engine_cfg.clone()
        };
        let bars = crate::progress::Bars::new(!a.json);
        let Engine { mut runner, .. } = Engine::new(be, files.clone(), &cfg, &bars)?;
        if i == 0 && !a.json {
            header(&a, be.device_name(), &plan, granularity)?;
        }
        measure(&a, be, &plan, strategy, &mut runner)?;
    }
    if !a.json {
        outln!(
            "capture s: the captures themselves (incl. the arena's range switch and remap); total s adds one eager warm-up step per bucket"
        )?;
    }
    Ok(())
}

/// The run's description and the table's column names.
fn header(a: &BenchCaptureArgs, device: String, plan: &Plan, granularity: usize) -> Result<()> {
    outln!(
        "{} on {}, {}: {} decode buckets ({} .. {}) and {} token buckets (.. {}), captured {}, granularity {} KiB",
        a.model.model,
        device,
        a.model.dtype,
        plan.buckets.len(),
        plan.buckets.iter().min().unwrap_or(&0),
        plan.max_batch,
        plan.token_buckets.len(),
        plan.max_tokens,
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
    Ok(())
}

/// Capture every key of `plan` in `runner` (whose graphs hold their memory per
/// `strategy`) and report the memory and time it took.
fn measure(
    a: &BenchCaptureArgs,
    be: &dyn Backend,
    plan: &Plan,
    strategy: GraphMemory,
    runner: &mut Runner<'_>,
) -> Result<()> {
    be.synchronize()?;
    let free_before = be.memory_info().map(|(f, _)| f);
    let t = Instant::now();
    for &k in &plan.keys {
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
                "strategy": strategy.name(), "model": a.model.model,
                "device": be.device_name(), "dtype": a.model.dtype.to_string(),
                "order": a.order, "buckets": plan.buckets,
                "token_buckets": plan.token_buckets, "pieces": g.pieces,
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
    Ok(())
}
