//! `quantization_config`: the checkpoint formats whose projections load kept quantized
//! (FP8, GPTQ, AWQ, compressed-tensors' pack-quantized and float-quantized), every other
//! method refused naming it.

use std::path::Path;

use serde_json::Value;

use super::parse::Fields;
use crate::error::{Error, Result};
use crate::model::formats::{IntPacking, IntScheme, WeightFormats};

/// `quantization_config`: FP8 checkpoints (`quant_method: "fp8"`, weights in E4M3 with
/// per-tensor scales or 128x128 blocks of `weight_scale_inv`) keep their projections in
/// FP8 (the LM head unquantized; projections of partial blocks dense); GPTQ, AWQ and
/// compressed-tensors go to their parsers below; MXFP4 (`"mxfp4"`, gpt-oss: `fused_experts`,
/// the family's experts are transformers' fused tensors) keeps the experts in MXFP4; any
/// other method is refused naming it (encore would read its packed tensors as garbage).
pub(super) fn parse_quantization(f: &Fields<'_>, fused_experts: bool) -> Result<WeightFormats> {
    let Some(obj) = f.opt_object("quantization_config")? else {
        return Ok(WeightFormats::default());
    };
    let q = Fields {
        obj,
        path: f.path,
        prefix: "quantization_config.",
    };
    let method = q.opt_str("quant_method")?.unwrap_or("");
    match method {
        "gptq" => return parse_gptq(&q),
        "awq" => return parse_awq(&q),
        "compressed-tensors" => return parse_compressed_tensors(&q),
        "mxfp4" => return parse_mxfp4(&q, fused_experts),
        "fp8" => {}
        _ => {
            return Err(q.err(format!(
                "quantization_config.quant_method = \"{method}\" is not supported (encore loads \
                 \"fp8\", \"gptq\", \"awq\", \"compressed-tensors\" (pack-quantized, \
                 float-quantized) and \"mxfp4\" (gpt-oss) checkpoints; GGUF files carry their \
                 own block formats)"
            )))
        }
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
        // The LM head is not quantized by this method (transformers and vLLM keep it as
        // stored; one stored in FP8 is decoded at load).
        dense_lm_head: true,
        dense_partial_blocks: true,
        ..Default::default()
    })
}

/// `quantization_config` of an MXFP4 checkpoint (transformers' `Mxfp4Config`, the published
/// gpt-oss ones): the routed experts' fused tensors stored as `*_blocks` / `*_scales`
/// (`model/weights/fused_experts.rs`) stay MXFP4 on the device, every other tensor is
/// dense as stored (transformers converts the experts alone). `modules_to_not_convert`
/// naming the experts (`mlp.experts`) keeps them dense too (their fused tensors then dense in
/// the file); other entries name what is dense anyway. A family whose experts are not
/// transformers' fused tensors is refused: MXFP4 checkpoints exist for gpt-oss only.
fn parse_mxfp4(q: &Fields<'_>, fused_experts: bool) -> Result<WeightFormats> {
    if !fused_experts {
        return Err(q.err(
            "quantization_config.quant_method = \"mxfp4\" is supported for gpt-oss only (its \
             fused expert tensors, `mlp.experts.*_blocks` / `*_scales`)",
        ));
    }
    let experts_dense = q
        .get("modules_to_not_convert")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|m| m.contains("mlp.experts") || m == "experts");
    Ok(WeightFormats {
        experts: (!experts_dense).then_some(encore_backend::quant::QuantFormat::Mxfp4),
        ..Default::default()
    })
}

/// `quantization_config` of a GPTQ checkpoint ([`IntPacking`]): 4 or 8 bits, symmetric
/// (or with zero points at 4 bits), groups of a multiple of 32 columns, in column order or
/// in activation order (`desc_act`: [`IntPacking::act_order`]), or one a row (-1, in any
/// order); what encore does not run (zero points at 8 bits, other widths or group sizes,
/// other packings) is refused naming the field.
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
    let zero_points = q.opt_bool("sym")? == Some(false);
    if zero_points && bits != 4 {
        return Err(q.err(format!(
            "quantization_config.sym = false is not supported with bits = {bits} (GPTQ zero \
             points are run at 4 bits)"
        )));
    }
    // Activation order permutes the columns among the groups: the loader sorts each
    // projection's input columns by group (its `perm`) and the forward gathers the
    // activation's columns the same way. With one group a row (group_size -1) every column
    // has the row's scale whatever the order, and the loader checks that g_idx says so.
    let act_order = q.opt_bool("desc_act")? == Some(true) && group_size.is_some();
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
    kept_packed(IntPacking {
        bits,
        group_size,
        scheme: IntScheme::Gptq { zeros_minus_one },
        zero_points,
        lm_head: q.opt_bool("lm_head")?.unwrap_or(false),
        act_order,
    })
}

