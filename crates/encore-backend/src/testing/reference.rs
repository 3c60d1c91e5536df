//! A naive f64 version of every op on plain host data, written from the semantics on
//! [`crate::backend::Backend`] and independently of the kernels: the yardstick the CPU
//! kernels are tested against (`check_cpu_against_reference`).
//!
//! Inputs are the values the tensors hold (already rounded to their dtype); outputs are
//! exact f64 results, not rounded. The one rounding a reference models is a value an op
//! *stores and then reads back*: `rms_norm`'s updated residual.

use crate::ops::uniform_from_seed;
use crate::tensor::DType;

/// `v` as a tensor of float dtype `dtype` would store it.
pub fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::BF16 => half::bf16::from_f64(v).to_f64(),
        DType::F16 => half::f16::from_f64(v).to_f64(),
        _ => v as f32 as f64,
    }
}

/// Rows `ids - first` of `table` (zero rows for ids outside it).
pub fn embedding(ids: &[i32], table: &[f64], hidden: usize, first: usize) -> Vec<f64> {
    let vocab = table.len() / hidden.max(1);
    let mut out = Vec::new();
    for &id in ids {
        let id = id as i64 - first as i64;
        if id >= 0 && (id as usize) < vocab {
            out.extend_from_slice(&table[id as usize * hidden..(id as usize + 1) * hidden]);
        } else {
            out.extend(std::iter::repeat_n(0.0, hidden));
        }
    }
    out
}

/// Returns `out` and, with a residual, the updated residual (rounded to `dtype`).
pub fn rms_norm(
    x: &[f64],
    residual: Option<&[f64]>,
    weight: &[f64],
    eps: f64,
    dtype: DType,
) -> (Vec<f64>, Option<Vec<f64>>) {
    norm(x, residual, weight, None, eps, dtype)
}

/// [`rms_norm`], or with `bias` LayerNorm: `(x - mean) / sqrt(var + eps) * weight + bias`,
/// var the population variance.
pub fn norm(
    x: &[f64],
    residual: Option<&[f64]>,
    weight: &[f64],
    bias: Option<&[f64]>,
    eps: f64,
    dtype: DType,
) -> (Vec<f64>, Option<Vec<f64>>) {
    let dim = weight.len();
    let summed: Option<Vec<f64>> = residual.map(|r| {
        r.iter()
            .zip(x)
            .map(|(r, x)| round_to(dtype, r + x))
            .collect()
    });
    let input = summed.as_deref().unwrap_or(x);
    let mut out = Vec::new();
    for row in input.chunks(dim) {
        let n = dim as f64;
        match bias {
            None => {
                let mean_sq = row.iter().map(|v| v * v).sum::<f64>() / n;
                for i in 0..dim {
                    out.push(row[i] / (mean_sq + eps).sqrt() * weight[i]);
                }
            }
            Some(b) => {
                let mean = row.iter().sum::<f64>() / n;
                let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
                for i in 0..dim {
                    out.push((row[i] - mean) / (var + eps).sqrt() * weight[i] + b[i]);
                }
            }
        }
    }
    (out, summed)
}

/// Rotates `x` (`[n, heads, head_dim]`) in place: the rotary part of `qkv_rope_write`.
pub fn rope(x: &mut [f64], positions: &[i32], cos_sin: &[f64], head_dim: usize, rot: usize) {
    let max_positions = cos_sin.len() / rot;
    let heads = x.len() / positions.len().max(1) / head_dim;
    for (i, &p) in positions.iter().enumerate() {
        if p < 0 || p as usize >= max_positions {
            continue;
        }
        let table = &cos_sin[p as usize * rot..(p as usize + 1) * rot];
        for h in 0..heads {
            let base = (i * heads + h) * head_dim;
            for j in 0..rot / 2 {
                let (c, s) = (table[j], table[rot / 2 + j]);
                let a = x[base + j];
                let b = x[base + rot / 2 + j];
                x[base + j] = a * c - b * s;
                x[base + rot / 2 + j] = b * c + a * s;
            }
        }
    }
}

pub fn silu_mul(gate_up: &[f64], inter: usize) -> Vec<f64> {
    act_mul(crate::args::Activation::Silu, gate_up, inter)
}

/// `act(gate) * up` per row of `[gate | up]`, in f64.
pub fn act_mul(act: crate::args::Activation, gate_up: &[f64], inter: usize) -> Vec<f64> {
    let mut out = Vec::new();
    for row in gate_up.chunks(2 * inter) {
        for j in 0..inter {
            out.push(act.gated_f64(row[j], row[inter + j]));
        }
    }
    out
}

