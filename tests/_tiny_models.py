"""Tiny random-init HuggingFace models for tests, built from config classes only.

Nothing here touches the network or the Hub: every model is built with
``ModelClass(config)`` from a hand-written config, so tests run offline, on CPU,
in milliseconds.  Sizes are the smallest that still exercise the interesting
structure of each architecture: GQA, MoE routing, sliding windows, encoder +
decoder stacks, cross-attention, a vision tower.

Public helpers:

- ``ARCHS`` - every architecture name ``tiny_model`` knows.
- ``tiny_config(arch, **overrides)`` - the config alone.
- ``tiny_model(arch, **overrides)`` - a model in training mode, seeded.
- ``tiny_batch(arch, config)`` - a right-padded batch with an attention mask and
  labels (``-100`` on padding), so HF computes the loss itself.
- ``loss_and_grads(model, batch)`` - one seeded forward + backward, for comparing
  two runs (dropout draws the same masks in both).

Every model is built with 3 layers per stack by default (``DEFAULT_LAYERS``).

Overrides that are not config fields:

- ``num_layers``: the layer count of EVERY stack (encoder, decoder, vision tower).
- ``dropout``: set every dropout probability the config has (``*dropout``,
  ``*pdrop``, ``*dropout_prob``, ``*dropout_rate``, in sub-configs too).
- ``attn_implementation``: ``"eager"`` / ``"sdpa"`` (default: HF's choice).
- ``seed`` (``tiny_model`` only): the torch seed used for the random init.

Any other keyword is set on the config (on the text config for a
vision-language model).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

VOCAB = 100
PAD_ID = 0
SEQ_LEN = 10
BATCH = 2
PAD_TAIL = 3  # the second row of a batch is right-padded by this many tokens
IMAGE_SIZE = 16
PATCH_SIZE = 8
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2
IMAGE_TOKEN_ID = VOCAB - 1

_DROPOUT_KEY = re.compile(r"(dropout|pdrop|dropout_prob|dropout_rate)$")


@dataclass(frozen=True)
class _Spec:
    """How to build one architecture: class names, config kwargs, layer keys."""

    config_cls: str
    model_cls: str
    kwargs: dict[str, Any]
    layer_keys: tuple[str, ...] = ("num_hidden_layers",)
    kind: str = "causal"  # causal | seq2seq | masked | vision_language
    extra: dict[str, Any] = field(default_factory=dict)


_DECODER = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "pad_token_id": PAD_ID,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

# DeepSeek's multi-head latent attention, k and v projected per head (kv heads = heads).
_MLA = {
    **_DECODER,
    "num_key_value_heads": 4,
    "q_lora_rank": 12,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 6,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "first_k_dense_replace": 64,
    "n_group": 2,
    "topk_group": 1,
}

_SPECS: dict[str, _Spec] = {
    "llama": _Spec("LlamaConfig", "LlamaForCausalLM", _DECODER),
    "mistral": _Spec("MistralConfig", "MistralForCausalLM", _DECODER),
    "smollm3": _Spec(
        "SmolLM3Config", "SmolLM3ForCausalLM", {**_DECODER, "no_rope_layer_interval": 2}
    ),
    "granite": _Spec(
        "GraniteConfig",
        "GraniteForCausalLM",
        {
            **_DECODER,
            "embedding_multiplier": 12.0,
            "residual_multiplier": 0.22,
            "attention_multiplier": 0.125,
            "logits_scaling": 8.0,
        },
    ),
    "qwen2": _Spec("Qwen2Config", "Qwen2ForCausalLM", _DECODER),
    "qwen3": _Spec("Qwen3Config", "Qwen3ForCausalLM", {**_DECODER, "head_dim": 8}),
    "qwen2_moe": _Spec(
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        {
            **_DECODER,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
        },
    ),
    "qwen3_moe": _Spec(
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {
            **_DECODER,
            "head_dim": 8,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 48,
            "norm_topk_prob": True,
        },
    ),
    "olmoe": _Spec(
        "OlmoeConfig",
        "OlmoeForCausalLM",
        {**_DECODER, "num_experts": 4, "num_experts_per_tok": 2, "clip_qkv": 8.0},
    ),
    "glm4_moe": _Spec(
        "Glm4MoeConfig",
        "Glm4MoeForCausalLM",
        {
            **_DECODER,
            "head_dim": 8,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 16,
            "n_shared_experts": 1,
            "first_k_dense_replace": 1,
            "n_group": 2,
            "topk_group": 1,
            "use_qk_norm": True,
            "attention_bias": True,
            "partial_rotary_factor": 0.5,
        },
    ),
    # MLA with a q latent; dense layers only (FlopCounterMode does not count grouped_mm).
    "deepseek_v3": _Spec("DeepseekV3Config", "DeepseekV3ForCausalLM", _MLA),
    # DeepSeek-V2: the same, its RoPE a complex multiply.
    "deepseek_v2": _Spec("DeepseekV2Config", "DeepseekV2ForCausalLM", _MLA),
    "mixtral": _Spec(
        "MixtralConfig",
        "MixtralForCausalLM",
        {**_DECODER, "num_local_experts": 4, "num_experts_per_tok": 2},
    ),
    "gemma": _Spec("GemmaConfig", "GemmaForCausalLM", {**_DECODER, "head_dim": 16}),
    "ernie4_5": _Spec(
        "Ernie4_5Config", "Ernie4_5ForCausalLM", {**_DECODER, "head_dim": 8, "use_bias": True}
    ),
    "cohere": _Spec(
        "CohereConfig",
        "CohereForCausalLM",
        {**_DECODER, "attention_bias": True, "use_qk_norm": True},
    ),
    "cohere2": _Spec(
        "Cohere2Config",
        "Cohere2ForCausalLM",
        {**_DECODER, "sliding_window": 4, "sliding_window_pattern": 2},
    ),
    "stablelm": _Spec(
        "StableLmConfig",
        "StableLmForCausalLM",
        {**_DECODER, "use_qkv_bias": True, "use_parallel_residual": True},
    ),
    "phi": _Spec(
        "PhiConfig",
        "PhiForCausalLM",
        {**_DECODER, "resid_pdrop": 0.1, "embd_pdrop": 0.1, "partial_rotary_factor": 0.5},
    ),
    "starcoder2": _Spec(
        "Starcoder2Config",
        "Starcoder2ForCausalLM",
        {**_DECODER, "residual_dropout": 0.1, "embedding_dropout": 0.1},
    ),
    "seed_oss": _Spec(
        "SeedOssConfig",
        "SeedOssForCausalLM",
        {**_DECODER, "head_dim": 8, "attention_bias": True, "attention_out_bias": True},
    ),
    "gemma2": _Spec(
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {**_DECODER, "head_dim": 8, "sliding_window": 4, "query_pre_attn_scalar": 8},
    ),
    "gemma3": _Spec(
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {**_DECODER, "head_dim": 8, "sliding_window": 4, "query_pre_attn_scalar": 8},
    ),
    "phi3": _Spec("Phi3Config", "Phi3ForCausalLM", _DECODER),
    "ministral3": _Spec("Ministral3Config", "Ministral3ForCausalLM", _DECODER),
    "ministral": _Spec(
        "MinistralConfig", "MinistralForCausalLM", {**_DECODER, "head_dim": 8, "sliding_window": 4}
    ),
    "exaone4": _Spec(
        "Exaone4Config",
        "Exaone4ForCausalLM",
        {**_DECODER, "sliding_window": 4, "sliding_window_pattern": 2},
    ),
    "glm4": _Spec("Glm4Config", "Glm4ForCausalLM", {**_DECODER, "head_dim": 8}),
    "glm": _Spec("GlmConfig", "GlmForCausalLM", {**_DECODER, "head_dim": 8}),
    "hunyuan_v1_dense": _Spec(
        "HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", {**_DECODER, "head_dim": 8}
    ),
    "gpt_oss": _Spec(
        "GptOssConfig",
        "GptOssForCausalLM",
        {
            **_DECODER,
            "head_dim": 8,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 4,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        },
    ),
    "olmo3": _Spec(
        "Olmo3Config",
        "Olmo3ForCausalLM",
        {**_DECODER, "sliding_window": 4},  # sliding layers, every fourth full
    ),
    "gpt2": _Spec(
        "GPT2Config",
        "GPT2LMHeadModel",
        {
            "vocab_size": VOCAB,
            "n_embd": 32,
            "n_head": 4,
            "n_positions": 64,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
        layer_keys=("n_layer",),
    ),
    "gpt_neox": _Spec(
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        {
            "vocab_size": VOCAB,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_attention_heads": 4,
            "max_position_embeddings": 64,
        },
    ),
    "opt": _Spec(
        "OPTConfig",
        "OPTForCausalLM",
        {
            "vocab_size": VOCAB,
            "hidden_size": 32,
            "word_embed_proj_dim": 32,
            "ffn_dim": 64,
            "num_attention_heads": 4,
            "max_position_embeddings": 64,
        },
    ),
    "falcon": _Spec(
        "FalconConfig",
        "FalconForCausalLM",
        {"vocab_size": VOCAB, "hidden_size": 32, "num_attention_heads": 4},
    ),
    "t5": _Spec(
        "T5Config",
        "T5ForConditionalGeneration",
        {
            "vocab_size": VOCAB,
            "d_model": 32,
            "d_kv": 8,
            "d_ff": 64,
            "num_heads": 4,
            "relative_attention_num_buckets": 8,
            "pad_token_id": PAD_ID,
            "decoder_start_token_id": PAD_ID,
        },
        layer_keys=("num_layers", "num_decoder_layers"),
        kind="seq2seq",
    ),
    "bart": _Spec(
        "BartConfig",
        "BartForConditionalGeneration",
        {
            "vocab_size": VOCAB,
            "d_model": 32,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 4,
            "encoder_ffn_dim": 64,
            "decoder_ffn_dim": 64,
            "max_position_embeddings": 64,
            "pad_token_id": PAD_ID,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "decoder_start_token_id": 2,
            "forced_eos_token_id": None,
        },
        layer_keys=("encoder_layers", "decoder_layers"),
        kind="seq2seq",
    ),
    "bert": _Spec(
        "BertConfig",
        "BertForMaskedLM",
        {
            "vocab_size": VOCAB,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_attention_heads": 4,
            "max_position_embeddings": 64,
            "pad_token_id": PAD_ID,
        },
        kind="masked",
    ),
    "llava": _Spec(
        "LlavaConfig",
        "LlavaForConditionalGeneration",
        {
            "image_token_id": IMAGE_TOKEN_ID,
            "image_seq_length": IMAGE_TOKENS,
            # The last vision layer feeds the projector, so every layer gets a gradient.
            "vision_feature_layer": -1,
        },
        kind="vision_language",
        extra={
            "text": ("LlamaConfig", _DECODER),
            "vision": (
                "CLIPVisionConfig",
                {
                    "hidden_size": 32,
                    "intermediate_size": 64,
                    "num_attention_heads": 4,
                    "image_size": IMAGE_SIZE,
                    "patch_size": PATCH_SIZE,
                    "projection_dim": 32,
                },
            ),
        },
    ),
}

ARCHS: tuple[str, ...] = tuple(_SPECS)
"""Every architecture name that ``tiny_config`` / ``tiny_model`` accept."""

DEFAULT_LAYERS = 3  # odd on purpose: shows how medium counts across stacks


def _spec(arch: str) -> _Spec:
    try:
        return _SPECS[arch]
    except KeyError:
        raise ValueError(f"unknown tiny arch {arch!r}; known: {', '.join(ARCHS)}") from None


def _set_dropout(config: Any, p: float) -> None:
    """Set every numeric dropout knob of ``config`` and of its sub-configs to ``p``."""
    for key, value in list(vars(config).items()):
        if _DROPOUT_KEY.search(key) and isinstance(value, int | float):
            setattr(config, key, p)
    for sub in ("text_config", "vision_config"):
        if getattr(config, sub, None) is not None:
            _set_dropout(getattr(config, sub), p)


def tiny_config(
    arch: str,
    *,
    num_layers: int = DEFAULT_LAYERS,
    dropout: float | None = None,
    attn_implementation: str | None = None,
    **overrides: Any,
) -> Any:
    """Build the tiny config of ``arch`` (see the module docstring for the overrides)."""
    import transformers

    spec = _spec(arch)
    layers = dict.fromkeys(spec.layer_keys, num_layers)
    if spec.kind == "vision_language":
        text_cls, text_kwargs = spec.extra["text"]
        vision_cls, vision_kwargs = spec.extra["vision"]
        text = getattr(transformers, text_cls)(
            **{**text_kwargs, "num_hidden_layers": num_layers, **overrides}
        )
        vision = getattr(transformers, vision_cls)(**vision_kwargs, num_hidden_layers=num_layers)
        config = getattr(transformers, spec.config_cls)(
            text_config=text, vision_config=vision, **spec.kwargs
        )
    else:
        config = getattr(transformers, spec.config_cls)(**{**spec.kwargs, **layers, **overrides})
    if dropout is not None:
        _set_dropout(config, dropout)
    if attn_implementation is not None:
        # The private setter is what `from_pretrained(attn_implementation=...)` uses;
        # it reaches the sub-configs of composite models too.
        config._attn_implementation = attn_implementation
    return config


def tiny_model(arch: str, *, seed: int = 0, **overrides: Any) -> Any:
    """Build a tiny random-init model of ``arch`` in training mode.

    ``seed`` makes the weights reproducible, so two calls with the same
    arguments give bit-identical models.
    """
    import torch
    import transformers

    config = tiny_config(arch, **overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, _spec(arch).model_cls)(config)
    return model.train()


def as_loaded(model: Any, dtype: Any) -> Any:
    """``model`` in ``dtype`` as ``from_pretrained(dtype=...)`` loads it: the parameters
    its ``_keep_in_fp32_modules_strict`` names (searched in each name, as the loader
    does: GLM-4.5's router weight) stay fp32."""
    import re

    model.to(dtype)
    keep = getattr(model, "_keep_in_fp32_modules_strict", None) or ()
    for name, parameter in model.named_parameters():
        if any(re.search(entry, name) for entry in keep):
            parameter.data = parameter.data.float()
    return model


def tiny_batch(arch: str, config: Any, *, seed: int = 1) -> dict[str, Any]:
    """A right-padded batch for ``arch``: ids, attention mask, labels (+ pixels).

    The second row ends in ``PAD_TAIL`` padding tokens masked out of attention
    and of the loss, so padding-dependent code paths (masks, caches) run.
    """
    import torch

    spec = _spec(arch)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB - 1, (BATCH, SEQ_LEN), generator=generator)
    mask = torch.ones(BATCH, SEQ_LEN, dtype=torch.long)
    mask[1, SEQ_LEN - PAD_TAIL :] = 0
    ids[mask == 0] = PAD_ID
    batch: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
    if spec.kind == "vision_language":
        ids[:, :IMAGE_TOKENS] = IMAGE_TOKEN_ID
        batch["pixel_values"] = torch.randn(BATCH, 3, IMAGE_SIZE, IMAGE_SIZE, generator=generator)
    labels = ids.clone()
    labels[mask == 0] = -100
    if spec.kind == "vision_language":
        labels[:, :IMAGE_TOKENS] = -100
    if spec.kind == "seq2seq":
        # Shorter targets than sources: decoder and encoder shapes differ, as in real jobs.
        labels = torch.randint(3, VOCAB - 1, (BATCH, SEQ_LEN - 2), generator=generator)
        labels[1, -2:] = -100
    batch["labels"] = labels
    return batch


def loss_and_grads(model: Any, batch: dict[str, Any], *, seed: int = 1234) -> tuple[Any, dict]:
    """One forward + backward from a fixed RNG state: ``(loss, {param name: grad})``.

    Seeding right before the forward makes dropout draw the same masks in two
    runs, so a run with checkpointing can be compared with one without.
    Grads are ``None`` for parameters the loss does not reach.
    """
    import torch

    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = model(**batch).loss
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads
