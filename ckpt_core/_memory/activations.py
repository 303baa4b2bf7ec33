"""Closed-form activation bytes per checkpointing tier (docs/design.md §5).

Same definition as the meta measurement (`ckpt_core._meta.measure`): the
unique storages autograd keeps at the end of one training forward with
labels, parameters excluded.  Each family writes its forward down op by op as
a `Ledger` of kept storages per block kind and `BlockMode` (see
`ckpt_core._memory.families`); this module composes them for a tier.

A tier assigns a mode to every block: off -> off; selective -> selective;
full -> full; medium -> full for every other block counted across stacks from
0 (HF's ``every_n_layers=2``), off otherwise.  The total is the embedding and
head scopes, plus each block's own storages, plus the storages shared by all
blocks (cos / sin, masks, ids) once.

Pure arithmetic.
"""

from __future__ import annotations

import functools

from ckpt_core._memory.arch import Arch, BlockKind
from ckpt_core._memory.families import family_of
from ckpt_core._memory.ledger import BlockMode, Step
from ckpt_core._planning.tiers import ConcreteTier


def activation_bytes(arch: Arch, step: Step, tier: ConcreteTier) -> int:
    """Bytes autograd keeps at the end of the forward for ``tier`` (closed form)."""
    family = family_of(arch)
    shared: dict[str, int] = {}
    total = 0
    for scope in (family.embed_ledger(arch, step), family.head_ledger(arch, step)):
        total += scope.local_bytes()
        shared.update(scope.globals())
    for (mode, kind), count in _block_counts(arch, tier):
        local, globals_ = block_bytes(arch, step, mode, kind)
        total += count * local
        shared.update(globals_)
    return total + sum(shared.values())


@functools.lru_cache(maxsize=4096)
def block_bytes(
    arch: Arch, step: Step, mode: BlockMode, kind: BlockKind
) -> tuple[int, tuple[tuple[str, int], ...]]:
    """One block's own bytes and the shared storages it keeps (cached: pure function)."""
    ledger = family_of(arch).block_ledger(arch, step, mode, kind)
    return ledger.local_bytes(), tuple(ledger.globals().items())


def head_bytes(arch: Arch, step: Step) -> int:
    """What the head scope keeps (freed once the loss backward has run)."""
    return family_of(arch).head_ledger(arch, step).local_bytes()


def largest_block(arch: Arch, step: Step, mode: BlockMode) -> int:
    """The local bytes of the largest block in ``mode`` (for the backward working set)."""
    kinds = {kind for (_, kind), _ in _block_counts(arch, "off")}
    return max(block_bytes(arch, step, mode, kind)[0] for kind in kinds)


def block_modes(arch: Arch, tier: ConcreteTier) -> list[tuple[int, int, BlockMode]]:
    """(stack, index in stack, mode) of every block under ``tier``.

    HF's ``every_n_layers`` counts blocks across stacks in module order; a
    vision tower comes first (its blocks are hooked too, but text-only
    training never runs them).
    """
    counter = arch.vision.layers if arch.vision is not None else 0
    modes = []
    for stack, layers in enumerate(family_of(arch).stacks(arch)):
        for index in range(layers):
            modes.append((stack, index, _mode(tier, counter)))
            counter += 1
    return modes


@functools.lru_cache(maxsize=1024)
def _block_counts(
    arch: Arch, tier: ConcreteTier
) -> tuple[tuple[tuple[BlockMode, BlockKind], int], ...]:
    """How many blocks of each (mode, kind) the tier has (cached per architecture)."""
    family = family_of(arch)
    counts: dict[tuple[BlockMode, BlockKind], int] = {}
    for stack, index, mode in block_modes(arch, tier):
        key = (mode, family.block_kind(arch, stack, index))
        counts[key] = counts.get(key, 0) + 1
    return tuple(counts.items())


def _mode(tier: ConcreteTier, counter: int) -> BlockMode:
    if tier == "medium":
        return "full" if counter % 2 == 0 else "off"
    return tier
