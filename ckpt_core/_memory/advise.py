"""Model-aware advice: the per-tier estimate and the ``auto`` choice (docs/design.md §§1, 5).

`estimate_tiers` turns a model (``{"preset": ...}``, ``{"config": {...}}`` or a
`ModelConfig`) and a workload into the estimate every answer carries::

    {"assumptions": {...}, "tiers": {"off" | "selective" | "medium" | "full":
        {"activation_bytes", "peak_bytes", "recompute_flops_ratio", "fits"}},
     "chosen": {"granularity", "blocks_checkpointed", "blocks_selective", "blocks",
        "activation_bytes", "peak_bytes", "recompute_flops_ratio", "fits"},
     "alternatives": [...]}  # auto only, when nothing fits (empty: no nearby workload fits)

`choose` picks ``auto``'s plan (`search.auto_pick`): the least recompute FLOPs
ratio, among the four tiers and the block-level plans between them, whose peak
fits ``gpu_memory x (1 - headroom)`` with the estimate's error band to spare;
when none does, the least memory (answered ``tight``).  When nothing fits it says
so, with the numbers and the nearest workloads that fit
(`alternatives.alternatives`).  Without GPU memory it chooses full, the safe
choice, and says why.

Its inputs (the model's facts, the workload prepared against them) come from
`ckpt_core._memory.inputs`.  Nothing here builds a model or imports torch.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ckpt_core._memory.alternatives import Alternative, alternatives, judges_for
from ckpt_core._memory.estimate import (
    ASSUMPTIONS,
    GIB,
    unquantized_parameter_bytes,
)
from ckpt_core._memory.inputs import Facts, Run, model_facts, parse_workload, prepare
from ckpt_core._memory.placement import place
from ckpt_core._memory.search import Candidate, auto_pick, granularity_of, tier_candidates
from ckpt_core._memory.sharding import distributed_summary
from ckpt_core._memory.verdict import tight_band, tight_note, verdict
from ckpt_core._planning.block_plan import BlockPlan
from ckpt_core._planning.workload import Workload

# Selective saving less than this share of the activations is worth saying.
SMALL_SAVING: Final = 0.25


@dataclass(frozen=True, slots=True)
class Choice:
    """``auto``'s plan (None = off, a tier, or ``"blocks"``) and the sentence that justifies it."""

    granularity: str | None
    reason: str
    candidate: Candidate
    block_plan: BlockPlan | None = None
    alternatives: tuple[Alternative, ...] | None = None  # searched when nothing fits


def estimate_tiers(
    run: Run, gpu_memory_gb: float | None, tiers: Mapping[str, Candidate] | None = None
) -> dict[str, Any]:
    """The estimate dict: assumptions and, per tier, activations, both peaks, FLOPs, verdict."""
    tiers = tiers or tier_candidates(run.facts.arch, run.step, run.peak)
    budget = _budget(gpu_memory_gb, run.workload.headroom)
    band = tight_band(run.facts.arch, run.step)
    rows = {
        tier: {
            "activation_bytes": c.memory.activation_bytes,
            "allocated_bytes": c.memory.allocated_bytes,
            "peak_bytes": c.memory.peak_bytes,
            "recompute_flops_ratio": round(c.ratio, 4),
            **verdict(c.memory.peak_bytes, budget, band),
        }
        for tier, c in tiers.items()
    }
    memory = {tier: c.memory for tier, c in tiers.items()}
    assumptions = _assumptions(run, gpu_memory_gb, budget, memory)
    assumptions["cuda_context_bytes"], assumptions["cuda_context_source"] = run.context
    assumptions["tight_band"] = band
    return {"assumptions": assumptions, "tiers": rows}


def chosen_row(candidate: Candidate, budget: int | None, band: float) -> dict[str, Any]:
    """``estimate["chosen"]``: what the answer does and what it costs, next to the tiers."""
    return {
        "granularity": granularity_of(candidate),
        "blocks_checkpointed": candidate.blocks_in("full"),
        "blocks_selective": candidate.blocks_in("selective"),
        "blocks": sum(n for _, n in candidate.counts),
        "activation_bytes": candidate.memory.activation_bytes,
        "peak_bytes": candidate.memory.peak_bytes,
        "recompute_flops_ratio": round(candidate.ratio, 4),
        "allocated_bytes": candidate.memory.allocated_bytes,
        **verdict(candidate.memory.peak_bytes, budget, band),
    }


def _budget(gpu_memory_gb: float | None, headroom: float) -> int | None:
    return None if gpu_memory_gb is None else int(gpu_memory_gb * GIB * (1 - headroom))


