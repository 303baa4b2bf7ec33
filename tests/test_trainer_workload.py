"""The workload a HuggingFace TrainingArguments decides (`workload_from_training_arguments`).

Real ``TrainingArguments`` where they can be built on a CPU; DeepSpeed configs
are read from a duck-typed arguments object (building the Trainer's DeepSpeed
arguments starts DeepSpeed), as a dict and as a JSON file.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from transformers import TrainingArguments

from ckpt_core import InvalidWorkloadError, make_plan, workload_from_training_arguments


def _args(tmp_path: Path, **kwargs: Any) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], **kwargs)


def _namespace(**overrides: Any) -> SimpleNamespace:
    """The attributes the reader uses, at TrainingArguments' defaults on torch >= 2.8."""
    fields = {
        "per_device_train_batch_size": 8,
        "bf16": False,
        "fp16": False,
        "optim": "adamw_torch_fused",
        "optim_args": None,
        "gradient_accumulation_steps": 1,
        "world_size": 8,
        "deepspeed": None,
        "fsdp": None,
        "fsdp_config": None,
    }
    return SimpleNamespace(**{**fields, **overrides})


def test_the_trainers_defaults_and_flags_become_the_workload(tmp_path: Path) -> None:
    """HF Trainer's default optimizer on this torch is the fused AdamW (no foreach
    temporary); accumulation keeps the gradients through the step's micro-batches."""
    args = _args(tmp_path, bf16=True, per_device_train_batch_size=2, gradient_accumulation_steps=4)
    workload = workload_from_training_arguments(args, seq_len=2048, method="lora")
    assert workload == {
        "micro_batch_size": 2,
        "dtype": "bf16",
        "optimizer": "adamw_fused",
        "gradients": "accumulate",
        "world_size": 1,
        "seq_len": 2048,
        "method": "lora",
    }
    plain = workload_from_training_arguments(_args(tmp_path), seq_len=512)
    assert (plain["dtype"], plain["gradients"], plain["micro_batch_size"]) == (
        "fp32",
        "set_to_none",
        8,
    )
    # The estimate takes it as it is.
    plan = make_plan("auto", gpu="A100-80GB", model={"preset": "llama-3.2-1b"}, workload=workload)
    assert plan.estimate["chosen"]["fits"]


@pytest.mark.parametrize(
    ("optim", "optimizer"),
    [
        ("adamw_torch", "adamw"),
        ("adamw_torch_fused", "adamw_fused"),
        ("adamw_bnb_8bit", "adamw_8bit"),
        ("paged_adamw_8bit", "adamw_8bit"),
        ("paged_adamw_32bit", "adamw_32bit"),
        ("adafactor", "adafactor"),
        ("sgd", "sgd"),
    ],
)
def test_the_trainers_optimizers_map_to_the_workloads(
    tmp_path: Path, optim: str, optimizer: str
) -> None:
    args = _args(tmp_path, optim=optim)
    assert workload_from_training_arguments(args, seq_len=64)["optimizer"] == optimizer


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"optim": "rmsprop"}, "optim"),  # no memory model: an error, not a guess
        ({"use_liger_kernel": True}, "use_liger_kernel"),
        ({"torch_compile": True}, "torch_compile"),
        ({"optim": "sgd", "optim_args": "momentum=0.9"}, "optim_args"),
        ({"deepspeed": {"zero_optimization": {"stage": 4}}}, "deepspeed.zero_optimization.stage"),
        ({"deepspeed": {"optimizer": {"type": "Lamb"}}}, "deepspeed.optimizer.type"),
        ({"deepspeed": "/nonexistent/ds_config.json"}, "deepspeed"),
        (
            {"fsdp": True, "fsdp_config": {"reshard_after_forward": "sometimes"}},
            "fsdp_config.reshard_after_forward",
        ),
    ],
)
def test_what_has_no_memory_model_is_an_error_naming_it(
    overrides: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidWorkloadError) as error:
        workload_from_training_arguments(_namespace(**overrides), seq_len=64)
    assert error.value.field == field


