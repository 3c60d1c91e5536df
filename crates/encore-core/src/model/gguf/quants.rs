//! GGML tensor types and their dequantization to f32.
//!
//! Each supported type is a block of `block_elems` values stored in `block_bytes` bytes
//! (1 and the element size for the float types). The decoders below follow the block
//! layouts of ggml (`ggml-common.h`) and compute every value in the same order of f32
//! operations as ggml's reference dequantizer and gguf-py's `quants.py`, so the results
//! are bit-identical to theirs (`tests/gguf/twins.rs` checks a fixture made by gguf-py).

use half::{bf16, f16};
use rayon::prelude::*;

/// A GGML tensor type id (`ggml_type`), known or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

impl GgmlType {
    pub const F32: GgmlType = GgmlType(0);
    pub const F16: GgmlType = GgmlType(1);
    pub const Q4_0: GgmlType = GgmlType(2);
    pub const Q4_1: GgmlType = GgmlType(3);
    pub const Q5_0: GgmlType = GgmlType(6);
    pub const Q5_1: GgmlType = GgmlType(7);
    pub const Q8_0: GgmlType = GgmlType(8);
    pub const Q2_K: GgmlType = GgmlType(10);
    pub const Q4_K: GgmlType = GgmlType(12);
    pub const Q5_K: GgmlType = GgmlType(13);
    pub const Q6_K: GgmlType = GgmlType(14);
    pub const IQ2_XXS: GgmlType = GgmlType(16);
    pub const BF16: GgmlType = GgmlType(30);

    /// The types encore dequantizes.
    pub const SUPPORTED: [GgmlType; 11] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];

    /// `(name, elements per block, bytes per block)` of every type ggml defines.
    fn info(self) -> Option<(&'static str, usize, usize)> {
        Some(match self.0 {
            0 => ("F32", 1, 4),
            1 => ("F16", 1, 2),
            2 => ("Q4_0", 32, 18),
            3 => ("Q4_1", 32, 20),
            6 => ("Q5_0", 32, 22),
            7 => ("Q5_1", 32, 24),
            8 => ("Q8_0", 32, 34),
            9 => ("Q8_1", 32, 40),
            10 => ("Q2_K", 256, 84),
            11 => ("Q3_K", 256, 110),
            12 => ("Q4_K", 256, 144),
            13 => ("Q5_K", 256, 176),
            14 => ("Q6_K", 256, 210),
            15 => ("Q8_K", 256, 292),
            16 => ("IQ2_XXS", 256, 66),
            17 => ("IQ2_XS", 256, 74),
            18 => ("IQ3_XXS", 256, 98),
            19 => ("IQ1_S", 256, 50),
            20 => ("IQ4_NL", 32, 18),
            21 => ("IQ3_S", 256, 110),
            22 => ("IQ2_S", 256, 82),
            23 => ("IQ4_XS", 256, 136),
            24 => ("I8", 1, 1),
            25 => ("I16", 1, 2),
            26 => ("I32", 1, 4),
            27 => ("I64", 1, 8),
            28 => ("F64", 1, 8),
            29 => ("IQ1_M", 256, 56),
            30 => ("BF16", 1, 2),
            34 => ("TQ1_0", 256, 54),
            35 => ("TQ2_0", 256, 66),
            39 => ("MXFP4", 32, 17),
            _ => return None,
        })
    }

    /// The ggml name (`Q4_K`, `IQ2_XXS`, ...), or `type N` for an id ggml does not define.
    pub fn name(self) -> String {
        match self.info() {
            Some((name, _, _)) => name.to_string(),
            None => format!("type {}", self.0),
        }
    }

    /// `(elements, bytes)` of one block, `None` for an unknown id.
    pub fn block(self) -> Option<(usize, usize)> {
        self.info().map(|(_, e, b)| (e, b))
    }

    /// Whether [`dequantize`] decodes this type.
    pub fn is_supported(self) -> bool {
        Self::SUPPORTED.contains(&self)
    }

    /// Bytes of `n` elements (`None` when `n` is not a whole number of blocks or the id is
    /// unknown, or on overflow).
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let (e, b) = self.block()?;
        if !n.is_multiple_of(e as u64) {
            return None;
        }
        (n / e as u64).checked_mul(b as u64)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// Blocks per rayon task.
