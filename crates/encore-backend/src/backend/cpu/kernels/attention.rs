//! Paged attention (decode and prefill), tiled flash-style. Semantics:
//! [`crate::backend::Attention`].
//!
//! Query rows are grouped into tiles: up to [`TILE_ROWS`] consecutive rows of one
//! sequence at consecutive positions (a decode row is a tile of one). One rayon task
//! takes one tile and one KV head, i.e. `rows x group` query vectors (every q head of the
//! GQA group), and walks the keys the tile can see in chunks of [`KEY_CHUNK`] tokens:
//! each chunk's K and V rows are gathered from the paged cache (widened to f32) once for
//! the whole tile, scores `S = Q Kᵀ` and the update `acc += P V` are dense products
//! (`gemm` for large tiles, 8-lane dot products for small ones), and an online softmax
//! in f32 (running max `m`, sum `l`, rescaled accumulator) merges the chunks. Chunks
//! outside every query's `[lo, hi)` (causal, sliding window, table capacity) are never
//! touched, so a small window keeps long contexts cheap. Deterministic: the tiling and
//! every summation order depend on shapes and contents only, never on threads.

use rayon::prelude::*;

use super::{dispatch_float, dot, gemm_f32, view, view_mut, Float, SyncPtr};
use crate::args::KvScale;
use crate::ops::AttentionDims;
use crate::quant::e4m3_table;
use crate::tensor::{DType, Tensor};
use half::{bf16, f16};

pub(in crate::backend::cpu) struct AttentionArgs {
    pub q: Tensor,
    pub k_cache: Tensor,
    pub v_cache: Tensor,
    pub kv_scale: KvScale,
    pub block_tables: Tensor,
    pub seq_lens: Tensor,
    pub cu_seqlens_q: Option<Tensor>,
    pub scale: f32,
    /// Logit soft-capping (`cap * tanh(x / cap)` on each scaled score), `None` for none.
    pub softcap: Option<f32>,
    /// Sliding window in positions (validated `>= 1`), `None` for full causal attention.
    pub window: Option<usize>,
    /// Per-head sink logits, T `[num_heads]` ([`crate::args::Attention::sinks`]).
    pub sinks: Option<Tensor>,
    pub out: Tensor,
    pub dims: AttentionDims,
}

/// Query rows per tile (one sequence, consecutive positions).
const TILE_ROWS: usize = 32;
/// Keys per chunk: gathered once per tile, the `n` of `Q Kᵀ` and the `k` of `P V`.
const KEY_CHUNK: usize = 64;
/// From this many query vectors per tile on, the products go through `gemm` (its
/// runtime-dispatched SIMD kernels); below, dot products and axpys (decode, short chunks).
const GEMM_MIN_QUERIES: usize = 16;

pub(in crate::backend::cpu) fn attention(a: &AttentionArgs) {
    dispatch_float!(a.q.dtype(), attention_t(a))
}

/// The sequence and position of query row `r`, or `None` when the row attends to
/// nothing (padding, beyond `cu[num_seqs]`, negative position).
fn query_of(r: usize, seq_lens: &[i32], cu: Option<&[i32]>) -> Option<(usize, usize)> {
    let (s, last_row) = match cu {
        None => (r, r as i64),
        Some(cu) => {
            let r64 = r as i64;
            // The first sequence whose row range holds `r` (exactly one for a valid,
            // non-decreasing `cu`; garbage never leads outside the tensors).
            let s = (0..seq_lens.len()).find(|&s| cu[s] as i64 <= r64 && r64 < cu[s + 1] as i64)?;
            (s, cu[s + 1] as i64 - 1)
        }
    };
    // The last query of the sequence is at seq_len - 1, earlier ones consecutively before.
    let pos = seq_lens[s] as i64 - 1 - (last_row - r as i64);
    usize::try_from(pos).ok().map(|p| (s, p))
}

/// The keys `[lo, hi)` the query at position `pos` attends to: causal, within the window,
/// and within the block table's capacity. Empty when `lo >= hi`.
fn key_range(pos: usize, window: Option<usize>, capacity: usize) -> (usize, usize) {
    let hi = (pos + 1).min(capacity);
    let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w));
    (lo, hi)
}

/// Consecutive rows `r0..r0 + n` of sequence `seq` at positions `p0..p0 + n`.
struct Tile {
    seq: usize,
    r0: usize,
    n: usize,
    p0: usize,
}

