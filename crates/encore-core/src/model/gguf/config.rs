//! [`ModelConfig`] and [`GgufVocab`] from a GGUF file's metadata.
//!
//! The `<arch>.*` keys llama.cpp's converter writes map onto the HF config fields; what
//! GGUF leaves implicit (tied embeddings, q/k/v bias) is read off the tensors present.
//! Anything the forward pass cannot honour is an [`Error::Config`] naming the key.

use super::reader::{GgufFile, Value};
use crate::error::{Error, Result};
use crate::model::arch::{GemmaRules, NormPlacement, QkNorm, QkvBias, FAMILIES};
use crate::model::config::{Arch, ModelConfig, MoeConfig, SlidingWindow};
use crate::ops::{
    Llama3Scaling, LongRopeScaling, RopeConfig, RopeScaling, YarnScaling, LONGROPE_MAX_FREQS,
};
use crate::tensor::DType;
use crate::tokenizer::{end_of_generation_ids, GgufVocab};

/// `tokenizer.ggml.token_type` of a control token.
const CONTROL_TOKEN_TYPE: i128 = 3;

/// The tensor llama.cpp stores Llama-3 rope scaling in (per-frequency divisors).
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// Metadata lookups with messages naming the file and key.
struct Meta<'a> {
    file: &'a GgufFile,
    arch: &'a str,
}

impl<'a> Meta<'a> {
    fn err(&self, what: impl Into<String>) -> Error {
        Error::Config {
            path: self.file.path().display().to_string(),
            what: what.into(),
        }
    }

    fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.file.get(key)
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        self.get(key)
            .map(|v| {
                v.as_int()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| {
                        let what = if v.as_array().is_some() {
                            " (per-layer values are not supported)"
                        } else {
                            ""
                        };
                        self.err(format!(
                            "`{key}` must be a non-negative integer, found {}{what}",
                            v.describe()
                        ))
                    })
            })
            .transpose()
    }

    fn positive(&self, key: &str) -> Result<usize> {
        match self.opt_usize(key)? {
            None => Err(self.err(format!("required key `{key}` is missing"))),
            Some(0) => Err(self.err(format!("`{key}` must be positive"))),
            Some(n) => Ok(n),
        }
    }

    /// The value of `key` through `conv`, or an error saying it must be `kind`.
    fn opt<T>(
        &self,
        key: &str,
        kind: &str,
        conv: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<Option<T>> {
        self.get(key)
            .map(|v| {
                conv(v).ok_or_else(|| {
                    self.err(format!("`{key}` must be {kind}, found {}", v.describe()))
                })
            })
            .transpose()
    }

    fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        self.opt(key, "a number", Value::as_f64)
    }

    fn opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        self.opt(key, "a string", Value::as_str)
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.opt(key, "a bool", Value::as_bool)
    }

    fn opt_id(&self, key: &str) -> Result<Option<u32>> {
        self.opt_usize(key)?
            .map(|n| {
                u32::try_from(n).map_err(|_| self.err(format!("`{key}` = {n} is not a token id")))
            })
            .transpose()
    }

    fn opt_array(&self, key: &str) -> Result<Option<&'a [Value]>> {
        self.opt(key, "an array", Value::as_array)
    }

    /// An array whose every element `conv` accepts.
    fn opt_vec<T>(
        &self,
        key: &str,
        kind: &str,
        conv: impl Fn(&Value) -> Option<T>,
    ) -> Result<Option<Vec<T>>> {
        let Some(items) = self.opt_array(key)? else {
            return Ok(None);
        };
        items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                conv(v).ok_or_else(|| {
                    self.err(format!(
                        "`{key}[{i}]` must be {kind}, found {}",
                        v.describe()
                    ))
                })
            })
            .collect::<Result<Vec<T>>>()
            .map(Some)
    }
}

/// The file's `general.architecture` and the [`Arch`] encore runs it as.
pub fn gguf_arch(file: &GgufFile) -> Result<(&str, Arch)> {
    let m = Meta { file, arch: "" };
    let name = m
        .opt_str("general.architecture")?
        .ok_or_else(|| m.err("required key `general.architecture` is missing"))?;
    Arch::from_gguf(name).map(|a| (name, a)).ok_or_else(|| {
        let supported: Vec<&str> = FAMILIES.iter().filter_map(|f| f.gguf).collect();
        m.err(format!(
            "unsupported architecture \"{name}\" (general.architecture; supported: {})",
            supported.join(", ")
        ))
    })
}

