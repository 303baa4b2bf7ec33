"""The distributed workload fields through every door: the CLI, the client's local
answer and the dry run (which counts each GPU's parameters on the built model)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ckpt_core import dry_run, make_plan
from ckpt_core.cli import main
from ckpt_core.client import local_plan

LORA_70B = {"seq_len": 8192, "method": "lora", "world_size": 8, "sharding": "zero3"}


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_cli_resolve_takes_the_distributed_flags(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_cli(
        capsys,
        *("resolve", "--tier", "auto", "--gpu", "H100-80GB", "--model", "llama-3.1-70b"),
        *("--seq-len", "8192", "--method", "full", "--world-size", "8", "--sharding", "zero3"),
        *("--engine", "deepspeed", "--offload", "optimizer", "--gpus-per-node", "8"),
        *("--host-memory-gb", "2048", "--json"),
    )
    assert status == 0
    plan = json.loads(out)
    api = make_plan(
        "auto",
        gpu="H100-80GB",
        model={"preset": "llama-3.1-70b"},
        workload={
            "seq_len": 8192,
            "method": "full",
            "world_size": 8,
            "sharding": "zero3",
            "engine": "deepspeed",
            "offload": "optimizer",
            "gpus_per_node": 8,
            "host_memory_gb": 2048.0,
        },
    )
    assert plan == json.loads(json.dumps(api.to_dict()))
    assert plan["estimate"]["assumptions"]["distributed"]["host_fits"] is True


def test_cli_hybrid_is_a_switch(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("resolve", "--tier", "full", "--model", "llama-3.1-8b", "--seq-len", "1024")
    args += ("--world-size", "16", "--gpus-per-node", "8", "--sharding", "zero3", "--json")
    status, out, _ = run_cli(capsys, *args, "--hybrid")
    assert status == 0
    assert json.loads(out)["estimate"]["assumptions"]["distributed"]["shard_degree"] == 8
    status, out, _ = run_cli(capsys, *args)
    assert json.loads(out)["estimate"]["assumptions"]["distributed"]["shard_degree"] == 16


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (("--sharding", "zero4"), "--sharding"),
        (("--world-size", "0"), "--world-size"),
        (("--offload", "all", "--sharding", "zero2"), "--offload"),
        (("--engine", "jax"), "--engine"),
        (("--host-memory-gb", "512", "--world-size", "8"), "--gpus-per-node"),
    ],
)
def test_cli_refuses_bad_distributed_flags(
    capsys: pytest.CaptureFixture[str], flags: tuple[str, ...], needle: str
) -> None:
    args = ("resolve", "--tier", "auto", "--model", "llama-3.1-8b", "--seq-len", "1024")
    status, out, err = run_cli(capsys, *args, *flags)
    assert status == 2
    assert out == ""
    assert needle in err and "Traceback" not in err


def test_client_local_answer_takes_the_fields() -> None:
    plan = local_plan("auto", gpu="H100-80GB", model={"preset": "llama-3.1-70b"}, workload=LORA_70B)
    assert plan.estimate is not None
    assert plan.estimate["assumptions"]["distributed"]["shard_degree"] == 8
    # FSDP's own checkpointing does a whole-model tier; a block-level plan is hooks on its units.
    wrapped = plan.training_arguments["fsdp_config"]["activation_checkpointing"]
    assert wrapped is (plan.granularity == "full")
    assert plan.hooks == ("blocks" if plan.granularity == "blocks" else None)


@pytest.mark.parametrize("preset", ["llama-3.1-70b", "mixtral-8x7b", "qwen2.5-7b", "gemma-2-9b"])
@pytest.mark.parametrize(("world_size", "sharding"), [(8, "zero3"), (4, "zero2"), (8, "none")])
def test_dry_run_counts_each_gpus_parameters_as_the_estimate_does(
    preset: str, world_size: int, sharding: str
) -> None:
    """FSDP2 shards along dim 0 and pads the last rank: the estimate assumes no padding."""
    shape: dict[str, Any] = {"seq_len": 256, "world_size": world_size, "sharding": sharding}
    report = dry_run({"preset": preset}, "full", measure=shape)
    assert report.measured is not None
    workload = {"seq_len": 256, "method": "full", "world_size": world_size, "sharding": sharding}
    plan = make_plan("full", model={"preset": preset}, workload=workload)
    estimated = plan.estimate["assumptions"]["weights_bytes"] // 2  # bf16
    assert report.measured["parameters_per_gpu"] == pytest.approx(estimated, rel=1e-4)
    if sharding == "none":
        assert report.measured["parameters_per_gpu"] == report.parameters


def test_a_plain_measurement_reports_its_shape_and_no_per_gpu_fields() -> None:
    report = dry_run({"preset": "llama-3.2-1b"}, "full", measure={"seq_len": 64})
    assert report.measured is not None
    assert set(report.measured) == {
        "activation_bytes",
        "seq_len",
        "micro_batch_size",
        "dtype",
        "attention",
        "padded",
    }
