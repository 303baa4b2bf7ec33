"""Per-GPU model states under data parallelism: DDP, FSDP2 and DeepSpeed ZeRO.

`per_gpu_memory` turns the unsharded `StaticMemory` of one model replica into
what each GPU of the data-parallel group holds (`ShardedMemory`, a
`StaticMemory` whose ``total`` also counts the transient gathered parameters
and the communication buffers, so the tier estimate adds activations on top
unchanged: activations stay per GPU).  The recipe of each engine:

- ``torch`` (DDP / FSDP2): parameters, gradients and optimizer states as the
  single-GPU model counts them (`ckpt_core._memory.estimate`); FSDP2 shards
  all three along dim 0 over the shard group, and all-gathers parameters in
  the compute dtype (``MixedPrecisionPolicy(param_dtype=dtype)``).
- ``deepspeed``: mixed precision with fp32 master weights, as DeepSpeed's
  bf16 / fp16 ZeRO optimizers run: 16-bit parameters and gradients, an fp32
  gradient partition, fp32 master weights and fp32 optimizer states (the same
  byte counts as DeepSpeed's own estimators; ZeRO-3 accumulates gradients in
  fp32 partitions, so it keeps no 16-bit gradient partition).

Shapes are assumed divisible by the shard degree (no padding), which holds
for the bundled presets' sizes.  Pure arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.estimate import (
    DTYPE_BYTES,
    LORA_BYTES,
    StaticMemory,
    optimizer_bytes_per_parameter,
)
from ckpt_core._memory.param_layout import ParamLayout, embedding_parameters
from ckpt_core._planning.workload import Workload

GIB: Final = 1 << 30
# DeepSpeed's documented defaults (elements): reduce_bucket_size, stage3_prefetch_bucket_size.
DS_REDUCE_BUCKET: Final = 500_000_000
DS_PREFETCH_BUCKET: Final = 50_000_000
FP32: Final = 4

RULES: Final[dict[str, str]] = {
    "ddp": "DDP (torch, sharding none, world_size > 1): every GPU holds all weights, gradients "
    "and optimizer states, plus the reducer's gradient buckets, a second copy of all gradients "
    "(gradient_as_bucket_view=False, DDP's default; bucket_cap_mb only sets their granularity)",
    "fsdp2": "FSDP2 (torch, zero2 / zero3): parameters, gradients and optimizer states sharded "
    "along dim 0 over the shard group; each decoder block is one fully_shard unit and the root "
    "unit (embeddings, LM head, norms) stays unsharded through the step",
    "fsdp2_zero3": "zero3 = fully_shard(reshard_after_forward=True): at the peak the root unit and "
    "two blocks are gathered (the current block and the next one prefetched) in the compute "
    "dtype, plus one block's unsharded gradients before its reduce-scatter",
    "fsdp2_zero2": "zero2 = fully_shard(reshard_after_forward=False): every unit stays gathered "
    "from its forward to its backward, so the whole model is held unsharded in the compute "
    "dtype at the start of backward, plus one block's unsharded gradients",
    "fsdp2_offload": "offload all = CPUOffloadPolicy: sharded parameters, gradients and optimizer "
    "states on the host, the optimizer step on the CPU; only gathered units on the GPU",
    "deepspeed": "DeepSpeed ZeRO, mixed precision with fp32 master weights: per parameter "
    "16-bit weight and gradient, fp32 gradient partition, fp32 master weight, fp32 optimizer "
    "states; zero1 shards the fp32 states, zero2 also the 16-bit gradients, zero3 also the "
    "16-bit weights (and accumulates gradients in its fp32 partition)",
    "deepspeed_live": "ZeRO-3 live parameters: the largest single module's 16-bit weight and "
    "gradient gathered (DeepSpeed's own largest-layer term; its gradient only when it trains)",
    "deepspeed_buckets": "ZeRO buckets in the compute dtype, DeepSpeed's defaults: the reduce "
    "bucket (reduce_bucket_size 5e8 elements, overlap_comm off) and, with zero3, the prefetch "
    "bucket (stage3_prefetch_bucket_size 5e7 elements)",
    "deepspeed_offload": "offload optimizer (ZeRO-Offload): fp32 gradient partitions, master "
    "weights and optimizer states on the host; offload all (ZeRO-Infinity to CPU) also the "
    "16-bit weight partitions",
    "hybrid": "hybrid: sharded within each node of gpus_per_node GPUs, replicated across nodes "
    "(FSDP2 HSDP, DeepSpeed MiCS)",
    "host": "host memory for offload is per GPU process; per node it is that times gpus_per_node "
    "(pinned buffers, no allowance for the dataloader or the framework)",
}


@dataclass(frozen=True, slots=True)
class ShardedMemory(StaticMemory):
    """What one GPU of the data-parallel group holds besides activations (bytes).

    ``weights`` / ``gradients`` / ``optimizer`` are per GPU; ``totals`` are the
    unsharded figures of one replica under the same recipe.  ``gathered`` are
    the transient unsharded parameters (and their gradients) of the units
    being all-gathered; ``communication`` the buckets of the collectives.
    """

    gathered: int = 0
    communication: int = 0
    host_per_gpu: int = 0
    shard_degree: int = 1
    totals: StaticMemory | None = None
    rules: tuple[str, ...] = ()
    states32: int | None = None  # one fp32 optimizer state of this GPU's share (DeepSpeed's)

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.gathered + self.communication

    @property
    def replica_total(self) -> int:
        return self.totals.total if self.totals is not None else super().total

    @property
    def foreach_temporary(self) -> int:
        """DeepSpeed steps its fp32 partition, whose states are fp32 whatever the
        gradients' dtype; torch's states follow the parameters, as the gradients."""
        return self.gradients if self.states32 is None else self.states32


@dataclass(frozen=True, slots=True)
class _Replica:
    """One replica's model states, split by what each ZeRO stage shards (bytes)."""

    weights: int  # as stored (16-bit for DeepSpeed's trainables)
    grads: int  # in the parameters' dtype (16-bit for DeepSpeed)
    grads32: int  # DeepSpeed's fp32 gradient partition (0 for torch)
    optimizer: int  # optimizer states, plus DeepSpeed's fp32 master weights


