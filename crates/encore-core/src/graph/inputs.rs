//! Persistent step inputs, declared once. A table of [`Field`]s (name, dtype, which rows,
//! row width) drives everything: the one device allocation (sized for the largest step),
//! the per-step layout, the host staging bytes the step is packed into, the single
//! host-to-device copy per step, and the tensor views a step (or a bucket's graph) reads.
//!
//! The layout depends only on the step's shape `(tokens, seqs)`: fields are packed back to
//! back (256-byte aligned) for exactly that many rows, so one copy of `layout.bytes`
//! uploads everything a step needs and nothing more. A bucket's graph is captured with the
//! views of its own layout, and every replay writes the same layout again. Adding an
//! input is one line in the table.

use crate::backend::{Backend, HostStaging};
use crate::error::{Error, Result};
use crate::memory::ARENA_ALIGN;
use crate::tensor::{DType, Element, Tensor};

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
}

/// Where each field of one step shape lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub tokens: usize,
    pub seqs: usize,
    offsets: Vec<usize>,
    shapes: Vec<Vec<usize>>,
    /// Bytes to upload for this step.
    pub bytes: usize,
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

    /// The layout of a step with `tokens` tokens and `seqs` sequences.
    pub fn layout(&self, tokens: usize, seqs: usize) -> Layout {
        let mut offsets = Vec::with_capacity(self.fields.len());
        let mut shapes = Vec::with_capacity(self.fields.len());
        let mut at = 0usize;
        for f in self.fields {
            let rows = match f.rows {
                Rows::Tokens => tokens,
                Rows::Seqs => seqs,
                Rows::SeqsPlusOne => seqs + 1,
            };
            let shape = match f.width {
                Width::One => vec![rows],
                Width::Table => vec![rows, self.table_width],
            };
            let bytes = shape.iter().product::<usize>() * f.dtype.size();
            offsets.push(at);
            shapes.push(shape);
            at = (at + bytes).next_multiple_of(ARENA_ALIGN);
        }
        Layout {
            tokens,
            seqs,
            offsets,
            shapes,
            bytes: at,
        }
    }

    fn index(&self, name: &str) -> Result<usize> {
        self.fields
            .iter()
            .position(|f| f.name == name)
            .ok_or_else(|| Error::invalid("InputTable", format!("no input named `{name}`")))
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

    /// The host staging of field `name` in layout `l`, typed; write the step's values here.
    pub fn host_mut<T: Element>(&mut self, l: &Layout, name: &str) -> Result<&mut [T]> {
        self.check_fits(l)?;
        let i = self.index(name)?;
        let f = self.fields[i];
        if f.dtype != T::DTYPE {
            return Err(Error::DType {
                op: "InputTable::host_mut",
                name: f.name,
                found: T::DTYPE,
                expected: f.dtype.to_string(),
            });
        }
        let n: usize = l.shapes[i].iter().product();
        let bytes = &mut self.staging.bytes_mut()?[l.offsets[i]..l.offsets[i] + n * f.dtype.size()];
        Ok(bytemuck::cast_slice_mut(bytes))
    }

    /// One host-to-device copy of the whole step (an asynchronous DMA from page-locked
    /// staging on CUDA; the next `host_mut` waits for it).
    pub fn upload(&mut self, be: &dyn Backend, l: &Layout) -> Result<()> {
        self.check_fits(l)?;
        let dst = self.device.view_as(DType::I32, &[l.bytes / 4])?;
        be.upload_staging(&mut self.staging, &dst)
    }

    /// The device view of field `name` in layout `l`.
    pub fn view(&self, l: &Layout, name: &str) -> Result<Tensor> {
        self.check_fits(l)?;
        let i = self.index(name)?;
        let f = self.fields[i];
        Tensor::new(
            self.device.storage().clone(),
            self.device.offset() + l.offsets[i],
            &l.shapes[i],
            f.dtype,
        )
    }

    /// Device bytes allocated.
    pub fn capacity(&self) -> usize {
        self.staging.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;

    const FIELDS: &[Field] = &[
        Field {
            name: "ids",
            dtype: DType::I32,
            rows: Rows::Tokens,
            width: Width::One,
        },
        Field {
            name: "tables",
            dtype: DType::I32,
            rows: Rows::Seqs,
            width: Width::Table,
        },
        Field {
            name: "cu",
            dtype: DType::I32,
            rows: Rows::SeqsPlusOne,
            width: Width::One,
        },
        Field {
            name: "seeds",
            dtype: DType::I64,
            rows: Rows::Seqs,
            width: Width::One,
        },
    ];

    #[test]
    fn one_upload_fills_every_view() {
        let cpu = CpuBackend::new();
        let be: &dyn Backend = &cpu;
        let mut t = InputTable::new(be, FIELDS, 64, 8, 5).unwrap();
        let l = t.layout(6, 3);
        assert_eq!(l.bytes, 4 * ARENA_ALIGN);
        t.host_mut::<i32>(&l, "ids")
            .unwrap()
            .copy_from_slice(&[1, 2, 3, 4, 5, 6]);
        t.host_mut::<i32>(&l, "tables")
            .unwrap()
            .iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = i as i32);
        t.host_mut::<i32>(&l, "cu")
            .unwrap()
            .copy_from_slice(&[0, 2, 5, 6]);
        t.host_mut::<i64>(&l, "seeds")
            .unwrap()
            .copy_from_slice(&[-1, 7, 1 << 40]);
        t.upload(be, &l).unwrap();
        assert_eq!(
            be.download::<i32>(&t.view(&l, "ids").unwrap()).unwrap(),
            vec![1, 2, 3, 4, 5, 6]
        );
        let tables = t.view(&l, "tables").unwrap();
        assert_eq!(tables.shape(), &[3, 5]);
        assert_eq!(
            be.download::<i32>(&tables).unwrap(),
            (0..15).collect::<Vec<_>>()
        );
        assert_eq!(
            be.download::<i32>(&t.view(&l, "cu").unwrap()).unwrap(),
            vec![0, 2, 5, 6]
        );
        assert_eq!(
            be.download::<i64>(&t.view(&l, "seeds").unwrap()).unwrap(),
            vec![-1, 7, 1 << 40]
        );
        // Layouts depend only on the shape; a larger shape moves the later fields.
        assert_eq!(t.layout(6, 3), l);
        assert_eq!(l.offsets[1], ARENA_ALIGN);
        assert_eq!(t.layout(70, 3).offsets[1], 2 * ARENA_ALIGN);
    }

    #[test]
    fn misuse_is_an_error() {
        let cpu = CpuBackend::new();
        let mut t = InputTable::new(&cpu, FIELDS, 4, 2, 3).unwrap();
        let big = t.layout(400, 2);
        assert!(t
            .upload(&cpu, &big)
            .unwrap_err()
            .to_string()
            .contains("needs"));
        let l = t.layout(4, 2);
        assert!(t.host_mut::<f32>(&l, "ids").is_err());
        assert!(t
            .view(&l, "nope")
            .unwrap_err()
            .to_string()
            .contains("`nope`"));
    }
}
