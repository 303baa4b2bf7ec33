"""Model-aware advice: the per-tier estimate and the ``auto`` choice (docs/design.md §§1, 5).

`estimate_tiers` turns a model (``{"preset": ...}``, ``{"config": {...}}`` or a
`ModelConfig`) and a workload into the estimate every answer carries::

    {"assumptions": {...}, "tiers": {"off" | "selective" | "medium" | "full":
        {"activation_bytes", "peak_bytes", "recompute_flops_ratio", "fits"}}}

`choose` picks ``auto``'s tier: the cheapest in recompute order off <
selective < medium < full whose peak fits ``gpu_memory x (1 - headroom)``.
When nothing fits it says so, with the numbers and what would fit (computed:
the longest sequence, the largest micro-batch, LoRA, 4-bit QLoRA).  Without
GPU memory it chooses full, the safe choice, and says why.

Nothing here builds a model or imports torch: the config is parsed once per
config key (cached) and the rest is arithmetic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from ckpt_core._errors import InvalidWorkloadError
from ckpt_core._memory.arch import Arch
from ckpt_core._memory.context import context_bytes
from ckpt_core._memory.estimate import (
    ASSUMPTIONS,
    DTYPE_BYTES,
    GIB,
    StaticMemory,
    all_tiers,
    recipe_for,
    static_memory,
    tier_memory,
)
from ckpt_core._memory.families import NO_FLASH, NO_SDPA, arch_of, param_layout
from ckpt_core._memory.flops import recompute_ratio
from ckpt_core._memory.ledger import Step
from ckpt_core._memory.param_layout import ParamLayout
from ckpt_core._memory.peak import Recipe
from ckpt_core._memory.sharding import distributed_summary, per_gpu_memory
from ckpt_core._memory.verdict import TIGHT_BANDS, tight_note, verdict
from ckpt_core._planning.tiers import CONCRETE_TIERS
from ckpt_core._planning.workload import Workload

# The attention kernel kinds of the activation model, by requested implementation.
_KERNEL: Final[dict[str, str]] = {"sdpa": "fused", "flash_attention_2": "flash", "eager": "eager"}
# Selective saving less than this share of the activations is worth saying.
SMALL_SAVING: Final = 0.25


@dataclass(frozen=True, slots=True)
class Facts:
    """What the estimate needs from a model config (cached per config key)."""

    arch: Arch
    layout: ParamLayout
    architecture: str


@dataclass(frozen=True, slots=True)
class Choice:
    """``auto``'s tier (None = off) and the sentence that justifies it."""

    granularity: str | None
    reason: str


_FACTS: dict[str, Facts] = {}  # config key -> facts; bounded, oldest dropped first
_FACTS_LIMIT: Final = 256


def model_facts(model: object) -> Facts:
    """Validate the model input (`load_model_config`'s rules) and parse it once per key."""
    from ckpt_core._configs.model_config import ModelConfig, hf_config_from_dict, load_model_config

    config = model if isinstance(model, ModelConfig) else load_model_config(model)
    facts = _FACTS.get(config.key)
    if facts is None:
        arch = arch_of(hf_config_from_dict(config.config))
        facts = Facts(arch, param_layout(arch), config.architecture)
        if len(_FACTS) >= _FACTS_LIMIT:
            _FACTS.pop(next(iter(_FACTS)), None)
        _FACTS[config.key] = facts
    return facts


def parse_workload(workload: object) -> Workload:
    """A `Workload` from a mapping (strict: `InvalidWorkloadError` naming the field)."""
    if isinstance(workload, Workload):
        return workload
    if workload is None:
        raise InvalidWorkloadError(
            "a workload with at least seq_len is required with a model", field="workload"
        )
    return Workload.from_dict(workload)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Run:
    """A validated (model, workload) pair and everything derived from it."""

    facts: Facts
    workload: Workload
    step: Step
    static: StaticMemory
    attention_note: str
    recipe: Recipe
    gpu: str | None = None  # GPU-table name: picks the measured CUDA context

    @property
    def context(self) -> tuple[int, str]:
        return context_bytes(self.gpu)


def prepare(facts: Facts, workload: Workload, gpu: str | None = None) -> Run:
    """Check the workload against the model and derive the activation step and static memory."""
    arch, layout = facts.arch, facts.layout
    _check_fits_model(arch, workload)
    targets = _lora_targets(layout, workload)
    lora_parameters = sum(
        workload.lora_rank * (linear.fan_in + linear.fan_out) * linear.count
        for linear in layout.linears
        if linear.name in targets
    )
    kernel, note = _attention(arch, workload.attention)
    step = Step(
        batch=workload.micro_batch_size,
        seq=workload.seq_len,
        dtype_bytes=activation_dtype_bytes(workload),
        attention=kernel,
        trainable_weights=workload.method == "full",
        lora_rank=workload.lora_rank if workload.method != "full" else 0,
        adapted=targets.__contains__,  # empty for a full fine-tune
        hidden_bytes=4 if workload.compute == "autocast" else 0,
    )
    # Per GPU of the data-parallel group (the unsharded totals ride along): issue 17.
    replica = static_memory(layout, workload, lora_parameters)
    static = per_gpu_memory(replica, arch, layout, workload)
    return Run(facts, workload, step, static, note, recipe_for(layout, workload, static, step), gpu)


