//! The CPU sampling kernel by hand: greedy settings, the softmax and its truncations
//! (top-k, top-p, min-p), penalties as vLLM applies them, and log-probabilities.

use encore_backend::backend::cpu::CpuBackend;
use encore_backend::{Backend, DType, Sampling};

fn cpu() -> Box<dyn Backend> {
    Box::new(CpuBackend::new())
}

fn sample(
    be: &dyn Backend,
    logits: &[f32],
    vocab: usize,
    temperature: f32,
    top_k: i32,
    top_p: f32,
    seeds: std::ops::Range<i64>,
) -> Vec<i32> {
    let rows = seeds.end - seeds.start;
    let b = rows as usize;
    let logits: Vec<f32> = logits.iter().copied().cycle().take(b * vocab).collect();
    let logits = be.upload(&logits, &[b, vocab]).unwrap();
    let temperature = be.upload(&vec![temperature; b], &[b]).unwrap();
    let top_k = be.upload(&vec![top_k; b], &[b]).unwrap();
    let top_p = be.upload(&vec![top_p; b], &[b]).unwrap();
    let seeds = be.upload(&seeds.collect::<Vec<i64>>(), &[b]).unwrap();
    let out = be.alloc(DType::I32, &[b]).unwrap();
    let min_p = be.upload(&vec![0.0f32; b], &[b]).unwrap();
    let params = Sampling {
        temperature: &temperature,
        top_k: &top_k,
        top_p: &top_p,
        min_p: &min_p,
        seeds: &seeds,
        penalties: None,
        logprobs: None,
        mask: None,
    };
    be.sample(&logits, &params, &out).unwrap();
    let mut ids = vec![0i32; b];
    be.read_bytes(&out, bytemuck::cast_slice_mut(&mut ids))
        .unwrap();
    ids
}

#[test]
fn greedy_settings_all_equal_argmax() {
    let be = cpu();
    let logits = [0.5f32, 2.0, -1.0, 2.5, 2.49, 0.0];
    for (temperature, top_k, top_p) in [
        (0.0, 0, 1.0),
        (-1.0, 5, 0.5),
        (1.0, 1, 1.0),
        (1.0, 0, 1e-6),
        (2.0, 1, 0.9),
    ] {
        let ids = sample(be.as_ref(), &logits, 6, temperature, top_k, top_p, 0..200);
        assert!(
            ids.iter().all(|&i| i == 3),
            "t={temperature} k={top_k} p={top_p}: {ids:?}"
        );
    }
    // Ties at the top-k threshold are all kept: k = 1 with a tie for the max keeps both.
    let tied = [1.0f32, 3.0, 0.0, 3.0];
    let ids = sample(be.as_ref(), &tied, 4, 1.0, 1, 1.0, 0..400);
    assert!(ids.iter().all(|&i| i == 1 || i == 3));
    assert!(ids.contains(&1) && ids.contains(&3));
}

#[test]
fn sampling_never_picks_nan_logits() {
    // NaN logits are never kept (the doc leaves NaN open; this mirrors argmax).
    let be = cpu();
    let nan = f32::NAN;
    let ids = sample(be.as_ref(), &[nan, 1.0, nan, 1.5], 4, 1.0, 0, 0.9, 0..500);
    assert!(ids.iter().all(|&i| i == 1 || i == 3), "{ids:?}");
    assert!(ids.contains(&1) && ids.contains(&3));
    let ids = sample(be.as_ref(), &[nan; 4], 4, 1.0, 2, 0.5, 0..50);
    assert!(ids.iter().all(|&i| i == 0));
}

/// Frequencies over `n` seeds against the expected probabilities, within 5 sigma.
fn assert_distribution(ids: &[i32], probs: &[f64]) {
    let n = ids.len() as f64;
    for (tok, &p) in probs.iter().enumerate() {
        let freq = ids.iter().filter(|&&i| i as usize == tok).count() as f64 / n;
        let sigma = (p * (1.0 - p) / n).sqrt();
        assert!(
            (freq - p).abs() <= 5.0 * sigma + 1e-9,
            "token {tok}: frequency {freq}, probability {p}"
        );
    }
}

