"""Response bodies (pydantic v2): they mirror `Plan`, `DryRunReport` and `PresetInfo`
field for field (a test keeps them in step), and the one error shape."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ckpt_core import Granularity, PlanGranularity, PlanHookKind, Tier


class _Response(BaseModel):
    model_config = ConfigDict(protected_namespaces=())


class PlanResponse(_Response):
    """A `ckpt_core.Plan`: pass `training_arguments` to TrainingArguments, install `hooks`."""

    tier: Tier
    granularity: PlanGranularity | None = Field(
        description="What is checkpointed: a tier, or 'blocks' for a block-level plan."
    )
    training_arguments: dict[str, Any]
    hooks: PlanHookKind | None = Field(description="Hooks the worker must install, or null.")
    description: str
    reason: str = Field(description="Why this granularity, and how it is applied.")
    gpu_memory_gb: float | None = Field(description="GiB used for the decision.")
    gpu: str | None = Field(description="Canonical GPU name when one was given.")
    transformers_version: str
    estimate: dict[str, Any] | None = Field(
        description="With a model and workload: the assumptions, per tier the activation, "
        "allocated and process-memory peak bytes with a verdict, the chosen plan and, when "
        "nothing fits, the alternatives; else null."
    )
    # Left out when null, as `Plan.to_dict` does: a tier's answer is unchanged.
    block_plan: dict[str, Any] | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="A block-level plan's blocks (HF's counting): full, selective, "
        "every_n_layers; only when granularity is 'blocks'.",
    )


class DescribeResponse(_Response):
    tier: Tier
    granularity: Granularity | None
    description: str


class DryRunResponse(_Response):
    """A `ckpt_core.DryRunReport`."""

    tier: Tier
    granularity: PlanGranularity | None
    model_type: str
    architecture: str = Field(description="The transformers model class built.")
    parameters: int = Field(description="Parameters of the meta-built model.")
    blocks: int = Field(description="Transformer blocks found (every stack).")
    hooked: int = Field(description="Modules the tier checkpoints.")
    modules: list[str] = Field(description="Their names.")
    native: bool = Field(description="HF's own checkpointing does this tier (no worker hooks).")
    measured: dict[str, Any] | None = Field(description="Activation bytes, when measured.")
    elapsed_ms: float = Field(description="Time of the dry run itself (cache hits repeat it).")
    # Left out when null, as `DryRunReport.to_dict` does.
    reason: str | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="With tier auto: the rule it chose by.",
    )
    block_plan: dict[str, Any] | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="A block-level plan's blocks, as in /resolve.",
    )


class PresetSummary(_Response):
    name: str
    model_type: str
    architecture: str | None
    published_parameters: int = Field(description="Parameter count the model card states.")
    source: str = Field(description="The repository the config.json comes from.")


class PresetsResponse(_Response):
    presets: list[PresetSummary]


class ErrorResponse(_Response):
    """Every 4xx / 5xx body."""

    error: str = Field(description="Stable error code, e.g. invalid_tier, config_too_large.")
    detail: str = Field(description="What is wrong, for a person.")
    field: str | None = Field(description="Path of the offending input, e.g. workload.seq_len.")


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries with the error body for the given statuses."""
    descriptions = {
        400: "The body is not valid JSON (syntax, NaN / Infinity, out-of-range numbers).",
        413: "The body is larger than the limit.",
        415: "The body is not application/json.",
        422: "A value is invalid; `field` names it.",
        429: "Every worker of the pool behind this operation (dry runs; estimates with a "
        "model) is busy and its queue is full; see Retry-After.",
        501: "The request needs a feature this build does not have.",
        503: "The worker running the job died; it is being replaced: retry.",
        504: "The job (a dry run, an estimate) hit its time limit.",
    }
    return {s: {"model": ErrorResponse, "description": descriptions[s]} for s in statuses}
