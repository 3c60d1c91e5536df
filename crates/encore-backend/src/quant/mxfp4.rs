//! OCP MXFP4 ([`QuantFormat::Mxfp4`]): blocks of 32 FP4 E2M1 values sharing one E8M0 scale.
//!
//! The block is llama.cpp's `block_mxfp4` (GGML type 39, `ggml-common.h`): `uint8 e;
//! uint8 qs[16]`, value `j` in the low nibble of `qs[j]` and value `j + 16` in its high
//! nibble. The device row is quant.rs's layout like every format's: the blocks' 16 nibble
//! bytes, then their scale bytes (one a block), padded to 16 bytes.
//!
//! A code `q` (bit 3 the sign, bits 0..2 the magnitude) is E2M1: ±{0, 0.5, 1, 1.5, 2, 3, 4,
//! 6} ([`FP4_VALUES`], transformers' table), and the value is `2^(e - 127) * fp4(q)`.
//! [`decode`] computes it as llama.cpp's `dequantize_row_mxfp4` does, `kvalues_mxfp4[q] *
//! 2^(e - 128)` with the doubled integer table (so `e = 255` times 0.5 stays finite, 2^127,
//! as transformers' `ldexp` gives it; `e` = 0 and 1 are the subnormal 2^-128 and 2^-127):
//! every value is exact in f32, and equal to transformers' `convert_moe_packed_tensors`.
//!
//! transformers' checkpoints (`*_blocks` `[..., G, 16]` uint8, `*_scales` `[..., G]`
//! uint8) pack value `2i` in the low nibble of byte `i` and `2i + 1` in its high nibble
//! (`convert_moe_packed_tensors`: `sub[:, 0::2] = lut[blk & 0x0F]`, `sub[:, 1::2] =
//! lut[blk >> 4]`); [`hf_row`] repacks one row into the device layout.

use super::QuantFormat;

