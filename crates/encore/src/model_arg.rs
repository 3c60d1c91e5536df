//! The arguments shared by the commands: `--model` (a Hugging Face directory, a GGUF
//! file or `dummy:NAME`) and `--device` (auto | cpu | cuda | cuda:N). The memory check
//! every command runs before it allocates is `Engine::new`'s.

use anyhow::{Context, Result};
use encore_core::device::{self, DeviceSpec, Opened};
use encore_core::model::config::ModelConfig;
use encore_core::model::weights::WeightSource;

/// The config and where the weights come from (seed 0 for dummy models).
pub fn resolve(spec: &str) -> Result<(ModelConfig, WeightSource<'_>)> {
    let m = encore_core::model::open_model(spec)?;
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
