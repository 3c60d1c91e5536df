//! A GPTQ projection in a checkpoint ([`GptqFormat`]): read from its packed tensors,
//! checked against the packing encore runs, and turned into GGUF blocks (Q4_0 for 4
//! bits, Q8_0 for 8: the same values, bit for bit) or decoded to f32.

use super::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::model::formats::GptqFormat;
use encore_backend::quant::QuantFormat;
use half::f16;
use safetensors::tensor::Dtype;

/// Columns of one GGUF block (Q4_0 and Q8_0).
const BLOCK: usize = 32;

/// One GPTQ projection `[rows, cols]` (HF's `[out, in]`), unpacked.
pub(super) struct GptqWeight {
    rows: usize,
    cols: usize,
    bits: u32,
    /// The codes, row-major `[rows, cols]` (0 .. 2^bits).
    codes: Vec<u8>,
    /// f16 scales `[groups, rows]` as the file stores them.
    scales: Vec<f16>,
    /// Columns a group.
    group: usize,
}

/// The packed tensors of projection `name` (`P.weight` in the declaration): `P.qweight`,
/// `P.scales`, `P.qzeros`, `P.g_idx`.
fn parts(name: &str) -> Option<[String; 4]> {
    let base = name.strip_suffix(".weight")?;
    Some(["qweight", "scales", "qzeros", "g_idx"].map(|p| format!("{base}.{p}")))
}

/// Whether `name` is one of a GPTQ projection's packed tensors.
pub(super) fn is_packed_part(name: &str) -> bool {
    [".qweight", ".scales", ".qzeros", ".g_idx"]
        .iter()
        .any(|s| name.ends_with(s))
}

/// Little-endian 32-bit words of a tensor stored as I32 or U32.
fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect()
}