/// `quantization_config` of an AWQ checkpoint (AutoAWQ, as transformers' `AwqConfig`
/// reads it: `bits` or `w_bit`, `group_size` or `q_group_size`, `zero_point`, `version`):
/// the GEMM layout, 4 bits, zero points, groups of a multiple of 32 columns;
/// `modules_to_not_convert` may name the LM head and routers. Anything else is refused
/// naming the field.
fn parse_awq(q: &Fields<'_>) -> Result<WeightFormats> {
    let pick = |a: &str, b: &str| q.get(a).or_else(|| q.get(b)).filter(|v| !v.is_null());
    match pick("bits", "w_bit").map(|v| v.as_u64()) {
        Some(Some(4)) => {}
        v => {
            return Err(q.err(format!(
                "quantization_config.bits = {} is not supported (AWQ with 4 bits)",
                v.flatten().map_or("missing".to_string(), |b| b.to_string())
            )))
        }
    }
    let group_size = match pick("group_size", "q_group_size") {
        Some(Value::Number(n)) if n.as_u64().is_some_and(|g| g > 0 && g % 32 == 0) => {
            n.as_u64().map(|g| g as usize)
        }
        Some(Value::Number(n)) if n.as_i64() == Some(-1) => None,
        v => {
            return Err(q.err(format!(
                "quantization_config.group_size = {} is not supported (AWQ groups of a \
                 multiple of 32 columns)",
                v.map_or("missing".to_string(), |v| v.to_string())
            )))
        }
    };
    if q.opt_bool("zero_point")? == Some(false) {
        return Err(q.err(
            "quantization_config.zero_point = false is not supported (AWQ with zero points)",
        ));
    }
    let version = q.opt_str("version")?.unwrap_or("gemm");
    if !version.eq_ignore_ascii_case("gemm") {
        return Err(q.err(format!(
            "quantization_config.version = \"{version}\" is not supported (AWQ's \"gemm\" \
             layout)"
        )));
    }
    for m in q
        .get("modules_to_not_convert")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match m.as_str() {
            // AutoAWQ never packs the LM head; a mixture of experts' routers, which encore
            // never quantizes.
            Some("lm_head" | "gate") => {}
            Some(r) if r.ends_with("mlp.gate") => {}
            _ => {
                return Err(q.err(format!(
                    "quantization_config.modules_to_not_convert lists {m}: modules kept \
                     unquantized other than the LM head and routers are not supported"
                )))
            }
        }
    }
    kept_packed(IntPacking {
        bits: 4,
        group_size,
        scheme: IntScheme::Awq,
        zero_points: true,
        lm_head: false,
        act_order: false,
    })
}

fn kept_packed(p: IntPacking) -> Result<WeightFormats> {
    Ok(WeightFormats {
        projections: Some(p.kept_as()),
        int_packing: Some(p),
        ..Default::default()
    })
}

