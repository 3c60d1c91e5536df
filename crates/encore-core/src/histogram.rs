//! Lock-free latency histograms (Prometheus-style buckets) that the engine loop records
//! into and a metrics endpoint reads.

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A histogram's bucket upper bounds in seconds, ascending (an observation `v` counts in
/// the first bucket whose bound is `>= v`, beyond the last in `+Inf`).
pub trait Buckets {
    const BOUNDS: &'static [f64];
}

/// Time to first token: vLLM's `vllm:time_to_first_token_seconds` bounds.
#[derive(Debug)]
pub struct TtftBuckets;

impl Buckets for TtftBuckets {
    const BOUNDS: &'static [f64] = &[
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
    ];
}

/// Inter-token latency: vLLM's `vllm:inter_token_latency_seconds` bounds, with 1, 2.5 and
/// 5 ms in front (a decode step on a GPU takes a few milliseconds).
#[derive(Debug)]
pub struct ItlBuckets;

impl Buckets for ItlBuckets {
    const BOUNDS: &'static [f64] = &[
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
        2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    ];
}

/// A histogram of durations over the bounds of `B`: one relaxed atomic counter per bucket
/// and the sum in nanoseconds, so recording never blocks a reader or another writer.
pub struct Histogram<B> {
    /// Per bucket (not cumulative); the last is `+Inf`.
    counts: Box<[AtomicU64]>,
    sum_nanos: AtomicU64,
    _bounds: PhantomData<fn() -> B>,
}

impl<B: Buckets> Default for Histogram<B> {
    fn default() -> Self {
        Histogram {
            counts: (0..=B::BOUNDS.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_nanos: AtomicU64::new(0),
            _bounds: PhantomData,
        }
    }
}

impl<B: Buckets> Histogram<B> {
    /// Record one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = B::BOUNDS.partition_point(|&b| b < secs);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The counts so far (a concurrent observation may be in the count but not yet in the
    /// sum).
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut total = 0;
        let cumulative = self
            .counts
            .iter()
            .map(|c| {
                total += c.load(Ordering::Relaxed);
                total
            })
            .collect();
        HistogramSnapshot {
            bounds: B::BOUNDS,
            cumulative,
            sum_secs: self.sum_nanos.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }
}

impl<B: Buckets> fmt::Debug for Histogram<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.snapshot();
        f.debug_struct("Histogram")
            .field("count", &s.count())
            .field("sum_secs", &s.sum_secs)
            .finish()
    }
}

/// A histogram read out, in Prometheus' terms.
#[derive(Clone, Debug, PartialEq)]
pub struct HistogramSnapshot {
    /// Bucket upper bounds in seconds (`le`), without `+Inf`.
    pub bounds: &'static [f64],
    /// Observations `<=` each bound, then the total (`le="+Inf"`): `bounds.len() + 1`
    /// non-decreasing values.
    pub cumulative: Vec<u64>,
    /// Sum of the observations in seconds.
    pub sum_secs: f64,
}

impl HistogramSnapshot {
    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.cumulative.last().copied().unwrap_or(0)
    }
}
