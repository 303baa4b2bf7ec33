"""Model configs: validate a preset or an inline HF ``config.json``, size it, build it on meta.

`load_model_config` turns ``{"preset": NAME}`` or ``{"config": {...}}`` into a
`ModelConfig` in this order, so that nothing expensive runs on hostile input:

1-2. the cheap checks of `ckpt_core._configs.config_json`: JSON types, depth, size,
   remote code, HF's own checkpointing, size fields in bounds, a known
   ``model_type``;
3. the ``PretrainedConfig`` built from the dict (pure Python, no network);
4. an analytic parameter count and the MoE expert instances, checked against
   their bounds.

Only then may `build_meta_model` construct the model, on ``torch.device("meta")``:
no weights, no download, never remote code; the built model's parameter count
is checked again.  This module imports torch and
transformers inside functions only, so importing it is cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Final

from ckpt_core._configs.config_json import ConfigLimits, Source, blamed_on_preset, check_config_json
from ckpt_core._configs.size_bounds import count_parameters, estimate_parameters, expert_instances
from ckpt_core._errors import ConfigTooLargeError, ModelConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from torch import nn
    from transformers import PreTrainedConfig

# Model classes tried for ``architectures[0]``; the first four (in this order,
# seq2seq only for encoder-decoders) and the bare model are the defaults.
# fmt: off
_ARCHITECTURE_MAPPINGS: Final = (
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING",
    "MODEL_FOR_MASKED_LM_MAPPING", "MODEL_FOR_CAUSAL_LM_MAPPING", "MODEL_FOR_PRETRAINING_MAPPING",
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING",
    "MODEL_FOR_QUESTION_ANSWERING_MAPPING", "MODEL_MAPPING",
)
# fmt: on
_DEFAULT_MAPPINGS: Final = (*_ARCHITECTURE_MAPPINGS[:4], "MODEL_MAPPING")

# attention= values for build_meta_model.  flash_attention_2 builds as sdpa: the
# module tree and parameters are identical, and its kernel package cannot load
# without CUDA; the measurement treats both as fused attention.
_BUILD_ATTENTION: Final = {"eager": "eager", "sdpa": "sdpa", "flash_attention_2": "sdpa"}


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A validated model config; `key` identifies it (sha256 of the canonical JSON).

    ``config`` is the HF config dict (a private copy; provenance keys of presets
    stripped), ``architecture`` the model class `build_meta_model` will build,
    ``approx_parameters`` the analytic count computed before anything is built.
    """

    source: Source
    preset: str | None
    config: dict[str, Any]
    model_type: str
    architecture: str
    key: str
    approx_parameters: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (without the config dict itself)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "config"}


def load_model_config(model: object, *, limits: ConfigLimits | None = None) -> ModelConfig:
    """Validate ``{"preset": NAME}`` or ``{"config": {...}}`` into a `ModelConfig`.

    Raises `ModelConfigError` (or its subclasses `UnknownPresetError`,
    `ConfigTooLargeError`) with ``field`` naming the offending input.
    """
    limits = limits or ConfigLimits()
    checked = check_config_json(model, limits)
    with blamed_on_preset(checked.asked_preset):
        hf_config = hf_config_from_dict(checked.config)
        approx = estimate_parameters(hf_config)
        _check_parameters(approx, limits, "estimated from the config")
        _check_expert_instances(hf_config, limits)
        architecture = _model_class(hf_config, checked.config.get("architectures")).__name__
    return ModelConfig(
        source=checked.source,
        preset=checked.preset,
        config=checked.config,
        model_type=checked.model_type,
        architecture=architecture,
        key=checked.key,
        approx_parameters=approx,
    )


def hf_config_from_dict(config: Mapping[str, Any]) -> PreTrainedConfig:
    """The transformers config object for a validated dict (no network, no remote code)."""
    from transformers import AutoConfig

    kwargs = {key: value for key, value in config.items() if key != "model_type"}
    try:
        hf_config = AutoConfig.for_model(config["model_type"], **kwargs)
    except Exception as exc:  # any rejection by the config class is the caller's input
        raise ModelConfigError(
            f"transformers rejected the config: {type(exc).__name__}: {exc}", field="model.config"
        ) from exc
    # A backbone's pretrained weights (timm / HF) would be downloaded at build time.
    if getattr(hf_config, "use_pretrained_backbone", False):
        hf_config.use_pretrained_backbone = False
    return hf_config


