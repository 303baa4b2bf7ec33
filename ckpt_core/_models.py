"""Model configs: validate a preset or an inline HF ``config.json``, size it, build it on meta.

`load_model_config` turns ``{"preset": NAME}`` or ``{"config": {...}}`` into a
`ModelConfig` in this order, so that nothing expensive runs on hostile input:

1. one walk over the raw dict: JSON types only, nesting depth, a node budget
   (no hang on a huge dict), remote-code markers (``auto_map``), HF's own
   checkpointing switched on (``gradient_checkpointing``: the tier decides),
   and every size field (layers, widths, vocabulary, experts) a positive int
   in bounds;
2. ``model_type`` known to the installed transformers;
3. the ``PretrainedConfig`` built from the dict (pure Python, no network);
4. an analytic parameter count and the MoE expert instances, checked against
   their bounds.

Only then may `build_meta_model` construct the model, on ``torch.device("meta")``:
no weights, no download, never remote code; the built model's parameter count
is checked again.  This module imports torch and
transformers inside functions only, so importing it is cheap.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Final, Literal

from ckpt_core._errors import ConfigTooLargeError, ModelConfigError
from ckpt_core._model_size import count_parameters, estimate_parameters, expert_instances
from ckpt_core._presets import canonical_preset_name, load_preset

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedConfig

Source = Literal["preset", "config"]

# Keys that make transformers import code from a model repository.
REMOTE_CODE_KEYS: Final = frozenset({"auto_map", "trust_remote_code"})
# A truthy value turns HF's own checkpointing on when the model is built
# (``PreTrainedModel._backward_compatibility_gradient_checkpointing``; old
# checkpoints saved it in config.json), which the tier's plan would contradict.
HF_CHECKPOINTING_KEYS: Final = frozenset({"gradient_checkpointing"})

# Size fields, under the names the supported families use, each bounded by a
# ConfigLimits attribute (see _SIZE_FIELDS).  null means "the class default".
# fmt: off
_LAYER_FIELDS: Final = (
    "num_hidden_layers", "num_layers", "n_layer", "n_layers", "num_decoder_layers",
    "encoder_layers", "decoder_layers",
)
_WIDTH_FIELDS: Final = (
    "hidden_size", "d_model", "n_embd", "intermediate_size", "d_ff", "n_inner", "ffn_dim",
    "encoder_ffn_dim", "decoder_ffn_dim", "ffn_hidden_size", "moe_intermediate_size",
    "shared_expert_intermediate_size", "head_dim", "d_kv", "num_attention_heads",
    "num_key_value_heads", "n_head", "num_heads", "num_kv_heads", "encoder_attention_heads",
    "decoder_attention_heads", "q_lora_rank", "kv_lora_rank",
)
_EXPERT_FIELDS: Final = (
    "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts",
    "num_experts_per_tok", "n_shared_experts",
)
# fmt: on
_SIZE_FIELDS: Final[dict[str, str]] = {
    **dict.fromkeys(_LAYER_FIELDS, "max_layers"),
    **dict.fromkeys(_WIDTH_FIELDS, "max_hidden_size"),
    "vocab_size": "max_vocab_size",
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx"), "max_positions"),
    **dict.fromkeys(_EXPERT_FIELDS, "max_experts"),
}
# Expert counts may be 0 (a dense model in an MoE config class); sizes may not.
_ZERO_ALLOWED: Final = frozenset(_EXPERT_FIELDS)

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
class ConfigLimits:
    """Bounds a config must stay within before anything is built.

    The defaults admit every released dense model and the 671B-1T MoE models;
    the service overrides them from its settings.
    """

    max_layers: int = 512
    max_hidden_size: int = 65_536
    max_vocab_size: int = 1_048_576
    max_experts: int = 1_024
    max_positions: int = 1 << 24  # 16M tokens; Llama-4-Scout declares 10M
    max_parameters: int = 2_000_000_000_000
    # MoE layers x experts: bounds the modules a build creates where experts are
    # separate modules (~1 s per 5k).  DeepSeek-V3: 14,848; Kimi-K2: 23,040.
    max_expert_instances: int = 65_536
    max_config_bytes: int = 256 * 1024
    max_depth: int = 8

    def __post_init__(self) -> None:
        for name in self.__slots__:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ConfigLimits.{name} must be a positive int, got {value!r}")


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
    source, value = _split_model(model)
    if source == "preset":
        config = load_preset(value)
        name = canonical_preset_name(value)
        try:
            return _validated(config, limits, source="preset", preset=name)
        except ModelConfigError as exc:  # the caller named a preset, not its fields
            raise type(exc)(f"preset {value!r}: {exc.message}", field="model.preset") from exc
    return _validated(value, limits, source="config", preset=None)


def canonical_json(config: Mapping[str, Any]) -> str:
    """Sorted keys, no whitespace: equal configs give equal text (and `ModelConfig.key`)."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _split_model(model: object) -> tuple[Source, Any]:
    if not isinstance(model, Mapping) or len(model) != 1 or not {"preset", "config"} & set(model):
        raise ModelConfigError(
            'model must be an object with exactly one key: {"preset": NAME} or '
            '{"config": {...HF config.json content...}}',
            field="model",
        )
    ((source, value),) = model.items()
    return source, value


