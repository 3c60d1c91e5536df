//! [`Role`]: what each declared device tensor is for, with its name and its HF and
//! llama.cpp sources.

use super::Source;

/// What a device tensor is for in the forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The token embedding table `[vocab, hidden]`.
    Embedding,
    /// The RMSNorm before attention (HF `input_layernorm`).
    AttnNorm,
    /// The merged q/k/v projection: q rows, then k, then v.
    Qkv,
    /// The merged q/k/v bias (Qwen2; Llama and Qwen3 with `attention_bias`).
    QkvBias,
    /// The per-head RMSNorm on q (Qwen3).
    QNorm,
    /// The per-head RMSNorm on k (Qwen3).
    KNorm,
    /// The attention output projection.
    OProj,
    /// The RMSNorm before the MLP (HF `post_attention_layernorm`).
    MlpNorm,
    /// The merged gate/up projection: gate rows, then up rows.
    GateUp,
    /// The MLP down projection.
    Down,
    /// The RMSNorm after the last layer.
    FinalNorm,
    /// The output projection of untied embeddings.
    LmHead,
    /// A sparse layer's router `[num_experts, hidden]` (HF `mlp.gate`).
    Router,
    /// Every expert's gate rows, then every expert's up rows: `[2 * E * I, hidden]` (the
    /// GGUF `ffn_gate_exps` and `ffn_up_exps` stacks one after the other).
    ExpertsGateUp,
    /// Every expert's down projection, stacked: `[E * hidden, I]`.
    ExpertsDown,
    /// Qwen2-MoE's shared expert: gate rows, then up rows.
    SharedGateUp,
    SharedDown,
    /// The shared expert's gate `[1, hidden]` (its output scaled by the sigmoid of it).
    SharedGate,
    /// An EAGLE-3 head's projection of the target's three hidden states
    /// `[hidden, 3 * target_hidden]` (HF `fc`).
    EagleFc,
    /// An EAGLE-3 head's RMSNorm of its input hidden state (HF `hidden_norm`).
    HiddenNorm,
    /// The RMSNorm of the attention's output before the residual add (Gemma's
    /// `post_attention_layernorm`; `ModelConfig::post_norms`).
    AttnOutNorm,
    /// The RMSNorm of the MLP's output before the residual add (Gemma's
    /// `post_feedforward_layernorm`).
    MlpOutNorm,
    /// The biases of the LayerNorms before attention, before the MLP and after the last
    /// layer (`ModelConfig::norm_kind`: StableLM's).
    AttnNormBias,
    MlpNormBias,
    FinalNormBias,
    /// The attention output projection's bias (gpt-oss's `attention_bias`).
    OProjBias,
    /// One attention sink logit per head `[heads]` (gpt-oss's `self_attn.sinks`).
    Sinks,
    /// The router's bias `[num_experts]` (gpt-oss's `mlp.router.bias`).
    RouterBias,
    /// The experts' gate/up biases laid out as [`Role::ExpertsGateUp`]'s rows: every
    /// expert's gate biases, then every expert's up biases `[2 * E * I]`.
    ExpertsGateUpBias,
    /// The experts' down biases `[E * hidden]`.
    ExpertsDownBias,
    /// A GPTQ act-order layer's column permutations (`IntPacking::act_order`), i32, one a
    /// projection's input: its weight's columns are the input's columns in this order
    /// (the stable sort of its g_idx), and the forward gathers the input by it before the
    /// matmul. q/k/v share one (their g_idx must agree), as do gate/up; o's and down's are
    /// of this rank's columns (values within its share). Made at load from the g_idx.
    QkvPerm,
    OProjPerm,
    GateUpPerm,
    DownPerm,
}

impl Role {
    pub const ALL: [Role; 34] = [
        Role::Embedding,
        Role::AttnNorm,
        Role::Qkv,
        Role::QkvBias,
        Role::QNorm,
        Role::KNorm,
        Role::OProj,
        Role::MlpNorm,
        Role::GateUp,
        Role::Down,
        Role::FinalNorm,
        Role::LmHead,
        Role::Router,
        Role::ExpertsGateUp,
        Role::ExpertsDown,
        Role::SharedGateUp,
        Role::SharedDown,
        Role::SharedGate,
        Role::EagleFc,
        Role::HiddenNorm,
        Role::AttnOutNorm,
        Role::MlpOutNorm,
        Role::AttnNormBias,
        Role::MlpNormBias,
        Role::FinalNormBias,
        Role::OProjBias,
        Role::Sinks,
        Role::RouterBias,
        Role::ExpertsGateUpBias,
        Role::ExpertsDownBias,
        Role::QkvPerm,
        Role::OProjPerm,
        Role::GateUpPerm,
        Role::DownPerm,
    ];

