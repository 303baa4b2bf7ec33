"""Parameter counts: of a built model, and analytically from a config before building.

The analytic count lets `load_model_config` bound a config (and the memory
model size the weights) without constructing anything: hostile or huge
configs are refused before torch allocates a single module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedConfig

# fmt: off
# MLPs with two matrices (up, down); every other family is gated (gate, up, down).
# T5-style configs say it themselves (``is_gated_act``).
_UNGATED_MLP_TYPES: Final = frozenset((
    "gpt2", "gpt_neox", "gptj", "gpt_bigcode", "bert", "roberta", "xlm-roberta", "distilbert",
    "electra", "falcon", "opt", "bloom", "phi", "starcoder2", "bart", "mbart", "whisper",
    "siglip_vision_model", "clip_vision_model", "vit",
))
# fmt: on


def count_parameters(model: nn.Module) -> int:
    """Parameters of a built model; tied weights count once."""
    return sum(parameter.numel() for parameter in model.parameters())


def estimate_parameters(hf_config: PreTrainedConfig) -> int:
    """Analytic parameter count of a config, before anything is built.

    Attention, MLP (gated or not, dense or MoE with shared experts), encoder
    and decoder stacks, embeddings and an untied LM head; a composite config
    (vision + text) is the sum of its parts.  Norms, biases, position tables
    and projectors are left out: within a few % for the bundled presets,
    which is what bounds checking needs.
    """
    return sum(_stack_parameters(part) for part in _parts(hf_config))


def expert_instances(hf_config: PreTrainedConfig) -> int:
    """Routed expert modules the model would hold (layers x experts, over every stack)."""
    return sum(_experts(part) * sum(_layers(part)) for part in _parts(hf_config))


def _parts(hf_config: PreTrainedConfig) -> list[PreTrainedConfig]:
    """The stacks of a config: its sub-configs (text, vision, ...), else itself."""
    from transformers import PreTrainedConfig

    names = getattr(hf_config, "sub_configs", None) or {}
    parts = [getattr(hf_config, name, None) for name in names]
    parts = [part for part in parts if isinstance(part, PreTrainedConfig)]
    return [sub for part in parts for sub in _parts(part)] if parts else [hf_config]


def _first(config: PreTrainedConfig, *names: str, default: int = 0) -> int:
    """The first of ``names`` the config sets to a positive int (aliases across families)."""
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def _stack_parameters(config: PreTrainedConfig) -> int:
    hidden = _first(config, "hidden_size", "d_model", "n_embd")
    if not hidden:
        return 0
    heads = _first(config, "num_attention_heads", "encoder_attention_heads", default=1)
    multi_query = getattr(config, "multi_query", False) and not getattr(
        config, "new_decoder_architecture", False
    )
    kv_heads = (
        1 if multi_query else _first(config, "num_key_value_heads", "num_kv_heads", default=heads)
    )
    head_dim = _first(config, "head_dim", "d_kv", default=hidden // heads)
    attention = 2 * hidden * head_dim * (heads + kv_heads)  # q and o, k and v
    inner_names = ("intermediate_size", "d_ff", "ffn_dim", "encoder_ffn_dim", "ffn_hidden_size")
    inner = _first(config, *inner_names, "n_inner", default=4 * hidden)
    gated = getattr(config, "is_gated_act", config.model_type not in _UNGATED_MLP_TYPES)
    matrices = 3 if gated else 2
    mlp = matrices * hidden * inner
    layers, decoder = _layers(config)
    if decoder:
        blocks = layers * (attention + mlp) + decoder * (2 * attention + mlp)  # + cross-attention
    else:
        sparse, moe_mlp = _moe(config, layers, hidden, inner, matrices)
        blocks = layers * attention + (layers - sparse) * mlp + sparse * moe_mlp
    tied = getattr(config, "tie_word_embeddings", True)
    embeddings = _first(config, "vocab_size") * hidden * (1 if tied else 2)
    return blocks + embeddings


def _layers(config: PreTrainedConfig) -> tuple[int, int]:
    """(encoder or decoder-only layers, decoder layers of an encoder-decoder else 0)."""
    if not config.is_encoder_decoder:
        return _first(config, "num_hidden_layers", "num_layers"), 0
    encoder = _first(config, "encoder_layers", "num_layers", "num_hidden_layers")
    return encoder, _first(config, "decoder_layers", "num_decoder_layers", default=encoder)


def _experts(config: PreTrainedConfig) -> int:
    """Routed experts per MoE layer; 0 for a dense model."""
    experts = _first(
        config, "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"
    )
    return experts if experts > 1 else 0


def _moe(
    config: PreTrainedConfig, layers: int, hidden: int, inner: int, matrices: int
) -> tuple[int, int]:
    """(number of MoE layers, parameters of one MoE MLP incl. router and shared experts)."""
    experts = _experts(config)
    if not experts:
        return 0, 0
    expert_inner = _first(config, "moe_intermediate_size", default=inner)
    shared_inner = _first(config, "n_shared_experts") * expert_inner + _first(
        config, "shared_expert_intermediate_size"
    )
    dense_layers = _first(config, "first_k_dense_replace") + len(
        getattr(config, "mlp_only_layers", None) or ()
    )
    per_layer = matrices * hidden * (experts * expert_inner + shared_inner) + hidden * experts
    return max(layers - dense_layers, 0), per_layer
