"""Dry run on the meta device (docs/design.md §4): what a tier would checkpoint on a model.

Resolve the tier into a `Plan`, validate the model config, build the model on
``torch.device("meta")`` (no weights, no download), install the hooks of the
plan's granularity - also for full / medium, where HF's own checkpointing may
do the work in training, so the report shows which modules the tier covers -
and optionally measure the activation bytes autograd keeps for one
batch x sequence.  Importing this module loads no torch: the model-touching
modules are imported when a dry run runs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Final

from ckpt_core._configs.config_json import ConfigLimits
from ckpt_core._configs.model_config import build_meta_model, count_parameters, load_model_config
from ckpt_core._errors import InvalidWorkloadError
from ckpt_core._memory.families import MODEL_TYPE_FAMILIES
from ckpt_core._plan import make_plan
from ckpt_core._planning.gpus import lookup_gpu
from ckpt_core._planning.tiers import PlanGranularity, Tier
from ckpt_core._planning.workload import Workload

if TYPE_CHECKING:
    from torch import nn

# What a measurement may be asked for; the rest of a workload does not change
# the activation bytes.  Validated by `Workload`, reported back as given.
MEASURE_FIELDS: Final = (
    "seq_len",
    "micro_batch_size",
    "dtype",
    "attention",
    "padded",
    "world_size",
    "sharding",
)
# What the activation measurement takes; world_size / sharding, when given, add the per-GPU
# parameters (reported only then, so a plain measurement reads as before).
_ACTIVATION_FIELDS: Final = MEASURE_FIELDS[:5]
_DISTRIBUTED_FIELDS: Final = MEASURE_FIELDS[5:]


@dataclass(frozen=True, slots=True)
class DryRunReport:
    """What a tier checkpoints on one model, built on meta; JSON via `to_dict`.

    ``native`` is true when HF's own checkpointing does this tier for the
    given transformers version (the worker installs no hooks); ``modules``
    then still lists the blocks HF wraps.  ``measured`` is None, or the
    activation bytes of one forward with labels for the requested shape.
    ``reason`` (``auto`` only) says how the granularity was chosen: with a
    measurement shape, as `make_plan` chooses for that workload (model-aware,
    ``block_plan`` set when it chose blocks between the tiers); without one, or
    for a model type the estimate does not describe, by the VRAM thresholds.
    Both appear in `to_dict` only when set.
    """

    tier: Tier
    granularity: PlanGranularity | None
    model_type: str
    architecture: str
    parameters: int
    blocks: int
    hooked: int
    modules: tuple[str, ...]
    native: bool
    measured: dict[str, Any] | None
    elapsed_ms: float
    reason: str | None = None
    block_plan: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["modules"] = list(self.modules)
        for key in ("reason", "block_plan"):
            if data[key] is None:
                del data[key]
        return data


def dry_run(
    model: Mapping[str, Any],
    tier: object,
    gpu_memory_gb: object = None,
    *,
    gpu: str | None = None,
    transformers_version: str | None = None,
    measure: Mapping[str, Any] | None = None,
    limits: ConfigLimits | None = None,
) -> DryRunReport:
    """Build ``model`` (``{"preset": ...}`` or ``{"config": {...}}``) on meta and hook ``tier``.

    ``measure`` (``{"seq_len": ..., "micro_batch_size": ..., "dtype": ...,
    "attention": ...}``, all but ``seq_len`` optional) adds a meta-device
    measurement of the activation bytes; with ``world_size`` / ``sharding``
    also the parameters each GPU keeps (``parameters_per_gpu``, counted on
    the built model's shapes as FSDP2 shards them).  Errors are the ckpt_core errors of
    the input at fault (tier, GPU, model config, measure fields).
    """
    started = time.perf_counter()
    # tier, GPU and version are checked before the model is loaded
    plan = make_plan(tier, gpu_memory_gb, gpu=gpu, transformers_version=transformers_version)
    gpu_name = lookup_gpu(gpu).name if gpu is not None else None
    shape = measure_shape(measure)
    cfg = load_model_config(model, limits=limits)
    # auto with a shape chooses by the model as make_plan does, where the estimate
    # describes the model; a dry run measures any model, so otherwise the thresholds
    # decide and the reason says why.
    estimated = cfg.model_type in MODEL_TYPE_FAMILIES
    if shape is not None and plan.tier == "auto" and not estimated:
        plan = replace(
            plan,
            reason=f"{plan.reason}; the estimate has no memory model for model_type "
            f"{cfg.model_type!r}, so the model did not decide",
        )
    elif shape is not None and plan.tier == "auto":
        plan = make_plan(
            tier,
            gpu_memory_gb,
            gpu=gpu,
            transformers_version=transformers_version,
            model=cfg,
            workload=shape,
        )
    built = build_meta_model(cfg, attention=shape.attention if shape else None, limits=limits)
    blocks, modules = _cover(built, plan.granularity, plan.block_plan)
    per_gpu = measure is not None and any(name in measure for name in _DISTRIBUTED_FIELDS)
    measured = (
        _measure(built, plan.granularity, shape, plan.block_plan, per_gpu=per_gpu, gpu=gpu_name)
        if shape
        else None
    )
    return DryRunReport(
        tier=plan.tier,
        granularity=plan.granularity,
        model_type=cfg.model_type,
        architecture=cfg.architecture,
        parameters=count_parameters(built),
        blocks=blocks,
        hooked=len(modules),
        modules=modules,
        native=plan.granularity is not None and plan.hooks is None,
        measured=measured,
        elapsed_ms=round((time.perf_counter() - started) * 1000, 1),
        reason=plan.reason if plan.tier == "auto" else None,
        block_plan=plan.block_plan,
    )


def _cover(
    model: nn.Module, granularity: PlanGranularity | None, block_plan: dict[str, Any] | None
) -> tuple[int, tuple[str, ...]]:
    """(number of blocks, names of the modules the granularity checkpoints)."""
    if granularity is None:
        from ckpt_core._hooks.blocks import find_blocks

        return sum(len(stack) for stack in find_blocks(model).values()), ()
    from ckpt_core._hooks.install import install_checkpoint_hooks

    report = install_checkpoint_hooks(model, granularity, block_plan=block_plan)
    return len(report.blocks), report.hooked


def measure_shape(measure: Mapping[str, Any] | None) -> Workload | None:
    """The measurement shape as a validated `Workload`; errors name ``measure.<field>``."""
    if measure is None:
        return None
    if not isinstance(measure, Mapping):
        raise InvalidWorkloadError("measure must be an object", field="measure")
    unknown = sorted(set(measure) - set(MEASURE_FIELDS))
    if unknown:
        raise InvalidWorkloadError(
            f"unknown measure field(s) {unknown}; known: {list(MEASURE_FIELDS)}",
            field=f"measure.{unknown[0]}",
        )
    with _as_measure_errors():
        return Workload.from_dict(measure)


@contextlib.contextmanager
def _as_measure_errors() -> Iterator[None]:
    """Name workload errors ``measure.<field>``: that is what the caller sent."""
    try:
        yield
    except InvalidWorkloadError as exc:
        field = (exc.field or "workload").replace("workload", "measure", 1)
        raise InvalidWorkloadError(exc.message.replace("workload", "measure"), field=field) from exc


def _measure(
    model: nn.Module,
    granularity: PlanGranularity | None,
    shape: Workload,
    block_plan: dict[str, Any] | None,
    *,
    per_gpu: bool,
    gpu: str | None,
) -> dict[str, Any]:
    """Activation bytes of ``model`` for ``shape``, by the meta-device measurement on
    ``gpu`` (a GPU-table name, or None).

    The model already carries the hooks of ``granularity``; the measurement
    uses them as they are.
    """
    from ckpt_core._meta.measure import measure_activation_bytes

    names = MEASURE_FIELDS if per_gpu else _ACTIVATION_FIELDS
    requested = {f.name: getattr(shape, f.name) for f in fields(shape) if f.name in names}
    activation = {k: v for k, v in requested.items() if k in _ACTIVATION_FIELDS}
    with _as_measure_errors():  # e.g. seq_len beyond GPT-2's learned positions
        activation_bytes = measure_activation_bytes(
            model, granularity, block_plan=block_plan, gpu=gpu, **activation
        )
    measured = {"activation_bytes": int(activation_bytes), **requested}
    if per_gpu:
        measured.update(parameters_per_gpu(model, shape.world_size, shape.sharding))
    return measured


def parameters_per_gpu(model: nn.Module, world_size: int, sharding: str) -> dict[str, int]:
    """Parameters one GPU keeps at rest, counted on the built model's own shapes.

    zero2 / zero3 shard each parameter along dim 0 as FSDP2's ``fully_shard``
    does: ``ceil(rows / world_size)`` rows per rank, the last ranks padded, so
    this is what ranks allocate (rank 0's shard, the largest).  Otherwise every
    GPU keeps the whole model.
    """
    sharded = sharding in ("zero2", "zero3")
    total = 0
    for parameter in model.parameters():
        if not sharded or parameter.dim() == 0:
            total += parameter.numel()
            continue
        rows = parameter.shape[0]
        total += -(-rows // world_size) * (parameter.numel() // rows if rows else 0)
    return {"parameters_per_gpu": total}
