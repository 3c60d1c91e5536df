//! The rotary embedding's configuration and its table: theta, the rotated dims and the
//! scalings (Llama 3's, linear, YaRN, LongRoPE) as transformers computes them.

/// Llama-3 style frequency scaling (`rope_scaling.rope_type == "llama3"`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3Scaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position_embeddings: usize,
}

/// YaRN scaling (`rope_type == "yarn"`, transformers' `_compute_yarn_parameters`): each
/// frequency blended between itself (extrapolation) and itself over `factor`
/// (interpolation) by a ramp over the dims whose rotations at
/// `original_max_position_embeddings` lie between `beta_slow` and `beta_fast`; cos and sin
/// are multiplied by `attention_factor`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct YarnScaling {
    pub factor: f32,
    pub original_max_position_embeddings: usize,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// The factor on cos and sin (transformers' default: `0.1 ln(factor) + 1`, or the
    /// ratio of two such terms with `mscale` / `mscale_all_dim`).
    pub attention_factor: f32,
    /// Whether the ramp's bounds are rounded outwards to whole dims (transformers'
    /// `truncate`, default true).
    pub truncate: bool,
}

impl YarnScaling {
    /// transformers' YaRN `get_mscale(factor, m)`: `0.1 m ln(factor) + 1`, 1 for a factor
    /// of at most 1 (the default attention factor is `m = 1`).
    pub fn mscale(factor: f64, m: f64) -> f64 {
        if factor <= 1.0 {
            1.0
        } else {
            0.1 * m * factor.ln() + 1.0
        }
    }
}

/// The most rotary frequencies a [`LongRopeScaling`] holds factors for (head_dim 256).
pub const LONGROPE_MAX_FREQS: usize = 128;

/// LongRoPE (Phi-3.5, Phi-4-mini: `longrope`): frequency `i` divided by `short[i]` for a
/// sequence within `original_max_position_embeddings` tokens, by `long[i]` beyond; cos
/// and sin multiplied by `attention_factor` (transformers' default:
/// `sqrt(1 + ln(factor) / ln(original))`, `factor` = `max_position_embeddings / original`).
/// The first `rot_dim / 2` entries of each array are used.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LongRopeScaling {
    pub short: [f32; LONGROPE_MAX_FREQS],
    pub long: [f32; LONGROPE_MAX_FREQS],
    pub original_max_position_embeddings: usize,
    pub attention_factor: f32,
}

impl LongRopeScaling {
    /// Why LongRoPE cannot run `rot_dim` rotary dims, if it cannot.
    pub fn check_rot_dim(rot_dim: usize) -> Option<String> {
        (rot_dim / 2 > LONGROPE_MAX_FREQS).then(|| {
            format!(
                "longrope with {rot_dim} rotary dims is not supported (at most {})",
                2 * LONGROPE_MAX_FREQS
            )
        })
    }

    /// One factor list as stored: `None` unless it holds `rot_dim / 2` positive finite
    /// numbers (the unused tail is 1).
    pub fn factors(v: &[f64], rot_dim: usize) -> Option<[f32; LONGROPE_MAX_FREQS]> {
        let half = rot_dim / 2;
        if v.len() != half
            || half > LONGROPE_MAX_FREQS
            || v.iter().any(|f| !(*f > 0.0 && f.is_finite()))
        {
            return None;
        }
        let mut out = [1.0f32; LONGROPE_MAX_FREQS];
        for (o, f) in out.iter_mut().zip(v) {
            *o = *f as f32;
        }
        Some(out)
    }

    /// transformers' default attention factor: `sqrt(1 + ln(factor) / ln(original))`, 1
    /// for a factor of at most 1.
    pub fn default_attention_factor(factor: f64, original: usize) -> f64 {
        if factor <= 1.0 {
            1.0
        } else {
            (1.0 + factor.ln() / (original as f64).ln()).sqrt()
        }
    }
}

/// How the rotary frequencies are scaled for a longer context.
// LongRoPE's factor arrays make it 1 KiB; the config is `Copy` everywhere it travels and
// built once a model, so the size costs nothing that boxing (and losing `Copy`) would save.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// Llama 3's (`llama3`).
    Llama3(Llama3Scaling),
    /// Every frequency over `factor` (`linear`: positions interpolated).
    Linear { factor: f32 },
    /// YaRN (`yarn`).
    Yarn(YarnScaling),
    /// LongRoPE (`longrope`): two tables, see [`RopeConfig::cos_sin_table`].
    LongRope(LongRopeScaling),
}

/// Everything that defines the rotary table.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeConfig {
    /// Rotated dims per head (usually head_dim).
    pub rot_dim: usize,
    pub theta: f32,
    pub scaling: Option<RopeScaling>,
}

