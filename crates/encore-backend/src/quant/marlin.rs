//! The tensor-core GEMM's weight layout (`kernels/quant_marlin.cu`, "marlin"): the 4-bit
//! formats (Q4_0, Q4_1, Q4_K) and Q8_0 repacked at load into the order the kernel's mma
//! fragments take them, so that a warp streams 16 bytes a lane per tile with `cp.async`
//! and every thread finds its own B-fragment words in shared memory, decoded in registers.
//!
//! # Values
//! Every format becomes codes `q` (4 bits: 0..16; 8 bits: 0..256, Q8_0's `i8 + 128`) with
//! one f16 scale `s` and one f16 min `m` per 32 values along k: `x = s * q + m`.
//! Q4_0: `s = d`, `m = -8 d`; Q4_1: `s = d`, `m = m`; Q8_0: `s = d`, `m = -128 d` (all
//! exact, so these decode to [`super::decode_block`]'s values, a zero's sign aside); Q4_K: `s = d * sc`,
//! `m = -(dmin * mn)` for each 32-value sub-block, each rounded to f16 once (the products
//! are exact in f32: a relative error of at most 2^-11 on each term; [`q4k_bound`]). A
//! block whose f16 scale or min would overflow is refused (`None`): the weight then keeps
//! the other kernels.
//!
//! # Layout
//! The matrix `[n, k]` is padded with zeros to `np` (a multiple of [`BN`] = 128 rows) by
//! `kp` (a multiple of [`BK`] = 64 values). It is cut into tiles of 128 rows by 64 values,
//! stored n tile by n tile, k tile after k tile; tile `(nt, kt)` is at
//! `(nt * kp / 64 + kt) * tile_bytes` ([`Layout::tile_bytes`]: 4 KiB of 4-bit codes, 8 KiB
//! of bytes), and its scales at `weight_bytes + (nt * kp / 64 + kt) * 1024`: for each of
//! its two 32-value groups, 128 (s, m) f16 pairs, one a row.
//!
//! In a tile, warp `w` (0..8) owns rows `16 w .. 16 w + 16`; lane `l` (g = l / 4, t = l %
//! 4) owns, for each of the tile's four 16-value k steps `s`, the values of rows
//! `16 w + g` and `16 w + 8 + g` at columns `16 s + 2 t + {0, 1, 8, 9}`: those of mma
//! m16n8k16's two B fragments (two n8 tiles). 4 bits: one u32 word a k step, lane `l`'s
//! four words (16 bytes) at `(w * 32 + l) * 16`; nibble `i` of the word (bits `4i..4i+4`)
//! is row `16 w + g + 8 [i & 2]`, column `16 s + 2 t + 8 [i & 1] + [i >= 4]`, so the pairs
//! (nibble i, nibble i + 4) are the fragments' bf16/f16 pairs after one shift and mask.
//! 8 bits: one word a (k step, n8 tile j), bytes `2 t, 2 t + 1, 2 t + 8, 2 t + 9` of row
//! `16 w + 8 j + g`; lane `l`'s words for k steps `2 h, 2 h + 1` (h = 0, 1; word `2 (s %
//! 2) + j`) at `((w * 2 + h) * 32 + l) * 16`, so both of a warp's 16-byte reads are
//! contiguous.

use half::f16;

use super::{decode_block, unpack_block, QuantFormat};

/// Weight rows per tile (a CTA's n tile).
pub const BN: usize = 128;
/// Values of k per tile (one pipeline stage).
pub const BK: usize = 64;
/// Scale bytes per tile: two groups x 128 rows x (s, m) f16.
pub const SCALE_TILE_BYTES: usize = 2 * BN * 4;

/// Bits per code of `fmt` in this layout, `None` for the formats it does not take.
pub fn bits(fmt: QuantFormat) -> Option<usize> {
    match fmt {
        QuantFormat::Q4_0 | QuantFormat::Q4_1 | QuantFormat::Q4K => Some(4),
        QuantFormat::Q8_0 => Some(8),
        _ => None,
    }
}

/// The repacked shape of an `[n, k]` weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub bits: usize,
    pub n: usize,
    pub k: usize,
    /// n rounded up to [`BN`], k to [`BK`].
    pub np: usize,
    pub kp: usize,
}

