"""The architecture facts the memory model needs, read once from an HF config.

`arch_of` turns a transformers config object into an `Arch`: plain numbers and
flags (sizes, GQA, MLP kind, norms, MoE routing, dropout, attention support),
so that `ckpt_core._params` and `ckpt_core._activations` are pure arithmetic
and never build a model.  Only the families whose forward pass the memory model
describes op by op are accepted; any other ``model_type`` is a
`ModelConfigError` naming the supported ones (no silent guess).

Pure Python: reads attributes of the config object it is given.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final

from ckpt_core._errors import ModelConfigError

# model_type -> family: one forward-pass description per family.
FAMILIES: Final[dict[str, str]] = {
    "llama": "decoder",
    "mistral": "decoder",
    "mixtral": "decoder",
    "qwen2": "decoder",
    "qwen3": "decoder",
    "qwen3_moe": "decoder",
    "phi3": "decoder",
    "olmo2": "decoder",
    "gemma2": "decoder",
    "gemma3_text": "decoder",
    "gemma3": "decoder",  # the language model of Gemma 3 (the vision tower adds weights only)
    "gpt2": "gpt2",
    "falcon": "falcon",
    "bert": "bert",
    "t5": "t5",
}

# Attention implementations transformers 5.24 supports per model type (the
# classes' _supports_sdpa / _supports_flash_attn; checked by a test).
NO_SDPA: Final = frozenset({"gemma2"})  # softcapping: transformers falls back to eager
NO_FLASH: Final = frozenset({"t5", "gemma3"})

# Activation functions by what their backward keeps (see _activations).
_ACTIVATIONS: Final[dict[str, str]] = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu",
    "gelu_python_tanh": "gelu",
    "gelu_fast": "gelu",
    "relu": "relu",
    "gelu_new": "gelu_new",
}


@dataclass(frozen=True, slots=True)
class Vision:
    """A vision tower's sizes (weights only: text-only training never runs it)."""

    hidden: int
    layers: int
    intermediate: int
    patches: int  # position-embedding rows
    patch_pixels: int  # 3 x patch x patch
    projector: int  # parameters of the projector into the text model


@dataclass(frozen=True, slots=True)
class Arch:
    """One model's architecture facts, in the names the memory model uses."""

    model_type: str
    family: str
    hidden: int
    layers: int  # blocks of the (decoder) stack
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    act: str  # silu | gelu | gelu_new | relu
    glu: bool
    encoder_layers: int = 0  # T5's encoder stack
    fused_qkv: bool = False  # one projection makes q, k and v (Phi-3)
    fused_gate_up: bool = False
    qkv_bias: bool = False
    norm: str = "rms"  # rms | rms_gemma | rms_olmo | layer | t5
    qk_norm: str = ""  # "" | head | full
    sandwich: str = ""  # "" | gemma (4 norms per block) | olmo2 (post-norms only)
    rope_fp32: bool = False  # cos / sin kept in fp32 (OLMo-2 applies RoPE in fp32)
    attn_softcap: bool = False
    final_softcap: bool = False
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] = ()
    moe_layers: tuple[bool, ...] = ()
    experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0
    router_in_dtype: bool = False  # routing weights cast to the activation dtype (Qwen3-MoE)
    attn_dropout: float = 0.0
    hidden_dropout: float = 0.0
    embed_dropout: float = 0.0
    positions: int = 0  # learned absolute position rows
    type_vocab: int = 0
    relative_buckets: int = 0
    parallel_attn: bool = False  # Falcon: attention and MLP side by side
    falcon_norms: int = 0  # LayerNorms per Falcon block (1 or 2)
    bias: bool = False  # every linear has a bias (GPT-2, BERT, Falcon with bias=True)
    mlp_bias: bool = False  # Llama-style ``mlp_bias``
    vision: Vision | None = None

    @property
    def is_moe(self) -> bool:
        return any(self.moe_layers)


def supported_model_types() -> list[str]:
    """The model types the memory model describes."""
    return sorted(FAMILIES)


def arch_of(config: Any) -> Arch:
    """The `Arch` of a transformers config object (composite configs: the text model)."""
    model_type = getattr(config, "model_type", None)
    family = FAMILIES.get(model_type or "")
    if family is None:
        raise ModelConfigError(
            f"no memory model for model_type {model_type!r}; the estimate knows "
            f"{', '.join(supported_model_types())} (a dry run with measure works for any)",
            field="model.config.model_type",
        )
    vision = _vision(config) if model_type == "gemma3" else None
    text = config.get_text_config() if model_type == "gemma3" else config
    parse = {"decoder": _decoder, "gpt2": _gpt2, "falcon": _falcon, "bert": _bert, "t5": _t5}
    arch = parse[family](text, model_type)
    if vision is not None:
        arch = replace(arch, vision=vision)
    return arch


