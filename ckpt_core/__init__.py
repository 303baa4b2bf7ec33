"""ckpt_core: decide and apply activation checkpointing for HuggingFace training.

Importing this package loads no torch, transformers, pydantic or FastAPI: the
functions that touch a model live in modules loaded on first use (see
`_LAZY`), so a worker or the service can resolve a plan in microseconds.
"""

from __future__ import annotations

import importlib
from typing import Any

from ckpt_core._dry_run import DryRunReport, dry_run
from ckpt_core._errors import (
    CheckpointConflictError,
    CkptError,
    ConfigTooLargeError,
    InvalidGpuMemoryError,
    InvalidGranularityError,
    InvalidTierError,
    InvalidWorkloadError,
    ModelConfigError,
    UnknownGpuError,
    UnknownPresetError,
    UnsupportedTransformersVersionError,
)
from ckpt_core._gpus import GPUS, GpuSpec, lookup_gpu
from ckpt_core._models import ConfigLimits, ModelConfig, build_meta_model, load_model_config
from ckpt_core._plan import Plan, make_plan
from ckpt_core._presets import PresetInfo, list_presets, load_preset
from ckpt_core._seed_api import describe_tier, resolve_gradient_checkpointing, resolve_granularity
from ckpt_core._tiers import (
    AUTO_FULL_THRESHOLD_GB,
    AUTO_SELECTIVE_THRESHOLD_GB,
    GRANULARITIES,
    TIERS,
    Granularity,
    Tier,
    TierLike,
    parse_tier,
)
from ckpt_core._workload import Workload

# Public names whose modules import torch: loaded on first attribute access.
_LAZY: dict[str, str] = {
    "HookReport": "ckpt_core._hooks",
    "install_checkpoint_hooks": "ckpt_core._hooks",
    "install_selective_hooks": "ckpt_core._hooks",
    "remove_checkpoint_hooks": "ckpt_core._hooks",
    "is_hf_checkpointing_enabled": "ckpt_core._hooks",
}

__all__ = [
    "AUTO_FULL_THRESHOLD_GB",
    "AUTO_SELECTIVE_THRESHOLD_GB",
    "GPUS",
    "GRANULARITIES",
    "TIERS",
    "CheckpointConflictError",
    "CkptError",
    "ConfigLimits",
    "ConfigTooLargeError",
    "DryRunReport",
    "GpuSpec",
    "Granularity",
    "HookReport",
    "InvalidGpuMemoryError",
    "InvalidGranularityError",
    "InvalidTierError",
    "InvalidWorkloadError",
    "ModelConfig",
    "ModelConfigError",
    "Plan",
    "PresetInfo",
    "Tier",
    "TierLike",
    "UnknownGpuError",
    "UnknownPresetError",
    "UnsupportedTransformersVersionError",
    "Workload",
    "build_meta_model",
    "describe_tier",
    "dry_run",
    "install_checkpoint_hooks",
    "install_selective_hooks",
    "is_hf_checkpointing_enabled",
    "list_presets",
    "load_model_config",
    "load_preset",
    "lookup_gpu",
    "make_plan",
    "parse_tier",
    "remove_checkpoint_hooks",
    "resolve_gradient_checkpointing",
    "resolve_granularity",
]


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'ckpt_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