#[test]
fn sampling_follows_the_softmax_and_its_truncations() {
    let be = cpu();
    let logits = [0.0f32, 1.0, 2.0, 0.5, -1.0, 1.5, 0.2, 3.0];
    let softmax = |t: f64, keep: &dyn Fn(usize) -> bool| -> Vec<f64> {
        let e: Vec<f64> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| if keep(i) { (l as f64 / t).exp() } else { 0.0 })
            .collect();
        let z: f64 = e.iter().sum();
        e.iter().map(|e| e / z).collect()
    };
    let n = 20_000;
    let ids = sample(be.as_ref(), &logits, 8, 1.0, 0, 1.0, 0..n);
    assert_distribution(&ids, &softmax(1.0, &|_| true));
    let ids = sample(be.as_ref(), &logits, 8, 0.5, 0, 1.0, n..2 * n);
    assert_distribution(&ids, &softmax(0.5, &|_| true));
    // top-k 3 keeps logits >= 1.5: tokens 7, 2, 5.
    let ids = sample(be.as_ref(), &logits, 8, 1.0, 3, 1.0, 0..n);
    assert_distribution(&ids, &softmax(1.0, &|i| [2, 5, 7].contains(&i)));
    // top-p 0.6: token 7 alone has ~0.47 of the mass, adding token 2 reaches ~0.65.
    let p = softmax(1.0, &|_| true);
    assert!(p[7] < 0.6 && p[7] + p[2] >= 0.6);
    let ids = sample(be.as_ref(), &logits, 8, 1.0, 0, 0.6, 0..n);
    assert_distribution(&ids, &softmax(1.0, &|i| i == 7 || i == 2));
    // The same seed gives the same token; a different seed may not.
    let a = sample(be.as_ref(), &logits, 8, 1.0, 0, 1.0, 5..6);
    assert_eq!(a, sample(be.as_ref(), &logits, 8, 1.0, 0, 1.0, 5..6));
}

/// Sample `rows` rows of `logits` with one set of parameters, min-p, penalties and
/// log-probabilities included; returns (tokens, token log-probabilities, top ids, top
/// log-probabilities, counts after).
struct Knobs<'a> {
    temperature: f32,
    min_p: f32,
    penalties: Option<PenaltyKnobs<'a>>,
    /// Top log-probabilities per row (-1: none) and the width.
    logprobs: Option<(i32, usize)>,
}

impl Knobs<'_> {
    /// Greedy, no min-p or penalties, with `num` top log-probabilities of width `width`.
    fn greedy_logprobs(num: i32, width: usize) -> Self {
        Knobs {
            temperature: 0.0,
            min_p: 0.0,
            penalties: None,
            logprobs: Some((num, width)),
        }
    }
}

/// (counts `[slots, vocab]`, per-row slot, repetition, frequency, presence).
type PenaltyKnobs<'a> = (&'a [i32], &'a [i32], f32, f32, f32);

type Sampled = (Vec<i32>, Vec<f32>, Vec<i32>, Vec<f32>, Vec<i32>);

