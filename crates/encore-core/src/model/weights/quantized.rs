//! [`Source::with_quantized`]: one HF tensor's device rows in a quantized format, from the
//! file's own blocks where it stores them in that format, else quantized at load.

use encore_backend::quant::QuantFormat;

use super::host::Staging;
use super::{dummy_init, Source, TensorSpec};
use crate::error::Result;
use crate::model::config::ModelConfig;
use crate::tensor::DType;

impl Source {
    /// [`Source::with_bytes`] for a tensor kept in `fmt`: device rows (`crate::quant`'s
    /// layout) of the file's own blocks when a GGUF file stores the part in `fmt` (or a
    /// GPTQ / FP8 / MXFP4 checkpoint its own codes and scales), else of its values
    /// quantized at load.
    pub(super) fn with_quantized<R>(
        &self,
        cfg: &ModelConfig,
        spec: &TensorSpec,
        fmt: QuantFormat,
        staging: &mut Staging,
        f: impl FnOnce(&[u8]) -> Result<R>,
    ) -> Result<R> {
        let k = *spec.shape.last().unwrap_or(&0);
        let bytes = match self {
            Source::Gguf(g) => match g.tensor_blocks(spec, fmt)? {
                Some(blocks) => staging.packed(fmt, k, &blocks),
                None => {
                    let values = g.tensor_f32(spec)?;
                    staging.quantized(fmt, k, |s| s.floats_from(&values))
                }
            },
            // A GPTQ projection: its own codes and scales as GGUF blocks when kept in the
            // format it is exactly, else its values requantized.
            Source::Checkpoint(ck) => match ck.packed_int(spec)? {
                Some(w) if w.format() == fmt => staging.packed(fmt, k, &w.blocks()),
                Some(w) => {
                    let values = w.to_f32();
                    staging.quantized(fmt, k, |s| s.floats_from(&values))
                }
                None => match ck.fp8(&spec.name)? {
                    // An FP8 checkpoint kept in FP8: its own bytes and scales.
                    Some(w) if fmt == QuantFormat::F8E4M3 => {
                        let bytes = w.rows * fmt.row_bytes(k).unwrap_or(0);
                        staging.rows_with(bytes, |out| w.device_rows(out))
                    }
                    Some(w) => {
                        let values = w.to_f32();
                        staging.quantized(fmt, k, |s| s.floats_from(&values))
                    }
                    None => {
                        // gpt-oss's MXFP4 experts kept in MXFP4: their own blocks.
                        let rows = match fmt {
                            QuantFormat::Mxfp4 => ck.fused.mxfp4_rows(ck, &spec.name)?,
                            _ => None,
                        };
                        match rows {
                            Some(rows) => {
                                staging.rows_with(rows.len(), |o| o.copy_from_slice(&rows))
                            }
                            None => match ck.fused.read_f32(ck, &spec.name)? {
                                Some(values) => {
                                    staging.quantized(fmt, k, |s| s.floats_from(&values))
                                }
                                None => {
                                    let (src_dtype, bytes) = ck.data(&spec.name)?;
                                    staging.quantized(fmt, k, |s| s.floats_of(bytes, src_dtype))
                                }
                            },
                        }
                    }
                },
            },
            Source::Dummy { seed } => {
                let (mean, std) = dummy_init(cfg, spec);
                staging.quantized(fmt, k, |s| {
                    s.dummy(*seed, &spec.name, spec.numel(), mean, std, DType::F32)
                        .len()
                        / 4
                })
            }
        };
        f(bytes)
    }
}