@dataclass(frozen=True, slots=True)
class _Case:
    """Everything one engine's rules read."""

    replica: _Replica
    totals: StaticMemory
    arch: Arch
    layout: ParamLayout
    workload: Workload
    degree: int


def per_gpu_memory(
    static: StaticMemory, arch: Arch, layout: ParamLayout, workload: Workload
) -> ShardedMemory:
    """The per-GPU view of ``static`` for the workload's world size, sharding and engine."""
    replica = _replica(static, workload)
    totals = StaticMemory(
        weights=replica.weights,
        trainable_parameters=static.trainable_parameters,
        gradients=replica.grads + replica.grads32,
        optimizer=replica.optimizer,
    )
    case = _Case(replica, totals, arch, layout, workload, shard_degree(workload))
    return _deepspeed(case) if workload.engine == "deepspeed" else _torch(case)


def shard_degree(workload: Workload) -> int:
    """GPUs one replica's states are split over: the node with hybrid, else the whole group."""
    if workload.sharding == "none":
        return 1
    if workload.hybrid and workload.gpus_per_node is not None:
        return workload.gpus_per_node
    return workload.world_size


def _replica(static: StaticMemory, workload: Workload) -> _Replica:
    if workload.engine == "torch":
        return _Replica(static.weights, static.gradients, 0, static.optimizer)
    # DeepSpeed keeps trainables in the compute dtype with fp32 masters; fp32 runs have no master.
    trainable = static.trainable_parameters
    compute = DTYPE_BYTES[workload.dtype]
    mixed = compute != FP32
    stored = DTYPE_BYTES[workload.weight_storage] if workload.method == "full" else LORA_BYTES
    frozen = static.weights - trainable * stored
    states = optimizer_bytes_per_parameter(workload.optimizer, FP32)
    return _Replica(
        weights=frozen + trainable * compute,
        grads=trainable * compute,
        grads32=trainable * FP32 if mixed else 0,
        optimizer=int(trainable * (states + (FP32 if mixed else 0))),
    )


