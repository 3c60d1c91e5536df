//! The arguments shared by the commands: `--model` (a Hugging Face directory, a GGUF
//! file or `dummy:NAME`) and `--device` (auto | cpu | cuda | cuda:N).

use anyhow::Result;
use encore_core::device::{self, DeviceSpec, Opened};
use encore_core::model::config::ModelConfig;
use encore_core::model::weights::WeightSource;

/// The config and where the weights come from (seed 0 for dummy models).
pub fn resolve(spec: &str) -> Result<(ModelConfig, WeightSource<'_>)> {
    let m = encore_core::model::open_model(spec)?;
    Ok((m.config, m.source))
}

/// Open the `--device` backend; says on stderr when `auto` fell back to the CPU and why.
pub fn open_device(spec: DeviceSpec) -> Result<Opened> {
    let (opened, note) = device::open(spec)?;
    if let Some(note) = note {
        eprintln!("note: {note}");
    }
    Ok(opened)
}
