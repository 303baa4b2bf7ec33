"""A block-level plan: which blocks to checkpoint whole, and which blocks' attention.

Between the tiers: ``auto`` with a model may answer "checkpoint these k of the
L blocks, and the attention of those" (`ckpt_core._memory.search` chooses the
counts, `ckpt_core._memory.placement` the blocks).  Blocks are named by HF's
block counter: every block of every stack in module order, a vision tower
first - the counter HF's ``every_n_layers`` uses, so a plan means the same
blocks to the planner (which sees only the config), to HF and to the hooks
(which see the built model, wrapped or not).

``every_n_layers`` is set when ``full`` is exactly the set HF's
``every_n_layers=N`` checkpoints and nothing is selective: then HF can do the
plan natively on releases that know the kwarg.

Pure Python.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ckpt_core._errors import InvalidGranularityError

BLOCK_PLAN_KEYS: Final = ("blocks", "full", "selective", "every_n_layers")


@dataclass(frozen=True, slots=True)
class BlockPlan:
    """Blocks checkpointed whole (``full``) and by their attention (``selective``).

    ``blocks`` is how many blocks HF counts in the model (the plan is refused
    on a model with another count).
    """

    blocks: int
    full: tuple[int, ...]
    selective: tuple[int, ...] = ()
    every_n_layers: int | None = None

    def __post_init__(self) -> None:
        _check(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON: lists of block indices."""
        return {
            "blocks": self.blocks,
            "full": list(self.full),
            "selective": list(self.selective),
            "every_n_layers": self.every_n_layers,
        }

    @classmethod
    def from_value(cls, value: object, *, field: str = "block_plan") -> BlockPlan:
        """A `BlockPlan`, or one from `to_dict` output; anything else names ``field``."""
        if isinstance(value, BlockPlan):
            return value
        if not isinstance(value, Mapping):
            raise InvalidGranularityError(
                f"{field} must be an object with {', '.join(BLOCK_PLAN_KEYS)}", field=field
            )
        unknown = sorted(set(value) - set(BLOCK_PLAN_KEYS))
        if unknown or "blocks" not in value or "full" not in value:
            raise InvalidGranularityError(
                f"{field} needs blocks and full (optional: selective, every_n_layers); "
                f"got keys {sorted(value)}",
                field=field,
            )
        return cls(
            blocks=_int(value["blocks"], f"{field}.blocks"),
            full=_indices(value["full"], f"{field}.full"),
            selective=_indices(value.get("selective", ()), f"{field}.selective"),
            every_n_layers=(
                None
                if value.get("every_n_layers") is None
                else _int(value["every_n_layers"], f"{field}.every_n_layers")
            ),
        )


def every_n_set(blocks: int, n: int) -> tuple[int, ...]:
    """The counters HF's ``every_n_layers=n`` checkpoints among ``blocks``."""
    return tuple(range(0, blocks, n))


def _check(plan: BlockPlan) -> None:
    if isinstance(plan.blocks, bool) or not isinstance(plan.blocks, int) or plan.blocks < 1:
        raise InvalidGranularityError(
            f"block_plan.blocks must be a positive integer, got {plan.blocks!r}",
            field="block_plan.blocks",
        )
    for name in ("full", "selective"):
        indices = getattr(plan, name)
        if list(indices) != sorted(set(indices)) or any(not 0 <= i < plan.blocks for i in indices):
            raise InvalidGranularityError(
                f"block_plan.{name} must list distinct block indices in 0..{plan.blocks - 1}, "
                f"ascending; got {list(indices)}",
                field=f"block_plan.{name}",
            )
    both = set(plan.full) & set(plan.selective)
    if both:
        raise InvalidGranularityError(
            f"blocks {sorted(both)} are both full and selective", field="block_plan.selective"
        )
    if plan.every_n_layers is not None and (
        plan.selective or plan.full != every_n_set(plan.blocks, plan.every_n_layers)
    ):
        raise InvalidGranularityError(
            f"every_n_layers={plan.every_n_layers} does not pick the full blocks "
            f"{list(plan.full)} of {plan.blocks}",
            field="block_plan.every_n_layers",
        )


def _int(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidGranularityError(f"{field} must be a positive integer", field=field)
    return value


def _indices(value: object, field: str) -> tuple[int, ...]:
    if not isinstance(value, list | tuple) or any(
        isinstance(i, bool) or not isinstance(i, int) for i in value
    ):
        raise InvalidGranularityError(f"{field} must be a list of block indices", field=field)
    return tuple(value)