impl RopeConfig {
    /// Inverse frequencies `f_i`, `i < rot_dim / 2`, with the scaling applied, in f64
    /// (what HF transformers computes, then uses in f32).
    pub fn inv_freq(&self) -> Vec<f64> {
        self.inv_freq_of(false)
    }

    /// [`RopeConfig::inv_freq`], with LongRoPE's long factors when `long`.
    pub fn inv_freq_of(&self, long: bool) -> Vec<f64> {
        let half = self.rot_dim / 2;
        let base = |i: usize| 1.0 / (self.theta as f64).powf((2 * i) as f64 / self.rot_dim as f64);
        // YaRN's ramp over the dims: 0 extrapolates (the frequency kept), 1 interpolates.
        let yarn_ramp = |y: &YarnScaling| {
            let dim = self.rot_dim as f64;
            let ln_base = (self.theta as f64).ln();
            let orig = y.original_max_position_embeddings as f64;
            let corr =
                |rot: f64| dim * (orig / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * ln_base);
            let (mut low, mut high) = (corr(y.beta_fast as f64), corr(y.beta_slow as f64));
            if y.truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
            if low == high {
                high += 0.001;
            }
            move |i: usize| ((i as f64 - low) / (high - low)).clamp(0.0, 1.0)
        };
        (0..half)
            .map(|i| {
                let f = base(i);
                match &self.scaling {
                    None => f,
                    Some(RopeScaling::Linear { factor }) => f / *factor as f64,
                    // transformers: 1 / (ext * base^(2i/d)), ext in f32.
                    Some(RopeScaling::LongRope(l)) => {
                        f / if long { l.long[i] } else { l.short[i] } as f64
                    }
                    Some(RopeScaling::Yarn(y)) => {
                        let ramp = yarn_ramp(y)(i);
                        // extrapolation weight 1 - ramp: the fast dims keep their frequency.
                        let interp = f / y.factor as f64;
                        interp * ramp + f * (1.0 - ramp)
                    }
                    Some(RopeScaling::Llama3(s)) => {
                        let old = s.original_max_position_embeddings as f64;
                        let low_wavelen = old / s.low_freq_factor as f64;
                        let high_wavelen = old / s.high_freq_factor as f64;
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / s.factor as f64
                        } else {
                            let smooth = (old / wavelen - s.low_freq_factor as f64)
                                / (s.high_freq_factor as f64 - s.low_freq_factor as f64);
                            (1.0 - smooth) * f / s.factor as f64 + smooth * f
                        }
                    }
                }
            })
            .collect()
    }

    /// The factor on cos and sin (YaRN's attention factor; 1 otherwise).
    pub fn attention_factor(&self) -> f64 {
        match &self.scaling {
            Some(RopeScaling::Yarn(y)) => y.attention_factor as f64,
            Some(RopeScaling::LongRope(l)) => l.attention_factor as f64,
            _ => 1.0,
        }
    }

    /// LongRoPE's `original_max_position_embeddings`: a sequence longer than that rotates
    /// with the long factors, from the table's second half. `None` for other scalings.
    pub fn long_rope(&self) -> Option<usize> {
        match &self.scaling {
            Some(RopeScaling::LongRope(l)) => Some(l.original_max_position_embeddings),
            _ => None,
        }
    }

    /// Rows of [`RopeConfig::cos_sin_table`] for `max_positions` positions: twice as
    /// many with LongRoPE.
    pub fn table_rows(&self, max_positions: usize) -> usize {
        match self.long_rope() {
            Some(_) => 2 * max_positions,
            None => max_positions,
        }
    }

    /// The f32 `[table_rows(max_positions), rot_dim]` table [`crate::backend::QkvRope`]
    /// reads: per position `p`, `cos(p f_i)` for all `i`, then `sin(p f_i)`. With LongRoPE
    /// the rows of the short factors come first, then those of the long ones: row
    /// `max_positions + p` is position `p` of a long sequence (the runner offsets such a
    /// sequence's positions).
    pub fn cos_sin_table(&self, max_positions: usize) -> Vec<f32> {
        let mscale = self.attention_factor();
        let half = self.rot_dim / 2;
        let halves: &[bool] = match self.long_rope() {
            Some(_) => &[false, true],
            None => &[false],
        };
        let mut t = Vec::with_capacity(halves.len() * max_positions * 2 * half);
        for &long in halves {
            let inv = self.inv_freq_of(long);
            for p in 0..max_positions {
                let start = t.len();
                t.resize(start + 2 * half, 0.0);
                let row = &mut t[start..];
                for (i, &f) in inv.iter().enumerate() {
                    // HF computes the angle in f32: (p as f32) * (f as f32).
                    let ang = (p as f32 * f as f32) as f64;
                    row[i] = (ang.cos() * mscale) as f32;
                    row[half + i] = (ang.sin() * mscale) as f32;
                }
            }
        }
        t
    }
}