/// Split the rows that attend to something into tiles; rows that attend to nothing are
/// listed in `empty`.
fn tiles(rows: usize, seq_lens: &[i32], cu: Option<&[i32]>) -> (Vec<Tile>, Vec<usize>) {
    let mut tiles: Vec<Tile> = Vec::new();
    let mut empty = Vec::new();
    for r in 0..rows {
        let Some((s, p)) = query_of(r, seq_lens, cu) else {
            empty.push(r);
            continue;
        };
        match tiles.last_mut() {
            Some(t) if t.seq == s && t.r0 + t.n == r && t.p0 + t.n == p && t.n < TILE_ROWS => {
                t.n += 1
            }
            _ => tiles.push(Tile {
                seq: s,
                r0: r,
                n: 1,
                p0: p,
            }),
        }
    }
    (tiles, empty)
}

/// A layer's K or V cache: elements of T, or FP8 bytes (decoded exactly; the scales are
/// folded into the softmax scale and the output).
#[derive(Clone, Copy)]
enum Cache<'a, T> {
    Same(&'a [T]),
    F8(&'a [u8], &'static [f32; 256]),
}

impl<T: Float> Cache<'_, T> {
    /// `dst[i]` = element `at + i` as f32.
    fn widen(&self, at: usize, dst: &mut [f32]) {
        let n = dst.len();
        match *self {
            Cache::Same(c) => T::widen(&c[at..at + n], dst),
            Cache::F8(c, table) => {
                for (d, &b) in dst.iter_mut().zip(&c[at..at + n]) {
                    *d = table[b as usize];
                }
            }
        }
    }
}

/// Per-task buffers, reused across the tasks of one rayon worker.
#[derive(Default)]
struct Work {
    /// Query vectors of the tile, pre-scaled: `[nq, head_dim]`, query `i = row * group + j`.
    q: Vec<f32>,
    /// Gathered keys and values of one chunk: `[KEY_CHUNK, head_dim]`.
    k: Vec<f32>,
    v: Vec<f32>,
    /// Whether chunk token `j` lies in a valid block.
    ok: Vec<bool>,
    /// Scores, then probabilities: `[nq, KEY_CHUNK]`.
    s: Vec<f32>,
    /// Running max and sum per query, unnormalised output `[nq, head_dim]`.
    m: Vec<f32>,
    l: Vec<f32>,
    acc: Vec<f32>,
}

