//! A GGUF file (v2 or v3, little-endian) memory-mapped and parsed: header, metadata
//! key-values, tensor infos, and the data section with every tensor's bytes checked to lie
//! inside the file.
//!
//! Layout: magic `GGUF`, u32 version, u64 tensor count, u64 metadata count; each metadata
//! entry a string key, a u32 value type and the value; each tensor info a string name,
//! u32 n_dims, n_dims u64 dims (`ne[0]` innermost), u32 ggml type, u64 offset into the
//! data section; padding to `general.alignment` (default 32); the data section. Strings
//! are a u64 byte length and UTF-8 bytes; arrays a u32 element type, a u64 count and the
//! elements.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::quants::{self, GgmlType};
use crate::error::{Error, Result};

/// The four bytes every GGUF file starts with.
pub const MAGIC: &[u8; 4] = b"GGUF";
/// `general.alignment` when the file does not set it.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// ggml tensors have at most four dimensions.
const MAX_DIMS: usize = 4;
/// Arrays nested deeper than this are refused (no real file nests at all).
const MAX_NESTING: usize = 8;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// The element type id and the elements (all of that type).
    Array(u32, Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// The GGUF value type id.
    pub fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::String(_) => 8,
            Value::Array(..) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }

    /// Any integer value, as i128 (so every GGUF integer fits).
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(x) => x.into(),
            Value::I8(x) => x.into(),
            Value::U16(x) => x.into(),
            Value::I16(x) => x.into(),
            Value::U32(x) => x.into(),
            Value::I32(x) => x.into(),
            Value::U64(x) => x.into(),
            Value::I64(x) => x.into(),
            _ => return None,
        })
    }

    /// Any number, as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(x) => Some(x.into()),
            Value::F64(x) => Some(x),
            _ => self.as_int().map(|x| x as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(_, items) => Some(items),
            _ => None,
        }
    }

    /// A short description for messages: the type and, for scalars, the value.
    pub fn describe(&self) -> String {
        match self {
            Value::String(s) if s.len() > 40 => format!("a string of {} bytes", s.len()),
            Value::String(s) => format!("\"{s}\""),
            Value::Array(_, items) => format!("an array of {} values", items.len()),
            other => format!("{other:?}"),
        }
    }
}

/// One tensor's entry in the file.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// `ne[0..n_dims]`, innermost first (reversed against the HF/PyTorch shape).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Byte offset of the data in the file (the data section start plus the stored offset).
    pub start: usize,
    /// Bytes of data.
    pub len: usize,
}

impl TensorInfo {
    /// Elements (the product of the dims).
    pub fn numel(&self) -> usize {
        self.dims.iter().product::<u64>() as usize
    }

    /// The shape in PyTorch order (outermost first).
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A parsed, memory-mapped GGUF file.
pub struct GgufFile {
    path: PathBuf,
    mmap: Mmap,
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    keys: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    /// `general.alignment`.
    pub alignment: usize,
}

impl GgufFile {
    /// Map and parse `path`; any malformation is an [`Error::WeightsFile`] naming it.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = File::open(path).map_err(|source| Error::Io {
            what: "opening GGUF file",
            path: path.display().to_string(),
            source,
        })?;
        // SAFETY: the map is read-only and lives as long as this struct. Another process
        // truncating or rewriting the file while it is mapped is undefined behaviour we
        // cannot exclude (every mmap-based loader shares it).
        let mmap = unsafe { Mmap::map(&file) }.map_err(|source| Error::Io {
            what: "memory-mapping GGUF file",
            path: path.display().to_string(),
            source,
        })?;
        let parsed = Parser {
            buf: &mmap,
            pos: 0,
            path,
            elements: 0,
        }
        .parse()?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            mmap,
            version: parsed.version,
            keys: parsed
                .metadata
                .iter()
                .enumerate()
                .map(|(i, (k, _))| (k.clone(), i))
                .collect(),
            metadata: parsed.metadata,
            by_name: parsed
                .tensors
                .iter()
                .enumerate()
                .map(|(i, t)| (t.name.clone(), i))
                .collect(),
            tensors: parsed.tensors,
            alignment: parsed.alignment,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The metadata value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.keys.get(key).map(|&i| &self.metadata[i].1)
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor (checked to lie inside the file at open).
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        self.mmap
            .get(info.start..info.start + info.len)
            .unwrap_or(&[])
    }

    /// A tensor dequantized to f32 (in file order, `ne[0]` fastest); an unsupported type
    /// or a missing tensor is an [`Error::Weights`] naming it.
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        let info = self.tensor(name).ok_or_else(|| Error::Weights {
            tensor: name.to_string(),
            what: format!("is not in `{}`", self.path.display()),
        })?;
        let mut out = vec![0f32; info.numel()];
        quants::dequantize(info.ggml_type, self.tensor_bytes(info), &mut out).map_err(|what| {
            Error::Weights {
                tensor: name.to_string(),
                what: format!("{what} (in `{}`)", self.path.display()),
            }
        })?;
        Ok(out)
    }
}

