//! Quantized weight formats: what a quantized tensor's bytes are on the device, how they
//! decode (the reference the kernels are checked against) and how f32 values quantize.
//!
//! # The device layout
//! A quantized tensor is a matrix `[n, k]` quantized along k in blocks of
//! [`QuantFormat::block_elems`] values. Every format is a ggml block format (FP8 is one
//! too, see [`QuantFormat::F8E4M3`]), and each ggml block is cut in two: its *quant
//! bytes* (the packed values, a multiple of 16 bytes) and its *scale bytes* (scales,
//! mins, the high bits of the 5-bit formats), each in ggml's byte order. A row of
//! `nb = k / block_elems` blocks is stored as
//!
//! ```text
//! [quants of block 0][quants of block 1]...[quants of block nb-1][scales of block 0]...[scales of block nb-1][pad to 16]
//! ```
//!
//! and rows follow each other at [`QuantFormat::row_bytes`]. So every row and every
//! block's quant bytes start 16-byte aligned (a kernel streams them with 16-byte loads, a
//! lane's loads of a warp coalesce), rows stay independent (a tensor narrows by rows, and
//! q/k/v rows of a merged tensor are written part by part), and the tensor takes the ggml
//! file's bytes plus at most 15 bytes a row. [`pack_row`] and [`unpack_block`] convert
//! between this layout and ggml's blocks.
//!
//! # Values
//! [`decode_block`] decodes one ggml block exactly as ggml's reference dequantizer (same
//! f32 operations in the same order), so a tensor decodes bit-identically to the f32
//! values llama.cpp and gguf-py produce. The quantizers ([`quantize_blocks`]) are simple
//! round-to-nearest schemes (one pass, no search for the best scales as ggml's `Q*_K`
//! quantizers do): good enough for in-situ quantization and for tests, which compare a
//! quantized model with its own decoded weights.

use half::f16;

pub mod marlin;
pub mod mxfp4;

/// A block-quantized weight format (see the module docs for the device layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// 32 values: f16 `d`, 32 signed bytes; `x = d * q`.
    Q8_0,
    /// 32 values: f16 `d`, 16 bytes of nibbles; `x = d * (q - 8)`.
    Q4_0,
    /// 32 values: f16 `d`, f16 `m`, 16 bytes of nibbles; `x = d * q + m`.
    Q4_1,
    /// 32 values: f16 `d`, 32 fifth bits, nibbles; `x = d * (q - 16)`.
    Q5_0,
    /// 32 values: f16 `d`, f16 `m`, 32 fifth bits, nibbles; `x = d * q + m`.
    Q5_1,
    /// 256 values in 8 sub-blocks of 32 with 6-bit scales and mins.
    Q4K,
    /// 256 values: Q4_K with a fifth bit per value.
    Q5K,
    /// 256 values in 16 sub-blocks of 16 with 8-bit scales, 6-bit values.
    Q6K,
    /// 128 values: FP8 E4M3 bytes and one f32 scale; `x = scale * fp8`. HF's FP8
    /// checkpoints (per-tensor scales, or 128x128 blocks of `weight_scale_inv`) load into
    /// it with each row's block scale repeated per 128 columns.
    F8E4M3,
    /// 32 values: an E8M0 scale byte `e`, 16 bytes of FP4 E2M1 nibbles (value j in the low
    /// nibble of byte j, j + 16 in the high one: llama.cpp's `block_mxfp4`, GGML type 39);
    /// `x = 2^(e - 127) * fp4(q)`. OCP MXFP4, gpt-oss's experts ([`mxfp4`]).
    Mxfp4,
}

impl QuantFormat {
    pub const ALL: [QuantFormat; 10] = [
        QuantFormat::Q8_0,
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q5_0,
        QuantFormat::Q5_1,
        QuantFormat::Q4K,
        QuantFormat::Q5K,
        QuantFormat::Q6K,
        QuantFormat::F8E4M3,
        QuantFormat::Mxfp4,
    ];

