//! Parsing an HF `config.json` into a [`ModelConfig`]: the field reader ([`Fields`], whose
//! errors name the file and the key) and one function per part of the config.

use serde_json::{Map, Value};

use super::quantization::parse_quantization;
use super::rope::{parse_gemma_rope, parse_rope};
use super::{Arch, EagleConfig, ModelConfig, MoeConfig, SlidingWindow};
use crate::backend::Activation;
use crate::error::{Error, Result};
use crate::model::arch::{GemmaRules, NormPlacement, QkNorm, QkvBias, WindowRule, FAMILIES};
use crate::tensor::DType;

/// A JSON object being parsed, with the file path and the key prefix for messages.
/// JSON `null` counts as absent everywhere (HF writes `"head_dim": null` and the like).
pub(super) struct Fields<'a> {
    pub(super) obj: &'a Map<String, Value>,
    pub(super) path: &'a str,
    pub(super) prefix: &'a str,
}

impl<'a> Fields<'a> {
    pub(super) fn err(&self, what: impl Into<String>) -> Error {
        Error::Config {
            path: self.path.to_string(),
            what: what.into(),
        }
    }

    pub(super) fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    pub(super) fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    pub(super) fn wrong_type(&self, key: &str, expected: &str, found: &Value) -> Error {
        self.err(format!(
            "field `{}` must be {expected}, found {found}",
            self.name(key)
        ))
    }

    /// The value of `key` through `conv`, or a wrong-type error expecting `expected`.
    pub(super) fn opt<T>(
        &self,
        key: &str,
        expected: &str,
        conv: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<Option<T>> {
        self.get(key)
            .map(|v| conv(v).ok_or_else(|| self.wrong_type(key, expected, v)))
            .transpose()
    }

    pub(super) fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        self.opt(key, "a non-negative integer", |v| {
            v.as_u64().and_then(|n| usize::try_from(n).ok())
        })
    }

    /// A required integer that must be at least 1.
    pub(super) fn positive(&self, key: &str) -> Result<usize> {
        match self.opt_usize(key)? {
            None => Err(self.err(format!("required field `{}` is missing", self.name(key)))),
            Some(0) => Err(self.err(format!("field `{}` must be positive", self.name(key)))),
            Some(n) => Ok(n),
        }
    }

    pub(super) fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        self.opt(key, "a number", Value::as_f64)
    }

    pub(super) fn req_f64(&self, key: &str) -> Result<f64> {
        self.opt_f64(key)?
            .ok_or_else(|| self.err(format!("required field `{}` is missing", self.name(key))))
    }

    pub(super) fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.opt(key, "true or false", Value::as_bool)
    }

    pub(super) fn opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        self.opt(key, "a string", Value::as_str)
    }

    pub(super) fn opt_object(&self, key: &str) -> Result<Option<&'a Map<String, Value>>> {
        self.opt(key, "an object", Value::as_object)
    }

    /// One token id, or a list of them.
    pub(super) fn token_ids(&self, key: &str) -> Result<Vec<u32>> {
        let as_id = |v: &Value| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| self.wrong_type(key, "a token id or a list of token ids", v))
        };
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items.iter().map(as_id).collect(),
            Some(v) => Ok(vec![as_id(v)?]),
        }
    }
}

