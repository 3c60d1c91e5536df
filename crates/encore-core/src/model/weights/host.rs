//! Host-side tensor data for the loader: dtype conversion of checkpoint bytes and seeded
//! dummy values, both computed in parallel (rayon) straight into the run dtype.

use half::{bf16, f16};
use rayon::prelude::*;

use encore_backend::quant::{self, QuantFormat};

use crate::model::decl::Slice;
use crate::ops::{splitmix64, GOLDEN};
use crate::tensor::DType;

/// The host buffer tensors pass through on their way to the device: one tensor at a time,
/// reused (grown to the largest tensor, usually the embedding, which loads first) so a
/// multi-GB model does not pay fresh page faults for every tensor.
#[derive(Default)]
pub(super) struct Staging {
    /// bf16 or f16 bits.
    halves: Vec<u16>,
    floats: Vec<f32>,
    /// Quantized device rows.
    quant: Vec<u8>,
}

/// Elements per rayon task.
const CHUNK: usize = 1 << 15;

/// The first `n` elements of `v`, growing it (zeroed, without keeping the old buffer).
fn first<T: Copy + Default>(v: &mut Vec<T>, n: usize) -> &mut [T] {
    if v.len() < n {
        *v = Vec::new();
        *v = vec![T::default(); n];
    }
    &mut v[..n]
}

fn fill<T: bytemuck::Pod + Default + Send>(
    v: &mut Vec<T>,
    n: usize,
    value: impl Fn(usize) -> T + Sync,
) -> &[u8] {
    let out = first(v, n);
    out.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(c, chunk)| {
            for (j, x) in chunk.iter_mut().enumerate() {
                *x = value(c * CHUNK + j);
            }
        });
    bytemuck::cast_slice(out)
}

impl Staging {
    /// `n` elements `value(i)` rounded once to the float dtype `to`, computed in
    /// parallel; returns their bytes.
    fn generate(&mut self, n: usize, to: DType, value: impl Fn(usize) -> f32 + Sync) -> &[u8] {
        match to {
            DType::BF16 => fill(&mut self.halves, n, |i| bf16_bits(value(i))),
            DType::F16 => fill(&mut self.halves, n, |i| f16::from_f32(value(i)).to_bits()),
            DType::F32 => fill(&mut self.floats, n, value),
            other => unreachable!("weights are loaded in float dtypes only, not {other}"),
        }
    }

    /// Little-endian `from` elements (bf16, f16 or f32; any byte alignment) converted to
    /// `to`. Every source value is exact in f32, so each element is rounded once.
    pub(super) fn convert(&mut self, src: &[u8], from: DType, to: DType) -> &[u8] {
        let n = src.len() / from.size();
        let two = |i: usize| u16::from_le_bytes([src[2 * i], src[2 * i + 1]]);
        match from {
            DType::BF16 => self.generate(n, to, |i| bf16::from_bits(two(i)).to_f32()),
            DType::F16 => self.generate(n, to, |i| f16::from_bits(two(i)).to_f32()),
            DType::F32 => self.generate(n, to, |i| {
                f32::from_le_bytes([src[4 * i], src[4 * i + 1], src[4 * i + 2], src[4 * i + 3]])
            }),
            other => unreachable!("checkpoint dtypes are validated before conversion, not {other}"),
        }
    }

    /// `n` dummy values of tensor `name` in `to`: `mean + std * t` with `t` the sum of two
    /// uniform draws rescaled to unit variance (a cheap bell shape within ±2.45), element
    /// `i` drawn from splitmix64 of `(seed, name, i)`, so the values depend on nothing else.
    pub(super) fn dummy(
        &mut self,
        seed: u64,
        name: &str,
        n: usize,
        mean: f32,
        std: f32,
        to: DType,
    ) -> &[u8] {
        let value = dummy_value(seed, name, mean, std);
        self.generate(n, to, value)
    }

    /// The block `s` of the dummy tensor `name` whose rows hold `k` values: the values [`Self::dummy`] gives those elements, drawn alone (a
    /// tensor-parallel rank's share without the whole tensor).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dummy_block(
        &mut self,
        seed: u64,
        name: &str,
        k: usize,
        s: Slice,
        mean: f32,
        std: f32,
        to: DType,
    ) -> &[u8] {
        let value = dummy_value(seed, name, mean, std);
        let cols = s.cols.max(1);
        self.generate(s.rows * cols, to, move |j| {
            value((s.row + j / cols) * k + s.col + j % cols)
        })
    }
}

/// Element `i` of dummy tensor `name`: `mean + std * t` with `t` the sum of two uniform
/// draws of splitmix64 of `(seed, name, i)`, rescaled to unit variance.
fn dummy_value(seed: u64, name: &str, mean: f32, std: f32) -> impl Fn(usize) -> f32 + Sync {
    let key = splitmix64(seed ^ fnv1a(name));
    let scale = std * 6f32.sqrt() / u32::MAX as f32;
    move |i| {
        let r = splitmix64(key.wrapping_add((i as u64).wrapping_mul(GOLDEN)));
        let sum = (r >> 32) as f32 + (r & 0xFFFF_FFFF) as f32;
        mean + (sum - u32::MAX as f32) * scale
    }
}

