//! A small GGUF (v3) writer, for tests, fixtures and benchmarks: metadata values and
//! tensors given as raw bytes of any GGML type (build them with [`super::quants`]'
//! quantizers or by hand).
//!
//! ```no_run
//! use encore_core::model::gguf::{GgmlType, GgufWriter, Value};
//! let mut w = GgufWriter::new();
//! w.kv("general.architecture", Value::String("llama".into()));
//! w.tensor_f32("output_norm.weight", &[4], &[1.0; 4]);
//! w.write(std::path::Path::new("model.gguf")).unwrap();
//! ```

use std::path::Path;

use half::f16;

use super::quants::GgmlType;
use super::reader::{Value, DEFAULT_ALIGNMENT, MAGIC};
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use crate::ops::RopeScaling;

/// Metadata and tensors to be written as one GGUF file.
#[derive(Clone, Debug, Default)]
pub struct GgufWriter {
    pub metadata: Vec<(String, Value)>,
    /// `(name, dims ne[0..] innermost first, type, bytes)`.
    pub tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
    /// The data alignment (`general.alignment` is written only when it is not 32).
    pub alignment: usize,
    /// The version written in the header (3 unless changed).
    pub version: u32,
}

impl GgufWriter {
    pub fn new() -> GgufWriter {
        GgufWriter {
            metadata: Vec::new(),
            tensors: Vec::new(),
            alignment: DEFAULT_ALIGNMENT,
            version: 3,
        }
    }

    /// Add (or replace) a metadata value.
    pub fn kv(&mut self, key: &str, value: Value) -> &mut Self {
        self.metadata.retain(|(k, _)| k != key);
        self.metadata.push((key.to_string(), value));
        self
    }

    /// The `general.architecture` and `<arch>.*` keys llama.cpp's converter writes for
    /// `cfg` (no tokenizer keys; `<arch>.vocab_size` gives the vocabulary size). Llama-3
    /// rope scaling (a `rope_freqs.weight` tensor in GGUF) is not written.
    pub fn model_metadata(&mut self, cfg: &ModelConfig) -> &mut Self {
        let a = cfg.arch.family().gguf_written;
        let u = |x: usize| Value::U32(x as u32);
        self.kv("general.architecture", Value::String(a.into()));
        self.kv("general.name", Value::String("encore".into()));
        for (key, value) in [
            ("block_count", u(cfg.num_layers)),
            ("context_length", u(cfg.max_position_embeddings)),
            ("embedding_length", u(cfg.hidden_size)),
            ("feed_forward_length", u(cfg.intermediate_size)),
            ("vocab_size", u(cfg.vocab_size)),
            ("attention.head_count", u(cfg.num_heads)),
            ("attention.head_count_kv", u(cfg.num_kv_heads)),
            ("attention.key_length", u(cfg.head_dim)),
            ("attention.value_length", u(cfg.head_dim)),
            ("rope.dimension_count", u(cfg.rope.rot_dim)),
            ("rope.freq_base", Value::F32(cfg.rope.theta)),
            (cfg.norm_kind.gguf_eps_key(), Value::F32(cfg.rms_norm_eps)),
        ] {
            self.kv(&format!("{a}.{key}"), value);
        }
        if let Some(w) = cfg.sliding_window {
            self.kv(&format!("{a}.attention.sliding_window"), u(w.size));
        }
        if let Some(RopeScaling::Linear { factor }) = cfg.rope.scaling {
            self.kv(
                &format!("{a}.rope.scaling.type"),
                Value::String("linear".into()),
            );
            self.kv(&format!("{a}.rope.scaling.factor"), Value::F32(factor));
        }
        // LongRoPE's keys (its factor tensors are the caller's: `longrope_tensors`).
        if let Some(RopeScaling::LongRope(l)) = cfg.rope.scaling {
            let s = |k: &str| format!("{a}.rope.scaling.{k}");
            self.kv(
                &s("original_context_length"),
                u(l.original_max_position_embeddings),
            );
            self.kv(&s("attn_factor"), Value::F32(l.attention_factor));
        }
        // YaRN as llama.cpp's converter writes it (GGUF has no key for `truncate`).
        if let Some(RopeScaling::Yarn(y)) = cfg.rope.scaling {
            let s = |k: &str| format!("{a}.rope.scaling.{k}");
            self.kv(&s("type"), Value::String("yarn".into()));
            self.kv(&s("factor"), Value::F32(y.factor));
            self.kv(
                &s("original_context_length"),
                u(y.original_max_position_embeddings),
            );
            self.kv(&s("yarn_beta_fast"), Value::F32(y.beta_fast));
            self.kv(&s("yarn_beta_slow"), Value::F32(y.beta_slow));
            self.kv(&s("yarn_attn_factor"), Value::F32(y.attention_factor));
        }
        if let Some(gemma) = cfg.arch.family().gemma {
            // Which layers slide (llama.cpp reads a list of flags or a period), the
            // windowed layers' rotary base, the logit caps (0: none).
            if cfg.sliding_window.is_some() {
                let flags = (0..cfg.num_layers)
                    .map(|l| Value::Bool(cfg.layer_window(l).is_some()))
                    .collect();
                self.kv(
                    &format!("{a}.attention.sliding_window_pattern"),
                    Value::Array(7, flags),
                );
            }
            if let Some(local) = cfg.rope_local {
                self.kv(&format!("{a}.rope.freq_base_swa"), Value::F32(local.theta));
            }
            if gemma.softcaps.is_some() {
                let cap = cfg.attn_softcap.unwrap_or(0.0);
                self.kv(&format!("{a}.attn_logit_softcapping"), Value::F32(cap));
            }
            if gemma.softcaps.is_some() || cfg.final_softcap.is_some() {
                let cap = cfg.final_softcap.unwrap_or(0.0);
                self.kv(&format!("{a}.final_logit_softcapping"), Value::F32(cap));
            }
        }
        if let Some(moe) = &cfg.moe {
            self.kv(&format!("{a}.expert_count"), u(moe.num_experts));
            self.kv(&format!("{a}.expert_used_count"), u(moe.top_k));
            let rules = cfg.arch.family().experts;
            // gpt-oss's converter writes the expert width too.
            if rules.is_some_and(|r| r.width.is_some() || r.fused_interleaved) {
                let width = u(moe.expert_intermediate);
                self.kv(&format!("{a}.expert_feed_forward_length"), width);
            }
            if let Some(n) = moe.shared_expert_intermediate {
                self.kv(&format!("{a}.expert_shared_feed_forward_length"), u(n));
            }
            // llama.cpp renormalises the top k for Mixtral and Qwen3-MoE, not Qwen2-MoE;
            // a config that differs says so.
            if rules.is_some_and(|r| r.gguf_norm_topk != moe.norm_topk_prob) {
                self.kv(
                    &format!("{a}.expert_weights_norm"),
                    Value::Bool(moe.norm_topk_prob),
                );
            }
        }
        self
    }

