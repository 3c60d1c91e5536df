//! The host side of an offloaded model's weights while they load: which parts are read in
//! place from registered checkpoint mappings and which are copied into page-locked memory,
//! and the views the executor reads them through.

use std::sync::Arc;

use super::host::Staging;
use super::{row_len, Source, TensorSpec};
use crate::backend::{Backend, HostMemory};
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use crate::model::decl::Decl;
use crate::offload::{HostPart, HostWeights, Place, Prepared};
use crate::progress::{Progress, Unit};
use crate::tensor::{DType, Tensor};

/// Where one part of a host-held weight goes.
#[derive(Clone, Copy)]
enum PartHome {
    /// Read in place from the registered mapping of checkpoint file `file`.
    InPlace { file: usize, offset: usize },
    /// Written at `offset` into the shared page-locked copy (streamed weights), or into
    /// the weight's own allocation (weights read in place, [`Place::Host`]).
    Copied { offset: usize },
}

/// The host side of the weights not resident on the device, while loading: page-locked
/// memory for parts that need writing, registered mappings for parts read in place.
#[derive(Default)]
pub(super) struct HostSide {
    /// Per weight, per part: where it goes (empty for resident weights).
    homes: Vec<Vec<PartHome>>,
    /// Per weight, per part: bytes.
    sizes: Vec<Vec<usize>>,
    /// Per weight: read in place by the device ([`Place::Host`]).
    host_read: Vec<bool>,
    /// The streamed weights' page-locked copy.
    copy: Option<HostMemory>,
    /// Per weight: the own allocation of a [`Place::Host`] weight that needs writing.
    own: Vec<Option<HostMemory>>,
    /// Checkpoint file and its registration.
    registered: Vec<(usize, Arc<HostMemory>)>,
    /// Memory behind the views handed out (own allocations, once filled).
    extra: Vec<Arc<HostMemory>>,
    views: Vec<Option<Tensor>>,
    registered_bytes: usize,
    copied_bytes: usize,
}

impl HostSide {
    pub(super) fn new(
        backend: &dyn Backend,
        decl: &Decl,
        source: &Source,
        dtype: DType,
        prepared: &Prepared,
        progress: &dyn Progress,
    ) -> Result<Self> {
        let merged = decl.tensors();
        if merged.len() != prepared.place.len() {
            return Err(Error::invalid(
                "weight offload",
                format!(
                    "the budget places {} weights, the model has {}",
                    prepared.place.len(),
                    merged.len()
                ),
            ));
        }
        let mut side = HostSide::default();
        let mut cursor = 0usize;
        let mut own_bytes = vec![0usize; merged.len()];
        let mut files = Vec::new();
        for (i, m) in merged.iter().enumerate() {
            let mut homes = Vec::new();
            let mut sizes = Vec::new();
            let host_read = matches!(prepared.place[i], Place::Host);
            if !matches!(prepared.place[i], Place::Device) {
                for (k, part) in m.parts.iter().enumerate() {
                    let bytes = m.part_bytes(k, dtype);
                    let in_place = match source {
                        // A weight read in place must be one range (a view): a
                        // tensor-parallel rank's block of whole rows is (from its first
                        // row), a block of columns is not and is copied.
                        Source::Checkpoint(ck)
                            if (!host_read || m.parts.len() == 1)
                                && ck.fp8(&part.name)?.is_none()
                                && ck.holds(&part.name) =>
                        {
                            let (d, file, range) = ck.location(&part.name)?;
                            let skip = match part.slice {
                                None => Some(0),
                                // (A padded vocabulary shard has rows past the file's.)
                                Some(s) if s.col == 0 && s.cols == row_len(part) && s.pad == 0 => {
                                    let rows = part.shape[0].max(1);
                                    Some(s.row * (range.len() / rows))
                                }
                                Some(_) => None,
                            };
                            match skip {
                                Some(skip) if d == m.dtype(dtype) => {
                                    Some((file, range.start + skip))
                                }
                                _ => None,
                            }
                        }
                        _ => None,
                    };
                    homes.push(match in_place {
                        Some((file, offset)) => {
                            if !files.contains(&file) {
                                files.push(file);
                            }
                            side.registered_bytes += bytes;
                            PartHome::InPlace { file, offset }
                        }
                        None if host_read => {
                            let offset = own_bytes[i];
                            own_bytes[i] += bytes;
                            PartHome::Copied { offset }
                        }
                        None => {
                            let offset = cursor;
                            cursor += bytes;
                            PartHome::Copied { offset }
                        }
                    });
                    sizes.push(bytes);
                }
            }
            side.homes.push(homes);
            side.sizes.push(sizes);
            side.host_read.push(host_read);
        }
        let owned: usize = own_bytes.iter().sum();
        side.copied_bytes = cursor + owned;
        side.lock_memory(backend, source, cursor, &own_bytes, files, progress)?;
        side.views = vec![None; merged.len()];
        Ok(side)
    }