/// The model config a GGUF file describes (the same struct `config.json` gives).
pub fn config_from_gguf(file: &GgufFile) -> Result<ModelConfig> {
    let (arch_name, arch) = gguf_arch(file)?;
    let m = Meta {
        file,
        arch: arch_name,
    };
    let k = |s: &str| m.key(s);
    let sizes = parse_sizes(&m)?;
    // llama.cpp writes Mixtral as `llama` with experts.
    let arch = match arch {
        Arch::Llama if m.opt_usize(&k("expert_count"))?.unwrap_or(0) > 0 => Arch::Mixtral,
        a => a,
    };
    let fam = arch.family();
    let moe = parse_moe(&m, arch, &sizes)?;
    let mut rope = parse_rope(&m, arch, sizes.head_dim)?;
    // GGUF has no key for YaRN's `truncate`: every gpt-oss checkpoint says false.
    if let (true, Some(RopeScaling::Yarn(y))) = (fam.sinks, rope.scaling.as_mut()) {
        y.truncate = false;
    }
    let eps_key = k(fam.norm_kind.gguf_eps_key());
    let rms_norm_eps =
        m.opt_f64(&eps_key)?
            .ok_or_else(|| m.err(format!("required key `{eps_key}` is missing")))? as f32;
    if rms_norm_eps.is_nan() || rms_norm_eps < 0.0 {
        return Err(m.err(format!("`{eps_key}` = {rms_norm_eps} must be >= 0")));
    }
    let vocab_size = parse_vocab_size(&m)?;
    // llama.cpp's default window for Gemma 2 files without the key.
    let default_window = arch.family().gemma.and_then(|g| g.gguf_window);
    // 0 is no window, as llama.cpp reads it (its converter writes 0 for Phi-4's `null`).
    let sliding_window = match m
        .opt_usize(&k("attention.sliding_window"))?
        .or(default_window)
    {
        None | Some(0) => None,
        Some(size) => Some(SlidingWindow {
            size,
            first_layer: 0,
        }),
    };
    let max_position_embeddings = m.positive(&k("context_length"))?;
    let bos_token_id = m.opt_id("tokenizer.ggml.bos_token_id")?;
    let eos_token_ids = parse_eos_token_ids(&m)?;
    check_layer_tensors(&m, arch)?;
    let gemma = match fam.gemma {
        Some(rules) => Some(parse_gemma(
            &m,
            rules,
            &sizes,
            rope,
            sliding_window.is_some(),
        )?),
        None => None,
    };
    let cfg = ModelConfig {
        arch,
        vocab_size,
        hidden_size: sizes.hidden_size,
        intermediate_size: sizes.intermediate_size,
        num_layers: sizes.num_layers,
        num_heads: sizes.num_heads,
        num_kv_heads: sizes.num_kv_heads,
        head_dim: sizes.head_dim,
        rope,
        rms_norm_eps,
        tie_word_embeddings: file.tensor("output.weight").is_none(),
        qkv_bias: fam.qkv_bias.by_default() || file.tensor("blk.0.attn_q.bias").is_some(),
        // gpt-oss's `attention_bias` biases o_proj too (`attn_output.bias`).
        o_bias: matches!(fam.qkv_bias, QkvBias::WithOutput { .. })
            && file.tensor("blk.0.attn_output.bias").is_some(),
        qk_norm: fam.qk_norm != QkNorm::None,
        hidden_act: fam.act,
        post_norms: fam.norms != NormPlacement::Pre,
        embed_scale: fam.embed_scale,
        rope_local: gemma.as_ref().and_then(|g| g.rope_local),
        norm_plus_one: gemma.is_some(),
        norm_kind: fam.norm_kind,
        query_scale: gemma.as_ref().map_or(1.0, |g| g.query_scale),
        attn_softcap: gemma.as_ref().and_then(|g| g.attn_softcap),
        final_softcap: gemma.as_ref().and_then(|g| g.final_softcap),
        // llama.cpp's smollm3 has no key for it: every fourth layer, hard-coded.
        no_rope_layers: match fam.no_rope_interval {
            Some(n) => (0..sizes.num_layers).filter(|i| (i + 1) % n == 0).collect(),
            None => Vec::new(),
        },
        max_position_embeddings,
        torch_dtype: DType::BF16,
        bos_token_id,
        eos_token_ids,
        sliding_window,
        // gpt-oss: llama.cpp's `set_swa_pattern(2)`, the even layers slide.
        full_attention_layers: match (gemma, fam.full_every, sliding_window.is_some()) {
            (Some(g), ..) => g.full_attention_layers,
            (None, Some(n), true) => (0..sizes.num_layers).filter(|l| (l + 1) % n == 0).collect(),
            _ => Vec::new(),
        },
        weights: Default::default(),
        moe,
        tp: None,
        eagle: None,
    };
    cfg.check_sizes([
        &k("embedding_length"),
        &k("feed_forward_length"),
        &k("vocab_size"),
        &k("block_count"),
        &k("attention.head_count"),
        &k("attention.head_count_kv"),
        &k("attention.key_length"),
        &k("context_length"),
    ])
    .map_err(|what| m.err(what))?;
    check_embedding(&m, vocab_size, cfg.hidden_size)?;
    Ok(cfg)
}