def _check_parameters(parameters: int, limits: ConfigLimits, how: str) -> None:
    if parameters > limits.max_parameters:
        raise ConfigTooLargeError(
            f"the model has {parameters:,} parameters ({how}); the limit is "
            f"{limits.max_parameters:,}",
            field="model.config",
        )


def _check_expert_instances(hf_config: PreTrainedConfig, limits: ConfigLimits) -> None:
    instances = expert_instances(hf_config)
    if instances > limits.max_expert_instances:
        raise ConfigTooLargeError(
            f"the config has {instances:,} expert instances (MoE layers x experts); the limit "
            f"is {limits.max_expert_instances:,}",
            field="model.config",
        )


def _model_class(hf_config: PreTrainedConfig, architectures: object) -> type[nn.Module]:
    """``architectures[0]`` when transformers maps it for this model type, else a default.

    Classes come only from transformers' auto mappings for the config's own
    class, never from a name looked up by getattr.
    """
    from transformers.models.auto import modeling_auto

    def candidate(mapping_name: str) -> type[nn.Module] | None:
        return getattr(modeling_auto, mapping_name).get(type(hf_config), None)

    wanted = architectures[0] if isinstance(architectures, list) and architectures else None
    if wanted is not None:
        for mapping_name in _ARCHITECTURE_MAPPINGS:
            cls = candidate(mapping_name)
            if cls is not None and cls.__name__ == wanted:
                return cls
    defaults = _DEFAULT_MAPPINGS if hf_config.is_encoder_decoder else _DEFAULT_MAPPINGS[1:]
    for mapping_name in defaults:
        cls = candidate(mapping_name)
        if cls is not None:
            return cls
    raise ModelConfigError(
        f"transformers has no model class for model_type {hf_config.model_type!r}",
        field="model.config.model_type",
    )


def model_class(cfg: ModelConfig) -> type[nn.Module]:
    """The transformers class `build_meta_model` builds for ``cfg`` (``cfg.architecture``):
    for a real step on a device, the same model the estimate and the dry run describe."""
    return _model_class(hf_config_from_dict(cfg.config), cfg.config.get("architectures"))


def build_meta_model(
    cfg: ModelConfig, *, attention: str | None = None, limits: ConfigLimits | None = None
) -> nn.Module:
    """Construct ``cfg``'s model on ``torch.device("meta")``: structure only, no weights.

    ``attention`` is the attention implementation (``"sdpa"``, ``"eager"`` or
    ``"flash_attention_2"``, which builds as sdpa: same modules, and its kernel
    package needs CUDA); None keeps transformers' default.  The built model's
    parameter count is checked against ``limits.max_parameters`` as well.
    """
    import torch

    hf_config = hf_config_from_dict(cfg.config)
    cls = _model_class(hf_config, cfg.config.get("architectures"))
    kwargs: dict[str, Any] = {}
    if attention is not None:
        kwargs["attn_implementation"] = _build_attention(attention, cls)
    try:
        with torch.device("meta"):
            model = cls._from_config(hf_config, **kwargs)
    except Exception as exc:  # inconsistent sizes etc. surface only when layers are made
        raise ModelConfigError(
            f"transformers could not build {cls.__name__} from the config: "
            f"{type(exc).__name__}: {exc}",
            field="model.config",
        ) from exc
    _check_parameters(count_parameters(model), limits or ConfigLimits(), "as built")
    return model


def _build_attention(attention: object, cls: type[nn.Module]) -> str:
    """The implementation to build with; a class without SDPA support builds eager.

    Some families (e.g. Gemma 2) refuse ``sdpa``: the module tree is the same
    either way, and the measurement decides what attention keeps.
    """
    implementation = _BUILD_ATTENTION.get(attention) if isinstance(attention, str) else None
    if implementation is None:
        raise ModelConfigError(
            f"attention must be one of {', '.join(_BUILD_ATTENTION)}; got {attention!r}",
            field="attention",
        )
    if implementation == "sdpa" and not getattr(cls, "_supports_sdpa", True):
        return "eager"
    return implementation
