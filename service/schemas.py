"""Request and response bodies (pydantic v2): the contract's types, choices and ranges.

Request fields carry their real types and bounds, built from ckpt_core's constants
(`service.contract` states the rules once, for the document and the validators;
`service.schema_rules` the cross-field ones);
values that pass are handed to ckpt_core in canonical spelling, and ckpt_core's
own checks - the cross-field ones included, which the models document with
``anyOf`` / ``not`` - still run, with their messages and fields.  Response models
are in `service.responses`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from ckpt_core import (
    ATTENTIONS,
    COMPUTES,
    DTYPES,
    ENGINES,
    GRADIENTS,
    KBIT_PREPARATIONS,
    LOAD_PATHS,
    MAX_HEADROOM,
    MAX_HOST_MEMORY_GB,
    MAX_LORA_RANK,
    MAX_MICRO_BATCH,
    MAX_SEQ_LEN,
    MAX_WORLD_SIZE,
    METHODS,
    OFFLOADS,
    OPTIMIZERS,
    SDPA_BACKENDS,
    SHARDINGS,
    WEIGHT_STORAGES,
    InvalidTierError,
    UnknownGpuError,
    UnknownPresetError,
    lookup_gpu,
    parse_tier,
)
from service.contract import (
    CHOICE_RULE,
    GPU_CHOICE,
    GPU_MEMORY_SCHEMA,
    PRESET_CHOICE,
    TIER_CHOICE,
    VERSION_PATTERN,
    Choice,
    choice_validator,
    gpu_memory,
    transformers_version,
)
from service.schema_rules import (
    ESTIMATED_MODEL_TYPES,
    MEASURABLE_SHARDING,
    NOT_GPU_AND_MEMORY,
    PRECISION,
    SHARDING,
    no_adafactor_on_experts,
    not_beyond_positions,
)

_NULL = {"type": "null"}


def _integral(value: Any) -> Any:
    """JSON Schema counts 4.0 as an integer; ckpt_core takes an int."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JsonInt = Annotated[int, BeforeValidator(_integral)]


def _tier(value: Any) -> Any:
    if value is None or isinstance(value, bool):
        return value
    return _TIER_NAME(value)


def refuse_gpu(value: object) -> None:
    if not isinstance(value, str):
        raise UnknownGpuError(f"gpu must be a GPU name, got {value!r}", field="gpu")
    lookup_gpu(value)


def _refuse_preset(value: object) -> None:
    if not isinstance(value, str):
        return  # a type error, not a name
    names = ", ".join(PRESET_CHOICE.words)
    raise UnknownPresetError(
        f"unknown preset {value!r}; known presets: {names}", field="model.preset"
    )


_TIER_NAME = choice_validator(TIER_CHOICE, parse_tier, error=InvalidTierError, field="tier")

TierField = Annotated[
    bool | str | None,
    BeforeValidator(_tier),
    WithJsonSchema(
        {"anyOf": [{"type": "boolean"}, _NULL, TIER_CHOICE.schema()]},
    ),
    Field(
        description="Required. off | full | medium | selective | auto; true (full); "
        "false, null, '', 'none', 'false' (off). " + CHOICE_RULE,
        examples=["auto"],
    ),
]
GpuMemoryField = Annotated[
    float | int | None,
    BeforeValidator(gpu_memory),
    WithJsonSchema({"anyOf": [GPU_MEMORY_SCHEMA, _NULL]}),
    Field(
        description="Total GPU memory in GiB (2**30 bytes) as torch reports it; "
        "> 0, <= 4096. Give this or `gpu`, not both.",
        examples=[79.2],
    ),
]
GpuField = Annotated[
    str | None,
    BeforeValidator(
        choice_validator(GPU_CHOICE, refuse_gpu, nullable=True, error=UnknownGpuError, field="gpu")
    ),
    WithJsonSchema({"anyOf": [GPU_CHOICE.schema(), _NULL]}),
    Field(
        description="A GPU model name or alias from the GPU table (e.g. A100-80GB, "
        "'NVIDIA H100 80GB HBM3'). " + CHOICE_RULE,
        examples=["H100-80GB"],
    ),
]
TransformersVersionField = Annotated[
    str | None,
    BeforeValidator(transformers_version),
    WithJsonSchema({"anyOf": [{"type": "string", "pattern": VERSION_PATTERN}, _NULL]}),
    Field(
        description="The worker's transformers version (decides the TrainingArguments "
        "names), >= 4.35.0; default: the service's installed version.",
        examples=["5.24.0"],
    ),
]


def _choice_field(choice: Choice, description: str) -> Any:
    return Annotated[
        str,
        BeforeValidator(choice_validator(choice, lambda _: None)),
        WithJsonSchema(choice.schema()),
        Field(description=f"{description}. {CHOICE_RULE}"),
    ]


