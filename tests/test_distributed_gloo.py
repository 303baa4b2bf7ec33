"""A real torch.distributed job (gloo, 127.0.0.1, 2 and 4 ranks): DDP and FSDP2 with AdamW.

Per rank, the bytes of the local parameters, gradients and optimizer states
equal the estimate's per-GPU figures; the global loss of one step, and of the
forward after it, equals the single-process run, with the plan's hooks
installed on the blocks before ``fully_shard`` (and after it, where the
Trainer's callback installs them).
"""

from __future__ import annotations

import functools
import sys

import pytest

from tests import _gloo_job

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the job forks its ranks (Linux)"
)

CASES = [  # (strategy, sharding, tier whose plan gives the hooks)
    ("ddp", "none", "selective"),
    ("fsdp2", "zero3", "medium"),
    ("fsdp2", "zero3", "selective"),
    ("fsdp2_late", "zero3", "medium"),
]


@functools.cache
def reference() -> list[float]:
    return _gloo_job.single_process(None)


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize(("strategy", "sharding", "tier"), CASES)
def test_gloo_job_matches_the_estimate_and_the_single_process_loss(
    world_size: int, strategy: str, sharding: str, tier: str
) -> None:
    plan = _gloo_job.plan_for(tier, world_size, sharding)
    assert plan.hooks == tier  # FSDP2: medium is hooks too (fsdp_config cannot say it)
    ranks = _gloo_job.run_job(world_size, strategy, plan.hooks)
    assumptions = plan.estimate["assumptions"]
    expected = {
        "weights": assumptions["weights_bytes"],
        "gradients": assumptions["gradients_bytes"],
        "optimizer": assumptions["optimizer_bytes"],
    }
    for rank in ranks:
        assert {key: rank[key] for key in expected} == expected
        assert rank["losses"] == pytest.approx(reference(), rel=1e-5)
    if strategy.startswith("fsdp2"):
        assert expected["weights"] * world_size == assumptions["weights_total_bytes"]
    else:
        assert expected["weights"] == assumptions["weights_total_bytes"]


def test_the_hooks_change_nothing_in_the_single_process_run() -> None:
    assert _gloo_job.single_process("medium") == pytest.approx(reference(), rel=1e-6)
