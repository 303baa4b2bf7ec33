"""Request and response bodies (pydantic v2): shapes and documentation, no logic.

Values that ckpt_core validates (tier, GPU memory, GPU name, transformers
version, workload, measurement shape) are accepted here as any JSON and
passed through unchanged, so the service has exactly one validator - ckpt_core's,
with its clear messages and field paths - while the OpenAPI document still
shows their types.  Response models mirror `Plan`, `DryRunReport` and
`PresetInfo` field for field (a test keeps them in step).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from ckpt_core import Granularity, PlanGranularity, PlanHookKind, Tier

_NUMBER_OR_NULL = {"anyOf": [{"type": "number"}, {"type": "null"}]}
_STRING_OR_NULL = {"anyOf": [{"type": "string"}, {"type": "null"}]}
_OBJECT_OR_NULL = {"anyOf": [{"type": "object"}, {"type": "null"}]}

TierField = Annotated[
    Any,
    WithJsonSchema({"anyOf": [{"type": "boolean"}, {"type": "string"}, {"type": "null"}]}),
    Field(
        description="off | full | medium | selective | auto (trimmed, case-insensitive), "
        "true (full), false / null / '' (off). Anything else is a 422 naming the valid tiers.",
        examples=["auto"],
    ),
]
GpuMemoryField = Annotated[
    Any,
    WithJsonSchema(_NUMBER_OR_NULL),
    Field(
        description="Total GPU memory in GiB (2**30 bytes) as torch reports it; "
        "finite, > 0, <= 4096. Give this or `gpu`, not both.",
        examples=[79.2],
    ),
]
GpuField = Annotated[
    Any,
    WithJsonSchema(_STRING_OR_NULL),
    Field(
        description="A GPU model name from the GPU table, e.g. A100-80GB.", examples=["H100-80GB"]
    ),
]
TransformersVersionField = Annotated[
    Any,
    WithJsonSchema(_STRING_OR_NULL),
    Field(
        description="The worker's transformers version (decides the TrainingArguments "
        "names); default: the service's installed version.",
        examples=["5.24.0"],
    ),
]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class ModelSpec(_Request):
    """Exactly one of `preset` (a bundled config, see GET /presets) or `config`."""

    model_config = ConfigDict(
        strict=True,
        json_schema_extra={
            "examples": [
                {"preset": "llama-3.1-8b"},
                {
                    "config": {
                        "model_type": "llama",
                        "hidden_size": 256,
                        "intermediate_size": 512,
                        "num_hidden_layers": 4,
                        "num_attention_heads": 4,
                        "vocab_size": 1000,
                    }
                },
            ]
        },
    )

    preset: str | None = Field(None, description="Name of a bundled preset.")
    config: dict[str, Any] | None = Field(
        None,
        description="Inline HF config.json content. Bounded (layers, widths, vocabulary, "
        "experts, parameters); auto_map / remote code is refused.",
    )

    def as_mapping(self) -> dict[str, Any]:
        """The ``{"preset": ...}`` / ``{"config": ...}`` mapping ckpt_core takes."""
        return self.model_dump(exclude_none=True)


class ResolveRequest(_Request):
    """Resolve a tier into TrainingArguments kwargs and worker hooks."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"tier": "auto", "gpu": "A100-80GB"},
                {"tier": "medium", "gpu_memory_gb": 23.6, "transformers_version": "5.10.0"},
                {
                    "tier": "auto",
                    "gpu": "H100-80GB",
                    "model": {"preset": "llama-3.1-8b"},
                    "workload": {"seq_len": 4096, "micro_batch_size": 2, "method": "lora"},
                },
            ]
        }
    )

    tier: TierField = None
    gpu_memory_gb: GpuMemoryField = None
    gpu: GpuField = None
    transformers_version: TransformersVersionField = None
    model: ModelSpec | None = Field(
        None, description="The model; with a workload, every tier is estimated."
    )
    workload: Annotated[
        Any,
        WithJsonSchema(_OBJECT_OR_NULL),
        Field(
            description="The training step (required with a model): seq_len (required), "
            "micro_batch_size, dtype, weights, method, lora_rank, lora_targets, optimizer, "
            "attention, headroom.",
            examples=[{"seq_len": 4096, "micro_batch_size": 2, "method": "lora"}],
        ),
    ] = None


class DryRunRequest(_Request):
    """Build a model on the meta device, install the tier's hooks, report what was hooked."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"model": {"preset": "llama-3.2-1b"}, "tier": "selective"},
                {
                    "model": {"preset": "qwen2.5-7b"},
                    "tier": "auto",
                    "gpu": "A100-80GB",
                    "measure": {"seq_len": 2048, "micro_batch_size": 1},
                },
            ]
        }
    )

    model: ModelSpec
    tier: TierField = None
    gpu_memory_gb: GpuMemoryField = None
    gpu: GpuField = None
    transformers_version: TransformersVersionField = None
    measure: Annotated[
        Any,
        WithJsonSchema(_OBJECT_OR_NULL),
        Field(
            description="Measure activation bytes for one batch x sequence: seq_len "
            "(required), micro_batch_size, dtype, attention.",
            examples=[{"seq_len": 2048, "micro_batch_size": 1}],
        ),
    ] = None

    def as_kwargs(self) -> dict[str, Any]:
        """`ckpt_core.dry_run` keyword arguments."""
        return {
            "model": self.model.as_mapping(),
            "tier": self.tier,
            "gpu_memory_gb": self.gpu_memory_gb,
            "gpu": self.gpu,
            "transformers_version": self.transformers_version,
            "measure": self.measure,
        }


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
        429: "Every dry-run worker is busy and the queue is full; see Retry-After.",
        501: "The request needs a feature this build does not have.",
        503: "The dry-run worker died; it is being replaced.",
        504: "The dry run hit its time limit.",
    }
    return {s: {"model": ErrorResponse, "description": descriptions[s]} for s in statuses}
