//! The acceptance rules of a verify step, on the host: the references the device kernels
//! will be checked against.
//!
//! A verify step scores `k + 1` positions of a sequence: after its last accepted token,
//! and after each of its `k` drafts. [`greedy`] keeps the longest prefix of drafts equal
//! to the target's argmax and then emits the target's own token. [`rejection_sample`] is
//! speculative sampling (Leviathan et al. 2023; Chen et al. 2023): draft `x_i` is kept with
//! probability `min(1, p_i(x_i) / q_i(x_i))`; the first rejected one is replaced by a
//! draw from the residual `max(0, p_i - q_i)` normalized; when all are kept, one more token
//! is drawn from `p_k`. The emitted tokens are then distributed exactly as sampling the
//! target one token at a time.

/// What a uniform draw of [`rejection_sample`] is for (so a caller can give every draw its
/// own seeded stream, independent of the batch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Draw {
    /// Keeping draft `i`.
    Accept(usize),
    /// The token emitted at position `i` (a residual draw, or the bonus at `k`).
    Sample(usize),
}

/// Greedy verification: `drafts` (k) against the target's argmax at the `k + 1` positions.
/// Returns the emitted tokens: the drafts up to the first that differs from the argmax,
/// then the argmax there (all `k` drafts and the argmax after them when none differs).
/// The sequence is then what greedy decoding one token at a time gives.
pub fn greedy(drafts: &[u32], argmax: &[u32]) -> Vec<u32> {
    assert_eq!(argmax.len(), drafts.len() + 1, "k + 1 target positions");
    let a = drafts
        .iter()
        .zip(argmax)
        .take_while(|(d, t)| d == t)
        .count();
    let mut out = drafts[..a].to_vec();
    out.push(argmax[a]);
    out
}

/// The index drawn from weights `w` (non-negative, not all zero) by a uniform `u` in [0, 1):
/// the first index whose running sum exceeds `u * total`, the last positive one when
/// rounding leaves `u * total` past them all.
pub fn draw(w: &[f32], u: f32) -> usize {
    let total: f64 = w.iter().map(|&v| v as f64).sum();
    let target = u as f64 * total;
    let mut acc = 0.0f64;
    for (i, &v) in w.iter().enumerate() {
        acc += v as f64;
        if v > 0.0 && target < acc {
            return i;
        }
    }
    w.iter()
        .rposition(|&v| v > 0.0)
        .expect("some weight is positive")
}

