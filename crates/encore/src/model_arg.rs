//! The `--model` argument shared by the commands: a Hugging Face directory or `dummy:NAME`.

use std::path::Path;

use anyhow::Result;
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