fn sample_knobs(
    be: &dyn Backend,
    logits: &[f32],
    vocab: usize,
    k: Knobs<'_>,
    seeds: std::ops::Range<i64>,
) -> Sampled {
    let b = (seeds.end - seeds.start) as usize;
    let logits: Vec<f32> = logits.iter().copied().cycle().take(b * vocab).collect();
    let logits = be.upload(&logits, &[b, vocab]).unwrap();
    let f = |v: f32| be.upload(&vec![v; b], &[b]).unwrap();
    let (temperature, top_p, min_p) = (f(k.temperature), f(1.0), f(k.min_p));
    let top_k = be.upload(&vec![0i32; b], &[b]).unwrap();
    let seeds = be.upload(&seeds.collect::<Vec<i64>>(), &[b]).unwrap();
    let out = be.alloc(DType::I32, &[b]).unwrap();
    let pen = k.penalties.map(|(counts, slot, r, fr, pr)| {
        (
            be.upload(counts, &[counts.len() / vocab, vocab]).unwrap(),
            be.upload(slot, &[b]).unwrap(),
            f(r),
            f(fr),
            f(pr),
        )
    });
    let n = k.logprobs.map_or(0, |l| l.1);
    let lp = (
        be.upload(&vec![k.logprobs.map_or(-1, |l| l.0); b], &[b])
            .unwrap(),
        be.upload(&vec![0f32; b], &[b]).unwrap(),
        be.upload(&vec![-7i32; b * n], &[b, n]).unwrap(),
        be.upload(&vec![0f32; b * n], &[b, n]).unwrap(),
    );
    let params = Sampling {
        temperature: &temperature,
        top_k: &top_k,
        top_p: &top_p,
        min_p: &min_p,
        seeds: &seeds,
        penalties: pen
            .as_ref()
            .map(
                |(counts, slot, repetition, frequency, presence)| encore_backend::Penalties {
                    counts,
                    slot,
                    repetition,
                    frequency,
                    presence,
                },
            ),
        logprobs: k.logprobs.map(|_| encore_backend::SampleLogprobs {
            num: &lp.0,
            token: &lp.1,
            top_ids: &lp.2,
            top: &lp.3,
            target: None,
        }),
        mask: None,
    };
    be.sample(&logits, &params, &out).unwrap();
    (
        be.download(&out).unwrap(),
        be.download(&lp.1).unwrap(),
        be.download(&lp.2).unwrap(),
        be.download(&lp.3).unwrap(),
        pen.map_or(Vec::new(), |p| be.download(&p.0).unwrap()),
    )
}

#[test]
fn min_p_keeps_tokens_at_least_that_likely_relative_to_the_best() {
    let be = cpu();
    // Probabilities proportional to 1, 0.5, 0.1, 0.04.
    let logits = [0.0f32, 0.5f32.ln(), 0.1f32.ln(), 0.04f32.ln()];
    let knobs = |min_p| Knobs {
        temperature: 1.0,
        min_p,
        penalties: None,
        logprobs: None,
    };
    let n = 3000;
    let ids = sample_knobs(be.as_ref(), &logits, 4, knobs(0.2), 0..n).0;
    let count = |t| ids.iter().filter(|&&i| i == t).count() as f64;
    assert_eq!(
        count(2) + count(3),
        0.0,
        "min_p 0.2 drops p/pmax = 0.1 and 0.04"
    );
    assert!(
        (count(1) / n as f64 - 1.0 / 3.0).abs() < 0.03,
        "{}",
        count(1)
    );
    // 0.09 keeps token 2, not token 3; above 1 keeps only the best.
    let ids = sample_knobs(be.as_ref(), &logits, 4, knobs(0.09), 0..n).0;
    assert!(ids.contains(&2) && !ids.contains(&3));
    let ids = sample_knobs(be.as_ref(), &logits, 4, knobs(7.0), 0..200).0;
    assert!(ids.iter().all(|&i| i == 0));
    // At temperature 2 the relative probabilities are square roots: 0.1 -> 0.316 stays.
    let ids = sample_knobs(
        be.as_ref(),
        &logits,
        4,
        Knobs {
            temperature: 2.0,
            ..knobs(0.3)
        },
        0..n,
    )
    .0;
    assert!(ids.contains(&2) && !ids.contains(&3));
}

