//! `quantization_config`: the checkpoint formats whose projections load kept quantized
//! (FP8, GPTQ), every other method refused naming it.

use serde_json::Value;

use super::parse::Fields;
use crate::error::Result;
use crate::model::formats::{GptqFormat, WeightFormats};

/// `quantization_config`: FP8 checkpoints (`quant_method: "fp8"`, weights in E4M3 with
/// per-tensor scales or 128x128 blocks of `weight_scale_inv`) keep their projections in
/// FP8; any other method is refused naming it (encore would read its packed tensors as
/// garbage).
pub(super) fn parse_quantization(f: &Fields<'_>) -> Result<WeightFormats> {
    let Some(obj) = f.opt_object("quantization_config")? else {
        return Ok(WeightFormats::default());
    };
    let q = Fields {
        obj,
        path: f.path,
        prefix: "quantization_config.",
    };
    let method = q.opt_str("quant_method")?.unwrap_or("");
    if method == "gptq" {
        return parse_gptq(&q);
    }
    if method != "fp8" {
        return Err(q.err(format!(
            "quantization_config.quant_method = \"{method}\" is not supported (encore loads \"fp8\" \
             and \"gptq\" checkpoints; GGUF files carry their own block formats)"
        )));
    }
    if let Some(fmt) = q.opt_str("fmt")? {
        if fmt != "e4m3" {
            return Err(q.err(format!(
                "quantization_config.fmt = \"{fmt}\" is not supported (only e4m3)"
            )));
        }
    }
    match q.get("weight_block_size") {
        None | Some(Value::Null) => {}
        Some(Value::Array(b)) if b.len() == 2 && b.iter().all(|x| x.as_u64() == Some(128)) => {}
        Some(v) => {
            return Err(q.err(format!(
                "quantization_config.weight_block_size = {v} is not supported (per-tensor \
                 scales or [128, 128])"
            )))
        }
    }
    Ok(WeightFormats {
        projections: Some(encore_backend::quant::QuantFormat::F8E4M3),
        ..Default::default()
    })
}

/// `quantization_config` of a GPTQ checkpoint ([`GptqFormat`]): 4 or 8 bits, symmetric,
/// groups of a multiple of 32 columns (or -1) in order; what encore does not run (zero
/// points, `desc_act`, other widths or group sizes, other packings) is refused naming the
/// field.
fn parse_gptq(q: &Fields<'_>) -> Result<WeightFormats> {
    let bits = match q.opt_usize("bits")? {
        Some(b @ (4 | 8)) => b as u32,
        Some(b) => {
            return Err(q.err(format!(
                "quantization_config.bits = {b} is not supported (GPTQ with 4 or 8 bits)"
            )))
        }
        None => return Err(q.err("quantization_config.bits is missing (GPTQ)")),
    };
    let group_size = match q.get("group_size") {
        Some(Value::Number(n)) if n.as_i64() == Some(-1) => None,
        Some(Value::Number(n)) if n.as_u64().is_some_and(|g| g > 0 && g % 32 == 0) => {
            n.as_u64().map(|g| g as usize)
        }
        None => Some(128),
        Some(v) => {
            return Err(q.err(format!(
                "quantization_config.group_size = {v} is not supported (GPTQ groups of a \
                 multiple of 32 columns, or -1)"
            )))
        }
    };
    if q.opt_bool("sym")? == Some(false) {
        return Err(q.err(
            "quantization_config.sym = false is not supported (GPTQ with zero points: encore \
             runs the symmetric packing)",
        ));
    }
    if q.opt_bool("desc_act")? == Some(true) {
        return Err(q.err(
            "quantization_config.desc_act = true is not supported (GPTQ groups in \
             activation order: encore runs groups in column order)",
        ));
    }
    let zeros_minus_one = match q.opt_str("checkpoint_format")?.unwrap_or("gptq") {
        "gptq" => true,
        "gptq_v2" => false,
        other => {
            return Err(q.err(format!(
                "quantization_config.checkpoint_format = \"{other}\" is not supported \
                 (\"gptq\" or \"gptq_v2\")"
            )))
        }
    };
    let gptq = GptqFormat {
        bits,
        group_size,
        zeros_minus_one,
        lm_head: q.opt_bool("lm_head")?.unwrap_or(false),
    };
    Ok(WeightFormats {
        projections: Some(gptq.kept_as()),
        per_tensor: Default::default(),
        gptq: Some(gptq),
    })
}
