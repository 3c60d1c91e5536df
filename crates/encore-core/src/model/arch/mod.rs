//! The model families encore runs, in one registry keyed by the names a checkpoint gives:
//! the HF `architectures` class, its `model_type`, and llama.cpp's `general.architecture`
//! for GGUF files. Adding a family starts here: its [`Arch`] and one [`Family`] row;
//! what its layer holds and how it runs follow from its config's variants
//! (`model/config/`, the declaration in `model/decl.rs`, the recipe in `model/llama.rs`).

/// The supported model families.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    /// Qwen2's attention with a mixture-of-experts MLP and a gated shared expert.
    Qwen2Moe,
    /// Qwen3's attention with a mixture-of-experts MLP.
    Qwen3Moe,
    /// Mistral's attention with a mixture-of-experts MLP.
    Mixtral,
    /// Llama's layer without rotary embeddings in some layers (NoPE: every fourth by
    /// default, `no_rope_layers`).
    SmolLM3,
    /// Phi-3, Phi-3.5 and Phi-4 (`phi3`): Llama's layer with q/k/v in one `qkv_proj` and
    /// gate/up in one `gate_up_proj`, partial rotary (`partial_rotary_factor`), a sliding
    /// window over every layer.
    Phi3,
    /// Gemma 3's language model (`gemma3_text`): GELU-tanh, (1 + w) RMSNorms before and
    /// after attention and the MLP, per-head q/k norms, the embedding times sqrt(hidden),
    /// windowed layers (five in six) with their own rotary base.
    Gemma3,
    /// Gemma 2 (`gemma2`): Gemma 3's layer without q/k norms, one rotary, windows on every
    /// other layer, and tanh soft-capping of the attention scores and the final logits.
    Gemma2,
}

/// One family's names and defaults.
#[derive(Clone, Copy, Debug)]
pub struct Family {
    pub arch: Arch,
    /// The HF `architectures` entry, e.g. `LlamaForCausalLM`.
    pub hf_name: &'static str,
    /// The HF `model_type`, e.g. `llama`.
    pub model_type: &'static str,
    /// llama.cpp's `general.architecture` a GGUF file of it carries (`None`: llama.cpp
    /// writes it as another family's, as Mistral and Mixtral are written as `llama`).
    pub gguf: Option<&'static str>,
    /// What llama.cpp's converter writes for it (`gguf`, or the family it is written as).
    pub gguf_written: &'static str,
    /// The dense family whose attention and norms it shares (itself for the dense ones).
    pub base: Arch,
    /// HF's default `max_position_embeddings`.
    pub default_max_positions: usize,
}

/// Every family encore runs.
pub const FAMILIES: [Family; 11] = [
    family(
        Arch::Llama,
        "LlamaForCausalLM",
        "llama",
        Some("llama"),
        "llama",
        Arch::Llama,
        2048,
    ),
    family(
        Arch::Mistral,
        "MistralForCausalLM",
        "mistral",
        None,
        "llama",
        Arch::Mistral,
        131_072,
    ),
    family(
        Arch::Qwen2,
        "Qwen2ForCausalLM",
        "qwen2",
        Some("qwen2"),
        "qwen2",
        Arch::Qwen2,
        32768,
    ),
    family(
        Arch::Qwen3,
        "Qwen3ForCausalLM",
        "qwen3",
        Some("qwen3"),
        "qwen3",
        Arch::Qwen3,
        32768,
    ),
    family(
        Arch::Qwen2Moe,
        "Qwen2MoeForCausalLM",
        "qwen2_moe",
        Some("qwen2moe"),
        "qwen2moe",
        Arch::Qwen2,
        32768,
    ),
    family(
        Arch::Qwen3Moe,
        "Qwen3MoeForCausalLM",
        "qwen3_moe",
        Some("qwen3moe"),
        "qwen3moe",
        Arch::Qwen3,
        32768,
    ),
    family(
        Arch::Mixtral,
        "MixtralForCausalLM",
        "mixtral",
        None,
        "llama",
        Arch::Mistral,
        131_072,
    ),
    family(
        Arch::SmolLM3,
        "SmolLM3ForCausalLM",
        "smollm3",
        Some("smollm3"),
        "smollm3",
        Arch::SmolLM3,
        32768,
    ),
    family(
        Arch::Phi3,
        "Phi3ForCausalLM",
        "phi3",
        Some("phi3"),
        "phi3",
        Arch::Phi3,
        4096,
    ),
    // llama.cpp's gemma3 files hold the norms as 1 + w and name the post norms apart.
    family(
        Arch::Gemma3,
        "Gemma3ForCausalLM",
        "gemma3_text",
        Some("gemma3"),
        "gemma3",
        Arch::Gemma3,
        131_072,
    ),
    family(
        Arch::Gemma2,
        "Gemma2ForCausalLM",
        "gemma2",
        Some("gemma2"),
        "gemma2",
        Arch::Gemma2,
        8192,
    ),
];