    /// The lowercase name (`q8_0`, `q4_k`, `fp8`), also the kernel-symbol suffix.
    pub const fn name(self) -> &'static str {
        match self {
            QuantFormat::Q8_0 => "q8_0",
            QuantFormat::Q4_0 => "q4_0",
            QuantFormat::Q4_1 => "q4_1",
            QuantFormat::Q5_0 => "q5_0",
            QuantFormat::Q5_1 => "q5_1",
            QuantFormat::Q4K => "q4_k",
            QuantFormat::Q5K => "q5_k",
            QuantFormat::Q6K => "q6_k",
            QuantFormat::F8E4M3 => "fp8",
            QuantFormat::Mxfp4 => "mxfp4",
        }
    }

    /// Parse a name as [`Self::name`] writes it (any case; `f8_e4m3` too).
    pub fn parse(s: &str) -> Option<QuantFormat> {
        let s = s.to_ascii_lowercase();
        if s == "f8_e4m3" || s == "f8e4m3" {
            return Some(QuantFormat::F8E4M3);
        }
        Self::ALL.into_iter().find(|f| f.name() == s)
    }

    /// Values per block.
    pub const fn block_elems(self) -> usize {
        match self {
            QuantFormat::Q4K | QuantFormat::Q5K | QuantFormat::Q6K => 256,
            QuantFormat::F8E4M3 => 128,
            _ => 32,
        }
    }

    /// The packed values of one block (a multiple of 16).
    pub const fn quant_bytes(self) -> usize {
        match self {
            QuantFormat::Q8_0 => 32,
            QuantFormat::Q4_0
            | QuantFormat::Q4_1
            | QuantFormat::Q5_0
            | QuantFormat::Q5_1
            | QuantFormat::Mxfp4 => 16,
            QuantFormat::Q4K | QuantFormat::F8E4M3 => 128,
            QuantFormat::Q5K => 160,
            QuantFormat::Q6K => 192,
        }
    }

    /// The scale bytes of one block.
    pub const fn scale_bytes(self) -> usize {
        match self {
            QuantFormat::Mxfp4 => 1,
            QuantFormat::Q8_0 | QuantFormat::Q4_0 => 2,
            QuantFormat::Q4_1 | QuantFormat::F8E4M3 => 4,
            QuantFormat::Q5_0 => 6,
            QuantFormat::Q5_1 => 8,
            QuantFormat::Q4K | QuantFormat::Q5K => 16,
            QuantFormat::Q6K => 18,
        }
    }

    /// Bytes of one ggml block.
    pub const fn block_bytes(self) -> usize {
        self.quant_bytes() + self.scale_bytes()
    }

    /// Whether a ggml block starts with its scale bytes (all but Q6_K, whose scales and
    /// `d` follow its values).
    const fn scales_first(self) -> bool {
        !matches!(self, QuantFormat::Q6K)
    }

    /// Bytes of one device row of `k` values, or `None` when `k` is not a whole number of
    /// blocks (the caller's error names the tensor) or on overflow.
    pub fn row_bytes(self, k: usize) -> Option<usize> {
        if k == 0 || !k.is_multiple_of(self.block_elems()) {
            return None;
        }
        (k / self.block_elems())
            .checked_mul(self.block_bytes())?
            .checked_next_multiple_of(16)
    }

    /// Device bytes of an `[n, k]` tensor (`None` as [`Self::row_bytes`]).
    pub fn bytes(self, n: usize, k: usize) -> Option<usize> {
        n.checked_mul(self.row_bytes(k)?)
    }

    /// Bits per weight on the device (padding aside).
    pub fn bits_per_weight(self) -> f64 {
        (self.block_bytes() * 8) as f64 / self.block_elems() as f64
    }
}

