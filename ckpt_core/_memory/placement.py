"""Which blocks carry an assignment's modes: from counts per kind to a `BlockPlan`.

FLOPs and the kept activations depend only on how many blocks of each kind take
each mode (`ckpt_core._memory.activations`), so the search chooses counts and
this module places them, one placement per count:

- when nothing is selective and the full blocks can be exactly the set HF's
  ``every_n_layers=N`` checkpoints (the same count of full blocks of each kind
  under HF's cross-stack counter), that set, so HF can do the plan natively;
- otherwise, per kind, the full blocks spread evenly over that kind's blocks,
  then the selective ones spread evenly over the rest.

Where the full blocks sit changes the allocated peak: the backward reaches the
last block first, and a block recomputed after an unchecked one has freed its
kept storages holds no more than they did (`transient.worst_block_backward`).
Spreading them from the first block leaves the last one unchecked, and keeps
the recomputed blocks away from each other in the backward pass, as
``every_n_layers`` does.  Pure Python.
"""

from __future__ import annotations

import functools

from ckpt_core._memory.activations import ModeCounts, block_layout
from ckpt_core._memory.arch import Arch, BlockKind
from ckpt_core._memory.ledger import BlockMode
from ckpt_core._planning.block_plan import BlockPlan, every_n_set


def hf_blocks(arch: Arch) -> int:
    """How many blocks HF counts: every stack's, a vision tower's included."""
    layout = block_layout(arch)
    return layout[-1][0] + 1 if layout else 0


def place(arch: Arch, counts: ModeCounts) -> BlockPlan:
    """The blocks of a block-level plan with these counts."""
    full = {kind: n for (mode, kind), n in counts if mode == "full" and n}
    selective = {kind: n for (mode, kind), n in counts if mode == "selective" and n}
    total = hf_blocks(arch)
    if not selective:
        native = _native(arch, tuple(sorted(full.items(), key=_kind_key)))
        if native is not None:
            return BlockPlan(total, every_n_set(total, native), (), every_n_layers=native)
    chosen_full: list[int] = []
    chosen_selective: list[int] = []
    for kind, counters in _counters_by_kind(arch).items():
        picked = _spread(counters, full.get(kind, 0))
        rest = [c for c in counters if c not in set(picked)]
        chosen_full += picked
        chosen_selective += _spread(rest, selective.get(kind, 0))
    return BlockPlan(total, tuple(sorted(chosen_full)), tuple(sorted(chosen_selective)))


@functools.lru_cache(maxsize=4096)
def _native(arch: Arch, full: tuple[tuple[BlockKind, int], ...]) -> int | None:
    """The N whose ``every_n_layers=N`` set has exactly these full counts per kind."""
    layout = block_layout(arch)
    wanted = dict(full)
    for n in range(2, hf_blocks(arch) + 1):
        got: dict[BlockKind, int] = {}
        for counter, _, _, kind in layout:
            if counter % n == 0:
                got[kind] = got.get(kind, 0) + 1
        if got == wanted:
            return n
    return None


def placed_modes(arch: Arch, counts: ModeCounts) -> tuple[BlockMode, ...]:
    """The mode of every block in module order once ``counts`` is placed (`place`)."""
    plan = place(arch, counts)
    full, selective = set(plan.full), set(plan.selective)
    return tuple(
        "full" if counter in full else "selective" if counter in selective else "off"
        for counter, _, _, _ in block_layout(arch)
    )


def _counters_by_kind(arch: Arch) -> dict[BlockKind, list[int]]:
    by_kind: dict[BlockKind, list[int]] = {}
    for counter, _, _, kind in block_layout(arch):
        by_kind.setdefault(kind, []).append(counter)
    return by_kind


def _spread(items: list[int], k: int) -> list[int]:
    """``k`` of ``items``, evenly spaced, the first one included."""
    n = len(items)
    return [items[(i * n) // k] for i in range(k)]


def _kind_key(item: tuple[BlockKind, int]) -> tuple[bool, ...]:
    kind = item[0]
    return (kind.sliding, kind.moe, kind.decoder_stack, kind.first_in_stack)
