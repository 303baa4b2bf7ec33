"""Per-GPU advice under data parallelism (DDP, FSDP2, DeepSpeed ZeRO): the workload fields,
the per-GPU breakdown, llama-3.1-70b on 8 x H100-80GB, and DeepSpeed's own estimators.

DeepSpeed's estimators (``estimate_zero2_model_states_mem_needs`` /
``estimate_zero3_model_states_mem_needs``, the functions behind the
``..._all_cold`` printers) are run for the same parameter counts as ours; they
assume mixed precision with fp32 master weights, as our ``engine: deepspeed``
recipe does.
"""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_core import InvalidWorkloadError, Workload, make_plan
from ckpt_core._memory.inputs import model_facts, parse_workload, prepare
from ckpt_core._memory.sharding import ShardedMemory, _largest_module

GIB = 1 << 30
H100 = "H100-80GB"
LLAMA_70B = {"preset": "llama-3.1-70b"}


def plan_for(**workload: Any) -> Any:
    return make_plan("auto", gpu=H100, model=LLAMA_70B, workload={"seq_len": 8192, **workload})


def static_for(preset: str, **workload: Any) -> ShardedMemory:
    run = prepare(model_facts({"preset": preset}), parse_workload({"seq_len": 1024, **workload}))
    assert isinstance(run.static, ShardedMemory)
    return run.static


# --- workload fields ---------------------------------------------------------------------


def test_distributed_defaults_are_one_gpu() -> None:
    workload = Workload(seq_len=16)
    assert (workload.world_size, workload.sharding, workload.engine, workload.offload) == (
        1,
        "none",
        "torch",
        "none",
    )
    assert (workload.gpus_per_node, workload.hybrid, workload.host_memory_gb) == (None, False, None)
    assert Workload.from_dict(workload.to_dict()) == workload


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"world_size": 0}, "world_size"),
        ({"world_size": 2.0}, "world_size"),
        ({"world_size": True}, "world_size"),
        ({"sharding": "zero4"}, "sharding"),
        ({"sharding": "ZeRO3"}, "sharding"),
        ({"engine": "megatron"}, "engine"),
        ({"offload": "nvme"}, "offload"),
        ({"hybrid": "yes", "sharding": "zero3"}, "hybrid"),
        ({"hybrid": True, "sharding": "zero3", "world_size": 16}, "hybrid"),  # no gpus_per_node
        ({"hybrid": True, "gpus_per_node": 8, "world_size": 16}, "hybrid"),  # no sharding
        ({"gpus_per_node": 3, "world_size": 8}, "gpus_per_node"),
        ({"gpus_per_node": 0}, "gpus_per_node"),
        ({"host_memory_gb": 0}, "host_memory_gb"),
        ({"host_memory_gb": float("nan")}, "host_memory_gb"),
        ({"host_memory_gb": 512, "world_size": 8, "sharding": "zero3"}, "gpus_per_node"),
        ({"offload": "optimizer", "engine": "deepspeed"}, "offload"),  # DDP cannot offload
        ({"offload": "all", "sharding": "zero2", "engine": "deepspeed"}, "offload"),
        ({"offload": "optimizer", "sharding": "zero3"}, "offload"),  # FSDP2 offloads all together
        ({"sharding": "zero1"}, "sharding"),  # no ZeRO-1 for torch under the HF Trainer
    ],
)
def test_bad_distributed_fields_name_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidWorkloadError) as caught:
        Workload.from_dict({"seq_len": 16, **fields})
    assert caught.value.field == f"workload.{field}"


def test_default_workload_keeps_the_single_gpu_numbers() -> None:
    static = static_for("llama-3.1-8b", method="full")
    assert static.totals is not None
    assert (static.weights, static.gradients, static.optimizer) == (
        static.totals.weights,
        static.totals.gradients,
        static.totals.optimizer,
    )
    assert static.gathered == static.communication == static.host_per_gpu == 0


# --- the per-GPU arithmetic ----------------------------------------------------------------


def test_fsdp2_shards_everything_the_single_gpu_model_counts() -> None:
    one = static_for("llama-3.1-8b")
    eight = static_for("llama-3.1-8b", world_size=8, sharding="zero3")
    assert eight.weights * 8 == one.weights
    assert eight.gradients * 8 == one.gradients
    assert eight.optimizer * 8 == one.optimizer
    # Root unit (embeddings + head + norms) and two blocks gathered, one block's gradients.
    assert one.weights / 8 < eight.gathered < one.weights / 4


def test_hybrid_shards_within_the_node_only() -> None:
    hybrid = static_for(
        "llama-3.1-8b", world_size=32, gpus_per_node=8, hybrid=True, sharding="zero3"
    )
    node = static_for("llama-3.1-8b", world_size=8, sharding="zero3")
    assert hybrid.shard_degree == 8
    assert (hybrid.weights, hybrid.gradients, hybrid.optimizer) == (
        node.weights,
        node.gradients,
        node.optimizer,
    )


