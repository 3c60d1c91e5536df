//! An HF safetensors checkpoint on disk: its files memory-mapped, their headers parsed,
//! and a map from tensor name to the file holding it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata, TensorInfo};
use safetensors::SafeTensors;

use super::fused_experts::FusedExperts;
use super::packed_int::{self, PackedIntWeight};
use super::{host, TensorSpec};
use crate::error::{Error, Result};
use crate::model::formats::IntPacking;
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
    /// Tensor name (as the declaration names it: [`our_name`]) -> index into `files` and
    /// the name in that file.
    location: HashMap<String, (usize, String)>,
    /// How the location map was built, for "missing" messages.
    origin: String,
    /// The config's packing in integers (GPTQ, pack-quantized), when its projections are
    /// packed ([`PackedIntWeight`]).
    pub(super) int_packing: Option<IntPacking>,
    /// gpt-oss's fused expert tensors, read under per-expert names.
    pub(super) fused: FusedExperts,
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
                if let Some((j, _)) = location.insert(our_name(&name), (i, name.clone())) {
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
            int_packing: None,
            fused: FusedExperts::default(),
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
            .map(|(t, f)| {
                let i = names.binary_search(&f).expect("file name is in the set");
                (our_name(&t), (i, t))
            })
            .collect();
        Ok(Checkpoint {
            files,
            location,
            origin: format!("`{}`", index.display()),
            int_packing: None,
            fused: FusedExperts::default(),
        })
    }

    fn info(&self, name: &str) -> Option<(&ShardFile, &TensorInfo)> {
        let (i, in_file) = self.location.get(name)?;
        let file = &self.files[*i];
        file.meta.info(in_file).map(|info| (file, info))
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
        // A packed projection's tensors stand for its `.weight` (read and checked with it
        // by `validate_specs`).
        let packed = |n: &str| self.int_packing.is_some() && packed_int::is_packed_part(n);
        let mut unused: Vec<&String> = self
            .location
            .keys()
            .filter(|n| !used.contains(n.as_str()) && !ignored(n) && !packed(n))
            .filter(|n| !self.fused.is_source(n))
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
            let name = format!("model.layers.{i}.self_attn.o_proj.weight");
            let packed = self.int_packing.is_some_and(|p| {
                let base = format!("model.layers.{i}.self_attn.o_proj");
                self.location.contains_key(&p.scheme.packed_tensor(&base).0)
            });
            if !(self.location.contains_key(&name) || packed) {
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
            let Some((i, in_file)) = self.location.get(&spec.name) else {
                // One expert's tensor of a fused one (gpt-oss).
                if let Some(shape) = self.fused.shape(&spec.name) {
                    if shape != spec.shape.as_slice() {
                        return Err(err(format!(
                            "has shape {shape:?}, expected {:?}",
                            spec.shape
                        )));
                    }
                    continue;
                }
                // Read now: a misshapen or unsupported packing is refused before loading.
                if self.read_packed_int(spec, false)?.is_some() {
                    continue;
                }
                return Err(err(format!("is missing from {}", self.origin)));
            };
            let file = &self.files[*i];
            let info = file.meta.info(in_file).ok_or_else(|| {
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
            if info.dtype == Dtype::F8_E4M3 {
                // Read now: a missing or misshapen scale is refused before loading.
                self.fp8(&spec.name)?;
                continue;
            }
            dtype_of(info.dtype).ok_or_else(|| {
                err(format!(
                    "has dtype {:?} in `{}`, expected BF16, F16, F32 or F8_E4M3 (with its \
                     scales)",
                    info.dtype,
                    file.name()
                ))
            })?;
        }
        Ok(())
    }

    /// An FP8 E4M3 weight `[rows, cols]` and its scales (`None` for a tensor of another
    /// dtype): `<name>_scale_inv` (DeepSeek and Qwen3-FP8: a `[ceil(rows / 128),
    /// ceil(cols / 128)]` grid of f32 multipliers, or one value) or `<name>_scale` (one
    /// per-tensor multiplier, or compressed-tensors' per-channel `[rows, 1]`). A missing or
    /// misshapen scale is an error naming the tensor.
    pub(super) fn fp8(&self, name: &str) -> Result<Option<Fp8<'_>>> {
        let Some((file, info)) = self.info(name) else {
            return Ok(None);
        };
        if info.dtype != Dtype::F8_E4M3 {
            return Ok(None);
        }
        let err = |what: String| Error::Weights {
            tensor: name.to_string(),
            what,
        };
        let (rows, cols) = match info.shape[..] {
            [r, c] => (r, c),
            _ => {
                return Err(err(format!(
                    "is FP8 with shape {:?}, expected a matrix",
                    info.shape
                )))
            }
        };
        let (scale_name, scale) = [format!("{name}_scale_inv"), format!("{name}_scale")]
            .into_iter()
            .find_map(|n| self.info(&n).map(|(_, i)| (n, i.shape.clone())))
            .ok_or_else(|| {
                err(format!(
                    "is FP8 (F8_E4M3) but {} has no `{name}_scale_inv` or `{name}_scale`",
                    self.origin
                ))
            })?;
        let values = self.read_f32(&scale_name)?.unwrap_or_default();
        let grid = (rows.div_ceil(FP8_BLOCK), cols.div_ceil(FP8_BLOCK));
        let layout = if values.len() == 1 {
            Fp8Scales::Tensor
        } else if scale == [rows, 1] {
            Fp8Scales::Row
        } else if scale.len() == 2 && (scale[0], scale[1]) == grid {
            Fp8Scales::Blocks { grid_cols: grid.1 }
        } else {
            return Err(err(format!(
                "has FP8 scales `{scale_name}` of shape {scale:?}, expected one value, \
                 [{rows}, 1] (a row each) or [{}, {}] (128x128 blocks)",
                grid.0, grid.1
            )));
        };
        if let Some(i) = values.iter().position(|x| !x.is_finite()) {
            return Err(err(format!(
                "has a non-finite FP8 scale at {i} in `{scale_name}`"
            )));
        }
        let (a, b) = info.data_offsets;
        Ok(Some(Fp8 {
            bytes: &file.mmap[file.data_start + a..file.data_start + b],
            rows,
            cols,
            scales: values,
            layout,
        }))
    }

    /// Packed projection `spec` unpacked (under act order its columns sorted by group
    /// within the rank's share), or `None` (not a packed checkpoint, or a tensor it stores
    /// plainly).
    pub(super) fn packed_int(&self, spec: &TensorSpec) -> Result<Option<PackedIntWeight>> {
        self.read_packed_int(spec, true)
    }

    /// Whether the checkpoint stores tensor `name` itself (a packed projection's `.weight`
    /// it does not).
    pub(super) fn holds(&self, name: &str) -> bool {
        self.location.contains_key(name)
    }

    /// [`Checkpoint::packed_int`], only checked unless `unpack`.
    pub(super) fn read_packed_int(
        &self,
        spec: &TensorSpec,
        unpack: bool,
    ) -> Result<Option<PackedIntWeight>> {
        let (name, shape) = (spec.name.as_str(), spec.shape.as_slice());
        // The columns a rank multiplies (a row-parallel share), which act order sorts.
        let range = spec
            .slice
            .filter(|_| shape.len() == 2)
            .map(|s| s.col..s.col + s.cols);
        match self.int_packing {
            Some(g) if !self.location.contains_key(name) => {
                PackedIntWeight::read(self, g, name, shape, range, unpack)
            }
            _ => Ok(None),
        }
    }

    /// A tensor's safetensors dtype, shape and bytes, unchecked; `None` when absent.
    pub(super) fn raw(&self, name: &str) -> Option<(Dtype, Vec<usize>, &[u8])> {
        let (file, info) = self.info(name)?;
        let (a, b) = info.data_offsets;
        Some((
            info.dtype,
            info.shape.clone(),
            &file.mmap[file.data_start + a..file.data_start + b],
        ))
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
        let file = self.location.get(name).expect("data() found it").0;
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

    /// An optional 1-D int64 tensor's values (an EAGLE-3 head's `d2t`), `None` when the
    /// checkpoint lacks it; an error naming it when it is another dtype or rank.
    pub(super) fn read_i64(&self, name: &str) -> Result<Option<Vec<i64>>> {
        let Some((file, info)) = self.info(name) else {
            return Ok(None);
        };
        if info.dtype != safetensors::Dtype::I64 || info.shape.len() != 1 {
            return Err(Error::Weights {
                tensor: name.to_string(),
                what: format!(
                    "is {:?} {:?} in {}, expected a 1-D int64 tensor",
                    info.dtype,
                    info.shape,
                    file.name()
                ),
            });
        }
        let (a, b) = info.data_offsets;
        let bytes = &file.mmap[file.data_start + a..file.data_start + b];
        Ok(Some(
            bytes
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
        ))
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

/// A checkpoint tensor's name as the declaration names it: the language model of a
/// multimodal checkpoint (Gemma 3's `Gemma3ForConditionalGeneration`) keeps its layers
/// under `language_model.model.` (transformers 4) or `model.language_model.` (5), and
/// its LM head under `language_model.lm_head`; every other name is its own.
fn our_name(name: &str) -> String {
    if let Some(rest) = name.strip_prefix("language_model.") {
        return rest.to_string();
    }
    if let Some(rest) = name.strip_prefix("model.language_model.") {
        return format!("model.{rest}");
    }
    name.to_string()
}

/// Rows and columns of one FP8 scale block.
const FP8_BLOCK: usize = 128;

/// An FP8 weight of a checkpoint: E4M3 bytes, row-major, and its f32 scales.
pub(super) struct Fp8<'a> {
    pub bytes: &'a [u8],
    pub rows: usize,
    pub cols: usize,
    /// The multipliers, laid out as `layout` says.
    scales: Vec<f32>,
    layout: Fp8Scales,
}

/// How an FP8 weight's scales map to its elements.
#[derive(Clone, Copy)]
enum Fp8Scales {
    /// One multiplier.
    Tensor,
    /// One a row (output channel).
    Row,
    /// A row-major grid of 128x128 blocks `grid_cols` wide.
    Blocks { grid_cols: usize },
}

impl Fp8<'_> {
    /// The multiplier of element `(r, c)`.
    pub fn scale(&self, r: usize, c: usize) -> f32 {
        match self.layout {
            Fp8Scales::Tensor => self.scales[0],
            Fp8Scales::Row => self.scales[r],
            Fp8Scales::Blocks { grid_cols } => {
                self.scales[(r / FP8_BLOCK) * grid_cols + c / FP8_BLOCK]
            }
        }
    }

    /// The decoded values (`fp8 * scale`), row-major.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        use rayon::prelude::*;
        out.par_chunks_mut(self.cols.max(1))
            .enumerate()
            .for_each(|(r, row)| {
                let src = &self.bytes[r * self.cols..(r + 1) * self.cols];
                for (c, (o, &q)) in row.iter_mut().zip(src).enumerate() {
                    *o = encore_backend::quant::e4m3_to_f32(q) * self.scale(r, c);
                }
            });
        out
    }

    /// Device rows of [`QuantFormat::F8E4M3`](encore_backend::quant::QuantFormat): each
    /// 128 columns of a row are one block, its scale the row's block scale, its bytes the
    /// checkpoint's own (nothing is requantized). `cols` must be a multiple of 128.
    pub fn device_rows(&self, out: &mut [u8]) {
        use encore_backend::quant::{pack_row, QuantFormat};
        use rayon::prelude::*;
        let fmt = QuantFormat::F8E4M3;
        let rb = fmt
            .row_bytes(self.cols)
            .expect("cols checked by check_formats");
        out.par_chunks_mut(rb).enumerate().for_each(|(r, o)| {
            let src = &self.bytes[r * self.cols..(r + 1) * self.cols];
            let mut blocks = Vec::with_capacity(self.cols / FP8_BLOCK * fmt.block_bytes());
            for (b, q) in src.chunks_exact(FP8_BLOCK).enumerate() {
                blocks.extend(self.scale(r, b * FP8_BLOCK).to_le_bytes());
                blocks.extend_from_slice(q);
            }
            pack_row(fmt, &blocks, o);
        });
    }
}