pub(super) fn parse(f: &Fields<'_>) -> Result<ModelConfig> {
    let arch = parse_arch(f)?;
    let vocab_size = f.positive("vocab_size")?;
    let hidden_size = f.positive("hidden_size")?;
    let intermediate_size = f.positive("intermediate_size")?;
    let num_layers = f.positive("num_hidden_layers")?;
    let heads = parse_heads(f, hidden_size)?;
    let fam = arch.family();
    // Gemma names it `hidden_activation` (GELU-tanh by default); `hidden_act` otherwise.
    let act_key = match f.get(fam.act_key) {
        None if f.get("hidden_act").is_some() => "hidden_act",
        _ => fam.act_key,
    };
    let hidden_act = match f.opt_str(act_key)? {
        None => fam.act,
        Some(name) => Activation::from_hf(name).ok_or_else(|| {
            f.err(format!(
                "{act_key} = \"{name}\" is not supported (supported: {})",
                Activation::hf_names()
            ))
        })?,
    };

    let max_position_embeddings = f
        .opt_usize("max_position_embeddings")?
        .unwrap_or(arch.default_max_positions());
    let (rope, rope_local) = match fam.gemma.is_some_and(|g| g.local_rope) {
        true => {
            let (global, local) = parse_gemma_rope(f, heads.head_dim, max_position_embeddings)?;
            (global, Some(local))
        }
        false => (
            parse_rope(f, arch, heads.head_dim, max_position_embeddings)?,
            None,
        ),
    };
    let eps_key = fam.norm_kind.eps_key();
    let rms_norm_eps = f.opt_f64(eps_key)?.unwrap_or(fam.rms_norm_eps) as f32;
    if rms_norm_eps.is_nan() || rms_norm_eps < 0.0 {
        return Err(f.err(format!("{eps_key} = {rms_norm_eps} must be >= 0")));
    }
    for (key, what) in fam.refused_flags {
        if f.opt_bool(key)? == Some(true) {
            let family = arch.model_type();
            return Err(f.err(format!(
                "{key} = true ({what}) is not supported for {family}"
            )));
        }
    }
    let tie_word_embeddings = f.opt_bool("tie_word_embeddings")?.unwrap_or(fam.tie);
    let (qkv_bias, o_bias) = parse_bias(f, arch)?;
    let mut sliding_window = parse_sliding_window(f, arch, num_layers)?;
    // `layer_types`, where present, says which layers slide (transformers then ignores
    // `max_window_layers`: the window starts at layer 0, `parse_sliding_window`); a window
    // it lifts from every layer changes nothing.
    let full_attention_layers =
        match parse_layer_types(f, arch, sliding_window.as_ref(), num_layers)? {
            Some(full) => {
                sliding_window = sliding_window.filter(|_| full.len() < num_layers);
                full
            }
            // Gemma without the list: Gemma 3's five windowed layers then a full one,
            // Gemma 2's one and one; gpt-oss's one and one (`full_every`).
            None => match (fam.gemma, fam.full_every, &sliding_window) {
                (Some(g), _, Some(_)) => {
                    let pattern = match g.pattern_key {
                        Some(key) => f.opt_usize(key)?.unwrap_or(g.pattern).max(1),
                        None => g.pattern,
                    };
                    (0..num_layers).filter(|l| (l + 1) % pattern == 0).collect()
                }
                (None, Some(n), Some(_)) => (0..num_layers).filter(|l| (l + 1) % n == 0).collect(),
                _ => Vec::new(),
            },
        };
    let GemmaVariants {
        query_scale,
        attn_softcap,
        final_softcap,
    } = match fam.gemma {
        Some(g) => parse_gemma_variants(f, g, heads.head_dim)?,
        None => GemmaVariants::NONE,
    };
    let torch_dtype = parse_torch_dtype(f)?;
    let weights = parse_quantization(f, fam.experts.is_some_and(|e| e.fused_interleaved))?;
    let moe = parse_moe(f, arch, num_layers, intermediate_size)?;
    if let Some(e) = fam.experts.filter(|e| e.act == Activation::SwigluOai) {
        // transformers fixes the limit (and alpha) in `GptOssExperts`; a config that names
        // another limit would run differently elsewhere.
        let limit = f.opt_f64("swiglu_limit")?;
        if limit.is_some_and(|l| l != crate::backend::SWIGLU_OAI_LIMIT as f64) {
            return Err(f.err(format!(
                "swiglu_limit = {} is not supported (the {} experts' clamp is {})",
                limit.unwrap_or_default(),
                e.act.hf_name(),
                crate::backend::SWIGLU_OAI_LIMIT
            )));
        }
    }
    if fam.rope_required && f.get("rope_parameters").is_none() && f.get("rope_scaling").is_none() {
        return Err(f.err(format!(
            "{} without `rope_parameters` (transformers' default YaRN) is not supported: \
             name its rope_type, factor and original_max_position_embeddings",
            arch.model_type()
        )));
    }
    if moe.is_some() && hidden_act != Activation::Silu {
        return Err(f.err(format!(
            "hidden_act = \"{}\" with experts is not supported (the experts run SiLU)",
            hidden_act.hf_name()
        )));
    }
    let bos_token_id = f.token_ids("bos_token_id")?.first().copied();
    let eos_token_ids = f.token_ids("eos_token_id")?;

    let cfg = ModelConfig {
        arch,
        vocab_size,
        hidden_size,
        intermediate_size,
        num_layers,
        num_heads: heads.num_heads,
        num_kv_heads: heads.num_kv_heads,
        head_dim: heads.head_dim,
        rope,
        rms_norm_eps,
        tie_word_embeddings,
        qkv_bias,
        o_bias,
        qk_norm: fam.qk_norm != QkNorm::None,
        hidden_act,
        post_norms: fam.norms != NormPlacement::Pre,
        embed_scale: fam.embed_scale,
        rope_local,
        norm_plus_one: fam.norm_plus_one,
        norm_kind: fam.norm_kind,
        query_scale,
        attn_softcap,
        final_softcap,
        no_rope_layers: parse_no_rope_layers(f, arch, num_layers)?,
        full_attention_layers,
        max_position_embeddings,
        torch_dtype,
        bos_token_id,
        eos_token_ids,
        sliding_window,
        weights,
        moe,
        tp: None,
        eagle: None,
    };
    let cfg = match parse_eagle(f)? {
        None => cfg,
        Some(eagle) => cfg.into_eagle(eagle).map_err(|what| f.err(what))?,
    };
    cfg.check_sizes([
        "hidden_size",
        "intermediate_size",
        "vocab_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
    ])
    .map_err(|what| f.err(what))?;
    Ok(cfg)
}

