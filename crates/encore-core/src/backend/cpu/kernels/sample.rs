//! Greedy and random sampling, one rayon task per row. Semantics:
//! [`crate::backend::Sampling`].

use rayon::prelude::*;

use super::{view, view_mut};
use crate::ops::{uniform_from_seed, SampleDims};
use crate::tensor::Tensor;

pub(in crate::backend::cpu) struct SampleArgs {
    pub logits: Tensor,
    pub temperature: Tensor,
    pub top_k: Tensor,
    pub top_p: Tensor,
    pub seeds: Tensor,
    pub out: Tensor,
    pub dims: SampleDims,
}

pub(in crate::backend::cpu) fn sample(a: &SampleArgs) {
    // SAFETY: dtypes validated (f32 logits/temperature/top_p, i32 top_k/out, i64
    // seeds); out is the only tensor written and overlaps none of the others.
    let (logits, temperature, top_k, top_p, seeds, out) = unsafe {
        (
            view::<f32>(&a.logits),
            view::<f32>(&a.temperature),
            view::<i32>(&a.top_k),
            view::<f32>(&a.top_p),
            view::<i64>(&a.seeds),
            view_mut::<i32>(&a.out),
        )
    };
    out.par_iter_mut()
        .zip(logits.par_chunks(a.dims.vocab))
        .enumerate()
        .for_each(|(r, (o, row))| {
            *o = sample_row(row, temperature[r], top_k[r], top_p[r], seeds[r]);
        });
}

/// The smallest index of the largest non-NaN value; 0 when every value is NaN.
fn argmax_row(row: &[f32]) -> i32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in row.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map_or(0, |(i, _)| i as i32)
}

/// One row of [`crate::backend::Sampling`]. NaN logits are never kept (like the greedy
/// [`argmax_row`] never picks them); a NaN temperature counts as `<= 0` (greedy).
fn sample_row(row: &[f32], temperature: f32, top_k: i32, top_p: f32, seed: i64) -> i32 {
    if temperature.is_nan() || temperature <= 0.0 {
        return argmax_row(row);
    }
    let max_z = row
        .iter()
        .filter(|l| !l.is_nan())
        .map(|&l| l / temperature)
        .fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = row
        .iter()
        .map(|&l| {
            if l.is_nan() {
                0.0
            } else {
                (l / temperature - max_z).exp()
            }
        })
        .collect();
    let mut kept: Vec<bool> = row.iter().map(|l| !l.is_nan()).collect();

    // 1. top-k: keep logits >= the k-th largest (ties at the threshold all stay).
    if let Ok(k) = usize::try_from(top_k) {
        let mut valid: Vec<f32> = row.iter().copied().filter(|l| !l.is_nan()).collect();
        if k > 0 && k < row.len() && k < valid.len() {
            let (_, &mut threshold, _) = valid.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
            for (keep, &l) in kept.iter_mut().zip(row) {
                *keep &= l >= threshold;
            }
        }
    }

    // 2. top-p: the largest threshold whose kept mass at or above it reaches top_p * S.
    if top_p > 0.0 && top_p < 1.0 {
        let total: f32 = kept
            .iter()
            .zip(&e)
            .filter(|(k, _)| **k)
            .map(|(_, e)| e)
            .sum();
        let mut order: Vec<usize> = (0..row.len()).filter(|&i| kept[i]).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        let target = top_p * total;
        let mut mass = 0f32;
        let mut threshold = None;
        for (j, &i) in order.iter().enumerate() {
            mass += e[i];
            // Only a whole group of equal logits can be cut.
            let group_ends = order.get(j + 1).is_none_or(|&n| row[n] != row[i]);
            if group_ends && mass >= target {
                threshold = Some(row[i]);
                break;
            }
        }
        // No threshold (rounding left the full mass short of the target): keep all.
        if let Some(threshold) = threshold {
            for (keep, &l) in kept.iter_mut().zip(row) {
                *keep &= l >= threshold;
            }
        }
    }

    // 3. Inverse CDF over the kept tokens in index order.
    let mass: f32 = kept
        .iter()
        .zip(&e)
        .filter(|(k, _)| **k)
        .map(|(_, e)| e)
        .sum();
    let target = uniform_from_seed(seed) * mass;
    let mut running = 0f32;
    let mut last = None;
    for (i, (&keep, &e)) in kept.iter().zip(&e).enumerate() {
        if !keep {
            continue;
        }
        running += e;
        last = Some(i);
        if running > target {
            return i as i32;
        }
    }
    last.map_or(0, |i| i as i32)
}
