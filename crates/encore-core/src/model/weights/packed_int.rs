//! A projection packed in integers in a checkpoint ([`IntPacking`]: GPTQ, AWQ, or
//! compressed-tensors' pack-quantized): read from its packed tensors, checked against the
//! packing encore runs, and turned into GGUF blocks (symmetric: Q4_0 for 4 bits, Q8_0 for
//! 8, the same values bit for bit; zero points: Q4_1, see [`IntPacking`]) or decoded to
//! f32.

use super::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::model::formats::{IntPacking, IntScheme};
use encore_backend::quant::QuantFormat;
use half::f16;
use safetensors::tensor::Dtype;

/// Columns of one GGUF block (Q4_0, Q4_1 and Q8_0).
const BLOCK: usize = 32;

/// AWQ's GEMM layout: nibble `i` of a word holds output `8 * word + AWQ_ORDER[i]`.
const AWQ_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// One packed projection `[rows, cols]` (HF's `[out, in]`), unpacked.
pub(super) struct PackedIntWeight {
    rows: usize,
    cols: usize,
    bits: u32,
    /// The block format holding exactly these values ([`IntPacking::kept_as`]).
    format: QuantFormat,
    /// The codes, row-major `[rows, cols]` (0 .. 2^bits).
    codes: Vec<u8>,
    /// f16 scales `[groups, rows]` (exactly the file's).
    scales: Vec<f16>,
    /// Zero points `[groups, rows]` (0 .. 2^bits), or `None`: the symmetric 2^(bits-1).
    zeros: Option<Vec<u8>>,
    /// The group of each 32-column block of the weight as kept (its columns permuted by
    /// `perm` under act order).
    block_group: Vec<usize>,
    /// Act order: column `j` of the weight as kept is the file's column `perm[j]` (the
    /// stable sort by g_idx of the columns `range`, the others in place); `None`: the
    /// file's order.
    perm: Option<Vec<usize>>,
    /// The columns whose order `perm` sorts (this rank's share of a row-parallel one).
    range: std::ops::Range<usize>,
}

/// Whether projection `name` (a `.weight`) is one of a dense layer's q/k/v, o, gate/up or
/// down, whose input columns act order sorts (the layer holds their permutations).
pub(super) fn act_ordered(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("model.layers.") else {
        return false;
    };
    let rest = rest.trim_start_matches(|c: char| c.is_ascii_digit());
    matches!(
        rest,
        ".self_attn.q_proj.weight"
            | ".self_attn.k_proj.weight"
            | ".self_attn.v_proj.weight"
            | ".self_attn.qkv_proj.weight"
            | ".self_attn.o_proj.weight"
            | ".mlp.gate_proj.weight"
            | ".mlp.up_proj.weight"
            | ".mlp.gate_up_proj.weight"
            | ".mlp.down_proj.weight"
    )
}

/// Act order's permutation of columns `range` of `cols` by their groups `g_idx` (a stable
/// sort; the columns outside `range` stay in place) and the group of each 32-column block
/// after it: an error naming tensor `t` when a group index is not below `groups` or a
/// group's columns in `range` are not whole blocks.
fn sort_by_group(
    t: &str,
    g_idx: &[u32],
    groups: usize,
    range: std::ops::Range<usize>,
) -> Result<(Vec<usize>, Vec<usize>)> {
    let err = |what: String| Error::Weights {
        tensor: t.to_string(),
        what,
    };
    if let Some(c) = g_idx.iter().position(|&g| g as usize >= groups) {
        return Err(err(format!(
            "puts column {c} in group {}, but there are {groups} groups",
            g_idx[c] as i32
        )));
    }
    let mut perm: Vec<usize> = (0..g_idx.len()).collect();
    perm[range.clone()].sort_by_key(|&c| g_idx[c]);
    let mut count = vec![0usize; groups];
    for &c in &perm[range.clone()] {
        count[g_idx[c] as usize] += 1;
    }
    if let Some(g) = count.iter().position(|n| !n.is_multiple_of(BLOCK)) {
        let share = match range.len() == g_idx.len() {
            true => String::new(),
            false => format!(
                " of columns {}..{} (this rank's share: activation order that crosses the \
                 tensor-parallel shards is not supported)",
                range.start, range.end
            ),
        };
        return Err(err(format!(
            "puts {} columns{share} in group {g}: encore runs activation order with every \
             group's columns whole blocks of {BLOCK} (one scale a block)",
            count[g]
        )));
    }
    let block_group = perm.chunks(BLOCK).map(|b| g_idx[b[0]] as usize).collect();
    Ok((perm, block_group))
}