DtypeField = _choice_field(Choice(DTYPES), " | ".join(DTYPES) + " (compute / activations)")
WeightsField = _choice_field(Choice(WEIGHT_STORAGES), " | ".join(WEIGHT_STORAGES))
MethodField = _choice_field(Choice(METHODS), " | ".join(METHODS))
OptimizerField = _choice_field(Choice(OPTIMIZERS), " | ".join(OPTIMIZERS))
AttentionField = _choice_field(Choice(ATTENTIONS), " | ".join(ATTENTIONS))
ShardingField = _choice_field(
    Choice(SHARDINGS), " | ".join(SHARDINGS) + " (zero3: FSDP FULL_SHARD)"
)
EngineField = _choice_field(Choice(ENGINES), " | ".join(ENGINES))
OffloadField = _choice_field(Choice(OFFLOADS), " | ".join(OFFLOADS))
KbitPreparationField = _choice_field(Choice(KBIT_PREPARATIONS), " | ".join(KBIT_PREPARATIONS))
ComputeField = _choice_field(Choice(COMPUTES), " | ".join(COMPUTES))
GradientsField = _choice_field(Choice(GRADIENTS), " | ".join(GRADIENTS))
LoadPathField = _choice_field(Choice(LOAD_PATHS), " | ".join(LOAD_PATHS))
SdpaBackendField = _choice_field(Choice(SDPA_BACKENDS), " | ".join(SDPA_BACKENDS))


class _Request(BaseModel):
    # python-re: patterns match as Python's re does, the engine the document's
    # consumers in this project (the fuzz test) generate with.
    model_config = ConfigDict(
        extra="forbid", protected_namespaces=(), strict=True, regex_engine="python-re"
    )


class MeasureSpec(_Request):
    """One batch x sequence to measure activation bytes for (meta device)."""

    model_config = ConfigDict(json_schema_extra={"allOf": [MEASURABLE_SHARDING]})

    seq_len: JsonInt = Field(ge=1, le=MAX_SEQ_LEN, description="Tokens per sequence.")
    micro_batch_size: JsonInt = Field(1, ge=1, le=MAX_MICRO_BATCH)
    dtype: DtypeField = "bf16"
    attention: AttentionField = "sdpa"
    padded: bool = Field(
        False,
        description="The batch is padded: an attention mask with padding reaches the model "
        "(sdpa then gets a materialized mask on every layer). Packed sequences whose "
        "position ids restart get the same mask: true for them too. For an encoder-decoder "
        "(T5), the encoder's input is padded, as a seq2seq collator pads it.",
    )
    world_size: JsonInt = Field(
        1, ge=1, le=MAX_WORLD_SIZE, description="GPUs in the data-parallel group."
    )
    sharding: ShardingField = "none"


class WorkloadSpec(MeasureSpec):
    """The training step (docs/design.md §5); every field but seq_len has a default."""

    model_config = ConfigDict(json_schema_extra={"allOf": [PRECISION, SHARDING]})

    weights: WeightsField | None = Field(
        None, description="Weight storage; null: the dtype (nf4 for qlora)."
    )
    method: MethodField = "full"
    lora_rank: JsonInt = Field(16, ge=1, le=MAX_LORA_RANK)
    lora_targets: list[Annotated[str, Field(pattern=r"\S")]] | None = Field(
        None,
        min_length=1,
        description=(
            "Module-name suffixes LoRA adapts; null: PEFT's all-linear, every linear but the "
            "output embeddings (attention and MLP, an MoE's stacked experts and router where "
            "PEFT adapts them, a head's such as BERT's transform, and an idle vision tower's)."
        ),
    )
    optimizer: OptimizerField = "adamw"
    headroom: float = Field(
        0.1, ge=0, le=MAX_HEADROOM, description="Fraction of GPU memory kept free."
    )
    double_quant: bool = Field(False, description="bitsandbytes' double quantization.")
    kbit_preparation: KbitPreparationField = "peft"
    compute: ComputeField = "loaded"
    gradients: GradientsField = "set_to_none"
    sdpa_backend: SdpaBackendField = Field(
        "auto",
        description=(
            "sdpa's kernel: auto (torch picks; without a fused kernel for the call - grouped "
            "kv heads with fp32 q or on a GPU older than compute capability 8.0, Falcon-7B's "
            "one key head - it runs the math backend, which keeps fp32 scores) | efficient "
            "(pinned with sdpa_kernel(EFFICIENT_ATTENTION); grouped K and V repeated to "
            "every head for it)."
        ),
    )
    load_path: LoadPathField | None = Field(
        None,
        description=(
            "How the weights reach the GPU: device_map (from_pretrained with a device map: "
            "transformers first reserves the model's size in one block) | to_device (loaded "
            "on the CPU, then .to(device), as HF Trainer does without a device map); null: "
            "device_map for quantized weights, to_device otherwise."
        ),
    )
    logits_held: bool = Field(True, description="The step's output stays referenced.")
    engine: EngineField = "torch"
    offload: OffloadField = "none"
    # The bounds before the validator: after it, pydantic writes them into the
    # document as "ge" / "le", which JSON Schema does not know.
    gpus_per_node: (
        Annotated[int, Field(ge=1, le=MAX_WORLD_SIZE), BeforeValidator(_integral)] | None
    ) = Field(
        None,
        description="GPUs per host; must divide world_size, and is required with "
        "host_memory_gb when world_size > 1.",
    )
    hybrid: bool = Field(False, description="Shard within a node, replicate across nodes.")
    host_memory_gb: float | None = Field(
        None, gt=0, le=MAX_HOST_MEMORY_GB, description="Host memory per node, GiB."
    )