    /// LongRoPE's factor tensors of `cfg` (`rope_factors_long` and `rope_factors_short`,
    /// F32 `[rot / 2]`, as llama.cpp's converter writes a Phi-3 128k model); nothing
    /// without LongRoPE.
    pub fn longrope_tensors(&mut self, cfg: &ModelConfig) -> &mut Self {
        if let Some(RopeScaling::LongRope(l)) = cfg.rope.scaling {
            let half = cfg.rope.rot_dim / 2;
            self.tensor_f32("rope_factors_long.weight", &[half], &l.long[..half]);
            self.tensor_f32("rope_factors_short.weight", &[half], &l.short[..half]);
        }
        self
    }

    /// Remove a metadata key.
    pub fn remove_kv(&mut self, key: &str) -> &mut Self {
        self.metadata.retain(|(k, _)| k != key);
        self
    }

    /// Add a tensor of `ty` from its raw bytes; `shape` in PyTorch order (outermost
    /// first), written reversed as GGUF's `ne`.
    pub fn tensor(
        &mut self,
        name: &str,
        shape: &[usize],
        ty: GgmlType,
        bytes: Vec<u8>,
    ) -> &mut Self {
        let dims = shape.iter().rev().map(|&d| d as u64).collect();
        self.tensors.push((name.to_string(), dims, ty, bytes));
        self
    }

    pub fn tensor_f32(&mut self, name: &str, shape: &[usize], values: &[f32]) -> &mut Self {
        let bytes = values.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.tensor(name, shape, GgmlType::F32, bytes)
    }

    /// `values` rounded to f16.
    pub fn tensor_f16(&mut self, name: &str, shape: &[usize], values: &[f32]) -> &mut Self {
        let bytes = values
            .iter()
            .flat_map(|&x| f16::from_f32(x).to_le_bytes())
            .collect();
        self.tensor(name, shape, GgmlType::F16, bytes)
    }

    /// Remove a tensor.
    pub fn remove_tensor(&mut self, name: &str) -> &mut Self {
        self.tensors.retain(|(n, ..)| n != name);
        self
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        let mut metadata = self.metadata.clone();
        if self.alignment != DEFAULT_ALIGNMENT {
            metadata.retain(|(k, _)| k != "general.alignment");
            metadata.push((
                "general.alignment".into(),
                Value::U32(self.alignment as u32),
            ));
        }
        out.extend((metadata.len() as u64).to_le_bytes());
        for (key, value) in &metadata {
            put_string(&mut out, key);
            out.extend(value.type_id().to_le_bytes());
            put_value(&mut out, value);
        }
        let align = |n: usize| n.div_ceil(self.alignment) * self.alignment;
        let mut offset = 0;
        for (name, dims, ty, bytes) in &self.tensors {
            put_string(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.0.to_le_bytes());
            out.extend((offset as u64).to_le_bytes());
            offset = align(offset + bytes.len());
        }
        out.resize(align(out.len()), 0);
        for (_, _, _, bytes) in &self.tensors {
            out.extend(bytes);
            out.resize(align(out.len()), 0);
        }
        out
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.to_bytes()).map_err(|source| Error::Io {
            what: "writing GGUF file",
            path: path.display().to_string(),
            source,
        })
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.extend(x.to_le_bytes()),
        Value::I8(x) => out.extend(x.to_le_bytes()),
        Value::U16(x) => out.extend(x.to_le_bytes()),
        Value::I16(x) => out.extend(x.to_le_bytes()),
        Value::U32(x) => out.extend(x.to_le_bytes()),
        Value::I32(x) => out.extend(x.to_le_bytes()),
        Value::F32(x) => out.extend(x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_string(out, s),
        Value::Array(elem, items) => {
            out.extend(elem.to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
        Value::U64(x) => out.extend(x.to_le_bytes()),
        Value::I64(x) => out.extend(x.to_le_bytes()),
        Value::F64(x) => out.extend(x.to_le_bytes()),
    }
}
