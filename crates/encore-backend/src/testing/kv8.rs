//! The FP8 KV cache in the op cases: caches uploaded as E4M3 bytes (the values times the
//! scale's reciprocal, as `qkv_rope_write` stores them), read back as the values they
//! stand for, and the reference's view of both.

use crate::args::KvScale;
use crate::backend::Backend;
use crate::error::Result;
use crate::quant::{e4m3_to_f32, f32_to_e4m3};
use crate::tensor::{DType, Tensor};

/// The scales the FP8 cases run with: powers of two, so that a value the cache holds is
/// exact in every dtype, and not 1, so that a scale applied twice or not at all shows.
pub const CASE_SCALE: KvScale = KvScale { k: 0.5, v: 2.0 };

/// `values` as the E4M3 bytes an FP8 cache of scale `1 / inv` holds.
pub fn encode(values: &[f32], inv: f32) -> Vec<u8> {
    values.iter().map(|&x| f32_to_e4m3(x * inv)).collect()
}

/// What the bytes of a cache of `scale` stand for.
pub fn decode(bytes: &[u8], scale: f32) -> Vec<f64> {
    bytes
        .iter()
        .map(|&b| e4m3_to_f32(b) as f64 * scale as f64)
        .collect()
}

/// `values` round-tripped through a cache of `scale`: what the backends see.
pub fn through(values: &[f32], scale: f32) -> Vec<f64> {
    decode(&encode(values, 1.0 / scale), scale)
}

/// An FP8 cache tensor holding `values` (scale `scale`).
pub fn upload(b: &dyn Backend, values: &[f32], shape: &[usize], scale: f32) -> Result<Tensor> {
    let t = b.alloc(DType::F8E4M3, shape)?;
    b.write_bytes(&t, &encode(values, 1.0 / scale))?;
    Ok(t)
}

/// The values an FP8 cache tensor stands for.
pub fn download(b: &dyn Backend, t: &Tensor, scale: f32) -> Result<Vec<f64>> {
    let mut bytes = vec![0u8; t.size_bytes()];
    b.read_bytes(t, &mut bytes)?;
    Ok(decode(&bytes, scale))
}
