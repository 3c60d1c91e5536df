//! Persistent step inputs, declared once. [`step_inputs!`](crate::step_inputs) turns one
//! list of fields (name, element type, which rows, row width, padding value) into the
//! field table, a struct of typed device views and a struct of typed host slices; the
//! [`InputTable`] holds the one device allocation (sized for the largest step), the host
//! staging the step is packed into, and the single host-to-device copy per step.
//!
//! A [`Layout`] places every field at a fixed offset for a step *capacity* of `(tokens,
//! seqs)` rows: fields are packed back to back (256-byte aligned) for exactly that many
//! rows. A captured graph reads the views of its bucket's layout; a step that fills fewer
//! rows than the capacity (a mixed step with fewer sequences than its token bucket allows)
//! writes the same offsets, pads the rest ([`InputTable::pad`]) and uploads only up to the
//! end of what is read ([`InputTable::upload`]), so pieces captured once read the right
//! bytes for any split of a bucket's tokens into sequences.

use crate::backend::{Backend, HostStaging};
use crate::error::{Error, Result};
use crate::memory::ARENA_ALIGN;
use crate::tensor::{DType, Tensor};

/// How many rows a field has in a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// One per token of the step.
    Tokens,
    /// One per sequence.
    Seqs,
    /// One per sequence, plus one (`cu_seqlens`).
    SeqsPlusOne,
}

/// Elements per row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    One,
    /// The block-table width (blocks per sequence).
    Table,
}

/// One declared input.
#[derive(Clone, Copy, Debug)]
pub struct Field {
    pub name: &'static str,
    pub dtype: DType,
    pub rows: Rows,
    pub width: Width,
    /// The value of every row a step does not fill (exact in f64 for every declared type).
    pub pad: f64,
}

impl Field {
    fn rows_for(&self, tokens: usize, seqs: usize) -> usize {
        match self.rows {
            Rows::Tokens => tokens,
            Rows::Seqs => seqs,
            Rows::SeqsPlusOne => seqs + 1,
        }
    }
}

