//! The weight offload executor end to end on the CPU twin (a worker thread copying into a
//! device pool in host memory, with a delay per copy so an ordering mistake reads stale
//! weights every time), and on CUDA (`#[ignore = "needs a CUDA device"]`):
//! - greedy tokens under budgets equal fully resident ones, eager and in graphs (decode
//!   graphs and piecewise prefill), planned and LRU, with tied embeddings, a qkv bias and
//!   q/k norms, through chunked prefill and preemption under KV pressure;
//! - captured offload replays equal eager offload (the runner's own replay check, and
//!   step logits compared directly);
//! - real safetensors checkpoints: read in place from the mapping when stored in the run
//!   dtype, converted into a host copy otherwise;
//! - the floor is exact; planned copies less than LRU;
//! - the failure table, each a load-time error naming the thing: a budget below the
//!   floor, a missing weight, a shape or dtype mismatch, registration refused, the device
//!   pool refused (and the memory check before it);
//! - the copy queue itself: copy, record, wait and join order, eagerly and captured.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use encore_core::backend::cpu::CpuBackend;
use encore_core::backend::Backend;
use encore_core::engine::{BootReport, Engine, EngineConfig, KvSizing};
use encore_core::generate::{generate, GenerateOptions};
use encore_core::graph::BucketPolicy;
use encore_core::kv::SeqId;
use encore_core::model::config::ModelConfig;
use encore_core::model::weights::{self, WeightSource};
use encore_core::model::{open_model, ModelFiles};
use encore_core::offload::{
    self, AccessOrder, OffloadConfig, Policy, Prepared, WeightBudget, SLOT_ALIGN,
};
use encore_core::progress::NoProgress;
use encore_core::request::SamplingParams;
use encore_core::runner::{GraphConfig, Runner, SeqStep, Seqs};
use encore_core::scheduler::{Scheduler, SchedulerConfig};
use encore_core::{DType, Error};
use half::bf16;
use safetensors::tensor::Dtype;

#[path = "../common/mod.rs"]
mod common;

use common::checkpoint::{model_dir, values, write_safetensors, Ck};
use common::temp_dir::TempDir;

mod budgets;
mod checkpoints;
mod copy_queue;
mod cuda;
mod failures;
mod gpt_oss;
mod replay;

const MODEL: &str = "dummy:tiny-qwen3";

fn config(graphs: bool, offload: Option<OffloadConfig>) -> EngineConfig {
    EngineConfig {
        graphs: graphs.then_some(GraphConfig {
            decode: BucketPolicy::PowersOfTwo { max: 4 },
            mixed: BucketPolicy::SglangLike { max: 64 },
            verify: 0,
        }),
        capture_all: graphs,
        offload,
        ..EngineConfig::new(DType::F32, 16, 64, 4, 256, KvSizing::Blocks(64))
    }
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        (0..45).map(|i| (i * 7 + 3) % 250).collect(),
        (0..9).map(|i| (i * 13 + 1) % 250).collect(),
        (0..70).map(|i| (i * 5 + 11) % 250).collect(),
    ]
}

/// Greedy tokens of [`prompts`] (chunked prefill: 64 tokens a step) under `cfg`.
fn run(be: &dyn Backend, cfg: &EngineConfig) -> Result<Vec<Vec<u32>>, Error> {
    run_files(be, &open_model(MODEL)?, cfg).map(|(tokens, _)| tokens)
}

/// [`run`] for the model `files`, with the start-up report.
fn run_files(
    be: &dyn Backend,
    files: &ModelFiles,
    cfg: &EngineConfig,
) -> Result<(Vec<Vec<u32>>, BootReport), Error> {
    let Engine { mut runner, report } = Engine::new(be, files.clone(), cfg, &NoProgress)?;
    Ok((greedy(&mut runner, &prompts())?, report))
}

/// Greedy tokens (12 per prompt, EOS ignored) of `prompts` through `generate`.
fn greedy(runner: &mut Runner<'_>, prompts: &[Vec<u32>]) -> Result<Vec<Vec<u32>>, Error> {
    let opts = GenerateOptions {
        max_tokens: 12,
        ignore_eos: true,
        sampling: Default::default(),
    };
    let out = generate(runner, prompts, &[], &opts, &NoProgress, |_, _| {
        ControlFlow::Continue(())
    })?;
    Ok(out.into_iter().map(|g| g.output_ids).collect())
}

fn budget(p: f64, policy: Policy) -> Option<OffloadConfig> {
    Some(OffloadConfig {
        budget: WeightBudget::Percent(p),
        policy,
        expert_prefetch: false,
    })
}

fn slow_cpu() -> CpuBackend {
    CpuBackend::with_copy_delay(Duration::from_micros(300))
}

fn order(cfg: &ModelConfig) -> AccessOrder {
    offload::executor_order(cfg, DType::F32).unwrap()
}

// ---------------------------------------------------------------------------------------
// Real safetensors checkpoints.

/// An HF Llama `config.json` of these sizes (head_dim = hidden / heads, untied).
fn llama_json(vocab: usize, hidden: usize, inter: usize, layers: usize, heads: usize) -> String {
    format!(
        r#"{{
  "architectures": ["LlamaForCausalLM"],
  "vocab_size": {vocab}, "hidden_size": {hidden}, "intermediate_size": {inter},
  "num_hidden_layers": {layers}, "num_attention_heads": {heads}, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512,
  "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16"
}}"#
    )
}

/// Every HF tensor `cfg` implies, in `dtype`, with seeded values of sensible scale (norms
/// near 1, matrices of std ~ 1/sqrt(fan_in)), so the logits are far from ties.
fn checkpoint(cfg: &ModelConfig, dtype: Dtype) -> Vec<Ck> {
    weights::hf_tensors(cfg)
        .into_iter()
        .enumerate()
        .map(|(k, t)| {
            let u = values(k as u64 + 1, t.numel());
            let values = if t.name.ends_with("norm.weight") {
                u.iter().map(|x| 1.0 + 0.05 * x).collect()
            } else {
                let scale = 1.7 / (*t.shape.last().unwrap() as f32).sqrt();
                u.iter().map(|x| x * scale).collect()
            };
            Ck {
                name: t.name,
                dtype,
                shape: t.shape,
                values,
            }
        })
        .collect()
}

/// The CPU checkpoint model: 4 layers, head_dim 32.
fn cpu_json() -> String {
    llama_json(256, 128, 224, 4, 4)
}

fn dir_files(dir: &Path) -> ModelFiles {
    ModelFiles {
        config: ModelConfig::from_file(&dir.join("config.json")).unwrap(),
        source: WeightSource::Dir(PathBuf::from(dir)),
    }
}
