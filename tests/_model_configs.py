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