impl GptqWeight {
    /// Projection `name` of `shape` `[rows, cols]` from its packed tensors, or `None` when
    /// the checkpoint has no `P.qweight`. Shapes, dtypes and the packing (zeros of
    /// 2^(bits - 1), groups in column order) are checked; a failure names the tensor.
    /// With `unpack` false only the checks run (the codes are left empty).
    pub(super) fn read(
        ck: &Checkpoint,
        g: GptqFormat,
        name: &str,
        shape: &[usize],
        unpack: bool,
    ) -> Result<Option<GptqWeight>> {
        let Some([qweight, scales, qzeros, g_idx]) = parts(name) else {
            return Ok(None);
        };
        let Some((qw_dtype, qw_shape, qw_bytes)) = ck.raw(&qweight) else {
            return Ok(None);
        };
        let err = |tensor: &str, what: String| Error::Weights {
            tensor: tensor.to_string(),
            what,
        };
        let (rows, cols) = match shape {
            [r, c] => (*r, *c),
            _ => return Err(err(name, format!("is GPTQ-packed but declared {shape:?}"))),
        };
        let bits = g.bits as usize;
        let per_word = 32 / bits;
        let group = g.group_size.unwrap_or(cols);
        if !cols.is_multiple_of(BLOCK)
            || !cols.is_multiple_of(group)
            || !group.is_multiple_of(BLOCK)
        {
            return Err(err(
                name,
                format!(
                    "has {cols} columns: GPTQ groups of {group} in whole blocks of {BLOCK} \
                     are needed"
                ),
            ));
        }
        let groups = cols / group;
        let int = |d: Dtype| matches!(d, Dtype::I32 | Dtype::U32);
        let expect = |t: &str, d: Dtype, s: &[usize], want: &[usize], ok: bool| -> Result<()> {
            if s != want || !ok {
                return Err(err(
                    t,
                    format!("has {d:?} {s:?}, expected {want:?} (GPTQ, {bits} bits)"),
                ));
            }
            Ok(())
        };
        expect(
            &qweight,
            qw_dtype,
            &qw_shape,
            &[cols / per_word, rows],
            int(qw_dtype),
        )?;
        let missing = |t: &str| {
            err(
                t,
                format!("is missing (the GPTQ projection `{qweight}` needs it)"),
            )
        };
        let (sc_dtype, sc_shape, sc_bytes) = ck.raw(&scales).ok_or_else(|| missing(&scales))?;
        expect(
            &scales,
            sc_dtype,
            &sc_shape,
            &[groups, rows],
            sc_dtype == Dtype::F16,
        )?;
        let (qz_dtype, qz_shape, qz_bytes) = ck.raw(&qzeros).ok_or_else(|| missing(&qzeros))?;
        expect(
            &qzeros,
            qz_dtype,
            &qz_shape,
            &[groups, rows.div_ceil(per_word)],
            int(qz_dtype),
        )?;
        if let Some((gi_dtype, gi_shape, gi_bytes)) = ck.raw(&g_idx) {
            expect(&g_idx, gi_dtype, &gi_shape, &[cols], int(gi_dtype))?;
            if let Some(c) = words(gi_bytes)
                .iter()
                .enumerate()
                .position(|(c, &gi)| gi as usize != c / group)
            {
                return Err(err(
                    &g_idx,
                    format!(
                        "puts column {c} outside group {} (groups in activation order, \
                         `desc_act`, are not supported)",
                        c / group
                    ),
                ));
            }
        }
        let mask = (1u32 << bits) - 1;
        let zero = 1u32 << (bits - 1);
        let stored_zero = zero - g.zeros_minus_one as u32;
        let zw = rows.div_ceil(per_word);
        for (i, w) in words(qz_bytes).iter().enumerate() {
            let (gr, word) = (i / zw, i % zw);
            for s in 0..per_word {
                let row = word * per_word + s;
                let z = (w >> (s * bits)) & mask;
                if row < rows && z != stored_zero {
                    return Err(err(
                        &qzeros,
                        format!(
                            "holds zero point {z} for row {row} of group {gr}, not {stored_zero}: \
                             an asymmetric packing (zero points are not supported)"
                        ),
                    ));
                }
            }
        }
        let packed = if unpack { words(qw_bytes) } else { Vec::new() };
        let mut codes = vec![0u8; if unpack { rows * cols } else { 0 }];
        for (i, w) in packed.iter().enumerate() {
            let (cw, row) = (i / rows, i % rows);
            for s in 0..per_word {
                codes[row * cols + cw * per_word + s] = ((w >> (s * bits)) & mask) as u8;
            }
        }
        let scales = sc_bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]))
            .collect();
        Ok(Some(GptqWeight {
            rows,
            cols,
            bits: g.bits,
            codes,
            scales,
            group,
        }))
    }

    fn scale(&self, row: usize, col: usize) -> f16 {
        self.scales[(col / self.group) * self.rows + row]
    }

    /// The code of `(row, col)` minus the zero point: -2^(bits-1) .. 2^(bits-1).
    fn centred(&self, row: usize, col: usize) -> i32 {
        self.codes[row * self.cols + col] as i32 - (1 << (self.bits - 1))
    }

    /// The decoded values `scale * (q - zero)`, row-major `[rows, cols]`, in f32 (exact:
    /// an f16 times a small integer).
    pub(super) fn to_f32(&self) -> Vec<f32> {
        (0..self.rows * self.cols)
            .map(|i| {
                let (r, c) = (i / self.cols, i % self.cols);
                self.scale(r, c).to_f32() * self.centred(r, c) as f32
            })
            .collect()
    }

    /// The format the packing is exactly: Q4_0 (4 bits), Q8_0 (8).
    pub(super) fn format(&self) -> QuantFormat {
        match self.bits {
            4 => QuantFormat::Q4_0,
            _ => QuantFormat::Q8_0,
        }
    }

    /// GGUF blocks of [`GptqWeight::format`], row-major: per 32 columns the f16 scale,
    /// then Q4_0's 16 bytes (column t in the low nibble of byte t, column t + 16 in its
    /// high nibble, each as code - zero + 8, i.e. the code) or Q8_0's 32 signed bytes.
    pub(super) fn blocks(&self) -> Vec<u8> {
        let fmt = self.format();
        let mut out = Vec::with_capacity(self.rows * self.cols / BLOCK * fmt.block_bytes());
        for r in 0..self.rows {
            for b in (0..self.cols).step_by(BLOCK) {
                out.extend_from_slice(&self.scale(r, b).to_le_bytes());
                match fmt {
                    QuantFormat::Q4_0 => out.extend((0..BLOCK / 2).map(|t| {
                        let lo = (self.centred(r, b + t) + 8) as u8;
                        let hi = (self.centred(r, b + t + BLOCK / 2) + 8) as u8;
                        lo | (hi << 4)
                    })),
                    _ => out.extend((0..BLOCK).map(|t| self.centred(r, b + t) as i8 as u8)),
                }
            }
        }
        out
    }
}