pub fn matmul(
    x: &[f64],
    w: &[f64],
    bias: Option<&[f64]>,
    m: usize,
    n: usize,
    k: usize,
) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = bias.map_or(0.0, |b| b[j]);
            for l in 0..k {
                acc += x[i * k + l] * w[j * k + l];
            }
            out[i * n + j] = acc;
        }
    }
    out
}

/// Writes rows of `k`/`v` (each `row_len` long) into the caches at their slots: the cache
/// part of `qkv_rope_write`.
pub fn kv_write(
    k: &[f64],
    v: &[f64],
    k_cache: &mut [f64],
    v_cache: &mut [f64],
    slot_mapping: &[i32],
    row_len: usize,
) {
    let slots = k_cache.len() / row_len;
    for (i, &slot) in slot_mapping.iter().enumerate() {
        if slot < 0 || slot as usize >= slots {
            continue;
        }
        let s = slot as usize;
        k_cache[s * row_len..(s + 1) * row_len].copy_from_slice(&k[i * row_len..(i + 1) * row_len]);
        v_cache[s * row_len..(s + 1) * row_len].copy_from_slice(&v[i * row_len..(i + 1) * row_len]);
    }
}

/// Host data of one attention launch.
pub struct AttentionRef<'a> {
    pub q: &'a [f64],
    pub k_cache: &'a [f64],
    pub v_cache: &'a [f64],
    pub block_tables: &'a [i32],
    pub seq_lens: &'a [i32],
    pub cu_seqlens_q: Option<&'a [i32]>,
    pub scale: f64,
    /// Logit soft-capping: a scaled score `x` becomes `cap * tanh(x / cap)`.
    pub softcap: Option<f64>,
    /// Sliding window: keys at positions `pos - w < t <= pos` only.
    pub window: Option<usize>,
    /// Per-head sink logits: one more logit in each head's softmax, its probability
    /// dropped (gpt-oss).
    pub sinks: Option<&'a [f64]>,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
}

pub fn attention(a: &AttentionRef<'_>) -> Vec<f64> {
    let (nh, kvh, hd, bs) = (a.num_heads, a.num_kv_heads, a.head_dim, a.block_size);
    let rows = a.q.len() / (nh * hd);
    let num_seqs = a.seq_lens.len();
    let width = a.block_tables.len() / num_seqs.max(1);
    let num_blocks = a.k_cache.len() / (bs * kvh * hd);
    let mut out = vec![0.0; a.q.len()];
    for r in 0..rows {
        // Which sequence this row belongs to, and how many rows of it come after it.
        let (s, after) = match a.cu_seqlens_q {
            None => (r, 0),
            Some(cu) => match (0..num_seqs)
                .find(|&s| cu[s] as i64 <= r as i64 && (r as i64) < cu[s + 1] as i64)
            {
                Some(s) => (s, cu[s + 1] as i64 - 1 - r as i64),
                None => continue,
            },
        };
        let pos = a.seq_lens[s] as i64 - 1 - after;
        if pos < 0 {
            continue;
        }
        let context = ((pos + 1) as usize).min(width * bs);
        let first = a.window.map_or(0, |w| (pos + 1 - w as i64).max(0) as usize);
        for h in 0..nh {
            let g = h / (nh / kvh);
            let q = &a.q[(r * nh + h) * hd..(r * nh + h + 1) * hd];
            let mut keys = Vec::new();
            for t in first..context {
                let block = a.block_tables[s * width + t / bs];
                if block < 0 || block as usize >= num_blocks {
                    continue;
                }
                let at = ((block as usize * bs + t % bs) * kvh + g) * hd;
                let score: f64 = (0..hd).map(|i| q[i] * a.k_cache[at + i]).sum::<f64>() * a.scale;
                let score = a.softcap.map_or(score, |c| c * (score / c).tanh());
                keys.push((at, score));
            }
            if keys.is_empty() {
                continue; // attends to nothing: zeros, sink or not
            }
            let sink = a.sinks.map(|s| s[h]);
            let max = keys
                .iter()
                .map(|k| k.1)
                .chain(sink)
                .fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = keys.iter().map(|k| (k.1 - max).exp()).sum::<f64>()
                + sink.map_or(0.0, |s| (s - max).exp());
            for &(at, score) in &keys {
                let p = (score - max).exp() / total;
                for i in 0..hd {
                    out[(r * nh + h) * hd + i] += p * a.v_cache[at + i];
                }
            }
        }
    }
    out
}

