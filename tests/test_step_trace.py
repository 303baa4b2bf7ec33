"""The replayed step through the caching allocator (`ckpt_core._memory.step_trace`)."""

from __future__ import annotations

from typing import Any

from ckpt_core._memory.allocator import MIB
from ckpt_core._memory.inputs import model_facts, parse_workload, prepare
from ckpt_core._memory.step_trace import simulate

LORA = {"method": "lora", "lora_rank": 32, "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}


def reserve_gap(preset: str, tier: str, **workload: Any) -> int:
    """Replayed peak reserved minus peak allocated, in bytes."""
    run = prepare(model_facts({"preset": preset}), parse_workload({**LORA, **workload}))
    assert run.recipe.trace is not None
    allocated, reserved = simulate(run.facts.arch, tier, run.recipe.trace)
    return reserved - allocated


def test_the_measured_step_reuses_the_warm_up_steps_pool() -> None:
    """llama-3.2-1b LoRA s2048 off on an H200 reserved 1148 MiB above its allocated peak:
    the measured step best-fits into the warm-up's cached segments, its bf16 logits
    split a freed fp32-logits segment and the loss backward reserves one more (1002 MiB).
    A first step alone (an empty pool) reserves 106 MiB above."""
    gap = reserve_gap("llama-3.2-1b", "off", seq_len=2048)
    fp32_logits = 2048 * 128256 * 4
    assert fp32_logits < gap < fp32_logits + 200 * MIB


def test_a_warm_up_leaves_the_other_tiers_gap_small() -> None:
    """The same model checkpointed: measured gaps 91-169 MiB, no extra logits segment."""
    for tier in ("medium", "full"):
        assert reserve_gap("llama-3.2-1b", tier, seq_len=2048) < 300 * MIB