fn attention_t<T: Float>(a: &AttentionArgs) {
    let AttentionDims {
        rows,
        num_heads,
        num_kv_heads,
        head_dim: hd,
        num_blocks,
        block_size,
        table_width,
        ..
    } = a.dims;
    // SAFETY: dtypes validated (q, caches, out T; tables, lengths, cu i32); out is only
    // written through `op` below, at disjoint elements per task, and does not overlap the
    // inputs.
    let (q, tables, lens, cu, sinks) = unsafe {
        (
            view::<T>(&a.q),
            view::<i32>(&a.block_tables),
            view::<i32>(&a.seq_lens),
            a.cu_seqlens_q.as_ref().map(|t| view::<i32>(t)),
            a.sinks.as_ref().map(|t| view::<T>(t)),
        )
    };
    // SAFETY: as above (both caches T, or both F8E4M3: validated).
    let (kc, vc, scale, v_scale) = unsafe {
        if a.k_cache.dtype() == DType::F8E4M3 {
            let t = e4m3_table();
            (
                Cache::<T>::F8(view::<u8>(&a.k_cache), t),
                Cache::<T>::F8(view::<u8>(&a.v_cache), t),
                a.scale * a.kv_scale.k,
                a.kv_scale.v,
            )
        } else {
            (
                Cache::Same(view::<T>(&a.k_cache)),
                Cache::Same(view::<T>(&a.v_cache)),
                a.scale,
                1.0,
            )
        }
    };
    if rows == 0 || num_heads == 0 || hd == 0 {
        return;
    }
    let group = num_heads / num_kv_heads;
    let capacity = table_width * block_size;
    let (tiles, empty) = tiles(rows, lens, cu);
    {
        // SAFETY: as above; this slice is dropped before the tasks write through `op`.
        let out = unsafe { view_mut::<T>(&a.out) };
        for r in empty {
            out[r * num_heads * hd..(r + 1) * num_heads * hd].fill(T::from_f32(0.0));
        }
    }
    let op = SyncPtr(super::ptr_of(&a.out) as *mut T);
    let tasks = tiles.len() * num_kv_heads;
    (0..tasks)
        .into_par_iter()
        .for_each_init(Work::default, |w, task| {
            let tile = &tiles[task / num_kv_heads];
            let g = task % num_kv_heads;
            let nq = tile.n * group;
            // Gather the tile's queries (scaled) and reset the running state.
            w.q.resize(nq * hd, 0.0);
            for r in 0..tile.n {
                for j in 0..group {
                    let src = ((tile.r0 + r) * num_heads + g * group + j) * hd;
                    let dst = &mut w.q[(r * group + j) * hd..(r * group + j + 1) * hd];
                    for (d, s) in dst.iter_mut().zip(&q[src..src + hd]) {
                        *d = s.to_f32() * scale;
                    }
                }
            }
            w.m.clear();
            w.m.resize(nq, f32::NEG_INFINITY);
            w.l.clear();
            w.l.resize(nq, 0.0);
            w.acc.clear();
            w.acc.resize(nq * hd, 0.0);
            w.k.resize(KEY_CHUNK * hd, 0.0);
            w.v.resize(KEY_CHUNK * hd, 0.0);
            w.ok.resize(KEY_CHUNK, false);
            w.s.resize(nq * KEY_CHUNK, 0.0);

            // Keys the tile can see: from the first row's `lo` to the last row's `hi`.
            let (lo, _) = key_range(tile.p0, a.window, capacity);
            let (_, hi) = key_range(tile.p0 + tile.n - 1, a.window, capacity);
            let table = &tables[tile.seq * table_width..(tile.seq + 1) * table_width];
            let mut c0 = lo;
            while c0 < hi {
                let kn = KEY_CHUNK.min(hi - c0);
                // Gather the chunk's K and V rows of KV head g (f32).
                for j in 0..kn {
                    let t = c0 + j;
                    let block = usize::try_from(table[t / block_size])
                        .ok()
                        .filter(|&b| b < num_blocks);
                    w.ok[j] = block.is_some();
                    if let Some(b) = block {
                        let base = ((b * block_size + t % block_size) * num_kv_heads + g) * hd;
                        kc.widen(base, &mut w.k[j * hd..(j + 1) * hd]);
                        vc.widen(base, &mut w.v[j * hd..(j + 1) * hd]);
                    } else {
                        // Never used (probability 0), but keep NaN-free data for gemm.
                        w.k[j * hd..(j + 1) * hd].fill(0.0);
                        w.v[j * hd..(j + 1) * hd].fill(0.0);
                    }
                }
                scores(w, nq, kn, hd);
                if let Some(c) = a.softcap {
                    w.s[..nq * kn]
                        .iter_mut()
                        .for_each(|s| *s = c * (*s / c).tanh());
                }
                let all_ok = w.ok[..kn].iter().all(|&ok| ok);
                // Online softmax per query over this chunk; `s` becomes probabilities.
                for i in 0..nq {
                    let (qlo, qhi) = key_range(tile.p0 + i / group, a.window, capacity);
                    let (jlo, jhi) = (qlo.clamp(c0, c0 + kn) - c0, qhi.clamp(c0, c0 + kn) - c0);
                    let srow = &mut w.s[i * kn..(i + 1) * kn];
                    if jlo >= jhi {
                        srow.fill(0.0);
                        continue;
                    }
                    // Keys outside [jlo, jhi) or in an invalid block get probability 0.
                    srow[..jlo].fill(0.0);
                    srow[jhi..].fill(0.0);
                    let visible = &mut srow[jlo..jhi];
                    if !all_ok {
                        for (s, &ok) in visible.iter_mut().zip(&w.ok[jlo..jhi]) {
                            if !ok {
                                *s = f32::NEG_INFINITY;
                            }
                        }
                    }
                    let mx = max(visible);
                    if mx == f32::NEG_INFINITY {
                        visible.fill(0.0); // only invalid blocks in range
                        continue;
                    }
                    let m_new = w.m[i].max(mx);
                    let corr = (w.m[i] - m_new).exp(); // 0 for the first visible chunk
                    for s in visible.iter_mut() {
                        *s = exp_nonpositive(*s - m_new); // 0 for invalid blocks (-inf)
                    }
                    w.l[i] = w.l[i] * corr + sum(visible);
                    w.m[i] = m_new;
                    if corr != 1.0 {
                        w.acc[i * hd..(i + 1) * hd]
                            .iter_mut()
                            .for_each(|x| *x *= corr);
                    }
                }
                accumulate(w, nq, kn, hd);
                c0 += kn;
            }

            // out = acc / l (zeros for a query that saw no valid key), times an FP8
            // cache's value scale. A sink adds its logit to the softmax's sum: with
            // `m' = max(m, sink)`, `out = acc e^(m - m') / (l e^(m - m') + e^(sink - m'))`.
            for i in 0..nq {
                let (r, j) = (i / group, i % group);
                let inv = match sinks {
                    Some(s) if w.l[i] > 0.0 => {
                        let sink = s[g * group + j].to_f32();
                        let m2 = w.m[i].max(sink);
                        let c = (w.m[i] - m2).exp();
                        v_scale * c / (w.l[i] * c + (sink - m2).exp())
                    }
                    _ if w.l[i] > 0.0 => v_scale / w.l[i],
                    _ => 0.0,
                };
                let at = ((tile.r0 + r) * num_heads + g * group + j) * hd;
                for (d, x) in w.acc[i * hd..(i + 1) * hd].iter().enumerate() {
                    // SAFETY: `at + d < rows * num_heads * head_dim`; (row, head) pairs
                    // belong to exactly one (tile, KV head) task and `empty` rows were
                    // written before the tasks started.
                    unsafe { *op.get().add(at + d) = T::from_f32(x * inv) };
                }
            }
        });
}

