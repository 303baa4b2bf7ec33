"""The plan's kwargs per data-parallel engine, read back by real TrainingArguments and
accelerate's FSDP plugin (no GPU needed to construct them)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from ckpt_core import make_plan
from ckpt_core.integrations.hf import PlanConflictWarning, merge_training_arguments

MODEL = {"preset": "llama-3.2-1b"}
TIERS = ("off", "selective", "medium", "full")


def plan_for(tier: str, version: str = "5.24.0", **workload: Any) -> Any:
    return make_plan(
        tier, transformers_version=version, model=MODEL, workload={"seq_len": 512, **workload}
    )


def training_arguments(tmp_path: Path, kwargs: dict[str, Any]) -> Any:
    from transformers import TrainingArguments

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # no deprecated names on 5.24
        return TrainingArguments(output_dir=str(tmp_path), report_to=[], **kwargs)


@pytest.mark.parametrize("tier", TIERS)
def test_fsdp_plans_checkpoint_through_fsdp_config(tier: str, tmp_path: Path) -> None:
    from accelerate.utils import FullyShardedDataParallelPlugin

    plan = plan_for(tier, world_size=8, sharding="zero3")
    args = training_arguments(tmp_path, plan.training_arguments)
    assert args.fsdp and args.activation_checkpointing is False  # no redundant all-gather
    plugin = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
    assert plugin.fsdp_version == 2
    assert plugin.activation_checkpointing is (tier == "full")
    assert plugin.reshard_after_forward is True
    # FSDP's wrapper checkpoints every block: medium and selective are hooks on those blocks.
    assert plan.hooks == (tier if tier in ("medium", "selective") else None)
    if plan.hooks:
        assert "before fully_shard" in plan.reason


def test_fsdp_zero2_and_offload_reach_the_plugin(tmp_path: Path) -> None:
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import CPUOffloadPolicy

    zero2 = training_arguments(
        tmp_path, plan_for("full", world_size=8, sharding="zero2").training_arguments
    )
    assert FullyShardedDataParallelPlugin(**zero2.fsdp_plugin_args).reshard_after_forward is False
    offload = plan_for("full", world_size=8, sharding="zero3", offload="all")
    args = training_arguments(tmp_path, offload.training_arguments)
    plugin = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
    assert isinstance(plugin.cpu_offload, CPUOffloadPolicy)


def test_older_transformers_get_the_fsdp_option_string(tmp_path: Path) -> None:
    plan = plan_for("full", version="4.57.0", world_size=8, sharding="zero3")
    assert plan.training_arguments["fsdp"] == "full_shard auto_wrap"
    assert plan.training_arguments["gradient_checkpointing"] is False
    from transformers import TrainingArguments

    # The installed release still reads the string form (with its deprecation warning).
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], **plan.training_arguments)
    assert args.fsdp_plugin_args["activation_checkpointing"] is True


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize(
    "workload",
    [
        {"world_size": 8},
        {"world_size": 8, "sharding": "zero3", "engine": "deepspeed"},
        {"world_size": 8, "sharding": "zero2", "engine": "deepspeed", "offload": "optimizer"},
    ],
)
def test_ddp_and_deepspeed_keep_hfs_own_kwargs(tier: str, workload: dict[str, Any]) -> None:
    distributed = plan_for(tier, **workload)
    single = plan_for(tier)
    assert distributed.training_arguments == single.training_arguments
    assert distributed.hooks == single.hooks
    assert "fsdp" not in distributed.training_arguments


def test_merge_keeps_the_users_fsdp_config_and_reports_what_the_plan_changes(
    tmp_path: Path,
) -> None:
    plan = plan_for("medium", world_size=8, sharding="zero3")
    user = {
        "learning_rate": 1e-4,
        "fsdp": True,
        "fsdp_config": {
            "fsdp_transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
            "activation_checkpointing": True,  # would checkpoint every block under the hooks
        },
        "gradient_checkpointing": True,
    }
    with pytest.warns(PlanConflictWarning):
        merged, conflicts = merge_training_arguments(user, plan)
    assert merged["fsdp_config"]["transformer_layer_cls_to_wrap"] == ["LlamaDecoderLayer"]
    assert merged["fsdp_config"]["activation_checkpointing"] is False
    assert {c.key for c in conflicts} == {
        "gradient_checkpointing",
        "fsdp_config.activation_checkpointing",
    }
    assert user["fsdp_config"]["activation_checkpointing"] is True  # the input is not modified
    args = training_arguments(tmp_path, merged)
    assert args.fsdp_plugin_args["transformer_cls_names_to_wrap"] == "LlamaDecoderLayer"
    assert args.fsdp_plugin_args["activation_checkpointing"] is False
