//! An HF safetensors checkpoint on disk: its files memory-mapped, their headers parsed,
//! and a map from tensor name to the file holding it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata, TensorInfo};
use safetensors::SafeTensors;

use super::{host, TensorSpec};
use crate::error::{Error, Result};
use crate::tensor::DType;

const SINGLE: &str = "model.safetensors";
const INDEX: &str = "model.safetensors.index.json";

/// One mapped `.safetensors` file.
struct ShardFile {
    path: PathBuf,
    mmap: std::sync::Arc<Mmap>,
    /// Byte offset of the data section (after the 8-byte length and the JSON header).
    data_start: usize,
    meta: Metadata,
}

impl ShardFile {
    fn open(path: &Path) -> Result<ShardFile> {
        let file = File::open(path).map_err(|source| Error::Io {
            what: "opening weights file",
            path: path.display().to_string(),
            source,
        })?;
        // SAFETY: the map is read-only and lives as long as the checkpoint. Another process
        // truncating or rewriting the file while it is loaded is undefined behaviour we
        // cannot exclude (every mmap-based loader shares it); writers that replace the
        // file (write + rename, as `safetensors` does) leave this mapping intact.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|source| Error::Io {
            what: "memory-mapping weights file",
            path: path.display().to_string(),
            source,
        })?;
        let (header_len, meta) =
            SafeTensors::read_metadata(&mmap).map_err(|e| Error::WeightsFile {
                path: path.display().to_string(),
                what: format!(
                    "not a valid safetensors file (truncated or corrupt?): {e:?} \
                     ({} bytes on disk)",
                    mmap.len()
                ),
            })?;
        Ok(ShardFile {
            path: path.to_path_buf(),
            mmap: std::sync::Arc::new(mmap),
            data_start: 8 + header_len,
            meta,
        })
    }

    fn name(&self) -> String {
        self.path.display().to_string()
    }
}

/// A checkpoint's files and where each tensor lives.
pub(super) struct Checkpoint {
    files: Vec<ShardFile>,
    /// Tensor name -> index into `files`.
    location: HashMap<String, usize>,
    /// How the location map was built, for "missing" messages.
    origin: String,
}