/// Per row: the smallest index of the largest non-NaN logit (0 if all are NaN): greedy
/// sampling.
pub fn argmax(logits: &[f64], vocab: usize) -> Vec<i32> {
    logits
        .chunks(vocab)
        .map(|row| {
            let mut best = 0;
            let mut best_value = f64::NAN;
            for (i, &v) in row.iter().enumerate() {
                if !v.is_nan() && (best_value.is_nan() || v > best_value) {
                    best = i;
                    best_value = v;
                }
            }
            best as i32
        })
        .collect()
}

/// A row's token log-probability and top `(id, log-probability)` entries.
pub type RowLogprobs = (f64, Vec<(i32, f64)>);

/// What [`sample`] computes: per row the token and, for rows asking, the token's
/// log-probability and the top `(id, log-probability)` entries; and the count table after
/// the rows' tokens are counted.
pub struct SampleRef {
    pub ids: Vec<i32>,
    pub logprobs: Vec<Option<RowLogprobs>>,
    pub counts: Vec<i32>,
}

/// A logit after the penalties of [`crate::backend::Penalties`]: each step rounded to
/// f32 as the semantics say (a value the op computes and reads back; in f64 near-ties
/// would order differently).
pub fn penalise(l: f32, c: i32, repetition: f32, frequency: f32, presence: f32) -> f64 {
    let r = |v: f64| v as f32 as f64;
    let n = c & (crate::backend::PROMPT_BIT - 1);
    let mut v = l as f64;
    if c != 0 {
        v = r(if v > 0.0 {
            v / repetition as f64
        } else {
            v * repetition as f64
        });
    }
    if n > 0 {
        v = r(v - r(frequency as f64 * n as f64));
        v = r(v - presence as f64);
    }
    v
}

/// Per row, what [`crate::backend::Sampling`] describes (NaN logits are never kept, and a
/// masked-out token reads as NaN), on the inputs' f32 values taken as f64.
pub fn sample(i: &super::inputs::SampleInputs) -> SampleRef {
    let vocab = i.vocab;
    let mut counts = i
        .penalties
        .as_ref()
        .map_or(Vec::new(), |p| p.counts.clone());
    let mut ids = Vec::new();
    let mut logprobs = Vec::new();
    for r in 0..i.batch {
        let (l, slot) = row_logits(i, r);
        let token = sample_row(
            &l,
            i.temperature[r],
            i.top_k[r],
            i.top_p[r],
            i.min_p[r],
            i.seeds[r],
        );
        ids.push(token);
        logprobs.push(i.logprobs.as_ref().and_then(|(num, width)| {
            let n = usize::try_from(num[r]).ok()?.min(*width);
            let valid: Vec<usize> = (0..vocab).filter(|&t| !l[t].is_nan()).collect();
            let m = valid
                .iter()
                .map(|&t| l[t])
                .fold(f64::NEG_INFINITY, f64::max);
            let ln_sum = valid.iter().map(|&t| (l[t] - m).exp()).sum::<f64>().ln();
            let lp = |v: f64| v - m - ln_sum;
            let mut order = valid.clone();
            order.sort_by(|&a, &b| l[b].partial_cmp(&l[a]).unwrap().then(a.cmp(&b)));
            let mut top: Vec<(i32, f64)> = order
                .iter()
                .take(n)
                .map(|&t| (t as i32, lp(l[t])))
                .collect();
            top.resize(n, (-1, f64::NEG_INFINITY));
            let scored = i
                .target
                .as_ref()
                .and_then(|t| usize::try_from(t[r]).ok())
                .filter(|&t| t < vocab)
                .unwrap_or(token as usize);
            Some((lp(l[scored]), top))
        }));
        if let Some(s) = slot {
            counts[s * vocab + token as usize] += 1;
        }
    }
    SampleRef {
        ids,
        logprobs,
        counts,
    }
}

/// One row of [`sample`] on (penalised) logits `l`.
fn sample_row(l: &[f64], temperature: f32, top_k: i32, top_p: f32, min_p: f32, seed: i64) -> i32 {
    let Some(w) = kept_weights(l, temperature, top_k, top_p, min_p) else {
        return argmax(l, l.len())[0];
    };
    let z_kept: f64 = w.iter().sum();
    let target = uniform_from_seed(seed) as f64 * z_kept;
    let mut running = 0.0;
    let mut chosen = None;
    for (i, &m) in w.iter().enumerate() {
        if m > 0.0 {
            running += m;
            chosen = Some(i);
            if running > target {
                break;
            }
        }
    }
    chosen.unwrap_or(0) as i32
}

