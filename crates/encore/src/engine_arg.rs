//! The engine flags shared by the commands that run the engine loop (`generate`, `serve`,
//! `bench serve --in-process`): sequence and step sizes, the KV cache, graph mode and the
//! weight budget, declared once and turned into the engine's configuration by
//! [`EngineArgs::config`].

use anyhow::{bail, Context, Result};
use clap::Args;
use encore_core::engine::{EngineConfig, KvSizing};
use encore_core::memory::GraphMemory;
use encore_core::model::config::ModelConfig;
use encore_core::model::formats::Quantization;
use encore_core::model::ModelFiles;
use encore_core::progress::Progress;
use encore_core::scheduler::SchedulerConfig;
use encore_core::serve::EngineHandle;
use encore_core::spec::ngram::NgramConfig;
use encore_core::spec::Proposer;
use encore_core::{Backend, BackendRef, DType};

use crate::offload_arg::{self, OffloadArg};
use crate::out::errln;
use crate::parse;

/// The largest `--max-num-batched-tokens`.
const MAX_BATCHED_TOKENS: usize = 1 << 24;

/// The engine flags. A command that keeps a flag's other default says so with
/// `#[command(mut_arg(...))]` (`generate`'s `--kv-fraction`).
#[derive(Args)]
pub struct EngineArgs {
    #[command(flatten)]
    pub offload: OffloadArg,
    /// Longest sequence (prompt + output); default min(4096, the model's limit).
    #[arg(long, value_parser = parse::count::<1, { usize::MAX }>, allow_negative_numbers = true)]
    pub max_seq_len: Option<usize>,
    /// Most tokens in one step (longer prompts are prefilled in chunks of this size);
    /// formerly --max-tokens-per-step.
    #[arg(long, alias = "max-tokens-per-step", default_value = "2048", allow_negative_numbers = true, value_parser = parse::count::<1, { MAX_BATCHED_TOKENS }>)]
    pub max_num_batched_tokens: usize,
    /// Tokens per KV-cache block.
    #[arg(long, default_value = "16", value_parser = parse::count::<1, 1024>, allow_negative_numbers = true)]
    pub block_size: usize,
    /// Fraction of free device memory (after the weights and start-up's warm-up) for the
    /// KV cache, in (0, 1]; CUDA only.
    #[arg(long, default_value = "0.8", value_parser = parse::fraction, allow_negative_numbers = true)]
    pub kv_fraction: f64,
    /// What the KV cache stores: auto (the run dtype) or fp8 (E4M3, half of bf16's bytes,
    /// so twice the tokens in the same memory; each layer's keys and values divided by
    /// its scale, 1.0 unless the checkpoint ships `k_scale`/`v_scale`).
    #[arg(long, default_value = "auto", value_name = "auto|fp8|DTYPE", value_parser = parse::kv_cache_dtype)]
    pub kv_cache_dtype: parse::KvCacheDtype,
    /// Compute every prompt whole: no reuse of cached KV blocks of earlier prompts with
    /// the same prefix.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Run every step eagerly (no graph capture): the reference mode.
    #[arg(long)]
    pub eager: bool,
    /// Debug: after each graph replay, run the step eagerly too and fail on a mismatch.
    #[arg(long)]
    pub verify_graphs: bool,
    /// Asynchronous scheduling, the default (accepted for vLLM's flag of the name): plan,
    /// pack and queue the next step while the device runs the current one, reading its
    /// samples after. One device, every weight resident; steps with constraints, prompt
    /// scoring or speculation run synchronously.
    #[arg(long, overrides_with = "no_async_scheduling")]
    pub async_scheduling: bool,
    /// Step synchronously: each step is planned after the one before has been read.
    #[arg(long, overrides_with = "async_scheduling")]
    pub no_async_scheduling: bool,
    /// Decode batch-size buckets for graph mode: vllm ([1,2,4] + 8..256 step 8 + 256..
    /// step 16), pow2, or a comma list; capped at the most sequences in a step.
    #[arg(long, default_value = "vllm")]
    pub buckets: String,
    /// Token-count buckets for prefill and mixed steps, captured piecewise (attention
    /// eager between the pieces): auto (sglang on a GPU, none on the CPU), sglang (4..32
    /// step 4, ..256 step 16, ..512 step 32, ..1024 step 64, ..4096 step 256, then 512),
    /// pow2, none, or a comma list; capped at --max-num-batched-tokens.
    #[arg(long, default_value = "auto")]
    pub prefill_buckets: String,
    /// How captured graphs share intermediate memory: private (each its own), multi-va
    /// (a virtual range per graph over shared chunks), arena (one growable range).
    #[arg(long, default_value = "arena")]
    pub graph_memory: GraphMemory,
    /// Speculative decoding: ngram (drafts from each sequence's own tokens: what followed
    /// the latest earlier occurrence of its last tokens), draft (a smaller model's
    /// greedy tokens, --draft-model) or eagle3 (an EAGLE-3 head's greedy tokens,
    /// --draft-model: a one-layer head reading the target's hidden states), verified by
    /// the target in one step replayed from its verify graph; the output is the one decoding token by token gives (up to the
    /// rounding differences between a multi-token step and a decode step). Penalties
    /// apply to every verify row; under a grammar the drafts are the tokens it forces or
    /// the proposals it allows.
    #[arg(long, value_name = "ngram|draft|eagle3", value_parser = speculative_method)]
    pub speculative_method: Option<String>,
    /// The draft model of --speculative-method draft (a Hugging Face directory, a .gguf
    /// file, a Hub id or dummy:NAME, as --model): same tokenizer as the target; booted
    /// after it on the same device with its sizes, of the memory it left. With eagle3:
    /// the EAGLE-3 head's directory (LlamaForCausalLMEagle3, safetensors) or
    /// dummy:eagle3 (random weights shaped for the target).
    #[arg(long, value_name = "DIR|FILE.gguf|dummy:NAME")]
    pub draft_model: Option<String>,
    /// No sequence speculates while more than this many run (a large batch is
    /// compute-bound); default: the most whose drafts fit one verify step's rows.
    #[arg(long, value_name = "N", requires = "speculative_method", allow_negative_numbers = true, value_parser = parse::count::<1, 1048576>)]
    pub speculative_disable_by_batch_size: Option<usize>,
    /// Drafts a speculating sequence proposes per step (1 to 16).
    #[arg(long, default_value = "4", requires = "speculative_method", allow_negative_numbers = true, value_parser = parse::count::<1, 16>)]
    pub num_speculative_tokens: usize,
    /// The shortest suffix (tokens) the ngram method matches.
    #[arg(long, default_value = "1", requires = "speculative_method", allow_negative_numbers = true, value_parser = parse::count::<1, 64>)]
    pub ngram_min: usize,
    /// The longest suffix (tokens) the ngram method matches (the longest match wins).
    #[arg(long, default_value = "4", requires = "speculative_method", allow_negative_numbers = true, value_parser = parse::count::<1, 64>)]
    pub ngram_max: usize,
}

