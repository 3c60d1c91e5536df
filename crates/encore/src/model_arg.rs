//! The arguments shared by the commands: `--model` (a Hugging Face directory or
//! `dummy:NAME`) and `--device` (auto | cpu | cuda | cuda:N).

use std::path::Path;

use anyhow::Result;
use encore_core::device::{self, DeviceSpec, Opened};
use encore_core::model::config::ModelConfig;
use encore_core::model::weights::WeightSource;

/// The config and where the weights come from (seed 0 for dummy models).
pub fn resolve(spec: &str) -> Result<(ModelConfig, WeightSource<'_>)> {
    Ok(match spec.strip_prefix("dummy:") {
        Some(name) => (ModelConfig::dummy(name)?, WeightSource::Dummy { seed: 0 }),
        None => {
            let dir = Path::new(spec);
            (
                ModelConfig::from_file(&dir.join("config.json"))?,
                WeightSource::Dir(dir),
            )
        }
    })
}

/// Open the `--device` backend; says on stderr when `auto` fell back to the CPU and why.
pub fn open_device(spec: DeviceSpec) -> Result<Opened> {
    let (opened, note) = device::open(spec)?;
    if let Some(note) = note {
        eprintln!("note: {note}");
    }
    Ok(opened)
}
