"""Configs of model types no bundled preset has, for the memory model's tests."""

from __future__ import annotations

from typing import Any, Final

# mT5-base's config: T5 v1.1's gated-GELU blocks with mT5's 250k vocabulary.
MT5_BASE: Final[dict[str, Any]] = {
    "model_type": "mt5",
    "architectures": ["MT5ForConditionalGeneration"],
    "d_model": 768,
    "d_kv": 64,
    "d_ff": 2048,
    "num_heads": 12,
    "num_layers": 12,
    "num_decoder_layers": 12,
    "vocab_size": 250112,
    "feed_forward_proj": "gated-gelu",
    "relative_attention_num_buckets": 32,
    "dropout_rate": 0.1,
    "tie_word_embeddings": False,
    "decoder_start_token_id": 0,
}

# Overrides of Llama 3.2 1B's preset config.  Granite: its four scalar multipliers,
# granite-3 configs' values.
GRANITE: Final = (
    ("model_type", "granite"),
    ("architectures", ["GraniteForCausalLM"]),
    ("embedding_multiplier", 12.0),
    ("residual_multiplier", 0.22),
    ("attention_multiplier", 0.0078125),
    ("logits_scaling", 8.0),
)

# SmolLM3 on Llama 3.2 1B's sizes: RoPE on three layers of four (its default NoPE
# interval), no Llama 3 rope scaling.
SMOLLM3: Final = (
    ("model_type", "smollm3"),
    ("architectures", ["SmolLM3ForCausalLM"]),
    ("no_rope_layer_interval", 4),
    ("rope_scaling", None),
)

# OLMo-3 on Llama 3.2 1B's sizes: OLMo-2's layer, three sliding layers of four (its
# default layout) with a window short enough for sdpa to need a mask at seq 1024.
OLMO3: Final = (
    ("model_type", "olmo3"),
    ("architectures", ["Olmo3ForCausalLM"]),
    ("sliding_window", 512),
    ("layer_types", (["sliding_attention"] * 3 + ["full_attention"]) * 4),
    ("rope_scaling", None),
)

# A Mistral 3 vision-language config at Mistral Small 3.1's sizes (Pixtral tower, Mistral
# text model), with four text layers: its parameter layout and activations are exact
# at any depth.
MISTRAL3: Final[dict[str, Any]] = {
    "model_type": "mistral3",
    "architectures": ["Mistral3ForConditionalGeneration"],
    "image_token_index": 10,
    "multimodal_projector_bias": False,
    "projector_hidden_act": "gelu",
    "spatial_merge_size": 2,
    "tie_word_embeddings": False,
    "vision_feature_layer": -1,
    "text_config": {
        "model_type": "mistral",
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "intermediate_size": 32768,
        "max_position_embeddings": 131072,
        "num_attention_heads": 32,
        "num_hidden_layers": 4,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000000.0,
        "sliding_window": None,
        "vocab_size": 131072,
    },
    "vision_config": {
        "model_type": "pixtral",
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 1024,
        "image_size": 1540,
        "intermediate_size": 4096,
        "num_attention_heads": 16,
        "num_hidden_layers": 24,
        "patch_size": 14,
        "rope_theta": 10000.0,
    },
}

# Ministral 3's text model on Llama 3.2 1B's sizes: its YaRN parameters with Llama 4's
# attention scaling (q times a per-position scale).
MINISTRAL3: Final = (
    ("model_type", "ministral3"),
    ("architectures", ["Ministral3ForCausalLM"]),
    ("rope_scaling", None),
    (
        "rope_parameters",
        {
            "type": "yarn",
            "rope_theta": 1000000.0,
            "factor": 16.0,
            "original_max_position_embeddings": 8192,
            "max_position_embeddings": 131072,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale_all_dim": 1.0,
            "mscale": 1.0,
            "llama_4_scaling_beta": 0.1,
        },
    ),
)

