//! The llama.cpp names of the declared HF tensors (GGUF files name a layer's tensors
//! `blk.N.*` and stack the experts).

use super::{Role, FUSED_GATE_UP, FUSED_QKV, PRE_FFN_NORM};

/// The llama.cpp name of an HF tensor name declared by some [`Role`] (`None` for names
/// with no GGUF counterpart); one expert's matrix names the stacked tensor of every
/// expert that holds it (see [`gguf_source`]).
pub fn gguf_name(hf: &str) -> Option<String> {
    gguf_source(hf).map(|(name, _)| name)
}

/// [`gguf_name`] for a model with post norms (Gemma): HF's `post_attention_layernorm` is
/// then the attention's output norm, llama.cpp's `post_attention_norm`, and the MLP's is
/// `post_ffw_norm` (a Llama's `post_attention_layernorm` is its MLP input norm,
/// `ffn_norm`).
pub fn gguf_source_of(hf: &str, post_norms: bool) -> Option<(String, Option<usize>)> {
    if post_norms {
        if let Some((layer, rest)) = hf
            .strip_prefix("model.layers.")
            .and_then(|r| r.split_once('.'))
        {
            let g = match rest {
                "post_attention_layernorm.weight" => Some("post_attention_norm.weight"),
                "post_feedforward_layernorm.weight" => Some("post_ffw_norm.weight"),
                _ => None,
            };
            if let Some(g) = g {
                return Some((format!("blk.{layer}.{g}"), None));
            }
        }
    }
    gguf_source(hf)
}

/// The GGUF tensor holding an HF tensor and, for one expert's matrix, the expert's index
/// in it: llama.cpp stacks a layer's experts as `blk.N.ffn_{gate,up,down}_exps` of shape
/// `[experts, rows, k]` (Mixtral's `w1`, `w3`, `w2` too; gpt-oss's biases as
/// `ffn_*_exps.bias` `[experts, rows]`); the router is `ffn_gate_inp` (with gpt-oss's bias),
/// Qwen2-MoE's shared expert `ffn_{gate,up,down}_shexp` and its gate `ffn_gate_inp_shexp`.
pub fn gguf_source(hf: &str) -> Option<(String, Option<usize>)> {
    let Some(rest) = hf.strip_prefix("model.layers.") else {
        let found = Role::ALL.iter().filter(|r| !r.per_layer());
        let s = found.flat_map(|r| r.sources()).find(|s| s.hf == hf)?;
        return Some((s.gguf.to_string(), None));
    };
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let blk = |g: &str| format!("blk.{layer}.{g}");
    let expert = ["mlp.experts.", "block_sparse_moe.experts."]
        .iter()
        .find_map(|p| rest.strip_prefix(p));
    if let Some(e) = expert {
        let (x, w) = e.split_once('.')?;
        let x: usize = x.parse().ok()?;
        let stacked = match w {
            "gate_proj.weight" | "w1.weight" => "ffn_gate_exps.weight",
            "up_proj.weight" | "w3.weight" => "ffn_up_exps.weight",
            "down_proj.weight" | "w2.weight" => "ffn_down_exps.weight",
            // gpt-oss's expert biases, stacked `[experts, rows]`.
            "gate_proj.bias" => "ffn_gate_exps.bias",
            "up_proj.bias" => "ffn_up_exps.bias",
            "down_proj.bias" => "ffn_down_exps.bias",
            _ => return None,
        };
        return Some((blk(stacked), Some(x)));
    }
    let moe = match rest {
        "mlp.gate.weight" | "block_sparse_moe.gate.weight" | "mlp.router.weight" => {
            Some("ffn_gate_inp.weight")
        }
        "mlp.router.bias" => Some("ffn_gate_inp.bias"),
        "mlp.shared_expert.gate_proj.weight" => Some("ffn_gate_shexp.weight"),
        "mlp.shared_expert.up_proj.weight" => Some("ffn_up_shexp.weight"),
        "mlp.shared_expert.down_proj.weight" => Some("ffn_down_shexp.weight"),
        "mlp.shared_expert_gate.weight" => Some("ffn_gate_inp_shexp.weight"),
        _ => None,
    };
    if let Some(g) = moe {
        return Some((blk(g), None));
    }
    let found = Role::ALL.iter().filter(|r| r.per_layer());
    let fused = [FUSED_QKV, FUSED_GATE_UP, PRE_FFN_NORM];
    let s = found
        .flat_map(|r| r.sources())
        .chain(&fused)
        .find(|s| s.hf == rest)?;
    Some((blk(s.gguf), None))
}
