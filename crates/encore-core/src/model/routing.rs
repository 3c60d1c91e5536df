//! Synthetic routing for benchmarks (`--router-skew`): random weights route in ways no
//! trained model does (in a random Qwen3-30B-A3B-shaped file, a 512-token batch reaches a
//! few dozen of the 128 experts, one of them taking almost every token), which would fake
//! every batched and prefill figure. A [`RouterSkew`] replaces each sparse layer's router
//! logits with a seeded table whose rows choose `top_k` distinct experts drawn from a Zipf
//! law over the experts (exponent 0: uniform), so the distribution is set, and stated.

use crate::error::{Error, Result};
use crate::ops::splitmix64;

/// A Zipf exponent over each layer's experts (0 = uniform) and the seed of the draws.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RouterSkew {
    pub exponent: f64,
    pub seed: u64,
    /// The share of a layer's chosen experts the expert cache's prefetch predicts
    /// (`--prefetch-accuracy`): the synthetic routing has no router to apply early, so the
    /// prediction is the table's own row with each chosen expert kept with this
    /// probability and otherwise swapped for another. Default [`DEFAULT_PREFETCH_ACCURACY`].
    pub prefetch_accuracy: f64,
}

/// The prefetch accuracy assumed by default under `--router-skew`: trained routers are
/// reported to keep most of the next layer's experts when applied a layer early, but no
/// trained checkpoint was measured here; 0.8 is an assumption, stated with every figure.
pub const DEFAULT_PREFETCH_ACCURACY: f64 = 0.8;

impl RouterSkew {
    /// A skew of `exponent` (finite, 0..=8), seed 0; an error naming `--router-skew`.
    pub fn new(exponent: f64) -> Result<RouterSkew> {
        if !exponent.is_finite() || !(0.0..=8.0).contains(&exponent) {
            return Err(Error::invalid(
                "--router-skew",
                format!("{exponent} is not a Zipf exponent in 0..=8 (0: uniform routing)"),
            ));
        }
        Ok(RouterSkew {
            exponent,
            seed: 0,
            prefetch_accuracy: DEFAULT_PREFETCH_ACCURACY,
        })
    }

    /// This skew with a prefetch accuracy of `p` (0..=1); an error naming
    /// `--prefetch-accuracy`.
    pub fn with_prefetch_accuracy(self, p: f64) -> Result<RouterSkew> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::invalid(
                "--prefetch-accuracy",
                format!("{p} is not a probability in 0..=1"),
            ));
        }
        Ok(RouterSkew {
            prefetch_accuracy: p,
            ..self
        })
    }
}

/// The routing table: `rows` rows of `experts` logits (row-major). Each row gives its
/// `top_k` chosen experts logits 4, 3.99, 3.98, ... in the order drawn and every other
/// expert 0, so softmax and top-k choose exactly them. The experts are drawn without
/// replacement with weight `1 / (rank + 1)^exponent`, ranks a seeded permutation of the
/// experts (the popular experts are not the low ids).
pub struct RoutingTable {
    pub experts: usize,
    pub top_k: usize,
    /// Each row's chosen experts, in order drawn.
    pub chosen: Vec<Vec<u32>>,
    /// Each row's experts as the prefetch predicts them: `chosen`, each kept with
    /// probability [`RouterSkew::prefetch_accuracy`], else another expert of the row's
    /// unchosen ones.
    pub predicted: Vec<Vec<u32>>,
}

