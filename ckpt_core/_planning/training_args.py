"""HuggingFace ``TrainingArguments`` kwargs that make the Trainer do exactly a tier.

Release boundaries, read from the published transformers wheels:

- 4.35.0: ``gradient_checkpointing_kwargs`` appears.  Older releases cannot ask
  for non-reentrant checkpointing, so they are refused.
- 5.16.0: the Trainer pops ``every_n_layers`` from the kwargs and passes it to
  ``gradient_checkpointing_enable``; before that "medium" needs our hooks.
- 5.23.0: ``activation_checkpointing`` / ``activation_checkpointing_kwargs``
  become the field names; ``gradient_checkpointing*`` are deprecated aliases
  that emit a FutureWarning.

Pre-releases count as the release before (``5.16.0.dev0`` < ``5.16.0``): the
older behaviour is always correct there, only possibly less native.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Final, Literal

from ckpt_core._errors import InvalidGranularityError, UnsupportedTransformersVersionError
from ckpt_core._planning.block_plan import BlockPlan
from ckpt_core._planning.tiers import PlanGranularity

Version = tuple[int, int, int]

MIN_TRANSFORMERS: Final[Version] = (4, 35, 0)
EVERY_N_LAYERS_SINCE: Final[Version] = (5, 16, 0)
ACTIVATION_NAMES_SINCE: Final[Version] = (5, 23, 0)
# Rotary embeddings multiply the positions by the inverse frequencies since 5.19; before,
# `inv_freq @ position_ids` was the forward's first cuBLAS call (its workspace).
ROTARY_MUL_SINCE: Final[Version] = (5, 19, 0)

_VERSION_RE: Final = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?(.*?)\s*$", re.ASCII)

# The hooks a worker installs for a tier (the public name, in the service's schema) ...
HookKind = Literal["medium", "selective"]
# ... or for any plan: a block-level plan's block set is "blocks".
PlanHookKind = Literal["medium", "selective", "blocks"]


@dataclass(frozen=True, slots=True)
class TrainerSettings:
    """The TrainingArguments kwargs for a tier and the hooks the worker still owes."""

    training_arguments: dict[str, Any]
    hooks: PlanHookKind | None


def parse_transformers_version(text: object, *, field: str = "transformers_version") -> Version:
    """Parse ``"5.24.0"``, ``"4.57"``, ``"5.23.0.dev0"`` into a comparable triple.

    A pre-release / dev suffix maps to the previous patch release so that a
    boundary's own pre-releases are treated as not having the new feature.
    """
    if not isinstance(text, str):
        raise UnsupportedTransformersVersionError(
            f"{field} must be a version string such as '5.24.0', got {text!r}", field=field
        )
    match = _VERSION_RE.match(text)
    if match is None:
        raise UnsupportedTransformersVersionError(
            f"{field} {text!r} is not a version such as '5.24.0'", field=field
        )
    major, minor, patch, suffix = match.groups()
    version = (int(major), int(minor), int(patch or 0))
    if _is_pre_release(suffix):
        return _previous(version)
    if suffix and not suffix.startswith(("+", ".post", "post")):
        raise UnsupportedTransformersVersionError(
            f"{field} {text!r} is not a version such as '5.24.0'", field=field
        )
    return version


def _is_pre_release(suffix: str) -> bool:
    return re.match(r"^[.\-_]?(dev|a|alpha|b|beta|rc|pre)\d*", suffix) is not None


def _previous(version: Version) -> Version:
    major, minor, patch = version
    if patch:
        return (major, minor, patch - 1)
    if minor:
        return (major, minor - 1, 999)
    return (major - 1, 999, 999)


@functools.cache
def installed_transformers_version() -> str | None:
    """The installed transformers version, read from metadata (no import of transformers).

    Looked up once per process: the metadata scan costs more than the rest of
    a `make_plan` call, and a running process keeps the transformers it
    imported.  ``importlib.metadata`` itself is slow to import: it loads here,
    on first use, not with ``import ckpt_core``.
    """
    from importlib import metadata

    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


def trainer_settings(
    granularity: PlanGranularity | None,
    transformers_version: Version,
    block_plan: BlockPlan | None = None,
) -> TrainerSettings:
    """Kwargs that make the HF Trainer checkpoint exactly `granularity`, no more.

    HF is turned explicitly off for off and selective: trainers such as TRL's
    SFTConfig default the flag to on, and selective hooks under HF's own full
    checkpointing would nest recomputation.  A block-level plan (``"blocks"``)
    is HF's when it is exactly ``every_n_layers=N`` and the release knows the
    kwarg, else HF off and the worker hooks its block set.
    """
    if (granularity == "blocks") != (block_plan is not None):
        raise InvalidGranularityError(
            "a block plan goes with granularity 'blocks', and only with it",
            field="block_plan",
        )
    if transformers_version < MIN_TRANSFORMERS:
        raise UnsupportedTransformersVersionError(
            f"transformers {_format(transformers_version)} is too old: non-reentrant "
            f"checkpointing kwargs need >= {_format(MIN_TRANSFORMERS)}",
            field="transformers_version",
        )
    on_key, kwargs_key = _field_names(transformers_version)
    non_reentrant: dict[str, Any] = {"use_reentrant": False}
    if granularity == "full":
        return TrainerSettings({on_key: True, kwargs_key: non_reentrant}, hooks=None)
    every_n = 2 if granularity == "medium" else block_plan and block_plan.every_n_layers
    if every_n and transformers_version >= EVERY_N_LAYERS_SINCE:
        return TrainerSettings(
            {on_key: True, kwargs_key: {**non_reentrant, "every_n_layers": every_n}}, hooks=None
        )
    hooks: PlanHookKind | None = granularity  # medium on old releases, selective, or blocks
    return TrainerSettings({on_key: False}, hooks=hooks)


def _field_names(version: Version) -> tuple[str, str]:
    if version >= ACTIVATION_NAMES_SINCE:
        return "activation_checkpointing", "activation_checkpointing_kwargs"
    return "gradient_checkpointing", "gradient_checkpointing_kwargs"


def _format(version: Version) -> str:
    return ".".join(str(part) for part in version)
