//! The mixture-of-experts kernel on the CPU: routing, the expert cache's plan and fill,
//! and the chosen experts' gate/up, SiLU and weighted down projections.

use super::*;

/// [`crate::args::Moe`]'s tensors, owned for the queue.
pub(in crate::backend::cpu) struct MoeArgs {
    pub x: Tensor,
    pub logits: Tensor,
    pub renormalize: bool,
    /// The experts' activation and their gate/up and down biases
    /// ([`crate::args::MoeBias`]).
    pub act: Activation,
    pub bias: Option<(Tensor, Tensor)>,
    pub gate_up: Tensor,
    pub down: Tensor,
    pub ids: Tensor,
    pub weights: Tensor,
    pub out: Tensor,
    /// The expert cache's tensors and its decay.
    pub cache: Option<(crate::backend::ExpertSlots, f32)>,
    /// A later layer's experts fetched ahead ([`crate::args::ExpertPrefetch`]).
    pub prefetch: Option<PrefetchArgs>,
}

/// [`crate::args::ExpertPrefetch`]'s tensors, owned for the queue.
pub(in crate::backend::cpu) struct PrefetchArgs {
    pub logits: Tensor,
    pub ids: Tensor,
    pub weights: Tensor,
    pub gate_up: Tensor,
    pub down: Tensor,
    pub fills: Tensor,
}

pub(in crate::backend::cpu) fn moe(a: &MoeArgs, d: &MoeDims) {
    dispatch_float!(a.x.dtype(), moe_t(a, d))
}

/// The bytes of a tensor.
///
/// # Safety
/// Nothing writes `t` while the slice lives.
unsafe fn bytes_of(t: &Tensor) -> &[u8] {
    // SAFETY: t's view lies inside its buffer and spans size_bytes() bytes.
    unsafe { std::slice::from_raw_parts(ptr_of(t) as *const u8, t.size_bytes()) }
}

/// The rows of a weight in T or quantized, each decoded to f32 on request: rows of `k`
/// values, `row_bytes` each, anywhere in `bytes` (a row starts at any multiple of T's
/// size).
struct WeightRows<'a, T> {
    bytes: &'a [u8],
    fmt: Option<QuantFormat>,
    k: usize,
    row_bytes: usize,
    _t: std::marker::PhantomData<T>,
}

impl<'a, T: Float> WeightRows<'a, T> {
    /// Rows of `k` values of `dtype` (T or quantized, validated) in `bytes`.
    fn new(bytes: &'a [u8], dtype: DType, k: usize) -> Self {
        let fmt = match dtype {
            DType::Q(fmt) => Some(fmt),
            _ => None,
        };
        WeightRows {
            bytes,
            fmt,
            k,
            row_bytes: dtype.bytes(&[1, k]).expect("a weight has whole rows"),
            _t: std::marker::PhantomData,
        }
    }

    /// The row at byte `off`.
    fn row_at(&self, off: usize, out: &mut [f32]) {
        let b = &self.bytes[off..off + self.row_bytes];
        match self.fmt {
            Some(fmt) => quant::dequantize_row(fmt, b, out),
            None => {
                assert!(b.as_ptr().cast::<T>().is_aligned(), "a T row is T-aligned");
                // SAFETY: b spans k values of T, aligned (asserted); T is plain data.
                let v = unsafe { std::slice::from_raw_parts(b.as_ptr().cast::<T>(), self.k) };
                T::widen(v, out)
            }
        }
    }
}

/// Where each expert's rows lie: the stacks (expert `e`'s gate rows at `e I`, its up rows
/// at `E I + e I`, its down rows at `e H`), or the expert cache's slots (`slot_of`).
struct ExpertRows<'a, T> {
    gu: WeightRows<'a, T>,
    dn: WeightRows<'a, T>,
    slot_of: Option<&'a [i32]>,
    gu_stride: usize,
    up_off: usize,
    dn_stride: usize,
}