impl RoutingTable {
    pub fn new(skew: RouterSkew, experts: usize, top_k: usize, rows: usize) -> RoutingTable {
        let mut state = splitmix64(skew.seed ^ 0x5EED_0FE0_E5E5);
        let mut next = || {
            state = splitmix64(state);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        // A seeded permutation: rank r is expert perm[r].
        let mut perm: Vec<u32> = (0..experts as u32).collect();
        for i in (1..experts).rev() {
            let j = (next() * (i + 1) as f64) as usize;
            perm.swap(i, j.min(i));
        }
        let weight: Vec<f64> = (0..experts)
            .map(|r| (r as f64 + 1.0).powf(-skew.exponent))
            .collect();
        let chosen = (0..rows)
            .map(|_| {
                let mut w = weight.clone();
                (0..top_k)
                    .map(|_| {
                        let total: f64 = w.iter().sum();
                        let mut u = next() * total;
                        let mut r = 0;
                        while r + 1 < experts && (w[r] == 0.0 || u >= w[r]) {
                            u -= w[r];
                            r += 1;
                        }
                        // Rounding can leave u past the last live weight: take the last one.
                        while w[r] == 0.0 {
                            r -= 1;
                        }
                        w[r] = 0.0;
                        perm[r]
                    })
                    .collect()
            })
            .collect::<Vec<Vec<u32>>>();
        let predicted = chosen
            .iter()
            .map(|c| {
                let mut out = c.clone();
                for i in 0..out.len() {
                    if next() < skew.prefetch_accuracy || experts == top_k {
                        continue;
                    }
                    // Another expert, none of the row's chosen or predicted ones.
                    loop {
                        let e = ((next() * experts as f64) as u32).min(experts as u32 - 1);
                        if !c.contains(&e) && !out.contains(&e) {
                            out[i] = e;
                            break;
                        }
                    }
                }
                out
            })
            .collect();
        RoutingTable {
            experts,
            top_k,
            chosen,
            predicted,
        }
    }

    /// The logits, `[rows, experts]` row-major.
    pub fn logits(&self) -> Vec<f32> {
        Self::logits_of(&self.chosen, self.experts)
    }

    /// The prefetch's predicted logits, `[rows, experts]` row-major.
    pub fn predicted_logits(&self) -> Vec<f32> {
        Self::logits_of(&self.predicted, self.experts)
    }

    fn logits_of(rows: &[Vec<u32>], experts: usize) -> Vec<f32> {
        let mut out = vec![0f32; rows.len() * experts];
        for (row, c) in out.chunks_exact_mut(experts).zip(rows) {
            for (j, &e) in c.iter().enumerate() {
                row[e as usize] = 4.0 - 0.01 * j as f32;
            }
        }
        out
    }

    /// The distinct experts rows `start..start + n` choose.
    /// Rows of a table whose steps read windows of `window` rows: room for at least 64
    /// windows and 65,536 rows, so steps rarely repeat a row (a cache of experts would
    /// otherwise see the same steps again).
    pub fn table_rows(window: usize) -> usize {
        (64 * window).max(65_536)
    }

    /// The first row of the window after a step of `rows` token rows that read from
    /// `start` (its `layers` layers read rows `start + l .. start + l + rows`): the next
    /// row none of them read, or the table's start when the window would run past its
    /// `len` rows.
    pub fn next_start(
        start: usize,
        rows: usize,
        layers: usize,
        window: usize,
        len: usize,
    ) -> usize {
        let next = start + layers + rows;
        if next + window > len {
            0
        } else {
            next
        }
    }

    /// The distinct experts a layer reaches in a step of `n` rows, the mean over `steps`
    /// successive steps and the `layers` layers (each step's window as
    /// [`RoutingTable::next_start`] moves it).
    pub fn mean_distinct(&self, n: usize, layers: usize, window: usize, steps: usize) -> f64 {
        let mut start = 0;
        let mut sum = 0;
        for _ in 0..steps {
            sum += (0..layers)
                .map(|l| self.distinct(start + l, n))
                .sum::<usize>();
            start = Self::next_start(start, n, layers, window, self.chosen.len());
        }
        sum as f64 / (steps * layers).max(1) as f64
    }

    pub fn distinct(&self, start: usize, n: usize) -> usize {
        let mut seen = vec![false; self.experts];
        for c in &self.chosen[start..start + n] {
            for &e in c {
                seen[e as usize] = true;
            }
        }
        seen.iter().filter(|&&s| s).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_choose_distinct_experts_by_the_skew() {
        let (e, k, rows) = (64, 8, 4000);
        let uniform = RoutingTable::new(RouterSkew::new(0.0).unwrap(), e, k, rows);
        let skewed = RoutingTable::new(RouterSkew::new(1.2).unwrap(), e, k, rows);
        for t in [&uniform, &skewed] {
            for c in &t.chosen {
                let mut s = c.clone();
                s.sort_unstable();
                s.dedup();
                assert_eq!(s.len(), k, "{c:?}");
                assert!(s.iter().all(|&x| (x as usize) < e));
            }
            // Softmax + top-k of the logits choose exactly those experts, in order.
            let l = t.logits();
            let row = &l[..e];
            let mut order: Vec<usize> = (0..e).collect();
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            let top: Vec<u32> = order[..k].iter().map(|&i| i as u32).collect();
            assert_eq!(top, t.chosen[0]);
        }
        // Uniform: every expert takes about k / e of the choices; skewed: the most
        // popular far more, and small batches reach fewer experts.
        let count = |t: &RoutingTable| {
            let mut n = vec![0usize; e];
            t.chosen.iter().flatten().for_each(|&x| n[x as usize] += 1);
            n
        };
        let (cu, cs) = (count(&uniform), count(&skewed));
        let mean = (rows * k / e) as f64;
        assert!(
            cu.iter().all(|&n| (n as f64 - mean).abs() < 0.2 * mean),
            "{cu:?}"
        );
        assert!(*cs.iter().max().unwrap() as f64 > 2.0 * mean, "{cs:?}");
        assert!(skewed.distinct(0, 16) < uniform.distinct(0, 16) + 8);
        assert!(uniform.distinct(0, 512) == e);
        assert!(RouterSkew::new(-1.0).is_err() && RouterSkew::new(f64::NAN).is_err());
        // Seeded: the same table again.
        let again = RoutingTable::new(RouterSkew::new(1.2).unwrap(), e, k, rows);
        assert_eq!(again.chosen, skewed.chosen);
    }

    /// Successive steps read disjoint rows until the table runs out, then start over;
    /// the mean distinct experts follows the same windows.
    #[test]
    fn steps_move_to_fresh_rows() {
        let (layers, rows) = (4, 16);
        let window = rows + layers;
        let len = RoutingTable::table_rows(window);
        assert!(len >= 64 * window);
        let mut start = 0;
        let mut starts = vec![start];
        for _ in 0..10 {
            start = RoutingTable::next_start(start, rows, layers, window, len);
            starts.push(start);
        }
        for w in starts.windows(2) {
            assert_eq!(w[1], w[0] + layers + rows, "{starts:?}");
        }
        let last = len - window;
        assert_eq!(RoutingTable::next_start(last, rows, layers, window, len), 0);
        let t = RoutingTable::new(RouterSkew::new(0.0).unwrap(), 64, 8, len);
        let mean = t.mean_distinct(2, layers, window, 8);
        assert!((8.0..=16.0).contains(&mean), "{mean}");
    }
}