/// Declare a step's inputs once:
///
/// ```ignore
/// step_inputs! {
///     pub struct Views, Host {
///         /// doc
///         token_ids: i32 [Tokens, One] = 0,
///         block_tables: i32 [Seqs, Table] = 0,
///     }
/// }
/// ```
///
/// gives `Views::FIELDS` (the table for [`InputTable::new`]), `Views::of(&table, &layout)`
/// (a device view per field, the layout's full capacity of rows) and
/// `Host::of(&mut table, &layout)` (a typed mutable slice per field over the host staging).
#[macro_export]
macro_rules! step_inputs {
    (
        $(#[$sm:meta])*
        $vis:vis struct $Views:ident, $Host:ident {
            $( $(#[$fm:meta])* $f:ident : $ty:ty [$rows:ident, $width:ident] = $pad:expr ),* $(,)?
        }
    ) => {
        $(#[$sm])*
        $vis struct $Views {
            $( $(#[$fm])* pub $f: $crate::tensor::Tensor, )*
        }

        impl $Views {
            pub const FIELDS: &'static [$crate::graph::Field] = &[
                $( $crate::graph::Field {
                    name: stringify!($f),
                    dtype: <$ty as $crate::tensor::Element>::DTYPE,
                    rows: $crate::graph::Rows::$rows,
                    width: $crate::graph::Width::$width,
                    pad: $pad as f64,
                }, )*
            ];

            /// The view of each field in layout `l` (all of its capacity's rows).
            pub fn of(
                table: &$crate::graph::InputTable,
                l: &$crate::graph::Layout,
            ) -> $crate::error::Result<Self> {
                let mut _i = 0usize;
                $( let $f = table.view(l, _i)?; _i += 1; )*
                Ok($Views { $( $f, )* })
            }
        }

        /// Host staging of every step input, typed (see `graph::inputs`).
        $vis struct $Host<'a> {
            $( $(#[$fm])* pub $f: &'a mut [$ty], )*
        }

        impl<'a> $Host<'a> {
            /// The host slices of layout `l`; write a step here, then pad and upload.
            pub fn of(
                table: &'a mut $crate::graph::InputTable,
                l: &$crate::graph::Layout,
            ) -> $crate::error::Result<Self> {
                let mut rest: &'a mut [u8] = table.staging_mut(l)?;
                let mut _at = 0usize;
                let mut _i = 0usize;
                $(
                    let (_, tail) = rest.split_at_mut(l.offset(_i) - _at);
                    let (mine, tail) = tail.split_at_mut(l.field_bytes(_i));
                    rest = tail;
                    _at = l.offset(_i) + l.field_bytes(_i);
                    let $f: &'a mut [$ty] = $crate::graph::inputs::cast_host(mine, stringify!($f))?;
                    _i += 1;
                )*
                let _ = rest;
                Ok($Host { $( $f, )* })
            }
        }
    };
}

/// Reinterpret staging bytes as a typed slice (offsets are 256-byte aligned, so this only
/// fails for a misaligned staging allocation).
pub fn cast_host<'a, T: bytemuck::Pod>(bytes: &'a mut [u8], name: &str) -> Result<&'a mut [T]> {
    bytemuck::try_cast_slice_mut(bytes).map_err(|e| {
        Error::invalid(
            "InputTable",
            format!("host staging of `{name}` cannot be typed: {e}"),
        )
    })
}

/// Where each field of one step capacity lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Token and sequence rows of the capacity.
    pub tokens: usize,
    pub seqs: usize,
    offsets: Vec<usize>,
    shapes: Vec<Vec<usize>>,
    dtypes: Vec<DType>,
    /// Bytes of the whole layout.
    pub bytes: usize,
}

impl Layout {
    /// Byte offset of field `i`.
    pub fn offset(&self, i: usize) -> usize {
        self.offsets[i]
    }

    /// Shape of field `i` at full capacity.
    pub fn shape(&self, i: usize) -> &[usize] {
        &self.shapes[i]
    }

    fn elems(&self, i: usize) -> usize {
        self.shapes[i].iter().product()
    }

    /// Bytes of field `i` at full capacity.
    pub fn field_bytes(&self, i: usize) -> usize {
        self.elems(i) * self.dtypes[i].size()
    }
}

/// The device buffer and host staging of a field table.
pub struct InputTable {
    fields: &'static [Field],
    table_width: usize,
    device: Tensor,
    staging: HostStaging,
}

impl InputTable {
    /// Allocate for steps of up to `max_tokens` tokens and `max_seqs` sequences.
    pub fn new(
        be: &dyn Backend,
        fields: &'static [Field],
        max_tokens: usize,
        max_seqs: usize,
        table_width: usize,
    ) -> Result<Self> {
        let mut t = InputTable {
            fields,
            table_width,
            device: be.alloc(DType::I32, &[1])?,
            staging: HostStaging::heap(0),
        };
        let max = t.layout(max_tokens, max_seqs);
        t.device = be.alloc(DType::I32, &[max.bytes.div_ceil(4).max(1)])?;
        t.staging = be.alloc_staging(max.bytes)?;
        Ok(t)
    }

    /// Bytes the table needs for steps of up to `max_tokens` / `max_seqs` (device and
    /// host staging each), without allocating.
    pub fn bytes_for(
        fields: &[Field],
        max_tokens: usize,
        max_seqs: usize,
        table_width: usize,
    ) -> usize {
        fields
            .iter()
            .map(|f| {
                let w = match f.width {
                    Width::One => 1,
                    Width::Table => table_width,
                };
                f.rows_for(max_tokens, max_seqs)
                    .saturating_mul(w)
                    .saturating_mul(f.dtype.size())
                    .saturating_add(ARENA_ALIGN)
            })
            .fold(0usize, usize::saturating_add)
    }

    /// The layout of a step capacity of `tokens` tokens and `seqs` sequences.
    pub fn layout(&self, tokens: usize, seqs: usize) -> Layout {
        let n = self.fields.len();
        let (mut offsets, mut shapes, mut dtypes) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let mut at = 0usize;
        for f in self.fields {
            let rows = f.rows_for(tokens, seqs);
            let shape = match f.width {
                Width::One => vec![rows],
                Width::Table => vec![rows, self.table_width],
            };
            let bytes = shape.iter().product::<usize>() * f.dtype.size();
            offsets.push(at);
            shapes.push(shape);
            dtypes.push(f.dtype);
            at = (at + bytes).next_multiple_of(ARENA_ALIGN);
        }
        Layout {
            tokens,
            seqs,
            offsets,
            shapes,
            dtypes,
            bytes: at,
        }
    }

    fn check_fits(&self, l: &Layout) -> Result<()> {
        if l.bytes > self.staging.len() {
            return Err(Error::invalid(
                "InputTable",
                format!(
                    "a step of {} tokens / {} sequences needs {} bytes of inputs, the table holds {}",
                    l.tokens,
                    l.seqs,
                    l.bytes,
                    self.staging.len()
                ),
            ));
        }
        Ok(())
    }

    /// The host staging bytes of layout `l` (what [`step_inputs!`](crate::step_inputs)'
    /// host struct splits into fields). Waits for the previous upload to finish reading.
    pub fn staging_mut(&mut self, l: &Layout) -> Result<&mut [u8]> {
        self.check_fits(l)?;
        Ok(&mut self.staging.bytes_mut()?[..l.bytes])
    }

    /// Fill every row a step of `tokens` tokens and `seqs` sequences leaves unused with
    /// its field's padding value.
    pub fn pad(&mut self, l: &Layout, tokens: usize, seqs: usize) -> Result<()> {
        if tokens > l.tokens || seqs > l.seqs {
            return Err(Error::invalid(
                "InputTable::pad",
                format!(
                    "{tokens} tokens / {seqs} sequences exceed the layout's {} / {}",
                    l.tokens, l.seqs
                ),
            ));
        }
        let fields = self.fields;
        let table_width = self.table_width;
        let bytes = self.staging_mut(l)?;
        for (i, f) in fields.iter().enumerate() {
            let width = match f.width {
                Width::One => 1,
                Width::Table => table_width,
            };
            let used = f.rows_for(tokens, seqs) * width;
            let field = &mut bytes[l.offset(i)..l.offset(i) + l.field_bytes(i)];
            match f.dtype {
                DType::I32 => cast_host::<i32>(field, f.name)?[used..].fill(f.pad as i32),
                DType::I64 => cast_host::<i64>(field, f.name)?[used..].fill(f.pad as i64),
                DType::F32 => cast_host::<f32>(field, f.name)?[used..].fill(f.pad as f32),
                other => {
                    return Err(Error::invalid(
                        "InputTable::pad",
                        format!(
                            "field `{}` has dtype {other}, not a step-input type",
                            f.name
                        ),
                    ))
                }
            }
        }
        Ok(())
    }

    /// One host-to-device copy of layout `l`, up to the end of the rows a step of
    /// `tokens` tokens and `seqs` sequences reads in the *last* field (every earlier field
    /// goes up whole): with the widest field last, a small step does not upload a
    /// bucket's worth of block tables. An asynchronous DMA from page-locked staging on
    /// CUDA; the next `staging_mut` waits for it.
    pub fn upload(
        &mut self,
        be: &dyn Backend,
        l: &Layout,
        tokens: usize,
        seqs: usize,
    ) -> Result<()> {
        self.check_fits(l)?;
        let end = self.upload_end(l, tokens, seqs);
        let dst = self.device.view_as(DType::I32, &[end / 4])?;
        be.upload_staging(&mut self.staging, &dst)
    }

    /// The staging bytes [`InputTable::upload`] of `l` for `tokens` and `seqs` sends
    /// (what another rank of a tensor-parallel group loads with [`InputTable::load`]).
    pub fn staged(&mut self, l: &Layout, tokens: usize, seqs: usize) -> Result<&[u8]> {
        self.check_fits(l)?;
        let end = self.upload_end(l, tokens, seqs);
        Ok(&self.staging_mut(l)?[..end])
    }

    /// Put `bytes` (another table's [`InputTable::staged`] of the same layout) into the
    /// staging and upload them.
    pub fn load(&mut self, be: &dyn Backend, l: &Layout, bytes: &[u8]) -> Result<()> {
        let staging = self.staging_mut(l)?;
        if bytes.len() > staging.len() || !bytes.len().is_multiple_of(4) {
            return Err(Error::invalid(
                "step inputs",
                format!(
                    "{} bytes do not fit the layout's {}",
                    bytes.len(),
                    staging.len()
                ),
            ));
        }
        staging[..bytes.len()].copy_from_slice(bytes);
        let dst = self.device.view_as(DType::I32, &[bytes.len() / 4])?;
        be.upload_staging(&mut self.staging, &dst)
    }

    /// Where the upload of `l` for `tokens` and `seqs` ends: past the last field's rows
    /// in use (the fields before it are sent whole).
    fn upload_end(&self, l: &Layout, tokens: usize, seqs: usize) -> usize {
        let last = self.fields.len() - 1;
        let f = self.fields[last];
        let per_row = l.field_bytes(last) / l.shape(last)[0].max(1);
        let rows = f.rows_for(tokens, seqs).min(l.shape(last)[0]);
        (l.offset(last) + rows * per_row)
            .next_multiple_of(4)
            .min(l.bytes)
    }

    /// The device view of field `i` in layout `l` (its full capacity).
    pub fn view(&self, l: &Layout, i: usize) -> Result<Tensor> {
        self.check_fits(l)?;
        let f = self.fields[i];
        Tensor::new(
            self.device.storage().clone(),
            self.device.offset() + l.offsets[i],
            &l.shapes[i],
            f.dtype,
        )
    }

    /// Bytes of the device buffer (and of the host staging).
    pub fn capacity(&self) -> usize {
        self.staging.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;

    crate::step_inputs! {
        struct Views, Host {
            ids: i32 [Tokens, One] = 0,
            cu: i32 [SeqsPlusOne, One] = 0,
            seeds: i64 [Seqs, One] = 7,
            temp: f32 [Seqs, One] = 1.5,
            /// The widest field last.
            tables: i32 [Seqs, Table] = -1,
        }
    }

    #[test]
    fn one_upload_fills_every_view() {
        let cpu = CpuBackend::new();
        let be: &dyn Backend = &cpu;
        let mut t = InputTable::new(be, Views::FIELDS, 64, 8, 5).unwrap();
        let l = t.layout(6, 3);
        assert_eq!(l.bytes, 5 * ARENA_ALIGN);
        {
            let h = Host::of(&mut t, &l).unwrap();
            h.ids.copy_from_slice(&[1, 2, 3, 4, 5, 6]);
            h.tables
                .iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = i as i32);
            h.cu.copy_from_slice(&[0, 2, 5, 6]);
            h.seeds.copy_from_slice(&[-1, 7, 1 << 40]);
            h.temp.copy_from_slice(&[0.5, 1.0, 2.0]);
        }
        t.upload(be, &l, 6, 3).unwrap();
        let v = Views::of(&t, &l).unwrap();
        assert_eq!(be.download::<i32>(&v.ids).unwrap(), vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(v.tables.shape(), &[3, 5]);
        assert_eq!(
            be.download::<i32>(&v.tables).unwrap(),
            (0..15).collect::<Vec<_>>()
        );
        assert_eq!(be.download::<i32>(&v.cu).unwrap(), vec![0, 2, 5, 6]);
        assert_eq!(be.download::<i64>(&v.seeds).unwrap(), vec![-1, 7, 1 << 40]);
        assert_eq!(be.download::<f32>(&v.temp).unwrap(), vec![0.5, 1.0, 2.0]);
        // Layouts depend only on the capacity; a larger one moves the later fields.
        assert_eq!(t.layout(6, 3), l);
        assert_eq!(l.offset(1), ARENA_ALIGN);
        assert_eq!(t.layout(70, 3).offset(1), 2 * ARENA_ALIGN);
    }

    #[test]
    fn a_partly_filled_capacity_pads_and_uploads_what_is_read() {
        let cpu = CpuBackend::new();
        let be: &dyn Backend = &cpu;
        let mut t = InputTable::new(be, Views::FIELDS, 16, 4, 3).unwrap();
        let l = t.layout(16, 4);
        // Poison the device, then fill 5 tokens of 2 sequences.
        {
            let h = Host::of(&mut t, &l).unwrap();
            h.tables.fill(99);
            h.ids.fill(99);
        }
        t.upload(be, &l, 16, 4).unwrap();
        {
            let h = Host::of(&mut t, &l).unwrap();
            h.ids[..5].copy_from_slice(&[1, 2, 3, 4, 5]);
            h.cu[..3].copy_from_slice(&[0, 3, 5]);
            h.tables[..6].copy_from_slice(&[1, 2, 3, 4, 5, 6]);
        }
        t.pad(&l, 5, 2).unwrap();
        t.upload(be, &l, 5, 2).unwrap();
        let v = Views::of(&t, &l).unwrap();
        let ids = be.download::<i32>(&v.ids).unwrap();
        assert_eq!(&ids[..6], &[1, 2, 3, 4, 5, 0]);
        assert!(ids[5..].iter().all(|&x| x == 0));
        assert_eq!(be.download::<i32>(&v.cu).unwrap(), vec![0, 3, 5, 0, 0]);
        assert_eq!(be.download::<i64>(&v.seeds).unwrap()[2..], [7, 7]);
        assert_eq!(be.download::<f32>(&v.temp).unwrap()[2..], [1.5, 1.5]);
        // The last field went up only for the 2 sequences read: the rest is stale.
        let tables = be.download::<i32>(&v.tables).unwrap();
        assert_eq!(&tables[..6], &[1, 2, 3, 4, 5, 6]);
        assert_eq!(&tables[6..], &[99; 6]);
        assert!(t.pad(&l, 17, 2).is_err());
    }

    #[test]
    fn misuse_is_an_error() {
        let cpu = CpuBackend::new();
        let mut t = InputTable::new(&cpu, Views::FIELDS, 4, 2, 3).unwrap();
        let big = t.layout(400, 2);
        assert!(t
            .upload(&cpu, &big, 400, 2)
            .unwrap_err()
            .to_string()
            .contains("needs"));
        assert!(Host::of(&mut t, &big).is_err());
        assert!(Views::of(&t, &big).is_err());
        assert!(
            InputTable::bytes_for(Views::FIELDS, 4, 2, 3) >= t.capacity(),
            "the estimate covers the allocation"
        );
    }
}
