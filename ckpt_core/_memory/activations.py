"""Closed-form activation bytes per assignment of checkpointing modes to blocks (docs/design.md §5).

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
import re

from ckpt_core._memory.arch import Arch, BlockKind
from ckpt_core._memory.families import family_of
from ckpt_core._memory.ledger import BlockMode, Step
from ckpt_core._planning.tiers import CONCRETE_TIERS, ConcreteTier

# How many blocks of each (mode, kind) an assignment has; counts of 0 may be left out.
ModeCounts = tuple[tuple[tuple[BlockMode, BlockKind], int], ...]
# A tier, or any other assignment of modes to blocks, by its counts.
Assignment = ConcreteTier | ModeCounts


def mode_counts(arch: Arch, assignment: Assignment) -> ModeCounts:
    """The counts of an assignment (a tier's are derived from its block modes, cached)."""
    if isinstance(assignment, str):
        return _block_counts(arch, assignment)
    return assignment


MODES: tuple[BlockMode, ...] = ("off", "selective", "full")


def canonical(arch: Arch, counts: ModeCounts) -> ModeCounts:
    """The same counts in one order, zeros dropped (equal assignments compare equal)."""
    totals: dict[tuple[BlockMode, BlockKind], int] = {}
    for key, n in counts:
        totals[key] = totals.get(key, 0) + n
    return tuple(
        ((mode, kind), totals[(mode, kind)])
        for kind, _ in block_kinds(arch)
        for mode in MODES
        if totals.get((mode, kind))
    )


@functools.lru_cache(maxsize=4096)
def tier_named(arch: Arch, counts: ModeCounts) -> ConcreteTier | None:
    """The tier whose assignment ``counts`` is (in any order), or None for a block-level plan."""
    counts = canonical(arch, counts)
    return next(
        (tier for tier in CONCRETE_TIERS if canonical(arch, mode_counts(arch, tier)) == counts),
        None,
    )


def activation_bytes(arch: Arch, step: Step, assignment: Assignment) -> int:
    """Bytes autograd keeps at the end of the forward for ``assignment`` (closed form)."""
    total, shared = _scopes(arch, step)
    shared = dict(shared)
    for (mode, kind), count in mode_counts(arch, assignment):
        if count:
            local, globals_ = block_bytes(arch, step, mode, kind)
            total += count * local
            shared.update(globals_)
    return total + sum(shared.values())


@functools.lru_cache(maxsize=1024)
def _scopes(arch: Arch, step: Step) -> tuple[int, tuple[tuple[str, int], ...]]:
    """The embedding and head scopes' own bytes and shared storages (cached: pure function)."""
    family = family_of(arch)
    shared: dict[str, int] = {}
    total = 0
    for scope in (family.embed_ledger(arch, step), family.head_ledger(arch, step)):
        total += scope.local_bytes()
        shared.update(scope.globals())
    return total, tuple(shared.items())


@functools.lru_cache(maxsize=4096)
def block_bytes(
    arch: Arch, step: Step, mode: BlockMode, kind: BlockKind
) -> tuple[int, tuple[tuple[str, int], ...]]:
    """One block's own bytes and the shared storages it keeps (cached: pure function).

    A checkpointed block or attention also keeps the inputs its linears hold as
    attributes (`Step.held_inputs`), as their unchecked forward does.
    """
    block_ledger = family_of(arch).block_ledger
    ledger = block_ledger(arch, step, mode, kind)
    if step.held_inputs and mode != "off":
        for name, (storage, nbytes) in block_ledger(arch, step, "off", kind).held.items():
            if mode == "full" or _ATTENTION.match(name):
                ledger.keep(storage, nbytes)
    return ledger.local_bytes(), tuple(ledger.globals().items())


# A linear of the attention a selective block checkpoints (its module's name says so, as
# `ckpt_core._hooks.blocks` finds that module).
_ATTENTION = re.compile(r"[^.]*(attention|attn)", re.IGNORECASE)


def head_bytes(arch: Arch, step: Step) -> int:
    """What the head scope keeps (freed once the loss backward has run)."""
    return family_of(arch).head_ledger(arch, step).local_bytes()


def block_modes(arch: Arch, tier: ConcreteTier) -> list[BlockMode]:
    """The mode of every block under ``tier``, in module order (for the step replay)."""
    return [_mode(tier, counter) for counter, _, _, _ in block_layout(arch)]


def block_kinds(arch: Arch) -> tuple[tuple[BlockKind, int], ...]:
    """How many blocks of each kind the model has, in first-seen order."""
    return tuple((kind, count) for (_, kind), count in _block_counts(arch, "off"))


@functools.lru_cache(maxsize=1024)
def block_layout(arch: Arch) -> tuple[tuple[int, int, int, BlockKind], ...]:
    """(HF's block counter, stack, index in stack, kind) of every block, in module order.

    HF's ``every_n_layers`` counts blocks across stacks in module order; a
    vision tower comes first (its blocks are hooked too, but text-only
    training never runs them), so the text blocks' counter starts after it.
    """
    family = family_of(arch)
    counter = arch.vision.layers if arch.vision is not None else 0
    layout = []
    for stack, layers in enumerate(family.stacks(arch)):
        for index in range(layers):
            layout.append((counter, stack, index, family.block_kind(arch, stack, index)))
            counter += 1
    return tuple(layout)


@functools.lru_cache(maxsize=1024)
def _block_counts(
    arch: Arch, tier: ConcreteTier
) -> tuple[tuple[tuple[BlockMode, BlockKind], int], ...]:
    """How many blocks of each (mode, kind) the tier has (cached per architecture)."""
    counts: dict[tuple[BlockMode, BlockKind], int] = {}
    for counter, _, _, kind in block_layout(arch):
        key = (_mode(tier, counter), kind)
        counts[key] = counts.get(key, 0) + 1
    return tuple(counts.items())


def _mode(tier: ConcreteTier, counter: int) -> BlockMode:
    if tier == "medium":
        return "full" if counter % 2 == 0 else "off"
    return tier
