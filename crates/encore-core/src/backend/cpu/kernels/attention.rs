//! Paged attention (decode and prefill): one rayon task per (query row, head), a
//! numerically stable softmax in f32. Semantics: [`crate::backend::Attention`].

use rayon::prelude::*;

use super::{dispatch_float, view, view_mut, Float};
use crate::ops::AttentionDims;
use crate::tensor::{DType, Tensor};
use half::{bf16, f16};

pub(in crate::backend::cpu) struct AttentionArgs {
    pub q: Tensor,
    pub k_cache: Tensor,
    pub v_cache: Tensor,
    pub block_tables: Tensor,
    pub seq_lens: Tensor,
    pub cu_seqlens_q: Option<Tensor>,
    pub scale: f32,
    pub out: Tensor,
    pub dims: AttentionDims,
}

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

fn attention_t<T: Float>(a: &AttentionArgs) {
    let AttentionDims {
        num_heads,
        num_kv_heads,
        head_dim,
        num_blocks,
        block_size,
        table_width,
        ..
    } = a.dims;
    // SAFETY: dtypes validated (q, caches, out T; tables, lengths, cu i32); out is the
    // only tensor written and does not overlap the inputs.
    let (q, kc, vc, tables, lens, cu, out) = unsafe {
        (
            view::<T>(&a.q),
            view::<T>(&a.k_cache),
            view::<T>(&a.v_cache),
            view::<i32>(&a.block_tables),
            view::<i32>(&a.seq_lens),
            a.cu_seqlens_q.as_ref().map(|t| view::<i32>(t)),
            view_mut::<T>(&a.out),
        )
    };
    if out.is_empty() {
        return;
    }
    let group = num_heads / num_kv_heads;
    let capacity = table_width * block_size;
    out.par_chunks_mut(head_dim).enumerate().for_each_init(
        || {
            (
                Vec::<(usize, f32)>::new(),
                vec![0f32; head_dim],
                vec![0f32; head_dim],
            )
        },
        |(scores, qrow, acc), (idx, o)| {
            let (r, h) = (idx / num_heads, idx % num_heads);
            let Some((s, pos)) = query_of(r, lens, cu) else {
                o.fill(T::from_f32(0.0));
                return;
            };
            let kv_head = h / group;
            for (d, v) in qrow
                .iter_mut()
                .zip(&q[idx * head_dim..(idx + 1) * head_dim])
            {
                *d = v.to_f32();
            }
            let table = &tables[s * table_width..(s + 1) * table_width];
            scores.clear();
            let mut max = f32::NEG_INFINITY;
            for t in 0..(pos + 1).min(capacity) {
                let block = table[t / block_size];
                let Some(block) = usize::try_from(block).ok().filter(|&b| b < num_blocks) else {
                    continue;
                };
                let base =
                    ((block * block_size + t % block_size) * num_kv_heads + kv_head) * head_dim;
                let key = &kc[base..base + head_dim];
                let dot: f32 = qrow.iter().zip(key).map(|(q, k)| q * k.to_f32()).sum();
                let score = dot * a.scale;
                max = max.max(score);
                scores.push((base, score));
            }
            if scores.is_empty() {
                o.fill(T::from_f32(0.0));
                return;
            }
            acc.fill(0.0);
            let mut sum = 0f32;
            for &(base, score) in scores.iter() {
                let p = (score - max).exp();
                sum += p;
                for (acc, v) in acc.iter_mut().zip(&vc[base..base + head_dim]) {
                    *acc += p * v.to_f32();
                }
            }
            for (o, acc) in o.iter_mut().zip(acc.iter()) {
                *o = T::from_f32(acc / sum);
            }
        },
    );
}
