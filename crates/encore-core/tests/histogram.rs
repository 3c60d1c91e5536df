//! The latency histograms behind `/metrics`: bucket placement (`le` is inclusive), the
//! `+Inf` bucket, sums, and exact counts under concurrent recording.

use std::sync::Arc;
use std::time::Duration;

use encore_core::histogram::{Buckets, Histogram, ItlBuckets, TtftBuckets};

#[test]
fn observations_land_in_the_first_bucket_at_or_above_them() {
    let h = Histogram::<TtftBuckets>::default();
    let b = TtftBuckets::BOUNDS;
    assert_eq!(h.snapshot().count(), 0);
    h.observe(Duration::from_micros(500)); // <= 0.001
    h.observe(Duration::from_millis(1)); // == 0.001: still le="0.001"
    h.observe(Duration::from_millis(7)); // (0.005, 0.01]
    h.observe(Duration::from_secs(3000)); // beyond the last bound: only +Inf
    let s = h.snapshot();
    assert_eq!(s.bounds, b);
    assert_eq!(s.cumulative.len(), b.len() + 1);
    assert_eq!(s.cumulative[0], 2, "{s:?}");
    assert_eq!(s.cumulative[1], 2, "{s:?}"); // le=0.005
    assert_eq!(s.cumulative[2], 3, "{s:?}"); // le=0.01
    assert_eq!(s.cumulative[b.len() - 1], 3, "{s:?}"); // le=2560
    assert_eq!(s.count(), 4);
    assert!((s.sum_secs - 3000.0085).abs() < 1e-6, "{}", s.sum_secs);
    assert!(s.cumulative.windows(2).all(|w| w[0] <= w[1]));
}

#[test]
fn bounds_ascend_and_match_vllm() {
    for b in [TtftBuckets::BOUNDS, ItlBuckets::BOUNDS] {
        assert!(b.windows(2).all(|w| w[0] < w[1]), "{b:?}");
    }
    assert_eq!(TtftBuckets::BOUNDS.last(), Some(&2560.0));
    assert_eq!(ItlBuckets::BOUNDS.last(), Some(&80.0));
}

#[test]
fn concurrent_observations_are_all_counted() {
    let h = Arc::new(Histogram::<ItlBuckets>::default());
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let h = Arc::clone(&h);
            std::thread::spawn(move || {
                for i in 0..10_000u64 {
                    h.observe(Duration::from_micros((t * 10_000 + i) % 3000));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = h.snapshot();
    assert_eq!(s.count(), 80_000);
    // Every observation is under 3 ms: nothing above le=0.005.
    let le_5ms = ItlBuckets::BOUNDS.iter().position(|&b| b == 0.005).unwrap();
    assert_eq!(s.cumulative[le_5ms], 80_000);
    assert!(s.cumulative[0] > 0 && s.cumulative[0] < 80_000);
}