const TASK_BLOCKS: usize = 512;

/// Decode `src` (whole blocks of `ty`) into `out`, in parallel. Errors (as text for the
/// caller to wrap with the tensor's name) when the type is unsupported or the sizes do
/// not match.
pub fn dequantize(ty: GgmlType, src: &[u8], out: &mut [f32]) -> Result<(), String> {
    let decode: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::F32 => f32_block,
        GgmlType::F16 => f16_block,
        GgmlType::BF16 => bf16_block,
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q4_0 => q4_0,
        GgmlType::Q4_1 => q4_1,
        GgmlType::Q5_0 => q5_0,
        GgmlType::Q5_1 => q5_1,
        GgmlType::Q4_K => q4_k,
        GgmlType::Q5_K => q5_k,
        GgmlType::Q6_K => q6_k,
        other => {
            return Err(format!(
                "has GGML type {other}, which encore does not dequantize (supported: {})",
                GgmlType::SUPPORTED.map(GgmlType::name).join(", ")
            ))
        }
    };
    let (elems, bytes) = ty.block().ok_or("unknown type")?;
    if !out.len().is_multiple_of(elems) || src.len() != out.len() / elems * bytes {
        return Err(format!(
            "{} bytes of {ty} do not hold {} elements",
            src.len(),
            out.len()
        ));
    }
    // Float types have one-element "blocks": hand each task many of them at once.
    let (task_elems, task_bytes) = if elems == 1 {
        (TASK_BLOCKS * 64, TASK_BLOCKS * 64 * bytes)
    } else {
        (TASK_BLOCKS * elems, TASK_BLOCKS * bytes)
    };
    out.par_chunks_mut(task_elems)
        .zip(src.par_chunks(task_bytes))
        .for_each(|(out, src)| {
            if elems == 1 {
                decode(src, out);
            } else {
                for (o, s) in out.chunks_exact_mut(elems).zip(src.chunks_exact(bytes)) {
                    decode(s, o);
                }
            }
        });
    Ok(())
}

fn half(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

// The decoders take exactly one block (or, for the float types, a run of elements);
// `dequantize` guarantees the lengths, so the fixed indices below stay in bounds.

fn f32_block(src: &[u8], out: &mut [f32]) {
    for (o, s) in out.iter_mut().zip(src.chunks_exact(4)) {
        *o = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    }
}

fn f16_block(src: &[u8], out: &mut [f32]) {
    for (o, s) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = f16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32();
    }
}

fn bf16_block(src: &[u8], out: &mut [f32]) {
    for (o, s) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = bf16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32();
    }
}

/// Q8_0: f16 scale `d`, 32 signed bytes; `x = d * q`.
fn q8_0(b: &[u8], out: &mut [f32]) {
    let d = half(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..34]) {
        *o = d * (q as i8) as f32;
    }
}

/// Q4_0: f16 `d`, 16 bytes of nibbles; low nibbles are elements 0..16, high 16..32;
/// `x = d * (q - 8)`.
fn q4_0(b: &[u8], out: &mut [f32]) {
    let d = half(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        out[j] = d * ((q & 0xF) as i32 - 8) as f32;
        out[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
    }
}

/// Q4_1: f16 `d`, f16 `m`, nibbles as Q4_0; `x = d * q + m`.
fn q4_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (half(b, 0), half(b, 2));
    for (j, &q) in b[4..20].iter().enumerate() {
        out[j] = d * (q & 0xF) as f32 + m;
        out[j + 16] = d * (q >> 4) as f32 + m;
    }
}

