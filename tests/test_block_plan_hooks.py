"""Block-level plans on real (tiny) models: numerics, recompute, FLOPs, memory, trainers.

Every claim is a comparison with the same model without checkpointing (same
loss, same gradients) or with HF's own ``every_n_layers``; the FLOPs and
activation bytes of a plan are compared with ``FlopCounterMode`` and the meta
measurement, as for the tiers.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from ckpt_core import InvalidGranularityError, Plan, install_checkpoint_hooks
from ckpt_core._hooks.blocks import counted_blocks, find_attention, find_blocks
from ckpt_core._memory.activations import activation_bytes, block_layout
from ckpt_core._memory.families import arch_of
from ckpt_core._memory.flops import recompute_ratio
from ckpt_core._memory.ledger import Step
from ckpt_core._memory.placement import hf_blocks
from ckpt_core._planning.block_plan import BlockPlan, every_n_set
from ckpt_core._planning.training_args import parse_transformers_version, trainer_settings
from tests._tiny_models import loss_and_grads, tiny_batch, tiny_model
from tests.test_hooks_numerics import assert_same_step
from tests.test_hooks_recompute import _descendants, _hf, forward_counts, total_flops

LAYERS = 4
NUMERIC_ARCHS = ("llama", "gemma2", "qwen2_moe", "gpt2", "t5", "bart", "bert", "llava")


def mixed_plan(model: torch.nn.Module) -> BlockPlan:
    """The first and last block whole, the second block's attention, the rest off."""
    _, total = counted_blocks(model, find_blocks(model))
    return BlockPlan(total, (0, total - 1), (1,))


def expected_hooked(model: torch.nn.Module, plan: BlockPlan) -> set[str]:
    counted, _ = counted_blocks(model, find_blocks(model))
    names = {name for counter, name, _ in counted if counter in plan.full}
    for counter, name, block in counted:
        if counter in plan.selective:
            names |= {f"{name}.{attn}" for attn, _ in find_attention(block)}
    return names


@pytest.mark.parametrize("arch", NUMERIC_ARCHS)
def test_block_plan_step_equals_plain_step(arch: str) -> None:
    model = tiny_model(arch, dropout=0.1, num_layers=LAYERS)
    assert getattr(model.config.get_text_config(), "use_cache", True) is not False
    batch = tiny_batch(arch, model.config)  # right-padded, with an attention mask
    expected = loss_and_grads(copy.deepcopy(model), batch)
    plan = mixed_plan(model)
    report = install_checkpoint_hooks(model, "blocks", block_plan=plan)
    assert set(report.hooked) == expected_hooked(model, plan) and report.count >= 3
    assert_same_step(expected, loss_and_grads(model, batch))


@pytest.mark.parametrize("arch", ("llama", "qwen2_moe", "t5", "bart", "llava"))
def test_each_planned_region_is_recomputed_exactly_once(arch: str) -> None:
    model = tiny_model(arch, dropout=0.1, num_layers=LAYERS)
    batch = tiny_batch(arch, model.config)
    plain = forward_counts(copy.deepcopy(model), batch)
    report = install_checkpoint_hooks(model, "blocks", block_plan=mixed_plan(model))
    hooked = forward_counts(model, batch)
    extra = {name: hooked[name] - plain[name] for name in hooked if hooked[name] != plain[name]}
    assert extra == dict.fromkeys(_descendants(report.hooked, list(plain)), 1)


@pytest.mark.parametrize("arch", ("llama", "t5", "llava"))
def test_a_plan_equal_to_every_n_layers_recomputes_what_hf_does(arch: str) -> None:
    model = tiny_model(arch, dropout=0.1, num_layers=LAYERS)
    batch = tiny_batch(arch, model.config)
    _, total = counted_blocks(model, find_blocks(model))
    plan = BlockPlan(total, every_n_set(total, 3), (), every_n_layers=3)
    native = _hf(model, 3)
    install_checkpoint_hooks(model, "blocks", block_plan=plan)
    assert forward_counts(model, batch) == forward_counts(native, batch)
    assert total_flops(model, batch) == total_flops(native, batch)


@pytest.mark.parametrize("arch", ("llama", "gemma2", "gpt2", "bert", "t5", "falcon"))
def test_the_planners_block_counter_is_hfs(arch: str) -> None:
    model = tiny_model(arch, num_layers=LAYERS)
    _, total = counted_blocks(model, find_blocks(model))
    assert hf_blocks(arch_of(model.config)) == total


def test_the_planners_block_counter_counts_a_vision_tower_first() -> None:
    from ckpt_core._configs.model_config import build_meta_model, load_model_config

    config = load_model_config({"preset": "gemma-3-4b"})
    model = build_meta_model(config)
    counted, total = counted_blocks(model, find_blocks(model))
    arch = arch_of(model.config)
    assert hf_blocks(arch) == total
    first_text = block_layout(arch)[0][0]
    assert first_text == arch.vision.layers > 0
    assert "vision" not in counted[first_text][1] and "vision" in counted[first_text - 1][1]


def _counts(arch: Any, plan: BlockPlan) -> tuple:
    counts: dict = {}
    for counter, _, _, kind in block_layout(arch):
        mode = "selective" if counter in plan.selective else "off"
        mode = "full" if counter in plan.full else mode
        counts[(mode, kind)] = counts.get((mode, kind), 0) + 1
    return tuple(counts.items())


