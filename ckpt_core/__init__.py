"""ckpt_core: decide and apply activation checkpointing for HuggingFace training.

Importing this package loads no torch, transformers, pydantic or FastAPI: the
functions that touch a model live in modules loaded on first use (see
`_LAZY`), so a worker or the service can resolve a plan in microseconds.
"""

from __future__ import annotations

import importlib
from typing import Any

from ckpt_core._configs.config_json import ConfigLimits, model_config_key
from ckpt_core._configs.model_config import ModelConfig, build_meta_model, load_model_config
from ckpt_core._configs.presets import PresetInfo, list_presets, load_preset
from ckpt_core._dry_run import MEASURE_FIELDS, DryRunReport, dry_run, measure_shape
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
from ckpt_core._memory.families import MODEL_TYPE_FAMILIES as ESTIMATE_FAMILIES
from ckpt_core._memory.families import MOE_MODEL_TYPES
from ckpt_core._plan import Plan, make_plan
from ckpt_core._planning.block_plan import BlockPlan
from ckpt_core._planning.gpus import GPUS, GpuSpec, lookup_gpu
from ckpt_core._planning.tiers import (
    AUTO_FULL_THRESHOLD_GB,
    AUTO_SELECTIVE_THRESHOLD_GB,
    GRANULARITIES,
    MAX_GPU_MEMORY_GB,
    TIER_SYNONYMS,
    TIERS,
    Granularity,
    PlanGranularity,
    Tier,
    TierLike,
    parse_tier,
)
from ckpt_core._planning.trainer_workload import workload_from_training_arguments
from ckpt_core._planning.training_args import (
    MIN_TRANSFORMERS,
    HookKind,
    PlanHookKind,
    installed_transformers_version,
)
from ckpt_core._planning.workload import (
    ATTENTIONS,
    COMPUTES,
    DTYPES,
    ENGINES,
    GRADIENTS,
    KBIT_PREPARATIONS,
    LOAD_PATHS,
    MAX_HEADROOM,
    MAX_HOST_MEMORY_GB,
    MAX_LORA_RANK,
    MAX_MICRO_BATCH,
    MAX_SEQ_LEN,
    MAX_WORLD_SIZE,
    METHODS,
    OFFLOADS,
    OPTIMIZERS,
    SDPA_BACKENDS,
    SHARDINGS,
    WEIGHT_STORAGES,
    Workload,
)
from ckpt_core._seed_api import describe_tier, resolve_gradient_checkpointing, resolve_granularity

# Public names whose modules import torch: loaded on first attribute access.
_LAZY: dict[str, str] = {
    "HookReport": "ckpt_core._hooks.install",
    "install_checkpoint_hooks": "ckpt_core._hooks.install",
    "install_selective_hooks": "ckpt_core._hooks.install",
    "remove_checkpoint_hooks": "ckpt_core._hooks.install",
    "is_hf_checkpointing_enabled": "ckpt_core._hooks.install",
    "find_blocks": "ckpt_core._hooks.blocks",
    "measure_activation_bytes": "ckpt_core._meta.measure",
    "find_attention": "ckpt_core._hooks.blocks",
    "Answer": "ckpt_core.client",
    "CkptClient": "ckpt_core.client",
    "ServiceRequestError": "ckpt_core.client",
    "ServiceUnavailableError": "ckpt_core.client",
    "CheckpointPlanCallback": "ckpt_core.integrations.hf",
    "Conflict": "ckpt_core.integrations.hf",
    "PlanConflictWarning": "ckpt_core.integrations.hf",
    "apply_plan": "ckpt_core.integrations.hf",
    "merge_training_arguments": "ckpt_core.integrations.hf",
    "remove_hooks": "ckpt_core.integrations.hf",
}

__all__ = [
    "ATTENTIONS",
    "AUTO_FULL_THRESHOLD_GB",
    "AUTO_SELECTIVE_THRESHOLD_GB",
    "COMPUTES",
    "DTYPES",
    "ENGINES",
    "ESTIMATE_FAMILIES",
    "GPUS",
    "GRADIENTS",
    "GRANULARITIES",
    "KBIT_PREPARATIONS",
    "LOAD_PATHS",
    "MAX_GPU_MEMORY_GB",
    "MAX_HEADROOM",
    "MAX_HOST_MEMORY_GB",
    "MAX_LORA_RANK",
    "MAX_MICRO_BATCH",
    "MAX_SEQ_LEN",
    "MAX_WORLD_SIZE",
    "MEASURE_FIELDS",
    "METHODS",
    "MIN_TRANSFORMERS",
    "MOE_MODEL_TYPES",
    "OFFLOADS",
    "OPTIMIZERS",
    "SDPA_BACKENDS",
    "SHARDINGS",
    "TIERS",
    "TIER_SYNONYMS",
    "WEIGHT_STORAGES",
    "Answer",
    "BlockPlan",
    "CheckpointConflictError",
    "CheckpointPlanCallback",
    "CkptClient",
    "CkptError",
    "ConfigLimits",
    "ConfigTooLargeError",
    "Conflict",
    "DryRunReport",
    "GpuSpec",
    "Granularity",
    "HookKind",
    "HookReport",
    "InvalidGpuMemoryError",
    "InvalidGranularityError",
    "InvalidTierError",
    "InvalidWorkloadError",
    "ModelConfig",
    "ModelConfigError",
    "Plan",
    "PlanConflictWarning",
    "PlanGranularity",
    "PlanHookKind",
    "PresetInfo",
    "ServiceRequestError",
    "ServiceUnavailableError",
    "Tier",
    "TierLike",
    "UnknownGpuError",
    "UnknownPresetError",
    "UnsupportedTransformersVersionError",
    "Workload",
    "apply_plan",
    "build_meta_model",
    "describe_tier",
    "dry_run",
    "find_attention",
    "find_blocks",
    "install_checkpoint_hooks",
    "install_selective_hooks",
    "installed_transformers_version",
    "is_hf_checkpointing_enabled",
    "list_presets",
    "load_model_config",
    "load_preset",
    "lookup_gpu",
    "make_plan",
    "measure_activation_bytes",
    "measure_shape",
    "merge_training_arguments",
    "model_config_key",
    "parse_tier",
    "remove_checkpoint_hooks",
    "remove_hooks",
    "resolve_gradient_checkpointing",
    "resolve_granularity",
    "workload_from_training_arguments",
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