/// `quantization_config` of a compressed-tensors checkpoint (llm-compressor): the
/// `pack-quantized` format with integer weights of 4 or 8 bits, symmetric (or with zero
/// points at 4 bits), per group (of a
/// multiple of 32 columns) or per channel, static, no activation quantization (W4A16,
/// W8A16); or the `float-quantized` format, FP8 E4M3 weights per channel or per tensor
/// (kept in FP8), activations in FP8 dynamic or static or not at all (FP8-dynamic, W8A8,
/// W8A16: encore's FP8 matmuls quantize activations per token at run time, so static input
/// scales go unused, which is logged); every config group the same; `ignore` may hold the
/// LM head (kept as stored) and routers. Other formats and options are refused naming the
/// field.
fn parse_compressed_tensors(q: &Fields<'_>) -> Result<WeightFormats> {
    let refuse = |what: String| Err(q.err(format!("quantization_config.{what}")));
    let format = q.opt_str("format")?.unwrap_or("");
    let float = match format {
        "pack-quantized" => false,
        "float-quantized" => true,
        _ => {
            return refuse(format!(
                "format = \"{format}\" is not supported (compressed-tensors \
                 \"pack-quantized\" or \"float-quantized\")"
            ))
        }
    };
    let Some(groups) = q.opt_object("config_groups")? else {
        return refuse("config_groups is missing (compressed-tensors)".into());
    };
    let mut weights: Option<&Value> = None;
    for (name, g) in groups {
        let field = |k: &str| g.get(k).filter(|v| !v.is_null());
        if let Some(f) = field("format").and_then(Value::as_str) {
            if f != format {
                return refuse(format!(
                    "config_groups.{name}.format = \"{f}\" is not supported (the \
                     checkpoint's format is \"{format}\")"
                ));
            }
        }
        if let Some(a) = field("input_activations") {
            let arg = |k: &str| a.get(k).filter(|v| !v.is_null());
            let fp8 = arg("num_bits").and_then(Value::as_u64) == Some(8)
                && arg("type").and_then(Value::as_str) == Some("float");
            if !(float && fp8) {
                return refuse(format!(
                    "config_groups.{name}.input_activations = {a} is not supported (integer \
                     weights run weight-only, W4A16 / W8A16; FP8 weights take FP8 activations)"
                ));
            }
            if arg("dynamic").and_then(Value::as_bool) != Some(true) {
                tracing::warn!(
                    "{}: config_groups.{name}.input_activations are static: their input \
                     scales go unused (encore's FP8 matmuls quantize activations per token \
                     at run time)",
                    q.path
                );
            }
        }
        let targets = field("targets").and_then(Value::as_array);
        if !targets.is_some_and(|t| t.iter().any(|x| x.as_str() == Some("Linear"))) {
            return refuse(format!(
                "config_groups.{name}.targets must include \"Linear\" (per-module schemes are \
                 not supported)"
            ));
        }
        match (weights, field("weights")) {
            (_, None) => return refuse(format!("config_groups.{name}.weights is missing")),
            (Some(w), Some(v)) if w != v => {
                return refuse(format!(
                    "config_groups.{name}.weights differs from another group's (one scheme for \
                     every projection is supported)"
                ))
            }
            (_, v) => weights = v,
        }
    }
    let Some(w) = weights else {
        return refuse("config_groups holds no group".into());
    };
    let arg = |k: &str| w.get(k).filter(|v| !v.is_null());
    if float {
        return parse_ct_fp8(q, w);
    }
    let bits = match arg("num_bits").and_then(Value::as_u64) {
        Some(b @ (4 | 8)) => b as u32,
        b => {
            return refuse(format!(
                "config_groups.*.weights.num_bits = {b:?} is not supported (4 or 8)"
            ))
        }
    };
    for (key, want) in [("type", "int")] {
        if let Some(v) = arg(key).and_then(Value::as_str).filter(|v| *v != want) {
            return refuse(format!(
                "config_groups.*.weights.{key} = \"{v}\" is not supported ({want})"
            ));
        }
    }
    let zero_points = arg("symmetric").and_then(Value::as_bool) == Some(false);
    if zero_points && bits != 4 {
        return refuse(format!(
            "config_groups.*.weights.symmetric = false is not supported with num_bits = {bits} \
             (zero points are run at 4 bits)"
        ));
    }
    if arg("dynamic").and_then(Value::as_bool) == Some(true) {
        return refuse("config_groups.*.weights.dynamic = true is not supported".into());
    }
    let group_size = match arg("strategy").and_then(Value::as_str).unwrap_or("") {
        "channel" => None,
        "group" => match arg("group_size").and_then(Value::as_u64) {
            Some(g) if g > 0 && g % 32 == 0 => Some(g as usize),
            g => {
                return refuse(format!(
                    "config_groups.*.weights.group_size = {g:?} is not supported (a multiple \
                     of 32)"
                ))
            }
        },
        other => {
            return refuse(format!(
                "config_groups.*.weights.strategy = \"{other}\" is not supported (group or \
                 channel)"
            ))
        }
    };
    // Activation order (llm-compressor's `actorder`) only matters between groups: one
    // scale a row (strategy "channel") runs in any order, the loader checking g_idx.
    let grouped = group_size.is_some();
    if let Some(a) = arg("actorder").filter(|a| grouped && a.as_bool() != Some(false)) {
        return refuse(format!(
            "config_groups.*.weights.actorder = {a} is not supported with strategy \
             \"group\" (groups in column order; strategy \"channel\" runs in any order)"
        ));
    }
    let lm_head = !ct_ignores_lm_head(q)?;
    kept_packed(IntPacking {
        bits,
        group_size,
        scheme: IntScheme::PackQuantized,
        zero_points,
        lm_head,
        act_order: false,
    })
}

