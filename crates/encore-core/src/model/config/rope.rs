//! The rotary embedding of an HF config: theta, partial rotary and the scaling
//! (`rope_scaling` in transformers 4, `rope_parameters` in 5).

use super::parse::Fields;
use super::Arch;
use crate::error::Result;
use crate::ops::{
    Llama3Scaling, LongRopeScaling, RopeConfig, RopeScaling, YarnScaling, LONGROPE_MAX_FREQS,
};
use serde_json::Value;

/// Theta and scaling from the top-level `rope_theta` / `rope_scaling` (transformers 4)
/// or from `rope_parameters` (transformers 5).
pub(super) fn parse_rope(
    f: &Fields<'_>,
    arch: Arch,
    head_dim: usize,
    max_positions: usize,
) -> Result<RopeConfig> {
    let params = f.opt_object("rope_parameters")?.map(|obj| Fields {
        obj,
        path: f.path,
        prefix: "rope_parameters.",
    });
    let default_theta = arch.family().default_theta;
    let theta = match f.opt_f64("rope_theta")? {
        Some(t) => t,
        None => match &params {
            Some(p) => p.opt_f64("rope_theta")?.unwrap_or(default_theta),
            None => default_theta,
        },
    };
    if !(theta > 0.0 && theta.is_finite()) {
        return Err(f.err(format!("rope_theta = {theta} must be positive")));
    }
    // Partial rotary (Phi-3's and StableLM's `partial_rotary_factor`, else the family's
    // default): the first `int(head_dim * r)` dims of each head rotate, as transformers
    // computes them; other families rotate all.
    let mut factor = (arch.family().partial_rotary.unwrap_or(1.0), f);
    for p in std::iter::once(f).chain(params.as_ref()) {
        if let Some(r) = p.opt_f64("partial_rotary_factor")? {
            factor = (r, p);
        }
    }
    let rot_dim = match factor {
        (1.0, _) => head_dim,
        (r, p) => {
            let dims = (head_dim as f64 * r) as usize;
            let key = p.name("partial_rotary_factor");
            if arch.family().partial_rotary.is_none() {
                return Err(p.err(format!(
                    "`{key}` = {r} is not supported for {} (only full rotary)",
                    arch.model_type()
                )));
            }
            if !(r > 0.0 && r < 1.0) || dims == 0 || !dims.is_multiple_of(2) {
                return Err(p.err(format!(
                    "`{key}` = {r} gives {dims} rotary dims of a head of {head_dim}: they must \
                     be even and at least 2"
                )));
            }
            dims
        }
    };
    let scaling = match f.opt_object("rope_scaling")? {
        Some(obj) => Some(Fields {
            obj,
            path: f.path,
            prefix: "rope_scaling.",
        }),
        None => params,
    };
    // Phi-3 keeps `original_max_position_embeddings` at the top level, which transformers
    // prefers over the scaling's own.
    let top_original = f.opt_usize("original_max_position_embeddings")?;
    let scaling = match scaling {
        None => None,
        Some(s) => parse_scaling(&s, max_positions, top_original, rot_dim)?,
    };
    Ok(RopeConfig {
        rot_dim,
        theta: theta as f32,
        scaling,
    })
}

/// Gemma 3's two rotaries: the full layers' (`rope_parameters.full_attention`, or the
/// top-level `rope_theta` (default 1e6) and `rope_scaling`) and the windowed layers'
/// (`rope_parameters.sliding_attention`, or `rope_local_base_freq`, default 1e4, never
/// scaled), as transformers 5's `convert_rope_params_to_dict` builds them.
pub(super) fn parse_gemma_rope(
    f: &Fields<'_>,
    head_dim: usize,
    max_positions: usize,
) -> Result<(RopeConfig, RopeConfig)> {
    let sub = |key: &'static str| -> Result<Option<Fields<'_>>> {
        let Some(params) = f.opt_object("rope_parameters")? else {
            return Ok(None);
        };
        let p = Fields {
            obj: params,
            path: f.path,
            prefix: "rope_parameters.",
        };
        Ok(p.opt_object(key)?.map(|obj| Fields {
            obj,
            path: f.path,
            prefix: match key {
                "full_attention" => "rope_parameters.full_attention.",
                _ => "rope_parameters.sliding_attention.",
            },
        }))
    };
    let theta = |p: &Fields<'_>, default: f64| -> Result<f32> {
        let t = p.opt_f64("rope_theta")?.unwrap_or(default);
        if !(t > 0.0 && t.is_finite()) {
            return Err(p.err(format!("`{}` = {t} must be positive", p.name("rope_theta"))));
        }
        Ok(t as f32)
    };
    let (global, local) = match (sub("full_attention")?, sub("sliding_attention")?) {
        (None, None) => {
            let global = RopeConfig {
                rot_dim: head_dim,
                theta: theta(f, 1_000_000.0)?,
                scaling: match f.opt_object("rope_scaling")? {
                    None => None,
                    Some(obj) => {
                        let s = Fields {
                            obj,
                            path: f.path,
                            prefix: "rope_scaling.",
                        };
                        parse_scaling(&s, max_positions, None, head_dim)?
                    }
                },
            };
            let base = f.opt_f64("rope_local_base_freq")?.unwrap_or(10_000.0);
            if !(base > 0.0 && base.is_finite()) {
                return Err(f.err(format!(
                    "`{}` = {base} must be positive",
                    f.name("rope_local_base_freq")
                )));
            }
            let local = RopeConfig {
                rot_dim: head_dim,
                theta: base as f32,
                scaling: None,
            };
            (global, local)
        }
        (full, sliding) => {
            let one = |p: Option<Fields<'_>>, default: f64| -> Result<RopeConfig> {
                Ok(match p {
                    None => RopeConfig {
                        rot_dim: head_dim,
                        theta: default as f32,
                        scaling: None,
                    },
                    Some(p) => RopeConfig {
                        rot_dim: head_dim,
                        theta: theta(&p, default)?,
                        scaling: parse_scaling(&p, max_positions, None, head_dim)?,
                    },
                })
            };
            (one(full, 1_000_000.0)?, one(sliding, 10_000.0)?)
        }
    };
    Ok((global, local))
}