impl<T: Float> ExpertRows<'_, T> {
    fn slot(&self, e: usize) -> usize {
        match self.slot_of {
            Some(m) => usize::try_from(m[e]).expect("a routed expert has a slot"),
            None => e,
        }
    }

    fn gate(&self, e: usize, j: usize, out: &mut [f32]) {
        let off = self.slot(e) * self.gu_stride + j * self.gu.row_bytes;
        self.gu.row_at(off, out)
    }

    fn up(&self, e: usize, j: usize, out: &mut [f32]) {
        let off = self.slot(e) * self.gu_stride + self.up_off + j * self.gu.row_bytes;
        self.gu.row_at(off, out)
    }

    fn down(&self, e: usize, h: usize, out: &mut [f32]) {
        let off = self.slot(e) * self.dn_stride + h * self.dn.row_bytes;
        self.dn.row_at(off, out)
    }
}

/// The expert cache's step for one layer (see [`crate::args::ExpertCache`]): count the
/// pairs, update the scores, look each needed expert up, give each miss (in ascending
/// expert order) the unpinned slot of least score, and record the fills. The CUDA kernel
/// `moe_cache_plan` makes the same decisions.
///
/// A prefetch (`pin`: the current call's layer and chosen experts; see
/// [`crate::args::ExpertPrefetch`]) plans `layer`'s predicted experts the same way, but the
/// slots holding the current call's experts stay pinned, the scores are left alone, it
/// stops when no unpinned slot is left, and it counts into `stats[3]` and `stats[4]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn expert_cache_plan(
    ids: &[i32],
    experts: usize,
    layer: usize,
    pin: Option<(usize, &[i32])>,
    slot_of: &mut [i32],
    owner: &mut [i32],
    score: &mut [f32],
    fills: &mut [i32],
    stats: &mut [i64],
    decay: f32,
    expert_bytes: usize,
) {
    let count = |ids: &[i32]| {
        let mut need = vec![0u32; experts];
        for &e in ids {
            if let Some(n) = usize::try_from(e).ok().and_then(|e| need.get_mut(e)) {
                *n += 1;
            }
        }
        need
    };
    let need = count(ids);
    let (pin_layer, pin_need) = match pin {
        Some((l, ids)) => (l, count(ids)),
        None => (usize::MAX, vec![0; experts]),
    };
    let base = layer * experts;
    if pin.is_none() {
        for (s, &n) in score[base..base + experts].iter_mut().zip(&need) {
            *s = s.mul_add(decay, n as f32);
        }
    }
    let (mut distinct, mut hits, mut misses) = (0i64, 0i64, 0usize);
    let pinned = |o: i32, need: &[u32]| {
        let (l, e) = (o as usize / experts, o as usize % experts);
        o >= 0 && ((l == layer && need[e] > 0) || (l == pin_layer && pin_need[e] > 0))
    };
    for e in 0..experts {
        if need[e] == 0 {
            continue;
        }
        distinct += 1;
        if slot_of[base + e] >= 0 {
            hits += 1;
            continue;
        }
        let key = |s: usize| {
            let o = owner[s];
            if o < 0 {
                -1.0
            } else {
                score[o as usize]
            }
        };
        let victim = (0..owner.len())
            .filter(|&s| !pinned(owner[s], &need))
            .min_by(|&a, &b| key(a).total_cmp(&key(b)).then(a.cmp(&b)));
        let Some(victim) = victim else {
            // Only a prefetch runs out: a plan's slots hold every expert a step needs
            // (checked).
            assert!(pin.is_some(), "the slots hold every expert a step needs");
            break;
        };
        if owner[victim] >= 0 {
            slot_of[owner[victim] as usize] = -1;
        }
        owner[victim] = (base + e) as i32;
        slot_of[base + e] = victim as i32;
        fills[1 + 2 * misses] = e as i32;
        fills[2 + 2 * misses] = victim as i32;
        misses += 1;
    }
    fills[0] = misses as i32;
    if pin.is_some() {
        stats[4] += misses as i64;
    } else {
        stats[0] += distinct;
        stats[1] += hits;
        stats[2] += misses as i64;
    }
    stats[3] += (misses * expert_bytes) as i64;
}

