//! Greedy and random sampling with penalties, min-p and log-probabilities, one rayon
//! task per row. Semantics: [`crate::backend::Sampling`].

use rayon::prelude::*;

use super::{view, view_mut};
use crate::backend::PROMPT_BIT;
use crate::ops::{uniform_from_seed, SampleDims};
use crate::tensor::Tensor;

pub(in crate::backend::cpu) struct SampleArgs {
    pub logits: Tensor,
    pub temperature: Tensor,
    pub top_k: Tensor,
    pub top_p: Tensor,
    pub min_p: Tensor,
    pub seeds: Tensor,
    pub out: Tensor,
    pub penalties: Option<PenaltyArgs>,
    pub logprobs: Option<LogprobArgs>,
    pub mask: Option<MaskArgs>,
    pub dims: SampleDims,
}

pub(in crate::backend::cpu) struct MaskArgs {
    pub bits: Tensor,
    pub on: Tensor,
}

pub(in crate::backend::cpu) struct PenaltyArgs {
    pub counts: Tensor,
    pub slot: Tensor,
    pub repetition: Tensor,
    pub frequency: Tensor,
    pub presence: Tensor,
}

pub(in crate::backend::cpu) struct LogprobArgs {
    pub num: Tensor,
    pub token: Tensor,
    pub top_ids: Tensor,
    pub top: Tensor,
    pub target: Option<Tensor>,
}

/// One row's result: the token, its penalty slot, and its log-probabilities.
struct RowOut {
    token: i32,
    slot: Option<usize>,
    logprobs: Option<(f32, Vec<(i32, f32)>)>,
}

/// [`crate::backend::Backend::logit_bias`] (checked by `check_logit_bias`).
pub(in crate::backend::cpu) fn logit_bias(
    logits: &Tensor,
    ids: &Tensor,
    vals: &Tensor,
    count: &Tensor,
    vocab: usize,
) {
    // SAFETY: dtypes and shapes validated; `logits` overlaps none of the others.
    unsafe {
        crate::ops::logit_bias_ref(
            view_mut::<f32>(logits),
            vocab,
            view::<i32>(ids),
            view::<f32>(vals),
            view::<i32>(count),
        )
    }
}

/// [`crate::backend::Backend::penalty_count`] (checked by `check_penalty_count`).
pub(in crate::backend::cpu) fn penalty_count(
    counts: &Tensor,
    slots: &Tensor,
    tokens: &Tensor,
    vocab: usize,
) {
    // SAFETY: dtypes and shapes validated; `counts` overlaps neither of the others.
    unsafe {
        crate::ops::penalty_count_ref(
            view_mut::<i32>(counts),
            vocab,
            view::<i32>(slots),
            view::<i32>(tokens),
        )
    }
}

pub(in crate::backend::cpu) fn sample(a: &SampleArgs) {
    let SampleDims {
        batch,
        vocab,
        slots,
        top_n,
        mask_words,
    } = a.dims;
    // SAFETY: dtypes and shapes validated (`check_sample`); nothing is written until
    // every row is computed, and then only `out`, the log-probability outputs and
    // `counts`, which overlap none of the inputs read here.
    let (logits, temperature, top_k, top_p, min_p, seeds) = unsafe {
        (
            view::<f32>(&a.logits),
            view::<f32>(&a.temperature),
            view::<i32>(&a.top_k),
            view::<f32>(&a.top_p),
            view::<f32>(&a.min_p),
            view::<i64>(&a.seeds),
        )
    };
    // SAFETY: as above; `counts` is only read until the rows are done.
    let pen = a.penalties.as_ref().map(|p| unsafe {
        (
            view::<i32>(&p.counts),
            view::<i32>(&p.slot),
            view::<f32>(&p.repetition),
            view::<f32>(&p.frequency),
            view::<f32>(&p.presence),
        )
    });
    // SAFETY: as above.
    let num = a.logprobs.as_ref().map(|l| unsafe { view::<i32>(&l.num) });
    // SAFETY: as above.
    let target = a
        .logprobs
        .as_ref()
        .and_then(|l| l.target.as_ref())
        .map(|t| unsafe { view::<i32>(t) });
    // SAFETY: as above.
    let mask = a
        .mask
        .as_ref()
        .map(|m| unsafe { (view::<i32>(&m.bits), view::<i32>(&m.on)) });
    let rows: Vec<RowOut> = (0..batch)
        .into_par_iter()
        .map(|r| {
            let raw = &logits[r * vocab..(r + 1) * vocab];
            let mut slot = None;
            let mut penalised = None;
            if let Some((counts, slot_of, rep, freq, pres)) = pen {
                if let Some(s) = usize::try_from(slot_of[r]).ok().filter(|&s| s < slots) {
                    let c = &counts[s * vocab..(s + 1) * vocab];
                    let (rep, freq, pres) = (rep[r], freq[r], pres[r]);
                    penalised = Some(
                        raw.iter()
                            .zip(c)
                            .map(|(&l, &c)| penalise(l, c, rep, freq, pres))
                            .collect::<Vec<f32>>(),
                    );
                    slot = Some(s);
                }
            }
            if let Some((bits, _)) = mask.filter(|(_, on)| on[r] != 0) {
                let words = &bits[r * mask_words..(r + 1) * mask_words];
                let row = penalised.get_or_insert_with(|| raw.to_vec());
                for (i, l) in row.iter_mut().enumerate() {
                    if (words[i / 32] as u32 >> (i % 32)) & 1 == 0 {
                        *l = f32::NAN;
                    }
                }
            }
            let row = penalised.as_deref().unwrap_or(raw);
            let token = sample_row(row, temperature[r], top_k[r], top_p[r], min_p[r], seeds[r]);
            let logprobs = num.and_then(|num| usize::try_from(num[r]).ok()).map(|n| {
                let (m, ln_sum) = log_normaliser(row);
                let lp = |l: f32| (l - m) - ln_sum;
                let top = top_entries(row, n.min(top_n))
                    .into_iter()
                    .map(|i| i.map_or((-1, f32::NEG_INFINITY), |i| (i as i32, lp(row[i]))))
                    .collect();
                let scored = target
                    .and_then(|t| usize::try_from(t[r]).ok())
                    .filter(|&t| t < vocab)
                    .unwrap_or(token as usize);
                (lp(row[scored]), top)
            });
            RowOut {
                token,
                slot,
                logprobs,
            }
        })
        .collect();
    // SAFETY: the outputs are exclusively ours (see above); the shared views above are
    // no longer used.
    let out = unsafe { view_mut::<i32>(&a.out) };
    for (o, row) in out.iter_mut().zip(&rows) {
        *o = row.token;
    }
    if let Some(l) = &a.logprobs {
        // SAFETY: as above.
        let (token, top_ids, top) = unsafe {
            (
                view_mut::<f32>(&l.token),
                view_mut::<i32>(&l.top_ids),
                view_mut::<f32>(&l.top),
            )
        };
        for (r, row) in rows.iter().enumerate() {
            if let Some((lp, entries)) = &row.logprobs {
                token[r] = *lp;
                for (j, &(id, v)) in entries.iter().enumerate() {
                    top_ids[r * top_n + j] = id;
                    top[r * top_n + j] = v;
                }
            }
        }
    }
    if let Some(p) = &a.penalties {
        // SAFETY: as above; rows sharing a slot are counted one after the other.
        let counts = unsafe { view_mut::<i32>(&p.counts) };
        for row in &rows {
            if let Some(s) = row.slot {
                let c = &mut counts[s * vocab + row.token as usize];
                *c = c.wrapping_add(1);
            }
        }
    }
}

