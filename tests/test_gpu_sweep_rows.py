"""The estimate against this project's own GPU rows (``bench/data``, recorded by bench.gpu_sweep).

Every tier (off, selective, medium, full) on three families at two sequence
lengths, measured on an H200: the tiers other than full, which no public
measurement covers and which are what this tool decides.
"""

from __future__ import annotations

import pytest

from bench import gpu_truth
from bench._gpu_rows import LOCAL_ROWS, gpu_of, load_rows, tier_of
from ckpt_core._memory.context import DEFAULT_CONTEXT_BYTES, MEASURED, context_bytes

MIB = 1 << 20


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return load_rows([LOCAL_ROWS])


@pytest.fixture(scope="module")
def scores(rows: list[dict]) -> list[gpu_truth.Score]:
    return gpu_truth.score(rows)


def test_every_tier_of_three_families_at_two_lengths(rows: list[dict]) -> None:
    cells = {(row["run"]["model_type"], row["run"]["seq_len"], tier_of(row)) for row in rows}
    assert len(cells) == len(rows) == 24
    assert {tier for _, _, tier in cells} == {"off", "selective", "medium", "full"}
    assert len({family for family, _, _ in cells}) == 3


def test_the_cuda_context_is_the_one_measured_on_that_gpu(rows: list[dict]) -> None:
    """The context table holds what the rows measured; unmeasured GPUs get more than any."""
    for row in rows:
        gpu = gpu_of(row)
        assert gpu in MEASURED
        assert context_bytes(gpu)[0] == int(row["measured"]["cuda_context_mib"] * MIB)
    assert max(measured for measured, _ in MEASURED.values()) <= DEFAULT_CONTEXT_BYTES


def test_allocated_peak_within_5_percent_on_every_tier(scores: list[gpu_truth.Score]) -> None:
    worst = max((item.allocated_error for item in scores), key=abs)
    assert abs(worst) <= gpu_truth.TARGETS["allocated_worst"]


def test_the_rows_were_loaded_with_a_device_map(rows: list[dict]) -> None:
    """bench/gpu_step loads through from_pretrained(device_map=...), and the rows say so."""
    assert {row["run"]["load_path"] for row in rows} == {"device_map"}


def test_process_memory_within_1_percent_on_every_tier(scores: list[gpu_truth.Score]) -> None:
    """The device-map load's warm-up block is in the replay: every row within 1%."""
    worst = max((item.process_error for item in scores), key=abs)
    assert abs(worst) <= 1.0


def test_boundary_verdicts_are_never_dangerous(rows: list[dict]) -> None:
    """Budgets 2-10% either side of each step's real process memory: never a wrong "fits"."""
    verdicts = gpu_truth.boundary(rows, None)
    assert verdicts["cases"] == len(rows) * len(gpu_truth.OFFSETS)
    assert verdicts["dangerous"] == 0
