"""The `slow` marker: integration tests, left out of the quick loop by ``-m "not slow"``.

Loaded as a plugin (``-p tests._markers`` in pyproject's addopts) so the list
of integration tests lives in one place.  Slow means a real server or
subprocess, a pip install, a Trainer run, fuzzing or a soak, or a comparison
against the meta device over many presets; the quick loop keeps every unit
test of the same code.
"""

from __future__ import annotations

from typing import Final

import pytest

# Whole modules that are integration tests.
SLOW_MODULES: Final = frozenset(
    {
        "test_transformers_compat",
        "test_trainer_integration",
        "test_fuzz",
        "test_soak",
        "test_shutdown",
        "test_service_uvicorn",
        "test_hostile",
        "test_distributed_gloo",
        "test_install_worker",
    }
)

# Tests of other modules that measure on the meta device across many presets.
SLOW_TESTS: Final = frozenset(
    {
        "test_estimate_matches_meta_measurement",
        "test_estimate_matches_other_attention_dtype_batch",
        "test_recompute_flops_ratio_matches_flop_counter",
        "test_peak_without_allowance_matches_mem_tracker_on_meta",
        "test_recompute_matches_hf_native_checkpointing",
    }
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: integration test, skipped by the quick loop (pytest -m 'not slow')"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = item.module.__name__.rpartition(".")[2] if item.module else ""
        if module in SLOW_MODULES or item.originalname in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