/// Softmax over each row's `experts` logits in f32, its top k by probability (ties to the
/// lower index) into `ids` and their weights (renormalized on request) into `wts`.
fn route_rows(logits: &[f32], experts: usize, renormalize: bool, ids: &mut [i32], wts: &mut [f32]) {
    let top_k = ids.len() / (logits.len() / experts).max(1);
    ids.par_chunks_mut(top_k)
        .zip(wts.par_chunks_mut(top_k))
        .enumerate()
        .for_each(|(t, (id, wt))| {
            let l = &logits[t * experts..(t + 1) * experts];
            let mx = l.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let mut p: Vec<f32> = l.iter().map(|&v| (v - mx).exp()).collect();
            let sum: f32 = p.iter().sum();
            p.iter_mut().for_each(|v| *v /= sum);
            let mut order: Vec<usize> = (0..experts).collect();
            order.sort_by(|&i, &j| p[j].total_cmp(&p[i]).then(i.cmp(&j)));
            let chosen = &order[..top_k];
            let total: f32 = chosen.iter().map(|&e| p[e]).sum();
            for (s, &e) in chosen.iter().enumerate() {
                id[s] = e as i32;
                wt[s] = if renormalize { p[e] / total } else { p[e] };
            }
        });
}

/// Logits `t` (f32 or T) as f32.
///
/// # Safety
/// Nothing writes `t` while the result lives.
unsafe fn logits_f32<T: Float>(t: &Tensor) -> Cow<'_, [f32]> {
    match t.dtype() {
        // SAFETY: the caller's.
        DType::F32 => Cow::Borrowed(unsafe { view::<f32>(t) }),
        _ => to_f32(unsafe { view::<T>(t) }),
    }
}

/// Copy each of `fills`' experts from the host stacks into its slot (the CUDA kernel
/// `moe_cache_fill`).
#[allow(clippy::too_many_arguments)]
fn fill_slots(
    fills: &[i32],
    gu_host: &[u8],
    dn_host: &[u8],
    experts: usize,
    half: usize,
    down: usize,
    gu_slots: &mut [u8],
    gate_up_slot: usize,
    dn_slots: &mut [u8],
    down_slot: usize,
) {
    for f in 0..fills[0] as usize {
        let (e, s) = (fills[1 + 2 * f] as usize, fills[2 + 2 * f] as usize);
        let g = &mut gu_slots[s * gate_up_slot..][..2 * half];
        g[..half].copy_from_slice(&gu_host[e * half..][..half]);
        g[half..].copy_from_slice(&gu_host[(experts + e) * half..][..half]);
        dn_slots[s * down_slot..][..down].copy_from_slice(&dn_host[e * down..][..down]);
    }
}

