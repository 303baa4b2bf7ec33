"""The training workload a memory estimate is for (docs/design.md §5).

Plain frozen dataclass with strict validation: unknown keys, wrong types and
out-of-range values raise `InvalidWorkloadError` naming the field
(``"workload.seq_len"``), never a silent default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Final, Literal

from ckpt_core._errors import InvalidWorkloadError

Dtype = Literal["bf16", "fp16", "fp32"]
WeightStorage = Literal["bf16", "fp16", "fp32", "int8", "nf4"]
Method = Literal["full", "lora", "qlora"]
Optimizer = Literal[
    "adamw", "adamw_fused", "adamw_8bit", "adamw_32bit", "adafactor", "sgd", "sgd_momentum"
]
Attention = Literal["sdpa", "flash_attention_2", "eager"]
KbitPreparation = Literal["peft", "none"]
Compute = Literal["loaded", "autocast"]
Gradients = Literal["set_to_none", "accumulate"]
LoadPath = Literal["device_map", "to_device"]
SdpaBackend = Literal["auto", "efficient"]
Sharding = Literal["none", "zero1", "zero2", "zero3"]
Engine = Literal["torch", "deepspeed"]
Offload = Literal["none", "optimizer", "all"]

DTYPES: Final[tuple[str, ...]] = ("bf16", "fp16", "fp32")
WEIGHT_STORAGES: Final[tuple[str, ...]] = ("bf16", "fp16", "fp32", "int8", "nf4")
METHODS: Final[tuple[str, ...]] = ("full", "lora", "qlora")
OPTIMIZERS: Final[tuple[str, ...]] = (
    "adamw",
    "adamw_fused",
    "adamw_8bit",
    "adamw_32bit",
    "adafactor",
    "sgd",
    "sgd_momentum",
)
ATTENTIONS: Final[tuple[str, ...]] = ("sdpa", "flash_attention_2", "eager")
KBIT_PREPARATIONS: Final[tuple[str, ...]] = ("peft", "none")
COMPUTES: Final[tuple[str, ...]] = ("loaded", "autocast")
GRADIENTS: Final[tuple[str, ...]] = ("set_to_none", "accumulate")
LOAD_PATHS: Final[tuple[str, ...]] = ("device_map", "to_device")
SDPA_BACKENDS: Final[tuple[str, ...]] = ("auto", "efficient")
QUANTIZED: Final[tuple[str, ...]] = ("int8", "nf4")
SHARDINGS: Final[tuple[str, ...]] = ("none", "zero1", "zero2", "zero3")
ENGINES: Final[tuple[str, ...]] = ("torch", "deepspeed")
OFFLOADS: Final[tuple[str, ...]] = ("none", "optimizer", "all")

MAX_SEQ_LEN: Final = 1 << 21  # 2M tokens: beyond any released context window
MAX_MICRO_BATCH: Final = 4096
MAX_LORA_RANK: Final = 4096
MAX_HEADROOM: Final = 0.9
MAX_WORLD_SIZE: Final = 1 << 16
MAX_HOST_MEMORY_GB: Final = 1 << 16  # GiB per node: a larger value is bytes or MiB by mistake


@dataclass(frozen=True, slots=True)
class Workload:
    """One training step's shape and numerics; all fields but `seq_len` have defaults."""

    seq_len: int
    micro_batch_size: int = 1
    dtype: Dtype = "bf16"
    weights: WeightStorage | None = None  # None: same as dtype (nf4 for qlora)
    method: Method = "full"
    lora_rank: int = 16
    # None: PEFT's all-linear, every linear but the output embeddings (an MoE's experts too)
    lora_targets: tuple[str, ...] | None = None
    optimizer: Optimizer = "adamw"
    attention: Attention = "sdpa"
    headroom: float = 0.1
    # The real recipe (docs/design.md §5): what changes a real step's memory.
    double_quant: bool = False  # bitsandbytes' bnb_4bit_use_double_quant
    kbit_preparation: KbitPreparation = "peft"  # prepare_model_for_kbit_training, or none
    compute: Compute = "loaded"  # weights loaded in dtype, or fp32 weights + autocast to dtype
    gradients: Gradients = "set_to_none"  # zero_grad(set_to_none=True) each step, or accumulate
    # from_pretrained(device_map=...), or loaded on the CPU and moved with .to(device);
    # None: device_map for quantized weights (bitsandbytes quantizes as they load), else to_device
    load_path: LoadPath | None = None
    logits_held: bool = True  # the step's output (logits) stays referenced through backward
    padded: bool = False  # an attention mask with padding reaches the model (pad to longest)
    # auto: torch picks sdpa's kernel; efficient: pinned to the memory-efficient one
    # (sdpa_kernel(EFFICIENT_ATTENTION)), grouped K / V repeated to every head for it
    sdpa_backend: SdpaBackend = "auto"
    # Distributed data parallelism (`ckpt_core._memory.sharding`); checked by `_check_distributed`.
    world_size: int = 1  # GPUs in the data-parallel group
    sharding: Sharding = "none"  # none: DDP (or one GPU); zero1/2/3: ZeRO stages, zero3 = FSDP
    engine: Engine = "torch"  # torch: DDP / FSDP2; deepspeed: DeepSpeed ZeRO
    offload: Offload = "none"  # optimizer: optimizer states (DeepSpeed); all: parameters too
    gpus_per_node: int | None = None  # GPUs sharing one host (needed with host_memory_gb)
    hybrid: bool = False  # shard within a node of gpus_per_node GPUs, replicate across nodes
    host_memory_gb: float | None = None  # host memory per node (GiB), checked against offload

    def __post_init__(self) -> None:
        _check_int("seq_len", self.seq_len, MAX_SEQ_LEN)
        _check_int("micro_batch_size", self.micro_batch_size, MAX_MICRO_BATCH)
        _check_int("lora_rank", self.lora_rank, MAX_LORA_RANK)
        _check_choice("dtype", self.dtype, DTYPES)
        _check_choice("method", self.method, METHODS)
        _check_choice("optimizer", self.optimizer, OPTIMIZERS)
        _check_choice("attention", self.attention, ATTENTIONS)
        if self.weights is not None:
            _check_choice("weights", self.weights, WEIGHT_STORAGES)
        if self.method == "qlora" and self.weights not in (None, "nf4", "int8"):
            raise InvalidWorkloadError(
                f"qlora trains adapters over quantized weights: weights must be nf4 or int8, "
                f"got {self.weights!r}",
                field="workload.weights",
            )
        if self.method == "full" and self.weights in QUANTIZED:
            raise InvalidWorkloadError(
                f"full fine-tuning cannot train {self.weights} weights; use method "
                "'qlora' (adapters over quantized weights) or bf16 / fp32 weights",
                field="workload.weights",
            )
        _check_targets(self.lora_targets)
        _check_headroom(self.headroom)
        _check_bool("double_quant", self.double_quant)
        _check_bool("logits_held", self.logits_held)
        _check_bool("padded", self.padded)
        _check_choice("kbit_preparation", self.kbit_preparation, KBIT_PREPARATIONS)
        _check_choice("compute", self.compute, COMPUTES)
        _check_choice("gradients", self.gradients, GRADIENTS)
        _check_choice("sdpa_backend", self.sdpa_backend, SDPA_BACKENDS)
        if self.load_path is not None:
            _check_choice("load_path", self.load_path, LOAD_PATHS)
        if self.compute == "autocast" and self.dtype == "fp32":
            raise InvalidWorkloadError(
                "compute 'autocast' runs fp32 weights in a bf16 or fp16 dtype; with dtype fp32 "
                "use compute 'loaded'",
                field="workload.compute",
            )
        if self.compute == "autocast" and self.weights not in (None, "fp32", *QUANTIZED):
            raise InvalidWorkloadError(
                f"compute 'autocast' keeps fp32 weights (AMP's master weights); weights "
                f"{self.weights!r} would be loaded in the compute dtype: use compute 'loaded'",
                field="workload.compute",
            )
        _check_distributed(self)

    @property
    def weight_storage(self) -> WeightStorage:
        """Weights storage, defaults applied (qlora -> nf4, autocast -> fp32, else dtype)."""
        if self.weights is not None:
            return self.weights
        if self.method == "qlora":
            return "nf4"
        return "fp32" if self.compute == "autocast" else self.dtype

    @property
    def quantized(self) -> bool:
        """The block linears are bitsandbytes-quantized (int8 / nf4)."""
        return self.weight_storage in QUANTIZED

    @property
    def kbit_prepared(self) -> bool:
        """PEFT's prepare_model_for_kbit_training ran: non-quantized parameters are fp32."""
        return self.quantized and self.kbit_preparation == "peft"

    @property
    def loaded_with_device_map(self) -> bool:
        """``from_pretrained`` placed the weights (``load_path``, defaults applied)."""
        if self.load_path is None:
            return self.quantized
        return self.load_path == "device_map"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["lora_targets"] = list(self.lora_targets) if self.lora_targets else None
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Workload:
        """Build from JSON-like input; unknown keys and a missing seq_len are errors."""
        if not isinstance(data, Mapping):
            raise InvalidWorkloadError("workload must be an object", field="workload")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidWorkloadError(
                f"unknown workload field(s) {unknown}; known: {sorted(known)}",
                field=f"workload.{unknown[0]}",
            )
        if "seq_len" not in data:
            raise InvalidWorkloadError("workload.seq_len is required", field="workload.seq_len")
        values = dict(data)
        targets = values.get("lora_targets")
        if isinstance(targets, list):
            values["lora_targets"] = tuple(targets)
        return cls(**values)