/// The attention heads: query and KV head counts and the head dimension.
struct Heads {
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

/// `num_attention_heads`, `num_key_value_heads` (default: as many as the query heads, of
/// which they must divide the count) and `head_dim` (default: `hidden_size` over the
/// heads), which must be even.
fn parse_heads(f: &Fields<'_>, hidden_size: usize) -> Result<Heads> {
    let num_heads = f.positive("num_attention_heads")?;
    let num_kv_heads = match f.opt_usize("num_key_value_heads")? {
        None => num_heads,
        Some(_) => f.positive("num_key_value_heads")?,
    };
    if num_heads % num_kv_heads != 0 {
        return Err(f.err(format!(
            "num_attention_heads = {num_heads} is not a multiple of \
             num_key_value_heads = {num_kv_heads}"
        )));
    }
    let head_dim = match f.opt_usize("head_dim")? {
        Some(_) => f.positive("head_dim")?,
        None if hidden_size.is_multiple_of(num_heads) => hidden_size / num_heads,
        None => {
            return Err(f.err(format!(
                "hidden_size = {hidden_size} is not a multiple of num_attention_heads = \
                 {num_heads} and there is no `head_dim`"
            )))
        }
    };
    if head_dim % 2 != 0 {
        return Err(f.err(format!(
            "head_dim = {head_dim} must be even (rotary embedding)"
        )));
    }
    Ok(Heads {
        num_heads,
        num_kv_heads,
        head_dim,
    })
}

/// Attention bias as the HF modeling code builds it (the family's [`QkvBias`]): Qwen2
/// always has q/k/v biases, Mistral never; Llama and Qwen3 follow `attention_bias` (which
/// also gives o_proj a bias: the loader accepts it only when it is all zeros); gpt-oss's
/// `attention_bias` (default true) biases q/k/v and o_proj, both applied. `mlp_bias` is
/// refused. Returns the q/k/v bias and the o_proj bias.
fn parse_bias(f: &Fields<'_>, arch: Arch) -> Result<(bool, bool)> {
    if let QkvBias::WithOutput { default } = arch.family().qkv_bias {
        let on = f.opt_bool("attention_bias")?.unwrap_or(default);
        return Ok((on, on));
    }
    let attention_bias = f.opt_bool("attention_bias")?.unwrap_or(false);
    let qkv_bias = match arch.family().qkv_bias {
        QkvBias::Always => true,
        QkvBias::Never => false,
        QkvBias::Flag { key, default } => f.opt_bool(key)?.unwrap_or(default),
        QkvBias::AttentionBias => attention_bias,
        QkvBias::Refused if attention_bias => {
            return Err(f.err(format!(
                "attention_bias = true is not supported for {}",
                arch.model_type()
            )));
        }
        QkvBias::Refused | QkvBias::WithOutput { .. } => false,
    };
    if f.opt_bool("mlp_bias")? == Some(true) {
        return Err(f.err("mlp_bias = true is not supported (the MLP has no bias in encore)"));
    }
    Ok((qkv_bias, false))
}

/// The experts of the MoE architectures, with transformers' defaults for absent fields
/// (Qwen2-MoE: 60 experts, top 4, width 1408, shared expert 5632; Qwen3-MoE: 128, top 8,
/// width 768; Mixtral: 8, top 2, its `intermediate_size`); `None` for the dense ones.
/// Sizes no model has, a top-k above the expert count, or a dense layer of a Mixtral are
/// refused naming the field.
fn parse_moe(
    f: &Fields<'_>,
    arch: Arch,
    num_layers: usize,
    intermediate_size: usize,
) -> Result<Option<MoeConfig>> {
    let Some(rules) = arch.family().experts else {
        return Ok(None);
    };
    let (experts_key, experts, top_k) = (rules.count_key, rules.count, rules.top_k);
    let positive = |key: &str, default: usize| -> Result<usize> {
        match f.opt_usize(key)? {
            None => Ok(default),
            Some(_) => f.positive(key),
        }
    };
    // transformers 5 writes either name (its configs alias one to the other).
    let alias = match experts_key {
        "num_experts" => "num_local_experts",
        _ => "num_experts",
    };
    let experts_key = match f.get(experts_key) {
        None if f.get(alias).is_some() => alias,
        _ => experts_key,
    };
    let num_experts = positive(experts_key, experts)?;
    let top_k = positive("num_experts_per_tok", top_k)?;
    if top_k > num_experts {
        return Err(f.err(format!(
            "num_experts_per_tok = {top_k} is more than the {num_experts} experts"
        )));
    }
    let expert_intermediate = match rules.width {
        None => intermediate_size,
        Some(width) => positive("moe_intermediate_size", width)?,
    };
    let norm_topk_prob = match rules.fixed_norm_topk {
        Some(b) => b,
        None => f.opt_bool("norm_topk_prob")?.unwrap_or(false),
    };
    let step = positive("decoder_sparse_step", 1)?;
    let dense: Vec<usize> = match f.get("mlp_only_layers") {
        None => Vec::new(),
        Some(v) => v
            .as_array()
            .and_then(|a| {
                a.iter()
                    .map(|x| x.as_u64().and_then(|n| usize::try_from(n).ok()))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| f.wrong_type("mlp_only_layers", "a list of layer indices", v))?,
    };
    if !rules.dense_layers && (step != 1 || !dense.is_empty()) {
        return Err(f.err(format!(
            "decoder_sparse_step / mlp_only_layers are not {} fields (every layer is sparse)",
            arch.model_type()
        )));
    }
    let sparse = (0..num_layers)
        .map(|l| !dense.contains(&l) && (l + 1) % step == 0)
        .collect();
    let shared_expert_intermediate = match rules.shared {
        Some(default) => match f.opt_usize("shared_expert_intermediate_size")? {
            Some(0) => None,
            None => Some(default),
            Some(n) => Some(n),
        },
        None => None,
    };
    let moe = MoeConfig {
        num_experts,
        top_k,
        expert_intermediate,
        norm_topk_prob,
        sparse,
        shared_expert_intermediate,
    };
    moe.check_sizes([
        experts_key,
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
    ])
    .map_err(|what| f.err(what))?;
    Ok(Some(moe))
}

/// The checkpoint's dtype: `torch_dtype`, else `dtype` (transformers 5), else bf16.
fn parse_torch_dtype(f: &Fields<'_>) -> Result<DType> {
    Ok(match f.opt_str("torch_dtype")?.or(f.opt_str("dtype")?) {
        None => DType::BF16,
        Some(s) => DType::parse_float(s).ok_or_else(|| {
            f.err(format!(
                "torch_dtype = \"{s}\" is not supported (expected {})",
                DType::FLOAT_NAMES
            ))
        })?,
    })
}

/// An EAGLE-3 head's fields, when `architectures` names one (a class name with
/// `Eagle3` in it, e.g. `LlamaForCausalLMEagle3`).
fn parse_eagle(f: &Fields<'_>) -> Result<Option<(EagleConfig, usize)>> {
    let Some(names) = f.get("architectures").and_then(Value::as_array) else {
        return Ok(None);
    };
    if !names
        .iter()
        .filter_map(Value::as_str)
        .any(|n| n.contains("Eagle3"))
    {
        return Ok(None);
    }
    let target_vocab = f.positive("vocab_size")?;
    let draft_vocab = f.opt_usize("draft_vocab_size")?.unwrap_or(target_vocab);
    if draft_vocab == 0 || draft_vocab > target_vocab {
        return Err(f.err(format!(
            "draft_vocab_size = {draft_vocab} must be 1 to vocab_size ({target_vocab})"
        )));
    }
    let hidden = f.positive("hidden_size")?;
    let target_hidden = f.opt_usize("target_hidden_size")?.unwrap_or(hidden);
    // Pinned layers. vLLM's (speculators) top-level field names the layers whose input
    // the head reads; SGLang's `eagle_config` field names the layers whose output it
    // reads, the input of the next.
    let three = |f: &Fields<'_>| -> Result<Option<[usize; 3]>> {
        const KEY: &str = "eagle_aux_hidden_state_layer_ids";
        let Some(v) = f.get(KEY) else {
            return Ok(None);
        };
        let ids: Option<Vec<usize>> = v.as_array().and_then(|a| {
            a.iter()
                .map(|x| x.as_u64().and_then(|n| usize::try_from(n).ok()))
                .collect()
        });
        match ids.as_deref() {
            Some(&[a, b, c]) => Ok(Some([a, b, c])),
            _ => Err(f.wrong_type(KEY, "a list of three layer indices", v)),
        }
    };
    let aux_layers = match three(f)? {
        Some(l) => Some(l),
        None => match f.opt_object("eagle_config")? {
            None => None,
            Some(obj) => three(&Fields {
                obj,
                path: f.path,
                prefix: "eagle_config.",
            })?
            .map(|l| l.map(|x| x.saturating_add(1))),
        },
    };
    let norm_before_residual = f.opt_bool("norm_before_residual")?.unwrap_or(false);
    Ok(Some((
        EagleConfig {
            target_vocab,
            target_hidden,
            aux_layers,
            norm_before_residual,
        },
        draft_vocab,
    )))
}

/// `architectures` (the first one encore knows), else `model_type`. An EAGLE-3 head
/// (`LlamaForCausalLMEagle3`) is a Llama layer.
fn parse_arch(f: &Fields<'_>) -> Result<Arch> {
    if let Some(v) = f.get("architectures") {
        let eagle = v.as_array().is_some_and(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .any(|n| n.contains("Eagle3"))
        });
        if eagle {
            return Ok(Arch::Llama);
        }
        let names: Vec<&str> = v
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if names.is_empty() {
            return Err(f.wrong_type("architectures", "a list of class names", v));
        }
        return names
            .iter()
            .find_map(|n| Arch::from_hf_name(n))
            .ok_or_else(|| {
                f.err(format!(
                    "unsupported architecture {names:?} (supported: {})",
                    FAMILIES.map(|f| f.hf_name).join(", ")
                ))
            });
    }
    match f.opt_str("model_type")? {
        Some(t) => Arch::from_model_type(t).ok_or_else(|| {
            f.err(format!(
                "unsupported model_type \"{t}\" (supported: {})",
                FAMILIES.map(|f| f.model_type).join(", ")
            ))
        }),
        None => Err(f.err("required field `architectures` (or `model_type`) is missing")),
    }
}