/// A layer's tensors the family runs without, refused by what they are (llama.cpp reads
/// both off the tensors: stablelm's per-head q/k norms, and its parallel residual as a
/// layer with an `attn_norm` but no `ffn_norm`).
fn check_layer_tensors(m: &Meta<'_>, arch: Arch) -> Result<()> {
    let fam = arch.family();
    let has = |name: &str| m.file.tensor(name).is_some();
    let what = if fam.qk_norm == QkNorm::None && has("blk.0.attn_q_norm.weight") {
        "q/k norms (`blk.0.attn_q_norm.weight`)"
    } else if has("blk.0.ffn_gate_up_exps.weight") {
        "fused gate/up experts (`blk.0.ffn_gate_up_exps.weight`; convert unfused)"
    } else if fam.norms == NormPlacement::Pre
        && !fam.sinks
        && has("blk.0.attn_norm.weight")
        && !has("blk.0.ffn_norm.weight")
    {
        "a parallel residual (no `blk.0.ffn_norm.weight`)"
    } else {
        return Ok(());
    };
    Err(m.err(format!("{what} is not supported for {}", m.arch)))
}

/// What a `gemma2` or `gemma3` file implies as llama.cpp runs it (`src/models/gemma*.cpp`):
/// GELU-tanh, post norms, the embedding times sqrt(hidden) and norms stored as `1 + w`
/// (the config's `norm_plus_one`, which the loader does not add again for GGUF); the
/// query scalar `hidden / heads` for the 27B models (46 layers of Gemma 2, 62 of Gemma 3)
/// and the head dim otherwise; the window on the layers `attention.sliding_window_pattern`
/// names (a list of flags, or every layer but each n-th; default 2 for Gemma 2, 6 for
/// Gemma 3), whose windowed layers rotate with `rope.freq_base_swa` (Gemma 3: default
/// 10,000, no scaling); logit soft-capping (`attn_logit_softcapping` and
/// `final_logit_softcapping`: Gemma 2's default 50 and 30, Gemma 3's final one if given).
struct Gemma {
    query_scale: f32,
    rope_local: Option<RopeConfig>,
    attn_softcap: Option<f32>,
    final_softcap: Option<f32>,
    full_attention_layers: Vec<usize>,
}