struct Parsed {
    version: u32,
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorInfo>,
    alignment: usize,
}

/// A cursor over the file's bytes; every read checks the length first.
struct Parser<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
    /// Metadata array elements read so far (see [`MAX_ARRAY_ELEMENTS`]).
    elements: usize,
}

/// Metadata array elements a file may hold in all: a value takes ~32 bytes in memory
/// against 1 in the file for a u8 array, so the file size alone does not bound the
/// memory a hostile file asks for. Real files hold a few vocabulary-sized arrays
/// (tokens, scores, types, merges: well under 2^24 each).
const MAX_ARRAY_ELEMENTS: usize = 1 << 26;

impl<'a> Parser<'a> {
    fn err(&self, what: impl Into<String>) -> Error {
        Error::WeightsFile {
            path: self.path.display().to_string(),
            what: what.into(),
        }
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.err(format!(
                "truncated: {} needs {n} bytes at offset {} but the file has {} bytes",
                what(),
                self.pos,
                self.buf.len()
            )));
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of items each at least `min_size` bytes: refused when the rest of the file
    /// could not hold them (so a corrupt count never drives a huge allocation).
    fn count(&mut self, min_size: usize, what: &dyn Fn() -> String) -> Result<usize> {
        let n = self.u64(what)?;
        let fits = usize::try_from(n).ok().filter(|&n| {
            n.checked_mul(min_size)
                .is_some_and(|b| b <= self.remaining())
        });
        fits.ok_or_else(|| {
            self.err(format!(
                "{} is {n}, more than the {} bytes left in the file can hold",
                what(),
                self.remaining()
            ))
        })
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let len = self.count(1, &|| format!("the length of {}", what()))?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|e| self.err(format!("{} is not valid UTF-8: {e}", what())))
    }

    fn parse(mut self) -> Result<Parsed> {
        let magic = self.array::<4>(&|| "the magic".into())?;
        if &magic != MAGIC {
            return Err(self.err(format!(
                "not a GGUF file: it starts with {magic:02x?}, not \"GGUF\""
            )));
        }
        let version = self.u32(&|| "the version".into())?;
        if version != 2 && version != 3 {
            let hint = if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
                " (a big-endian file; encore reads little-endian GGUF only)"
            } else if version == 1 {
                " (GGUF v1 is obsolete: convert the model again)"
            } else {
                ""
            };
            return Err(self.err(format!(
                "unsupported GGUF version {version}{hint}; encore reads versions 2 and 3"
            )));
        }
        // A tensor info takes at least 24 + 8 bytes, a metadata entry 8 + 4 + 1.
        let n_tensors = self.count(32, &|| "the tensor count".into())?;
        let n_kv = self.count(13, &|| "the metadata count".into())?;

        let mut metadata = Vec::with_capacity(n_kv);
        let mut seen = HashMap::with_capacity(n_kv);
        for i in 0..n_kv {
            let key = self.string(&|| format!("the key of metadata entry {i}"))?;
            let ty = self.u32(&|| format!("the value type of metadata `{key}`"))?;
            let value = self.value(ty, 0, &|| format!("metadata `{key}`"))?;
            if seen.insert(key.clone(), i).is_some() {
                return Err(self.err(format!("metadata key `{key}` appears twice")));
            }
            metadata.push((key, value));
        }

        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((_, Value::U32(a))) if *a > 0 && a.is_power_of_two() => *a as usize,
            Some((_, v)) => {
                return Err(self.err(format!(
                    "general.alignment must be a u32 power of two, found {}",
                    v.describe()
                )))
            }
        };

        let mut infos = Vec::with_capacity(n_tensors);
        let mut names = HashMap::with_capacity(n_tensors);
        for i in 0..n_tensors {
            let name = self.string(&|| format!("the name of tensor {i}"))?;
            let what = |s: &str| format!("the {s} of tensor `{name}`");
            let n_dims = self.u32(&|| what("dimension count"))? as usize;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(self.err(format!(
                    "tensor `{name}` has {n_dims} dimensions (1 to {MAX_DIMS} allowed)"
                )));
            }
            let mut dims = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                dims.push(self.u64(&|| what("dimensions"))?);
            }
            let ty = GgmlType(self.u32(&|| what("type"))?);
            let offset = self.u64(&|| what("offset"))?;
            if names.insert(name.clone(), i).is_some() {
                return Err(self.err(format!("tensor `{name}` appears twice")));
            }
            infos.push((name, dims, ty, offset));
        }

        let data_start = self.pos.div_ceil(alignment) * alignment;
        let mut tensors = Vec::with_capacity(infos.len());
        for (name, dims, ty, offset) in infos {
            tensors.push(self.place(name, dims, ty, offset, data_start, alignment)?);
        }
        Ok(Parsed {
            version,
            metadata,
            tensors,
            alignment,
        })
    }

    /// Check a tensor's size and position and say where its bytes are.
    fn place(
        &self,
        name: String,
        dims: Vec<u64>,
        ty: GgmlType,
        offset: u64,
        data_start: usize,
        alignment: usize,
    ) -> Result<TensorInfo> {
        let bad = |what: String| self.err(format!("tensor `{name}`: {what}"));
        let (block_elems, _) = ty.block().ok_or_else(|| Error::Weights {
            tensor: name.clone(),
            what: format!(
                "has GGML type id {}, which ggml does not define (in `{}`)",
                ty.0,
                self.path.display()
            ),
        })?;
        let numel = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .filter(|&n| n > 0 && usize::try_from(n).is_ok())
            .ok_or_else(|| bad(format!("dimensions {dims:?} are empty or too large")))?;
        if !dims[0].is_multiple_of(block_elems as u64) {
            return Err(bad(format!(
                "its row length {} is not a multiple of the {ty} block of {block_elems}",
                dims[0]
            )));
        }
        let len = ty
            .bytes_for(numel)
            .ok_or_else(|| bad(format!("dimensions {dims:?} overflow")))?;
        if !offset.is_multiple_of(alignment as u64) {
            return Err(bad(format!(
                "data offset {offset} is not a multiple of the alignment {alignment}"
            )));
        }
        let end = (data_start as u64)
            .checked_add(offset)
            .and_then(|s| s.checked_add(len));
        match end {
            Some(end) if end <= self.buf.len() as u64 => Ok(TensorInfo {
                start: data_start + offset as usize,
                len: len as usize,
                name,
                dims,
                ggml_type: ty,
            }),
            _ => Err(bad(format!(
                "its {len} bytes at data offset {offset} (file offset {}) extend past the \
                 end of the file ({} bytes): truncated download?",
                data_start as u64 + offset,
                self.buf.len()
            ))),
        }
    }

    fn value(&mut self, ty: u32, depth: usize, what: &dyn Fn() -> String) -> Result<Value> {
        Ok(match ty {
            0 => Value::U8(u8::from_le_bytes(self.array(what)?)),
            1 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            2 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            4 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            5 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.err(format!("{} is a bool of value {b}", what()))),
            },
            8 => Value::String(self.string(what)?),
            9 => {
                if depth >= MAX_NESTING {
                    return Err(self.err(format!(
                        "{} nests arrays more than {MAX_NESTING} deep",
                        what()
                    )));
                }
                let elem = self.u32(&|| format!("the element type of {}", what()))?;
                let min = match elem {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    other => {
                        return Err(self.err(format!(
                            "{} is an array of unknown value type {other}",
                            what()
                        )))
                    }
                };
                let n = self.count(min, &|| format!("the length of {}", what()))?;
                self.elements = self.elements.saturating_add(n);
                if self.elements > MAX_ARRAY_ELEMENTS {
                    return Err(self.err(format!(
                        "{} brings the metadata to more than {MAX_ARRAY_ELEMENTS} array \
                         elements",
                        what()
                    )));
                }
                let mut items = Vec::with_capacity(n);
                for i in 0..n {
                    items.push(self.value(elem, depth + 1, &|| format!("{}[{i}]", what()))?);
                }
                Value::Array(elem, items)
            }
            10 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            11 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            other => return Err(self.err(format!("{} has unknown value type {other}", what()))),
        })
    }
}