/// `--max-num-seqs`'s default where none is given, vLLM's rule on its V1 engine: 1,024
/// sequences on a device of at least 70 GiB (H100, H200: their KV cache holds that many,
/// and more in FP8), 256 on a smaller GPU, `cpu` on a backend without device memory (the
/// CPU's).
pub fn default_max_num_seqs(device_bytes: Option<usize>, cpu: usize) -> usize {
    match device_bytes {
        None => cpu,
        Some(b) if b >= 70 << 30 => 1024,
        Some(_) => 256,
    }
}

/// `--kv-cache-dtype` against the run dtype: FP8, or the run dtype itself (`None`: auto).
pub fn kv_cache_dtype(kv: parse::KvCacheDtype, dtype: DType) -> Result<Option<DType>> {
    match kv.0 {
        Some(k) if k != DType::F8E4M3 && k != dtype => {
            bail!("--kv-cache-dtype {k} with --dtype {dtype}: the cache holds the run dtype or fp8")
        }
        Some(k) if k == dtype => Ok(None),
        k => Ok(k),
    }
}

/// `--speculative-method`: the methods built so far.
fn speculative_method(s: &str) -> std::result::Result<String, String> {
    match s {
        "ngram" | "draft" | "eagle3" => Ok(s.to_string()),
        _ => Err(format!("`{s}`: expected ngram, draft or eagle3")),
    }
}

/// The EAGLE-3 head `spec` names (`--draft-model` of `--speculative-method eagle3`): a
/// directory, a Hub id, or `dummy:eagle3` (random weights the engine shapes for the
/// target at start-up).
fn eagle_files(be: &dyn Backend, spec: &str) -> Result<ModelFiles> {
    if spec == "dummy:eagle3" {
        let placeholder = ModelConfig::dummy("tiny")?;
        return Ok(ModelFiles {
            config: ModelConfig::eagle_head_for(&placeholder, placeholder.vocab_size),
            source: encore_core::model::weights::WeightSource::Dummy { seed: 0xea91e },
        });
    }
    let files = draft_files(be, spec)?;
    if files.config.eagle.is_none() {
        bail!(
            "--draft-model {spec}: not an EAGLE-3 head (its architectures name no ...Eagle3 class): \
             --speculative-method draft runs a draft model"
        );
    }
    Ok(files)
}