def _validated(
    config: object, limits: ConfigLimits, *, source: Source, preset: str | None
) -> ModelConfig:
    import hashlib  # loads OpenSSL (~10 ms): on the first validation, not with ckpt_core

    if not isinstance(config, Mapping):
        raise ModelConfigError(
            f"model.config must be an object (the content of config.json), got "
            f"{type(config).__name__}",
            field="model.config",
        )
    _Walker(limits).walk(config, "model.config", depth=1)
    text = canonical_json(config)
    encoded = text.encode()
    if len(encoded) > limits.max_config_bytes:
        raise ConfigTooLargeError(
            f"config is {len(encoded)} bytes as JSON; the limit is {limits.max_config_bytes}",
            field="model.config",
        )
    canonical: dict[str, Any] = json.loads(text)  # a private deep copy
    model_type = _check_model_types(canonical, "model.config")
    hf_config = hf_config_from_dict(canonical)
    approx = estimate_parameters(hf_config)
    _check_parameters(approx, limits, "estimated from the config")
    _check_expert_instances(hf_config, limits)
    return ModelConfig(
        source=source,
        preset=preset,
        config=canonical,
        model_type=model_type,
        architecture=_model_class(hf_config, canonical.get("architectures")).__name__,
        key=hashlib.sha256(encoded).hexdigest(),
        approx_parameters=approx,
    )


class _Walker:
    """One pass over the raw config: types, depth, node budget, remote code, size fields."""

    def __init__(self, limits: ConfigLimits) -> None:
        self.limits = limits
        self.budget = limits.max_config_bytes  # every node costs >= 1 byte of JSON

    def walk(self, value: object, path: str, depth: int) -> None:
        self.budget -= 1
        if self.budget < 0:
            raise ConfigTooLargeError(
                f"config has more than {self.limits.max_config_bytes} values; "
                f"the limit is {self.limits.max_config_bytes} bytes of JSON",
                field="model.config",
            )
        if depth > self.limits.max_depth:
            raise ConfigTooLargeError(
                f"{path} is nested deeper than {self.limits.max_depth} levels", field=path
            )
        if isinstance(value, Mapping):
            self._walk_mapping(value, path, depth)
        elif isinstance(value, list | tuple):
            for index, item in enumerate(value):
                self.walk(item, f"{path}[{index}]", depth + 1)
        elif isinstance(value, float) and not math.isfinite(value):
            raise ModelConfigError(f"{path} is {value!r}: not valid JSON", field=path)
        elif value is not None and not isinstance(value, str | int | float):
            raise ModelConfigError(
                f"{path} must be JSON (object, array, string, number, bool, null), "
                f"got {type(value).__name__}",
                field=path,
            )

    def _walk_mapping(self, mapping: Mapping[Any, Any], path: str, depth: int) -> None:
        for key, item in mapping.items():
            if not isinstance(key, str):
                raise ModelConfigError(f"{path} has a non-string key {key!r}", field=path)
            child = f"{path}.{key}"
            if key in REMOTE_CODE_KEYS:
                raise ModelConfigError(
                    f"{child} asks for code from a model repository; remote code is never "
                    "run here: remove it and use a model_type transformers ships",
                    field=child,
                )
            if key in HF_CHECKPOINTING_KEYS and item:  # HF tests truthiness: "false" is on
                raise ModelConfigError(
                    f"{child}={item!r} turns HF's own checkpointing on when the model is built; "
                    f"the tier decides checkpointing: remove {key!r} (false / null are accepted)",
                    field=child,
                )
            if key in _SIZE_FIELDS:
                self._check_size(key, item, child)
            self.walk(item, child, depth + 1)

    def _check_size(self, key: str, value: object, path: str) -> None:
        if value is None:
            return
        if isinstance(value, list):  # per-layer sizes
            for index, item in enumerate(value):
                self._check_size(key, item, f"{path}[{index}]")
            return
        minimum = 0 if key in _ZERO_ALLOWED else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ModelConfigError(
                f"{path} must be an integer >= {minimum}, got {value!r}", field=path
            )
        limit_name = _SIZE_FIELDS[key]
        limit = getattr(self.limits, limit_name)
        if value > limit:
            raise ConfigTooLargeError(
                f"{path}={value} is over the limit {limit} ({limit_name})", field=path
            )


def _check_model_types(config: Mapping[str, Any], path: str) -> str:
    """The config's ``model_type`` (and every nested one) must be known to transformers."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = config.get("model_type")
    field = f"{path}.model_type"
    if not isinstance(model_type, str) or not model_type:
        raise ModelConfigError(
            f"{field} is required: a model type such as 'llama', got {model_type!r}", field=field
        )
    if model_type not in CONFIG_MAPPING:
        raise ModelConfigError(
            f"{field} {model_type!r} is not known to the installed transformers; "
            "only model types it ships are supported (no remote code)",
            field=field,
        )
    for key, value in config.items():
        if isinstance(value, Mapping) and "model_type" in value:
            _check_model_types(value, f"{path}.{key}")
    return model_type


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