def _assumptions(
    run: Run, gpu_memory_gb: float | None, budget: int | None, memory: Mapping[str, Any]
) -> dict[str, Any]:
    arch, workload = run.facts.arch, run.workload
    return {
        "workload": {**workload.to_dict(), "weights": workload.weight_storage},
        "model": {
            "model_type": arch.model_type,
            "architecture": run.facts.architecture,
            "parameters": run.facts.layout.total,
            "trainable_parameters": run.static.trainable_parameters,
            "layers": arch.layers + arch.encoder_layers,
            "hidden_size": arch.hidden,
        },
        "attention_kernel": run.step.attention,
        "attention_note": run.attention_note,
        "gpu_memory_gb": gpu_memory_gb,
        "gpu_memory_unit": "GiB (2**30 bytes), as torch reports total memory",
        "headroom": workload.headroom,
        "budget_bytes": budget,
        **distributed_summary(run.static, workload),  # per-GPU weights / gradients / optimizer
        "transient_bytes": {tier: item.transient_bytes for tier, item in memory.items()},
        "rules": dict(ASSUMPTIONS),
    }


def choose(
    run: Run, estimate: Mapping[str, Any], gpu_memory_gb: float | None, tiers: dict[str, Candidate]
) -> Choice:
    """``auto`` with a model: the least recompute that fits, or full with the reason why."""
    if gpu_memory_gb is None:
        return Choice(
            "full",
            "auto with a model but no GPU memory: full, the safe choice (the estimate lists "
            "each tier's peak; pass gpu_memory_gb or gpu to choose by it)",
            tiers["full"],
        )
    arch, step = run.facts.arch, run.step
    budget = estimate["assumptions"]["budget_bytes"]
    where = f"{_gib(budget)} usable of {gpu_memory_gb:.1f} GiB (headroom {run.workload.headroom:g})"
    band = estimate["assumptions"]["tight_band"]
    picked = auto_pick(arch, step, run.peak, budget, band=band, tiers=tiers)
    if picked is None:
        options = _nearest_fitting(run.facts, run.workload, run.gpu, run.rotary_matmul, budget)
        reason = (
            f"auto: nothing fits - even full needs an estimated "
            f"{_gib(tiers['full'].memory.peak_bytes)} > {where}; {_options_text(run, options)}"
        )
        return Choice("full", reason, tiers["full"], alternatives=options)
    best, clear = picked
    if clear:
        why = f"{_label(best)} has the least recompute that fits with the estimate's "
        why += f"{band:.0%} error band to spare"
    else:
        why = f"no plan clears the estimate's {band:.0%} error band; {_label(best)} needs "
        why += "the least memory"
    name = granularity_of(best)
    block_plan = place(arch, best.counts) if best.tier is None else None
    reason = (
        f"auto: {why} ({best.ratio:.4f}x the FLOPs of no checkpointing"
        f"{_next_to_tiers(best, tiers, int(budget / (1 + band)))}), "
        f"estimated peak {_gib(best.memory.peak_bytes)} <= {where}"
    )
    reason += tight_note(verdict(best.memory.peak_bytes, budget, band), band)
    granularity = None if name == "off" else name
    return Choice(granularity, reason + selective_note(run, estimate, name), best, block_plan)


def _label(candidate: Candidate) -> str:
    if candidate.tier is not None:
        return candidate.tier
    blocks = sum(n for _, n in candidate.counts)
    label = f"a block-level plan checkpointing {candidate.blocks_in('full')} of {blocks} blocks"
    selective = candidate.blocks_in("selective")
    return label + (f" and the attention of {selective} more" if selective else "")


def _next_to_tiers(best: Candidate, tiers: Mapping[str, Candidate], budget: int) -> str:
    fitting = [c for c in tiers.values() if c.memory.peak_bytes <= budget and c is not best]
    if best.tier is not None or not fitting:
        return ""
    cheapest = min(fitting, key=lambda c: c.ratio)
    return f"; the cheapest tier that does, {cheapest.tier}, costs {cheapest.ratio:.4f}x"


def _options_text(run: Run, options: tuple[Alternative, ...]) -> str:
    if not options:
        return (
            "no lighter method (LoRA, QLoRA), shorter sequence or smaller micro-batch fits: "
            f"weights, gradients and optimizer states alone take {_gib(run.static.total)}"
            + _unquantized_experts_note(run)
        )
    parts = []
    for option in options:
        row = option.to_dict(run.workload)
        changes = ", ".join(f"{key} {value}" for key, value in row["changes"].items())
        if "gradient_accumulation_factor" in row:
            changes += f" (gradient accumulation x{row['gradient_accumulation_factor']})"
        parts.append(
            f"{changes} fits with {_label(option.candidate)} "
            f"({row['recompute_flops_ratio']:.4f}x FLOPs, peak {_gib(row['peak_bytes'])})"
        )
    return "what would fit: " + "; ".join(parts)


