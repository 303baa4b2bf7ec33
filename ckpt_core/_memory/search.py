"""``auto`` with a model: the assignment with the least recompute whose peak fits.

The space is every count of off / selective / full blocks per kind of block
(sliding or global attention, MoE or dense, encoder or decoder): the four
tiers are points of it, block-level plans the rest.  Each point is judged by
the one peak function (`ckpt_core._memory.peak_model.tier_memory`) against the
budget and ranked by its recompute FLOPs ratio (`ckpt_core._memory.flops`).

The search walks ``F`` = blocks checkpointed whole from 0 to L and, for each,
finds the fewest selective blocks ``S`` that fit: more checkpointing keeps
less, so that fewest only shrinks as ``F`` grows and one pass over both is
enough (about 2 L peak evaluations, not L^2); it stops once ``F`` full blocks
alone cost more than the best plan so far.  With several kinds, full and
selective blocks go first to the kinds that save the most bytes per
recomputed FLOP.  The walk judges a block-level plan from the full tier's
replay (`PeakModel.searching`); the plans near its frontier are then replayed
as placed, cheapest first, and when none of the first few fits, the walk runs
again on a budget smaller by what the replay added (`_placed_walk`).  The four
tiers are judged too, so the answer never costs more than the cheapest
fitting tier.  Pure arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ckpt_core._memory.activations import (
    ModeCounts,
    block_bytes,
    block_kinds,
    canonical,
    mode_counts,
    tier_named,
)
from ckpt_core._memory.arch import Arch, BlockKind
from ckpt_core._memory.flops import kind_flops, recompute_ratio
from ckpt_core._memory.ledger import BlockMode, Step
from ckpt_core._memory.peak_model import PeakModel, TierMemory
from ckpt_core._planning.tiers import CONCRETE_TIERS, ConcreteTier

# How many times a walk runs again when no plan near its frontier fits by its own replay,
# how many of them are replayed, and how many more selective blocks than the fewest that
# fit make a plan near the frontier.
WALK_TRIES: Final = 3
REPLAYED: Final = 4
EXTRA_SELECTIVE: Final = 2


@dataclass(frozen=True, slots=True)
class Candidate:
    """One assignment with its memory and cost; ``tier`` names it when it is a tier's."""

    counts: ModeCounts
    memory: TierMemory
    ratio: float
    tier: ConcreteTier | None

    def blocks_in(self, mode: BlockMode) -> int:
        return sum(n for (m, _), n in self.counts if m == mode)


def granularity_of(candidate: Candidate) -> str:
    """The tier's name, or ``"blocks"`` for a block-level plan."""
    return candidate.tier or "blocks"


def evaluate(arch: Arch, step: Step, peak: PeakModel, counts: ModeCounts) -> Candidate:
    """The peak and the recompute ratio of one assignment."""
    counts = canonical(arch, counts)
    memory = peak.of(arch, step, counts)
    return Candidate(counts, memory, recompute_ratio(arch, step, counts), tier_named(arch, counts))


def tier_candidates(arch: Arch, step: Step, peak: PeakModel) -> dict[str, Candidate]:
    """The four tiers as candidates (named by the tier even when two coincide)."""
    return {
        tier: Candidate(
            canonical(arch, mode_counts(arch, tier)),
            peak.of(arch, step, tier),
            recompute_ratio(arch, step, tier),
            tier,
        )
        for tier in CONCRETE_TIERS
    }


def cheapest_fit(
    arch: Arch, step: Step, peak: PeakModel, budget: int, tiers: dict[str, Candidate]
) -> Candidate | None:
    """The least recompute among the tiers and block-level plans whose peak fits ``budget``."""
    fitting = [c for c in tiers.values() if c.memory.peak_bytes <= budget]
    if tiers["off"] in fitting:
        return tiers["off"]  # nothing recomputes less
    # By the walk's model a block-level plan keeps at least full's peak (more
    # activations, full's fragmentation), so only a tier can fit when full does not; a
    # tier replayed on its own can keep less than full (tests check both).
    if tiers["full"] in fitting:
        placed = _placed_walk(arch, step, peak, budget)
        if placed is not None:
            fitting.append(placed)
    if not fitting:
        return None
    return min(fitting, key=lambda c: (c.ratio, c.memory.peak_bytes, c.tier is None))


def auto_pick(
    arch: Arch,
    step: Step,
    peak: PeakModel,
    budget: int,
    *,
    band: float,
    tiers: dict[str, Candidate],
) -> tuple[Candidate, bool] | None:
    """What ``auto`` answers, and whether it is clear of the estimate's error band.

    A plan that fits only within the band (``band``, a fraction of the peak) may run
    out of memory, so the least recompute clear of it comes first; when none is, the
    least memory, if that fits at all (not the cheapest plan inside the band: more
    memory would then buy more recompute).  None when nothing fits.
    """
    clear = cheapest_fit(arch, step, peak, int(budget / (1 + band)), tiers)
    if clear is not None:
        return clear, True
    least = min(tiers.values(), key=lambda c: (c.memory.peak_bytes, -c.ratio))
    return (least, False) if least.memory.peak_bytes <= budget else None


