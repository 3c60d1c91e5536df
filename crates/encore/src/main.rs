//! The `encore` command line: `info` (backends, devices, kernels, self-check),
//! `generate`, `serve`, and `bench kernels | decode | prefill | capture | serve | offload`.
//!
//! One module per command (`generate_cmd`, `serve_cmd`, `bench_*`, `bench_serve/`), and
//! the flags they share, declared once and flattened into them: `model_arg` (`--model`,
//! `--device`, `--dtype`), `engine_arg` (the engine flags, which yield the engine's and the
//! scheduler's configuration), `offload_arg` (the weight budget), `graphs` (bucket
//! policies). Every command that runs a model starts it through
//! `encore_core::engine::Engine::new`, directly or in the engine loop. See ARCHITECTURE.md.

mod bench_allreduce;
mod bench_capture;
mod bench_decode;
mod bench_offload;
mod bench_prefill;
mod bench_serve;
mod bench_structured;
mod engine_arg;
mod generate_cmd;
mod graphs;
mod model_arg;
mod offload_arg;
mod out;
mod parse;
mod progress;
mod prompts;
mod serve_cmd;

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use encore_core::backend::cuda::{self, CudaLibraries};
use encore_core::bench::{self, AttentionShape, BenchRow, MoeShape};
use encore_core::device::{self, Opened};
use encore_core::quant::QuantFormat;
use encore_core::testing::{self, CheckResult};
use encore_core::DType;
use indicatif::{ProgressBar, ProgressStyle};
pub use model_arg::DeviceArg;
use out::{errln, outln};

#[derive(Parser)]
#[command(
    name = "encore",
    version,
    about = "LLM inference engine built around graph mode"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Backends and devices found, CUDA libraries, kernels compiled, and a self-check of
    /// each backend's kernels against the CPU reference.
    Info(InfoArgs),
    /// Generate text for one or more prompts (one batch).
    Generate(generate_cmd::GenerateArgs),
    /// An OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions,
    /// /v1/models, /health, /metrics).
    Serve(serve_cmd::ServeArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Args)]
struct InfoArgs {
    #[command(flatten)]
    device: DeviceArg,
    /// Skip the kernel self-check.
    #[arg(long)]
    no_self_check: bool,
    /// Seed of the self-check's random inputs (default: from the clock, so each run draws
    /// fresh inputs).
    #[arg(long, allow_negative_numbers = true)]
    seed: Option<u64>,
    /// Also show how this model's weights are stored (format and bytes per group) under
    /// --quantization and --dtype.
    #[arg(long)]
    model: Option<String>,
    /// With --model: auto, none or a format (see `generate --help`).
    #[arg(long, default_value = "auto", value_parser = parse::quantization)]
    quantization: encore_core::model::formats::Quantization,
    /// With --model: the run dtype.
    #[arg(long, default_value = "bf16", value_parser = parse::dtype)]
    dtype: encore_core::DType,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// GEMM TFLOP/s, decode-attention bandwidth, copy bandwidth, launch cost eager vs graph.
    Kernels(BenchKernelsArgs),
    /// Decode-step latency at several batch sizes beside the weight-bandwidth floor.
    Decode(bench_decode::BenchDecodeArgs),
    /// Prefill latency and tokens/s at several prompt lengths and batch sizes (eager).
    Prefill(bench_prefill::BenchPrefillArgs),
    /// Memory of captured decode graphs per graph-memory strategy (private, multi-va,
    /// arena): physical and virtual bytes, capture time, the largest bucket's need.
    Capture(bench_capture::BenchCaptureArgs),
    /// A serving benchmark against a running server (--url) or the engine in this process
    /// (--in-process): Poisson, fixed-rate or all-at-once arrivals, length ranges or a
    /// JSONL trace, a concurrency limit; request and token throughput, TTFT, TPOT and
    /// inter-token latency percentiles.
    Serve(Box<bench_serve::BenchServeArgs>),
    /// Decode-step latency under weight budgets (--weight-budget), planned vs LRU, graph
    /// vs eager, beside the PCIe bound (bytes streamed per step / measured host-to-device
    /// bandwidth).
    Offload(bench_offload::BenchOffloadArgs),
    /// Host cost of structured outputs for a model's tokenizer: indexing it, compiling JSON
    /// schemas (p50/p99), and the allowed-token mask and advance per generated token.
    Structured(bench_structured::BenchStructuredArgs),
    /// All-reduce latency over a tensor-parallel group inside a captured graph, per
    /// message size: the one-shot peer-memory kernel against NCCL (CUDA), or the CPU
    /// twin's shared-memory reduce.
    Allreduce(bench_allreduce::BenchAllreduceArgs),
}

