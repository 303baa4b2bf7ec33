"""``auto`` with a model: the assignment with the least recompute whose peak fits.

The space is every count of off / selective / full blocks per kind of block
(sliding or global attention, MoE or dense, encoder or decoder): the four
tiers are points of it, block-level plans the rest.  Each point is judged by
the one peak function (`ckpt_core._memory.peak_model.tier_memory`) against the
budget and ranked by its recompute FLOPs ratio (`ckpt_core._memory.flops`).

The search walks ``F`` = blocks checkpointed whole from 0 to L and, for each,
finds the fewest selective blocks ``S`` that fit by the search's model
(`PeakModel.searching`: a block-level plan judged from the full tier's replay):
more checkpointing keeps less, so that fewest only shrinks as ``F`` grows and
one pass over both is enough (about 2 L peak evaluations, not L^2).  With
several kinds, full and selective blocks go first to the kinds that save the
most bytes per recomputed FLOP.  The plans at or above that frontier are then
taken in order of recompute and replayed as placed, and the first whose replay
fits is the answer (`_cheapest_replayed`); a replay that misses teaches the search's
model what it misses for plans like it.  The four tiers are judged too, so the
answer never costs more than the cheapest fitting tier.  Pure arithmetic.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable
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

# How many plans one search replays at most: a replay is a step through the allocator
# (40 to 350 ms for the bundled presets), and the answer is cached.
REPLAYS: Final = 24
# How many replays of one kind of plan must miss before their miss judges the next
# plans of that kind: one more selective block can change a plan's replay by 4 GiB.
CONFIRMED: Final = 2


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
    # By the search's model a block-level plan keeps at least full's peak (more
    # activations, full's fragmentation), so only a tier can fit when full does not; a
    # tier replayed on its own can keep less than full (tests check both).
    if tiers["full"] in fitting:
        ceiling = min(c.ratio for c in fitting)
        placed = _cheapest_replayed(arch, step, peak, budget, ceiling)
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


@functools.lru_cache(maxsize=1024)
def _cheapest_replayed(
    arch: Arch, step: Step, peak: PeakModel, budget: int, ceiling: float
) -> Candidate | None:
    """The least recompute below ``ceiling`` that fits by the search's model and by the
    replay of its own placement, or None.

    The search's model (`PeakModel.searching`: from the full tier's replay) can miss a
    plan's own fragmentation by 15% either way (a single unchecked block among selective
    ones, whose math-backend scores fragment the pool), and not smoothly: one more block
    checkpointed can reserve one more logits-sized segment.  So the plans it fits are
    replayed in order of recompute, and the first whose replay fits is the answer.  A
    replay that does not fit says what the search's model misses for its count of full
    blocks, with or without unchecked blocks (an unchecked block's activations are what
    fragments the pool beyond full's): once `CONFIRMED` replays of a kind missed, its
    next plans are judged with the nearest one's miss and replayed only when they fit
    with it too.  `REPLAYS` replays at most (each is a step through the allocator)."""
    searching = peak.searching()
    kinds = dict(block_kinds(arch))
    layers = sum(kinds.values())
    order_full, order_selective = _kind_orders(arch, step)

    def counts_of(full: int, selective: int) -> ModeCounts:
        return _distribute(kinds, full, selective, order_full, order_selective)

    def searched(full: int, selective: int) -> int:
        return searching.of(arch, step, counts_of(full, selective)).peak_bytes

    def entry(full: int, selective: int) -> tuple[float, int, int]:
        return recompute_ratio(arch, step, counts_of(full, selective)), full, selective

    # Per count of full blocks, the plans from the fewest selective blocks that fit up,
    # merged in order of recompute.
    heap = [entry(full, selective) for full, selective in _walk(layers, searched, budget).items()]
    heapq.heapify(heap)
    # (full blocks, whether every block is checkpointed) -> (selective, replay - search)
    misses: dict[tuple[int, bool], list[tuple[int, int]]] = {}
    replays = 0
    while heap and replays < REPLAYS:
        ratio, full, selective = heapq.heappop(heap)
        if ratio >= ceiling:
            break
        if selective < layers - full:
            heapq.heappush(heap, entry(full, selective + 1))
        expected = searched(full, selective)
        regime = (full, full + selective == layers)
        replayed = misses.get(regime, [])
        miss = _miss(replayed, selective) if len(replayed) >= CONFIRMED else 0
        if expected + miss > budget:
            continue
        candidate = evaluate(arch, step, peak, counts_of(full, selective))
        replays += 1
        if candidate.memory.peak_bytes <= budget:
            return candidate
        missed = candidate.memory.peak_bytes - expected
        misses.setdefault(regime, []).append((selective, missed))
    return None


def _miss(replayed: list[tuple[int, int]], selective: int) -> int:
    """What the replays of one kind of plan added to the search's model, from the replay
    nearest in selective blocks (the larger on a tie)."""
    return min(replayed, key=lambda item: (abs(item[0] - selective), -item[1]))[1]


def _walk(layers: int, searched: Callable[[int, int], int], budget: int) -> dict[int, int]:
    """For each count of full blocks from 0 to L, the fewest selective blocks whose peak
    (``searched(full, selective)``) fits ``budget``, where any do.

    More checkpointing keeps less, so that fewest only shrinks as full blocks are added
    and one pass over both is enough (about 2 L peak evaluations, not L^2)."""
    fit_cache: dict[tuple[int, int], bool] = {}

    def fits(full: int, selective: int) -> bool:
        known = fit_cache.get((full, selective))
        if known is None:
            known = fit_cache[(full, selective)] = searched(full, selective) <= budget
        return known

    fewest: dict[int, int] = {}
    selective = layers
    for full in range(layers + 1):
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
        fewest[full] = selective
    return fewest


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