def _torch(case: _Case) -> ShardedMemory:
    replica, workload, degree = case.replica, case.workload, case.degree
    rules = ["hybrid"] if workload.hybrid else []
    if workload.sharding == "none":
        ddp = workload.world_size > 1
        return _sharded(
            case,
            weights=replica.weights,
            gradients=replica.grads,
            optimizer=replica.optimizer,
            communication=replica.grads if ddp else 0,
            rules=rules + ["ddp"] * ddp,
        )
    block = _block_parameters(case.arch, case.layout)
    per_parameter = _gathered_bytes_per_parameter(replica, case.layout, workload)
    block_grads = _trainable_share(case) * block * DTYPE_BYTES[workload.dtype]
    if workload.sharding == "zero3":
        held = _root_parameters(case.arch, case.layout) + 2 * block
        rules += ["fsdp2", "fsdp2_zero3"]
    else:
        held = case.layout.total
        rules += ["fsdp2", "fsdp2_zero2"]
    gathered = int(held * per_parameter) + int(block_grads)
    sharded = (_ceil(replica.weights, degree), _ceil(replica.grads, degree))
    optimizer = _ceil(replica.optimizer, degree)
    if workload.offload == "all":
        return _sharded(
            case,
            gathered=gathered,
            host=sum(sharded) + optimizer,
            rules=[*rules, "fsdp2_offload", "host"],
        )
    weights, gradients = sharded
    return _sharded(
        case,
        weights=weights,
        gradients=gradients,
        optimizer=optimizer,
        gathered=gathered,
        rules=rules,
    )


def _deepspeed(case: _Case) -> ShardedMemory:
    replica, workload, degree = case.replica, case.workload, case.degree
    sharding, offload = workload.sharding, workload.offload
    compute = DTYPE_BYTES[workload.dtype]
    rules = ["deepspeed"] + (["hybrid"] if workload.hybrid else [])
    buckets = DS_REDUCE_BUCKET * compute if sharding != "none" else 0
    rules += ["deepspeed_buckets"] if buckets else []
    # Frozen (LoRA base) weights are sharded only with the 16-bit weights, under zero3.
    weights = _ceil(replica.weights, degree) if sharding == "zero3" else replica.weights
    if sharding == "zero3":
        grads, grads32 = 0, replica.grads32 or replica.grads  # fp32 accumulation partition
    elif sharding == "zero2":
        grads, grads32 = _ceil(replica.grads, degree), replica.grads32
    else:
        grads, grads32 = replica.grads, replica.grads32
    grads32, optimizer = _ceil(grads32, degree), _ceil(replica.optimizer, degree)
    gathered = 0
    if sharding == "zero3":
        trainable = 1 if workload.method == "full" else 0
        gathered = _largest_module(case.arch, case.layout) * compute * (1 + trainable)
        buckets += DS_PREFETCH_BUCKET * compute
        rules.append("deepspeed_live")
    host = 0
    states32 = _ceil(case.totals.trainable_parameters * FP32, degree)
    if offload != "none":  # the optimizer steps on the host
        host, grads32, optimizer, states32 = grads32 + optimizer, 0, 0, 0
        grads = grads if sharding == "zero1" else 0  # ZeRO-Offload reduces straight to the host
        rules.append("deepspeed_offload")
    if offload == "all":
        host, weights = host + weights, 0
    return _sharded(
        case,
        weights=weights,
        gradients=grads + grads32,
        optimizer=optimizer,
        gathered=gathered,
        communication=buckets,
        host=host,
        rules=rules + ["host"] * bool(host),
        states32=states32,
    )


