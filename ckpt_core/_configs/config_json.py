"""A model config as JSON: the cheap checks, its canonical form and its key.

Steps 1 and 2 of `ckpt_core._configs.model_config.load_model_config`, which need nothing but
the JSON and transformers' list of model types:

1. one walk over the raw dict: JSON types only, nesting depth, a node budget
   (no hang on a huge dict), remote-code markers (``auto_map``), HF's own
   checkpointing switched on (``gradient_checkpointing``: the tier decides),
   and every size field (layers, widths, vocabulary, experts) a positive int
   in bounds;
2. ``model_type`` known to the installed transformers (its name list only:
   no config class is imported).

Apart from the rest because they are cheap (tens of microseconds for a
typical config) and identify a config: `model_config_key` is how the service
keys its report cache without building a transformers config.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, Literal

from ckpt_core._configs.presets import canonical_preset_name, load_preset
from ckpt_core._errors import ConfigTooLargeError, ModelConfigError

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
    # separate modules (build time grows with them).  DeepSeek-V3: 14,848; Kimi-K2: 23,040.
    max_expert_instances: int = 65_536
    max_config_bytes: int = 256 * 1024
    max_depth: int = 8

    def __post_init__(self) -> None:
        for name in self.__slots__:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ConfigLimits.{name} must be a positive int, got {value!r}")


def model_config_key(model: object, *, limits: ConfigLimits | None = None) -> str:
    """`load_model_config(model).key`, after only its cheap checks (steps 1 and 2).

    Identifies a config without building the transformers config (pure
    Python that holds the GIL for milliseconds): the service keys its report cache with this in
    the event loop's process, and leaves the rest of the checks to its worker
    (whose `load_model_config` runs them all before anything is built).
    Raises as `load_model_config` does for what these steps check.
    """
    return check_config_json(model, limits or ConfigLimits()).key


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


@dataclass(frozen=True, slots=True)
class CheckedConfig:
    """A config past steps 1 and 2: canonical, bounded, of a model type transformers ships."""

    source: Source
    preset: str | None  # the canonical preset name
    asked_preset: str | None  # the name as the caller wrote it: errors quote it
    config: dict[str, Any]  # a private deep copy, keys sorted
    model_type: str
    key: str  # sha256 of the canonical JSON


def check_config_json(model: object, limits: ConfigLimits) -> CheckedConfig:
    source, value = _split_model(model)
    if source == "preset":
        config, preset, asked = load_preset(value), canonical_preset_name(value), value
    else:
        config, preset, asked = value, None, None
    with blamed_on_preset(asked):
        canonical, encoded, model_type = _canonical_config(config, limits)
    import hashlib  # loads OpenSSL: on the first validation, not with ckpt_core

    return CheckedConfig(
        source, preset, asked, canonical, model_type, hashlib.sha256(encoded).hexdigest()
    )


@contextmanager
def blamed_on_preset(asked: str | None) -> Iterator[None]:
    """Errors in a preset's fields name the preset: the caller named it, not its fields."""
    if asked is None:
        yield
        return
    try:
        yield
    except ModelConfigError as exc:
        raise type(exc)(f"preset {asked!r}: {exc.message}", field="model.preset") from exc


def _canonical_config(config: object, limits: ConfigLimits) -> tuple[dict[str, Any], bytes, str]:
    """Steps 1 and 2: (a private canonical copy, its JSON bytes, its model type)."""
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
    return canonical, encoded, _check_model_types(canonical, "model.config")


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
