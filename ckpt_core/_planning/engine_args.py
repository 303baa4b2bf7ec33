"""TrainingArguments kwargs for the data-parallel engine a workload names.

- DDP (``sharding: none``) and DeepSpeed (``engine: deepspeed``): the HF
  checkpointing kwargs of `trainer_settings` as they are; DeepSpeed honours
  the model's own checkpointing (its ZeRO config is the worker's).
- FSDP2 under the HF Trainer (``engine: torch``, ``zero2`` / ``zero3``): the
  plan's checkpointing goes into ``fsdp_config["activation_checkpointing"]``
  (accelerate wraps each block with FSDP's checkpoint wrapper before
  ``fully_shard``), and HF's own flag is explicitly off: with FSDP it
  recomputes through FSDP's pre-forward hook and all-gathers every block's
  parameters a second time in the backward pass.  FSDP's wrapper checkpoints
  every wrapped block, so medium and selective stay hooks (on the blocks FSDP
  wraps; the hooks replace the block's ``forward``, inside FSDP's
  ``__call__`` hooks, so recomputation gathers nothing again).

Field forms, read from the transformers sources: 5.24 takes ``fsdp=True`` with
``fsdp_config`` keys ``version``, ``reshard_after_forward``, ``cpu_offload``,
``activation_checkpointing``; earlier releases take the ``fsdp`` option string
(``"full_shard auto_wrap"``), which 5.24 still translates, with a warning.
"""

from __future__ import annotations

from typing import Any, Final

from ckpt_core._planning.tiers import PlanGranularity
from ckpt_core._planning.training_args import TrainerSettings, Version
from ckpt_core._planning.workload import Workload

FSDP_BOOL_SINCE: Final[Version] = (5, 24, 0)  # the first release read here with fsdp=True


def uses_fsdp(workload: Workload | None) -> bool:
    """Whether the workload runs FSDP2 (torch engine with sharding)."""
    return workload is not None and workload.engine == "torch" and workload.sharding != "none"


def engine_settings(
    settings: TrainerSettings,
    granularity: PlanGranularity | None,
    version: Version,
    workload: Workload | None,
) -> TrainerSettings:
    """`settings` as the workload's engine needs them under the HF Trainer."""
    if workload is None or not uses_fsdp(workload):
        return settings
    on_key = next(k for k in settings.training_arguments if k.endswith("checkpointing"))
    fsdp_config: dict[str, Any] = {"activation_checkpointing": granularity == "full"}
    kwargs: dict[str, Any] = {on_key: False, "fsdp_config": fsdp_config}
    if version >= FSDP_BOOL_SINCE:
        kwargs["fsdp"] = True
        fsdp_config.update(
            version=2,
            reshard_after_forward=workload.sharding == "zero3",
            cpu_offload=workload.offload == "all",
        )
    else:
        strategy = "full_shard" if workload.sharding == "zero3" else "shard_grad_op"
        kwargs["fsdp"] = f"{strategy} auto_wrap" + (" offload" if workload.offload == "all" else "")
    # Anything short of every block is hooks on the blocks FSDP wraps (a block plan too).
    hooks = granularity if granularity in ("medium", "selective", "blocks") else None
    return TrainerSettings(kwargs, hooks=hooks)  # type: ignore[arg-type]


def engine_sentence(granularity: PlanGranularity | None, workload: Workload | None) -> str:
    """How the plan's checkpointing reaches the engine, for the plan's reason ("" when as usual)."""
    if workload is None or not uses_fsdp(workload):
        return ""
    hybrid = (
        "; hybrid sharding (HSDP) is set in accelerate's parallelism config, not by these kwargs"
        if workload.hybrid
        else ""
    )
    if granularity == "full":
        how = "FSDP2: fsdp_config activation_checkpointing wraps every block (HF's flag off)"
    elif granularity is None:
        how = "FSDP2: no checkpointing (HF's flag and fsdp_config activation_checkpointing off)"
    else:
        how = (
            f"FSDP2: HF's flag and fsdp_config activation_checkpointing off; the worker installs "
            f"{granularity} hooks on the blocks FSDP wraps (before fully_shard)"
        )
    return how + hybrid