    /// The device tensor's name, without the layer prefix for per-layer roles (the name
    /// offload reports and errors use).
    pub fn module(self) -> &'static str {
        match self {
            Role::Embedding => "model.embed_tokens",
            Role::AttnNorm => "input_layernorm",
            Role::Qkv => "self_attn.qkv_proj",
            Role::QkvBias => "self_attn.qkv_bias",
            Role::QNorm => "self_attn.q_norm",
            Role::KNorm => "self_attn.k_norm",
            Role::OProj => "self_attn.o_proj",
            Role::MlpNorm => "post_attention_layernorm",
            Role::GateUp => "mlp.gate_up_proj",
            Role::Down => "mlp.down_proj",
            Role::FinalNorm => "model.norm",
            Role::LmHead => "lm_head",
            Role::Router => "mlp.gate",
            Role::ExpertsGateUp => "mlp.experts.gate_up_proj",
            Role::ExpertsDown => "mlp.experts.down_proj",
            Role::SharedGateUp => "mlp.shared_expert.gate_up_proj",
            Role::SharedDown => "mlp.shared_expert.down_proj",
            Role::SharedGate => "mlp.shared_expert_gate",
            Role::EagleFc => "fc",
            Role::HiddenNorm => "hidden_norm",
            Role::AttnOutNorm => "attn_out_norm",
            Role::MlpOutNorm => "mlp_out_norm",
            Role::AttnNormBias => "input_layernorm.bias",
            Role::MlpNormBias => "post_attention_layernorm.bias",
            Role::FinalNormBias => "model.norm.bias",
            Role::OProjBias => "self_attn.o_proj.bias",
            Role::Sinks => "self_attn.sinks",
            Role::RouterBias => "mlp.gate.bias",
            Role::ExpertsGateUpBias => "mlp.experts.gate_up_proj_bias",
            Role::ExpertsDownBias => "mlp.experts.down_proj_bias",
            Role::QkvPerm => "self_attn.qkv_proj.perm",
            Role::OProjPerm => "self_attn.o_proj.perm",
            Role::GateUpPerm => "mlp.gate_up_proj.perm",
            Role::DownPerm => "mlp.down_proj.perm",
        }
    }

    /// Whether the role is a matrix the forward multiplies by (and so may be quantized).
    pub fn is_projection(self) -> bool {
        matches!(
            self,
            Role::Qkv
                | Role::OProj
                | Role::GateUp
                | Role::Down
                | Role::LmHead
                | Role::ExpertsGateUp
                | Role::ExpertsDown
                | Role::SharedGateUp
                | Role::SharedDown
                | Role::EagleFc
        )
    }

    /// The projection whose input a permutation role orders (`None` for other roles).
    pub fn permutes(self) -> Option<Role> {
        match self {
            Role::QkvPerm => Some(Role::Qkv),
            Role::OProjPerm => Some(Role::OProj),
            Role::GateUpPerm => Some(Role::GateUp),
            Role::DownPerm => Some(Role::Down),
            _ => None,
        }
    }

    /// Whether the role is a norm weight (not a LayerNorm's bias).
    pub fn is_norm(self) -> bool {
        matches!(
            self,
            Role::AttnNorm
                | Role::QNorm
                | Role::KNorm
                | Role::MlpNorm
                | Role::FinalNorm
                | Role::HiddenNorm
                | Role::AttnOutNorm
                | Role::MlpOutNorm
        )
    }

    /// Whether the role has one tensor per decoder layer.
    pub fn per_layer(self) -> bool {
        !matches!(
            self,
            Role::Embedding | Role::FinalNorm | Role::FinalNormBias | Role::LmHead | Role::EagleFc
        )
    }

    /// The HF tensors stacked along the first dimension into this one, in row order
    /// (none for the mixture-of-experts roles, whose names depend on the architecture and
    /// the expert: [`Decl::new`] names them).
    pub fn sources(self) -> &'static [Source] {
        match self {
            Role::Embedding => &[src!("model.embed_tokens.weight", "token_embd.weight")],
            Role::AttnNorm => &[src!("input_layernorm.weight", "attn_norm.weight")],
            Role::Qkv => &[
                src!("self_attn.q_proj.weight", "attn_q.weight"),
                src!("self_attn.k_proj.weight", "attn_k.weight"),
                src!("self_attn.v_proj.weight", "attn_v.weight"),
            ],
            Role::QkvBias => &[
                src!("self_attn.q_proj.bias", "attn_q.bias"),
                src!("self_attn.k_proj.bias", "attn_k.bias"),
                src!("self_attn.v_proj.bias", "attn_v.bias"),
            ],
            Role::QNorm => &[src!("self_attn.q_norm.weight", "attn_q_norm.weight")],
            Role::KNorm => &[src!("self_attn.k_norm.weight", "attn_k_norm.weight")],
            Role::OProj => &[src!("self_attn.o_proj.weight", "attn_output.weight")],
            Role::MlpNorm => &[src!("post_attention_layernorm.weight", "ffn_norm.weight")],
            Role::GateUp => &[
                src!("mlp.gate_proj.weight", "ffn_gate.weight"),
                src!("mlp.up_proj.weight", "ffn_up.weight"),
            ],
            Role::Down => &[src!("mlp.down_proj.weight", "ffn_down.weight")],
            Role::FinalNorm => &[src!("model.norm.weight", "output_norm.weight")],
            Role::LmHead => &[src!("lm_head.weight", "output.weight")],
            Role::EagleFc => &[src!("fc.weight", "eagle.fc.weight")],
            Role::HiddenNorm => &[src!("hidden_norm.weight", "eagle.hidden_norm.weight")],
            Role::AttnNormBias => &[src!("input_layernorm.bias", "attn_norm.bias")],
            Role::MlpNormBias => &[src!("post_attention_layernorm.bias", "ffn_norm.bias")],
            Role::FinalNormBias => &[src!("model.norm.bias", "output_norm.bias")],
            Role::OProjBias => &[src!("self_attn.o_proj.bias", "attn_output.bias")],
            Role::Sinks => &[src!("self_attn.sinks", "attn_sinks.weight")],
            Role::Router
            | Role::ExpertsGateUp
            | Role::ExpertsDown
            | Role::SharedGateUp
            | Role::SharedDown
            | Role::SharedGate
            | Role::AttnOutNorm
            | Role::MlpOutNorm
            | Role::RouterBias
            | Role::ExpertsGateUpBias
            | Role::ExpertsDownBias
            | Role::QkvPerm
            | Role::OProjPerm
            | Role::GateUpPerm
            | Role::DownPerm => &[],
        }
    }
}