impl std::fmt::Display for QuantFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// Lay out one row of ggml blocks (`blocks`, `k / block_elems` of them) as a device row
/// (`out`, [`QuantFormat::row_bytes`] long; the padding is zeroed).
pub fn pack_row(fmt: QuantFormat, blocks: &[u8], out: &mut [u8]) {
    let (q, s, bb) = (fmt.quant_bytes(), fmt.scale_bytes(), fmt.block_bytes());
    let nb = blocks.len() / bb;
    debug_assert_eq!(blocks.len(), nb * bb);
    let (quants, rest) = out.split_at_mut(nb * q);
    let (scales, pad) = rest.split_at_mut(nb * s);
    for (b, block) in blocks.chunks_exact(bb).enumerate() {
        let (sb, qb) = if fmt.scales_first() {
            (&block[..s], &block[s..])
        } else {
            (&block[q..], &block[..q])
        };
        quants[b * q..(b + 1) * q].copy_from_slice(qb);
        scales[b * s..(b + 1) * s].copy_from_slice(sb);
    }
    pad.fill(0);
}

/// Reassemble ggml block `b` of a device row of `nb` blocks into `out`
/// ([`QuantFormat::block_bytes`] long).
pub fn unpack_block(fmt: QuantFormat, row: &[u8], nb: usize, b: usize, out: &mut [u8]) {
    let (q, s) = (fmt.quant_bytes(), fmt.scale_bytes());
    let qb = &row[b * q..(b + 1) * q];
    let sb = &row[nb * q + b * s..nb * q + (b + 1) * s];
    if fmt.scales_first() {
        out[..s].copy_from_slice(sb);
        out[s..s + q].copy_from_slice(qb);
    } else {
        out[..q].copy_from_slice(qb);
        out[q..q + s].copy_from_slice(sb);
    }
}

/// Decode one device row of `out.len()` values.
pub fn dequantize_row(fmt: QuantFormat, row: &[u8], out: &mut [f32]) {
    let be = fmt.block_elems();
    let nb = out.len() / be;
    let mut block = [0u8; 210];
    let block = &mut block[..fmt.block_bytes()];
    for (b, o) in out.chunks_exact_mut(be).enumerate() {
        unpack_block(fmt, row, nb, b, block);
        decode_block(fmt, block, o);
    }
}

/// Quantize f32 rows of `k` values (`values.len()` a multiple of `k`, `k` a whole number
/// of blocks) into device rows. FP8 takes one scale a row (the row's amax / 448, repeated
/// in each block: the per-channel scaling of vLLM's and TensorRT-LLM's FP8, which Hopper's
/// row-wise FP8 GEMM runs ~1.4x faster than 128-value blocks); the other formats quantize
/// block by block.
pub fn quantize_rows(fmt: QuantFormat, values: &[f32], k: usize, out: &mut [u8]) {
    quantize_rows_as(fmt, values, k, out, fmt == QuantFormat::F8E4M3);
}

/// [`quantize_rows`] with every block scaled alone (FP8: one scale per 128 values, as the
/// block-scaled checkpoints and the FP8 GEMM's 128-value activations; the other formats
/// as [`quantize_rows`]).
pub fn quantize_rows_by_block(fmt: QuantFormat, values: &[f32], k: usize, out: &mut [u8]) {
    quantize_rows_as(fmt, values, k, out, false);
}

/// Device rows of `values`; `row_scale`: FP8 with one scale a row (the row's amax / 448).
fn quantize_rows_as(fmt: QuantFormat, values: &[f32], k: usize, out: &mut [u8], row_scale: bool) {
    let rb = fmt.row_bytes(k).expect("k is a whole number of blocks");
    let mut blocks = Vec::with_capacity(k / fmt.block_elems() * fmt.block_bytes());
    for (row, o) in values.chunks_exact(k).zip(out.chunks_exact_mut(rb)) {
        blocks.clear();
        if row_scale {
            let amax = row.iter().fold(0f32, |a, x| a.max(x.abs()));
            fp8_blocks(row, amax / E4M3_MAX, &mut blocks);
        } else {
            quantize_blocks(fmt, row, &mut blocks);
        }
        pack_row(fmt, &blocks, o);
    }
}