def _unquantized_experts_note(run: Run) -> str:
    """Why QLoRA does not shrink an MoE model: transformers stores its experts as stacked
    3-D parameters, which bitsandbytes (it replaces ``nn.Linear``) leaves as they are."""
    experts, workload = run.facts.layout.experts, run.workload
    if not experts:
        return ""
    each = unquantized_parameter_bytes(workload)
    cast = " (fp32 after PEFT's kbit preparation)" if workload.kbit_prepared else ""
    return (
        f", {_gib(experts * each)} of it the model's expert weights{cast}, which QLoRA "
        "leaves unquantized: transformers stores them as stacked tensors and bitsandbytes "
        "quantizes linear layers only"
    )


def selective_note(run: Run, estimate: Mapping[str, Any], chosen: str) -> str:
    """Say so when selective saves little: fused attention keeps no s x s scores."""
    if chosen == "off" or run.step.attention == "eager":
        return ""
    tiers = estimate["tiers"]
    off, selective = tiers["off"]["activation_bytes"], tiers["selective"]["activation_bytes"]
    saving = (off - selective) / off if off else 0.0
    if saving >= SMALL_SAVING:
        return ""
    return (
        f"; selective saves only {saving:.0%} of the activations here: fused attention "
        "keeps no s x s scores, so the MLP dominates"
    )


def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:.1f} GiB"


@dataclass(frozen=True, slots=True)
class Advice:
    """What `make_plan` needs from a model-aware resolution of a tier."""

    granularity: str | None
    reason: str
    description: str
    estimate: dict[str, Any]
    block_plan: BlockPlan | None = None


def advise(
    tier: str,
    model: object,
    workload: object,
    gpu_memory_gb: float | None,
    gpu: str | None = None,
    *,
    rotary_matmul: bool = False,
) -> Advice:
    """Estimate every tier for the model and workload; resolve ``auto`` by the estimate.

    An explicit tier is kept as asked; the reason says whether it fits.  ``gpu``
    (a GPU-table name) selects its measured CUDA context; ``rotary_matmul``: the worker's
    transformers computes RoPE's angles with a matmul (`prepare`).
    """
    run = prepare(model_facts(model), parse_workload(workload), gpu, rotary_matmul=rotary_matmul)
    arch = run.facts.arch
    tiers = tier_candidates(arch, run.step, run.peak)
    estimate = estimate_tiers(run, gpu_memory_gb, tiers)
    budget, band = estimate["assumptions"]["budget_bytes"], estimate["assumptions"]["tight_band"]
    if tier == "auto":
        choice = choose(run, estimate, gpu_memory_gb, tiers)
        estimate["chosen"] = chosen_row(choice.candidate, budget, band)
        if choice.alternatives is not None:
            estimate["alternatives"] = [a.to_dict(run.workload) for a in choice.alternatives]
        chosen = _label(choice.candidate) if choice.block_plan else choice.granularity or "off"
        description = (
            f"auto → {chosen} (estimated for {arch.model_type}, "
            f"seq_len {run.workload.seq_len} x micro-batch {run.workload.micro_batch_size})"
        )
        return Advice(choice.granularity, choice.reason, description, estimate, choice.block_plan)
    from ckpt_core._planning.tiers import describe

    estimate["chosen"] = chosen_row(tiers[tier], budget, band)
    granularity = None if tier == "off" else tier
    reason = f"tier {tier!r} requested; {_fit_sentence(estimate, tier)}"
    reason += selective_note(run, estimate, tier) if tier == "selective" else ""
    return Advice(granularity, reason, describe(tier, gpu_memory_gb), estimate)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=256)
def _nearest_fitting(
    facts: Facts, workload: Workload, gpu: str | None, rotary_matmul: bool, budget: int
) -> tuple[Alternative, ...]:
    """`alternatives.alternatives` for a request, cached per request: the search plans dozens
    of workloads from the cached peaks, most of a repeated call's time without it."""
    judge, feasible = judges_for(
        lambda changed: prepare(facts, changed, gpu, rotary_matmul=rotary_matmul), budget
    )
    return tuple(alternatives(workload, judge, feasible))


def _fit_sentence(estimate: Mapping[str, Any], tier: str) -> str:
    row = estimate["tiers"][tier]
    budget = estimate["assumptions"]["budget_bytes"]
    peak = f"estimated peak {_gib(row['peak_bytes'])}"
    if budget is None:
        return f"{peak} (no GPU memory given, fit not judged)"
    verdict = "fits" if row["fits"] else "does NOT fit"
    note = tight_note(row, estimate["assumptions"]["tight_band"])
    return f"{peak} {verdict} the {_gib(budget)} usable{note}"
