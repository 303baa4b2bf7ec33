"""The replayed step through the caching allocator (`ckpt_core._memory.step_trace`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ckpt_core._memory.allocator import MIB
from ckpt_core._memory.inputs import model_facts, parse_workload, prepare
from ckpt_core._memory.step_trace import simulate
from ckpt_core._memory.workspace import EARLIER, HOPPER_AND_LATER, blas_workspace_bytes

LORA = {"method": "lora", "lora_rank": 32, "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}


def reserve_gap(
    preset: str, tier: str, gpu: str | None = None, workspace: int | None = None, **workload: Any
) -> int:
    """Replayed peak reserved minus peak allocated, in bytes."""
    run = prepare(model_facts({"preset": preset}), parse_workload({**LORA, **workload}), gpu)
    trace = run.recipe.trace
    assert trace is not None
    if workspace is not None:
        trace = dataclasses.replace(trace, blas_workspace=workspace)
    allocated, reserved = simulate(run.facts.arch, tier, trace)
    return reserved - allocated


def test_the_measured_step_reuses_the_warm_up_steps_pool() -> None:
    """llama-3.2-1b LoRA s2048 off on an H200 reserved 1148 MiB above its allocated peak:
    the measured step best-fits into the warm-up's cached segments, its bf16 logits
    split a freed fp32-logits segment and the loss backward reserves one more (1002 MiB).
    A first step alone (an empty pool) reserves 106 MiB above."""
    gap = reserve_gap("llama-3.2-1b", "off", gpu="H200", seq_len=2048)
    fp32_logits = 2048 * 128256 * 4
    assert fp32_logits < gap < fp32_logits + 200 * MIB


def test_a_warm_up_leaves_the_other_tiers_gap_small() -> None:
    """The same model checkpointed: measured gaps 91-169 MiB, no extra logits segment."""
    for tier in ("medium", "full"):
        assert reserve_gap("llama-3.2-1b", tier, gpu="H200", seq_len=2048) < 300 * MIB


def test_blas_workspace_sizes_are_pytorchs_defaults() -> None:
    """CublasHandlePool.cpp: :4096:8 from compute capability 9 on, :4096:2:16:8 before."""
    assert blas_workspace_bytes("H200") == HOPPER_AND_LATER == 32 * MIB
    assert blas_workspace_bytes("T4") == blas_workspace_bytes(None) == EARLIER
    assert EARLIER == 8 * MIB + 128 * 1024


def test_autograd_threads_workspace_strands_a_freed_logits_segment() -> None:
    """gemma-3-1b LoRA s2048 on an H200 reserved 2132-2302 MiB above its allocated peak in
    every tier (fp32 logits: 2048 MiB).  The backward's first matmul (the LM head's) makes
    the autograd thread's 32 MiB cuBLAS workspace while the freed fp32 logits blocks are
    the only free ones that fit: it lands in one for good, and every later step's loss
    reserves one more logits-sized segment.  Without the workspace the replay misses it."""
    fp32_logits = 2048 * 262144 * 4
    for tier in ("off", "full"):
        assert reserve_gap("gemma-3-1b", tier, gpu="H200", seq_len=2048) > fp32_logits
        assert reserve_gap("gemma-3-1b", tier, "H200", 0, seq_len=2048) < 300 * MIB


def test_gemma3_selective_strands_one_more_fp32_logits_segment_at_8192() -> None:
    """gemma-3-1b LoRA s8192 on an H200: selective reserved 8458 MiB above its allocated
    peak (one more fp32-logits segment: 8192 x 262144 x 4 B = 8 GiB), off / medium / full
    201-486 MiB.  Replayed as Gemma 3's own layers (sandwich and q / k norms, the sliding
    layers' sdpa masks), selective's pool leaves no freed block the measured step's loss
    can take the fp32 logits from; a Llama block at Gemma's sizes left one (295 MiB)."""
    fp32_logits = 8192 * 262144 * 4
    assert reserve_gap("gemma-3-1b", "selective", gpu="H200", seq_len=8192) > fp32_logits
    for tier in ("off", "medium", "full"):
        assert reserve_gap("gemma-3-1b", tier, gpu="H200", seq_len=8192) < fp32_logits // 8