def test_ddp_counts_its_gradient_buckets() -> None:
    ddp = static_for("llama-3.2-1b", world_size=4)
    assert ddp.communication == ddp.gradients > 0


def test_offload_moves_states_to_the_host_and_checks_its_size() -> None:
    workload = {"world_size": 8, "gpus_per_node": 8, "sharding": "zero3", "engine": "deepspeed"}
    on_gpu = plan_for(**workload, offload="optimizer", host_memory_gb=2048)
    too_small = plan_for(**workload, offload="optimizer", host_memory_gb=256)
    info = on_gpu.estimate["assumptions"]["distributed"]
    assert info["host_bytes_per_node"] == 8 * info["host_bytes_per_gpu"] > 0
    assert info["host_fits"] is True
    assert "host memory" not in on_gpu.reason
    assert too_small.estimate["assumptions"]["distributed"]["host_fits"] is False
    assert "more than the 256 GiB given" in too_small.reason


@pytest.mark.parametrize("sharding", ["zero1", "zero2", "zero3"])
def test_the_foreach_adamw_temporary_is_one_state_of_the_gpus_share(sharding: str) -> None:
    """torch's foreach step holds one state-sized tensor per parameter.  DeepSpeed steps
    its fp32 partition: one fp32 state of this GPU's share (a third of the optimizer
    bytes, masters included), not the 16-bit and fp32 gradients together (ZeRO-3 keeps
    only the fp32 partition); torch's states are the parameters' dtype, as the
    gradients.  On the host, or fused (DeepSpeed's own FusedAdam), none."""
    workload = {"world_size": 8, "sharding": sharding, "method": "full"}
    run = prepare(
        model_facts({"preset": "llama-3.2-1b"}),
        parse_workload({"seq_len": 1024, **workload, "engine": "deepspeed"}),
    )
    share = -(-run.static.trainable_parameters * 4 // 8)
    assert run.recipe.optimizer_temporary == share == run.static.optimizer // 3
    bf16 = 2 * run.static.trainable_parameters  # ZeRO-1 keeps them whole, ZeRO-2 a share
    sixteen_bit = {"zero1": bf16, "zero2": -(-bf16 // 8), "zero3": 0}[sharding]
    assert run.static.gradients == share + sixteen_bit
    if sharding != "zero1":  # torch's engine has no ZeRO-1
        torch = prepare(
            model_facts({"preset": "llama-3.2-1b"}), parse_workload({"seq_len": 1024, **workload})
        )
        assert torch.recipe.optimizer_temporary == torch.static.gradients
    for change in ({"offload": "optimizer"}, {"optimizer": "adamw_fused"}):
        other = {"seq_len": 1024, **workload, "engine": "deepspeed", **change}
        off = prepare(model_facts({"preset": "llama-3.2-1b"}), parse_workload(other))
        assert off.recipe.optimizer_temporary == 0


# --- must show: llama-3.1-70b, seq 8192, 8 x H100-80GB -----------------------------------


def _breakdown(plan: Any) -> tuple[dict[str, Any], int]:
    """The per-GPU breakdown of the chosen tier, and its allocated bytes rebuilt from it."""
    assumptions = plan.estimate["assumptions"]
    chosen = plan.estimate["chosen"]
    parts = {
        "weights": assumptions["weights_bytes"],
        "gradients": assumptions["gradients_bytes"],
        "optimizer": assumptions["optimizer_bytes"],
        "gathered": assumptions["distributed"]["gathered_bytes"],
        "communication": assumptions["distributed"]["communication_bytes"],
        "activations": chosen["activation_bytes"],
    }
    return parts, sum(parts.values())


@pytest.mark.parametrize(
    "workload",
    [
        {"method": "lora"},
        {"method": "lora", "engine": "deepspeed"},
        {"method": "full", "offload": "all"},
        {"method": "full", "engine": "deepspeed", "offload": "optimizer"},
    ],
)
def test_llama_70b_fits_8_h100_with_zero3_not_without(workload: dict[str, Any]) -> None:
    sharded = plan_for(world_size=8, sharding="zero3", **workload)
    assert sharded.estimate["chosen"]["fits"] is True, sharded.reason
    assert "least recompute that fits" in sharded.reason
    parts, _ = _breakdown(sharded)
    row = sharded.estimate["chosen"]
    assumptions = sharded.estimate["assumptions"]
    # Nothing left out: what stays resident through the step (the sharded states, the
    # gathered units, the buckets and the kept activations) is inside the allocated peak,
    # and the process holds it plus the CUDA context.
    resident = sum(parts[k] for k in ("weights", "optimizer", "gathered", "communication"))
    assert row["allocated_bytes"] >= resident + parts["activations"]
    assert row["peak_bytes"] >= row["allocated_bytes"] + assumptions["cuda_context_bytes"]
    if workload.get("offload", "none") == "none":
        # Per GPU: the replica's weights over 8 GPUs, the unsharded total beside it.
        assert parts["weights"] * 8 == pytest.approx(assumptions["weights_total_bytes"], rel=1e-9)
    replicated = {k: v for k, v in workload.items() if k != "offload"}
    plain = plan_for(world_size=8, sharding="none", **replicated)
    assert not any(row["fits"] for row in plain.estimate["tiers"].values())
    assert "nothing fits" in plain.reason
    # DDP holds the whole replica on every GPU: the per-GPU figure is the sharded run's total.
    assert plain.estimate["assumptions"]["weights_bytes"] == assumptions["weights_total_bytes"]


def test_llama_70b_full_fine_tune_needs_offload_on_8_h100() -> None:
    """16 B (or 8 B) of model states per parameter over 8 GPUs leave no room: said, not hidden."""
    plan = plan_for(world_size=8, sharding="zero3", method="full")
    assert "nothing fits" in plan.reason
    methods = {option["changes"].get("method") for option in plan.estimate["alternatives"]}
    assert methods & {"lora", "qlora"}, plan.estimate["alternatives"]


# --- DeepSpeed's own estimators -----------------------------------------------------------

PRESETS = ("llama-3.1-70b", "llama-3.1-8b", "mixtral-8x7b", "qwen2.5-7b")
SETUPS = ((1, 8), (2, 8), (8, 8), (1, 4))  # (nodes, GPUs per node)


def _ds_case(preset: str, nodes: int, per_node: int, **workload: Any) -> tuple[ShardedMemory, Any]:
    run = prepare(
        model_facts({"preset": preset}),
        parse_workload(
            {
                "seq_len": 1024,
                "method": "full",
                "engine": "deepspeed",
                "world_size": nodes * per_node,
                "gpus_per_node": per_node,
                **workload,
            }
        ),
    )
    assert isinstance(run.static, ShardedMemory)
    return run.static, run.facts


def _model_states(static: ShardedMemory) -> int:
    return static.weights + static.gradients + static.optimizer + static.gathered


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize(("nodes", "per_node"), SETUPS)
@pytest.mark.parametrize("offload", ["none", "optimizer"])
def test_zero2_matches_deepspeeds_estimator(
    preset: str, nodes: int, per_node: int, offload: str
) -> None:
    stage_1_and_2 = pytest.importorskip(
        "deepspeed.runtime.zero.stage_1_and_2", reason="deepspeed (the test extra) not installed"
    )
    ours, facts = _ds_case(preset, nodes, per_node, sharding="zero2", offload=offload)
    _, gpu = stage_1_and_2.estimate_zero2_model_states_mem_needs(
        facts.layout.total, per_node, nodes, cpu_offload=offload != "none"
    )
    assert _model_states(ours) == pytest.approx(gpu, rel=0.01)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize(("nodes", "per_node"), SETUPS)
@pytest.mark.parametrize("offload", ["none", "optimizer", "all"])
def test_zero3_matches_deepspeeds_estimator(
    preset: str, nodes: int, per_node: int, offload: str
) -> None:
    stage3 = pytest.importorskip(
        "deepspeed.runtime.zero.stage3", reason="deepspeed (the test extra) not installed"
    )
    ours, facts = _ds_case(preset, nodes, per_node, sharding="zero3", offload=offload)
    largest = _largest_module(facts.arch, facts.layout)
    cpu, gpu, _ = stage3.estimate_zero3_model_states_mem_needs(
        facts.layout.total,
        largest,
        per_node,
        nodes,
        cpu_offload=offload != "none",
        cpu_offload_params=offload == "all",
        additional_buffer_factor=1.0,
    )
    assert _model_states(ours) == pytest.approx(gpu, rel=0.01)
    if offload != "none":  # with zero.Init, DeepSpeed's host figure is the steady state
        assert ours.host_per_gpu * per_node == pytest.approx(cpu, rel=0.01)


@pytest.mark.parametrize("arch", ["llama", "mixtral"])
def test_largest_module_is_what_deepspeed_counts_on_a_real_model(arch: str) -> None:
    stage3 = pytest.importorskip(
        "deepspeed.runtime.zero.stage3", reason="deepspeed (the test extra) not installed"
    )
    from tests._tiny_models import tiny_model

    model = tiny_model(arch)
    total, largest = stage3.model_to_params(model)
    import json

    facts = model_facts({"config": json.loads(model.config.to_json_string())})
    assert (facts.layout.total, _largest_module(facts.arch, facts.layout)) == (total, largest)