/// The checkpoint dtypes encore converts from.
pub(super) fn dtype_of(d: Dtype) -> Option<DType> {
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

/// The KV cache scales a checkpoint ships for an FP8 KV cache (ModelOpt's and
/// compressed-tensors' `k_scale` / `v_scale`, one per layer, at
/// `model.layers.{i}.self_attn.{k,v}_scale` or `...self_attn.{k,v}_proj.{k,v}_scale`), as
/// vLLM reads them; `None` when the checkpoint at `path` has none. A checkpoint with some
/// layers' scales and not others', or a scale that is not finite and positive, is an
/// error naming the tensor. A scale of several values (per head) gives its largest, the
/// one every head's values fit under.
pub fn read_kv_scales(
    path: &std::path::Path,
    num_layers: usize,
) -> Result<Option<Vec<crate::backend::KvScale>>> {
    let ck = Checkpoint::open(path)?;
    let one = |layer: usize, which: &str| -> Result<Option<(String, f32)>> {
        for name in [
            format!("model.layers.{layer}.self_attn.{which}_scale"),
            format!("model.layers.{layer}.self_attn.{which}_proj.{which}_scale"),
        ] {
            if let Some(v) = ck.read_f32(&name)? {
                let max = v.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                return Ok(Some((name, max)));
            }
        }
        Ok(None)
    };
    let found = (0..num_layers)
        .map(|l| Ok((one(l, "k")?, one(l, "v")?)))
        .collect::<Result<Vec<_>>>()?;
    if found.iter().all(|(k, v)| k.is_none() && v.is_none()) {
        return Ok(None);
    }
    let mut scales = Vec::with_capacity(num_layers);
    for (layer, pair) in found.into_iter().enumerate() {
        let (Some((kn, k)), Some((vn, v))) = pair else {
            return Err(Error::Weights {
                tensor: format!("model.layers.{layer}.self_attn.k_scale"),
                what: "or its v_scale is missing, but the checkpoint has KV cache scales \
                       (k_scale and v_scale come together, in every layer)"
                    .into(),
            });
        };
        for (name, x) in [(kn, k), (vn, v)] {
            if !(x.is_finite() && x > 0.0) {
                return Err(Error::Weights {
                    tensor: name,
                    what: format!("is {x}: a KV cache scale must be finite and positive"),
                });
            }
        }
        scales.push(crate::backend::KvScale { k, v });
    }
    Ok(Some(scales))
}
