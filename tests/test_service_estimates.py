"""Estimates with a model run in their own worker pool: the event loop keeps answering.

An estimate replays a training step through the allocator model (tenths of a
second to seconds of pure Python): in the server's threads it held the GIL
against every other request.  In the pool, a full queue is a 429, a job past
its time limit a 504, and requests without a model never wait for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from fastapi.testclient import TestClient

from tests.conftest import TINY_CONFIG, metric, service_client

# Nothing fits: the alternatives are searched, seconds of replays in a fresh worker.
SLOW_ESTIMATE = {
    "tier": "auto",
    "gpu": "RTX 4090",
    "model": {"preset": "llama-3.1-8b"},
    "workload": {"seq_len": 8192, "method": "full"},
}
TINY_ESTIMATE = {"tier": "auto", "gpu": "A100-80GB", "model": {"config": TINY_CONFIG}}


def _busy(api: TestClient) -> bool:
    return metric(api, "ckpt_estimate_workers_busy") >= 1


def _wait_until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_a_busy_estimate_pool_answers_429_while_other_requests_answer() -> None:
    with service_client(estimate_queue=0) as api:
        results: list[Any] = []
        thread = threading.Thread(
            target=lambda: results.append(api.post("/resolve", json=SLOW_ESTIMATE))
        )
        thread.start()
        _wait_until(lambda: _busy(api))
        busy = api.post("/resolve", json={**TINY_ESTIMATE, "workload": {"seq_len": 64}})
        plain = api.post("/resolve", json={"tier": "auto", "gpu": "H200"})
        health = api.get("/healthz")
        still_busy = _busy(api)
        thread.join()
    assert still_busy, "the slow estimate ended before the checks: make SLOW_ESTIMATE slower"
    assert busy.status_code == 429, busy.text
    assert busy.json()["error"] == "estimate_busy"
    assert int(busy.headers["Retry-After"]) >= 1
    assert plain.status_code == 200 and plain.json()["granularity"] == "selective"
    assert health.status_code == 200
    assert results[0].status_code == 200, results[0].text
    assert results[0].json()["estimate"]["alternatives"]  # nothing fits: it searched


def test_an_estimate_over_the_time_limit_is_a_504_and_the_pool_recovers() -> None:
    with service_client(estimate_timeout_s=0.2) as api:
        slow = api.post("/resolve", json=SLOW_ESTIMATE)
        assert slow.status_code == 504, slow.text
        assert slow.json()["error"] == "estimate_timeout"
        assert api.post("/resolve", json={"tier": "full"}).status_code == 200
        # The killed worker is replaced: a small estimate succeeds again.
        tiny = {**TINY_ESTIMATE, "workload": {"seq_len": 96}}
        _wait_until(lambda: api.post("/resolve", json=tiny).status_code == 200)
        assert metric(api, "ckpt_estimate_duration_seconds_count", outcome="timeout") == 1
        assert api.get("/readyz").status_code == 200