@pytest.mark.parametrize(
    "overrides",
    [{"optim": "rmsprop"}, {"deepspeed": {"optimizer": {"type": "Lamb"}}}],
)
def test_an_optimizer_the_caller_names_needs_no_memory_model_of_the_arguments(
    overrides: dict[str, Any],
) -> None:
    """What the error says to do works: the caller's optimizer is taken as given."""
    read = workload_from_training_arguments(
        _namespace(**overrides), seq_len=64, optimizer="adamw_fused"
    )
    assert read["optimizer"] == "adamw_fused"


def test_an_object_that_is_not_training_arguments_is_refused() -> None:
    with pytest.raises(InvalidWorkloadError) as error:
        workload_from_training_arguments(SimpleNamespace(bf16=True), seq_len=64)
    assert error.value.field == "per_device_train_batch_size"


def test_a_missing_seq_len_is_an_error() -> None:
    with pytest.raises(InvalidWorkloadError) as error:
        workload_from_training_arguments(_namespace())
    assert error.value.field == "workload.seq_len"


@pytest.mark.parametrize(
    ("fsdp_config", "sharding", "offload"),
    [
        ({"reshard_after_forward": True, "cpu_offload": False}, "zero3", "none"),
        ({"reshard_after_forward": False, "cpu_offload": False}, "zero2", "none"),
        ({"reshard_after_forward": True, "cpu_offload": True}, "zero3", "all"),
    ],
)
def test_fsdp_arguments_become_the_sharding(
    tmp_path: Path, fsdp_config: dict[str, Any], sharding: str, offload: str
) -> None:
    args = _args(tmp_path, fsdp=True, fsdp_config=fsdp_config)
    workload = workload_from_training_arguments(args, seq_len=1024)
    assert (workload["engine"], workload["sharding"], workload["offload"]) == (
        "torch",
        sharding,
        offload,
    )
    assert workload["hybrid"] is False


def test_fsdps_older_option_list_is_read_too() -> None:
    args = _namespace(fsdp=["hybrid_shard", "auto_wrap"], fsdp_config={})
    workload = workload_from_training_arguments(args, seq_len=1024, gpus_per_node=8)
    assert (workload["sharding"], workload["hybrid"]) == ("zero3", True)


def test_a_deepspeed_config_file_sets_zero_and_its_own_optimizer(tmp_path: Path) -> None:
    """ZeRO-2 with the optimizer offloaded, DeepSpeed's own AdamW (FusedAdam: the fused
    step), from the JSON file the Trainer was given; the caller still wins."""
    config = {
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
    }
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    workload = workload_from_training_arguments(
        _namespace(deepspeed=str(path)), seq_len=1024, host_memory_gb=512, gpus_per_node=8
    )
    assert {k: workload[k] for k in ("engine", "sharding", "offload", "optimizer")} == {
        "engine": "deepspeed",
        "sharding": "zero2",
        "offload": "optimizer",
        "optimizer": "adamw_fused",
    }
    stage3 = {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}
    read = workload_from_training_arguments(_namespace(deepspeed=stage3), seq_len=1024)
    assert (read["sharding"], read["offload"], read["optimizer"]) == ("zero3", "all", "adamw_fused")
    # Without an optimizer section DeepSpeed steps the Trainer's: optim decides.
    plain = {"zero_optimization": {"stage": 1}}
    read = workload_from_training_arguments(
        _namespace(deepspeed=plain, optim="adamw_torch"), seq_len=1024, optimizer="adamw_8bit"
    )
    assert (read["sharding"], read["optimizer"]) == ("zero1", "adamw_8bit")


def test_real_arguments_that_compile_the_step_are_refused(tmp_path: Path) -> None:
    """``torch_compile=True`` as the Trainer reads it: a compiled step keeps other tensors."""
    args = _args(tmp_path, torch_compile=True)
    with pytest.raises(InvalidWorkloadError, match="torch_compile") as error:
        workload_from_training_arguments(args, seq_len=64)
    assert error.value.field == "torch_compile"