@pytest.mark.parametrize(("arch", "dropout"), [("llama", 0.0), ("gemma2", 0.0), ("gpt2", 0.1)])
def test_block_plan_flops_ratio_matches_flop_counter(arch: str, dropout: float) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    from ckpt_core import remove_checkpoint_hooks

    model = tiny_model(arch, attn_implementation="eager", dropout=dropout, num_layers=LAYERS)
    ids = torch.randint(3, 90, (2, 32), generator=torch.Generator().manual_seed(0))

    def flops(plan: BlockPlan | None) -> int:
        if plan is not None:
            install_checkpoint_hooks(model, "blocks", block_plan=plan)
        with FlopCounterMode(display=False) as counter:
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        remove_checkpoint_hooks(model)
        model.zero_grad(set_to_none=True)
        return counter.get_total_flops()

    base = flops(None)
    step = Step(batch=2, seq=32, dtype_bytes=4, attention="eager")
    arch_facts = arch_of(model.config)
    for plan in (mixed_plan(model), BlockPlan(LAYERS, (1, 2), (0,)), BlockPlan(LAYERS, (3,))):
        expected = recompute_ratio(arch_facts, step, _counts(arch_facts, plan))
        assert expected == pytest.approx(flops(plan) / base, rel=0.02), plan


@pytest.mark.parametrize("preset", ["llama-3.2-1b", "gemma-3-1b", "t5-base"])
def test_block_plan_activation_bytes_match_the_meta_measurement(preset: str) -> None:
    from ckpt_core._configs.model_config import build_meta_model, load_model_config
    from ckpt_core._memory.inputs import model_facts, parse_workload, prepare
    from ckpt_core._meta.measure import measure_activation_bytes

    model = build_meta_model(load_model_config({"preset": preset}), attention="sdpa")
    run = prepare(model_facts({"preset": preset}), parse_workload({"seq_len": 512}))
    arch = run.facts.arch
    total = hf_blocks(arch)
    first = block_layout(arch)[0][0]
    plan = BlockPlan(total, (first, first + 2, total - 1), (first + 1, first + 3))
    measured = measure_activation_bytes(
        model, "blocks", block_plan=plan, seq_len=512, micro_batch_size=1
    )
    estimated = activation_bytes(arch, run.step, _counts(arch, plan))
    assert estimated == pytest.approx(measured, rel=0.02)


def test_a_plan_for_another_model_is_refused() -> None:
    model = tiny_model("llama", num_layers=LAYERS)
    with pytest.raises(InvalidGranularityError, match="5 blocks") as caught:
        install_checkpoint_hooks(model, "blocks", block_plan=BlockPlan(5, (0,)))
    assert caught.value.field == "block_plan.blocks"
    with pytest.raises(InvalidGranularityError):
        install_checkpoint_hooks(model, "blocks")
    with pytest.raises(InvalidGranularityError):
        install_checkpoint_hooks(model, "full", block_plan=BlockPlan(LAYERS, (0,)))


# --- through the HF Trainer and TRL ----------------------------------------------


def block_level_plan(plan: BlockPlan, version: str) -> Plan:
    """The Plan make_plan answers for this block plan on this transformers version."""
    settings = trainer_settings("blocks", parse_transformers_version(version), plan)
    return Plan(
        tier="auto",
        granularity="blocks",
        training_arguments=settings.training_arguments,
        hooks=settings.hooks,
        description="a block-level plan",
        reason="test",
        transformers_version=version,
        block_plan=plan.to_dict(),
    )


TRAINER_PLANS = [
    (BlockPlan(3, (0,), (2,)), "5.24.0"),  # mixed: HF off, blocks hooks
    (BlockPlan(3, (0,), (), every_n_layers=3), "5.24.0"),  # HF's every_n_layers=3
    (BlockPlan(3, (0,), (), every_n_layers=3), "5.15.0"),  # the same by hooks
]
TRAINER_IDS = ["mixed-hooks", "every-3-hf", "every-3-hooks"]


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("block_plan_trainer_out")


@pytest.mark.parametrize(("block_plan", "version"), TRAINER_PLANS, ids=TRAINER_IDS)
def test_trainer_block_plan_trains_like_no_checkpointing(
    block_plan: BlockPlan, version: str, out_dir: Path
) -> None:
    from tests.test_trainer_integration import (
        _baseline,
        assert_plan_applied,
        assert_same_training,
        train_hf,
    )

    plan = block_level_plan(block_plan, version)
    run = train_hf("llama", plan, out_dir)
    assert_same_training(run, _baseline("hf", "llama", out_dir))
    assert_plan_applied(run, plan)
    if plan.hooks is not None:
        wanted = {"model.layers.0"} | (
            {"model.layers.2.self_attn"} if block_plan.selective else set()
        )
        assert set(run.callback.report.hooked) == wanted


@pytest.mark.parametrize(("block_plan", "version"), TRAINER_PLANS[:2], ids=TRAINER_IDS[:2])
def test_trl_sft_block_plan_trains_like_no_checkpointing(
    block_plan: BlockPlan, version: str, out_dir: Path
) -> None:
    from tests.test_trainer_integration import (
        _baseline,
        assert_plan_applied,
        assert_same_training,
        train_trl,
    )

    plan = block_level_plan(block_plan, version)
    run = train_trl(plan, out_dir, peft=True)
    assert type(run.trained_model).__name__ == "PeftModel"
    assert_same_training(run, _baseline("trl-peft", "llama", out_dir))
    assert_plan_applied(run, plan)