/// Whether every device row of `bytes` (rows of `k` values in `fmt`) has one scale in all
/// its blocks: FP8 rows quantized by [`quantize_rows`] or from a per-tensor or per-channel
/// checkpoint (the row-wise FP8 GEMM's condition, [`crate::Tensor::with_row_scale`]).
/// False for every other format, and for an empty tensor.
pub fn rows_share_one_scale(fmt: QuantFormat, k: usize, bytes: &[u8]) -> bool {
    if fmt != QuantFormat::F8E4M3 || bytes.is_empty() {
        return false;
    }
    let Some(rb) = fmt.row_bytes(k) else {
        return false;
    };
    let (q, nb) = (fmt.quant_bytes(), k / fmt.block_elems());
    bytes.len().is_multiple_of(rb)
        && bytes.chunks_exact(rb).all(|row| {
            let scales = &row[nb * q..nb * q + nb * 4];
            scales.chunks_exact(4).all(|s| s == &scales[..4])
        })
}

/// FP8 blocks of `values` (whole blocks of 128) at one `scale`: the scale's bytes, then
/// each value / scale rounded to E4M3 (a zero scale gives zeros).
fn fp8_blocks(values: &[f32], scale: f32, out: &mut Vec<u8>) {
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    for block in values.chunks_exact(QuantFormat::F8E4M3.block_elems()) {
        out.extend(scale.to_le_bytes());
        out.extend(block.iter().map(|&x| f32_to_e4m3(x * inv)));
    }
}