/// A logit after the penalties of a token whose count entry is `c` (see
/// [`crate::backend::Penalties`]).
fn penalise(l: f32, c: i32, repetition: f32, frequency: f32, presence: f32) -> f32 {
    if c == 0 {
        return l;
    }
    let mut v = if l > 0.0 {
        l / repetition
    } else {
        l * repetition
    };
    let n = c & (PROMPT_BIT - 1);
    if n > 0 {
        v -= frequency * n as f32;
        v -= presence;
    }
    v
}

/// The row's largest non-NaN value `m` and `ln(sum of exp(l - m))` over non-NaN `l`.
fn log_normaliser(row: &[f32]) -> (f32, f32) {
    let m = row
        .iter()
        .filter(|l| !l.is_nan())
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let sum: f64 = row
        .iter()
        .filter(|l| !l.is_nan())
        .map(|&l| (l - m).exp() as f64)
        .sum();
    (m, sum.ln() as f32)
}

/// The indices of the `n` largest non-NaN values, largest first, ties by smaller index;
/// `None` past the number of non-NaN values.
fn top_entries(row: &[f32], n: usize) -> Vec<Option<usize>> {
    let mut idx: Vec<usize> = (0..row.len()).filter(|&i| !row[i].is_nan()).collect();
    let order = |&a: &usize, &b: &usize| {
        row[b]
            .partial_cmp(&row[a])
            .expect("NaN filtered")
            .then(a.cmp(&b))
    };
    if n < idx.len() {
        idx.select_nth_unstable_by(n, order);
        idx.truncate(n);
    }
    idx.sort_by(order);
    let mut out: Vec<Option<usize>> = idx.into_iter().map(Some).collect();
    out.resize(n, None);
    out
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

/// The summed weights `e` of the kept tokens, in f64.
fn kept_mass(kept: &[bool], e: &[f32]) -> f64 {
    kept.iter()
        .zip(e)
        .filter(|(k, _)| **k)
        .map(|(_, &e)| e as f64)
        .sum()
}

/// One row of [`crate::backend::Sampling`]. NaN logits are never kept (like the greedy
/// [`argmax_row`] never picks them); a NaN temperature counts as `<= 0` (greedy).
fn sample_row(row: &[f32], temperature: f32, top_k: i32, top_p: f32, min_p: f32, seed: i64) -> i32 {
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

    // 0. min-p: keep tokens at least min_p as likely as the most likely one.
    if min_p > 0.0 {
        let threshold = min_p.min(1.0);
        for (keep, &e) in kept.iter_mut().zip(&e) {
            *keep &= e >= threshold;
        }
    }

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
        let total = kept_mass(&kept, &e);
        let mut order: Vec<usize> = (0..row.len()).filter(|&i| kept[i]).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        let target = top_p as f64 * total;
        let mut mass = 0f64;
        let mut threshold = None;
        for (j, &i) in order.iter().enumerate() {
            mass += e[i] as f64;
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

    // 3. Inverse CDF over the kept tokens in index order. The sums are f64: a f32 running
    // sum over a large vocabulary drifts by more than a token's share of a flat row
    // (the CUDA kernel sums exact fixed-point masses).
    let mass = kept_mass(&kept, &e);
    let target = uniform_from_seed(seed) as f64 * mass;
    let mut running = 0f64;
    let mut last = None;
    for (i, (&keep, &e)) in kept.iter().zip(&e).enumerate() {
        if !keep {
            continue;
        }
        running += e as f64;
        last = Some(i);
        if running > target {
            return i as i32;
        }
    }
    last.map_or(0, |i| i as i32)
}