def _check_int(name: str, value: object, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidWorkloadError(
            f"{name} must be an integer, got {value!r}", field=f"workload.{name}"
        )
    if not 1 <= value <= maximum:
        raise InvalidWorkloadError(
            f"{name} must be between 1 and {maximum}, got {value}", field=f"workload.{name}"
        )


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InvalidWorkloadError(
            f"{name} must be one of {', '.join(choices)}; got {value!r}", field=f"workload.{name}"
        )


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise InvalidWorkloadError(
            f"{name} must be true or false, got {value!r}", field=f"workload.{name}"
        )


def _check_targets(targets: object) -> None:
    if targets is None:
        return
    ok = (
        isinstance(targets, tuple)
        and targets
        and all(isinstance(t, str) and t.strip() for t in targets)
    )
    if not ok:
        raise InvalidWorkloadError(
            "lora_targets must be a non-empty list of module-name suffixes such as "
            f"['q_proj', 'v_proj'], got {targets!r}",
            field="workload.lora_targets",
        )


def _check_headroom(headroom: object) -> None:
    valid = (
        not isinstance(headroom, bool)
        and isinstance(headroom, int | float)
        and math.isfinite(headroom)
        and 0 <= headroom <= MAX_HEADROOM
    )
    if not valid:
        raise InvalidWorkloadError(
            f"headroom must be a fraction between 0 and {MAX_HEADROOM}, got {headroom!r}",
            field="workload.headroom",
        )


def _check_distributed(workload: Workload) -> None:
    """The data-parallel fields, alone and together: combinations no engine runs are errors."""
    _check_int("world_size", workload.world_size, MAX_WORLD_SIZE)
    _check_choice("sharding", workload.sharding, SHARDINGS)
    _check_choice("engine", workload.engine, ENGINES)
    _check_choice("offload", workload.offload, OFFLOADS)
    if not isinstance(workload.hybrid, bool):
        raise InvalidWorkloadError(
            f"hybrid must be true or false, got {workload.hybrid!r}", field="workload.hybrid"
        )
    per_node = workload.gpus_per_node
    if per_node is not None:
        _check_int("gpus_per_node", per_node, MAX_WORLD_SIZE)
        if workload.world_size % per_node:
            raise InvalidWorkloadError(
                f"gpus_per_node {per_node} must divide world_size {workload.world_size}",
                field="workload.gpus_per_node",
            )
    if workload.hybrid and (per_node is None or workload.sharding != "zero3"):
        raise InvalidWorkloadError(
            "hybrid sharding shards within a node and replicates across nodes (FSDP2 HSDP, "
            "DeepSpeed MiCS): it needs gpus_per_node and sharding 'zero3'",
            field="workload.hybrid",
        )
    host = workload.host_memory_gb
    if host is not None and not (
        not isinstance(host, bool)
        and isinstance(host, int | float)
        and math.isfinite(host)
        and 0 < host <= MAX_HOST_MEMORY_GB
    ):
        raise InvalidWorkloadError(
            f"host_memory_gb must be a number of GiB between 0 and {MAX_HOST_MEMORY_GB}, "
            f"got {host!r}",
            field="workload.host_memory_gb",
        )
    if host is not None and per_node is None and workload.world_size > 1:
        raise InvalidWorkloadError(
            "host_memory_gb is per node: give gpus_per_node too, so the host memory that "
            "offload needs can be added up over the GPUs that share one host",
            field="workload.gpus_per_node",
        )
    _check_engine(workload)


def _check_engine(workload: Workload) -> None:
    """What each engine can express (DDP, FSDP2 and DeepSpeed ZeRO as documented)."""
    sharding, offload, engine = workload.sharding, workload.offload, workload.engine
    if offload != "none" and sharding == "none":
        raise InvalidWorkloadError(
            f"offload {offload!r} needs a sharding stage: DDP keeps everything on the GPU",
            field="workload.offload",
        )
    if offload == "all" and sharding != "zero3":
        raise InvalidWorkloadError(
            "offload 'all' moves sharded parameters to the host: it needs sharding 'zero3'",
            field="workload.offload",
        )
    if engine == "torch" and sharding == "zero1":
        raise InvalidWorkloadError(
            "engine 'torch' has no ZeRO-1 under the HF Trainer: use sharding 'zero2' / 'zero3' "
            "(FSDP2) or engine 'deepspeed'",
            field="workload.sharding",
        )
    if workload.optimizer == "adafactor" and (sharding != "none" or engine != "torch"):
        raise InvalidWorkloadError(
            "adafactor's factored states are modelled on whole parameters (one GPU or DDP): "
            "use sharding 'none' with engine 'torch'",
            field="workload.optimizer",
        )
    if engine == "torch" and offload == "optimizer":
        raise InvalidWorkloadError(
            "FSDP2's CPUOffloadPolicy offloads parameters, gradients and optimizer states "
            "together: use offload 'all', or engine 'deepspeed' for ZeRO-Offload of the optimizer",
            field="workload.offload",
        )