#[test]
fn penalties_follow_vllm_and_count_the_sampled_token() {
    let be = cpu();
    let prompt = encore_backend::PROMPT_BIT;
    // Token 0 in the prompt, token 1 twice in the output, token 3 both.
    let logits = [2.0f32, -1.0, 0.5, 3.0];
    let counts = [prompt, 2, 0, prompt | 1, /* slot 1 */ 0, 0, 0, 0];
    // Rows: slot 0; no slot; slot 9 (out of range: no penalties).
    let slots = [0, -1, 9];
    let (ids, token_lp, top_ids, top_lp, after) = sample_knobs(
        be.as_ref(),
        &logits,
        4,
        Knobs {
            temperature: 0.0,
            min_p: 0.0,
            penalties: Some((&counts, &slots, 2.0, 0.5, 0.25)),
            logprobs: Some((4, 4)),
        },
        0..3,
    );
    // Penalised: 2 / 2 = 1; -1 * 2 - 0.5 * 2 - 0.25 = -3.25; 0.5; 3 / 2 - 0.5 - 0.25 = 0.75.
    let pen = [1.0f32, -3.25, 0.5, 0.75];
    assert_eq!(ids, vec![0, 3, 3], "greedy rows are penalised too");
    let lse = |l: &[f32]| l.iter().map(|v| (*v as f64).exp()).sum::<f64>().ln();
    let (lse_pen, lse_raw) = (lse(&pen), lse(&logits));
    assert_eq!(&top_ids[..4], &[0, 3, 2, 1]);
    assert_eq!(&top_ids[4..8], &[3, 0, 2, 1]);
    for (j, &t) in [0usize, 3, 2, 1].iter().enumerate() {
        assert!((top_lp[j] as f64 - (pen[t] as f64 - lse_pen)).abs() < 1e-6);
    }
    for (j, &t) in [3usize, 0, 2, 1].iter().enumerate() {
        assert!((top_lp[4 + j] as f64 - (logits[t] as f64 - lse_raw)).abs() < 1e-6);
    }
    assert!((token_lp[0] as f64 - (1.0 - lse_pen)).abs() < 1e-6);
    assert!((token_lp[1] as f64 - (3.0 - lse_raw)).abs() < 1e-6);
    // Only the row with a valid slot counted its token.
    assert_eq!(after, vec![prompt | 1, 2, 0, prompt | 1, 0, 0, 0, 0]);
}

#[test]
fn logprobs_of_rows_that_ask_and_only_those() {
    let be = cpu();
    let logits = [0.5f32, 2.0, 2.0, f32::NAN, -1.0];
    let (_, token_lp, top_ids, top_lp, _) =
        sample_knobs(be.as_ref(), &logits, 5, Knobs::greedy_logprobs(6, 6), 0..1);
    // Ties by smaller index; NaN never listed; past the non-NaN count: -1 and -inf.
    assert_eq!(top_ids, vec![1, 2, 0, 4, -1, -1]);
    assert_eq!(top_lp[4], f32::NEG_INFINITY);
    assert_eq!(top_lp[0], top_lp[1]);
    assert_eq!(
        token_lp[0], top_lp[0],
        "greedy picks the first of the tied best"
    );
    let total: f64 = top_lp[..4].iter().map(|&v| (v as f64).exp()).sum();
    assert!((total - 1.0).abs() < 1e-6, "{total}");
    // num 0: the token only; -1: nothing written.
    for (num, want_top) in [(0, vec![-7; 3]), (-1, vec![-7; 3])] {
        let (_, token_lp, top_ids, _, _) = sample_knobs(
            be.as_ref(),
            &logits,
            5,
            Knobs::greedy_logprobs(num, 3),
            0..1,
        );
        assert_eq!(top_ids, want_top);
        assert_eq!(token_lp[0] != 0.0, num == 0, "{num}: {token_lp:?}");
    }
}