/// Where row `r`'s draw lands against `token`: the kept mass before `token`, through it,
/// and the draw's target, each a fraction of the kept mass (in index order, as the draw
/// walks); `None` for a greedy row. A sampled token is right when `lo <= target < hi`.
pub fn draw_interval(
    i: &super::inputs::SampleInputs,
    r: usize,
    token: usize,
) -> Option<(f64, f64, f64)> {
    let (l, _) = row_logits(i, r);
    let w = kept_weights(&l, i.temperature[r], i.top_k[r], i.top_p[r], i.min_p[r])?;
    let z: f64 = w.iter().sum();
    let lo: f64 = w.get(..token)?.iter().sum();
    let hi = lo + w.get(token)?;
    Some((lo / z, hi / z, uniform_from_seed(i.seeds[r]) as f64))
}

/// Row `r`'s logits as sampling reads them (penalised, a masked-out token NaN), with its
/// penalty slot.
fn row_logits(i: &super::inputs::SampleInputs, r: usize) -> (Vec<f64>, Option<usize>) {
    let vocab = i.vocab;
    let mut l: Vec<f64> = i.logits[r * vocab..(r + 1) * vocab]
        .iter()
        .map(|&v| v as f64)
        .collect();
    let slot = i.penalties.as_ref().and_then(|p| {
        let s = usize::try_from(p.slot[r]).ok().filter(|&s| s < p.slots)?;
        for (t, v) in l.iter_mut().enumerate() {
            *v = penalise(
                *v as f32,
                p.counts[s * vocab + t],
                p.repetition[r],
                p.frequency[r],
                p.presence[r],
            );
        }
        Some(s)
    });
    if let Some((bits, on, words)) = &i.mask {
        if on[r] != 0 {
            for (t, v) in l.iter_mut().enumerate() {
                if (bits[r * words + t / 32] as u32 >> (t % 32)) & 1 == 0 {
                    *v = f64::NAN;
                }
            }
        }
    }
    (l, slot)
}

/// The weights a draw of (penalised) logits `l` walks: `exp(l / t - max)` for the tokens
/// min-p, top-k and top-p keep, 0 for the others; `None` when the row is greedy.
fn kept_weights(
    l: &[f64],
    temperature: f32,
    top_k: i32,
    top_p: f32,
    min_p: f32,
) -> Option<Vec<f64>> {
    let vocab = l.len();
    let t = temperature as f64;
    if t.is_nan() || t <= 0.0 {
        return None;
    }
    let z: Vec<f64> = l.iter().map(|v| v / t).collect();
    let max = z
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = z
        .iter()
        .map(|v| if v.is_nan() { 0.0 } else { (v - max).exp() })
        .collect();
    let mut keep: Vec<bool> = l.iter().map(|v| !v.is_nan()).collect();

    if min_p > 0.0 {
        let threshold = (min_p as f64).min(1.0);
        for i in 0..vocab {
            keep[i] = keep[i] && e[i] >= threshold;
        }
    }

    let mut sorted: Vec<f64> = l.iter().copied().filter(|v| !v.is_nan()).collect();
    sorted.sort_by(|a, b| b.partial_cmp(a).unwrap());
    if top_k > 0 && (top_k as usize) < vocab && (top_k as usize) < sorted.len() {
        let threshold = sorted[top_k as usize - 1];
        for i in 0..vocab {
            keep[i] = keep[i] && l[i] >= threshold;
        }
    }

    let p = top_p as f64;
    if p > 0.0 && p < 1.0 {
        let total: f64 = (0..vocab).filter(|&i| keep[i]).map(|i| e[i]).sum();
        let mut candidates: Vec<f64> = (0..vocab).filter(|&i| keep[i]).map(|i| l[i]).collect();
        candidates.sort_by(|a, b| b.partial_cmp(a).unwrap());
        candidates.dedup();
        // The largest candidate threshold whose mass reaches top_p * total (the mass
        // only grows as the threshold falls, so the first one found going down).
        let mut mass = 0.0;
        let mut idx: Vec<usize> = (0..vocab).filter(|&i| keep[i]).collect();
        idx.sort_by(|&a, &b| l[b].partial_cmp(&l[a]).unwrap());
        let mut next = 0;
        for &tau in &candidates {
            while next < idx.len() && l[idx[next]] >= tau {
                mass += e[idx[next]];
                next += 1;
            }
            if mass >= p * total {
                for i in 0..vocab {
                    keep[i] = keep[i] && l[i] >= tau;
                }
                break;
            }
        }
    }

    Some(
        (0..vocab)
            .map(|i| if keep[i] { e[i] } else { 0.0 })
            .collect(),
    )
}