/// Q5_0: f16 `d`, 32 high bits (element `k`'s fifth bit is bit `k` of a little-endian
/// u32), nibbles as Q4_0; `x = d * (q - 16)`.
fn q5_0(b: &[u8], out: &mut [f32]) {
    let d = half(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for (j, &q) in b[6..22].iter().enumerate() {
        let lo = (q & 0xF) as u32 | ((qh >> j) & 1) << 4;
        let hi = (q >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
        out[j] = d * (lo as i32 - 16) as f32;
        out[j + 16] = d * (hi as i32 - 16) as f32;
    }
}

/// Q5_1: f16 `d`, f16 `m`, high bits and nibbles as Q5_0; `x = d * q + m`.
fn q5_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (half(b, 0), half(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    for (j, &q) in b[8..24].iter().enumerate() {
        let lo = (q & 0xF) as u32 | ((qh >> j) & 1) << 4;
        let hi = (q >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
        out[j] = d * lo as f32 + m;
        out[j + 16] = d * hi as f32 + m;
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K/Q5_K block, packed in 12
/// bytes: sub-blocks 0..4 in the low 6 bits of bytes `j` and `j + 4`; sub-blocks 4..8 take
/// their low 4 bits from the nibbles of byte `j + 4` and their top 2 bits from the top
/// bits of bytes `j - 4` (scale) and `j` (min).
fn scale_min_k4(j: usize, s: &[u8]) -> (f32, f32) {
    let (sc, m) = if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    };
    (sc as f32, m as f32)
}

/// Q4_K: 256 values in 8 sub-blocks of 32: f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales
/// and mins, 128 bytes of nibbles (each 32 bytes hold two sub-blocks: low nibbles, then
/// high); `x = (d * sc) * q - dmin * m`.
fn q4_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let scales = &b[4..16];
    let qs = &b[16..144];
    for (pair, (out, q)) in out
        .chunks_exact_mut(64)
        .zip(qs.chunks_exact(32))
        .enumerate()
    {
        let (sc0, m0) = scale_min_k4(2 * pair, scales);
        let (sc1, m1) = scale_min_k4(2 * pair + 1, scales);
        let (d0, dm0, d1, dm1) = (d * sc0, dmin * m0, d * sc1, dmin * m1);
        for (l, &q) in q.iter().enumerate() {
            out[l] = d0 * (q & 0xF) as f32 - dm0;
            out[l + 32] = d1 * (q >> 4) as f32 - dm1;
        }
    }
}

/// Q5_K: as Q4_K with 32 bytes of high bits after the scales (bit `g` of byte `l` is the
/// fifth bit of element `l` of sub-block `g`).
fn q5_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for (pair, (out, q)) in out
        .chunks_exact_mut(64)
        .zip(qs.chunks_exact(32))
        .enumerate()
    {
        let (sc0, m0) = scale_min_k4(2 * pair, scales);
        let (sc1, m1) = scale_min_k4(2 * pair + 1, scales);
        let (d0, dm0, d1, dm1) = (d * sc0, dmin * m0, d * sc1, dmin * m1);
        for (l, (&q, &h)) in q.iter().zip(qh).enumerate() {
            let lo = (q & 0xF) | ((h >> (2 * pair)) & 1) << 4;
            let hi = (q >> 4) | ((h >> (2 * pair + 1)) & 1) << 4;
            out[l] = d0 * lo as f32 - dm0;
            out[l + 32] = d1 * hi as f32 - dm1;
        }
    }
}

/// Q6_K: 256 values in 16 sub-blocks of 16: 128 bytes of low nibbles, 64 bytes of high
/// 2-bit pairs, 16 signed 8-bit scales, f16 `d`; `x = (d * sc) * (q - 32)`. Each half of
/// 128 values uses 64 low bytes `ql` and 32 high bytes `qh`: values `l`, `l + 32`,
/// `l + 64`, `l + 96` (l < 32) are the low nibbles of `ql[l]`, `ql[l + 32]`, then the
/// high nibbles of both, with bits 0-1, 2-3, 4-5, 6-7 of `qh[l]` on top.
fn q6_k(b: &[u8], out: &mut [f32]) {
    let d = half(b, 208);
    let scales = &b[192..208];
    for (h, out) in out.chunks_exact_mut(128).enumerate() {
        let ql = &b[64 * h..64 * h + 64];
        let qh = &b[128 + 32 * h..128 + 32 * h + 32];
        let sc = &scales[8 * h..8 * h + 8];
        for l in 0..32 {
            let q = |low: u8, shift: u32| (low | ((qh[l] >> shift) & 3) << 4) as i32 - 32;
            let q1 = q(ql[l] & 0xF, 0);
            let q2 = q(ql[l + 32] & 0xF, 2);
            let q3 = q(ql[l] >> 4, 4);
            let q4 = q(ql[l + 32] >> 4, 6);
            let s = |k: usize| d * (sc[l / 16 + k] as i8) as f32;
            out[l] = s(0) * q1 as f32;
            out[l + 32] = s(2) * q2 as f32;
            out[l + 64] = s(4) * q3 as f32;
            out[l + 96] = s(6) * q4 as f32;
        }
    }
}

/// f32 values to Q8_0 blocks (panics unless `values.len()` is a multiple of 32): `d = max|x| / 127`,
/// `q = round(x / d)` (ties away from zero), as ggml's reference quantizer.
pub fn quantize_q8_0(values: &[f32]) -> Vec<u8> {
    assert!(
        values.len().is_multiple_of(32),
        "quantize_q8_0: {} values are not whole blocks of 32",
        values.len()
    );
    let mut out = Vec::with_capacity(values.len() / 32 * 34);
    for block in values.chunks(32) {
        let amax = block.iter().fold(0f32, |a, x| a.max(x.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f16::from_f32(d).to_le_bytes());
        out.extend(block.iter().map(|&x| (x * id).round() as i8 as u8));
    }
    out
}

/// f32 values to Q4_0 blocks: `d = x_max / -8` with `x_max` the value of largest
/// magnitude, `q = min(15, trunc(x / d + 8.5))`, as ggml's reference quantizer.
pub fn quantize_q4_0(values: &[f32]) -> Vec<u8> {
    assert!(
        values.len().is_multiple_of(32),
        "quantize_q4_0: {} values are not whole blocks of 32",
        values.len()
    );
    let mut out = Vec::with_capacity(values.len() / 32 * 18);
    for block in values.chunks(32) {
        let max = block
            .iter()
            .fold(0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f16::from_f32(d).to_le_bytes());
        let q = |x: f32| ((x * id + 8.5) as i32).clamp(0, 15) as u8;
        out.extend((0..16).map(|j| q(block[j]) | q(block[j + 16]) << 4));
    }
    out
}

/// f32 values to Q4_1 blocks: `d = (max - min) / 15`, `m = min`,
/// `q = min(15, trunc((x - min) / d + 0.5))`, as ggml's reference quantizer.
pub fn quantize_q4_1(values: &[f32]) -> Vec<u8> {
    assert!(
        values.len().is_multiple_of(32),
        "quantize_q4_1: {} values are not whole blocks of 32",
        values.len()
    );
    let mut out = Vec::with_capacity(values.len() / 32 * 20);
    for block in values.chunks(32) {
        let min = block.iter().fold(f32::INFINITY, |a, &x| a.min(x));
        let max = block.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f16::from_f32(d).to_le_bytes());
        out.extend(f16::from_f32(min).to_le_bytes());
        let q = |x: f32| (((x - min) * id + 0.5) as i32).clamp(0, 15) as u8;
        out.extend((0..16).map(|j| q(block[j]) | q(block[j + 16]) << 4));
    }
    out
}
