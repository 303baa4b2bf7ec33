"""Service test fixtures: apps with small worker pools, warmed once per test module.

A pool's warm-up costs seconds (the first one starts the forkserver, which
imports torch and transformers), so each module shares one app through the
`api` fixture; tests that need other limits build their own with
`service_client`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings

READY_TIMEOUT_S = 120.0

# A small inline config (a 2-layer Llama): validates and builds in milliseconds.
TINY_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 128,
}

# Within the default bounds but slow to build on meta: 512 layers take about
# a second here (measured), long enough to hold a worker busy.
SLOW_CONFIG: dict[str, Any] = {**TINY_CONFIG, "num_hidden_layers": 512, "hidden_size": 64}


def wait_ready(api: TestClient, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Poll /readyz until 200; fail with its last answer after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = api.get("/readyz")
        if response.status_code == 200:
            return
        assert time.monotonic() < deadline, f"not ready after {timeout_s} s: {response.text}"
        time.sleep(0.05)


@contextmanager
def service_client(**settings: Any) -> Iterator[TestClient]:
    """A TestClient on a fresh app with these settings, its workers warm."""
    app = create_app(Settings(**{"dry_run_workers": 1, **settings}))
    with TestClient(app, raise_server_exceptions=True) as api:
        wait_ready(api)
        yield api


@pytest.fixture(scope="module")
def api() -> Iterator[TestClient]:
    """One warm app per test module: one worker, default limits otherwise."""
    with service_client() as test_client:
        yield test_client


def metric(api: TestClient, name: str, **labels: str) -> float:
    """The current value of one Prometheus sample (0.0 when it has not been recorded)."""
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    prefix = f"{name}{{{wanted}}} " if labels else f"{name} "
    for line in api.get("/metrics").text.splitlines():
        if _sorted_labels(line).startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _sorted_labels(line: str) -> str:
    """Prometheus writes labels in declaration order; sort them to compare."""
    if "{" not in line:
        return line
    name, rest = line.split("{", 1)
    labels, value = rest.split("} ", 1)
    return f"{name}{{{','.join(sorted(labels.split(',')))}}} {value}"