/// The text of `config.json` at `path`, with the GPTQ packing of an AutoGPTQ export that
/// keeps it in `quantize_config.json` beside a config without `quantization_config` (read
/// as `quantization_config`, `quant_method` "gptq" where it names none). Unchanged when
/// there is no such file, the config already has one, or it is not a JSON object (which
/// `from_json` reports).
pub(super) fn with_quantize_config(path: &Path, text: String) -> Result<String> {
    let side = path.with_file_name("quantize_config.json");
    if !side.is_file() {
        return Ok(text);
    }
    let mut cfg: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(_) => return Ok(text),
    };
    let Some(obj) = cfg.as_object_mut() else {
        return Ok(text);
    };
    if obj.contains_key("quantization_config") {
        return Ok(text);
    }
    let where_ = side.display().to_string();
    let q_text = std::fs::read_to_string(&side).map_err(|source| Error::Io {
        what: "reading the GPTQ quantize config",
        path: where_.clone(),
        source,
    })?;
    let mut q: Value = serde_json::from_str(&q_text).map_err(|e| Error::Config {
        path: where_.clone(),
        what: format!("not valid JSON: {e}"),
    })?;
    let Some(qo) = q.as_object_mut() else {
        return Err(Error::Config {
            path: where_,
            what: "the top level is not a JSON object".into(),
        });
    };
    qo.entry("quant_method")
        .or_insert_with(|| Value::from("gptq"));
    obj.insert("quantization_config".into(), q);
    Ok(cfg.to_string())
}

/// Whether compressed-tensors' `ignore` lists the LM head; anything in it other than the
/// LM head and routers is refused naming it.
fn ct_ignores_lm_head(q: &Fields<'_>) -> Result<bool> {
    let mut lm_head = false;
    for i in q
        .get("ignore")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match i.as_str() {
            Some("lm_head") => lm_head = true,
            // A mixture of experts' routers, which encore never quantizes.
            Some(r) if r.ends_with("mlp.gate") || r.ends_with("mlp.gate$") => {}
            _ => {
                return Err(q.err(format!(
                    "quantization_config.ignore lists {i}: modules kept unquantized other \
                     than the LM head and routers are not supported"
                )))
            }
        }
    }
    Ok(lm_head)
}

/// compressed-tensors' `float-quantized` weights (`w`, one config group's `weights`):
/// FP8 E4M3 (`num_bits` 8, `type` float), symmetric, static, per channel or per tensor:
/// the projections are kept in FP8 from their `weight` and `weight_scale`; an ignored LM
/// head stays as stored.
fn parse_ct_fp8(q: &Fields<'_>, w: &Value) -> Result<WeightFormats> {
    let refuse = |what: String| {
        Err(q.err(format!(
            "quantization_config.config_groups.*.weights.{what}"
        )))
    };
    let arg = |k: &str| w.get(k).filter(|v| !v.is_null());
    if arg("num_bits").and_then(Value::as_u64) != Some(8)
        || arg("type").and_then(Value::as_str) != Some("float")
    {
        return refuse(format!(
            "num_bits / type = {:?} / {:?} are not supported (float-quantized: 8-bit float, \
             E4M3)",
            arg("num_bits"),
            arg("type")
        ));
    }
    if arg("symmetric").and_then(Value::as_bool) == Some(false) {
        return refuse("symmetric = false is not supported (FP8 weights)".into());
    }
    if arg("dynamic").and_then(Value::as_bool) == Some(true) {
        return refuse("dynamic = true is not supported (FP8 weights with static scales)".into());
    }
    match arg("strategy").and_then(Value::as_str).unwrap_or("tensor") {
        "channel" | "tensor" => {}
        other => {
            return refuse(format!(
                "strategy = \"{other}\" is not supported (FP8 weights per channel or per \
                 tensor)"
            ))
        }
    }
    Ok(WeightFormats {
        projections: Some(encore_backend::quant::QuantFormat::F8E4M3),
        dense_lm_head: ct_ignores_lm_head(q)?,
        dense_partial_blocks: true,
        ..Default::default()
    })
}
