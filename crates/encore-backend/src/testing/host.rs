//! Host-side helpers the checks need beyond `dyn Backend`'s: reading a float tensor back
//! as f64, and poisoning outputs.

use crate::backend::Backend;
use crate::error::Result;
use crate::tensor::Tensor;

/// A float tensor read back as f64 (exact: every float dtype widens exactly to f32).
pub(crate) fn download_f64(b: &dyn Backend, src: &Tensor) -> Result<Vec<f64>> {
    Ok(b.download_f32(src)?.into_iter().map(f64::from).collect())
}

/// Fill `t` with garbage an op must overwrite: NaN in every float dtype (the bytes
/// `c0 7f` repeated are a NaN as bf16, f16 and f32), -1 for integers.
pub(crate) fn poison(b: &dyn Backend, t: &Tensor) -> Result<()> {
    let bytes: Vec<u8> = if t.dtype().is_float() {
        [0xc0u8, 0x7f]
            .into_iter()
            .cycle()
            .take(t.size_bytes())
            .collect()
    } else {
        vec![0xff; t.size_bytes()]
    };
    b.write_bytes(t, &bytes)
}