def _int(config: Any, *names: str, default: int | None = None) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    if default is None:
        raise ModelConfigError(
            f"the config has none of {', '.join(names)} (a positive integer)",
            field=f"model.config.{names[0]}",
        )
    return default


def _window(config: Any) -> int | None:
    """``sliding_window``: null or a positive int (some config classes do not check it)."""
    value = getattr(config, "sliding_window", None)
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    raise ModelConfigError(
        f"sliding_window must be a positive integer or null, got {value!r}",
        field="model.config.sliding_window",
    )


def _act(config: Any, *names: str) -> str:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, str):
            kind = _ACTIVATIONS.get(value)
            if kind is None:
                raise ModelConfigError(
                    f"activation {value!r} is not described by the memory model; "
                    f"known: {', '.join(sorted(_ACTIVATIONS))}",
                    field=f"model.config.{name}",
                )
            return kind
    return "silu"


def _decoder(config: Any, model_type: str) -> Arch:
    hidden = _int(config, "hidden_size")
    heads = _int(config, "num_attention_heads")
    layers = _int(config, "num_hidden_layers")
    layer_types = tuple(getattr(config, "layer_types", None) or ())
    gemma = model_type.startswith("gemma")
    window = _window(config)
    # Layers list their attention type; Mistral / Phi-3 slide on every layer when a window is set.
    if layer_types:
        sliding = tuple(kind == "sliding_attention" for kind in layer_types)
    else:
        sliding = (window is not None,) * layers
    experts = _int(config, "num_local_experts", "num_experts", default=0)
    moe_layers = _moe_layers(config, layers) if experts > 1 else (False,) * layers
    norm = "rms_gemma" if gemma else "rms_olmo" if model_type == "olmo2" else "rms"
    return Arch(
        model_type=model_type,
        family="decoder",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=_int(config, "num_key_value_heads", default=heads),
        head_dim=_int(config, "head_dim", default=hidden // heads),
        intermediate=_int(config, "intermediate_size"),
        vocab=_int(config, "vocab_size"),
        tied=bool(getattr(config, "tie_word_embeddings", False)),
        act=_act(config, "hidden_activation", "hidden_act"),
        glu=True,
        fused_qkv=model_type == "phi3",
        fused_gate_up=model_type == "phi3",
        qkv_bias=model_type == "qwen2" or bool(getattr(config, "attention_bias", False)),
        norm=norm,
        qk_norm="head" if model_type in ("qwen3", "qwen3_moe", "gemma3_text", "gemma3") else "",
        sandwich="gemma" if gemma else "olmo2" if model_type == "olmo2" else "",
        rope_fp32=model_type == "olmo2",
        attn_softcap=bool(getattr(config, "attn_logit_softcapping", None)),
        final_softcap=bool(getattr(config, "final_logit_softcapping", None)),
        sliding_window=window if any(sliding) else None,
        sliding_layers=sliding,
        moe_layers=moe_layers,
        experts=experts if any(moe_layers) else 0,
        top_k=_int(config, "num_experts_per_tok", default=0) if any(moe_layers) else 0,
        moe_intermediate=_int(config, "moe_intermediate_size", "intermediate_size")
        if any(moe_layers)
        else 0,
        router_in_dtype=model_type == "qwen3_moe",
        attn_dropout=float(getattr(config, "attention_dropout", 0.0) or 0.0),
        hidden_dropout=float(getattr(config, "resid_pdrop", 0.0) or 0.0),
        embed_dropout=float(getattr(config, "embd_pdrop", 0.0) or 0.0),
        mlp_bias=bool(getattr(config, "mlp_bias", False)),
    )


def _moe_layers(config: Any, layers: int) -> tuple[bool, ...]:
    """Which layers route to experts: Qwen-MoE's sparse step and dense-only list."""
    step = _int(config, "decoder_sparse_step", default=1)
    dense = set(getattr(config, "mlp_only_layers", None) or ())
    return tuple(i not in dense and (i + 1) % step == 0 for i in range(layers))


def _gpt2(config: Any, model_type: str) -> Arch:
    hidden = _int(config, "n_embd", "hidden_size")
    heads = _int(config, "n_head", "num_attention_heads")
    return Arch(
        model_type=model_type,
        family="gpt2",
        hidden=hidden,
        layers=_int(config, "n_layer", "num_hidden_layers"),
        heads=heads,
        kv_heads=heads,
        head_dim=hidden // heads,
        intermediate=_int(config, "n_inner", default=4 * hidden),
        vocab=_int(config, "vocab_size"),
        tied=bool(getattr(config, "tie_word_embeddings", True)),
        act=_act(config, "activation_function"),
        glu=False,
        fused_qkv=True,
        norm="layer",
        attn_dropout=float(config.attn_pdrop or 0.0),
        hidden_dropout=float(config.resid_pdrop or 0.0),
        embed_dropout=float(config.embd_pdrop or 0.0),
        positions=_int(config, "n_positions", "max_position_embeddings"),
        bias=True,
    )


def _falcon(config: Any, model_type: str) -> Arch:
    hidden = _int(config, "hidden_size")
    heads = _int(config, "num_attention_heads")
    new = bool(config.new_decoder_architecture)
    kv_heads = (
        _int(config, "num_kv_heads", default=heads) if new else 1 if config.multi_query else heads
    )
    if bool(getattr(config, "alibi", False)):
        raise ModelConfigError(
            "Falcon with alibi is not described by the memory model (rotary only)",
            field="model.config.alibi",
        )
    return Arch(
        model_type=model_type,
        family="falcon",
        hidden=hidden,
        layers=_int(config, "num_hidden_layers"),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=hidden // heads,
        intermediate=_int(config, "ffn_hidden_size", default=4 * hidden),
        vocab=_int(config, "vocab_size"),
        tied=bool(getattr(config, "tie_word_embeddings", True)),
        act="gelu",
        glu=False,
        fused_qkv=True,
        norm="layer",
        attn_dropout=float(config.attention_dropout or 0.0),
        hidden_dropout=float(config.hidden_dropout or 0.0),
        parallel_attn=bool(config.parallel_attn) or new,
        falcon_norms=_falcon_norms(config, new),
        bias=bool(config.bias),
    )


def _falcon_norms(config: Any, new: bool) -> int:
    """LayerNorms per Falcon block: 2 (ln_attn + ln_mlp) in the new architecture."""
    if new:
        return 2 if getattr(config, "num_ln_in_parallel_attn", None) in (None, 2) else 1
    return 1 if config.parallel_attn else 2


def _bert(config: Any, model_type: str) -> Arch:
    hidden = _int(config, "hidden_size")
    heads = _int(config, "num_attention_heads")
    return Arch(
        model_type=model_type,
        family="bert",
        hidden=hidden,
        layers=_int(config, "num_hidden_layers"),
        heads=heads,
        kv_heads=heads,
        head_dim=hidden // heads,
        intermediate=_int(config, "intermediate_size"),
        vocab=_int(config, "vocab_size"),
        tied=bool(getattr(config, "tie_word_embeddings", True)),
        act=_act(config, "hidden_act"),
        glu=False,
        norm="layer",
        attn_dropout=float(config.attention_probs_dropout_prob or 0.0),
        hidden_dropout=float(config.hidden_dropout_prob or 0.0),
        embed_dropout=float(config.hidden_dropout_prob or 0.0),
        positions=_int(config, "max_position_embeddings"),
        type_vocab=_int(config, "type_vocab_size", default=0),
        bias=True,
    )


def _t5(config: Any, model_type: str) -> Arch:
    hidden = _int(config, "d_model")
    heads = _int(config, "num_heads")
    gated = bool(getattr(config, "is_gated_act", False))
    layers = _int(config, "num_layers")
    return Arch(
        model_type=model_type,
        family="t5",
        hidden=hidden,
        layers=_int(config, "num_decoder_layers", default=layers),
        encoder_layers=layers,
        heads=heads,
        kv_heads=heads,
        head_dim=_int(config, "d_kv"),
        intermediate=_int(config, "d_ff"),
        vocab=_int(config, "vocab_size"),
        tied=bool(getattr(config, "tie_word_embeddings", True)),
        act=_act(config, "dense_act_fn"),
        glu=gated,
        norm="t5",
        attn_dropout=float(config.dropout_rate or 0.0),
        hidden_dropout=float(config.dropout_rate or 0.0),
        embed_dropout=float(config.dropout_rate or 0.0),
        relative_buckets=_int(config, "relative_attention_num_buckets"),
    )


def _vision(config: Any) -> Vision:
    vision = config.vision_config
    if getattr(vision, "model_type", None) != "siglip_vision_model" or vision.vision_use_head:
        raise ModelConfigError(
            "only a SigLIP vision tower without pooling head is described (Gemma 3)",
            field="model.config.vision_config",
        )
    patch = _int(vision, "patch_size")
    hidden = _int(vision, "hidden_size")
    text_hidden = _int(config.get_text_config(), "hidden_size")
    return Vision(
        hidden=hidden,
        layers=_int(vision, "num_hidden_layers"),
        intermediate=_int(vision, "intermediate_size"),
        patches=(_int(vision, "image_size") // patch) ** 2,
        patch_pixels=_int(vision, "num_channels", default=3) * patch * patch,
        projector=hidden * text_hidden + hidden,  # projection matrix + soft-embedding norm
    )