fn parse_gemma(
    m: &Meta<'_>,
    rules: GemmaRules,
    sizes: &Sizes,
    rope: RopeConfig,
    windowed: bool,
) -> Result<Gemma> {
    let (big, pattern) = (rules.gguf_big_layers, rules.pattern);
    let pattern_key = m.key("attention.sliding_window_pattern");
    let windowed_layers: Vec<bool> = match m.get(&pattern_key) {
        Some(v) if v.as_array().is_some() => {
            let flags = m
                .opt_vec(&pattern_key, "a bool", Value::as_bool)?
                .unwrap_or_default();
            if flags.len() < sizes.num_layers {
                return Err(m.err(format!(
                    "`{pattern_key}` has {} entries for {} layers",
                    flags.len(),
                    sizes.num_layers
                )));
            }
            flags
        }
        _ => {
            let n = m.opt_usize(&pattern_key)?.unwrap_or(pattern);
            (0..sizes.num_layers)
                .map(|l| n == 0 || l % n < n - 1)
                .collect()
        }
    };
    let scalar = match sizes.num_layers == big {
        true => sizes.hidden_size / sizes.num_heads,
        false => sizes.head_dim,
    };
    let cap = |key: &str, default: f32| -> Result<Option<f32>> {
        let key = m.key(key);
        let v = m.opt_f64(&key)?.unwrap_or(default as f64);
        // llama.cpp reads 0 as none.
        if v == 0.0 {
            return Ok(None);
        }
        if !(v > 0.0 && v.is_finite()) {
            return Err(m.err(format!("`{key}` = {v} must be positive")));
        }
        Ok(Some(v as f32))
    };
    // Gemma 2's caps apply unless the file says 0; Gemma 3's final cap only if given.
    let capped = rules.softcaps;
    let base_key = m.key("rope.freq_base_swa");
    let local_base = m.opt_f64(&base_key)?;
    if let Some(b) = local_base.filter(|b| !(*b > 0.0 && b.is_finite())) {
        return Err(m.err(format!("`{base_key}` = {b} must be positive")));
    }
    let rope_local = match (rules.local_rope, local_base) {
        (false, None) => None,
        (false, Some(b)) => Some(RopeConfig {
            theta: b as f32,
            ..rope
        }),
        (true, b) => Some(RopeConfig {
            theta: b.unwrap_or(10_000.0) as f32,
            scaling: None,
            ..rope
        }),
    };
    let final_key = m.key("final_logit_softcapping");
    Ok(Gemma {
        query_scale: (sizes.head_dim as f64 / scalar as f64).sqrt() as f32,
        rope_local,
        attn_softcap: match capped {
            Some((attn, _)) => cap("attn_logit_softcapping", attn)?,
            None => None,
        },
        final_softcap: match (capped, m.get(&final_key)) {
            (Some((_, fin)), _) => cap("final_logit_softcapping", fin)?,
            (None, Some(_)) => cap("final_logit_softcapping", 0.0)?,
            (None, None) => None,
        },
        full_attention_layers: match windowed {
            true => (0..sizes.num_layers)
                .filter(|&l| !windowed_layers[l])
                .collect(),
            false => Vec::new(),
        },
    })
}

/// The experts of a `qwen3moe`, `qwen2moe` or `llama`-with-experts (Mixtral) file, as
/// llama.cpp reads them: `expert_count`, `expert_used_count`, the expert width
/// (`expert_feed_forward_length`; Mixtral's `feed_forward_length`), the shared expert's
/// (`expert_shared_feed_forward_length`, Qwen2-MoE), the top-k renormalised for Qwen3-MoE and
/// Mixtral and not for Qwen2-MoE (`expert_weights_norm` where the file says), and a layer
/// sparse where it has a router (`blk.N.ffn_gate_inp.weight`).
fn parse_moe(m: &Meta<'_>, arch: Arch, sizes: &Sizes) -> Result<Option<MoeConfig>> {
    let k = |s: &str| m.key(s);
    let Some(rules) = arch.family().experts else {
        return Ok(None);
    };
    let num_experts = m.positive(&k("expert_count"))?;
    let top_k = m.positive(&k("expert_used_count"))?;
    if top_k > num_experts {
        return Err(m.err(format!(
            "`{}` = {top_k} is more than `{}` = {num_experts}",
            k("expert_used_count"),
            k("expert_count")
        )));
    }
    let expert_intermediate = match rules.width {
        // gpt-oss's converter writes `expert_feed_forward_length` too.
        None if rules.fused_interleaved => m
            .opt_usize(&k("expert_feed_forward_length"))?
            .unwrap_or(sizes.intermediate_size),
        None => sizes.intermediate_size,
        Some(_) => m.positive(&k("expert_feed_forward_length"))?,
    };
    let shared_expert_intermediate = match rules.shared {
        Some(_) => m
            .opt_usize(&k("expert_shared_feed_forward_length"))?
            .filter(|&n| n > 0),
        None => None,
    };
    let norm_topk_prob = match m.opt_bool(&k("expert_weights_norm"))? {
        Some(b) => b,
        None => rules.gguf_norm_topk,
    };
    let sparse = (0..sizes.num_layers)
        .map(|l| {
            m.file
                .tensor(&format!("blk.{l}.ffn_gate_inp.weight"))
                .is_some()
        })
        .collect();
    let moe = MoeConfig {
        num_experts,
        top_k,
        expert_intermediate,
        norm_topk_prob,
        sparse,
        shared_expert_intermediate,
    };
    moe.check_sizes([
        &k("expert_count"),
        &k("expert_feed_forward_length"),
        &k("expert_shared_feed_forward_length"),
    ])
    .map_err(|what| m.err(what))?;
    Ok(Some(moe))
}

