//! The attention block's prologue: `qkv_rope_write` (semantics on
//! `crate::backend::QkvRope`): head norms, rotary embedding, and the K/V write into a
//! paged cache of the dtype or FP8.

use super::{dispatch_float, view, view_mut, Float};
use crate::args::KvScale;
use crate::ops::QkvRopeDims;
use crate::quant;
use crate::tensor::{DType, Tensor};
use half::{bf16, f16};

/// Tensors of one `qkv_rope_write` (semantics on `crate::backend::QkvRope`).
pub(in crate::backend::cpu) struct QkvRopeArgs {
    pub qkv: Tensor,
    pub head_norm: Option<(Tensor, Tensor)>,
    pub eps: f32,
    pub positions: Tensor,
    pub cos_sin: Tensor,
    pub slot_mapping: Tensor,
    pub q_out: Tensor,
    pub k_cache: Tensor,
    pub v_cache: Tensor,
    pub kv_scale: KvScale,
}

pub(in crate::backend::cpu) fn qkv_rope_write(a: &QkvRopeArgs, d: &QkvRopeDims) {
    dispatch_float!(a.qkv.dtype(), qkv_rope_write_t(a, d))
}

/// Where a `qkv_rope_write` stores one head's keys or values: a cache of T as they are, an
/// FP8 cache times the scale's reciprocal in E4M3.
enum KvDst<'a, T> {
    Same(&'a mut [T]),
    F8(&'a mut [u8], f32),
}

impl<T: Float> KvDst<'_, T> {
    /// Store `head` (values T holds exactly) at elements `at..at + head.len()`.
    fn store(&mut self, at: usize, head: impl Iterator<Item = f32>) {
        match self {
            KvDst::Same(c) => c[at..]
                .iter_mut()
                .zip(head)
                .for_each(|(o, x)| *o = T::from_f32(x)),
            KvDst::F8(c, inv) => c[at..]
                .iter_mut()
                .zip(head)
                .for_each(|(o, x)| *o = quant::f32_to_e4m3(x * *inv)),
        }
    }
}

fn qkv_rope_write_t<T: Float>(a: &QkvRopeArgs, d: &QkvRopeDims) {
    let hd = d.head_dim;
    let (nh, kvh) = (d.num_heads, d.num_kv_heads);
    let row = (nh + 2 * kvh) * hd;
    let slots = d.num_blocks * d.block_size;
    let half = d.rot / 2;
    // SAFETY: dtypes and shapes validated; q_out and the caches are distinct from each
    // other and from every input.
    let (qkv, pos, cs, sm, q_out) = unsafe {
        (
            view::<T>(&a.qkv),
            view::<i32>(&a.positions),
            view::<f32>(&a.cos_sin),
            view::<i32>(&a.slot_mapping),
            view_mut::<T>(&a.q_out),
        )
    };
    let (k_inv, v_inv) = a.kv_scale.inverse();
    // SAFETY: as above (the cache dtypes were validated: both T or both F8E4M3).
    let (mut kc, mut vc) = unsafe {
        if a.k_cache.dtype() == DType::F8E4M3 {
            (
                KvDst::<T>::F8(view_mut::<u8>(&a.k_cache), k_inv),
                KvDst::<T>::F8(view_mut::<u8>(&a.v_cache), v_inv),
            )
        } else {
            (
                KvDst::Same(view_mut::<T>(&a.k_cache)),
                KvDst::Same(view_mut::<T>(&a.v_cache)),
            )
        }
    };
    // SAFETY: as above (weights are only read).
    let norms = a
        .head_norm
        .as_ref()
        .map(|(qn, kn)| unsafe { (view::<T>(qn), view::<T>(kn)) });
    let mut head = vec![0f32; hd];
    // One head: optional RMSNorm (rounded to T), rope (rounded to T), left in `head`.
    let process = |head: &mut [f32], src: &[T], norm: Option<&[T]>, p: Option<usize>| {
        for (h, x) in head.iter_mut().zip(src) {
            *h = x.to_f32();
        }
        if let Some(w) = norm {
            let mean_sq = head.iter().map(|v| v * v).sum::<f32>() / hd as f32;
            let inv = 1.0 / (mean_sq + a.eps).sqrt();
            for (h, w) in head.iter_mut().zip(w) {
                *h = T::from_f32(*h * inv * w.to_f32()).to_f32();
            }
        }
        if let Some(p) = p {
            let (cos, sin) = cs[p * d.rot..(p + 1) * d.rot].split_at(half);
            for i in 0..half {
                let (x, y) = (head[i], head[i + half]);
                head[i] = T::from_f32(x * cos[i] - y * sin[i]).to_f32();
                head[i + half] = T::from_f32(y * cos[i] + x * sin[i]).to_f32();
            }
        }
    };
    for i in 0..d.n {
        let src = &qkv[i * row..(i + 1) * row];
        let p = usize::try_from(pos[i])
            .ok()
            .filter(|&p| p < d.max_positions);
        for h in 0..nh {
            let dst = &mut q_out[(i * nh + h) * hd..(i * nh + h + 1) * hd];
            process(&mut head, &src[h * hd..(h + 1) * hd], norms.map(|n| n.0), p);
            for (o, x) in dst.iter_mut().zip(&head) {
                *o = T::from_f32(*x);
            }
        }
        let Some(slot) = usize::try_from(sm[i]).ok().filter(|&s| s < slots) else {
            continue;
        };
        for h in 0..kvh {
            let at = (slot * kvh + h) * hd;
            let k = &src[(nh + h) * hd..(nh + h + 1) * hd];
            process(&mut head, k, norms.map(|n| n.1), p);
            kc.store(at, head.iter().copied());
            let v = &src[(nh + kvh + h) * hd..(nh + kvh + h + 1) * hd];
            vc.store(at, v.iter().map(|x| x.to_f32()));
        }
    }
}