/// Whether `name` is one of a packed projection's tensors (either scheme).
pub(super) fn is_packed_part(name: &str) -> bool {
    [
        ".qweight",
        ".scales",
        ".qzeros",
        ".g_idx",
        ".weight_packed",
        ".weight_scale",
        ".weight_shape",
        ".weight_zero_point",
        ".weight_g_idx",
    ]
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

/// Every `bits`-wide slot of the words in `bytes` (I32 or U32), low bits first, as
/// `f(word index, slot, value)`.
fn each_slot(bytes: &[u8], bits: usize, mut f: impl FnMut(usize, usize, u8)) {
    let mask = (1u32 << bits) - 1;
    for (i, w) in words(bytes).into_iter().enumerate() {
        for s in 0..32 / bits {
            f(i, s, ((w >> (s * bits)) & mask) as u8);
        }
    }
}

/// Zero points `[groups, rows]` from their packed words in `bytes`: slot `s` of word `i`
/// holds the zero of `(group, row) = at(i, s)` (rows past `rows` are padding).
fn zero_grid(
    bytes: &[u8],
    bits: usize,
    groups: usize,
    rows: usize,
    at: impl Fn(usize, usize) -> (usize, usize),
) -> Vec<u8> {
    let mut zs = vec![0u8; groups * rows];
    each_slot(bytes, bits, |i, s, z| {
        let (gr, row) = at(i, s);
        if row < rows {
            zs[gr * rows + row] = z;
        }
    });
    zs
}

/// A symmetric packing's zero points (`zs`, `[groups, rows]`, from tensor `t`) must all be
/// `want`: an error naming the first that is not.
fn symmetric_zeros(t: &str, zs: &[u8], rows: usize, want: u8) -> Result<()> {
    match zs.iter().position(|&z| z != want) {
        None => Ok(()),
        Some(i) => Err(Error::Weights {
            tensor: t.to_string(),
            what: format!(
                "holds zero point {} for row {} of group {}, not {want}, under a symmetric \
                 config (zero points need `sym: false` / `symmetric: false` at 4 bits)",
                zs[i],
                i % rows,
                i / rows
            ),
        }),
    }
}

fn is_int(d: Dtype) -> bool {
    matches!(d, Dtype::I32 | Dtype::U32)
}

fn is_float(d: Dtype) -> bool {
    matches!(d, Dtype::F16 | Dtype::BF16 | Dtype::F32)
}

/// Scales `t` of a float dtype as f16, each exactly (a Q4_0 / Q8_0 block's scale is an
/// f16): an error naming the tensor and the first value that is not.
fn f16_scales(t: &str, d: Dtype, bytes: &[u8]) -> Result<Vec<f16>> {
    let dt = super::checkpoint::dtype_of(d).expect("a float dtype");
    super::host::to_f32(bytes, dt)
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let h = f16::from_f32(v);
            match h.to_f32() == v {
                true => Ok(h),
                false => Err(Error::Weights {
                    tensor: t.to_string(),
                    what: format!(
                        "holds {v} at {i}, which an f16 scale cannot hold exactly (encore \
                         keeps these weights as blocks of f16 scales)"
                    ),
                }),
            }
        })
        .collect()
}

/// What one checkpoint tensor must be: an error naming it otherwise.
fn expect(t: &str, what: &str, d: Dtype, s: &[usize], want: &[usize], ok: bool) -> Result<()> {
    if s != want || !ok {
        return Err(Error::Weights {
            tensor: t.to_string(),
            what: format!("has {d:?} {s:?}, expected {want:?} ({what})"),
        });
    }
    Ok(())
}