impl Checkpoint {
    /// Open a model directory (index, else `model.safetensors`, else every
    /// `*.safetensors` file) or a single `.safetensors` file.
    pub(super) fn open(path: &Path) -> Result<Checkpoint> {
        let meta = std::fs::metadata(path).map_err(|source| Error::Io {
            what: "opening model weights",
            path: path.display().to_string(),
            source,
        })?;
        if meta.is_file() {
            return Self::from_files(vec![path.to_path_buf()]);
        }
        let index = path.join(INDEX);
        if index.is_file() {
            return Self::from_index(path, &index);
        }
        let single = path.join(SINGLE);
        if single.is_file() {
            return Self::from_files(vec![single]);
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|source| Error::Io {
                what: "listing model directory",
                path: path.display().to_string(),
                source,
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        if files.is_empty() {
            return Err(Error::WeightsFile {
                path: path.display().to_string(),
                what: format!("no {SINGLE}, {INDEX} or other *.safetensors file in the directory"),
            });
        }
        files.sort();
        Self::from_files(files)
    }

    /// Every tensor of every file; a name in two files is an error.
    fn from_files(paths: Vec<PathBuf>) -> Result<Checkpoint> {
        let files = paths
            .iter()
            .map(|p| ShardFile::open(p))
            .collect::<Result<Vec<_>>>()?;
        let mut location = HashMap::new();
        for (i, f) in files.iter().enumerate() {
            for name in f.meta.offset_keys() {
                if let Some(j) = location.insert(name.clone(), i) {
                    return Err(Error::Weights {
                        tensor: name,
                        what: format!("is in both `{}` and `{}`", files[j].name(), f.name()),
                    });
                }
            }
        }
        let origin = match &files[..] {
            [one] => format!("`{}`", one.name()),
            many => format!("{} files", many.len()),
        };
        Ok(Checkpoint {
            files,
            location,
            origin,
        })
    }

    /// The shards an index's `weight_map` names (relative to `dir`).
    fn from_index(dir: &Path, index: &Path) -> Result<Checkpoint> {
        let bad = |what: String| Error::WeightsFile {
            path: index.display().to_string(),
            what,
        };
        let text = std::fs::read_to_string(index).map_err(|source| Error::Io {
            what: "reading weights index",
            path: index.display().to_string(),
            source,
        })?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| bad("no `weight_map` object".into()))?;
        let mut by_tensor = Vec::with_capacity(map.len());
        for (tensor, file) in map {
            let file = file.as_str().filter(|f| !f.is_empty()).ok_or_else(|| {
                bad(format!(
                    "`weight_map` entry for `{tensor}` is not a file name: {file}"
                ))
            })?;
            by_tensor.push((tensor.clone(), file));
        }
        let names: Vec<&str> = by_tensor
            .iter()
            .map(|(_, f)| *f)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let files = names
            .iter()
            .map(|f| ShardFile::open(&dir.join(f)))
            .collect::<Result<Vec<_>>>()?;
        let location = by_tensor
            .into_iter()
            .map(|(t, f)| (t, names.binary_search(&f).expect("file name is in the set")))
            .collect();
        Ok(Checkpoint {
            files,
            location,
            origin: format!("`{}`", index.display()),
        })
    }

    fn info(&self, name: &str) -> Option<(&ShardFile, &TensorInfo)> {
        let file = &self.files[*self.location.get(name)?];
        file.meta.info(name).map(|info| (file, info))
    }

    /// Check every spec's presence, shape and dtype, then that the checkpoint holds no
    /// tensor the config does not use (other than those `ignored` accepts); the first
    /// failure names the tensor.
    pub(super) fn validate(
        &self,
        specs: &[&TensorSpec],
        ignored: impl Fn(&str) -> bool,
    ) -> Result<()> {
        self.validate_specs(specs)?;
        let used: HashSet<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        let mut unused: Vec<&String> = self
            .location
            .keys()
            .filter(|n| !used.contains(n.as_str()) && !ignored(n))
            .collect();
        unused.sort_by_key(|n| natural_key(n));
        if let Some(name) = unused.first() {
            return Err(Error::Weights {
                tensor: name.to_string(),
                what: format!(
                    "is in {} but the config does not use it ({} unused tensors; does \
                     config.json match the checkpoint, e.g. num_hidden_layers?)",
                    self.origin,
                    unused.len()
                ),
            });
        }
        Ok(())
    }

    /// A config with more layers than the checkpoint holds is refused before the loader
    /// plans them: the error names the first layer's tensor that is missing. Checked up
    /// to one layer past the tensor count, so a corrupt count costs nothing.
    pub(super) fn check_layer_count(&self, num_layers: usize) -> Result<()> {
        let limit = num_layers.min(self.location.len() + 1);
        for i in 0..limit {
            let name = format!("model.layers.{i}.input_layernorm.weight");
            if !self.location.contains_key(&name) {
                return Err(Error::Weights {
                    tensor: name,
                    what: format!(
                        "is missing from {}, which the config's num_hidden_layers = \
                         {num_layers} needs",
                        self.origin
                    ),
                });
            }
        }
        Ok(())
    }

    fn validate_specs(&self, specs: &[&TensorSpec]) -> Result<()> {
        for spec in specs {
            let err = |what: String| Error::Weights {
                tensor: spec.name.clone(),
                what,
            };
            let Some(&i) = self.location.get(&spec.name) else {
                return Err(err(format!("is missing from {}", self.origin)));
            };
            let file = &self.files[i];
            let info = file.meta.info(&spec.name).ok_or_else(|| {
                err(format!(
                    "the index maps it to `{}`, which does not contain it",
                    file.name()
                ))
            })?;
            if info.shape != spec.shape {
                return Err(err(format!(
                    "has shape {:?} in `{}`, expected {:?}",
                    info.shape,
                    file.name(),
                    spec.shape
                )));
            }
            dtype_of(info.dtype).ok_or_else(|| {
                err(format!(
                    "has dtype {:?} in `{}`, expected BF16, F16 or F32",
                    info.dtype,
                    file.name()
                ))
            })?;
        }
        Ok(())
    }

    /// The dtype and raw little-endian bytes of a validated tensor.
    pub(super) fn data(&self, name: &str) -> Result<(DType, &[u8])> {
        let missing = || Error::Weights {
            tensor: name.to_string(),
            what: format!("is missing from {}", self.origin),
        };
        let (file, info) = self.info(name).ok_or_else(missing)?;
        let dtype = dtype_of(info.dtype).ok_or_else(|| Error::Weights {
            tensor: name.to_string(),
            what: format!("has unsupported dtype {:?}", info.dtype),
        })?;
        let (a, b) = info.data_offsets;
        Ok((dtype, &file.mmap[file.data_start + a..file.data_start + b]))
    }

    /// Where a validated tensor's bytes lie: its dtype, the index of its file and the
    /// byte range within that file's mapping ([`Checkpoint::mapping`]).
    pub(super) fn location(&self, name: &str) -> Result<(DType, usize, std::ops::Range<usize>)> {
        let (dtype, bytes) = self.data(name)?;
        let file = *self.location.get(name).expect("data() found it");
        let base = self.files[file].mmap.as_ptr() as usize;
        let start = bytes.as_ptr() as usize - base;
        Ok((dtype, file, start..start + bytes.len()))
    }

    /// The mapping of file `file` (to register it with the device in place).
    pub(super) fn mapping(&self, file: usize) -> std::sync::Arc<Mmap> {
        self.files[file].mmap.clone()
    }

    /// The path of file `file`, for messages.
    pub(super) fn file_name(&self, file: usize) -> String {
        self.files[file].name()
    }

    /// An optional tensor's values as f32, `None` when the checkpoint lacks it.
    pub(super) fn read_f32(&self, name: &str) -> Result<Option<Vec<f32>>> {
        if self.info(name).is_none() {
            return Ok(None);
        }
        let (dtype, bytes) = self.data(name)?;
        Ok(Some(host::to_f32(bytes, dtype)))
    }
}

/// The checkpoint dtypes encore converts from.
fn dtype_of(d: Dtype) -> Option<DType> {
    match d {
        Dtype::BF16 => Some(DType::BF16),
        Dtype::F16 => Some(DType::F16),
        Dtype::F32 => Some(DType::F32),
        _ => None,
    }
}

/// A sort key that orders the numbers inside names by value (`layers.2` before
/// `layers.10`), so "the first unused tensor" is the first in model order.
pub(crate) fn natural_key(name: &str) -> Vec<(u64, String)> {
    let mut key = Vec::new();
    let mut rest = name;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits > 0 {
            key.push((rest[..digits].parse().unwrap_or(u64::MAX), String::new()));
            rest = &rest[digits..];
        } else {
            let text = rest.len() - rest.trim_start_matches(|c: char| !c.is_ascii_digit()).len();
            key.push((0, rest[..text].to_string()));
            rest = &rest[text..];
        }
    }
    key
}