/// SmolLM3's NoPE layers: `no_rope_layers` (one entry a layer at least, 1 = rotary, 0 =
/// none), else every `no_rope_layer_interval`-th layer (default 4: layers 3, 7, ...), as
/// transformers builds them. Empty for the other families.
fn parse_no_rope_layers(f: &Fields<'_>, arch: Arch, num_layers: usize) -> Result<Vec<usize>> {
    let Some(interval) = arch.family().no_rope_interval else {
        return Ok(Vec::new());
    };
    if let Some(v) = f.get("no_rope_layers").filter(|v| !v.is_null()) {
        let flags: Option<Vec<u64>> = v
            .as_array()
            .map(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>())
            .unwrap_or(None);
        let flags = flags
            .filter(|l| l.iter().all(|&x| x <= 1))
            .ok_or_else(|| f.wrong_type("no_rope_layers", "a list of 0 and 1", v))?;
        if flags.len() < num_layers {
            return Err(f.err(format!(
                "no_rope_layers has {} entries for {num_layers} layers",
                flags.len()
            )));
        }
        return Ok((0..num_layers).filter(|&i| flags[i] == 0).collect());
    }
    let step = f.opt_usize("no_rope_layer_interval")?.unwrap_or(interval);
    if step == 0 {
        return Err(f.err(format!(
            "field `{}` must be positive",
            f.name("no_rope_layer_interval")
        )));
    }
    Ok((0..num_layers).filter(|i| (i + 1) % step == 0).collect())
}