/// The layer count and the sizes of a layer.
struct Sizes {
    num_layers: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

/// `block_count` (at most one layer per tensor), the
/// embedding and feed-forward lengths, the head counts (KV heads dividing the query
/// heads) and the head dim: the key length, else the embedding over the heads; the value
/// length must match it, and it must be even.
fn parse_sizes(m: &Meta<'_>) -> Result<Sizes> {
    let k = |s: &str| m.key(s);
    let num_layers = m.positive(&k("block_count"))?;
    // Every layer has several tensors: a corrupt count must not size the plan.
    if num_layers > m.file.tensors().len() {
        return Err(m.err(format!(
            "`{}` = {num_layers} but the file holds only {} tensors",
            k("block_count"),
            m.file.tensors().len()
        )));
    }
    let hidden_size = m.positive(&k("embedding_length"))?;
    let intermediate_size = m.positive(&k("feed_forward_length"))?;
    let num_heads = m.positive(&k("attention.head_count"))?;
    let num_kv_heads = match m.opt_usize(&k("attention.head_count_kv"))? {
        None => num_heads,
        Some(_) => m.positive(&k("attention.head_count_kv"))?,
    };
    if num_heads % num_kv_heads != 0 {
        return Err(m.err(format!(
            "`{}` = {num_heads} is not a multiple of `{}` = {num_kv_heads}",
            k("attention.head_count"),
            k("attention.head_count_kv")
        )));
    }
    let head_dim = match m.opt_usize(&k("attention.key_length"))? {
        Some(_) => m.positive(&k("attention.key_length"))?,
        None if hidden_size % num_heads == 0 => hidden_size / num_heads,
        None => {
            return Err(m.err(format!(
                "`{}` = {hidden_size} is not a multiple of `{}` = {num_heads} and there is \
                 no `{}`",
                k("embedding_length"),
                k("attention.head_count"),
                k("attention.key_length")
            )))
        }
    };
    if let Some(v) = m.opt_usize(&k("attention.value_length"))? {
        if v != head_dim {
            return Err(m.err(format!(
                "`{}` = {v} differs from the key length {head_dim} (not supported)",
                k("attention.value_length")
            )));
        }
    }
    if head_dim % 2 != 0 {
        return Err(m.err(format!(
            "head dim {head_dim} must be even (rotary embedding)"
        )));
    }
    Ok(Sizes {
        num_layers,
        hidden_size,
        intermediate_size,
        num_heads,
        num_kv_heads,
        head_dim,
    })
}

/// Rotary over `rope.dimension_count` dims of a head (all of it but for phi3's and
/// stablelm's partial rotary) with the file's base, and Llama-3 scaling when the file holds [`ROPE_FREQS`];
/// any other scaling type (phi3's longrope factors too) is refused.
fn parse_rope(m: &Meta<'_>, arch: Arch, head_dim: usize) -> Result<RopeConfig> {
    let k = |s: &str| m.key(s);
    let mut rot_dim = head_dim;
    if let Some(r) = m.opt_usize(&k("rope.dimension_count"))? {
        let partial_ok =
            arch.family().partial_rotary.is_some() && r > 0 && r < head_dim && r.is_multiple_of(2);
        if r != head_dim && !partial_ok {
            return Err(m.err(format!(
                "`{}` = {r} but the head dim is {head_dim}: partial rotary is not supported \
                 (only phi3's and stablelm's, an even count below the head dim)",
                k("rope.dimension_count")
            )));
        }
        rot_dim = r;
    }
    let theta = m.opt_f64(&k("rope.freq_base"))?.unwrap_or(10_000.0);
    if !(theta > 0.0 && theta.is_finite()) {
        return Err(m.err(format!(
            "`{}` = {theta} must be positive",
            k("rope.freq_base")
        )));
    }
    let scaling_key = k("rope.scaling.type");
    // llama.cpp's linear scaling divides every frequency by `rope.scaling.factor`, as
    // transformers' `linear` does.
    let linear = match m.opt_str(&scaling_key)? {
        None | Some("none") => None,
        Some("linear") => {
            let key = k("rope.scaling.factor");
            let factor = m
                .opt_f64(&key)?
                .ok_or_else(|| m.err(format!("required key `{key}` is missing")))?;
            if !(factor > 0.0 && factor.is_finite()) {
                return Err(m.err(format!("`{key}` = {factor} must be positive")));
            }
            Some(RopeScaling::Linear {
                factor: factor as f32,
            })
        }
        Some("yarn") => Some(RopeScaling::Yarn(parse_yarn(m)?)),
        Some(other) => {
            return Err(m.err(format!(
                "`{scaling_key}` = \"{other}\" is not supported (no rope scaling, linear, yarn, \
                 or Llama-3 scaling through `{ROPE_FREQS}`)"
            )))
        }
    };
    let mut rope = RopeConfig {
        rot_dim,
        theta: theta as f32,
        scaling: linear,
    };
    if m.file.tensor(ROPE_FREQS).is_some() {
        rope.scaling = Some(RopeScaling::Llama3(llama3_from_rope_freqs(
            m.file, m, rope,
        )?));
    }
    if let Some(l) = parse_longrope(m, rot_dim)? {
        if rope.scaling.is_some() {
            return Err(m.err(format!(
                "`{LONG_FACTORS}` beside another rope scaling is not supported"
            )));
        }
        rope.scaling = Some(RopeScaling::LongRope(l));
    }
    Ok(rope)
}

/// LongRoPE's per-frequency factors (llama.cpp's Phi-3 files: `rope_factors_long` and
/// `rope_factors_short`, F32 `[rot / 2]`).
const LONG_FACTORS: &str = "rope_factors_long.weight";
const SHORT_FACTORS: &str = "rope_factors_short.weight";

/// LongRoPE as llama.cpp's converter writes Phi-3's 128k models: both factor tensors,
/// `rope.scaling.original_context_length`, and `rope.scaling.attn_factor` (transformers'
/// default `sqrt(1 + ln(factor) / ln(original))` where absent, `factor` the context over
/// the original one). `None` without the tensors; one without the other is an error.
fn parse_longrope(m: &Meta<'_>, rot_dim: usize) -> Result<Option<LongRopeScaling>> {
    let (long, short) = (m.file.tensor(LONG_FACTORS), m.file.tensor(SHORT_FACTORS));
    if long.is_none() && short.is_none() {
        return Ok(None);
    }
    if let Some(why) = LongRopeScaling::check_rot_dim(rot_dim) {
        return Err(m.err(why));
    }
    let factors = |name: &str| -> Result<[f32; LONGROPE_MAX_FREQS]> {
        if m.file.tensor(name).is_none() {
            return Err(m.err(format!("`{name}` is missing beside its longrope twin")));
        }
        let v: Vec<f64> = m
            .file
            .tensor_f32(name)?
            .into_iter()
            .map(f64::from)
            .collect();
        LongRopeScaling::factors(&v, rot_dim).ok_or_else(|| {
            m.err(format!(
                "`{name}` must hold {} positive factors (one per rotary frequency), found {}",
                rot_dim / 2,
                v.len()
            ))
        })
    };
    let (long, short) = (factors(LONG_FACTORS)?, factors(SHORT_FACTORS)?);
    let orig_key = m.key("rope.scaling.original_context_length");
    let original = match m.opt_usize(&orig_key)? {
        Some(0) | None => {
            return Err(m.err(format!(
                "`{orig_key}` must be given and positive with longrope factors"
            )))
        }
        Some(n) => n,
    };
    let factor = m.positive(&m.key("context_length"))? as f64 / original as f64;
    let attn_key = m.key("rope.scaling.attn_factor");
    let attention_factor = match m.opt_f64(&attn_key)? {
        Some(a) if a > 0.0 && a.is_finite() => a,
        Some(a) => return Err(m.err(format!("`{attn_key}` = {a} must be positive"))),
        None => LongRopeScaling::default_attention_factor(factor, original),
    };
    Ok(Some(LongRopeScaling {
        short,
        long,
        original_max_position_embeddings: original,
        attention_factor: attention_factor as f32,
    }))
}

/// YaRN as llama.cpp's converter writes transformers' `yarn` (`rope.scaling.factor`,
/// `original_context_length`, `yarn_beta_fast` / `yarn_beta_slow` when the config had them,
/// `yarn_attn_factor` for its `attention_factor`), read back into transformers' semantics:
/// betas 32 and 1, the attention factor `0.1 ln(factor) + 1` and the ramp's bounds rounded
/// outwards unless given. What transformers has no counterpart for (an extrapolation factor
/// other than 1, `yarn_log_multiplier`) is refused naming the key.
fn parse_yarn(m: &Meta<'_>) -> Result<YarnScaling> {
    let k = |s: &str| m.key(s);
    let positive = |key: &str, default: Option<f64>| -> Result<f64> {
        let key = k(key);
        let v = match (m.opt_f64(&key)?, default) {
            (Some(v), _) | (None, Some(v)) => v,
            (None, None) => return Err(m.err(format!("required key `{key}` is missing"))),
        };
        if !(v > 0.0 && v.is_finite()) {
            return Err(m.err(format!("`{key}` = {v} must be positive")));
        }
        Ok(v)
    };
    for (key, ok) in [
        ("rope.scaling.yarn_ext_factor", 1.0),
        ("rope.scaling.yarn_log_multiplier", 0.0),
    ] {
        if let Some(v) = m.opt_f64(&k(key))?.filter(|v| *v != ok) {
            return Err(m.err(format!(
                "`{}` = {v} is not supported (only {ok}: transformers' YaRN)",
                k(key)
            )));
        }
    }
    let factor = positive("rope.scaling.factor", None)?;
    let original = match m.opt_usize(&k("rope.scaling.original_context_length"))? {
        Some(0) => {
            return Err(m.err(format!(
                "`{}` must be positive",
                k("rope.scaling.original_context_length")
            )))
        }
        Some(n) => n,
        None => m.positive(&k("context_length"))?,
    };
    let default_attention = YarnScaling::mscale(factor, 1.0);
    Ok(YarnScaling {
        factor: factor as f32,
        original_max_position_embeddings: original,
        beta_fast: positive("rope.scaling.yarn_beta_fast", Some(32.0))? as f32,
        beta_slow: positive("rope.scaling.yarn_beta_slow", Some(1.0))? as f32,
        attention_factor: positive("rope.scaling.yarn_attn_factor", Some(default_attention))?
            as f32,
        truncate: true,
    })
}

/// `vocab_size`, else the length of `tokenizer.ggml.tokens`.
fn parse_vocab_size(m: &Meta<'_>) -> Result<usize> {
    let key = m.key("vocab_size");
    Ok(match m.opt_usize(&key)? {
        Some(_) => m.positive(&key)?,
        None => match m.opt_array("tokenizer.ggml.tokens")? {
            Some(tokens) if !tokens.is_empty() => tokens.len(),
            _ => {
                return Err(m.err(format!(
                    "neither `{key}` nor `tokenizer.ggml.tokens` gives the vocabulary size"
                )))
            }
        },
    })
}

/// The same list as the tokenizer's `eos_token_ids()` (what `generate` stops on): the
/// metadata's EOS and EOT, then the control tokens whose text ends a turn.
fn parse_eos_token_ids(m: &Meta<'_>) -> Result<Vec<u32>> {
    let mut metadata_eos = Vec::new();
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
        metadata_eos.extend(m.opt_id(key)?);
    }
    let tokens = m.opt_array("tokenizer.ggml.tokens")?.unwrap_or_default();
    let types = m
        .opt_array("tokenizer.ggml.token_type")?
        .unwrap_or_default();
    let controls = types
        .iter()
        .zip(tokens)
        .enumerate()
        .filter(|(_, (ty, _))| ty.as_int() == Some(CONTROL_TOKEN_TYPE))
        .filter_map(|(id, (_, text))| Some((u32::try_from(id).ok()?, text.as_str()?)));
    Ok(end_of_generation_ids(metadata_eos, controls))
}