impl Layout {
    /// The layout of `fmt` `[n, k]` (k a whole number of `fmt`'s blocks), `None` for a
    /// format this layout does not take or an empty shape.
    pub fn new(fmt: QuantFormat, n: usize, k: usize) -> Option<Layout> {
        let bits = bits(fmt)?;
        if n == 0 || k == 0 || !k.is_multiple_of(fmt.block_elems()) {
            return None;
        }
        Some(Layout {
            bits,
            n,
            k,
            np: n.div_ceil(BN) * BN,
            kp: k.div_ceil(BK) * BK,
        })
    }
    /// Bytes of one tile's codes.
    pub fn tile_bytes(&self) -> usize {
        BN * BK * self.bits / 8
    }
    pub fn k_tiles(&self) -> usize {
        self.kp / BK
    }
    /// Bytes of all codes (where the scales start).
    pub fn weight_bytes(&self) -> usize {
        self.np * self.kp * self.bits / 8
    }
    /// Bytes of the whole repacked weight.
    pub fn bytes(&self) -> usize {
        self.weight_bytes() + (self.np / BN) * self.k_tiles() * SCALE_TILE_BYTES
    }
    /// Byte of the code of row `r` column `c`, and its bit shift within that byte (4 or
    /// 0) or 0 for 8 bits.
    fn code_at(&self, r: usize, c: usize) -> (usize, u32) {
        let (nt, kt) = (r / BN, c / BK);
        let tile = (nt * self.k_tiles() + kt) * self.tile_bytes();
        let (w, rl) = ((r % BN) / 16, r % 16);
        let (j, g) = (rl / 8, rl % 8);
        let cl = c % BK;
        let (s, cs) = (cl / 16, cl % 16);
        // cs = 2 t + 8 hi + odd.
        let (hi, t, odd) = (cs / 8, (cs % 8) / 2, cs % 2);
        let l = 4 * g + t;
        if self.bits == 4 {
            let nib = 2 * j + hi + 4 * odd;
            let word = tile + (w * 32 + l) * 16 + s * 4;
            (word + nib / 2, 4 * (nib as u32 % 2))
        } else {
            let (h, ws) = (s / 2, s % 2);
            let word = tile + ((w * 2 + h) * 32 + l) * 16 + (2 * ws + j) * 4;
            (word + 2 * hi + odd, 0)
        }
    }
    /// Byte of the (s, m) pair of row `r`, 32-value group `gi` (of k).
    fn scale_at(&self, r: usize, gi: usize) -> usize {
        let (nt, kt) = (r / BN, gi / 2);
        self.weight_bytes()
            + (nt * self.k_tiles() + kt) * SCALE_TILE_BYTES
            + ((gi % 2) * BN + r % BN) * 4
    }
}

/// One 32-value group: its codes, scale and min.
struct Group {
    q: [u8; 32],
    s: f16,
    m: f16,
}

/// f16 of `v`, `None` when it overflows (or is not finite).
fn f16_of(v: f32) -> Option<f16> {
    let h = f16::from_f32(v);
    h.is_finite().then_some(h)
}

fn half_at(b: &[u8], at: usize) -> f16 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// The 32-value groups of one ggml block of `fmt`, `None` where a scale or min overflows
/// f16.
fn groups(fmt: QuantFormat, b: &[u8], out: &mut Vec<Group>) -> Option<()> {
    let nibbles = |qs: &[u8], high: bool| {
        let mut q = [0u8; 32];
        for (i, &v) in qs.iter().enumerate() {
            q[i] = if high { v >> 4 } else { v & 0xF };
        }
        q
    };
    match fmt {
        QuantFormat::Q4_0 | QuantFormat::Q4_1 => {
            let (d, qs) = (half_at(b, 0), if fmt == QuantFormat::Q4_0 { 2 } else { 4 });
            let mut q = [0u8; 32];
            for j in 0..16 {
                q[j] = b[qs + j] & 0xF;
                q[j + 16] = b[qs + j] >> 4;
            }
            let m = if fmt == QuantFormat::Q4_0 {
                f16_of(-8.0 * d.to_f32())?
            } else {
                half_at(b, 2)
            };
            out.push(Group { q, s: d, m });
        }
        QuantFormat::Q8_0 => {
            let d = half_at(b, 0);
            let mut q = [0u8; 32];
            for (o, &v) in q.iter_mut().zip(&b[2..34]) {
                *o = v ^ 0x80;
            }
            out.push(Group {
                q,
                s: d,
                m: f16_of(-128.0 * d.to_f32())?,
            });
        }
        QuantFormat::Q4K => {
            let (d, dmin) = (half_at(b, 0).to_f32(), half_at(b, 2).to_f32());
            let sc = &b[4..16];
            for pair in 0..4 {
                let qs = &b[16 + 32 * pair..48 + 32 * pair];
                for (sub, high) in [(2 * pair, false), (2 * pair + 1, true)] {
                    let (s, m) = scale_min_k4(sub, sc);
                    out.push(Group {
                        q: nibbles(qs, high),
                        s: f16_of(d * s)?,
                        m: f16_of(-(dmin * m))?,
                    });
                }
            }
        }
        _ => return None,
    }
    Some(())
}