    /// Allocate the page-locked copy (`cursor` bytes) and the own allocations
    /// (`own_bytes`), and register checkpoint `files` for reading in place.
    pub(super) fn lock_memory(
        &mut self,
        backend: &dyn Backend,
        source: &Source,
        cursor: usize,
        own_bytes: &[usize],
        files: Vec<usize>,
        progress: &dyn Progress,
    ) -> Result<()> {
        // Page-locking takes seconds for gigabytes (the driver touches every page; a
        // registered file is read from disk), so it shows as its own piece of work.
        let mapped: usize = match source {
            Source::Checkpoint(ck) => files.iter().map(|&f| ck.mapping(f).len()).sum(),
            _ => 0,
        };
        let bar = crate::progress::Guard::start(
            progress,
            "page-locking host memory for offloaded weights",
            (self.copied_bytes + mapped) as u64,
            Unit::Bytes,
        );
        let mut done = 0;
        if cursor > 0 {
            self.copy = Some(backend.alloc_host(cursor)?);
            done += cursor;
            bar.0.set(done as u64);
        }
        for &bytes in own_bytes {
            self.own.push(if bytes > 0 {
                done += bytes;
                let m = backend.alloc_host(bytes)?;
                bar.0.set(done as u64);
                Some(m)
            } else {
                None
            });
        }
        if let Source::Checkpoint(ck) = source {
            for file in files {
                done += ck.mapping(file).len();
                let mem =
                    backend
                        .register_host(ck.mapping(file))
                        .map_err(|e| Error::WeightsFile {
                            path: ck.file_name(file),
                            what: format!(
                                "could not be registered page-locked for weight offload: {e}"
                            ),
                        })?;
                self.registered.push((file, Arc::new(mem)));
                bar.0.set(done as u64);
            }
        }
        Ok(())
    }

    /// Write part `k` of host-held weight `i` into its page-locked copy (parts read in
    /// place only have their norms checked, as a device load would).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fill(
        &mut self,
        source: &Source,
        cfg: &ModelConfig,
        i: usize,
        k: usize,
        part: &TensorSpec,
        dtype: DType,
        staging: &mut Staging,
    ) -> Result<()> {
        let home = self.homes[i][k];
        let bytes = self.sizes[i][k];
        let target = if self.host_read[i] {
            &mut self.own[i]
        } else {
            &mut self.copy
        };
        source.with_bytes(cfg, part, dtype, staging, |src| {
            let PartHome::Copied { offset } = home else {
                return Ok(());
            };
            let dst = target
                .as_mut()
                .and_then(|c| c.bytes_mut())
                .and_then(|b| b.get_mut(offset..offset + bytes))
                .ok_or_else(|| {
                    Error::invalid("weight offload", "page-locked copy smaller than planned")
                })?;
            // A padded vocabulary shard: its rows, then zeros.
            if src.len() > dst.len() {
                return Err(Error::invalid(
                    "weight offload",
                    "page-locked copy smaller than planned",
                ));
            }
            let (head, pad) = dst.split_at_mut(src.len());
            head.copy_from_slice(src);
            pad.fill(0);
            Ok(())
        })
    }

    /// The tensor over host memory of [`Place::Host`] weight `i`, once filled.
    pub(super) fn view(
        &mut self,
        backend: &dyn Backend,
        i: usize,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Tensor> {
        let (mem, offset) = match self.homes[i].first() {
            Some(PartHome::InPlace { file, offset }) => {
                let mem = self
                    .registered
                    .iter()
                    .find(|(f, _)| f == file)
                    .map(|(_, m)| m.clone())
                    .expect("registered in new()");
                (mem, *offset)
            }
            _ => {
                let m = Arc::new(self.own[i].take().ok_or_else(|| {
                    Error::invalid("weight offload", "host-read weight has no memory")
                })?);
                self.extra.push(m.clone());
                (m, 0)
            }
        };
        let t = backend.host_view(&mem, offset, shape, dtype)?;
        self.views[i] = Some(t.clone());
        Ok(t)
    }

    pub(super) fn finish(self) -> HostWeights {
        let mut memory = Vec::new();
        let copy_index = self.copy.map(|c| {
            memory.push(Arc::new(c));
            memory.len() - 1
        });
        let mut file_index = std::collections::HashMap::new();
        for (file, mem) in self.registered {
            memory.push(mem);
            file_index.insert(file, memory.len() - 1);
        }
        memory.extend(self.extra);
        let parts = self
            .homes
            .iter()
            .zip(&self.sizes)
            .zip(&self.host_read)
            .map(|((homes, sizes), &host_read)| {
                if host_read {
                    return Vec::new(); // read in place: nothing is copied
                }
                let mut dst_offset = 0;
                homes
                    .iter()
                    .zip(sizes)
                    .map(|(h, &bytes)| {
                        let (memory, offset) = match *h {
                            PartHome::InPlace { file, offset } => (file_index[&file], offset),
                            PartHome::Copied { offset } => {
                                (copy_index.expect("a copy exists"), offset)
                            }
                        };
                        let p = HostPart {
                            memory,
                            offset,
                            bytes,
                            dst_offset,
                        };
                        dst_offset += bytes;
                        p
                    })
                    .collect()
            })
            .collect();
        HostWeights {
            memory,
            parts,
            views: self.views,
            registered_bytes: self.registered_bytes,
            copied_bytes: self.copied_bytes,
        }
    }
}
