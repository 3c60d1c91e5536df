//! `--model` specs resolved into a config, a weight source and a tokenizer: `dummy:NAME`,
//! an HF directory, one `.safetensors` file (its directory holds `config.json` and the
//! tokenizer), a GGUF file (a `.gguf` name or a file starting with `GGUF`), or a Hub id
//! (`org/name`, `org/name:QUANT`; see [`super::hub`]) resolved to one of those.

use std::path::Path;

use encore_backend::quant::QuantFormat;

use super::config::ModelConfig;
use super::formats::{Quantization, WeightFormats};
use super::gguf::{self, GgufFile};
use super::hub::{HubCache, HubId};
use super::weights::WeightSource;
use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// A resolved model: its config and where its weights come from (seed 0 for dummies).
/// The tokenizer is built on demand ([`ModelFiles::tokenizer`]), so config and weights
/// load without it. An owned value: it can be handed to the engine thread.
#[derive(Clone, Debug)]
pub struct ModelFiles {
    pub config: ModelConfig,
    pub source: WeightSource,
}

/// Resolve a model spec (see the module docs; a Hub id at its `main` revision); the
/// config is parsed, nothing else is read.
pub fn open_model(spec: &str) -> Result<ModelFiles> {
    open_model_at(spec, "main")
}

/// [`open_model`] with a Hub id at `revision` (a branch, tag or commit), resolved through
/// the cache the environment names ([`HubCache::from_env`]).
pub fn open_model_at(spec: &str, revision: &str) -> Result<ModelFiles> {
    open_spec(spec, revision, true)
}

/// [`open_model`] taking a Hub id from the local cache only (never downloading).
pub fn open_local_model(spec: &str) -> Result<ModelFiles> {
    open_spec(spec, "main", false)
}

fn open_spec(spec: &str, revision: &str, download: bool) -> Result<ModelFiles> {
    if let Some(id) = HubId::parse(spec) {
        let cache = HubCache::from_env();
        let path = if download {
            cache.resolve(&id, revision)?
        } else {
            cache.local(&id, revision)?
        };
        return open_path(&path);
    }
    if let Some(name) = spec.strip_prefix("dummy:") {
        return Ok(ModelFiles {
            config: ModelConfig::dummy(name)?,
            source: WeightSource::Dummy { seed: 0 },
        });
    }
    open_path(Path::new(spec))
}

/// A model directory, `.safetensors` file or GGUF file.
fn open_path(path: &Path) -> Result<ModelFiles> {
    if gguf::is_gguf(path) {
        let file = GgufFile::open(path)?;
        let mut config = gguf::config_from_gguf(&file)?;
        config.weights = gguf::stored_formats(&file, &config);
        return Ok(ModelFiles {
            config,
            source: WeightSource::Gguf(path.to_path_buf()),
        });
    }
    Ok(ModelFiles {
        config: ModelConfig::from_file(&hf_dir(path).join("config.json"))?,
        source: WeightSource::Dir(path.to_path_buf()),
    })
}

impl ModelFiles {
    /// Apply `--quantization`: `auto` keeps what [`open_model`] found (a GGUF file's block
    /// formats), `none` makes every weight dense, a format quantizes every projection at
    /// load. An error names the first tensor whose rows the format cannot hold.
    pub fn quantize(&mut self, q: Quantization) -> Result<()> {
        match q {
            Quantization::Auto => {}
            Quantization::None => {
                self.config.weights = WeightFormats {
                    int_packing: self.config.weights.int_packing,
                    ..Default::default()
                }
            }
            // MXFP4 is an experts' format: a model with experts keeps the rest dense.
            Quantization::To(f) if f == QuantFormat::Mxfp4 && self.config.moe.is_some() => {
                self.config.weights = WeightFormats {
                    experts: Some(f),
                    int_packing: self.config.weights.int_packing,
                    ..Default::default()
                }
            }
            Quantization::To(f) => {
                self.config.weights = WeightFormats {
                    projections: Some(f),
                    int_packing: self.config.weights.int_packing,
                    ..Default::default()
                }
            }
        }
        self.config.check_formats()
    }

    /// The model's tokenizer (see [`open_tokenizer`]).
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        open_tokenizer(&self.source)
    }
}

/// The tokenizer that goes with a weight source: the HF directory's `tokenizer.json`, the
/// GGUF file's `tokenizer.*` metadata, or the byte-level tokenizer for dummy weights.
pub fn open_tokenizer(source: &WeightSource) -> Result<Tokenizer> {
    match source {
        WeightSource::Dir(path) => Tokenizer::from_dir(hf_dir(path)),
        WeightSource::Gguf(path) => {
            let vocab = gguf::vocab_from_gguf(&GgufFile::open(path)?)?;
            Tokenizer::from_gguf_vocab(&vocab, &path.display().to_string())
        }
        WeightSource::Dummy { .. } => Ok(Tokenizer::bytes()),
    }
}

/// The HF model directory of a directory or of a file inside one.
fn hf_dir(path: &Path) -> &Path {
    if path.is_file() {
        path.parent().unwrap_or(Path::new("."))
    } else {
        path
    }
}