const fn family(
    arch: Arch,
    hf_name: &'static str,
    model_type: &'static str,
    gguf: Option<&'static str>,
    gguf_written: &'static str,
    base: Arch,
    default_max_positions: usize,
) -> Family {
    Family {
        arch,
        hf_name,
        model_type,
        gguf,
        gguf_written,
        base,
        default_max_positions,
    }
}

impl Arch {
    /// Its row of [`FAMILIES`].
    pub fn family(self) -> &'static Family {
        FAMILIES
            .iter()
            .find(|f| f.arch == self)
            .expect("every Arch has a FAMILIES row")
    }

    /// The family of an HF `architectures` entry.
    pub fn from_hf_name(name: &str) -> Option<Arch> {
        FAMILIES.iter().find(|f| f.hf_name == name).map(|f| f.arch)
    }

    /// The family of an HF `model_type`.
    pub fn from_model_type(model_type: &str) -> Option<Arch> {
        FAMILIES
            .iter()
            .find(|f| f.model_type == model_type)
            .map(|f| f.arch)
    }

    /// The family of a GGUF file's `general.architecture` (llama.cpp's Mixtral is `llama`
    /// with experts: the caller tells them apart).
    pub fn from_gguf(name: &str) -> Option<Arch> {
        FAMILIES
            .iter()
            .find(|f| f.gguf == Some(name))
            .map(|f| f.arch)
    }

    /// The dense architecture whose attention and norms this one shares (itself for the
    /// dense ones).
    pub fn base(self) -> Arch {
        self.family().base
    }

    /// The HF `architectures` entry, e.g. `LlamaForCausalLM`.
    pub fn hf_name(self) -> &'static str {
        self.family().hf_name
    }

    /// The HF `model_type`, e.g. `llama`.
    pub fn model_type(self) -> &'static str {
        self.family().model_type
    }

    /// HF's default `max_position_embeddings` for the architecture.
    pub fn default_max_positions(self) -> usize {
        self.family().default_max_positions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_found_by_each_of_its_names() {
        for f in FAMILIES {
            assert_eq!(f.arch.family().hf_name, f.hf_name);
            assert_eq!(Arch::from_hf_name(f.hf_name), Some(f.arch));
            assert_eq!(Arch::from_model_type(f.model_type), Some(f.arch));
            if let Some(g) = f.gguf {
                assert_eq!(Arch::from_gguf(g), Some(f.arch));
            }
            // What llama.cpp writes for it is a family of ours (Mistral's and Mixtral's
            // `llama`), unless its GGUF files are not read yet (Gemma 3).
            if f.gguf.is_some() || f.gguf_written == "llama" {
                assert!(Arch::from_gguf(f.gguf_written).is_some(), "{}", f.hf_name);
            }
        }
        assert_eq!(Arch::from_hf_name("GPT2LMHeadModel"), None);
        assert_eq!(Arch::from_gguf("mistral"), None);
    }
}