# Ministral (8B, 2024) on Llama 3.2 1B's sizes: Qwen2's layer without biases, every layer
# sliding, a window short enough for sdpa to need a mask at seq 1024; it makes the full
# mask too, which no layer reads.
MINISTRAL: Final = (
    ("model_type", "ministral"),
    ("architectures", ["MinistralForCausalLM"]),
    ("sliding_window", 512),
    ("rope_scaling", None),
)

# EXAONE 4 on Llama 3.2 1B's sizes: post-norms, q / k norms per head, three sliding
# layers of four (its default pattern) with a window short enough for sdpa to need a
# mask at seq 1024, and no RoPE on the global layers.
EXAONE4: Final = (
    ("model_type", "exaone4"),
    ("architectures", ["Exaone4ForCausalLM"]),
    ("sliding_window", 512),
    ("sliding_window_pattern", 4),
    ("rope_scaling", None),
)

# GLM-4 on Llama 3.2 1B's sizes: four sandwich norms, biased q / k / v, fused gate / up,
# RoPE on half of each head from interleaved copies of cos / sin in every layer.
GLM4: Final = (
    ("model_type", "glm4"),
    ("architectures", ["Glm4ForCausalLM"]),
    ("attention_bias", True),
    ("partial_rotary_factor", 0.5),
    ("rope_scaling", None),
    ("pad_token_id", 0),  # GLM-4's default is beyond Llama's vocabulary
)

# GLM (GLM-4-9B's first release) on Llama 3.2 1B's sizes: GLM-4's attention and MLP in
# Llama's layer (two norms).
GLM: Final = (
    ("model_type", "glm"),
    ("architectures", ["GlmForCausalLM"]),
    ("attention_bias", True),
    ("partial_rotary_factor", 0.5),
    ("rope_scaling", None),
    ("pad_token_id", 0),
)

# gpt-oss-20b's config with four layers: 32 experts, top 4, sliding and full layers in
# turn, attention sinks, biases everywhere (its activations and parameters are exact at
# any depth).
GPT_OSS: Final[dict[str, Any]] = {
    "model_type": "gpt_oss",
    "architectures": ["GptOssForCausalLM"],
    "hidden_size": 2880,
    "num_hidden_layers": 4,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "intermediate_size": 2880,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "vocab_size": 201088,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
    "tie_word_embeddings": False,
    "attention_bias": True,
    "swiglu_limit": 7.0,
    "rms_norm_eps": 1e-05,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 4096,
    },
    "max_position_embeddings": 131072,
    "pad_token_id": 199999,
    "eos_token_id": 200002,
}

# Hunyuan (dense, v1) on Llama 3.2 1B's sizes: q and k normalized per head after RoPE,
# biases on q / k / v / o.
HUNYUAN: Final = (
    ("model_type", "hunyuan_v1_dense"),
    ("architectures", ["HunYuanDenseV1ForCausalLM"]),
    ("attention_bias", True),
    ("rope_scaling", None),
)

# Seed-OSS on Llama 3.2 1B's sizes: biased q / k / v, and residual dropout on the
# attention's output (inside self_attn) and the MLP's, which keeps masks in training.
SEED_OSS: Final = (
    ("model_type", "seed_oss"),
    ("architectures", ["SeedOssForCausalLM"]),
    ("attention_bias", True),
    ("residual_dropout", 0.1),
    ("rope_scaling", None),
)

# StarCoder2 on Llama 3.2 1B's sizes: LayerNorms with biases, a GELU MLP (c_fc, c_proj),
# biases on every linear, dropout on the embeddings and on each branch's output.
STARCODER2: Final = (
    ("model_type", "starcoder2"),
    ("architectures", ["Starcoder2ForCausalLM"]),
    ("use_bias", True),
    ("hidden_act", "gelu_pytorch_tanh"),
    ("norm_epsilon", 1e-5),
    ("residual_dropout", 0.1),
    ("embedding_dropout", 0.1),
    ("rope_scaling", None),
)

