//! quant.rs's unit tests.
use super::*;

fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32 - 0.5) * 2.0
        })
        .collect()
}

#[test]
fn fp8_rows_take_one_scale_and_blocks_their_own() {
    let fmt = QuantFormat::F8E4M3;
    let k = 3 * fmt.block_elems();
    // Block 1 of each row ten times larger than the rest.
    let x: Vec<f32> = values(2 * k, 7)
        .iter()
        .enumerate()
        .map(|(i, &v)| if (i % k) / 128 == 1 { 10.0 * v } else { v })
        .collect();
    let rb = fmt.row_bytes(k).unwrap();
    let (mut rows, mut blocks) = (vec![0u8; 2 * rb], vec![0u8; 2 * rb]);
    quantize_rows(fmt, &x, k, &mut rows);
    quantize_rows_by_block(fmt, &x, k, &mut blocks);
    assert!(rows_share_one_scale(fmt, k, &rows));
    assert!(!rows_share_one_scale(fmt, k, &blocks));
    // Each row's scale is its amax / 448.
    for (r, row) in rows.chunks_exact(rb).enumerate() {
        let amax = x[r * k..(r + 1) * k]
            .iter()
            .fold(0f32, |a, v| a.max(v.abs()));
        let s = f32::from_le_bytes(row[3 * 128..3 * 128 + 4].try_into().unwrap());
        assert_eq!(s, amax / E4M3_MAX);
    }
    // Other formats, a short or empty tensor: not row-scaled.
    let q8 = QuantFormat::Q8_0;
    let mut q = vec![0u8; q8.bytes(2, k).unwrap()];
    quantize_rows(q8, &x, k, &mut q);
    assert!(!rows_share_one_scale(q8, k, &q));
    assert!(!rows_share_one_scale(fmt, k, &[]));
    assert!(!rows_share_one_scale(fmt, k, &rows[..rb + 1]));
}

#[test]
fn every_format_round_trips_within_its_step() {
    for fmt in QuantFormat::ALL {
        let k = 2 * fmt.block_elems();
        let x = values(3 * k, fmt as u32);
        let rb = fmt.row_bytes(k).unwrap();
        assert_eq!(rb % 16, 0);
        let mut dev = vec![0xAAu8; 3 * rb];
        quantize_rows(fmt, &x, k, &mut dev);
        let mut y = vec![0f32; 3 * k];
        for (r, o) in y.chunks_exact_mut(k).enumerate() {
            dequantize_row(fmt, &dev[r * rb..(r + 1) * rb], o);
        }
        // The worst error is half a quantization step of the coarsest sub-block.
        let tol = match fmt {
            QuantFormat::Q8_0 => 0.005,
            QuantFormat::Q6K => 0.04,
            QuantFormat::Q5_0 | QuantFormat::Q5_1 | QuantFormat::Q5K => 0.05,
            QuantFormat::F8E4M3 => 0.07,
            // ggml's Q4_0 puts the largest magnitude at -8 steps: its opposite clamps
            // at +7, a whole step away.
            QuantFormat::Q4_0 => 0.13,
            // MXFP4's scale is a power of two under the block's largest magnitude (llama.cpp's
            // and the OCP spec's): values above 1.5 times it clip to it (up to a quarter here).
            QuantFormat::Mxfp4 => 0.25,
            _ => 0.1,
        };
        let worst = x
            .iter()
            .zip(&y)
            .fold(0f32, |a, (p, q)| a.max((p - q).abs()));
        assert!(worst <= tol, "{fmt}: worst error {worst}");
    }
}

#[test]
fn the_device_row_is_the_ggml_blocks_cut_in_two() {
    for fmt in QuantFormat::ALL {
        let k = 3 * fmt.block_elems();
        let mut blocks = Vec::new();
        quantize_blocks(fmt, &values(k, 7), &mut blocks);
        assert_eq!(blocks.len(), 3 * fmt.block_bytes());
        let mut row = vec![0u8; fmt.row_bytes(k).unwrap()];
        pack_row(fmt, &blocks, &mut row);
        let mut back = vec![0u8; fmt.block_bytes()];
        for b in 0..3 {
            unpack_block(fmt, &row, 3, b, &mut back);
            let bb = fmt.block_bytes();
            assert_eq!(back, blocks[b * bb..(b + 1) * bb], "{fmt} block {b}");
        }
    }
}

/// The nearest code by search over the decoded values `vals` (codes 0..=0x7E; ties to
/// the even code): what `f32_to_e4m3` computes from the bits.
fn e4m3_by_search(vals: &[f32], x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs().min(E4M3_MAX);
    let below = (vals.partition_point(|&v| v <= a) - 1) as u8;
    let code = if below < 0x7E {
        let (db, da) = (a - vals[below as usize], vals[below as usize + 1] - a);
        if da < db || (da == db && below & 1 == 1) {
            below + 1
        } else {
            below
        }
    } else {
        below
    };
    sign | code
}

#[test]
fn e4m3_encoding_matches_the_search_everywhere() {
    // Every code, every midpoint between neighbours and the floats next to it, and a
    // sweep of f32 bit patterns from 2^-12 to past the saturation point.
    let mut xs = vec![0.0f32, -0.0, 1e-30, 1e9, -1e9, 464.0, 480.0];
    for c in 0u8..0x7E {
        let (lo, hi) = (e4m3_to_f32(c), e4m3_to_f32(c + 1));
        let mid = (lo + hi) / 2.0;
        xs.extend([lo, mid, f32::from_bits(mid.to_bits() - 1), mid.next_up()]);
    }
    let mut b = 2f32.powi(-12).to_bits();
    while b < 500f32.to_bits() {
        xs.push(f32::from_bits(b));
        b += 997;
    }
    let vals: Vec<f32> = (0u8..=0x7E).map(e4m3_to_f32).collect();
    for &x in &xs {
        for x in [x, -x] {
            assert_eq!(f32_to_e4m3(x), e4m3_by_search(&vals, x), "{x:e}");
        }
    }
}

#[test]
fn e4m3_encodes_to_the_nearest_code() {
    for code in 0u8..=0x7E {
        let v = e4m3_to_f32(code);
        assert_eq!(f32_to_e4m3(v), code, "{v}");
        assert_eq!(f32_to_e4m3(-v), if code == 0 { 0x80 } else { code | 0x80 });
    }
    assert_eq!(e4m3_to_f32(0x7E), 448.0);
    assert_eq!(f32_to_e4m3(1e9), 0x7E);
    assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
    // 1.0625 lies halfway between 1.0 (0x38) and 1.125 (0x39): ties go to even.
    assert_eq!(f32_to_e4m3(1.0625), 0x38);
    assert!(e4m3_to_f32(0x7F).is_nan());
}

#[test]
fn rows_that_are_not_whole_blocks_have_no_size() {
    assert_eq!(QuantFormat::Q4K.row_bytes(576), None);
    assert_eq!(QuantFormat::Q8_0.row_bytes(576), Some(624));
    assert_eq!(QuantFormat::Q4K.row_bytes(4096), Some(16 * 144));
    assert_eq!(QuantFormat::Q6K.row_bytes(4096), Some(16 * 210));
    assert_eq!(QuantFormat::parse("Q4_K"), Some(QuantFormat::Q4K));
    assert_eq!(QuantFormat::parse("fp8"), Some(QuantFormat::F8E4M3));
    assert_eq!(QuantFormat::parse("q2_k"), None);
}