class ModelSpec(_Request):
    """Exactly one of `preset` (a bundled config, see GET /presets) or `config`."""

    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [{"required": ["preset"]}, {"required": ["config"]}],
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
            ],
        },
    )

    # Defaults are not validated: absent is None, an explicit null is refused.
    preset: Annotated[
        str,
        BeforeValidator(choice_validator(PRESET_CHOICE, _refuse_preset)),
        WithJsonSchema(PRESET_CHOICE.schema()),
    ] = Field(None, description="Name of a bundled preset. " + CHOICE_RULE)
    config: dict[str, Any] = Field(
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
            **NOT_GPU_AND_MEMORY,
            "allOf": [
                *not_beyond_positions("workload")["allOf"],
                no_adafactor_on_experts(),
                ESTIMATED_MODEL_TYPES,
            ],
            # A model and a workload go together (the estimate needs both).
            "anyOf": [
                {"properties": {"model": _NULL, "workload": _NULL}},
                {
                    "required": ["model", "workload"],
                    "properties": {"model": {"type": "object"}, "workload": {"type": "object"}},
                },
            ],
            "examples": [
                {"tier": "auto", "gpu": "A100-80GB"},
                {"tier": "medium", "gpu_memory_gb": 23.6, "transformers_version": "5.10.0"},
                {
                    "tier": "auto",
                    "gpu": "H100-80GB",
                    "model": {"preset": "llama-3.1-8b"},
                    "workload": {"seq_len": 4096, "micro_batch_size": 2, "method": "lora"},
                },
            ],
        }
    )

    tier: TierField
    gpu_memory_gb: GpuMemoryField = None
    gpu: GpuField = None
    transformers_version: TransformersVersionField = None
    model: ModelSpec | None = Field(
        None, description="The model; with a workload, every tier is estimated."
    )
    workload: WorkloadSpec | None = Field(
        None, description="The training step; required with a model, refused without one."
    )

    def plan_kwargs(self) -> dict[str, Any]:
        """`ckpt_core.make_plan` keyword arguments except the model."""
        return {
            "tier": self.tier,
            "gpu_memory_gb": self.gpu_memory_gb,
            "gpu": self.gpu,
            "transformers_version": self.transformers_version,
            "workload": self.workload.model_dump() if self.workload is not None else None,
        }


class DryRunRequest(_Request):
    """Build a model on the meta device, install the tier's hooks, report what was hooked."""

    model_config = ConfigDict(
        json_schema_extra={
            **NOT_GPU_AND_MEMORY,
            **not_beyond_positions("measure"),
            "examples": [
                {"model": {"preset": "llama-3.2-1b"}, "tier": "selective"},
                {
                    "model": {"preset": "qwen2.5-7b"},
                    "tier": "auto",
                    "gpu": "A100-80GB",
                    "measure": {"seq_len": 2048, "micro_batch_size": 1},
                },
            ],
        }
    )

    model: ModelSpec
    tier: TierField
    gpu_memory_gb: GpuMemoryField = None
    gpu: GpuField = None
    transformers_version: TransformersVersionField = None
    measure: MeasureSpec | None = Field(
        None, description="Measure activation bytes for one batch x sequence."
    )

    def as_kwargs(self) -> dict[str, Any]:
        """`ckpt_core.dry_run` keyword arguments."""
        return {
            "model": self.model.as_mapping(),
            "tier": self.tier,
            "gpu_memory_gb": self.gpu_memory_gb,
            "gpu": self.gpu,
            "transformers_version": self.transformers_version,
            # What the caller sent: a distributed field asks for the per-GPU parameters.
            "measure": (
                self.measure.model_dump(exclude_unset=True) if self.measure is not None else None
            ),
        }