impl PackedIntWeight {
    /// Projection `name` (`P.weight` in the declaration) of `shape` `[rows, cols]` from
    /// its packed tensors, or `None` when the checkpoint has no packed `P`. Shapes, dtypes
    /// and the packing (symmetric, groups in column order, or in act order for the
    /// projections [`act_ordered`] names, their columns in `range` sorted by group) are
    /// checked; a failure names the tensor. With `unpack` false only the checks run (the
    /// codes are left empty).
    pub(super) fn read(
        ck: &Checkpoint,
        g: IntPacking,
        name: &str,
        shape: &[usize],
        range: Option<std::ops::Range<usize>>,
        unpack: bool,
    ) -> Result<Option<PackedIntWeight>> {
        let Some(base) = name.strip_suffix(".weight") else {
            return Ok(None);
        };
        let (packed_name, scheme) = g.scheme.packed_tensor(base);
        let Some((pk_dtype, pk_shape, pk_bytes)) = ck.raw(&packed_name) else {
            return Ok(None);
        };
        let err = |tensor: &str, what: String| Error::Weights {
            tensor: tensor.to_string(),
            what,
        };
        let (rows, cols) = match shape {
            [r, c] => (*r, *c),
            _ => {
                return Err(err(
                    name,
                    format!("is {scheme}-packed but declared {shape:?}"),
                ))
            }
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
                    "has {cols} columns: {scheme} groups of {group} in whole blocks of {BLOCK} \
                     are needed"
                ),
            ));
        }
        let groups = cols / group;
        let range = range.unwrap_or(0..cols);
        let sorted = g.act_order && act_ordered(name);
        // Act order's permutation and the group of each block (column order by default).
        let mut perm = None;
        let mut block_group: Vec<usize> = (0..cols / BLOCK).map(|b| b * BLOCK / group).collect();
        let what = format!("{scheme}, {bits} bits");
        let missing = |t: &str| {
            err(
                t,
                format!("is missing (the packed `{packed_name}` needs it)"),
            )
        };
        let get = |part: &str| {
            let t = format!("{base}.{part}");
            ck.raw(&t).map(|r| (t, r))
        };
        let column_order = |t: &str, bytes: &[u8]| -> Result<()> {
            match words(bytes)
                .iter()
                .enumerate()
                .position(|(c, &gi)| gi as usize != c / group)
            {
                None => Ok(()),
                Some(c) => Err(err(
                    t,
                    format!(
                        "puts column {c} outside group {} (groups in activation order run for \
                         a dense layer's q/k/v, o, gate/up and down projections under GPTQ's \
                         desc_act, not here)",
                        c / group
                    ),
                )),
            }
        };
        let zero = 1u8 << (bits - 1);
        let pk_want = match g.scheme {
            IntScheme::Gptq { .. } => [cols / per_word, rows],
            IntScheme::PackQuantized => [rows, cols.div_ceil(per_word)],
            IntScheme::Awq => [cols, rows / per_word],
        };
        if g.scheme == IntScheme::Awq && !rows.is_multiple_of(per_word) {
            return Err(err(
                name,
                format!("has {rows} rows: AWQ packs outputs {per_word} a word"),
            ));
        }
        let pk_int = is_int(pk_dtype);
        expect(&packed_name, &what, pk_dtype, &pk_shape, &pk_want, pk_int)?;
        let mut codes = vec![0u8; if unpack { rows * cols } else { 0 }];
        let mut zeros = None;
        // GPTQ's and AWQ's `scales` ([groups, rows], f16) and `qzeros` ([groups, zw] words),
        // checked: the scales and the zero words' bytes.
        let scales_and_qzeros = |zw: usize| -> Result<(Vec<f16>, String, &[u8])> {
            let scales = format!("{base}.scales");
            let (sc_dtype, sc_shape, sc_bytes) = ck.raw(&scales).ok_or_else(|| missing(&scales))?;
            let ok = is_float(sc_dtype);
            expect(&scales, &what, sc_dtype, &sc_shape, &[groups, rows], ok)?;
            let qzeros = format!("{base}.qzeros");
            let (qz_dtype, qz_shape, qz_bytes) = ck.raw(&qzeros).ok_or_else(|| missing(&qzeros))?;
            let qz_ok = is_int(qz_dtype);
            expect(&qzeros, &what, qz_dtype, &qz_shape, &[groups, zw], qz_ok)?;
            Ok((f16_scales(&scales, sc_dtype, sc_bytes)?, qzeros, qz_bytes))
        };
        let scales: Vec<f16> = match g.scheme {
            IntScheme::Gptq { zeros_minus_one } => {
                let zw = rows.div_ceil(per_word);
                let (scales, qzeros, qz_bytes) = scales_and_qzeros(zw)?;
                if let Some((t, (d, s, b))) = get("g_idx") {
                    expect(&t, &what, d, &s, &[cols], is_int(d))?;
                    match sorted {
                        true => {
                            let (p, bg) = sort_by_group(&t, &words(b), groups, range.clone())?;
                            (perm, block_group) = (Some(p), bg);
                        }
                        false => column_order(&t, b)?,
                    }
                }
                // Word (g, j) holds rows j * per_word .. of group g.
                let zs = zero_grid(qz_bytes, bits, groups, rows, |i, s| {
                    (i / zw, (i % zw) * per_word + s)
                });
                if g.zero_points {
                    // v1 stores each zero minus one (as GPTQModel converts v1 to v2, modulo
                    // 2^bits).
                    let one = zeros_minus_one as u8;
                    let mask = ((1u16 << bits) - 1) as u8;
                    zeros = Some(zs.iter().map(|&z| z.wrapping_add(one) & mask).collect());
                } else {
                    symmetric_zeros(&qzeros, &zs, rows, zero - zeros_minus_one as u8)?;
                }
                if unpack {
                    // Word (j, r) holds columns j * per_word .. of row r.
                    each_slot(pk_bytes, bits, |i, s, q| {
                        codes[(i % rows) * cols + (i / rows) * per_word + s] = q;
                    });
                }
                scales
            }
            IntScheme::Awq => {
                let ow = rows / per_word;
                let (scales, _, qz_bytes) = scales_and_qzeros(ow)?;
                // Word (i, j) holds outputs 8j + AWQ_ORDER[s] of input i (qweight) or of
                // group i (qzeros).
                let out = |i: usize, s: usize| (i % ow) * per_word + AWQ_ORDER[s];
                zeros = Some(zero_grid(qz_bytes, bits, groups, rows, |i, s| {
                    (i / ow, out(i, s))
                }));
                if unpack {
                    each_slot(pk_bytes, bits, |i, s, q| {
                        codes[out(i, s) * cols + i / ow] = q
                    });
                }
                scales
            }
            IntScheme::PackQuantized => {
                // `[ceil(rows / per_word), groups]`, packed along the rows (low bits
                // first, offset by 2^(bits-1) as the codes are): required with zero points,
                // else every one must be the symmetric zero.
                let zp = get("weight_zero_point");
                if g.zero_points && zp.is_none() {
                    let t = format!("{base}.weight_zero_point");
                    return Err(missing(&t));
                }
                if let Some((t, (d, sh, b))) = zp {
                    let zr = rows.div_ceil(per_word);
                    expect(&t, &what, d, &sh, &[zr, groups], is_int(d))?;
                    let zs = zero_grid(b, bits, groups, rows, |i, s| {
                        (i % groups, (i / groups) * per_word + s)
                    });
                    match g.zero_points {
                        true => zeros = Some(zs),
                        false => symmetric_zeros(&t, &zs, rows, zero)?,
                    }
                }
                if let Some((t, (d, s, b))) = get("weight_g_idx") {
                    expect(&t, &what, d, &s, &[cols], is_int(d))?;
                    column_order(&t, b)?;
                }
                if let Some((t, (d, _, b))) = get("weight_shape") {
                    let dims: Vec<u64> = match d {
                        Dtype::I64 => b
                            .chunks_exact(8)
                            .map(|x| u64::from_le_bytes(x.try_into().expect("8 bytes")))
                            .collect(),
                        _ => words(b).iter().map(|&x| x as u64).collect(),
                    };
                    if dims != [rows as u64, cols as u64] {
                        return Err(err(&t, format!("is {dims:?}, expected [{rows}, {cols}]")));
                    }
                }
                let scale = format!("{base}.weight_scale");
                let (sc_dtype, sc_shape, sc_bytes) =
                    ck.raw(&scale).ok_or_else(|| missing(&scale))?;
                let float = is_float(sc_dtype);
                expect(&scale, &what, sc_dtype, &sc_shape, &[rows, groups], float)?;
                // Stored [rows, groups]; kept [groups, rows] as GPTQ's.
                let stored = f16_scales(&scale, sc_dtype, sc_bytes)?;
                let mut scales = vec![f16::ZERO; rows * groups];
                for (i, h) in stored.into_iter().enumerate() {
                    scales[(i % groups) * rows + i / groups] = h;
                }
                if unpack {
                    // Word (r, j) holds columns j * per_word .. of row r.
                    let wpr = cols.div_ceil(per_word);
                    each_slot(pk_bytes, bits, |i, s, q| {
                        let c = (i % wpr) * per_word + s;
                        if c < cols {
                            codes[(i / wpr) * cols + c] = q;
                        }
                    });
                }
                scales
            }
        };
        if let (Some(p), true) = (&perm, unpack) {
            // Each row's columns in act order's order.
            let mut row = vec![0u8; cols];
            for r in codes.chunks_exact_mut(cols.max(1)) {
                row.copy_from_slice(r);
                for (o, &c) in r.iter_mut().zip(p) {
                    *o = row[c];
                }
            }
        }
        Ok(Some(PackedIntWeight {
            rows,
            cols,
            bits: g.bits,
            format: g.kept_as(),
            codes,
            scales,
            zeros,
            block_group,
            perm,
            range,
        }))
    }

    /// Act order's permutation of this rank's columns (`range`) as the forward gathers
    /// them: entry `j` the input column (within the share) that the weight's column
    /// `range.start + j` multiplies. `None` without act order (the file's order).
    pub(super) fn perm(&self) -> Option<Vec<i32>> {
        let p = self.perm.as_ref()?;
        let r = &self.range;
        Some(p[r.clone()].iter().map(|&c| (c - r.start) as i32).collect())
    }

    fn scale(&self, row: usize, col: usize) -> f16 {
        self.scales[self.block_group[col / BLOCK] * self.rows + row]
    }

    fn zero(&self, row: usize, col: usize) -> i32 {
        match &self.zeros {
            Some(z) => z[self.block_group[col / BLOCK] * self.rows + row] as i32,
            None => 1 << (self.bits - 1),
        }
    }

    /// The code of `(row, col)` minus the zero point: -2^bits .. 2^bits.
    fn centred(&self, row: usize, col: usize) -> i32 {
        self.codes[row * self.cols + col] as i32 - self.zero(row, col)
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

    /// The format the packing is kept as: Q4_0 (4 bits), Q8_0 (8), Q4_1 (zero points).
    pub(super) fn format(&self) -> QuantFormat {
        self.format
    }

    /// GGUF blocks of [`PackedIntWeight::format`], row-major: per 32 columns the f16 scale,
    /// then Q4_0's 16 bytes (column t in the low nibble of byte t, column t + 16 in its
    /// high nibble, each as code - zero + 8, i.e. the code), Q8_0's 32 signed bytes, or
    /// Q4_1's f16 `m = -scale * zero` (rounded to f16) and the 16 bytes of codes.
    pub(super) fn blocks(&self) -> Vec<u8> {
        let fmt = self.format();
        let mut out = Vec::with_capacity(self.rows * self.cols / BLOCK * fmt.block_bytes());
        for r in 0..self.rows {
            for b in (0..self.cols).step_by(BLOCK) {
                let d = self.scale(r, b);
                out.extend_from_slice(&d.to_le_bytes());
                match fmt {
                    QuantFormat::Q4_1 => {
                        let m = -d.to_f32() * self.zero(r, b) as f32;
                        out.extend_from_slice(&f16::from_f32(m).to_le_bytes());
                        let code = |c: usize| self.codes[r * self.cols + c];
                        out.extend(
                            (0..BLOCK / 2).map(|t| code(b + t) | (code(b + t + BLOCK / 2) << 4)),
                        );
                    }
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