/// transformers 5's `layer_types` (one entry a layer at least), for the families whose
/// modeling code reads it (Qwen2, Qwen3; Mistral's and Phi-3's ignore it): where the model
/// has a window, the layers it names `full_attention` attend fully (an alternation, which
/// `max_window_layers` cannot give); every entry must be `sliding_attention` or
/// `full_attention`. `None` without a window or without the list.
fn parse_layer_types(
    f: &Fields<'_>,
    arch: Arch,
    window: Option<&SlidingWindow>,
    num_layers: usize,
) -> Result<Option<Vec<usize>>> {
    let Some(v) = f.get("layer_types") else {
        return Ok(None);
    };
    if !arch.family().layer_types {
        return Ok(None);
    }
    let kinds: Option<Vec<&str>> = v
        .as_array()
        .and_then(|a| a.iter().map(Value::as_str).collect());
    let kinds = kinds
        .filter(|k| {
            k.iter()
                .all(|k| matches!(*k, "sliding_attention" | "full_attention"))
        })
        .ok_or_else(|| {
            f.wrong_type(
                "layer_types",
                "a list of \"sliding_attention\" and \"full_attention\"",
                v,
            )
        })?;
    if kinds.len() < num_layers {
        return Err(f.err(format!(
            "layer_types has {} entries for {num_layers} layers",
            kinds.len()
        )));
    }
    if window.is_none() {
        return Ok(None);
    }
    Ok(Some(
        (0..num_layers)
            .filter(|&l| kinds[l] == "full_attention")
            .collect(),
    ))
}