/// An allowed-token mask: sampled and greedy rows only ever pick allowed tokens (the
/// best logit is disallowed), a row without its flag is untouched, and log-probabilities
/// are normalised over the allowed tokens, disallowed ones absent from the top entries.
#[test]
fn masked_tokens_are_never_sampled_and_leave_the_logprobs() {
    let be = cpu();
    let vocab = 70; // three mask words, the last partly past the vocabulary
    let b = 64;
    let base: Vec<f32> = (0..vocab).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
    let best = (0..vocab)
        .max_by(|&a, &c| base[a].total_cmp(&base[c]).then(c.cmp(&a)))
        .unwrap();
    let allowed: Vec<usize> = (0..vocab).filter(|&t| t % 3 == 1 && t != best).collect();
    let mut words = [0i32; 3];
    for &t in &allowed {
        words[t / 32] |= (1u32 << (t % 32)) as i32;
    }
    words[2] |= !0 << (vocab % 32); // bits past the vocabulary are ignored
    let logits: Vec<f32> = base.iter().copied().cycle().take(b * vocab).collect();
    let logits = be.upload(&logits, &[b, vocab]).unwrap();
    // Rows: greedy and sampled, masked, except the last row (flag off, greedy).
    let temps: Vec<f32> = (0..b)
        .map(|r| if r % 2 == 0 || r + 1 == b { 0.0 } else { 1.0 })
        .collect();
    let temperature = be.upload(&temps, &[b]).unwrap();
    let top_k = be.upload(&vec![0i32; b], &[b]).unwrap();
    let top_p = be.upload(&vec![1.0f32; b], &[b]).unwrap();
    let min_p = be.upload(&vec![0.0f32; b], &[b]).unwrap();
    let seeds = be.upload(&(0..b as i64).collect::<Vec<_>>(), &[b]).unwrap();
    let bits: Vec<i32> = words.iter().copied().cycle().take(b * 3).collect();
    let bits = be.upload(&bits, &[b, 3]).unwrap();
    let on: Vec<i32> = (0..b).map(|r| (r + 1 < b) as i32).collect();
    let on = be.upload(&on, &[b]).unwrap();
    let num = be.upload(&vec![5i32; b], &[b]).unwrap();
    let token = be.alloc(DType::F32, &[b]).unwrap();
    let top_ids = be.alloc(DType::I32, &[b, 5]).unwrap();
    let top = be.alloc(DType::F32, &[b, 5]).unwrap();
    let out = be.alloc(DType::I32, &[b]).unwrap();
    let params = Sampling {
        temperature: &temperature,
        top_k: &top_k,
        top_p: &top_p,
        min_p: &min_p,
        seeds: &seeds,
        penalties: None,
        logprobs: Some(encore_backend::SampleLogprobs {
            num: &num,
            token: &token,
            top_ids: &top_ids,
            top: &top,
            target: None,
        }),
        mask: Some(encore_backend::TokenMask {
            bits: &bits,
            on: &on,
        }),
    };
    be.sample(&logits, &params, &out).unwrap();
    let read_i32 = |t| {
        let mut v = vec![0i32; b * 5];
        be.read_bytes(t, bytemuck::cast_slice_mut(&mut v[..t.numel()]))
            .unwrap();
        v.truncate(t.numel());
        v
    };
    let read_f32 = |t| {
        let mut v = vec![0f32; b * 5];
        be.read_bytes(t, bytemuck::cast_slice_mut(&mut v[..t.numel()]))
            .unwrap();
        v.truncate(t.numel());
        v
    };
    let (ids, ids_top, lp_top) = (read_i32(&out), read_i32(&top_ids), read_f32(&top));
    for r in 0..b - 1 {
        assert!(
            allowed.contains(&(ids[r] as usize)),
            "row {r} sampled {}",
            ids[r]
        );
        for &t in &ids_top[r * 5..r * 5 + 5] {
            assert!(allowed.contains(&(t as usize)), "row {r} top entry {t}");
        }
    }
    // The unmasked greedy row takes the best token.
    assert_eq!(ids[b - 1] as usize, best);
    // Masked greedy rows take the best allowed logit (smallest index among ties).
    let best_allowed = *allowed
        .iter()
        .max_by(|&&a, &&c| base[a].total_cmp(&base[c]).then(c.cmp(&a)))
        .unwrap();
    assert!((0..b - 1)
        .step_by(2)
        .all(|r| ids[r] as usize == best_allowed));
    // Log-probabilities over the allowed tokens: the allowed softmax.
    let m = allowed.iter().map(|&t| base[t]).fold(f32::MIN, f32::max);
    let z: f32 = allowed.iter().map(|&t| (base[t] - m).exp()).sum();
    for (j, &t) in ids_top[..5].iter().enumerate() {
        let want = (base[t as usize] - m) - z.ln();
        assert!((lp_top[j] - want).abs() < 1e-5, "{} vs {want}", lp_top[j]);
    }
}