/// The scaling of a `rope_scaling` / `rope_parameters` object: `llama3`, `linear` and
/// `yarn` as transformers computes them; `dynamic` (frequencies that change with the
/// sequence's length) and `longrope` are refused by name.
fn parse_scaling(
    s: &Fields<'_>,
    max_positions: usize,
    top_original: Option<usize>,
    rot_dim: usize,
) -> Result<Option<RopeScaling>> {
    let kind = s.opt_str("rope_type")?.or(s.opt_str("type")?);
    match kind {
        None if s.prefix.starts_with("rope_parameters.") => Ok(None),
        None => Err(s.err("`rope_scaling` has no `rope_type` (or `type`)")),
        Some("default") => Ok(None),
        // Dynamic NTK changes the base only for sequences past `max_position_embeddings`,
        // which encore never runs: within them it is the default rotary.
        Some("dynamic") => Ok(None),
        // Phi-3's early configs name LongRoPE `su` (or `yarn`, with its factor lists).
        Some("longrope" | "su") => {
            parse_longrope(s, max_positions, top_original, rot_dim).map(Some)
        }
        Some("yarn") if s.get("short_factor").is_some() => {
            parse_longrope(s, max_positions, top_original, rot_dim).map(Some)
        }
        Some("llama3") => {
            let factor = s.req_f64("factor")? as f32;
            let low_freq_factor = s.req_f64("low_freq_factor")? as f32;
            let high_freq_factor = s.req_f64("high_freq_factor")? as f32;
            let original = s.opt_usize("original_max_position_embeddings")?;
            let original_max_position_embeddings = original.ok_or_else(|| {
                s.err(format!(
                    "required field `{}` is missing",
                    s.name("original_max_position_embeddings")
                ))
            })?;
            if !(factor > 0.0 && low_freq_factor > 0.0 && high_freq_factor > low_freq_factor)
                || original_max_position_embeddings == 0
            {
                return Err(s.err(format!(
                    "invalid llama3 rope scaling: factor {factor}, low_freq_factor \
                     {low_freq_factor}, high_freq_factor {high_freq_factor}, \
                     original_max_position_embeddings {original_max_position_embeddings}"
                )));
            }
            Ok(Some(RopeScaling::Llama3(Llama3Scaling {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            })))
        }
        Some("linear") => {
            let factor = s.req_f64("factor")?;
            if !(factor > 0.0 && factor.is_finite()) {
                return Err(s.err(format!(
                    "`{}` = {factor} must be positive",
                    s.name("factor")
                )));
            }
            Ok(Some(RopeScaling::Linear {
                factor: factor as f32,
            }))
        }
        Some("yarn") => parse_yarn(s, max_positions, top_original).map(Some),
        Some(other) => Err(s.err(format!(
            "`{}rope_type` = \"{other}\" is not supported (only \"default\", \"llama3\", \
             \"linear\", \"yarn\", \"longrope\" and \"dynamic\")",
            s.prefix
        ))),
    }
}

