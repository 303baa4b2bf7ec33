"""The seed module's public functions, same names and signatures, fixed answers.

Workers already call these; they keep working.  Differences from the seed are
the fixes of docs/design.md §7: strict tier parsing, validated GPU memory,
kwargs that make the Trainer do exactly the tier, current field names.
"""

from __future__ import annotations

from typing import Any

from ckpt_core._plan import make_plan, resolve_gpu_memory
from ckpt_core._planning.tiers import Granularity, TierLike, describe, granularity_for, parse_tier


def resolve_granularity(
    tier: TierLike, gpu_memory_gb: float | None = None, *, gpu: str | None = None
) -> Granularity | None:
    """The granularity to checkpoint: ``"full"`` | ``"medium"`` | ``"selective"`` | ``None``.

    ``"auto"`` resolves by GPU memory (GiB) or GPU name with the seed thresholds.
    """
    return granularity_for(parse_tier(tier), resolve_gpu_memory(gpu_memory_gb, gpu))


def resolve_gradient_checkpointing(
    tier: TierLike,
    gpu_memory_gb: float | None = None,
    *,
    gpu: str | None = None,
    transformers_version: str | None = None,
) -> dict[str, Any]:
    """``TrainingArguments(**kwargs)`` kwargs that make the HF Trainer do exactly the tier.

    Field names follow `transformers_version` (default: the installed one).
    For selective (and medium on releases without ``every_n_layers``) HF is
    off and the worker must install hooks: see `make_plan` for which.
    """
    plan = make_plan(tier, gpu_memory_gb, gpu=gpu, transformers_version=transformers_version)
    return plan.training_arguments


def describe_tier(
    tier: TierLike, gpu_memory_gb: float | None = None, *, gpu: str | None = None
) -> str:
    """A short human-readable description of the tier (the seed's strings)."""
    return describe(parse_tier(tier), resolve_gpu_memory(gpu_memory_gb, gpu))
