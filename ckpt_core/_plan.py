"""The plan: one answer that the library, the CLI, the service and workers share.

`make_plan` turns a tier (+ GPU memory or GPU name, + transformers version)
into a `Plan`: the granularity, the TrainingArguments kwargs that make the HF
Trainer do exactly that, the hooks the worker must install, and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ckpt_core._errors import ModelConfigError
from ckpt_core._planning.block_plan import BlockPlan
from ckpt_core._planning.engine_args import engine_sentence, engine_settings
from ckpt_core._planning.gpus import gpu_memory_for, lookup_gpu
from ckpt_core._planning.tiers import (
    AUTO_FULL_THRESHOLD_GB,
    AUTO_SELECTIVE_THRESHOLD_GB,
    PlanGranularity,
    Tier,
    describe,
    granularity_for,
    parse_tier,
)
from ckpt_core._planning.training_args import (
    EVERY_N_LAYERS_SINCE,
    ROTARY_MUL_SINCE,
    PlanHookKind,
    installed_transformers_version,
    parse_transformers_version,
    trainer_settings,
)
from ckpt_core._planning.workload import Workload

if TYPE_CHECKING:
    from ckpt_core._configs.model_config import ModelConfig

# The newest behaviour we know, used when no version is given and none is installed.
ASSUMED_TRANSFORMERS_VERSION = "5.24.0"


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do for one training job: JSON-serialisable via `to_dict`.

    ``training_arguments`` goes into ``TrainingArguments(**...)``; ``hooks``
    (``"medium"`` / ``"selective"`` / ``"blocks"`` / ``None``) is the granularity the worker
    must install with `install_checkpoint_hooks` after PEFT wrapping.
    ``estimate`` is the per-tier memory estimate when a model was given;
    ``gpu`` is the canonical GPU-table name when the caller named a GPU.
    ``block_plan`` is set when ``auto`` chose a plan between the tiers
    (granularity ``"blocks"``): ``{"blocks": N, "full": [...], "selective":
    [...], "every_n_layers": N | None}``, blocks numbered by HF's cross-stack
    counter (`BlockPlan`); HF does it when ``every_n_layers`` is set and the
    release knows the kwarg, else the worker's ``"blocks"`` hooks do.
    """

    tier: Tier
    granularity: PlanGranularity | None
    training_arguments: dict[str, Any]
    hooks: PlanHookKind | None
    description: str
    reason: str
    gpu_memory_gb: float | None = None
    gpu: str | None = None
    transformers_version: str = ASSUMED_TRANSFORMERS_VERSION
    estimate: dict[str, Any] | None = field(default=None)
    block_plan: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A plain-JSON dict (deep copy: mutating it never changes the plan).

        ``block_plan`` appears only when set: a tier's answer is the same JSON
        as before block-level plans existed.
        """
        data = asdict(self)
        if data["block_plan"] is None:
            del data["block_plan"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """Rebuild a plan from `to_dict` output (e.g. a service answer)."""
        return cls(**data)


def resolve_gpu_memory(gpu_memory_gb: object = None, gpu: str | None = None) -> float | None:
    """GPU memory in GiB from a number or a GPU name (not both), validated."""
    return gpu_memory_for(gpu_memory_gb, gpu)


def make_plan(
    tier: object,
    gpu_memory_gb: object = None,
    *,
    gpu: str | None = None,
    transformers_version: str | None = None,
    model: Mapping[str, Any] | ModelConfig | None = None,
    workload: Mapping[str, Any] | Workload | None = None,
) -> Plan:
    """Resolve a tier into a `Plan`.

    Without a model, ``auto`` uses the seed's VRAM thresholds.  With ``model``
    (``{"preset": NAME}``, ``{"config": {...}}``, or a `ModelConfig` already
    validated by `load_model_config` against caller-chosen bounds) and ``workload`` (at least
    ``seq_len``; see `Workload`), every tier is estimated (``Plan.estimate``)
    and ``auto`` picks the least recompute whose peak fits the GPU memory less
    the headroom - a tier, or a block-level plan (``granularity="blocks"``,
    ``Plan.block_plan``) - full when no GPU memory is given, or when nothing
    fits (``estimate["alternatives"]`` and the reason then say what would).
    Bad input raises the `CkptError` subclass naming the field
    (``workload.seq_len``, ``model.preset``, ...).
    """
    parsed = parse_tier(tier)
    memory = resolve_gpu_memory(gpu_memory_gb, gpu)
    version_text = transformers_version
    if version_text is None:
        version_text = installed_transformers_version() or ASSUMED_TRANSFORMERS_VERSION
    version = parse_transformers_version(version_text)
    gpu_name = lookup_gpu(gpu).name if gpu is not None else None
    estimate: dict[str, Any] | None = None
    parsed_workload: Workload | None = None
    block_plan: BlockPlan | None = None
    if model is None:
        if workload is not None:
            raise ModelConfigError(
                "a workload was given without a model: the estimate needs both", field="model"
            )
        granularity = granularity_for(parsed, memory)
        why = _why_granularity(parsed, granularity, memory, gpu_name)
        description = describe(parsed, memory)
    else:
        from ckpt_core._memory.advise import advise  # only when a model is given
        from ckpt_core._memory.inputs import parse_workload
        from ckpt_core._memory.sharding import host_sentence

        rotary_matmul = version < ROTARY_MUL_SINCE
        advice = advise(parsed, model, workload, memory, gpu_name, rotary_matmul=rotary_matmul)
        parsed_workload = parse_workload(workload)
        granularity, why = advice.granularity, advice.reason  # type: ignore[assignment]
        description, estimate = advice.description, advice.estimate
        host = host_sentence(estimate["assumptions"])
        why = f"{why}; {host}" if host else why
        block_plan = advice.block_plan
    # The data-parallel engine's form of the same checkpointing (FSDP2: fsdp_config): issue 17.
    settings = engine_settings(
        trainer_settings(granularity, version, block_plan), granularity, version, parsed_workload
    )
    how = engine_sentence(granularity, parsed_workload) or _how(
        granularity, settings.hooks, version_text, block_plan
    )
    return Plan(
        tier=parsed,
        granularity=granularity,
        training_arguments=settings.training_arguments,
        hooks=settings.hooks,
        description=description,
        reason=f"{why}; {how}",
        gpu_memory_gb=memory,
        gpu=gpu_name,
        transformers_version=version_text,
        estimate=estimate,
        block_plan=None if block_plan is None else block_plan.to_dict(),
    )


def _why_granularity(
    tier: Tier, granularity: PlanGranularity | None, memory: float | None, gpu: str | None
) -> str:
    if tier != "auto":
        return f"tier {tier!r} requested"
    if memory is None:
        return "auto without GPU memory: full, the safe choice"
    where = f" ({gpu})" if gpu else ""
    if granularity == "full":
        rule = f"< {AUTO_FULL_THRESHOLD_GB:g} GiB"
    elif granularity == "medium":
        rule = f"between {AUTO_FULL_THRESHOLD_GB:g} and {AUTO_SELECTIVE_THRESHOLD_GB:g} GiB"
    else:
        rule = f"> {AUTO_SELECTIVE_THRESHOLD_GB:g} GiB"
    return f"auto with {memory:g} GiB{where} {rule} -> {granularity} (VRAM thresholds, no model)"


def _how(
    granularity: PlanGranularity | None,
    hooks: PlanHookKind | None,
    version_text: str,
    block_plan: BlockPlan | None = None,
) -> str:
    version = f"transformers {version_text}"
    if block_plan is not None:
        return _how_blocks(block_plan, hooks, version)
    if granularity is None:
        return f"HF checkpointing explicitly off ({version})"
    if granularity == "full":
        return f"HF checkpoints every block, non-reentrant ({version})"
    if granularity == "medium" and hooks is None:
        return f"HF checkpoints every other block via every_n_layers=2 ({version})"
    if granularity == "medium":
        since = ".".join(map(str, EVERY_N_LAYERS_SINCE))
        return (
            f"{version} has no every_n_layers (needs >= {since}): HF off, "
            "worker installs medium hooks (every other block)"
        )
    return f"HF off, worker installs selective hooks on the attention modules ({version})"


def _how_blocks(plan: BlockPlan, hooks: PlanHookKind | None, version: str) -> str:
    if hooks is None:
        return (
            f"HF checkpoints one block in {plan.every_n_layers} via "
            f"every_n_layers={plan.every_n_layers} ({version})"
        )
    selective = f", attention of blocks {list(plan.selective)}" if plan.selective else ""
    return (
        f"HF off, worker installs blocks hooks (plan.block_plan): whole blocks "
        f"{list(plan.full)}{selective}, numbered across stacks as HF counts them ({version})"
    )
