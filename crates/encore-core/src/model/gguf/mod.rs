//! GGUF models (the llama.cpp / Ollama / LM Studio format): the file reader, the
//! dequantizers of the common GGML types, the config and tokenizer metadata, the mapping
//! of GGUF tensors onto the HF tensors [`crate::model::weights`] loads, and a small
//! writer for tests.
//!
//! A projection the file stores in one block format (all its q/k/v or gate/up parts in the
//! same type) stays in that format on the device ([`stored_formats`]; the kernels decode
//! it as they multiply); everything else (embeddings, norms, a projection whose parts
//! differ in type, everything under `--quantization none`) is dequantized to f32 on the
//! host and converted to the run dtype.

mod config;
mod quants;
mod reader;
mod tensors;
pub mod writer;

pub use config::{config_from_gguf, gguf_arch, vocab_from_gguf, ROPE_FREQS};
pub use quants::{dequantize, quantize, quantize_q4_0, quantize_q4_1, quantize_q8_0, GgmlType};
pub use reader::{GgufFile, TensorInfo, Value, DEFAULT_ALIGNMENT, MAGIC};
pub use tensors::{
    gguf_name, gguf_source, gguf_source_of, stored_formats, unpermute_rows, GgufWeights,
};
pub use writer::GgufWriter;

use std::io::Read;
use std::path::Path;

/// Whether `path` names a GGUF file: a `.gguf` extension, or a file starting with `GGUF`.
pub fn is_gguf(path: &Path) -> bool {
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return true;
    }
    let mut magic = [0u8; 4];
    path.is_file()
        && std::fs::File::open(path)
            .and_then(|mut f| f.read_exact(&mut magic))
            .is_ok()
        && &magic == MAGIC
}
