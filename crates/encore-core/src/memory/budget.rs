//! Memory a run will need, estimated before anything is allocated, and the limit it must
//! fit in: the device's free memory on CUDA, [`HOST_FRACTION`] of the available host
//! memory on the CPU. Checking first turns "allocates for minutes, then dies" into an
//! immediate error giving both numbers.

use crate::backend::Backend;
use crate::error::{gib, Error, Result};

/// Share of the available host memory a CPU run may use.
pub const HOST_FRACTION: f64 = 0.8;

/// Bytes a run needs, by what holds them. Sums saturate (an absurd request reports
/// `usize::MAX` bytes rather than overflowing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryNeed {
    /// Model weights in the run dtype.
    pub weights: usize,
    /// The KV cache (`kv_blocks` blocks).
    pub kv_cache: usize,
    pub kv_blocks: usize,
    /// The step's intermediates (the arena) and its input buffers.
    pub activations: usize,
}

impl MemoryNeed {
    pub fn total(&self) -> usize {
        self.weights
            .saturating_add(self.kv_cache)
            .saturating_add(self.activations)
    }

    /// An [`Error::MemoryBudget`] when the total exceeds `limit`; `what` names the run
    /// (e.g. "bench decode --batch 100000"), `fix` what to lower.
    pub fn check(&self, what: &str, limit: &MemoryLimit, fix: &str) -> Result<()> {
        if self.total() <= limit.bytes {
            return Ok(());
        }
        Err(Error::MemoryBudget {
            what: what.to_string(),
            need: self.total(),
            detail: format!(
                "weights {:.2} GiB, KV cache {:.2} GiB in {} blocks, activations {:.2} GiB",
                gib(self.weights),
                gib(self.kv_cache),
                self.kv_blocks,
                gib(self.activations)
            ),
            limit: limit.bytes,
            limit_what: limit.what.clone(),
            fix: fix.to_string(),
        })
    }
}

/// How much a run may allocate, and what that figure is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryLimit {
    pub bytes: usize,
    /// E.g. "free memory of cuda:0" or "80% of 31.2 GiB of available host memory".
    pub what: String,
}

impl MemoryLimit {
    /// The limit on `backend`: its free memory where it reports one (CUDA), else
    /// [`HOST_FRACTION`] of the host's available memory; `None` when neither is known
    /// (no `/proc/meminfo`).
    pub fn of(backend: &dyn Backend) -> Option<MemoryLimit> {
        if let Some((free, _)) = backend.memory_info() {
            return Some(MemoryLimit {
                bytes: free,
                what: format!("free memory of {}", backend.device_name()),
            });
        }
        let (available, total) = host_memory()?;
        let base = available.unwrap_or(total);
        Some(MemoryLimit {
            bytes: (base as f64 * HOST_FRACTION) as usize,
            what: format!(
                "{:.0}% of {:.2} GiB of {} host memory",
                HOST_FRACTION * 100.0,
                gib(base),
                if available.is_some() {
                    "available"
                } else {
                    "total"
                }
            ),
        })
    }
}

/// `(MemAvailable, MemTotal)` in bytes from `/proc/meminfo`; `None` where it cannot be
/// read (not Linux) or has no `MemTotal`.
pub fn host_memory() -> Option<(Option<usize>, usize)> {
    parse_meminfo(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

fn parse_meminfo(text: &str) -> Option<(Option<usize>, usize)> {
    let field = |name: &str| -> Option<usize> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let rest = line.get(name.len()..)?.trim_start_matches(':').trim();
        let kib: usize = rest
            .strip_suffix("kB")
            .unwrap_or(rest)
            .trim()
            .parse()
            .ok()?;
        kib.checked_mul(1024)
    };
    Some((field("MemAvailable"), field("MemTotal")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_is_parsed_in_bytes() {
        let text =
            "MemTotal:       65536000 kB\nMemFree:         1000 kB\nMemAvailable:   32768000 kB\n";
        assert_eq!(
            parse_meminfo(text),
            Some((Some(32768000 * 1024), 65536000 * 1024))
        );
        assert_eq!(
            parse_meminfo("MemTotal: 1024 kB\n"),
            Some((None, 1024 * 1024))
        );
        assert_eq!(parse_meminfo("nothing here"), None);
    }

    #[test]
    fn a_need_over_the_limit_names_both_in_gib() {
        let need = MemoryNeed {
            weights: 1 << 30,
            kv_cache: 3 << 30,
            kv_blocks: 12,
            activations: 1 << 29,
        };
        let limit = MemoryLimit {
            bytes: 2 << 30,
            what: "a test limit".into(),
        };
        let e = need
            .check("this run", &limit, "lower it")
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs 4.50 GiB"), "{e}");
        assert!(
            e.contains("limit is 2.00 GiB (a test limit); lower it"),
            "{e}"
        );
        assert!(e.contains("KV cache 3.00 GiB in 12 blocks"), "{e}");
        let big = MemoryLimit {
            bytes: 5 << 30,
            what: String::new(),
        };
        assert!(need.check("this run", &big, "").is_ok());
        let absurd = MemoryNeed {
            kv_cache: usize::MAX,
            weights: 1,
            ..need
        };
        assert_eq!(absurd.total(), usize::MAX);
    }
}