/// YaRN's parameters as transformers' `_compute_yarn_parameters` reads them: `factor`
/// (default: `max_position_embeddings / original_max_position_embeddings`), the original
/// context (the config's top-level one first, then the scaling's, then
/// `max_position_embeddings`), `beta_fast` 32 and `beta_slow` 1 by default, `truncate`
/// true, and the attention factor given, or `0.1 ln(factor) + 1` (with `mscale` and
/// `mscale_all_dim`: the ratio of two such terms).
fn parse_yarn(
    s: &Fields<'_>,
    max_positions: usize,
    top_original: Option<usize>,
) -> Result<RopeScaling> {
    let (original, factor) = original_and_factor(s, max_positions, top_original, true)?;
    let positive = |v: f64, key: &str| {
        if v > 0.0 && v.is_finite() {
            Ok(v)
        } else {
            Err(s.err(format!("`{}` = {v} must be positive", s.name(key))))
        }
    };
    let factor = positive(factor, "factor")?;
    let beta_fast = positive(s.opt_f64("beta_fast")?.unwrap_or(32.0), "beta_fast")?;
    let beta_slow = positive(s.opt_f64("beta_slow")?.unwrap_or(1.0), "beta_slow")?;
    let mscale = YarnScaling::mscale;
    let attention_factor = match s.opt_f64("attention_factor")? {
        Some(a) => positive(a, "attention_factor")?,
        None => match (s.opt_f64("mscale")?, s.opt_f64("mscale_all_dim")?) {
            (Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                mscale(factor, m) / mscale(factor, all)
            }
            _ => mscale(factor, 1.0),
        },
    };
    Ok(RopeScaling::Yarn(YarnScaling {
        factor: factor as f32,
        original_max_position_embeddings: original,
        beta_fast: beta_fast as f32,
        beta_slow: beta_slow as f32,
        attention_factor: attention_factor as f32,
        truncate: s.opt_bool("truncate")?.unwrap_or(true),
    }))
}

/// LongRoPE's parameters as transformers' `_compute_longrope_parameters` reads them: the
/// `short_factor` and `long_factor` lists (one per rotary frequency), the original context
/// (the config's top-level one first, then the scaling's), `factor` (default:
/// `max_position_embeddings / original`) and the attention factor given, or
/// `sqrt(1 + ln(factor) / ln(original))` (1 for a factor of at most 1).
fn parse_longrope(
    s: &Fields<'_>,
    max_positions: usize,
    top_original: Option<usize>,
    rot_dim: usize,
) -> Result<RopeScaling> {
    if let Some(why) = LongRopeScaling::check_rot_dim(rot_dim) {
        return Err(s.err(why));
    }
    let factors = |key: &str| -> Result<[f32; LONGROPE_MAX_FREQS]> {
        let v = s
            .get(key)
            .ok_or_else(|| s.err(format!("required field `{}` is missing", s.name(key))))?;
        let list: Option<Vec<f64>> = v
            .as_array()
            .and_then(|a| a.iter().map(Value::as_f64).collect());
        let list = list.ok_or_else(|| s.wrong_type(key, "a list of numbers", v))?;
        LongRopeScaling::factors(&list, rot_dim).ok_or_else(|| {
            s.err(format!(
                "`{}` must hold {} positive numbers (one per rotary frequency), found {}",
                s.name(key),
                rot_dim / 2,
                list.len()
            ))
        })
    };
    let (short, long) = (factors("short_factor")?, factors("long_factor")?);
    let (original, factor) = original_and_factor(s, max_positions, top_original, false)?;
    let attention_factor = match s.opt_f64("attention_factor")? {
        Some(a) if a > 0.0 && a.is_finite() => a,
        Some(a) => {
            return Err(s.err(format!(
                "`{}` = {a} must be positive",
                s.name("attention_factor")
            )))
        }
        None => LongRopeScaling::default_attention_factor(factor, original),
    };
    Ok(RopeScaling::LongRope(LongRopeScaling {
        short,
        long,
        original_max_position_embeddings: original,
        attention_factor: attention_factor as f32,
    }))
}

/// The original context of YaRN and LongRoPE (the config's top-level
/// `original_max_position_embeddings` first, then the scaling's; with `or_max`,
/// `max_position_embeddings` where neither gives it, else it is required) and `factor`
/// (default: `max_position_embeddings` over the original).
fn original_and_factor(
    s: &Fields<'_>,
    max_positions: usize,
    top_original: Option<usize>,
    or_max: bool,
) -> Result<(usize, f64)> {
    let key = "original_max_position_embeddings";
    let original = match top_original.or(s.opt_usize(key)?) {
        Some(n) => n,
        None if or_max => max_positions,
        None => return Err(s.err(format!("required field `{}` is missing", s.name(key)))),
    };
    if original == 0 {
        return Err(s.err(format!("`{}` must be positive", s.name(key))));
    }
    let factor = s
        .opt_f64("factor")?
        .unwrap_or(max_positions as f64 / original as f64);
    Ok((original, factor))
}
