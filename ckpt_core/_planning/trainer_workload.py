"""The workload fields a HuggingFace ``TrainingArguments`` already decides.

A worker that trains with HF Trainer (or TRL) has its arguments before it asks
for a plan; `workload_from_training_arguments` reads from them what changes a
step's memory, so the estimate describes the run that will happen rather than
the workload's defaults:

- ``per_device_train_batch_size`` -> ``micro_batch_size``;
- ``bf16`` / ``fp16`` -> ``dtype`` (neither: fp32);
- ``optim`` -> ``optimizer`` (HF Trainer's default with torch >= 2.8,
  ``adamw_torch_fused``, is `adamw_fused`; ``adamw_torch`` is torch's foreach
  step, `adamw`; ``paged_adamw_32bit`` is bitsandbytes' AdamW with fp32 states,
  `adamw_32bit`; ``adafactor`` is transformers' Adafactor, `adafactor`);
- ``gradient_accumulation_steps`` > 1 -> ``gradients: accumulate`` (the
  Trainer zeroes the gradients after each optimizer step, so they live through
  every micro-batch of it);
- ``world_size`` and FSDP (``fsdp`` with ``fsdp_config``) or DeepSpeed
  (``deepspeed``: its config, a dict or a JSON file) -> ``world_size``,
  ``engine``, ``sharding``, ``offload``, ``hybrid``; a DeepSpeed config's own
  ``optimizer`` section (FusedAdam) -> `adamw_fused`.

What the arguments cannot say - ``seq_len``, ``method`` and the LoRA fields,
how the model was loaded (``weights``, ``compute``: an fp32 model trained with
``bf16=True`` runs under autocast), ``attention``, ``gpus_per_node`` - comes
from ``workload``, which also overrides anything read here.  The arguments are
read by attribute (no transformers import).  A value with no memory model here
is an error naming the argument, never a silent default: so are Liger's kernels
(``use_liger_kernel``) and ``torch_compile``, which change what the step keeps.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, Final

from ckpt_core._errors import InvalidWorkloadError
from ckpt_core._planning.workload import Workload

__all__ = ["workload_from_training_arguments"]

# TrainingArguments.optim -> Workload.optimizer (Trainer.get_optimizer_cls_and_kwargs).
# bitsandbytes' paged AdamWs keep their large states in managed memory, which the
# driver may page out under pressure: counted as resident, the safe side.
OPTIM_NAMES: Final[dict[str, str]] = {
    "adamw_torch": "adamw",
    "adamw_torch_fused": "adamw_fused",
    "adamw_bnb_8bit": "adamw_8bit",
    "adamw_8bit": "adamw_8bit",
    "paged_adamw_8bit": "adamw_8bit",
    "paged_adamw_32bit": "adamw_32bit",
    "adafactor": "adafactor",
    "sgd": "sgd",
}
_OFFLOAD_DEVICES: Final = ("cpu", "nvme")
# Switches that change which tensors a step keeps in ways no workload field describes.
UNMODELLED_SWITCHES: Final[dict[str, str]] = {
    "use_liger_kernel": "Liger's kernels (fused linear cross entropy, RMSNorm, SwiGLU, RoPE) "
    "keep other tensors than the unfused step",
    "torch_compile": "a compiled step keeps what inductor's partitioner chooses, not what "
    "the eager step keeps",
}


def workload_from_training_arguments(args: Any, **workload: Any) -> dict[str, Any]:
    """The workload (a dict for ``make_plan(workload=...)`` or the client) of a run with
    these ``TrainingArguments``; ``workload`` gives the rest and wins over what is read.

    Raises `InvalidWorkloadError` (a ``ValueError``) naming the argument or field at fault;
    an optimizer the arguments name without a memory model here is no error when
    ``workload`` says which optimizer it is.
    """
    read: dict[str, Any] = {
        "micro_batch_size": _attribute(args, "per_device_train_batch_size"),
        "dtype": "bf16"
        if _attribute(args, "bf16")
        else "fp16"
        if _attribute(args, "fp16")
        else "fp32",
        "gradients": "accumulate"
        if _attribute(args, "gradient_accumulation_steps") > 1
        else "set_to_none",
        "world_size": _attribute(args, "world_size"),
    }
    for switch, why in UNMODELLED_SWITCHES.items():
        if getattr(args, switch, False):
            raise InvalidWorkloadError(
                f"{switch}=True has no memory model here: {why}.  To plan the eager, unfused "
                "step knowingly, pass make_plan a workload built without these arguments",
                field=switch,
            )
    optimizer_given = "optimizer" in workload
    if not optimizer_given:
        read["optimizer"] = _optimizer(args)
    deepspeed = getattr(args, "deepspeed", None)
    if deepspeed:
        read.update(_deepspeed(deepspeed, read_optimizer=not optimizer_given))
    elif getattr(args, "fsdp", None):
        read.update(_fsdp(args.fsdp, getattr(args, "fsdp_config", None) or {}))
    merged = {**read, **workload}
    Workload.from_dict(merged)  # every field checked now, where the worker can fix it
    return merged


def _attribute(args: Any, name: str) -> Any:
    if not hasattr(args, name):
        raise InvalidWorkloadError(
            f"expected HuggingFace TrainingArguments: no attribute {name!r}", field=name
        )
    return getattr(args, name)


def _optimizer(args: Any) -> str:
    optim = _attribute(args, "optim")
    name = str(getattr(optim, "value", optim))  # an OptimizerNames member, or its string
    optimizer = OPTIM_NAMES.get(name)
    if optimizer is None:
        raise InvalidWorkloadError(
            f"optim {name!r} has no memory model here; known: {', '.join(OPTIM_NAMES)} "
            "(or pass optimizer=... for what the run's optimizer keeps)",
            field="optim",
        )
    if getattr(args, "optim_args", None):
        raise InvalidWorkloadError(
            "optim_args can change what the optimizer keeps (SGD's momentum): pass "
            "optimizer=... to say which of the workload's optimizers it is",
            field="optim_args",
        )
    return optimizer


def _fsdp(fsdp: Any, config: Mapping[str, Any]) -> dict[str, Any]:
    """FSDP under the Trainer: ``fsdp=True`` and ``fsdp_config`` (transformers 5.24), or
    the older option list / string (``"full_shard auto_wrap offload"``)."""
    if isinstance(fsdp, str):
        options = set(fsdp.split())
    elif isinstance(fsdp, list | tuple):
        options = {str(getattr(option, "value", option)) for option in fsdp}
    else:
        options = set()
    reshard = config.get("reshard_after_forward")
    if reshard is None:
        reshard = not options & {"shard_grad_op", "hybrid_shard_zero2"}
    elif isinstance(reshard, str):
        if reshard.lower() not in ("true", "false", "full_shard", "shard_grad_op"):
            raise InvalidWorkloadError(
                f"fsdp_config.reshard_after_forward {reshard!r} is not one this reads "
                "(true, false, FULL_SHARD, SHARD_GRAD_OP)",
                field="fsdp_config.reshard_after_forward",
            )
        reshard = reshard.lower() in ("true", "full_shard")
    offload = bool(config.get("cpu_offload")) or "offload" in options
    return {
        "engine": "torch",
        "sharding": "zero3" if reshard else "zero2",
        "offload": "all" if offload else "none",
        "hybrid": bool(options & {"hybrid_shard", "hybrid_shard_zero2"}),
    }


def _deepspeed(config: Any, *, read_optimizer: bool) -> dict[str, Any]:
    """ZeRO's stage and offload from a DeepSpeed config (a dict, or a JSON file's path),
    and its own optimizer when ``read_optimizer``."""
    if isinstance(config, str | os.PathLike):
        try:
            with open(config, encoding="utf-8") as file:
                config = json.load(file)
        except (OSError, ValueError) as error:
            raise InvalidWorkloadError(
                f"the DeepSpeed config {os.fspath(config)!r} could not be read: {error}",
                field="deepspeed",
            ) from error
    if not isinstance(config, Mapping):
        raise InvalidWorkloadError(
            "deepspeed must be a config dict or a JSON path", field="deepspeed"
        )
    zero = config.get("zero_optimization") or {}
    stage = zero.get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise InvalidWorkloadError(
            f"zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}",
            field="deepspeed.zero_optimization.stage",
        )
    offload = "none"
    if _offloaded(zero.get("offload_optimizer")):
        offload = "optimizer"
    if _offloaded(zero.get("offload_param")):
        offload = "all"
    read: dict[str, Any] = {
        "engine": "deepspeed",
        "sharding": ("none", "zero1", "zero2", "zero3")[stage],
        "offload": offload,
    }
    optimizer = config.get("optimizer")
    if optimizer and read_optimizer:  # DeepSpeed builds it: the Trainer's optim is not used
        kind = str(optimizer.get("type", "")).lower() if isinstance(optimizer, Mapping) else ""
        if kind not in ("adam", "adamw"):
            raise InvalidWorkloadError(
                f"the DeepSpeed optimizer {kind or optimizer!r} has no memory model here "
                "(Adam / AdamW: FusedAdam); pass optimizer=... for what it keeps",
                field="deepspeed.optimizer.type",
            )
        read["optimizer"] = "adamw_fused"
    return read


def _offloaded(section: Any) -> bool:
    return isinstance(section, Mapping) and section.get("device") in _OFFLOAD_DEVICES