/// Q4_K's 6-bit scale and min of sub-block `j` (quant.rs's `scale_min_k4`).
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

/// Repack the device rows (`crate::quant`'s layout) of an `[n, k]` weight in `fmt` into
/// [`Layout`]'s bytes; `None` when the layout does not take `fmt` or a scale overflows f16
/// (the caller keeps the weight on the other kernels). Rows in parallel.
pub fn repack(fmt: QuantFormat, n: usize, k: usize, rows: &[u8]) -> Option<Vec<u8>> {
    use rayon::prelude::*;
    let lay = Layout::new(fmt, n, k)?;
    let rb = fmt.row_bytes(k)?;
    if rows.len() < n * rb {
        return None;
    }
    let nb = k / fmt.block_elems();
    // Each row's groups, then written into the interleaved bytes row by row.
    let per_row: Option<Vec<Vec<Group>>> = (0..n)
        .into_par_iter()
        .map(|r| {
            let row = &rows[r * rb..(r + 1) * rb];
            let mut block = vec![0u8; fmt.block_bytes()];
            let mut g = Vec::with_capacity(k / 32);
            for b in 0..nb {
                unpack_block(fmt, row, nb, b, &mut block);
                groups(fmt, &block, &mut g)?;
            }
            Some(g)
        })
        .collect();
    let per_row = per_row?;
    let mut out = vec![0u8; lay.bytes()];
    // The n tiles are disjoint ranges of the codes; the scales follow. Write per n tile in
    // parallel: split the codes and scales by n tile.
    let (codes, scales) = out.split_at_mut(lay.weight_bytes());
    let tile_codes = lay.k_tiles() * lay.tile_bytes();
    let tile_scales = lay.k_tiles() * SCALE_TILE_BYTES;
    codes
        .par_chunks_mut(tile_codes)
        .zip(scales.par_chunks_mut(tile_scales))
        .enumerate()
        .for_each(|(nt, (c, s))| {
            let rows = nt * BN..((nt + 1) * BN).min(n);
            for (r, groups) in rows.clone().zip(&per_row[rows]) {
                for (gi, g) in groups.iter().enumerate() {
                    let at = lay.scale_at(r, gi) - lay.weight_bytes() - nt * tile_scales;
                    s[at..at + 2].copy_from_slice(&g.s.to_bits().to_le_bytes());
                    s[at + 2..at + 4].copy_from_slice(&g.m.to_bits().to_le_bytes());
                    for (i, &q) in g.q.iter().enumerate() {
                        let (byte, shift) = lay.code_at(r, gi * 32 + i);
                        let byte = byte - nt * tile_codes;
                        if lay.bits == 4 {
                            c[byte] |= q << shift;
                        } else {
                            c[byte] = q;
                        }
                    }
                }
            }
        });
    Some(out)
}

/// The values of a repacked weight, `[n, k]` row-major: `s * q + m` in f32 (the CPU
/// inverse of [`repack`], what the kernel's decode rounds to x's type).
pub fn unpack(lay: &Layout, packed: &[u8]) -> Vec<f32> {
    let mut out = vec![0f32; lay.n * lay.k];
    for r in 0..lay.n {
        for c in 0..lay.k {
            let (byte, shift) = lay.code_at(r, c);
            let q = if lay.bits == 4 {
                (packed[byte] >> shift) & 0xF
            } else {
                packed[byte]
            };
            let at = lay.scale_at(r, c / 32);
            let s = half_at(packed, at).to_f32();
            let m = half_at(packed, at + 2).to_f32();
            out[r * lay.k + c] = s * q as f32 + m;
        }
    }
    out
}

