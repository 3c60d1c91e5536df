"""The random-weight models scripts/hf_reference.py builds: per model its name, its
transformers config and model classes, and the config's fields (beside
hf_reference.py's COMMON). Odd sizes on purpose (vocabularies not a multiple of 64,
head_dim != hidden / heads, MQA and GQA, intermediates not a power of two).
"""

from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GptOssConfig,
    GptOssForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    SmolLM3Config,
    SmolLM3ForCausalLM,
    StableLmConfig,
    StableLmForCausalLM,
)

# LongRoPE on phi3's shape (Phi-3.5 / Phi-4-mini): 15 factors each for 30 rotary dims.
PHI3_LONGROPE = dict(
    vocab_size=1031,
    hidden_size=160,
    intermediate_size=344,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    partial_rotary_factor=0.75,
    max_position_embeddings=16384,
    original_max_position_embeddings=4096,
    pad_token_id=None,
    tie_word_embeddings=False,
    rope_parameters={
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.75,
        "original_max_position_embeddings": 4096,
        "short_factor": [1.0 + 0.07 * i for i in range(15)],
        "long_factor": [1.0 + 1.3 * i for i in range(15)],
    },
)

# Every model: rms_norm_eps 1e-6, float32 on disk, max_position_embeddings 256 (encore's
# test runs 128 positions). rope_parameters is the transformers 5 form of rope_theta +
# rope_scaling; it is written to config.json as is.
MODELS = [
    (
        "llama",
        LlamaConfig,
        LlamaForCausalLM,
        dict(
            vocab_size=1031,
            hidden_size=160,
            intermediate_size=416,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,  # GQA 2
            head_dim=48,  # != 160 / 4
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    (
        "llama3",
        LlamaConfig,
        LlamaForCausalLM,
        dict(
            vocab_size=1000,
            hidden_size=128,
            intermediate_size=344,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,  # MQA
            head_dim=64,  # != 128 / 4
            tie_word_embeddings=True,
            # original_max_position_embeddings 64: wavelengths below 16 unscaled, above 64
            # divided by 8, in between interpolated; head_dim 64 has all three.
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
    ),
    (
        "mistral",
        MistralConfig,
        MistralForCausalLM,
        dict(
            vocab_size=1031,
            hidden_size=192,
            intermediate_size=480,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,  # GQA 3
            head_dim=40,  # != 192 / 6
            sliding_window=None,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    (
        "qwen2",
        Qwen2Config,
        Qwen2ForCausalLM,
        dict(
            vocab_size=1000,
            hidden_size=160,
            intermediate_size=432,
            num_hidden_layers=3,
            num_attention_heads=5,  # head_dim 32 = hidden / heads (Qwen2 has no head_dim)
            num_key_value_heads=1,  # MQA
            tie_word_embeddings=True,
            use_sliding_window=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        ),
    ),
    (
        "qwen3",
        Qwen3Config,
        Qwen3ForCausalLM,
        dict(
            vocab_size=1031,
            hidden_size=160,
            intermediate_size=400,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,  # GQA 2
            head_dim=48,  # != 160 / 4
            tie_word_embeddings=False,
            use_sliding_window=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    # Sliding windows (appended, so the models above keep their seeds): every prompt and
    # its 32 new tokens run far past the window.
    (
        "mistral_window",
        MistralConfig,
        MistralForCausalLM,
        dict(
            vocab_size=1031,
            hidden_size=192,
            intermediate_size=480,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,  # GQA 3
            head_dim=40,
            sliding_window=7,  # every layer
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    (
        "qwen2_window",
        Qwen2Config,
        Qwen2ForCausalLM,
        dict(
            vocab_size=1000,
            hidden_size=160,
            intermediate_size=432,
            num_hidden_layers=3,
            num_attention_heads=5,
            num_key_value_heads=1,  # MQA
            tie_word_embeddings=True,
            use_sliding_window=True,
            sliding_window=6,
            max_window_layers=1,  # layer 0 full, layers 1 and 2 windowed
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        ),
    ),
    # Mixtures of experts (saved by save_pretrained with transformers' per-expert names).
    (
        "qwen3_moe",
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
        dict(
            vocab_size=1031,
            hidden_size=160,
            intermediate_size=400,  # the dense layer 0
            moe_intermediate_size=96,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[0],
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=48,
            tie_word_embeddings=False,
            use_sliding_window=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    (
        "mixtral",
        MixtralConfig,
        MixtralForCausalLM,
        dict(
            vocab_size=1000,
            hidden_size=128,
            intermediate_size=160,
            num_local_experts=4,
            num_experts_per_tok=2,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            sliding_window=None,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    (
        "qwen2_moe",
        Qwen2MoeConfig,
        Qwen2MoeForCausalLM,
        dict(
            vocab_size=1000,
            hidden_size=128,
            intermediate_size=320,
            moe_intermediate_size=64,
            shared_expert_intermediate_size=160,
            num_experts=6,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=False,
            use_sliding_window=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        ),
    ),
    # SmolLM3: Llama's layer without rotary in the layers `no_rope_layers` marks 0 (layer 1
    # here, and every fourth by default), appended so the models above keep their seeds.
    (
        "smollm3",
        SmolLM3Config,
        SmolLM3ForCausalLM,
        dict(
            vocab_size=1031,
            hidden_size=160,
            intermediate_size=416,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,  # GQA 2
            head_dim=40,
            tie_word_embeddings=True,
            no_rope_layers=[1, 0, 1],
            pad_token_id=None,  # its default, 128004, is outside this vocabulary
            use_sliding_window=False,
            rope_parameters={"rope_type": "default", "rope_theta": 2000000.0},
        ),
    ),
    # Rope scaling: linear (every frequency over 4) and YaRN (a ramp between the original
    # 64 positions' rotations, cos and sin times the attention factor), short contexts so
    # that every prompt crosses the original length.
    (
        "llama_linear",
        LlamaConfig,
        LlamaForCausalLM,
        dict(
            vocab_size=1031,
            hidden_size=128,
            intermediate_size=344,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        ),
    ),
    (
        "qwen2_yarn",
        Qwen2Config,
        Qwen2ForCausalLM,
        dict(
            vocab_size=1031,
            hidden_size=128,
            intermediate_size=344,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=False,
            use_sliding_window=False,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
    ),
    # Phi-3: fused qkv_proj and gate_up_proj, 3/4 of each head rotating (Phi-4-mini's
    # partial_rotary_factor) and a window of 12 over every layer (Phi-3-mini's, short).
    (
        "phi3",
        Phi3Config,
        Phi3ForCausalLM,
        dict(
            vocab_size=1031,
            hidden_size=160,
            intermediate_size=344,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,  # GQA 2
            partial_rotary_factor=0.75,  # 30 of 40 dims rotate
            sliding_window=12,
            pad_token_id=None,  # its default, 32000, is outside this vocabulary
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    # LongRoPE (Phi-3.5 / Phi-4-mini) on phi3's shape: the short factors within the
    # original context (4096, a factor of 4 giving the attention factor), and the long ones
    # with an original context of 4 that every prompt passes (transformers then rotates the
    # whole sequence with them, as encore does for a sequence past it).
    (
        "phi3_longrope",
        Phi3Config,
        Phi3ForCausalLM,
        PHI3_LONGROPE,
    ),
    (
        "phi3_longrope_long",
        Phi3Config,
        Phi3ForCausalLM,
        dict(
            PHI3_LONGROPE,
            max_position_embeddings=64,
            original_max_position_embeddings=4,
            rope_parameters=dict(
                PHI3_LONGROPE["rope_parameters"], original_max_position_embeddings=4
            ),
        ),
    ),
    # Gemma 3's text model: GELU-tanh, (1 + w) norms before and after attention and the
    # MLP, q/k head norms, the embedding times sqrt(hidden), query_pre_attn_scalar 24 (not
    # the head dim 32), windows of 6 on layers 0-2 with the local base, layer 3 full with
    # the global base and linear scaling.
    (
        "gemma3",
        Gemma3TextConfig,
        Gemma3ForCausalLM,
        dict(
            vocab_size=1031,
            hidden_size=128,
            intermediate_size=344,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=24,
            sliding_window=6,
            layer_types=["sliding_attention"] * 3 + ["full_attention"],
            pad_token_id=None,
            tie_word_embeddings=True,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        ),
    ),
    # Gemma 2: Gemma 3's layer without q/k norms, one rotary, windows of 6 on layers 0 and
    # 2 (its default alternation), query_pre_attn_scalar 24, and soft-capping at caps low
    # enough to bend these weights' attention scores (5) and logits (10).
    (
        "gemma2",
        Gemma2Config,
        Gemma2ForCausalLM,
        dict(
            vocab_size=1031,
            hidden_size=128,
            intermediate_size=344,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=24,
            sliding_window=6,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=10.0,
            pad_token_id=None,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    # transformers 5's `layer_types`: a window of 6 on layers 0 and 2, layer 1 full (an
    # alternation `max_window_layers` cannot give; gpt-oss's pattern).
    (
        "qwen2_layer_types",
        Qwen2Config,
        Qwen2ForCausalLM,
        dict(
            vocab_size=1031,
            hidden_size=128,
            intermediate_size=344,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=False,
            use_sliding_window=True,
            sliding_window=6,
            max_window_layers=28,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    # OLMo 2: norms after attention and the MLP only (each block reads the residual
    # stream), q and k normed across all their heads; 3 heads over 1 KV head (GQA 3),
    # widths that are not powers of two, its default epsilon 1e-5.
    (
        "olmo2",
        Olmo2Config,
        Olmo2ForCausalLM,
        dict(
            vocab_size=1031,
            hidden_size=120,
            intermediate_size=344,
            num_hidden_layers=3,
            num_attention_heads=3,
            num_key_value_heads=1,
            rms_norm_eps=1e-5,
            pad_token_id=None,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        ),
    ),
    # StableLM 2: LayerNorms with a bias before attention, before the MLP and after the
    # last layer (random weights and biases), a quarter of each head rotating, q/k/v
    # biases; 3 heads of 40 over 1 KV head (GQA 3), widths that are not powers of two.
    # COMMON's rms_norm_eps is not StableLM's key (its layer_norm_eps is).
    (
        "stablelm",
        StableLmConfig,
        StableLmForCausalLM,
        dict(
            vocab_size=1031,
            hidden_size=120,
            intermediate_size=344,
            num_hidden_layers=3,
            num_attention_heads=3,
            num_key_value_heads=1,
            layer_norm_eps=1e-5,
            partial_rotary_factor=0.25,  # 10 of 40 dims rotate
            use_qkv_bias=True,
            pad_token_id=None,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    # gpt-oss: attention sinks per head, q/k/v and o biases, windowed layers (6 positions,
    # which the prompts and their 32 tokens cross) alternating with full ones, YaRN rotary
    # (factor 4 over 64 positions, not truncated), and in every layer 5 experts, top 3,
    # with a biased router and biased experts running the clamped SwiGLU (their gate/up
    # gain makes the clamp at 7 bite); 3 heads of 40 over 1 KV head (GQA 3), widths that
    # are not powers of two. Its experts are transformers' fused 3-D tensors.
    (
        "gpt_oss",
        GptOssConfig,
        GptOssForCausalLM,
        dict(
            vocab_size=1031,
            hidden_size=120,
            intermediate_size=72,
            num_hidden_layers=3,
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=40,
            num_local_experts=5,
            num_experts_per_tok=3,
            sliding_window=6,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            attention_bias=True,
            rms_norm_eps=1e-5,
            pad_token_id=None,
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "original_max_position_embeddings": 64,
                "truncate": False,
            },
        ),
    ),
]