/// What Gemma adds to the Llama family's attention and head.
struct GemmaVariants {
    /// The factor on q that makes attention's `1 / sqrt(head_dim)` its
    /// `query_pre_attn_scalar^-1/2` (default 256).
    query_scale: f32,
    /// `attn_logit_softcapping` and `final_logit_softcapping` (Gemma 2's default 50 and
    /// 30; none for Gemma 3; `null` turns one off).
    attn_softcap: Option<f32>,
    final_softcap: Option<f32>,
}

impl GemmaVariants {
    const NONE: Self = Self {
        query_scale: 1.0,
        attn_softcap: None,
        final_softcap: None,
    };
}

/// Gemma 2's and 3's fields beyond the Llama family's: the query scalar and logit
/// soft-capping; what encore does not run (bidirectional attention) is refused by name.
fn parse_gemma_variants(
    f: &Fields<'_>,
    rules: GemmaRules,
    head_dim: usize,
) -> Result<GemmaVariants> {
    let cap = |key: &str, default: Option<f32>| -> Result<Option<f32>> {
        let v = match f.obj.get(key) {
            None => return Ok(default),
            Some(Value::Null) => return Ok(None),
            Some(_) => f.opt_f64(key)?.unwrap_or(0.0),
        };
        if !(v > 0.0 && v.is_finite()) {
            return Err(f.err(format!("`{}` = {v} must be positive", f.name(key))));
        }
        Ok(Some(v as f32))
    };
    let (attn_cap, final_cap) = rules.softcaps.unzip();
    let attn_softcap = cap("attn_logit_softcapping", attn_cap)?;
    let final_softcap = cap("final_logit_softcapping", final_cap)?;
    if f.opt_bool("use_bidirectional_attention")? == Some(true) {
        return Err(f.err("use_bidirectional_attention = true is not supported"));
    }
    let scalar = f.opt_f64("query_pre_attn_scalar")?.unwrap_or(256.0);
    if !(scalar > 0.0 && scalar.is_finite()) {
        return Err(f.err(format!(
            "`{}` = {scalar} must be positive",
            f.name("query_pre_attn_scalar")
        )));
    }
    Ok(GemmaVariants {
        query_scale: (head_dim as f64 / scalar).sqrt() as f32,
        attn_softcap,
        final_softcap,
    })
}