#[derive(Args)]
struct BenchKernelsArgs {
    #[command(flatten)]
    device: DeviceArg,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Small shapes and few iterations (for a quick look, e.g. on CPU).
    #[arg(long)]
    quick: bool,
    /// Only these groups (comma-separated; all by default).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<KernelGroup>,
}

/// The groups of `bench kernels`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum KernelGroup {
    Gemm,
    Copy,
    Gemv,
    Attention,
    PrefillAttention,
    Launch,
    Moe,
    /// Quantized weights' GEMMs: the repacked mixed-input GEMM against the block layout's
    /// path and the bf16 GEMM, at the 8B's projections.
    QuantGemm,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ENCORE_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result: Result<ExitCode> = match cli.command {
        Command::Info(a) => info(a),
        Command::Generate(a) => generate_cmd::run(a).map(|_| ExitCode::SUCCESS),
        Command::Serve(a) => serve_cmd::run(a).map(|_| ExitCode::SUCCESS),
        Command::Bench(BenchCommand::Kernels(a)) => bench_kernels(a),
        Command::Bench(BenchCommand::Decode(a)) => bench_decode::run(a).map(|_| ExitCode::SUCCESS),
        Command::Bench(BenchCommand::Prefill(a)) => {
            bench_prefill::run(a).map(|_| ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Capture(a)) => {
            bench_capture::run(a).map(|_| ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Serve(a)) => bench_serve::run(*a).map(|_| ExitCode::SUCCESS),
        Command::Bench(BenchCommand::Offload(a)) => {
            bench_offload::run(a).map(|_| ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Allreduce(a)) => {
            bench_allreduce::run(a).map(|_| ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Structured(a)) => {
            bench_structured::run(a).map(|_| ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        // Stdout's reader went away (`encore generate | head -c 5`): stop quietly.
        Err(e) if out::is_broken_pipe(&e) => ExitCode::from(out::BROKEN_PIPE_STATUS),
        Err(e) => {
            errln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn spinner(msg: &str) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(std::time::Duration::from_millis(100));
    pb
}

fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

fn info(args: InfoArgs) -> Result<ExitCode> {
    let spec = args.device.device;
    if args.device.tensor_parallel_size > 1 {
        anyhow::bail!("--tensor-parallel-size: info opens one device");
    }
    outln!("encore {}", env!("CARGO_PKG_VERSION"))?;
    if let Some(model) = &args.model {
        let (cfg, _) = model_arg::resolve(model, "main", args.quantization)?;
        outln!(
            "model    {model}: {:?}, {} layers, hidden {}",
            cfg.arch,
            cfg.num_layers,
            cfg.hidden_size
        )?;
        let decl = cfg.decl();
        outln!("  weights {}", decl.format_summary(args.dtype))?;
        if let Some(e) = &cfg.eagle {
            let layers = match e.aux_layers {
                Some(l) => format!("the inputs of layers {l:?}"),
                None => "the inputs of layers 2, L/2 and L-3".into(),
            };
            outln!(
                "  eagle3  a draft head (--speculative-method eagle3): drafts over {} of the target's {} tokens, reads {layers} of a target of hidden size {}",
                cfg.vocab_size,
                e.target_vocab,
                e.target_hidden
            )?;
        }
        if let Some(m) = &cfg.moe {
            let bytes = decl.expert_bytes(args.dtype);
            let sparse = m.sparse.iter().filter(|&&s| s).count();
            let per_expert = bytes / (sparse * m.num_experts).max(1);
            outln!(
                "  experts {} per sparse layer ({sparse} of {} layers), top {}, {} wide{}: {:.2} GB, {:.1} MB each; a token reads {:.2} GB of them",
                m.num_experts,
                cfg.num_layers,
                m.top_k,
                m.expert_intermediate,
                m.shared_expert_intermediate
                    .map_or(String::new(), |s| format!(", a shared expert {s} wide")),
                bytes as f64 / 1e9,
                per_expert as f64 / 1e6,
                (per_expert * m.top_k * sparse) as f64 / 1e9
            )?;
        }
    }
    outln!("backends")?;
    outln!("  cpu      available ({} threads)", rayon_threads())?;
    let libs = CudaLibraries::probe();
    let yes = |b| if b { "found" } else { "missing" };
    outln!(
        "  cuda     libcuda {}, libnvrtc {}, libcublasLt {}, libnccl {} (tensor parallelism)",
        yes(libs.driver),
        yes(libs.nvrtc),
        yes(libs.cublaslt),
        yes(encore_core::backend::cuda::nccl::available())
    )?;
    match cuda::device_count() {
        Ok(n) => outln!("           {n} device(s)")?,
        Err(e) => outln!("           no devices: {e}")?,
    }

    let pb = spinner(&format!("opening {spec} (compiling kernels on first use)"));
    let opened = device::open(spec);
    pb.finish_and_clear();
    let (opened, note) = opened.with_context(|| format!("opening --device {spec}"))?;
    if let Some(note) = note {
        outln!("note     {note}")?;
    }
    let backend = opened.backend();
    outln!("selected {}", backend.device_name())?;
    if let Opened::Cuda(c) = &opened {
        let i = c.info();
        outln!(
            "  device {}: {}, sm_{}{}, {} SMs, {:.1} GiB",
            i.ordinal,
            i.name,
            i.compute_capability.0,
            i.compute_capability.1,
            i.sm_count,
            gib(i.total_memory)
        )?;
        let r = c.compile_report();
        outln!(
            "kernels  {} functions from {} files for {}, NVRTC {}.{}: {:.2} s ({} of {} files from the cache{})",
            c.num_kernels(),
            r.files,
            r.arch,
            r.nvrtc_version.0,
            r.nvrtc_version.1,
            r.seconds,
            r.cache_hits,
            r.files,
            r.cache_dir
                .as_ref()
                .map(|d| format!(" at {}", d.display()))
                .unwrap_or_else(|| ", cache off".into())
        )?;
    } else {
        outln!("kernels  CPU reference kernels (Rust, f32 accumulation)")?;
    }
    if args.no_self_check {
        return Ok(ExitCode::SUCCESS);
    }

    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let (title, results) = {
        let t = Instant::now();
        let pb = spinner("self-check");
        let r = match &opened {
            Opened::Cpu(_) => testing::check_cpu_against_reference(seed)
                .map(|r| ("CPU kernels vs naive f64 reference", r)),
            Opened::Cuda(_) => testing::check_backend_against_cpu(backend.as_ref(), seed)
                .map(|r| ("CUDA kernels vs CPU reference", r)),
        };
        let capture = testing::check_capture_replay(backend.as_ref(), seed);
        pb.finish_and_clear();
        let (title, mut results) = r?;
        results.extend(capture?);
        tracing::info!("self-check took {:?}", t.elapsed());
        (title, results)
    };
    outln!("self-check: {title}, seed {seed}")?;
    print_checks(&results)?;
    let failed = results.iter().filter(|r| !r.pass).count();
    outln!("{} passed, {} failed", results.len() - failed, failed)?;
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn print_checks(results: &[CheckResult]) -> std::io::Result<()> {
    outln!(
        "  {:<34} {:<30} {:<5} {:>10} {:>9}  ",
        "check",
        "shape",
        "dtype",
        "error",
        "tol"
    )?;
    for r in results {
        outln!(
            "  {:<34} {:<30} {:<5} {:>10.2e} {:>9.1e}  {}",
            r.op,
            r.shape,
            r.dtype,
            r.error,
            r.tolerance,
            if r.pass { "ok" } else { "FAIL" }
        )?;
        if let Some(note) = &r.note {
            outln!("      {note}")?;
        }
    }
    Ok(())
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// What `bench kernels` times, in order: GEMMs (m, n, k, dtype, iterations), the copy
/// bandwidth (bytes, iterations), decode attention (shape, dtype, iterations) and the
/// launch cost (iterations).
struct KernelSuite {
    gemms: &'static [GemmCase],
    /// Decode projections `(n, k, dtype, act)` (`act`: the fused gate/up and activation)
    /// streamed in a graph over more weight bytes than L2.
    gemvs: &'static [(usize, usize, DType, bool)],
    copy: (usize, usize),
    attention: &'static [(AttentionShape, DType, usize)],
    /// Causal prefill attention: `batch` prompts of `context` tokens.
    prefill_attention: &'static [(AttentionShape, DType, usize)],
    launches: usize,
    /// Experts in host memory: read in place, or through the expert cache.
    moe: &'static [(MoeShape, DType, usize)],
    /// Quantized GEMMs: rows of x, weights `(n, k)`, formats, x's dtype, iterations; each
    /// timed repacked, on the block layout, and with the weight in x's dtype.
    quant_gemms: QuantGemmSuite,
}

/// See [`KernelSuite::quant_gemms`].
type QuantGemmSuite = (
    &'static [usize],
    &'static [(usize, usize)],
    &'static [QuantFormat],
    DType,
    usize,
);

/// A GEMM of `bench kernels`: m, n, k, x's dtype, the weight's format (`None`: x's dtype),
/// iterations.
type GemmCase = (usize, usize, usize, DType, Option<QuantFormat>, usize);

/// A decode-attention shape of 16-token KV blocks.
const fn attention(
    batch: usize,
    context: usize,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
) -> AttentionShape {
    AttentionShape {
        batch,
        context,
        num_heads,
        num_kv_heads,
        head_dim,
        block_size: 16,
        fp8_cache: false,
    }
}

/// Llama-3-8B's decode attention (heads 32/8, d 128) at `batch` x `context`, over a
/// cache of the run dtype or FP8.
const fn llama8b_attention(batch: usize, context: usize, fp8_cache: bool) -> AttentionShape {
    AttentionShape {
        fp8_cache,
        ..attention(batch, context, 32, 8, 128)
    }
}

/// One token of Qwen3-30B-A3B's experts (128 of 2048 x 768, top 8) in `format`.
const fn qwen3_30b_experts(format: Option<QuantFormat>) -> MoeShape {
    MoeShape {
        rows: 1,
        hidden: 2048,
        inter: 768,
        experts: 128,
        top_k: 8,
        format,
    }
}

/// `--quick` (and the CPU): small shapes, few iterations.
const QUICK: KernelSuite = KernelSuite {
    gemms: &[
        (64, 256, 256, DType::F32, None, 5),
        (64, 256, 256, DType::F32, Some(QuantFormat::Q8_0), 5),
    ],
    gemvs: &[(256, 256, DType::F32, false), (256, 256, DType::F32, true)],
    copy: (8 << 20, 5),
    attention: &[
        (attention(1, 256, 8, 2, 64), DType::F32, 5),
        (
            AttentionShape {
                fp8_cache: true,
                ..attention(4, 256, 8, 2, 64)
            },
            DType::F32,
            5,
        ),
    ],
    prefill_attention: &[(attention(2, 128, 8, 2, 64), DType::F32, 3)],
    launches: 100,
    moe: &[(
        MoeShape {
            rows: 1,
            hidden: 64,
            inter: 32,
            experts: 8,
            top_k: 2,
            format: None,
        },
        DType::F32,
        5,
    )],
    quant_gemms: (&[16], &[(256, 256)], &[QuantFormat::Q4_0], DType::F32, 3),
};

/// The full suite: Llama-3-8B's shapes.
const FULL: KernelSuite = KernelSuite {
    gemms: &[
        (4096, 4096, 4096, DType::BF16, None, 50),
        (4096, 4096, 4096, DType::F16, None, 50),
        (1, 4096, 4096, DType::BF16, None, 200),
        (64, 14336, 4096, DType::BF16, None, 200),
        // Llama-3-8B's q/k/v, o, gate/up and down over an 8k-token prefill step and a
        // 512-row decode step, bf16 weights then FP8 (Hopper's FP8 GEMM).
        (8192, 6144, 4096, DType::BF16, None, 10),
        (8192, 4096, 4096, DType::BF16, None, 10),
        (8192, 28672, 4096, DType::BF16, None, 10),
        (8192, 4096, 14336, DType::BF16, None, 10),
        (8192, 6144, 4096, DType::BF16, Some(QuantFormat::F8E4M3), 10),
        (8192, 4096, 4096, DType::BF16, Some(QuantFormat::F8E4M3), 10),
        (
            8192,
            28672,
            4096,
            DType::BF16,
            Some(QuantFormat::F8E4M3),
            10,
        ),
        (
            8192,
            4096,
            14336,
            DType::BF16,
            Some(QuantFormat::F8E4M3),
            10,
        ),
        (512, 6144, 4096, DType::BF16, Some(QuantFormat::F8E4M3), 50),
        (512, 28672, 4096, DType::BF16, Some(QuantFormat::F8E4M3), 50),
        (512, 4096, 14336, DType::BF16, Some(QuantFormat::F8E4M3), 50),
    ],
    // Llama-3-8B's q/k/v, o, gate/up (as one gemv, then fused with SiLU) and down, one
    // rank's of the 8B over 2 GPUs, then one rank's of a 70B over 4 GPUs; then
    // Gemma-3-4B's and Phi-4-mini's q/k/v, o, gate/up with the activation and down.
    gemvs: &[
        (6144, 4096, DType::BF16, false),
        (4096, 4096, DType::BF16, false),
        (28672, 4096, DType::BF16, false),
        (28672, 4096, DType::BF16, true),
        (4096, 14336, DType::BF16, false),
        (3072, 4096, DType::BF16, false),
        (4096, 2048, DType::BF16, false),
        (14336, 4096, DType::BF16, false),
        (4096, 7168, DType::BF16, false),
        (2560, 8192, DType::BF16, false),
        (8192, 2048, DType::BF16, false),
        (14336, 8192, DType::BF16, false),
        (8192, 7168, DType::BF16, false),
        (4096, 2560, DType::BF16, false),
        (2560, 2048, DType::BF16, false),
        (20480, 2560, DType::BF16, true),
        (2560, 10240, DType::BF16, false),
        (5120, 3072, DType::BF16, false),
        (3072, 3072, DType::BF16, false),
        (16384, 3072, DType::BF16, true),
        (3072, 8192, DType::BF16, false),
    ],
    copy: (1 << 30, 20),
    // The serving issue's rows, (batch, context) = (1, 8k), (64, 2k), (256, 2k), (1024,
    // 1k), over bf16 and FP8 caches, and the earlier rows at 4k.
    attention: &[
        (attention(1, 4096, 32, 8, 128), DType::BF16, 100),
        (attention(64, 4096, 32, 8, 128), DType::BF16, 100),
        (llama8b_attention(1, 8192, false), DType::BF16, 100),
        (llama8b_attention(1, 8192, true), DType::BF16, 100),
        (llama8b_attention(64, 2048, false), DType::BF16, 100),
        (llama8b_attention(64, 2048, true), DType::BF16, 100),
        (llama8b_attention(256, 2048, false), DType::BF16, 50),
        (llama8b_attention(256, 2048, true), DType::BF16, 50),
        (llama8b_attention(1024, 1024, false), DType::BF16, 50),
        (llama8b_attention(1024, 1024, true), DType::BF16, 50),
    ],
    // The prefill-heavy serving row's step: 4 prompts of 2,048 tokens (8B heads), and one
    // of 8,192, over bf16 and FP8 caches.
    prefill_attention: &[
        (llama8b_attention(4, 2048, false), DType::BF16, 20),
        (llama8b_attention(4, 2048, true), DType::BF16, 20),
        (llama8b_attention(1, 8192, false), DType::BF16, 10),
        (llama8b_attention(1, 8192, true), DType::BF16, 10),
    ],
    launches: 1000,
    // Qwen3-30B-A3B's experts in Q4_K and bf16, one token.
    moe: &[
        (qwen3_30b_experts(Some(QuantFormat::Q4K)), DType::BF16, 20),
        (qwen3_30b_experts(None), DType::BF16, 20),
    ],
    // The 8B's projections (q/k/v, o, gate/up, down) at batch 16-512.
    quant_gemms: (
        &[16, 64, 128, 256, 512],
        &[(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)],
        &[QuantFormat::Q4K, QuantFormat::Q8_0, QuantFormat::Q4_0],
        DType::BF16,
        50,
    ),
};

fn bench_kernels(args: BenchKernelsArgs) -> Result<ExitCode> {
    if args.device.tensor_parallel_size > 1 {
        anyhow::bail!("--tensor-parallel-size: bench kernels runs on one device");
    }
    let opened = crate::model_arg::open_device(args.device.device)?;
    let be = opened.backend();
    let be = be.as_ref();
    let quick = args.quick || matches!(opened, Opened::Cpu(_));
    let mut rows: Vec<BenchRow> = Vec::new();
    let mut push = |r: BenchRow| -> std::io::Result<()> {
        if args.json {
            outln!(
                "{{\"name\":\"{}\",\"value\":{:.4},\"unit\":\"{}\",\"seconds\":{:.9},\"device\":\"{}\"}}",
                r.name,
                r.value,
                r.unit,
                r.seconds,
                be.device_name()
            )?;
        }
        rows.push(r);
        Ok(())
    };
    let suite = if quick { &QUICK } else { &FULL };
    let on = |g: KernelGroup| args.only.is_empty() || args.only.contains(&g);
    if on(KernelGroup::Gemm) {
        for &(m, n, k, dtype, format, iters) in suite.gemms {
            // FP8: scaled per 128 values (a block-scaled checkpoint), then per row.
            if format == Some(QuantFormat::F8E4M3) {
                push(bench::gemm(be, m, n, k, dtype, format, true, iters)?)?;
            }
            push(bench::gemm(be, m, n, k, dtype, format, false, iters)?)?;
        }
    }
    if on(KernelGroup::Copy) {
        let (bytes, iters) = suite.copy;
        push(bench::copy_bandwidth(be, bytes, iters)?)?;
    }
    if on(KernelGroup::Gemv) {
        let min_bytes = if quick { 1 << 20 } else { 1 << 30 };
        for &(n, k, dtype, act) in suite.gemvs {
            push(bench::gemv_stream(be, n, k, dtype, act, min_bytes)?)?;
        }
    }
    if on(KernelGroup::Attention) {
        for &(shape, dtype, iters) in suite.attention {
            let (eager, graph) = bench::decode_attention(be, shape, dtype, iters)?;
            push(eager)?;
            push(graph)?;
        }
    }
    if on(KernelGroup::PrefillAttention) {
        for &(shape, dtype, iters) in suite.prefill_attention {
            push(bench::prefill_attention(be, shape, dtype, iters)?)?;
        }
    }
    if on(KernelGroup::Launch) {
        let (eager, graph) = bench::launch_cost(be, suite.launches)?;
        push(eager)?;
        push(graph)?;
    }
    if on(KernelGroup::Moe) && be.runs_moe() {
        for &(shape, dtype, iters) in suite.moe {
            for r in bench::moe_streaming(be, shape, dtype, iters)? {
                push(r)?;
            }
        }
    }
    if on(KernelGroup::QuantGemm) {
        let (ms, shapes, formats, dtype, iters) = suite.quant_gemms;
        for &(n, k) in shapes {
            for &m in ms {
                push(bench::gemm(be, m, n, k, dtype, None, false, iters)?)?;
            }
            for &f in formats {
                for r in bench::quant_gemm(be, ms, n, k, dtype, f, iters)? {
                    push(r)?;
                }
            }
        }
    }
    if !args.json {
        outln!("{:<58} {:>12} {:<10} detail", "benchmark", "value", "unit")?;
        for r in &rows {
            outln!(
                "{:<58} {:>12.2} {:<10} {}",
                r.name,
                r.value,
                r.unit,
                r.detail
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