/// The draft model `spec` names (`--draft-model`), its weight formats as in its files,
/// refused where `be` does not run it.
fn draft_files(be: &dyn Backend, spec: &str) -> Result<ModelFiles> {
    let (config, source) = crate::model_arg::resolve(spec, "main", Quantization::Auto)
        .with_context(|| format!("--draft-model {spec}"))?;
    config
        .check_runs(be.runs_moe())
        .with_context(|| format!("--draft-model {spec} on {}", be.device_name()))?;
    Ok(ModelFiles { config, source })
}

/// What a command decides about its engine beside the flags.
pub struct EngineShape {
    /// Most sequences in one step.
    pub max_seqs: usize,
    /// Longest sequence (see [`EngineArgs::max_seq_len`]).
    pub max_seq_len: usize,
    /// KV blocks the cache holds at least.
    pub kv_at_least: usize,
    /// KV blocks on a backend that reports no device memory (the CPU); `None`: size it as
    /// on a device (a fraction of nothing: `kv_at_least`).
    pub cpu_kv_blocks: Option<usize>,
    /// Capture every bucket at start-up (`false`: on first use).
    pub capture_all: bool,
    /// The run's name and what to lower when it does not fit (the memory error).
    pub run_name: String,
    pub fix_hint: String,
}

impl EngineArgs {
    /// `--max-seq-len`, or min(4096, the model's positions) without it; refused above the
    /// model's positions.
    pub fn max_seq_len(&self, cfg: &ModelConfig) -> Result<usize> {
        let max_seq_len = self
            .max_seq_len
            .unwrap_or(cfg.max_position_embeddings.min(4096));
        if max_seq_len > cfg.max_position_embeddings {
            bail!(
                "--max-seq-len {max_seq_len} exceeds the model's max_position_embeddings {}",
                cfg.max_position_embeddings
            );
        }
        Ok(max_seq_len)
    }

    /// The engine's and the scheduler's configuration: the flags (graph buckets parsed and
    /// capped, the KV sizing on this backend) with the command's `shape`.
    pub fn config(
        &self,
        be: &dyn Backend,
        dtype: DType,
        shape: EngineShape,
    ) -> Result<(EngineConfig, SchedulerConfig)> {
        let mut graphs = if self.eager {
            None
        } else {
            Some(crate::graphs::config(
                be,
                &self.buckets,
                shape.max_seqs,
                &self.prefill_buckets,
                self.max_num_batched_tokens,
            )?)
        };
        let kv = match shape.cpu_kv_blocks {
            Some(blocks) if be.memory_info().is_none() => {
                KvSizing::Blocks(blocks.max(shape.kv_at_least))
            }
            _ => KvSizing::DeviceFraction {
                fraction: self.kv_fraction,
                at_least: shape.kv_at_least,
            },
        };
        let k = self.num_speculative_tokens;
        let (speculative, draft) = match (self.speculative_method.as_deref(), &self.draft_model) {
            (Some("draft"), Some(m)) => {
                let files = draft_files(be, m)?;
                if files.config.eagle.is_some() {
                    bail!("--draft-model {m} is an EAGLE-3 head: use --speculative-method eagle3");
                }
                (Some(Proposer::Draft { k }), Some(files))
            }
            (Some("eagle3"), Some(m)) => (Some(Proposer::Draft { k }), Some(eagle_files(be, m)?)),
            (Some(m @ ("draft" | "eagle3")), None) => {
                bail!("--speculative-method {m} needs --draft-model")
            }
            (_, Some(_)) => {
                bail!("--draft-model goes with --speculative-method draft or eagle3")
            }
            (Some(_), None) => (
                Some(Proposer::Ngram(NgramConfig::new(
                    self.ngram_min,
                    self.ngram_max,
                    k,
                )?)),
                None,
            ),
            (None, None) => (None, None),
        };
        // A verify chunk takes a sampling row per draft beside its sequence's: room for
        // up to 8 sequences' drafts in one step (more sequences share it).
        let spec_rows = speculative.map_or(0, |p| p.k() * shape.max_seqs.min(8));
        // Verify steps replay graphs of their decode bucket (where its rows fit).
        if let (Some(g), Some(p)) = (graphs.as_mut(), speculative) {
            g.verify = p.k();
        }
        let engine = EngineConfig {
            offload: self.offload.config(),
            dtype,
            block_size: self.block_size,
            max_tokens_per_step: self.max_num_batched_tokens,
            max_seqs: shape.max_seqs + spec_rows,
            max_seq_len: shape.max_seq_len,
            kv,
            graphs,
            graph_memory: self.graph_memory,
            capture_all: shape.capture_all,
            verify_graphs: self.verify_graphs,
            extra_bytes: 0,
            run_name: shape.run_name,
            fix_hint: shape.fix_hint,
            constraints: None,
            tp: Default::default(),
            router_skew: None,
            draft,
            eagle_aux: None,
            eagle_embed: None,
            kv_cache_dtype: kv_cache_dtype(self.kv_cache_dtype, dtype)?,
            async_scheduling: !self.no_async_scheduling,
        };
        let sched = SchedulerConfig {
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_num_seqs: shape.max_seqs,
            prefix_cache: !self.no_prefix_cache,
            speculative,
            // By default, while the batch's verify rows fit the runner's sampling rows
            // (and so its verify graphs, where captured).
            speculative_max_batch: speculative.map_or(0, |p| {
                self.speculative_disable_by_batch_size
                    .unwrap_or((shape.max_seqs + spec_rows) / (p.k() + 1))
            }),
        };
        Ok((engine, sched))
    }
}

