"""Tier vocabulary: parse what callers pass, resolve ``auto`` without a model.

A tier is what a training config says (``True``, ``"medium"``, ``"auto"``...);
a granularity is what actually gets checkpointed (``"full"``, ``"medium"``,
``"selective"`` or ``None`` for off).  Parsing is strict: the seed silently
mapped typos such as ``"fulll"`` to "off", and the job died hours later.
"""

from __future__ import annotations

import math
from typing import Final, Literal

from ckpt_core._errors import InvalidGpuMemoryError, InvalidTierError

Tier = Literal["off", "full", "medium", "selective", "auto"]
Granularity = Literal["full", "medium", "selective"]
# What a plan checkpoints: a tier's granularity, or a block-level plan (``auto`` with a model).
PlanGranularity = Literal["full", "medium", "selective", "blocks"]
TierLike = bool | str | None

# A concrete tier names what to checkpoint (every tier but auto, which chooses one).
ConcreteTier = Literal["off", "selective", "medium", "full"]

TIERS: Final[tuple[Tier, ...]] = ("off", "full", "medium", "selective", "auto")
GRANULARITIES: Final[tuple[Granularity, ...]] = ("full", "medium", "selective")
# Least recompute first for a typical model (the estimate answers each of them).
CONCRETE_TIERS: Final[tuple[ConcreteTier, ...]] = ("off", "selective", "medium", "full")

# Seed thresholds for ``auto`` without a model, in GiB (2**30 bytes) of GPU
# memory as torch reports it.  Tuned for a 7-8B LoRA run at bf16 + 4-bit
# weights + ~4k tokens: below 24 -> full, 24..80 -> medium, above 80 -> selective.
AUTO_FULL_THRESHOLD_GB: Final = 24.0
AUTO_SELECTIVE_THRESHOLD_GB: Final = 80.0

# No single accelerator is anywhere near this; a bigger number is a unit
# mistake (bytes or MiB passed as GiB), not a GPU.
MAX_GPU_MEMORY_GB: Final = 4096.0

TIER_SYNONYMS: Final[dict[str, Tier]] = {
    "": "off",
    "off": "off",
    "none": "off",
    "false": "off",
    "full": "full",
    "true": "full",
    "medium": "medium",
    "selective": "selective",
    "auto": "auto",
}

_VALID_HELP: Final = (
    "valid tiers: off (also false, none, empty), full (also true), medium, selective, auto; "
    "or a bool / None"
)


def parse_tier(tier: object) -> Tier:
    """Return the canonical tier for a bool / None / str, or raise `InvalidTierError`.

    Strings are trimmed and case-insensitive.  Anything else - ints, floats,
    typos - is an error naming the valid tiers, never a silent "off".
    """
    if tier is None or tier is False:
        return "off"
    if tier is True:
        return "full"
    if not isinstance(tier, str):
        raise InvalidTierError(
            f"tier must be a bool, None or a string, got {type(tier).__name__} {tier!r}; "
            + _VALID_HELP,
            field="tier",
        )
    canonical = TIER_SYNONYMS.get(tier.strip().casefold())
    if canonical is None:
        raise InvalidTierError(f"unknown tier {tier!r}; {_VALID_HELP}", field="tier")
    return canonical


def validate_gpu_memory_gb(gpu_memory_gb: object, *, field: str = "gpu_memory_gb") -> float | None:
    """Return GPU memory in GiB as a float, ``None`` when unknown; reject anything else.

    Must be a real number (not a bool), finite, > 0 and at most `MAX_GPU_MEMORY_GB`.
    """
    if gpu_memory_gb is None:
        return None
    if isinstance(gpu_memory_gb, bool) or not isinstance(gpu_memory_gb, int | float):
        raise InvalidGpuMemoryError(
            f"{field} must be a number of GiB, got {type(gpu_memory_gb).__name__} "
            f"{gpu_memory_gb!r}",
            field=field,
        )
    value = float(gpu_memory_gb)
    if not math.isfinite(value) or value <= 0:
        raise InvalidGpuMemoryError(
            f"{field} must be a finite number > 0 (GiB), got {gpu_memory_gb!r}", field=field
        )
    if value > MAX_GPU_MEMORY_GB:
        raise InvalidGpuMemoryError(
            f"{field}={gpu_memory_gb!r} GiB is larger than any single GPU "
            f"(limit {MAX_GPU_MEMORY_GB:.0f}); pass GiB, not bytes or MiB",
            field=field,
        )
    return value


def auto_granularity_by_memory(gpu_memory_gb: float | None) -> Granularity:
    """The seed's VRAM-threshold rule for ``auto`` when no model is known."""
    if gpu_memory_gb is None or gpu_memory_gb < AUTO_FULL_THRESHOLD_GB:
        return "full"
    if gpu_memory_gb <= AUTO_SELECTIVE_THRESHOLD_GB:
        return "medium"
    return "selective"


def granularity_for(tier: Tier, gpu_memory_gb: float | None) -> Granularity | None:
    """Granularity of a parsed tier; ``auto`` uses the memory thresholds."""
    if tier == "off":
        return None
    if tier == "auto":
        return auto_granularity_by_memory(gpu_memory_gb)
    return tier


def describe(tier: Tier, gpu_memory_gb: float | None) -> str:
    """The seed's human-readable description of a parsed tier (same strings)."""
    if tier == "off":
        return "off"
    if tier == "full":
        return "full (every block)"
    if tier == "medium":
        return "medium (every other block)"
    if tier == "selective":
        return "selective (attention only)"
    chosen = auto_granularity_by_memory(gpu_memory_gb)
    if gpu_memory_gb is None:
        return f"auto → {chosen} (unknown VRAM)"
    return f"auto → {chosen} (VRAM {gpu_memory_gb:.0f}GB)"
