"""When no plan fits: the few workloads nearest the request that do, with their plans.

Changes are searched in combination, not one at a time (a full fine-tune of
an 8B model on 24 GiB fits neither as LoRA at the same sequence nor as a full
fine-tune at any sequence, but does as QLoRA at a slightly shorter one):

- method: the request's, then the lighter ones (full -> LoRA -> QLoRA nf4);
- optimizer: a full fine-tune with torch's foreach AdamW also as the fused
  step, which holds no parameter-sized temporary and trains the same (the
  smallest change of all);
- micro-batch: the request's, then each divisor of it, with gradient
  accumulation multiplied to keep the global batch;
- sequence length: the request's when some plan fits, else the longest
  multiple of `SEQ_UNIT` that fits (peaks grow with it; found by bisection on
  full's peak, the lowest of any assignment: each block checkpointed whole
  keeps the least, and the recompute working set is one block's however many
  are checkpointed);
- the plan: what auto answers for that workload (`search.auto_pick`).

Of the options found, those on the frontier are kept - no other option is at
least as close to the request in every change and at least as cheap in
recompute - closest first.  Pure arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Final

from ckpt_core._memory.search import Candidate, auto_pick, granularity_of, tier_candidates
from ckpt_core._memory.verdict import tight_band
from ckpt_core._planning.tiers import CONCRETE_TIERS
from ckpt_core._planning.workload import Workload

MAX_ALTERNATIVES: Final = 4
# A shorter sequence is offered in multiples of this (kernels and packing like them).
SEQ_UNIT: Final = 64
_LIGHTNESS: Final = {"full": 0, "lora": 1, "qlora": 2}


@dataclass(frozen=True, slots=True)
class Alternative:
    """A changed workload that fits, and its cheapest plan."""

    workload: Workload
    candidate: Candidate
    # method steps, share of the sequence cut, batch divisor, optimizer changed
    distance: tuple[int, float, int, int]

    def to_dict(self, request: Workload) -> dict[str, Any]:
        changes = {
            name: getattr(self.workload, name)
            for name in ("method", "weights", "optimizer", "seq_len", "micro_batch_size")
            if getattr(self.workload, name) != getattr(request, name)
        }
        row: dict[str, Any] = {
            "changes": changes,
            "granularity": granularity_of(self.candidate),
            "blocks_checkpointed": self.candidate.blocks_in("full"),
            "peak_bytes": self.candidate.memory.peak_bytes,
            "recompute_flops_ratio": round(self.candidate.ratio, 4),
        }
        if self.distance[2] > 1:
            row["gradient_accumulation_factor"] = self.distance[2]
        return row


Judge = Callable[[Workload], Candidate | None]


def alternatives(
    request: Workload, judge: Judge, feasible: Callable[[Workload], bool]
) -> list[Alternative]:
    """The frontier of fitting workloads near ``request``.

    ``judge`` plans one workload (None: nothing fits); ``feasible`` says
    cheaply whether anything fits it (the bisection's test).
    """
    found = []
    for method_steps, fused, workload in _variants(request):
        for divisor in _divisors(request.micro_batch_size):
            shaped = replace(workload, micro_batch_size=request.micro_batch_size // divisor)
            option = _fitting_sequence(shaped, judge, feasible)
            if option is not None:
                fitted, candidate = option
                cut = 1 - fitted.seq_len / request.seq_len
                found.append(Alternative(fitted, candidate, (method_steps, cut, divisor, fused)))
                if cut == 0:
                    break  # a smaller micro-batch of this variant is only a further change
    frontier = [a for a in found if not any(_dominates(b, a) for b in found if b is not a)]
    frontier.sort(key=lambda a: (_changed_fields(a), a.distance, a.candidate.ratio))
    return frontier[:MAX_ALTERNATIVES]


def _changed_fields(option: Alternative) -> int:
    method_steps, cut, divisor, fused = option.distance
    return (method_steps > 0) + (cut > 0) + (divisor > 1) + fused


def _dominates(a: Alternative, b: Alternative) -> bool:
    no_worse = all(x <= y for x, y in zip(a.distance, b.distance, strict=True))
    return (
        no_worse
        and a.candidate.ratio <= b.candidate.ratio
        and (a.distance != b.distance or a.candidate.ratio < b.candidate.ratio)
    )


def _variants(request: Workload) -> list[tuple[int, int, Workload]]:
    """The request; a full fine-tune's foreach AdamW as the fused step; then each lighter
    method (its default weight storage).  Each as (method steps, optimizer changed, workload).
    Adapters are a small share of the parameters, so only a full fine-tune's temporary
    is worth a variant of its own."""
    variants = [(0, 0, request)]
    if request.method == "full":
        if request.optimizer == "adamw":
            variants.append((0, 1, replace(request, optimizer="adamw_fused")))
        variants.append((1, 0, replace(request, method="lora")))
    if request.method != "qlora" or request.weight_storage != "nf4":
        steps = max(1, _LIGHTNESS["qlora"] - _LIGHTNESS[request.method])
        variants.append((steps, 0, replace(request, method="qlora", weights="nf4")))
    return variants


def _divisors(micro_batch: int) -> list[int]:
    return [d for d in range(1, micro_batch + 1) if micro_batch % d == 0]


def _fitting_sequence(
    workload: Workload, judge: Judge, feasible: Callable[[Workload], bool]
) -> tuple[Workload, Candidate] | None:
    """The workload at its own sequence, or the longest shorter one, where some plan fits."""
    if feasible(workload):
        return workload, judge(workload)  # type: ignore[return-value]
    unit = SEQ_UNIT if workload.seq_len > SEQ_UNIT else 1
    low, high = 0, (workload.seq_len - 1) // unit  # in units
    while low < high:
        middle = (low + high + 1) // 2
        if feasible(replace(workload, seq_len=middle * unit)):
            low = middle
        else:
            high = middle - 1
    if low == 0:
        return None
    shorter = replace(workload, seq_len=low * unit)
    return shorter, judge(shorter)  # type: ignore[return-value]


def judges_for(
    prepare: Callable[[Workload], Any], budget: int
) -> tuple[Judge, Callable[[Workload], bool]]:
    """From ``prepare`` (workload -> `advise.Run`): the judge and the feasibility test."""

    def judge(workload: Workload) -> Candidate | None:
        run = prepare(workload)
        arch, step, peak = run.facts.arch, run.step, run.peak
        tiers = tier_candidates(arch, step, peak)
        band = tight_band(arch, step)
        picked = auto_pick(arch, step, peak, budget, band=band, tiers=tiers)
        return None if picked is None else picked[0]

    def feasible(workload: Workload) -> bool:
        run = prepare(workload)
        arch, step = run.facts.arch, run.step
        # The closed form (a tier's allocated peak, no replay) rules most probes out
        # without replaying the allocator; it can only say no too often, never yes.  Full
        # is replayed first, another tier only when full does not fit (it can fragment
        # less) and its closed form does.
        quick = run.peak.quick()
        tiers = ("full", *(tier for tier in CONCRETE_TIERS if tier != "full"))
        return any(
            quick.of(arch, step, tier).peak_bytes <= budget
            and run.peak.of(arch, step, tier).peak_bytes <= budget
            for tier in tiers
        )

    return judge, feasible