/// `e^x` for `x <= 0` (the softmax's `score - max`) in a form that vectorises: Cephes'
/// `expf` (range reduction by `ln 2` in two parts, a degree-5 polynomial, `2^n` built in
/// the exponent bits), within 2 ulp of `f32::exp`. `x < -87` (including `-inf`) gives
/// exactly 0: such terms are below `f32`'s normal range and the row's maximum alone
/// contributes 1 to the sum.
#[inline]
fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5 * 2^23 rounds to an integer held in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let xc = if x < -87.0 { -87.0 } else { x }; // NaN stays NaN
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    // n in [-126, 0]: the exponent field of 2^n is n + 127 in [1, 127].
    let ni = t.to_bits() as i32 - ROUND.to_bits() as i32;
    let scale = f32::from_bits(((ni + 127) << 23) as u32);
    if x < -87.0 {
        0.0
    } else {
        e * scale
    }
}

/// `Σ x` with 8 independent partial sums (so the loop vectorises).
fn sum(x: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for l in 0..8 {
            lanes[l] += c[l];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// The largest element (`-inf` for an empty slice or all `-inf`), with 8 independent
/// maxima so the loop vectorises (a NaN score is never chosen, as with `f32::max`).
fn max(x: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    for c in chunks {
        for l in 0..8 {
            lanes[l] = if c[l] > lanes[l] { c[l] } else { lanes[l] };
        }
    }
    lanes.iter().fold(tail, |m, &v| m.max(v))
}

/// `s[i][j] = q_i · k_j` for `nq` queries and `kn` keys (`s` is `[nq, kn]`).
fn scores(w: &mut Work, nq: usize, kn: usize, hd: usize) {
    if nq < GEMM_MIN_QUERIES {
        for i in 0..nq {
            let qi = &w.q[i * hd..(i + 1) * hd];
            for j in 0..kn {
                w.s[i * kn + j] = dot(qi, &w.k[j * hd..(j + 1) * hd]);
            }
        }
        return;
    }
    // rhs element (d, j) is `k[j * hd + d]`: the keys are the columns.
    gemm_f32(nq, kn, hd, &mut w.s, &w.q, &w.k, (1, hd), false);
}

/// `acc_i += Σ_j p[i][j] v_j` for `nq` queries and `kn` values (`p` in `s`, `[nq, kn]`).
///
/// NOTE: through `gemm`, a key invisible to query `i` (`p = 0`) but visible to another
/// query of the tile still enters as `0 · v`: a non-finite value in such a row would reach
/// `i`. Every such key is a real token of the sequence (positions below its `seq_len`,
/// K/V written by the forward), so this only matters when the cache already holds NaN.
/// Keys of invalid blocks are gathered as zeros and never reach anyone.
fn accumulate(w: &mut Work, nq: usize, kn: usize, hd: usize) {
    if nq < GEMM_MIN_QUERIES {
        for i in 0..nq {
            let acc = &mut w.acc[i * hd..(i + 1) * hd];
            for j in 0..kn {
                let p = w.s[i * kn + j];
                if p != 0.0 {
                    for (a, v) in acc.iter_mut().zip(&w.v[j * hd..(j + 1) * hd]) {
                        *a += p * v;
                    }
                }
            }
        }
        return;
    }
    // rhs element (j, d) is `v[j * hd + d]`: the values are the rows.
    gemm_f32(nq, hd, kn, &mut w.acc, &w.s, &w.v, (hd, 1), true);
}

#[cfg(test)]
mod tests {
    use super::exp_nonpositive;

    #[test]
    fn exp_nonpositive_is_within_2_ulp_of_exp() {
        let mut worst = 0f64;
        for i in 0..=2_000_000 {
            let x = -87.0 * i as f32 / 2_000_000.0;
            let (got, want) = (exp_nonpositive(x) as f64, (x as f64).exp());
            worst = worst.max((got - want).abs() / want);
        }
        // 2 ulp of f32 is 2.4e-7 relative.
        assert!(worst < 2.4e-7, "worst relative error {worst:.2e}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(-87.5), 0.0);
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
        assert!(exp_nonpositive(f32::NAN).is_nan());
    }
}