/// The embedding's shape ties the metadata to the tensors before anything is sized from
/// the metadata (the memory estimate runs before the weights are checked).
fn check_embedding(m: &Meta<'_>, vocab_size: usize, hidden_size: usize) -> Result<()> {
    if let Some(t) = m.file.tensor("token_embd.weight") {
        if t.shape() != [vocab_size, hidden_size] {
            return Err(m.err(format!(
                "`token_embd.weight` has shape {:?}, but the metadata gives a vocabulary \
                 of {vocab_size} and `{}` = {hidden_size}",
                t.shape(),
                m.key("embedding_length")
            )));
        }
    }
    Ok(())
}

/// Llama-3 rope scaling is stored by llama.cpp as `rope_freqs.weight`, the divisor of
/// each inverse frequency, without the parameters. The divisors of the published Llama
/// 3.1/3.2 settings (low 1, high 4, original context 8192, any factor) are tried; a file
/// whose divisors match none of them is refused rather than run with wrong positions.
fn llama3_from_rope_freqs(
    file: &GgufFile,
    m: &Meta<'_>,
    rope: RopeConfig,
) -> Result<Llama3Scaling> {
    let divisors = file.tensor_f32(ROPE_FREQS)?;
    let half = rope.rot_dim / 2;
    if divisors.len() != half {
        return Err(m.err(format!(
            "`{ROPE_FREQS}` has {} values, expected {half} (head dim / 2)",
            divisors.len()
        )));
    }
    let factor = divisors.iter().fold(1f32, |a, &x| a.max(x));
    let plain = rope.inv_freq();
    for original in [8192, 4096, 2048, 16384, 32768] {
        let scaling = Llama3Scaling {
            factor,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: original,
        };
        let scaled = RopeConfig {
            scaling: Some(RopeScaling::Llama3(scaling)),
            ..rope
        }
        .inv_freq();
        let matches = (0..half).all(|i| {
            let want = plain[i] / scaled[i];
            (divisors[i] as f64 - want).abs() <= 1e-4 * want
        });
        if matches {
            return Ok(scaling);
        }
    }
    Err(m.err(format!(
        "`{ROPE_FREQS}` holds rope frequency divisors that match no Llama-3 scaling encore \
         knows (factor {factor}, low 1, high 4); custom rope factors are not supported"
    )))
}