/// The window as transformers builds its layer types: Mistral's `sliding_window` applies
/// to every layer; Qwen2/Qwen3's only when `use_sliding_window` is true, and then to the
/// layers from `max_window_layers` on (default: every layer; from layer 0 when `layer_types`
/// is given, which then picks the layers); Phi-3's covers every layer.
/// Llama has none. A window that covers every position the model can reach is kept: it
/// changes nothing.
fn parse_sliding_window(
    f: &Fields<'_>,
    arch: Arch,
    num_layers: usize,
) -> Result<Option<SlidingWindow>> {
    let default = match arch.family().window {
        WindowRule::None => return Ok(None),
        WindowRule::Refused { needs_size } => {
            if f.opt_bool("use_sliding_window")? == Some(true)
                && (!needs_size || f.opt_usize("sliding_window")?.is_some())
            {
                return Err(f.err(format!(
                    "use_sliding_window = true is not supported for {}",
                    arch.model_type()
                )));
            }
            return Ok(None);
        }
        WindowRule::Every { default } => default,
        WindowRule::OptIn => None,
    };
    let first_layer = match arch.family().window {
        WindowRule::OptIn => {
            if f.opt_bool("use_sliding_window")? != Some(true) {
                return Ok(None);
            }
            // `layer_types`, when given, decides per layer (`parse_layer_types`).
            match f.get("layer_types") {
                Some(_) => 0,
                None => f.opt_usize("max_window_layers")?.unwrap_or(0),
            }
        }
        _ => 0,
    };
    let size = match f.opt_usize("sliding_window")?.or(default) {
        None => return Ok(None),
        Some(0) => {
            return Err(f.err(format!(
                "field `{}` must be positive",
                f.name("sliding_window")
            )))
        }
        Some(n) => n,
    };
    if first_layer >= num_layers {
        return Ok(None);
    }
    Ok(Some(SlidingWindow { size, first_layer }))
}