# Command R on Llama 3.2 1B's sizes: one fp32 LayerNorm per block read by the attention
# and the MLP in parallel, biases on q / k / v / o, q / k norms with a weight per head.
COHERE: Final = (
    ("model_type", "cohere"),
    ("architectures", ["CohereForCausalLM"]),
    ("attention_bias", True),
    ("use_qk_norm", True),
    ("logit_scale", 0.0625),
    ("rope_scaling", None),
)

COHERE_NO_QK: Final = tuple(item for item in COHERE if item[0] != "use_qk_norm")

# Command R7B on Llama 3.2 1B's sizes: Command R's block without q / k norms, three
# sliding layers in four, the global ones without RoPE.
COHERE2: Final = (
    ("model_type", "cohere2"),
    ("architectures", ["Cohere2ForCausalLM"]),
    ("sliding_window", 512),
    ("sliding_window_pattern", 4),
    ("layer_types", None),
    ("rope_scaling", None),
)

# StableLM 2 on Llama 3.2 1B's sizes: LayerNorms with biases, biased q / k / v, RoPE on
# the leading quarter of each head; and GPT-NeoX's parallel residual.
STABLELM: Final = (
    ("model_type", "stablelm"),
    ("architectures", ["StableLmForCausalLM"]),
    ("use_qkv_bias", True),
    ("partial_rotary_factor", 0.25),
    ("rope_scaling", None),
)
STABLELM_PARALLEL: Final = (*STABLELM, ("use_parallel_residual", True))

# Phi on Llama 3.2 1B's sizes: one LayerNorm per block read by the attention and a GELU MLP
# (fc1, fc2) in parallel, biases on every linear and the LM head, RoPE on the leading half
# of each head (Phi-1.5's; Phi-2 rotates 32 of 80), dropout on the embeddings and on each
# branch's output.
PHI: Final = (
    ("model_type", "phi"),
    ("architectures", ["PhiForCausalLM"]),
    ("hidden_act", "gelu_new"),
    ("partial_rotary_factor", 0.5),
    ("resid_pdrop", 0.1),
    ("embd_pdrop", 0.1),
    ("tie_word_embeddings", False),
    ("rope_scaling", None),
)

# GPT-NeoX (Pythia) on Llama 3.2 1B's sizes, its heads all kv heads: one fused biased
# query_key_value, RoPE on the leading quarter of each head, two LayerNorms, a GELU MLP
# (dense_h_to_4h, dense_4h_to_h), dropout on the embeddings and each branch; the parallel
# residual by default, and sequential.
GPT_NEOX: Final = (
    ("model_type", "gpt_neox"),
    ("architectures", ["GPTNeoXForCausalLM"]),
    ("num_key_value_heads", None),
    ("hidden_act", "gelu"),
    ("partial_rotary_factor", 0.25),
    ("hidden_dropout", 0.1),
    ("tie_word_embeddings", False),
    ("rope_scaling", None),
)
GPT_NEOX_SEQUENTIAL: Final = (*GPT_NEOX, ("use_parallel_residual", False))

# OPT on Llama 3.2 1B's sizes, its heads all kv heads: separate biased q / k / v (q scaled
# into a new tensor) and out_proj, two LayerNorms before the branches, a ReLU MLP (fc1,
# fc2), learned positions offset by two rows (a short table: Llama's would be 131072
# rows), dropout on each branch's output and none on the embeddings.
OPT: Final = (
    ("model_type", "opt"),
    ("architectures", ["OPTForCausalLM"]),
    ("num_key_value_heads", None),
    ("ffn_dim", 8192),
    ("activation_function", "relu"),
    ("max_position_embeddings", 2048),
    ("dropout", 0.1),
    ("attention_dropout", 0.0),
    ("word_embed_proj_dim", 2048),
    ("rope_scaling", None),
)

# Gemma (1) on Llama 3.2 1B's sizes, with Gemma's wide heads (heads x head_dim = twice the
# hidden size, as Gemma 7B's 16 x 256 against 3072): Llama's layer with Gemma's norms,
# GeGLU and scaled, tied embeddings.
GEMMA: Final = (
    ("model_type", "gemma"),
    ("architectures", ["GemmaForCausalLM"]),
    ("head_dim", 128),
    ("hidden_act", "gelu_pytorch_tanh"),
    ("tie_word_embeddings", True),
    ("rope_scaling", None),
)