/// Start the engine loop for `model` and say on stderr, when `show`, what the weight
/// budget gave (the line is logged either way).
pub fn start_engine(
    be: BackendRef,
    model: ModelFiles,
    (engine_cfg, sched): (EngineConfig, SchedulerConfig),
    progress: Box<dyn Progress + Send>,
    show: bool,
) -> Result<EngineHandle> {
    let offload = engine_cfg.offload;
    let weight_bytes = model.config.weight_bytes(engine_cfg.dtype);
    let formats = model.config.decl().format_summary(engine_cfg.dtype);
    tracing::info!("weights {formats}");
    if show && !model.config.weights.is_dense() {
        errln!("weights {formats}");
    }
    let engine = EngineHandle::start(be, model, engine_cfg, sched, progress)?;
    if let Some(line) =
        offload_arg::summary(offload.as_ref(), engine.boot.offload.as_ref(), weight_bytes)
    {
        tracing::info!("{line}");
        if show {
            errln!("{line}");
        }
    }
    Ok(engine)
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use encore_core::backend::cpu::CpuBackend;

    use super::*;
    use crate::{Cli, Command};

    fn engine_args(args: &[&str]) -> EngineArgs {
        let cli = Cli::try_parse_from([&["encore"][..], args].concat()).unwrap();
        match cli.command {
            Command::Generate(a) => a.engine,
            Command::Serve(a) => a.engine,
            _ => unreachable!("generate or serve"),
        }
    }

    fn shape(cpu_kv_blocks: Option<usize>) -> EngineShape {
        EngineShape {
            max_seqs: 4,
            max_seq_len: 256,
            kv_at_least: 17,
            cpu_kv_blocks,
            capture_all: false,
            run_name: "test".into(),
            fix_hint: String::new(),
        }
    }

    #[test]
    fn each_command_keeps_its_defaults_and_the_flags_reach_the_config() {
        assert_eq!(engine_args(&["generate"]).kv_fraction, 0.5);
        assert_eq!(engine_args(&["serve"]).kv_fraction, 0.8);
        let be = CpuBackend::new();
        let e = engine_args(&["serve", "--eager", "--no-prefix-cache", "--block-size", "8"]);
        let (cfg, sched) = e.config(&be, DType::F32, shape(Some(64))).unwrap();
        assert!(cfg.graphs.is_none());
        assert_eq!(cfg.block_size, 8);
        assert!(matches!(cfg.kv, KvSizing::Blocks(64)));
        assert!(!sched.prefix_cache);
        assert_eq!((sched.max_num_seqs, cfg.max_seqs), (4, 4));
        // --max-num-seqs by device: 141 GB (H200) and 80 GB (H100), 40 GB, the CPU.
        assert_eq!(default_max_num_seqs(Some(141 << 30), 64), 1024);
        assert_eq!(default_max_num_seqs(Some(80 << 30), 64), 1024);
        assert_eq!(default_max_num_seqs(Some(40 << 30), 64), 256);
        assert_eq!(default_max_num_seqs(None, 64), 64);
        let (cfg, sched) = engine_args(&["generate", "--buckets", "1,2"])
            .config(&be, DType::F32, shape(None))
            .unwrap();
        assert!(cfg.graphs.is_some());
        assert!(matches!(
            cfg.kv,
            KvSizing::DeviceFraction { at_least: 17, .. }
        ));
        assert!(sched.prefix_cache);
        let (cfg, _) = engine_args(&["serve"])
            .config(&be, DType::F32, shape(Some(2)))
            .unwrap();
        assert!(matches!(cfg.kv, KvSizing::Blocks(17)));
    }
}