def activation_dtype_bytes(workload: Workload) -> int:
    """Bytes per activation element.

    After PEFT's kbit preparation the embeddings, norms and LM head are fp32:
    the embedding's output is fp32, Llama-style norms return ``weight *
    x.to(input_dtype)`` (fp32), and bitsandbytes' linears cast back to their
    input's dtype, so every hidden state of the step is fp32.
    """
    return 4 if workload.kbit_prepared else DTYPE_BYTES[workload.dtype]


def _check_fits_model(arch: Arch, workload: Workload) -> None:
    if workload.method == "full" and workload.weight_storage in ("int8", "nf4"):
        raise InvalidWorkloadError(
            f"full fine-tuning cannot train {workload.weight_storage} weights; use method "
            "'qlora' (adapters over quantized weights) or bf16 / fp32 weights",
            field="workload.weights",
        )
    if arch.positions and workload.seq_len > arch.positions:
        raise InvalidWorkloadError(
            f"seq_len {workload.seq_len} is longer than the model's learned positions "
            f"({arch.positions})",
            field="workload.seq_len",
        )


def _lora_targets(layout: ParamLayout, workload: Workload) -> frozenset[str]:
    """Block linears the adapters go on: every one by default, else those matching by suffix."""
    names = [linear.name for linear in layout.linears]
    if workload.method == "full":
        return frozenset()
    if workload.lora_targets is None:
        return frozenset(names)
    chosen: set[str] = set()
    for target in workload.lora_targets:
        matched = [n for n in names if n == target or n.endswith("." + target)]
        if not matched:
            raise InvalidWorkloadError(
                f"lora target {target!r} matches no linear layer of this model; its block "
                f"linears are {', '.join(names)}",
                field="workload.lora_targets",
            )
        chosen.update(matched)
    return frozenset(chosen)


def _attention(arch: Arch, requested: str) -> tuple[str, str]:
    """The kernel transformers would run, and a note when it differs from the request."""
    effective = requested
    if effective == "flash_attention_2" and arch.model_type in NO_FLASH:
        effective = "sdpa"
    if effective == "sdpa" and arch.model_type in NO_SDPA:
        effective = "eager"
    note = ""
    if effective != requested:
        note = f"{arch.model_type} does not support {requested} in transformers: {effective} runs"
    return _KERNEL[effective], note


def estimate_tiers(run: Run, gpu_memory_gb: float | None) -> dict[str, Any]:
    """The estimate dict: assumptions and, per tier, activations, both peaks, FLOPs, verdict."""
    budget = _budget(gpu_memory_gb, run.workload.headroom)
    context, context_source = run.context
    memory = all_tiers(run.facts.arch, run.step, run.static, run.recipe, context_bytes=context)
    tiers = {
        tier: {
            "activation_bytes": item.activation_bytes,
            "allocated_bytes": item.allocated_bytes,
            "peak_bytes": item.peak_bytes,
            "recompute_flops_ratio": round(recompute_ratio(run.facts.arch, run.step, tier), 4),
            **verdict(item.peak_bytes, budget, TIGHT_BANDS[run.step.attention]),
        }
        for tier, item in memory.items()
    }
    assumptions = _assumptions(run, gpu_memory_gb, budget, memory)
    assumptions["cuda_context_bytes"] = context
    assumptions["cuda_context_source"] = context_source
    assumptions["tight_band"] = TIGHT_BANDS[run.step.attention]
    return {"assumptions": assumptions, "tiers": tiers}


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


def choose(run: Run, estimate: Mapping[str, Any], gpu_memory_gb: float | None) -> Choice:
    """``auto`` with a model: the cheapest tier that fits, or full with the reason why."""
    tiers = estimate["tiers"]
    if gpu_memory_gb is None:
        return Choice(
            "full",
            "auto with a model but no GPU memory: full, the safe choice (the estimate lists "
            "each tier's peak; pass gpu_memory_gb or gpu to choose by it)",
        )
    budget = estimate["assumptions"]["budget_bytes"]
    where = f"{_gib(budget)} usable of {gpu_memory_gb:.1f} GiB (headroom {run.workload.headroom:g})"
    for tier in CONCRETE_TIERS:
        if tiers[tier]["fits"]:
            chosen = None if tier == "off" else tier
            reason = (
                f"auto: {tier} is the cheapest tier that fits, estimated peak "
                f"{_gib(tiers[tier]['peak_bytes'])} <= {where}"
            )
            reason += tight_note(tiers[tier], estimate["assumptions"]["tight_band"])
            return Choice(chosen, reason + selective_note(run, estimate, tier))
    reason = (
        f"auto: nothing fits - even full needs an estimated {_gib(tiers['full']['peak_bytes'])} "
        f"> {where}; {_what_would_fit(run, budget)}"
    )
    return Choice("full", reason)


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


