//! The model selection shared by the commands: `--model` (a Hugging Face directory, a
//! GGUF file, `dummy:NAME` or a Hub id with `--revision`), `--device` (auto | cpu | cuda
//! | cuda:N) and `--dtype`.
//! (The memory check a run makes before it allocates is `Engine::new`'s.)

use anyhow::{Context, Result};
use clap::Args;
use encore_core::device::{self, DeviceSpec, Opened};
use encore_core::engine::TpBackends;
use encore_core::model::config::ModelConfig;
use encore_core::model::formats::Quantization;
use encore_core::model::weights::WeightSource;
use encore_core::DType;

use crate::parse;

/// `--device`, shared by every command.
#[derive(Args)]
pub struct DeviceArg {
    /// auto | cpu | cuda | cuda:N (auto: CUDA when usable, else the CPU).
    #[arg(long, default_value = "auto", value_parser = parse::device)]
    pub device: DeviceSpec,
    /// Split the model over this many devices (tensor parallelism: cuda:N..N+size, or
    /// as many CPU ranks in threads); one engine, rank 0 schedules and samples.
    #[arg(long, short = 't', alias = "tp", default_value = "1", value_parser = parse::count::<1, 64>, allow_negative_numbers = true)]
    pub tensor_parallel_size: usize,
}

/// `--model`, `--device` and `--dtype`: what to run, where, in which precision.
#[derive(Args)]
pub struct ModelArgs {
    /// A Hugging Face model directory, a `.gguf` file, a Hub id (`org/name`, or
    /// `org/name:Q4_K_M` / `org/name:FILE.gguf` for a GGUF file in the repository: from the
    /// Hugging Face cache, downloaded into it when missing unless HF_HUB_OFFLINE=1), or
    /// `dummy:NAME` for seeded random weights (tiny, tiny-llama3, tiny-qwen2, tiny-qwen3,
    /// smollm2-135m, qwen2.5-0.5b, llama-3.2-1b, llama-3-8b, llama-3-70b).
    #[arg(long, default_value = "dummy:tiny")]
    pub model: String,
    /// The revision of a Hub id `--model`: a branch, a tag or a commit.
    #[arg(long, default_value = "main")]
    pub revision: String,
    #[command(flatten)]
    pub device: DeviceArg,
    /// Run dtype: bf16, f16 or f32 (also bfloat16, fp16, float16, half, fp32, float32;
    /// any case).
    #[arg(long, default_value = "bf16", value_parser = parse::dtype)]
    pub dtype: DType,
    /// How weights are stored on the device: auto (a GGUF file's block formats stay
    /// quantized, dense checkpoints stay dense), none (everything decoded to --dtype), or a
    /// format every projection is quantized to at load: fp8, q8_0, q4_k (also q4_0, q4_1,
    /// q5_0, q5_1, q5_k, q6_k). Activations stay in --dtype.
    #[arg(long, default_value = "auto", value_parser = parse::quantization)]
    pub quantization: Quantization,
}

impl ModelArgs {
    /// The model's config and weight source, and the device (see [`open_device`]; every
    /// rank's with `--tensor-parallel-size`, rank 0 first); a model the device does not
    /// run is refused ([`ModelConfig::check_runs`]).
    pub fn open(&self) -> Result<(Opened, ModelConfig, WeightSource, TpBackends)> {
        let (cfg, source) = resolve(&self.model, &self.revision, self.quantization)?;
        let (opened, tp) = open_devices(self.device.device, self.device.tensor_parallel_size)?;
        cfg.check_runs(opened.backend().runs_moe())
            .with_context(|| {
                format!(
                    "--model {} on {}",
                    self.model,
                    opened.backend().device_name()
                )
            })?;
        Ok((opened, cfg, source, tp))
    }

    /// [`ModelArgs::open`] for a command that runs on one device: refuses
    /// `--tensor-parallel-size` above 1, naming the command.
    pub fn open_one(&self, command: &str) -> Result<(Opened, ModelConfig, WeightSource)> {
        if self.device.tensor_parallel_size > 1 {
            anyhow::bail!(
                "--tensor-parallel-size {}: {command} runs on one device",
                self.device.tensor_parallel_size
            );
        }
        let (opened, cfg, source, _) = self.open()?;
        Ok((opened, cfg, source))
    }
}

/// Open `size` ranks of a tensor-parallel group on `spec` (one backend when `size` is
/// 1): rank 0's backend and every rank's, in order.
pub fn open_devices(spec: DeviceSpec, size: usize) -> Result<(Opened, TpBackends)> {
    if size <= 1 {
        return Ok((open_device(spec)?, TpBackends::default()));
    }
    let (opened, note) = device::open_group(spec, size)
        .with_context(|| format!("--device {spec} --tensor-parallel-size {size}"))?;
    if let Some(note) = note {
        crate::out::errln!("note: {note}");
    }
    let tp = TpBackends(opened.iter().map(|o| o.backend()).collect());
    let first = opened.into_iter().next().expect("size ranks");
    Ok((first, tp))
}

/// The config (with the weight formats `quantization` gives it) and where the weights
/// come from (seed 0 for dummy models); a Hub id at `revision`.
pub fn resolve(
    spec: &str,
    revision: &str,
    quantization: Quantization,
) -> Result<(ModelConfig, WeightSource)> {
    let mut m = encore_core::model::open_model_at(spec, revision)?;
    m.quantize(quantization)
        .with_context(|| format!("--quantization {quantization}"))?;
    Ok((m.config, m.source))
}

/// Open the `--device` backend; says in one line on stderr when `auto` fell back to the
/// CPU and why (the details are logged at `ENCORE_LOG=info`).
pub fn open_device(spec: DeviceSpec) -> Result<Opened> {
    let (opened, note) = device::open(spec).with_context(|| format!("--device {spec}"))?;
    if let Some(note) = note {
        crate::out::errln!("note: {note}");
    }
    Ok(opened)
}