/// Speculative sampling of one sequence's verify step. `drafts` (k) were proposed with
/// distributions `q` (k rows over the vocabulary; `None`: a deterministic proposer such as
/// n-gram lookup, whose `q_i` is one-hot at `x_i`); `p` holds the target's k + 1
/// distributions. `uniform(draw)` gives each draw in [0, 1). Returns the emitted tokens
/// (1 to k + 1).
pub fn rejection_sample(
    drafts: &[u32],
    q: Option<&[Vec<f32>]>,
    p: &[Vec<f32>],
    mut uniform: impl FnMut(Draw) -> f32,
) -> Vec<u32> {
    let k = drafts.len();
    assert_eq!(p.len(), k + 1, "k + 1 target distributions");
    if let Some(q) = q {
        assert_eq!(q.len(), k, "k draft distributions");
    }
    let mut out = Vec::with_capacity(k + 1);
    for (i, &x) in drafts.iter().enumerate() {
        let x = x as usize;
        let qx = q.map_or(1.0, |q| q[i][x]);
        let px = p[i][x];
        let keep = if qx <= 0.0 {
            false
        } else {
            uniform(Draw::Accept(i)) < (px / qx).min(1.0)
        };
        if keep {
            out.push(x as u32);
            continue;
        }
        // The residual max(0, p - q); a draft the target gives no less mass than the
        // proposer cannot be rejected, so it is positive somewhere.
        let residual: Vec<f32> = match q {
            Some(q) => p[i]
                .iter()
                .zip(&q[i])
                .map(|(&a, &b)| (a - b).max(0.0))
                .collect(),
            None => p[i]
                .iter()
                .enumerate()
                .map(|(j, &a)| if j == x { 0.0 } else { a })
                .collect(),
        };
        let r = if residual.iter().any(|&v| v > 0.0) {
            residual
        } else {
            p[i].clone()
        };
        out.push(draw(&r, uniform(Draw::Sample(i))) as u32);
        return out;
    }
    out.push(draw(&p[k], uniform(Draw::Sample(k))) as u32);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::uniform_from_seed;

    #[test]
    fn greedy_keeps_the_matching_prefix_then_the_target_token() {
        assert_eq!(greedy(&[5, 6, 7], &[5, 6, 7, 8]), vec![5, 6, 7, 8]);
        assert_eq!(greedy(&[5, 6, 7], &[5, 9, 7, 8]), vec![5, 9]);
        assert_eq!(greedy(&[5, 6, 7], &[1, 6, 7, 8]), vec![1]);
        assert_eq!(greedy(&[], &[3]), vec![3]);
    }

    fn softmax(l: &[f32]) -> Vec<f32> {
        let m = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let e: Vec<f32> = l.iter().map(|&v| (v - m).exp()).collect();
        let s: f32 = e.iter().sum();
        e.iter().map(|v| v / s).collect()
    }

    /// Pearson's chi-square of `counts` against probabilities `p` over `n` trials.
    fn chi_square(counts: &[usize], p: &[f32], n: usize) -> f64 {
        counts
            .iter()
            .zip(p)
            .map(|(&c, &pi)| {
                let e = pi as f64 * n as f64;
                (c as f64 - e).powi(2) / e
            })
            .sum()
    }

    /// The tokens speculation emits are distributed as the target's: over many seeds, the
    /// first and second emitted tokens of a tiny vocabulary match p_0 and (given the first)
    /// p_1 by a chi-square test, with a deterministic proposer (n-gram: q one-hot) and a
    /// sampled one (a draft model's q); a wrong rule (keeping every draft) fails the test.
    #[test]
    fn speculative_sampling_keeps_the_target_distribution() {
        let v = 5;
        let n = 40_000;
        // The critical value of chi-square with 4 degrees of freedom at p = 0.001.
        let critical = 18.47;
        let p0 = softmax(&[0.3, -1.0, 1.2, 0.1, -0.4]);
        let p1 = softmax(&[1.0, 0.2, -0.5, 0.7, 0.0]);
        let p2 = softmax(&[0.0, 0.0, 0.5, -2.0, 1.0]);
        let p = vec![p0.clone(), p1.clone(), p2];
        let q = vec![
            softmax(&[1.5, 0.0, 0.0, -1.0, 0.5]),
            softmax(&[-0.5, 1.0, 0.3, 0.0, 0.0]),
        ];
        for deterministic in [true, false] {
            let mut first = vec![0usize; v];
            // Second tokens after a first token of 2 (the most likely).
            let mut second = vec![0usize; v];
            let mut after2 = 0;
            for s in 0..n as i64 {
                let u = |d: Draw| {
                    let tag = match d {
                        Draw::Accept(i) => 2 * i as i64,
                        Draw::Sample(i) => 2 * i as i64 + 1,
                    };
                    uniform_from_seed(s * 64 + tag)
                };
                let drafts: Vec<u32> = if deterministic {
                    vec![2, 0]
                } else {
                    let d0 = draw(&q[0], uniform_from_seed(-s - 1));
                    let d1 = draw(&q[1], uniform_from_seed(-s - 1_000_000_007));
                    vec![d0 as u32, d1 as u32]
                };
                let qs = (!deterministic).then_some(q.as_slice());
                // The target's second distribution does not depend on the first token here
                // (a fixed table), so the second emitted token follows p1 whatever it is.
                let out = rejection_sample(&drafts, qs, &p, u);
                assert!((1..=3).contains(&out.len()));
                first[out[0] as usize] += 1;
                if out.len() > 1 && out[0] == 2 {
                    second[out[1] as usize] += 1;
                    after2 += 1;
                }
            }
            let c1 = chi_square(&first, &p0, n);
            assert!(
                c1 < critical,
                "deterministic {deterministic}: first {first:?} chi2 {c1}"
            );
            let c2 = chi_square(&second, &p1, after2);
            assert!(
                c2 < critical,
                "deterministic {deterministic}: second {second:?} chi2 {c2}"
            );
        }
        // A wrong rule fails the same test: keeping the n-gram draft 2 always.
        let mut first = vec![0usize; v];
        for s in 0..n as i64 {
            let u = |_: Draw| uniform_from_seed(s);
            let out = rejection_sample(&[2], None, &p[..2], |d| match d {
                Draw::Accept(_) => 0.0,
                other => u(other),
            });
            first[out[0] as usize] += 1;
        }
        assert!(chi_square(&first, &p0, n) > critical, "{first:?}");
    }

    #[test]
    fn draw_follows_the_weights() {
        let w = [0.0, 1.0, 0.0, 3.0];
        assert_eq!(draw(&w, 0.0), 1);
        assert_eq!(draw(&w, 0.24), 1);
        assert_eq!(draw(&w, 0.26), 3);
        assert_eq!(draw(&w, 0.999_999_9), 3);
    }
}