def _what_would_fit(run: Run, budget: int) -> str:
    """Computed alternatives: shorter sequence, smaller micro-batch, LoRA, 4-bit."""
    workload = run.workload
    options = []
    seq = _largest(lambda s: replace(workload, seq_len=s), workload.seq_len - 1, run, budget)
    if seq:
        options.append(f"seq_len <= {seq} fits with full")
    if workload.micro_batch_size > 1:
        batch = _largest(
            lambda b: replace(workload, micro_batch_size=b),
            workload.micro_batch_size - 1,
            run,
            budget,
        )
        if batch:
            options.append(f"micro_batch_size <= {batch} fits with full")
    for label, changed in _cheaper_methods(workload):
        tier = _first_fitting(run, changed, budget)
        if tier:
            options.append(f"{label} fits with {tier}")
    if not options:
        return (
            f"no shorter sequence, smaller micro-batch, LoRA or 4-bit setting fits: weights, "
            f"gradients and optimizer states alone take {_gib(run.static.total)}"
        )
    return "what would fit: " + "; ".join(options)


def _cheaper_methods(workload: Workload) -> list[tuple[str, Workload]]:
    methods = []
    if workload.method == "full":
        methods.append(("LoRA (bf16 base)", replace(workload, method="lora", weights=None)))
    if workload.method != "qlora" or workload.weight_storage != "nf4":
        methods.append(("QLoRA (4-bit nf4 base)", replace(workload, method="qlora", weights="nf4")))
    return methods


def _full_peak(run: Run, workload: Workload, *, replay: bool = True) -> int:
    other = prepare(run.facts, workload, run.gpu)
    return tier_memory(
        other.facts.arch,
        other.step,
        "full",
        other.static,
        other.recipe,
        context_bytes=other.context[0],
        replay=replay,
    ).peak_bytes


def _largest(make: Any, upper: int, run: Run, budget: int) -> int:
    """The largest value in [1, upper] whose full-tier peak fits (peaks grow with it).

    Bracketed first without the allocator replay (cheap), then searched with it.
    """

    def search(low: int, high: int, replay: bool) -> int:
        while low < high:
            middle = (low + high + 1) // 2
            if _full_peak(run, make(middle), replay=replay) <= budget:
                low = middle
            else:
                high = middle - 1
        return low

    bound = search(0, upper, replay=False)
    answer = search(0, bound, replay=True)
    if answer == bound < upper and _full_peak(run, make(bound + 1)) <= budget:
        answer = search(bound + 1, upper, replay=True)
    return answer


def _first_fitting(run: Run, workload: Workload, budget: int) -> str | None:
    other = prepare(run.facts, workload, run.gpu)
    for tier in CONCRETE_TIERS:
        memory = tier_memory(
            other.facts.arch,
            other.step,
            tier,
            other.static,
            other.recipe,
            context_bytes=other.context[0],
        )
        if memory.peak_bytes <= budget:
            return tier
    return None


def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:.1f} GiB"


@dataclass(frozen=True, slots=True)
class Advice:
    """What `make_plan` needs from a model-aware resolution of a tier."""

    granularity: str | None
    reason: str
    description: str
    estimate: dict[str, Any]


def advise(
    tier: str,
    model: object,
    workload: object,
    gpu_memory_gb: float | None,
    gpu: str | None = None,
) -> Advice:
    """Estimate every tier for the model and workload; resolve ``auto`` by the estimate.

    An explicit tier is kept as asked; the reason says whether it fits.  ``gpu``
    (a GPU-table name) selects its measured CUDA context.
    """
    run = prepare(model_facts(model), parse_workload(workload), gpu)
    estimate = estimate_tiers(run, gpu_memory_gb)
    if tier == "auto":
        choice = choose(run, estimate, gpu_memory_gb)
        chosen = choice.granularity or "off"
        description = (
            f"auto → {chosen} (estimated for {run.facts.arch.model_type}, "
            f"seq_len {run.workload.seq_len} x micro-batch {run.workload.micro_batch_size})"
        )
        return Advice(choice.granularity, choice.reason, description, estimate)
    from ckpt_core._planning.tiers import describe

    granularity = None if tier == "off" else tier
    reason = f"tier {tier!r} requested; {_fit_sentence(estimate, tier)}"
    reason += selective_note(run, estimate, tier) if tier == "selective" else ""
    return Advice(granularity, reason, describe(tier, gpu_memory_gb), estimate)  # type: ignore[arg-type]


def _fit_sentence(estimate: Mapping[str, Any], tier: str) -> str:
    row = estimate["tiers"][tier]
    budget = estimate["assumptions"]["budget_bytes"]
    peak = f"estimated peak {_gib(row['peak_bytes'])}"
    if budget is None:
        return f"{peak} (no GPU memory given, fit not judged)"
    verdict = "fits" if row["fits"] else "does NOT fit"
    note = tight_note(row, estimate["assumptions"]["tight_band"])
    return f"{peak} {verdict} the {_gib(budget)} usable{note}"