fn half_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Decode one ggml block of `fmt` (exactly [`QuantFormat::block_bytes`] bytes) into
/// [`QuantFormat::block_elems`] values, as ggml's reference dequantizer does.
pub fn decode_block(fmt: QuantFormat, b: &[u8], out: &mut [f32]) {
    match fmt {
        QuantFormat::Q8_0 => {
            let d = half_at(b, 0);
            for (o, &q) in out.iter_mut().zip(&b[2..34]) {
                *o = d * (q as i8) as f32;
            }
        }
        QuantFormat::Q4_0 => {
            let d = half_at(b, 0);
            for (j, &q) in b[2..18].iter().enumerate() {
                out[j] = d * ((q & 0xF) as i32 - 8) as f32;
                out[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
            }
        }
        QuantFormat::Q4_1 => {
            let (d, m) = (half_at(b, 0), half_at(b, 2));
            for (j, &q) in b[4..20].iter().enumerate() {
                out[j] = d * (q & 0xF) as f32 + m;
                out[j + 16] = d * (q >> 4) as f32 + m;
            }
        }
        QuantFormat::Q5_0 => {
            // Element k's fifth bit is bit k of a little-endian u32.
            let d = half_at(b, 0);
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            for (j, &q) in b[6..22].iter().enumerate() {
                let lo = (q & 0xF) as u32 | ((qh >> j) & 1) << 4;
                let hi = (q >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
                out[j] = d * (lo as i32 - 16) as f32;
                out[j + 16] = d * (hi as i32 - 16) as f32;
            }
        }
        QuantFormat::Q5_1 => {
            let (d, m) = (half_at(b, 0), half_at(b, 2));
            let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
            for (j, &q) in b[8..24].iter().enumerate() {
                let lo = (q & 0xF) as u32 | ((qh >> j) & 1) << 4;
                let hi = (q >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
                out[j] = d * lo as f32 + m;
                out[j + 16] = d * hi as f32 + m;
            }
        }
        QuantFormat::Q4K => q4_k(b, out),
        QuantFormat::Q5K => q5_k(b, out),
        QuantFormat::Q6K => q6_k(b, out),
        QuantFormat::F8E4M3 => {
            let s = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            for (o, &q) in out.iter_mut().zip(&b[4..132]) {
                *o = s * e4m3_to_f32(q);
            }
        }
        QuantFormat::Mxfp4 => mxfp4::decode(b, out),
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

/// Q4_K: f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
/// (each 32 bytes hold two sub-blocks: low nibbles, then high); `x = (d * sc) * q - dmin * m`.
fn q4_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
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
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
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

/// Q6_K: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 signed 8-bit scales
/// (one per 16 values), f16 `d`; `x = (d * sc) * (q - 32)`. Each half of 128 values uses
/// 64 low bytes `ql` and 32 high bytes `qh`: values `l`, `l + 32`, `l + 64`, `l + 96`
/// (l < 32) are the low nibbles of `ql[l]`, `ql[l + 32]`, then the high nibbles of both,
/// with bits 0-1, 2-3, 4-5, 6-7 of `qh[l]` on top.
fn q6_k(b: &[u8], out: &mut [f32]) {
    let d = half_at(b, 208);
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

/// The value of an FP8 E4M3 byte (OCP "fn" variant: no infinities, `0x7F`/`0xFF` NaN).
pub fn e4m3_to_f32(q: u8) -> f32 {
    let sign = if q & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = ((q >> 3) & 0xF, q & 7);
    if e == 15 && m == 7 {
        return f32::NAN;
    }
    let mag = if e == 0 {
        m as f32 / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + m as f32 / 8.0) * 2f32.powi(e as i32 - 7)
    };
    sign * mag
}

/// Every E4M3 byte's value ([`e4m3_to_f32`]), for decoding in bulk (an FP8 KV cache).
pub fn e4m3_table() -> &'static [f32; 256] {
    static TABLE: std::sync::LazyLock<[f32; 256]> =
        std::sync::LazyLock::new(|| std::array::from_fn(|b| e4m3_to_f32(b as u8)));
    &TABLE
}

/// The largest finite E4M3 value.
pub const E4M3_MAX: f32 = 448.0;

/// The nearest E4M3 byte to `x` (ties to even), saturating at ±448; NaN maps to NaN.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs().min(E4M3_MAX);
    let bits = a.to_bits();
    let exp = (bits >> 23) as i32 - 127;
    let code = if exp < -6 {
        // Below 2^-6: the subnormal codes 0..=7 are multiples of 2^-9 (8 is 2^-6, the first
        // normal code), and `a * 512` is exact.
        (a * 512.0).round_ties_even() as u8
    } else {
        // Normal: the exponent (bias 7) and f32's mantissa rounded to 3 bits, ties to an
        // even code; a carry out of the mantissa moves to the next exponent, as the codes
        // are in value order. `a` <= 448 (0x7E), so the code stays finite.
        let v = (((exp + 7) as u32) << 3) | ((bits >> 20) & 7);
        let rem = bits & 0xF_FFFF;
        let up = rem > 0x8_0000 || (rem == 0x8_0000 && v & 1 == 1);
        (v + up as u32) as u8
    };
    sign | code
}

/// Quantize `values` (a whole number of blocks) into ggml blocks of `fmt`, appended to
/// `out` (round to nearest with one scale pass; see the module docs).
pub fn quantize_blocks(fmt: QuantFormat, values: &[f32], out: &mut Vec<u8>) {
    let be = fmt.block_elems();
    assert!(
        values.len().is_multiple_of(be),
        "quantize {fmt}: {} values are not whole blocks of {be}",
        values.len()
    );
    for block in values.chunks_exact(be) {
        match fmt {
            QuantFormat::Q8_0 => q8_0_block(block, out),
            QuantFormat::Q4_0 | QuantFormat::Q5_0 => sym_block(fmt, block, out),
            QuantFormat::Q4_1 | QuantFormat::Q5_1 => affine_block(fmt, block, out),
            QuantFormat::Q4K | QuantFormat::Q5K => k_affine_block(fmt, block, out),
            QuantFormat::Q6K => q6_k_block(block, out),
            QuantFormat::F8E4M3 => {
                let amax = block.iter().fold(0f32, |a, x| a.max(x.abs()));
                fp8_blocks(block, amax / E4M3_MAX, out);
            }
            QuantFormat::Mxfp4 => mxfp4::quantize_block(block, out),
        }
    }
}

/// `d = max|x| / 127`, `q = round(x / d)`, as ggml's reference Q8_0 quantizer.
fn q8_0_block(block: &[f32], out: &mut Vec<u8>) {
    let amax = block.iter().fold(0f32, |a, x| a.max(x.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend(f16::from_f32(d).to_le_bytes());
    out.extend(block.iter().map(|&x| (x * id).round() as i8 as u8));
}

/// Q4_0/Q5_0 as ggml's reference: `d = x_max / -8` (`-16`) with `x_max` the value of
/// largest magnitude, `q = min(15 (31), trunc(x / d + 8.5 (16.5)))`.
fn sym_block(fmt: QuantFormat, block: &[f32], out: &mut Vec<u8>) {
    let five = fmt == QuantFormat::Q5_0;
    let (half_range, top) = if five { (16.0, 31) } else { (8.0, 15) };
    let max = block
        .iter()
        .fold(0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
    let d = max / -half_range;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q: Vec<u32> = block
        .iter()
        .map(|&x| ((x * id + half_range + 0.5) as i32).clamp(0, top) as u32)
        .collect();
    out.extend(f16::from_f32(d).to_le_bytes());
    push_nibbles_and_fifth_bits(&q, five, out);
}

/// Q4_1/Q5_1 as ggml's reference: `d = (max - min) / 15 (31)`, `m = min`,
/// `q = min(15 (31), trunc((x - min) / d + 0.5))`.
fn affine_block(fmt: QuantFormat, block: &[f32], out: &mut Vec<u8>) {
    let five = fmt == QuantFormat::Q5_1;
    let top = if five { 31 } else { 15 };
    let min = block.iter().fold(f32::INFINITY, |a, &x| a.min(x));
    let max = block.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
    let d = (max - min) / top as f32;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q: Vec<u32> = block
        .iter()
        .map(|&x| (((x - min) * id + 0.5) as i32).clamp(0, top) as u32)
        .collect();
    out.extend(f16::from_f32(d).to_le_bytes());
    out.extend(f16::from_f32(min).to_le_bytes());
    push_nibbles_and_fifth_bits(&q, five, out);
}

/// The 32 values' fifth bits (a little-endian u32, when `five`) and nibbles (element `j`
/// low, `j + 16` high), the tail of every 32-value block.
fn push_nibbles_and_fifth_bits(q: &[u32], five: bool, out: &mut Vec<u8>) {
    if five {
        let qh = q
            .iter()
            .enumerate()
            .fold(0u32, |h, (j, &v)| h | ((v >> 4) & 1) << j);
        out.extend(qh.to_le_bytes());
    }
    out.extend((0..16).map(|j| (q[j] & 0xF) as u8 | ((q[j + 16] & 0xF) as u8) << 4));
}

/// Q4_K/Q5_K: per sub-block of 32, `scale = (max - min') / 15 (31)` and `mn = -min'` with
/// `min' = min(min, 0)`; 6-bit codes of both against the block's `d = max scale / 63` and
/// `dmin = max mn / 63`; then `q = round((x + dmin * m) / (d * sc))`.
fn k_affine_block(fmt: QuantFormat, block: &[f32], out: &mut Vec<u8>) {
    let five = fmt == QuantFormat::Q5K;
    let top = if five { 31 } else { 15 };
    let mut scale = [0f32; 8];
    let mut mn = [0f32; 8];
    for (j, sub) in block.chunks_exact(32).enumerate() {
        let lo = sub.iter().fold(0f32, |a, &x| a.min(x));
        let hi = sub.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
        scale[j] = (hi - lo) / top as f32;
        mn[j] = -lo;
    }
    let d = f16::from_f32(scale.iter().fold(0f32, |a, &x| a.max(x)) / 63.0);
    let dmin = f16::from_f32(mn.iter().fold(0f32, |a, &x| a.max(x)) / 63.0);
    let code = |v: f32, unit: f32| {
        if unit > 0.0 {
            (v / unit).round().clamp(0.0, 63.0) as u8
        } else {
            0
        }
    };
    let sc: Vec<u8> = scale.iter().map(|&s| code(s, d.to_f32())).collect();
    let m: Vec<u8> = mn.iter().map(|&x| code(x, dmin.to_f32())).collect();
    let mut packed = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            packed[j] = sc[j];
            packed[j + 4] = m[j];
        } else {
            packed[j + 4] = (sc[j] & 0xF) | (m[j] & 0xF) << 4;
            packed[j - 4] |= (sc[j] >> 4) << 6;
            packed[j] |= (m[j] >> 4) << 6;
        }
    }
    let mut q = [0u8; 256];
    for (j, sub) in block.chunks_exact(32).enumerate() {
        let unit = d.to_f32() * sc[j] as f32;
        let off = dmin.to_f32() * m[j] as f32;
        for (l, &x) in sub.iter().enumerate() {
            q[32 * j + l] = if unit > 0.0 {
                ((x + off) / unit).round().clamp(0.0, top as f32) as u8
            } else {
                0
            };
        }
    }
    out.extend(d.to_le_bytes());
    out.extend(dmin.to_le_bytes());
    out.extend(packed);
    if five {
        // Bit g of byte l is the fifth bit of element l of sub-block g.
        out.extend((0..32).map(|l| (0..8).fold(0u8, |h, g| h | ((q[32 * g + l] >> 4) & 1) << g)));
    }
    // Bytes 32p..32p+32 hold sub-block 2p (low nibbles) and 2p + 1 (high).
    for p in 0..4 {
        out.extend((0..32).map(|l| (q[64 * p + l] & 0xF) | (q[64 * p + 32 + l] & 0xF) << 4));
    }
}

/// Q6_K: per sub-block of 16, `scale = max|x| / 31`; 8-bit codes against
/// `d = max scale / 127`; `q = round(x / (d * sc)) + 32` in 0..=63.
fn q6_k_block(block: &[f32], out: &mut Vec<u8>) {
    let mut scale = [0f32; 16];
    for (j, sub) in block.chunks_exact(16).enumerate() {
        scale[j] = sub.iter().fold(0f32, |a, x| a.max(x.abs())) / 31.0;
    }
    let d = f16::from_f32(scale.iter().fold(0f32, |a, &x| a.max(x)) / 127.0);
    let sc: Vec<i8> = scale
        .iter()
        .map(|&s| {
            if d.to_f32() > 0.0 {
                (s / d.to_f32()).round().clamp(0.0, 127.0) as i8
            } else {
                0
            }
        })
        .collect();
    let mut q = [0u8; 256];
    for (i, &x) in block.iter().enumerate() {
        let unit = d.to_f32() * sc[i / 16] as f32;
        let v = if unit > 0.0 {
            (x / unit).round().clamp(-32.0, 31.0) as i32
        } else {
            0
        };
        q[i] = (v + 32) as u8;
    }
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for h in 0..2 {
        for l in 0..32 {
            let v = |k: usize| q[128 * h + 32 * k + l];
            ql[64 * h + l] = (v(0) & 0xF) | (v(2) & 0xF) << 4;
            ql[64 * h + l + 32] = (v(1) & 0xF) | (v(3) & 0xF) << 4;
            qh[32 * h + l] = (v(0) >> 4) | (v(1) >> 4) << 2 | (v(2) >> 4) << 4 | (v(3) >> 4) << 6;
        }
    }
    out.extend(ql);
    out.extend(qh);
    out.extend(sc.iter().map(|&s| s as u8));
    out.extend(d.to_le_bytes());
}

#[cfg(test)]
mod tests;