/// The most a Q4_K value through this layout may differ from [`decode_block`]'s, for
/// the block `b`: each 32-value group's `|s| * 15 + |m|` times 2^-11 (the f16 rounding of
/// each term) plus an ulp of f32 of the same, taken over the block's groups.
pub fn q4k_bound(b: &[u8]) -> f32 {
    let (d, dmin) = (half_at(b, 0).to_f32(), half_at(b, 2).to_f32());
    (0..8)
        .map(|j| {
            let (s, m) = scale_min_k4(j, &b[4..16]);
            ((d * s).abs() * 15.0 + (dmin * m).abs()) * (2f32.powi(-11) + 2f32.powi(-22))
        })
        .fold(0.0, f32::max)
}

/// The reference values of one device row (for tests): [`decode_block`] block by block.
pub fn decode_row(fmt: QuantFormat, row: &[u8], k: usize) -> Vec<f32> {
    let nb = k / fmt.block_elems();
    let mut block = vec![0u8; fmt.block_bytes()];
    let mut out = vec![0f32; k];
    for (b, o) in out.chunks_exact_mut(fmt.block_elems()).enumerate() {
        unpack_block(fmt, row, nb, b, &mut block);
        decode_block(fmt, &block, o);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Random device rows of `fmt` `[n, k]`: random bytes, with f16 scales kept small and
    /// finite (ggml's blocks are any bytes; an f16 NaN scale would make both sides NaN).
    fn random_rows(rng: &mut rand::rngs::StdRng, fmt: QuantFormat, n: usize, k: usize) -> Vec<u8> {
        let rb = fmt.row_bytes(k).unwrap();
        let nb = k / fmt.block_elems();
        let mut out = vec![0u8; n * rb];
        let mut blocks = vec![0u8; nb * fmt.block_bytes()];
        let halves = match fmt {
            QuantFormat::Q4_1 | QuantFormat::Q4K => 2,
            _ => 1,
        };
        for r in 0..n {
            rng.fill(&mut blocks[..]);
            for block in blocks.chunks_exact_mut(fmt.block_bytes()) {
                for h in 0..halves {
                    let v: f32 = rng.random_range(-2.0..2.0);
                    let bits = f16::from_f32(v).to_bits().to_le_bytes();
                    block[2 * h..2 * h + 2].copy_from_slice(&bits);
                }
            }
            super::super::pack_row(fmt, &blocks, &mut out[r * rb..(r + 1) * rb]);
        }
        out
    }

    /// Repack then unpack gives the dequantized original: exactly for Q4_0, Q4_1 and Q8_0,
    /// within [`q4k_bound`] for Q4_K; on shapes that pad n and k.
    #[test]
    fn repack_then_unpack_is_the_decode() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(48);
        for fmt in [
            QuantFormat::Q4_0,
            QuantFormat::Q4_1,
            QuantFormat::Q8_0,
            QuantFormat::Q4K,
        ] {
            let be = fmt.block_elems();
            for (n, blocks) in [(1, 1), (7, 3), (128, 2), (200, 5), (256, 8)] {
                let k = blocks * be;
                let rows = random_rows(&mut rng, fmt, n, k);
                let lay = Layout::new(fmt, n, k).unwrap();
                let packed = repack(fmt, n, k, &rows).unwrap();
                assert_eq!(packed.len(), lay.bytes());
                let got = unpack(&lay, &packed);
                let rb = fmt.row_bytes(k).unwrap();
                let mut differ = 0;
                for r in 0..n {
                    let row = &rows[r * rb..(r + 1) * rb];
                    let want = decode_row(fmt, row, k);
                    let mut bound = 0.0;
                    for c in 0..k {
                        let (g, w) = (got[r * k + c], want[c]);
                        if fmt == QuantFormat::Q4K {
                            // The block's bound, once a block (debug builds are slow).
                            if c % be == 0 {
                                let mut block = vec![0u8; fmt.block_bytes()];
                                unpack_block(fmt, row, k / be, c / be, &mut block);
                                bound = q4k_bound(&block);
                            }
                            assert!(
                                (g - w).abs() <= bound,
                                "{fmt} [{r}, {c}]: {g} vs {w} (bound {bound})"
                            );
                            differ += (g != w) as usize;
                        } else {
                            // Equal values; a zero's sign may differ (Q4_0's d * (8 - 8)
                            // is -0 for a negative d, s * 8 + m is +0).
                            assert!(g == w, "{fmt} n={n} k={k} [{r}, {c}]: {g} vs {w}");
                        }
                    }
                }
                // The padding decodes to zero (codes 0, scale 0, min 0).
                let full = Layout {
                    n: lay.np,
                    k: lay.kp,
                    ..lay
                };
                let padded = unpack(&full, &packed);
                for r in 0..lay.np {
                    for c in 0..lay.kp {
                        if r >= n || c >= k {
                            assert_eq!(padded[r * lay.kp + c], 0.0, "padding [{r}, {c}]");
                        }
                    }
                }
                if fmt == QuantFormat::Q4K && n * k >= 4096 {
                    assert!(
                        differ > 0,
                        "Q4_K's f16 rounding never showed: the test cannot see it"
                    );
                }
            }
        }
    }

    /// Every code of the padded tile lands on a distinct (byte, shift): the layout is a
    /// permutation.
    #[test]
    fn layout_is_a_permutation() {
        for bits_fmt in [QuantFormat::Q4_0, QuantFormat::Q8_0] {
            let lay = Layout::new(bits_fmt, 256, 128).unwrap();
            let mut seen = vec![0u8; lay.weight_bytes()];
            for r in 0..lay.np {
                for c in 0..lay.kp {
                    let (b, s) = lay.code_at(r, c);
                    let bit = if lay.bits == 4 { 0xF << s } else { 0xFF };
                    assert_eq!(seen[b] & bit, 0, "row {r} col {c} collides");
                    seen[b] |= bit;
                }
            }
            assert!(seen.iter().all(|&b| b == 0xFF));
        }
    }

    /// The bytes each lane of the kernel reads (quant_marlin.cu: its 16- or 32-byte share of
    /// a tile, the word of k step s, the pairs it decodes into m16n8k16's B fragments b0 =
    /// (k 2t, 2t + 1), b1 = (k 2t + 8, 2t + 9) of column n = g of n8 tile j) hold the
    /// values the fragments must: written from the kernel's side, not from `code_at`.
    #[test]
    fn lanes_read_their_fragments() {
        for fmt in [QuantFormat::Q4_0, QuantFormat::Q8_0] {
            let lay = Layout::new(fmt, 256, 128).unwrap();
            let (nt, kt) = (1, 1);
            let tile = (nt * lay.k_tiles() + kt) * lay.tile_bytes();
            for w in 0..8 {
                for l in 0..32 {
                    let (g, t) = (l / 4, l % 4);
                    for s in 0..4 {
                        for j in 0..2 {
                            for r in 0..2 {
                                let row = nt * BN + 16 * w + 8 * j + g;
                                let col = kt * BK + 16 * s + 2 * t + 8 * r;
                                // (byte, shift) of the pair's low and high values.
                                let (lo, hi) = if lay.bits == 4 {
                                    let word = tile + (w * 32 + l) * 16 + 4 * s;
                                    let i = 2 * j + r;
                                    (
                                        (word + i / 2, 4 * (i as u32 % 2)),
                                        (word + (i + 4) / 2, 4 * ((i + 4) as u32 % 2)),
                                    )
                                } else {
                                    let (h, hh) = (s / 2, s % 2);
                                    let word =
                                        tile + ((w * 2 + h) * 32 + l) * 16 + 4 * (2 * hh + j);
                                    ((word + 2 * r, 0), (word + 2 * r + 1, 0))
                                };
                                assert_eq!(
                                    lay.code_at(row, col),
                                    lo,
                                    "{fmt} w{w} l{l} s{s} j{j} r{r}"
                                );
                                assert_eq!(
                                    lay.code_at(row, col + 1),
                                    hi,
                                    "{fmt} w{w} l{l} s{s} j{j} r{r}"
                                );
                                // The scales the lane reads for group s / 2 of its row.
                                let sc = lay.weight_bytes()
                                    + (nt * lay.k_tiles() + kt) * SCALE_TILE_BYTES
                                    + ((s / 2) * BN + 16 * w + 8 * j + g) * 4;
                                assert_eq!(lay.scale_at(row, col / 32), sc);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Formats the layout does not take, and shapes that are not whole blocks, are refused.
    #[test]
    fn refuses_other_formats() {
        assert!(Layout::new(QuantFormat::Q6K, 128, 256).is_none());
        assert!(Layout::new(QuantFormat::Q5_0, 128, 64).is_none());
        assert!(Layout::new(QuantFormat::Q4K, 128, 64).is_none());
        assert!(repack(QuantFormat::Q6K, 1, 256, &[0u8; 256]).is_none());
    }
}