def _placed_walk(arch: Arch, step: Step, peak: PeakModel, budget: int) -> Candidate | None:
    """The cheapest plan near the walk's frontier that fits by the replay of its own
    placement.

    The walk judges plans from the full tier's replay (`PeakModel.searching`), which
    can miss a plan's own fragmentation either way (a single unchecked block among
    selective ones, whose math-backend scores fragment the pool, by 15%).  So its
    frontier - per count of full blocks, the fewest selective blocks that fit, and
    one or two more - is replayed as placed in order of recompute, `REPLAYED` plans at
    most; when none of those fits, the walk runs again on a budget smaller by what the
    cheapest one's replay added (`WALK_TRIES` walks at most, then no block-level
    plan)."""
    searching = peak.searching()
    walk_budget = budget
    for _ in range(WALK_TRIES):
        frontier = _walk(arch, step, searching, walk_budget)
        if not frontier:
            return None
        for counts in frontier[:REPLAYED]:
            candidate = evaluate(arch, step, peak, counts)
            if candidate.memory.peak_bytes <= budget:
                return candidate
        cheapest = frontier[0]
        missed = (
            peak.of(arch, step, cheapest).peak_bytes - searching.of(arch, step, cheapest).peak_bytes
        )
        walk_budget = min(walk_budget, budget - missed)
    return None


def _walk(arch: Arch, step: Step, peak: PeakModel, budget: int) -> list[ModeCounts]:
    """For each count of full blocks the walk reaches, the fewest selective blocks that
    fit, and that plan with ``EXTRA_SELECTIVE`` more selective blocks at most; cheapest
    first."""
    kinds = dict(block_kinds(arch))
    layers = sum(kinds.values())
    order_full, order_selective = _kind_orders(arch, step)
    fit_cache: dict[tuple[int, int], bool] = {}

    def counts_of(full: int, selective: int) -> ModeCounts:
        return _distribute(kinds, full, selective, order_full, order_selective)

    def fits(full: int, selective: int) -> bool:
        known = fit_cache.get((full, selective))
        if known is None:
            needed = peak.of(arch, step, counts_of(full, selective)).peak_bytes
            known = fit_cache[(full, selective)] = needed <= budget
        return known

    best: float | None = None
    frontier: list[tuple[float, ModeCounts]] = []
    selective = layers
    for full in range(layers + 1):
        if best is not None and recompute_ratio(arch, step, counts_of(full, 0)) >= best:
            break  # more full blocks only cost more
        selective = min(selective, layers - full)
        if not fits(full, selective):
            while selective < layers - full and not fits(full, selective):
                selective += 1
            if not fits(full, selective):
                selective = layers - full
                continue
        while selective > 0 and fits(full, selective - 1):
            selective -= 1
        if selective > 0 and fits(full, 0):
            selective = 0  # the first selective block adds its recompute working set
        counts = counts_of(full, selective)
        ratio = recompute_ratio(arch, step, counts)
        best = ratio if best is None else min(best, ratio)
        frontier.append((ratio, counts))
        for extra in range(1, min(EXTRA_SELECTIVE, layers - full - selective) + 1):
            more = counts_of(full, selective + extra)
            frontier.append((recompute_ratio(arch, step, more), more))
    frontier.sort(key=lambda item: item[0])
    return [counts for _, counts in frontier]


def _kind_orders(arch: Arch, step: Step) -> tuple[list[BlockKind], list[BlockKind]]:
    """Kinds by bytes saved per recomputed FLOP, best first, for full and for selective."""
    flops = kind_flops(arch, step)

    def efficiency(kind: BlockKind, mode: BlockMode) -> float:
        saved = block_bytes(arch, step, "off", kind)[0] - block_bytes(arch, step, mode, kind)[0]
        return saved / max(flops[kind].recomputed(mode), 1)

    kinds = [kind for kind, _ in block_kinds(arch)]
    return (
        sorted(kinds, key=lambda k: -efficiency(k, "full")),
        sorted(kinds, key=lambda k: -efficiency(k, "selective")),
    )


def _distribute(
    kinds: dict[BlockKind, int],
    full: int,
    selective: int,
    order_full: list[BlockKind],
    order_selective: list[BlockKind],
) -> ModeCounts:
    """``full`` then ``selective`` blocks handed to the kinds in their orders."""
    left = dict(kinds)
    counts: list[tuple[tuple[BlockMode, BlockKind], int]] = []
    plan: tuple[tuple[BlockMode, int, list[BlockKind]], ...] = (
        ("full", full, order_full),
        ("selective", selective, order_selective),
    )
    for mode, wanted, order in plan:
        remaining = wanted
        for kind in order:
            take = min(remaining, left[kind])
            if take:
                counts.append(((mode, kind), take))
                left[kind] -= take
                remaining -= take
    counts += [(("off", kind), n) for kind, n in left.items() if n]
    return tuple(counts)