/// The `tokenizer.*` metadata, for [`crate::tokenizer::Tokenizer::from_gguf_vocab`].
pub fn vocab_from_gguf(file: &GgufFile) -> Result<GgufVocab> {
    let m = Meta { file, arch: "" };
    let model = m
        .opt_str("tokenizer.ggml.model")?
        .ok_or_else(|| m.err("required key `tokenizer.ggml.model` is missing"))?;
    let tokens = m
        .opt_vec("tokenizer.ggml.tokens", "a string", |v| {
            v.as_str().map(String::from)
        })?
        .ok_or_else(|| m.err("required key `tokenizer.ggml.tokens` is missing"))?;
    let as_i32 = |v: &Value| v.as_int().and_then(|n| i32::try_from(n).ok());
    Ok(GgufVocab {
        model: model.to_string(),
        pre: m.opt_str("tokenizer.ggml.pre")?.map(String::from),
        tokens,
        scores: m.opt_vec("tokenizer.ggml.scores", "a number", |v| {
            v.as_f64().map(|x| x as f32)
        })?,
        token_types: m.opt_vec("tokenizer.ggml.token_type", "an integer", as_i32)?,
        merges: m.opt_vec("tokenizer.ggml.merges", "a string", |v| {
            v.as_str().map(String::from)
        })?,
        bos_token_id: m.opt_id("tokenizer.ggml.bos_token_id")?,
        eos_token_id: m.opt_id("tokenizer.ggml.eos_token_id")?,
        eot_token_id: m.opt_id("tokenizer.ggml.eot_token_id")?,
        unknown_token_id: m.opt_id("tokenizer.ggml.unknown_token_id")?,
        padding_token_id: m.opt_id("tokenizer.ggml.padding_token_id")?,
        add_bos_token: m.opt_bool("tokenizer.ggml.add_bos_token")?,
        add_eos_token: m.opt_bool("tokenizer.ggml.add_eos_token")?,
        add_space_prefix: m.opt_bool("tokenizer.ggml.add_space_prefix")?,
        chat_template: m.opt_str("tokenizer.chat_template")?.map(String::from),
    })
}