# Qwen1.5-MoE-A2.7B's config with four layers: 60 routed experts (top 4, unnormalized
# weights) and a shared expert with its sigmoid gate in every layer, biased q / k / v.
QWEN2_MOE: Final[dict[str, Any]] = {
    "model_type": "qwen2_moe",
    "architectures": ["Qwen2MoeForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "norm_topk_prob": False,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "vocab_size": 151936,
    "max_position_embeddings": 8192,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "sliding_window": 32768,
    "max_window_layers": 21,
    "decoder_sparse_step": 1,
    "rms_norm_eps": 1e-06,
}

# The same with experts on every other layer (the others dense) and sliding layers.
QWEN2_MOE_SPARSE: Final[dict[str, Any]] = {
    **QWEN2_MOE,
    "decoder_sparse_step": 2,
    "use_sliding_window": True,
    "sliding_window": 512,
    "max_window_layers": 3,
}

# GLM-4.5-Air's config with four layers: the first dense, then 128 routed experts (top 8)
# chosen by an fp32 sigmoid router beside a shared expert; biased q / k / v, RoPE on half
# of each head.  The grouped variant: GLM-4.5's q / k norms, group-limited routing,
# unnormalized scaled weights, two dense layers.
GLM4_MOE: Final[dict[str, Any]] = {
    "model_type": "glm4_moe",
    "architectures": ["Glm4MoeForCausalLM"],
    "attention_bias": True,
    "first_k_dense_replace": 1,
    "head_dim": 128,
    "hidden_size": 4096,
    "intermediate_size": 10944,
    "max_position_embeddings": 131072,
    "moe_intermediate_size": 1408,
    "n_group": 1,
    "n_routed_experts": 128,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 96,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 4,
    "num_key_value_heads": 8,
    "partial_rotary_factor": 0.5,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000,
    "routed_scaling_factor": 1.0,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "use_qk_norm": False,
    "vocab_size": 151552,
    "pad_token_id": 151329,
    "eos_token_id": [151329, 151336, 151338],
}
GLM4_MOE_GROUPED: Final[dict[str, Any]] = {
    **GLM4_MOE,
    "use_qk_norm": True,
    "n_group": 8,
    "topk_group": 4,
    "norm_topk_prob": False,
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 2,
}

# Moonlight-16B-A3B's config (DeepSeek-V3's architecture) with four layers: multi-head
# latent attention with q projected directly, 64 routed experts beside two shared ones,
# the first layer dense.  DEEPSEEK_V3: DeepSeek-V3's sizes (q through its own latent,
# 256 experts chosen within groups) with four layers, the first three dense.
MOONLIGHT: Final[dict[str, Any]] = {
    "model_type": "deepseek_v3",
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 11264,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 64,
    "num_experts_per_tok": 6,
    "n_shared_experts": 2,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 2.446,
    "norm_topk_prob": True,
    "vocab_size": 163840,
    "rope_theta": 50000.0,
    "tie_word_embeddings": False,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-05,
    "bos_token_id": 163584,
    "eos_token_id": 163585,
}
DEEPSEEK_V3: Final[dict[str, Any]] = {
    **MOONLIGHT,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "n_group": 8,
    "topk_group": 4,
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 3,
    "vocab_size": 129280,
    "bos_token_id": 0,
    "eos_token_id": 1,
}

# DeepSeek-V2-Lite's config with four layers: MLA with q projected directly, a softmax
# router (greedy top 6 of 64) beside two shared experts, RoPE by a complex multiply.  The
# grouped variant: q through a latent, group-limited routing, two dense layers.
DEEPSEEK_V2_LITE: Final[dict[str, Any]] = {
    **MOONLIGHT,
    "model_type": "deepseek_v2",
    "architectures": ["DeepseekV2ForCausalLM"],
    "intermediate_size": 10944,
    "topk_method": "greedy",
    "routed_scaling_factor": 1.0,
    "norm_topk_prob": False,
    "vocab_size": 102400,
    "rope_theta": 10000,
    "bos_token_id": 100000,
    "eos_token_id": 100001,
}
DEEPSEEK_V2_GROUPED: Final[dict[str, Any]] = {
    **DEEPSEEK_V2_LITE,
    "q_lora_rank": 384,
    "n_group": 8,
    "topk_group": 3,
    "topk_method": "group_limited_greedy",
    "routed_scaling_factor": 16.0,
    "first_k_dense_replace": 2,
}

# GLM-4.7-Flash's config (glm4_moe_lite: DeepSeek-V3's latent attention, GLM-4.5's
# experts) with four layers, dense and sparse alternating by ``mlp_layer_types``; its v
# heads are as wide as q's.
GLM4_MOE_LITE: Final[dict[str, Any]] = {
    "model_type": "glm4_moe_lite",
    "architectures": ["Glm4MoeLiteForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 10240,
    "moe_intermediate_size": 1536,
    "num_hidden_layers": 4,
    "num_attention_heads": 20,
    "num_key_value_heads": 20,
    "n_shared_experts": 1,
    "n_routed_experts": 64,
    "routed_scaling_factor": 1.8,
    "kv_lora_rank": 512,
    "q_lora_rank": 768,
    "qk_rope_head_dim": 64,
    "v_head_dim": 256,
    "qk_nope_head_dim": 192,
    "num_experts_per_tok": 4,
    "norm_topk_prob": True,
    "vocab_size": 154880,
    "mlp_layer_types": ["dense", "sparse", "dense", "sparse"],
    "tie_word_embeddings": False,
}

# dots.llm1's config with four layers: Qwen3's attention (q / k norms per head) with
# DeepSeek-V3's experts (128 routed, two shared, the first layer dense); the windowed
# variant adds GQA, biases and sliding layers.
DOTS1: Final[dict[str, Any]] = {
    "model_type": "dots1",
    "architectures": ["Dots1ForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 4,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 128,
    "n_routed_experts": 128,
    "num_experts_per_tok": 6,
    "n_shared_experts": 2,
    "first_k_dense_replace": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "vocab_size": 152064,
    "rope_theta": 10000000,
    "tie_word_embeddings": False,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-05,
    "sliding_window": None,
}
DOTS1_WINDOWED: Final[dict[str, Any]] = {
    **DOTS1,
    "sliding_window": 512,
    "max_window_layers": 2,
    "attention_bias": True,
    "num_key_value_heads": 8,
}

# OLMoE-1B-7B-0924's config with four layers: 64 routed experts (top 8) in every layer,
# q and k normalized over the whole projections.  The clipped variant adds GQA, biases,
# normalized top-k weights and ``clip_qkv`` (q, k and v clamped in place).
OLMOE: Final[dict[str, Any]] = {
    "model_type": "olmoe",
    "architectures": ["OlmoeForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 1024,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_experts": 64,
    "num_experts_per_tok": 8,
    "norm_topk_prob": False,
    "num_hidden_layers": 4,
    "vocab_size": 50304,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "clip_qkv": None,
    "pad_token_id": 1,
    "eos_token_id": 50279,
}
OLMOE_CLIPPED: Final[dict[str, Any]] = {
    **OLMOE,
    "num_key_value_heads": 4,
    "attention_bias": True,
    "norm_topk_prob": True,
    "clip_qkv": 8.0,
}

# ERNIE 4.5 (dense) on Llama 3.2 1B's sizes: RoPE in fp32 from fp32 tables interleaved
# into copies in every layer.
ERNIE4_5: Final = (
    ("model_type", "ernie4_5"),
    ("architectures", ["Ernie4_5ForCausalLM"]),
    ("use_bias", False),
    ("rope_scaling", None),
)