/// Route each row (one row per rayon task); with an expert cache, plan and fill the slots;
/// then run each row's experts (one row per task).
fn moe_t<T: Float>(a: &MoeArgs, d: &MoeDims) {
    let MoeDims {
        n,
        hidden: h,
        experts: ne,
        inter: ni,
        top_k,
        cache,
    } = *d;
    if n == 0 {
        return;
    }
    // SAFETY: dtypes and shapes validated (`check_moe`); x, logits and the weights are only
    // read; ids, weights and out are distinct outputs, each row written by its task alone.
    let (x, ids, wts, out) = unsafe {
        (
            view::<T>(&a.x),
            view_mut::<i32>(&a.ids),
            view_mut::<f32>(&a.weights),
            view_mut::<T>(&a.out),
        )
    };
    // SAFETY: as above.
    let logits = unsafe { logits_f32::<T>(&a.logits) };
    route_rows(&logits, ne, a.renormalize, ids, wts);
    let (gu_dt, dn_dt) = (a.gate_up.dtype(), a.down.dtype());
    // SAFETY: as above; the cache's tables and slots are written here alone, before any
    // expert reads them.
    let experts = match (&a.cache, cache) {
        (Some((c, decay)), Some(cd)) => unsafe {
            let slot_of = view_mut::<i32>(&c.slot_of);
            expert_cache_plan(
                ids,
                ne,
                cd.layer,
                None,
                slot_of,
                view_mut::<i32>(&c.owner),
                view_mut::<f32>(&c.score),
                view_mut::<i32>(&c.fills),
                view_mut::<i64>(&c.stats),
                *decay,
                cd.expert_bytes(),
            );
            let gu_slots = std::slice::from_raw_parts_mut(
                ptr_of(&c.gate_up_slots),
                c.gate_up_slots.size_bytes(),
            );
            let dn_slots =
                std::slice::from_raw_parts_mut(ptr_of(&c.down_slots), c.down_slots.size_bytes());
            let half = cd.half_bytes;
            fill_slots(
                view::<i32>(&c.fills),
                bytes_of(&a.gate_up),
                bytes_of(&a.down),
                ne,
                half,
                cd.down_bytes,
                gu_slots,
                cd.gate_up_slot,
                dn_slots,
                cd.down_slot,
            );
            // The prefetch: plans and fills slots this call's experts do not use.
            if let (Some(p), Some(pd)) = (&a.prefetch, cd.prefetch) {
                let (pids, pwts) = (view_mut::<i32>(&p.ids), view_mut::<f32>(&p.weights));
                route_rows(&logits_f32::<T>(&p.logits), ne, a.renormalize, pids, pwts);
                expert_cache_plan(
                    pids,
                    ne,
                    pd.layer,
                    Some((cd.layer, &*ids)),
                    slot_of,
                    view_mut::<i32>(&c.owner),
                    view_mut::<f32>(&c.score),
                    view_mut::<i32>(&p.fills),
                    view_mut::<i64>(&c.stats),
                    *decay,
                    pd.expert_bytes(),
                );
                fill_slots(
                    view::<i32>(&p.fills),
                    bytes_of(&p.gate_up),
                    bytes_of(&p.down),
                    ne,
                    pd.half_bytes,
                    pd.down_bytes,
                    gu_slots,
                    cd.gate_up_slot,
                    dn_slots,
                    cd.down_slot,
                );
            }
            ExpertRows::<T> {
                gu: WeightRows::new(bytes_of(&c.gate_up_slots), gu_dt, h),
                dn: WeightRows::new(bytes_of(&c.down_slots), dn_dt, ni),
                slot_of: Some(&slot_of[cd.layer * ne..(cd.layer + 1) * ne]),
                gu_stride: cd.gate_up_slot,
                up_off: half,
                dn_stride: cd.down_slot,
            }
        },
        _ => unsafe {
            let half = a.gate_up.size_bytes() / (2 * ne);
            ExpertRows::<T> {
                gu: WeightRows::new(bytes_of(&a.gate_up), gu_dt, h),
                dn: WeightRows::new(bytes_of(&a.down), dn_dt, ni),
                slot_of: None,
                gu_stride: half,
                up_off: ne * half,
                dn_stride: a.down.size_bytes() / ne,
            }
        },
    };
    let (ids, wts) = (&*ids, &*wts);
    // SAFETY: as above (validated T, only read).
    let bias = a
        .bias
        .as_ref()
        .map(|(gu, dn)| unsafe { (view::<T>(gu), view::<T>(dn)) });
    // Expert e's gate bias j, up bias j and down bias r (0 without biases).
    let gate_bias = |e: usize, j: usize| bias.map_or(0.0, |(gu, _)| gu[e * ni + j].to_f32());
    let up_bias = |e: usize, j: usize| bias.map_or(0.0, |(gu, _)| gu[(ne + e) * ni + j].to_f32());
    let down_bias = |e: usize, r: usize| bias.map_or(0.0, |(_, dn)| dn[e * h + r].to_f32());
    let act_fn = a.act;
    out.par_chunks_mut(h).enumerate().for_each(|(t, o)| {
        let (id, wt) = (&ids[t * top_k..][..top_k], &wts[t * top_k..][..top_k]);
        let mut xf = vec![0f32; h];
        T::widen(&x[t * h..(t + 1) * h], &mut xf);
        let (mut row, mut down_row) = (vec![0f32; h], vec![0f32; ni]);
        let mut act = vec![0f32; ni];
        let mut acc = vec![0f32; h];
        for (s, &e) in id.iter().enumerate() {
            let e = e as usize;
            for (j, a) in act.iter_mut().enumerate() {
                experts.gate(e, j, &mut row);
                let g = round_to::<T>(dot(&xf, &row[..]) + gate_bias(e, j));
                experts.up(e, j, &mut row);
                let u = round_to::<T>(dot(&xf, &row[..]) + up_bias(e, j));
                *a = round_to::<T>(act_fn.gated(g, u));
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                experts.down(e, r, &mut down_row);
                *acc += wt[s] * round_to::<T>(dot(&act, &down_row[..]) + down_bias(e, r));
            }
        }
        for (o, v) in o.iter_mut().zip(&acc) {
            *o = T::from_f32(*v);
        }
    });
}