impl Staging {
    /// The f32 values `values` writes into the staging buffer (`n` of them), quantized
    /// to `fmt` device rows of `k` values (in parallel over rows); returns their bytes.
    pub(super) fn quantized(
        &mut self,
        fmt: QuantFormat,
        k: usize,
        values: impl FnOnce(&mut Staging) -> usize,
    ) -> &[u8] {
        let n = values(self);
        let rows = n / k;
        let rb = fmt
            .row_bytes(k)
            .expect("formats are checked before loading");
        let floats = &self.floats[..n];
        let out = first(&mut self.quant, rows * rb);
        out.par_chunks_mut(rb)
            .zip(floats.par_chunks(k))
            .for_each(|(o, v)| quant::quantize_rows(fmt, v, k, o));
        out
    }

    /// f32 values into the staging buffer: `src` (little-endian `from` elements)
    /// converted, or dummy values; returns the count (for [`Self::quantized`]).
    pub(super) fn floats_of(&mut self, src: &[u8], from: DType) -> usize {
        self.convert(src, from, DType::F32).len() / 4
    }

    /// Put `values` in the staging buffer; returns the count.
    pub(super) fn floats_from(&mut self, values: &[f32]) -> usize {
        first(&mut self.floats, values.len()).copy_from_slice(values);
        values.len()
    }

    /// `bytes` of device rows written by `fill`.
    pub(super) fn rows_with(&mut self, bytes: usize, fill: impl FnOnce(&mut [u8])) -> &[u8] {
        let out = first(&mut self.quant, bytes);
        fill(out);
        out
    }

    /// Rows of ggml blocks of `fmt` (`k` values a row) laid out as device rows.
    pub(super) fn packed(&mut self, fmt: QuantFormat, k: usize, blocks: &[u8]) -> &[u8] {
        let src_row = k / fmt.block_elems() * fmt.block_bytes();
        let rb = fmt
            .row_bytes(k)
            .expect("formats are checked before loading");
        let out = first(&mut self.quant, blocks.len() / src_row * rb);
        out.par_chunks_mut(rb)
            .zip(blocks.par_chunks(src_row))
            .for_each(|(o, b)| quant::pack_row(fmt, b, o));
        out
    }
}

/// Little-endian bf16/f16/f32 bytes as f32 values (small tensors).
pub(super) fn to_f32(src: &[u8], from: DType) -> Vec<f32> {
    let mut staging = Staging::default();
    let n = staging.convert(src, from, DType::F32).len() / 4;
    staging.floats[..n].to_vec()
}

/// `bf16::from_f32(x).to_bits()` (round to nearest even, NaN kept quiet) without the
/// data-dependent branch, which mispredicts on random data and made conversion ~5x slower.
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if b & 0x7FFF_FFFF > 0x7F80_0000 {
        return ((b >> 16) | 0x0040) as u16;
    }
    (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// FNV-1a of a tensor name: the per-tensor stream key.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_bits_matches_half() {
        let mut xs = vec![
            0.0,
            -0.0,
            1.0,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::MIN_POSITIVE,
            1e-40,
            f32::from_bits(0x3F80_8000), // exactly halfway, even below: stays
            f32::from_bits(0x3F81_8000), // exactly halfway, odd below: rounds up
            f32::from_bits(0x7F7F_FFFF), // rounds to infinity
        ];
        xs.extend((0..200_000u64).map(|i| f32::from_bits(splitmix64(i) as u32)));
        for x in xs {
            assert_eq!(
                bf16_bits(x),
                bf16::from_f32(x).to_bits(),
                "{x:e} {:#x}",
                x.to_bits()
            );
        }
    }

    #[test]
    fn dummy_values_do_not_depend_on_the_dtype_or_the_buffer() {
        let mut a = Staging::default();
        let mut b = Staging::default();
        // A larger tensor first, so `b` reuses a bigger buffer.
        b.dummy(3, "other", 100_000, 0.0, 1.0, DType::F32);
        let f: Vec<f32> =
            bytemuck::cast_slice(a.dummy(3, "w", 70_000, 0.5, 2.0, DType::F32)).to_vec();
        let h: Vec<u16> =
            bytemuck::cast_slice(b.dummy(3, "w", 70_000, 0.5, 2.0, DType::BF16)).to_vec();
        assert_eq!(h.len(), f.len());
        assert!(f
            .iter()
            .zip(&h)
            .all(|(&x, &y)| bf16::from_f32(x).to_bits() == y));
        assert!(f.iter().all(|&x| (x - 0.5).abs() <= 2.0 * 6f32.sqrt()));
    }
}
