"""The ``ckpt`` command's workload flags: one per field of the workload the API takes.

``--seq-len`` is ``workload.seq_len``; a switch (``--padded``) also takes ``--no-``;
a flag left out leaves the field to the workload's default.  Values are checked by
the workload itself (`ckpt_core._planning.workload.Workload`), whose errors name the
field, and the command turns the field back into the flag.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

__all__ = ["WORKLOAD_FIELDS", "add_workload_args", "workload_of_args"]

_FLAGS: tuple[tuple[str, type], ...] = (
    ("seq_len", int),
    ("micro_batch_size", int),
    ("dtype", str),
    ("weights", str),
    ("method", str),
    ("lora_rank", int),
    ("lora_targets", str),
    ("optimizer", str),
    ("attention", str),
    ("padded", bool),
    ("headroom", float),
    ("world_size", int),
    ("sharding", str),
    ("engine", str),
    ("offload", str),
    ("gpus_per_node", int),
    ("hybrid", bool),
    ("host_memory_gb", float),
    ("double_quant", bool),
    ("kbit_preparation", str),
    ("compute", str),
    ("gradients", str),
    ("sdpa_backend", str),
    ("load_path", str),
    ("logits_held", bool),
)
WORKLOAD_FIELDS: tuple[str, ...] = tuple(name for name, _ in _FLAGS)

_HELP: dict[str, str] = {
    "lora_targets": "comma-separated module names",
    "optimizer": "adamw (torch's foreach step) | adamw_fused (HF Trainer's default "
    "adamw_torch_fused) | adamw_8bit | adamw_32bit (bitsandbytes', paged_adamw_32bit) | "
    "adafactor (transformers', HF Trainer's optim=adafactor) | sgd | sgd_momentum",
    "padded": "padded batches (an attention mask), or packed ones whose position ids restart",
    "world_size": "GPUs in the data-parallel group (1)",
    "sharding": "none (DDP) | zero1 | zero2 | zero3 (FSDP FULL_SHARD)",
    "engine": "torch (DDP / FSDP2) | deepspeed",
    "offload": "none | optimizer (DeepSpeed) | all (parameters too)",
    "gpus_per_node": "GPUs sharing one host (with --host-memory-gb or --hybrid)",
    "hybrid": "shard within each node, replicate across nodes (zero3)",
    "host_memory_gb": "host memory per node in GiB, checked against offload",
    "double_quant": "bitsandbytes' bnb_4bit_use_double_quant (qlora; off by default)",
    "kbit_preparation": "peft (PEFT's prepare_model_for_kbit_training: the parameters left "
    "unquantized in fp32; the default) | none",
    "compute": "loaded (weights loaded in --dtype; the default) | autocast (fp32 weights under "
    "autocast to --dtype, as TrainingArguments(bf16=True) on an fp32 model)",
    "gradients": "set_to_none (zero_grad(set_to_none=True) each step; the default) | "
    "accumulate (gradient accumulation: gradients held through the step)",
    "sdpa_backend": "auto (torch picks sdpa's kernel; the default) | efficient (pinned with "
    "sdpa_kernel(EFFICIENT_ATTENTION))",
    "load_path": "device_map (from_pretrained with a device map) | to_device (loaded on the "
    "CPU, then .to(device)); default: device_map for quantized weights, else to_device",
    "logits_held": "the step's output (logits) stays referenced through backward (the "
    "default); --no-logits-held when the training loop drops it before backward",
}


def add_workload_args(
    parser: argparse.ArgumentParser,
    *,
    names: Sequence[str] | None = None,
    title: str = "workload (with --model: model-aware auto)",
) -> None:
    """Workload flags (all, or the ``names`` a dry-run measurement takes)."""
    group = parser.add_argument_group(title)
    for name, kind in _FLAGS:
        if names is not None and name not in names:
            continue
        flag = "--" + name.replace("_", "-")
        if kind is bool:  # --flag / --no-flag; absent means the workload's default
            group.add_argument(flag, action=argparse.BooleanOptionalAction, help=_HELP.get(name))
            continue
        group.add_argument(flag, type=kind, help=_HELP.get(name))


def workload_of_args(args: argparse.Namespace) -> dict[str, Any] | None:
    """The workload (or measurement) flags that were given, as the JSON object the API takes."""
    given = {name: getattr(args, name, None) for name, _ in _FLAGS}
    workload = {name: value for name, value in given.items() if value is not None}
    if "lora_targets" in workload:
        workload["lora_targets"] = [t.strip() for t in workload["lora_targets"].split(",")]
    return workload or None