/// The E2M1 values of the 16 codes (transformers' `FP4_VALUES`).
pub const FP4_VALUES: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Twice the E2M1 values (llama.cpp's `kvalues_mxfp4`).
const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `2^(e - 128)`, half the block scale (llama.cpp's `ggml_e8m0_to_fp32_half`: `e` = 0, 1
/// are the subnormals 2^-128, 2^-127).
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// Decode one `block_mxfp4` (17 bytes: `e`, then `qs`) into 32 values.
pub(super) fn decode(b: &[u8], out: &mut [f32]) {
    let d = e8m0_half(b[0]);
    for (j, &q) in b[1..17].iter().enumerate() {
        out[j] = KVALUES[(q & 0xF) as usize] as f32 * d;
        out[j + 16] = KVALUES[(q >> 4) as usize] as f32 * d;
    }
}

/// The scale byte llama.cpp's `quantize_row_mxfp4_ref` (and the OCP MX spec) gives a block
/// of largest magnitude `amax`: `floor(log2(amax)) - 2 + 127` (the largest E2M1 exponent is
/// 2), 0 for an all-zero block; clamped to 0..=254 (a block past 2^127 saturates, one
/// below 2^-125 takes the smallest scale).
pub fn scale_for(amax: f32) -> u8 {
    // Zero, negative or NaN: the smallest scale.
    if amax.is_nan() || amax <= 0.0 {
        return 0;
    }
    let amax = amax.min(f32::MAX);
    (amax.log2().floor() - 2.0 + 127.0).clamp(0.0, 254.0) as u8
}

/// The code nearest to `x` at half-scale `d`, as llama.cpp's `best_index_mxfp4`: a scan of
/// the 16 codes by `|kvalues[i] * d - x|`, the first smallest error winning (so a tie goes
/// to the smaller magnitude, and 0 to +0).
fn best_code(x: f32, d: f32) -> u8 {
    let mut best = 0u8;
    let mut best_err = (KVALUES[0] as f32 * d - x).abs();
    for (i, &k) in KVALUES.iter().enumerate().skip(1) {
        let err = (k as f32 * d - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

/// Quantize 32 values into one `block_mxfp4` appended to `out`, as llama.cpp's
/// `quantize_row_mxfp4_ref`: [`scale_for`] the block's largest magnitude, then each value
/// to the nearest code (values past `6 * 2^(e - 127)`, up to a third of the block's
/// largest, clip to ±6).
pub(super) fn quantize_block(block: &[f32], out: &mut Vec<u8>) {
    let amax = block.iter().fold(0f32, |a, x| a.max(x.abs()));
    let e = scale_for(amax);
    let d = e8m0_half(e);
    out.push(e);
    out.extend((0..16).map(|j| best_code(block[j], d) | best_code(block[j + 16], d) << 4));
}

/// One row of a transformers MXFP4 tensor (`blocks`: `G` groups of 16 bytes, `scales`: `G`
/// E8M0 bytes) as a device row of `32 G` values (`out`: [`QuantFormat::row_bytes`] long,
/// padding zeroed): each group's nibbles reordered from transformers' (value `2i` low and
/// `2i + 1` high in byte `i`) to `block_mxfp4`'s (value `j` low and `j + 16` high in byte
/// `j`), the scale bytes as they are.
pub fn hf_row(blocks: &[u8], scales: &[u8], out: &mut [u8]) {
    let g = scales.len();
    debug_assert_eq!(blocks.len(), 16 * g);
    debug_assert_eq!(Some(out.len()), QuantFormat::Mxfp4.row_bytes(32 * g));
    let (quants, rest) = out.split_at_mut(16 * g);
    for (src, dst) in blocks.chunks_exact(16).zip(quants.chunks_exact_mut(16)) {
        let code = |v: usize| (src[v >> 1] >> (4 * (v & 1))) & 0xF;
        for (j, o) in dst.iter_mut().enumerate() {
            *o = code(j) | code(j + 16) << 4;
        }
    }
    rest[..g].copy_from_slice(scales);
    rest[g..].fill(0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize_row, quantize_blocks, quantize_rows};

    #[test]
    fn codes_decode_to_the_e2m1_values_times_the_scale() {
        for e in [0u8, 1, 2, 100, 127, 128, 200, 254, 255] {
            let scale = 2f64.powi(e as i32 - 127);
            for q in 0..16u8 {
                let mut block = [0u8; 17];
                block[0] = e;
                block[1] = q | (15 - q) << 4;
                let mut out = [0f32; 32];
                decode(&block, &mut out);
                let want = |c: u8| (FP4_VALUES[c as usize] as f64 * scale) as f32;
                // Equal values (code 8, -0, decodes to +0 as llama.cpp's does).
                assert_eq!(out[0], want(q), "e {e} q {q}");
                assert_eq!(out[16], want(15 - q), "e {e} q {}", 15 - q);
                assert!(out[1..16].iter().all(|&v| v == 0.0));
            }
        }
    }

    #[test]
    fn grid_values_round_trip_exactly() {
        // Each block holds every code at its scale (the largest magnitude, 6, sets e).
        for e in [3u8, 100, 127, 140, 250] {
            let s = 2f32.powi(e as i32 - 127);
            let values: Vec<f32> = (0..32).map(|i| FP4_VALUES[i % 16] * s).collect();
            let mut blocks = Vec::new();
            quantize_blocks(QuantFormat::Mxfp4, &values, &mut blocks);
            // A block holding ±6 s: floor(log2(6 s)) - 2 = log2(s) exactly.
            assert_eq!(blocks[0], e);
            let mut back = [0f32; 32];
            decode(&blocks, &mut back);
            for (a, b) in values.iter().zip(&back) {
                assert_eq!(a.abs(), b.abs(), "e {e}");
            }
        }
    }

    #[test]
    fn quantization_picks_the_nearest_value_and_clips_above_the_grid() {
        let fmt = QuantFormat::Mxfp4;
        let mut s = 0x9E37_79B9u32;
        let x: Vec<f32> = (0..32 * 64)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                // Blocks of magnitudes from 2^-20 to 2^20.
                let mag = 2f32.powi((i / 32) % 41 - 20);
                (s as f32 / u32::MAX as f32 - 0.5) * 2.0 * mag
            })
            .collect();
        let mut dev = vec![0u8; fmt.bytes(64, 32).unwrap()];
        quantize_rows(fmt, &x, 32, &mut dev);
        let rb = fmt.row_bytes(32).unwrap();
        assert_eq!(rb, 32);
        for (r, (row, block)) in dev.chunks_exact(rb).zip(x.chunks_exact(32)).enumerate() {
            let mut y = [0f32; 32];
            dequantize_row(fmt, row, &mut y);
            let e = row[16];
            let s = 2f32.powi(e as i32 - 127);
            let grid: Vec<f32> = FP4_VALUES.iter().map(|v| v * s).collect();
            for (&a, &b) in block.iter().zip(&y) {
                let nearest = grid
                    .iter()
                    .fold(f32::INFINITY, |m, &g| m.min((g - a).abs()));
                assert_eq!((b - a).abs(), nearest, "row {r}: {a} -> {b}");
                // On the grid's range the error is at most half its widest step (2 s).
                if a.abs() <= 6.0 * s {
                    assert!((b - a).abs() <= s, "row {r}: {a} -> {b}");
                }
            }
            // The block's largest magnitude sets e: it lies in [4 s, 8 s).
            let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(
                amax >= 4.0 * s && amax < 8.0 * s,
                "row {r}: amax {amax}, e {e}"
            );
        }
        // An all-zero block: scale byte 0, every code +0.
        let mut z = Vec::new();
        quantize_blocks(fmt, &[0.0; 32], &mut z);
        assert_eq!(z, [0u8; 17]);
    }

    #[test]
    fn scales_saturate_at_both_ends() {
        assert_eq!(scale_for(0.0), 0);
        assert_eq!(scale_for(f32::NAN), 0);
        assert_eq!(scale_for(1e-40), 0);
        assert_eq!(scale_for(6.0), 127);
        assert_eq!(scale_for(4.0), 127);
        assert_eq!(scale_for(3.999), 126);
        // log2 of f32::MAX rounds to 128 in f32 (as llama.cpp's log2f does).
        assert_eq!(scale_for(f32::MAX), 253);
        assert_eq!(scale_for(f32::INFINITY), 253);
        assert_eq!(e8m0_half(0).to_bits(), 0x0020_0000);
        assert_eq!(e8m0_half(1).to_bits(), 0x0040_0000);
        assert_eq!(e8m0_half(128), 1.0);
        assert_eq!(e8m0_half(255), 2f32.powi(127));
    }

    #[test]
    fn a_transformers_row_repacks_its_nibbles() {
        // Group 0: byte i holds codes 2i (low) and 2i + 1 (high) = i % 8 and 7 - i % 8.
        let blocks: Vec<u8> = (0..32u8).map(|i| (i % 8) | (7 - i % 8) << 4).collect();
        let scales = [127u8, 130];
        let mut row = vec![0xAAu8; QuantFormat::Mxfp4.row_bytes(64).unwrap()];
        hf_row(&blocks, &scales, &mut row);
        let mut y = vec![0f32; 64];
        dequantize_row(QuantFormat::Mxfp4, &row, &mut y);
        for g in 0..2 {
            let s = 2f32.powi(scales[g] as i32 - 127);
            for v in 0..32 {
                let byte = blocks[16 * g + v / 2];
                let code = if v % 2 == 0 { byte & 0xF } else { byte >> 4 };
                assert_eq!(
                    y[32 * g + v],
                    FP4_VALUES[code as usize] * s,
                    "group {g} value {v}"
                );
            }
        }
        assert_eq!(&row[32..34], &scales);
        assert!(row[34..].iter().all(|&b| b == 0));
    }
}