def _sharded(
    case: _Case,
    *,
    weights: int = 0,
    gradients: int = 0,
    optimizer: int = 0,
    gathered: int = 0,
    communication: int = 0,
    host: int = 0,
    rules: list[str],
    states32: int | None = None,
) -> ShardedMemory:
    return ShardedMemory(
        weights=weights,
        trainable_parameters=case.totals.trainable_parameters,
        gradients=gradients,
        optimizer=optimizer,
        gathered=gathered,
        communication=communication,
        host_per_gpu=host,
        shard_degree=case.degree,
        totals=case.totals,
        rules=tuple(rules),
        states32=states32,
    )


def _ceil(nbytes: int, ways: int) -> int:
    return -(-nbytes // ways)


def _blocks(arch: Arch) -> int:
    return arch.layers + arch.encoder_layers


def _block_parameters(arch: Arch, layout: ParamLayout) -> float:
    """Parameters of one block (its linears and experts; norms are left to the root unit)."""
    return (layout.linear_parameters + layout.experts) / _blocks(arch)


def _root_parameters(arch: Arch, layout: ParamLayout) -> float:
    return layout.total - _block_parameters(arch, layout) * _blocks(arch)


def _trainable_share(case: _Case) -> float:
    total = case.layout.total
    return case.totals.trainable_parameters / total if total else 0.0


def _gathered_bytes_per_parameter(
    replica: _Replica, layout: ParamLayout, workload: Workload
) -> float:
    """Bytes per parameter of an all-gathered unit: the compute dtype, or as stored if quantized."""
    if workload.weight_storage in DTYPE_BYTES:
        return float(DTYPE_BYTES[workload.dtype])
    return replica.weights / layout.total


def _largest_module(arch: Arch, layout: ParamLayout) -> int:
    """Parameters of the largest single module (its own, not its children's): DeepSpeed's count."""
    embedding = arch.vocab * arch.hidden
    linear = max((lin.parameters // lin.count for lin in layout.linears if lin.count), default=0)
    moe_layers = sum(arch.moe_layers)
    experts = layout.experts // moe_layers if moe_layers else 0
    untied_head = embedding_parameters(arch) - embedding
    return max(embedding, linear, experts, untied_head)


def distributed_summary(static: StaticMemory, workload: Workload) -> dict[str, Any]:
    """The estimate's per-GPU breakdown, the unsharded totals beside it, and the host check."""
    sharded = static if isinstance(static, ShardedMemory) else None
    totals = sharded.totals if sharded and sharded.totals else static
    host = sharded.host_per_gpu if sharded else 0
    per_node = host * workload.gpus_per_node if workload.gpus_per_node else None
    if per_node is None and workload.world_size == 1:
        per_node = host
    limit = workload.host_memory_gb
    host_fits = None if limit is None or per_node is None else per_node <= limit * GIB
    return {
        "weights_bytes": static.weights,
        "gradients_bytes": static.gradients,
        "optimizer_bytes": static.optimizer,
        "weights_total_bytes": totals.weights,
        "gradients_total_bytes": totals.gradients,
        "optimizer_total_bytes": totals.optimizer,
        "distributed": {
            "world_size": workload.world_size,
            "sharding": workload.sharding,
            "engine": workload.engine,
            "offload": workload.offload,
            "shard_degree": sharded.shard_degree if sharded else 1,
            "gathered_bytes": sharded.gathered if sharded else 0,
            "communication_bytes": sharded.communication if sharded else 0,
            "host_bytes_per_gpu": host,
            "host_bytes_per_node": per_node,
            "host_memory_gb": limit,
            "host_fits": host_fits,
            "rules": {name: RULES[name] for name in (sharded.rules if sharded else ())},
        },
    }


def host_sentence(summary: dict[str, Any]) -> str:
    """A sentence for the plan's reason when offload needs more host memory than given."""
    info = summary["distributed"]
    if info["host_fits"] is not False:
        return ""
    return (
        f"offload needs an estimated {info['host_bytes_per_node'] / GIB:.1f} GiB of host memory "
        f"per node, more than the {info['host_memory_gb']:g} GiB given"
    )
