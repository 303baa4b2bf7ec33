"""POST /dry-run: reports, cache, bounds before the pool, saturation, time limit, crashes."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

import ckpt_core
from ckpt_core._dry_run import dry_run
from tests.conftest import SLOW_CONFIG, TINY_CONFIG, metric, service_client


def _in_background(call: Callable[[], httpx.Response]) -> tuple[threading.Thread, list[Any]]:
    """Run `call` in a thread; its response lands in the returned list."""
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(call()))
    thread.start()
    return thread, results


def _wait_until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def _worker_pids() -> set[int]:
    """Live dry-run worker processes of this test process."""
    return {p.pid for p in multiprocessing.active_children() if p.name == "ckpt-dry-run" and p.pid}


def _busy(api: TestClient) -> bool:
    return metric(api, "ckpt_dry_run_workers_busy") >= 1


def test_dry_run_reports_what_ckpt_core_reports(api: TestClient) -> None:
    body = {"model": {"preset": "llama-3.2-1b"}, "tier": "selective"}
    response = api.post("/dry-run", json=body)
    assert response.status_code == 200, response.text
    report = response.json()
    expected = dry_run({"preset": "llama-3.2-1b"}, "selective").to_dict()
    assert {k: v for k, v in report.items() if k != "elapsed_ms"} == {
        k: v for k, v in expected.items() if k != "elapsed_ms"
    }
    assert report["hooked"] == report["blocks"] == 16
    assert all(name.endswith("self_attn") for name in report["modules"])
    assert report["native"] is False


def test_native_full_tier_on_an_inline_config(api: TestClient) -> None:
    body = {"model": {"config": TINY_CONFIG}, "tier": "full", "gpu": "A100-80GB"}
    report = api.post("/dry-run", json=body).json()
    assert report["granularity"] == "full" and report["native"] is True
    assert report["blocks"] == report["hooked"] == TINY_CONFIG["num_hidden_layers"]


def test_a_repeated_request_is_served_from_the_cache(api: TestClient) -> None:
    config = {**TINY_CONFIG, "num_hidden_layers": 3}
    hits = metric(api, "ckpt_dry_run_cache_total", result="hit")
    runs = metric(api, "ckpt_dry_run_duration_seconds_count", outcome="ok")
    first = api.post("/dry-run", json={"model": {"config": config}, "tier": "medium"})
    # Same config with its keys in another order: the same canonical key.
    reordered = dict(reversed(list(config.items())))
    second = api.post("/dry-run", json={"model": {"config": reordered}, "tier": "medium"})
    assert first.headers["X-Cache"] == "miss" and second.headers["X-Cache"] == "hit"
    assert first.json() == second.json()
    assert metric(api, "ckpt_dry_run_cache_total", result="hit") == hits + 1
    assert metric(api, "ckpt_dry_run_duration_seconds_count", outcome="ok") == runs + 1
    other_tier = api.post("/dry-run", json={"model": {"config": config}, "tier": "full"})
    assert other_tier.headers["X-Cache"] == "miss"


@pytest.mark.parametrize(
    ("model", "extra", "code", "field"),
    [
        ({"preset": "gpt-7"}, {}, "unknown_preset", "model.preset"),
        (
            {"config": {**TINY_CONFIG, "model_type": "nopeformer"}},
            {},
            "invalid_model_config",
            "model.config.model_type",
        ),
        (
            {"config": {**TINY_CONFIG, "num_hidden_layers": 513}},
            {},
            "config_too_large",
            "model.config.num_hidden_layers",
        ),
        (
            {"config": {**TINY_CONFIG, "hidden_size": 1 << 20}},
            {},
            "config_too_large",
            "model.config.hidden_size",
        ),
        (
            {"config": {**TINY_CONFIG, "auto_map": {"AutoModel": "evil.Model"}}},
            {},
            "invalid_model_config",
            "model.config.auto_map",
        ),
        (  # was a 409 checkpoint_conflict, whose hint only made sense in Python
            {"config": {**TINY_CONFIG, "gradient_checkpointing": True}},
            {},
            "invalid_model_config",
            "model.config.gradient_checkpointing",
        ),
        ({"config": TINY_CONFIG}, {"tier": "fulll"}, "invalid_tier", "tier"),
        ({"config": TINY_CONFIG}, {"gpu_memory_gb": -2}, "invalid_gpu_memory", "gpu_memory_gb"),
        (
            {"config": TINY_CONFIG},
            {"measure": {"seq_len": 0}},
            "invalid_workload",
            "measure.seq_len",
        ),
        ({"config": TINY_CONFIG}, {"measure": {"steps": 3}}, "invalid_workload", "measure.steps"),
    ],
)
def test_bad_input_is_refused_before_the_pool(
    api: TestClient, model: dict[str, Any], extra: dict[str, Any], code: str, field: str
) -> None:
    lookups = metric(api, "ckpt_dry_run_cache_total", result="miss")
    response = api.post("/dry-run", json={"model": model, "tier": "full", **extra})
    assert response.status_code == 422, response.text
    assert response.json()["error"] == code and response.json()["field"] == field
    # Refused before the cache lookup, so before any worker was involved.
    assert metric(api, "ckpt_dry_run_cache_total", result="miss") == lookups


@pytest.mark.parametrize(
    ("config", "code"),
    [
        # Heads that do not divide the width: only transformers' config class knows.
        ({**TINY_CONFIG, "hidden_size": 100, "num_attention_heads": 3}, "invalid_model_config"),
        # Every size field within its bound, the product (~8.6e12 parameters) over the limit.
        (
            {
                **TINY_CONFIG,
                "hidden_size": 65_536,
                "intermediate_size": 65_536,
                "num_hidden_layers": 512,
                "num_attention_heads": 64,
                "num_key_value_heads": 64,
            },
            "config_too_large",
        ),
    ],
)
def test_what_needs_transformers_is_refused_by_the_worker_before_it_builds(
    api: TestClient, config: dict[str, Any], code: str
) -> None:
    misses = metric(api, "ckpt_dry_run_cache_total", result="miss")
    response = api.post("/dry-run", json={"model": {"config": config}, "tier": "full"})
    assert response.status_code == 422, response.text
    assert response.json()["error"] == code and response.json()["field"] == "model.config"
    # Past the server's checks (a cache lookup), refused in the worker: nothing cached.
    assert metric(api, "ckpt_dry_run_cache_total", result="miss") == misses + 1
    again = api.post("/dry-run", json={"model": {"config": config}, "tier": "full"})
    assert again.status_code == 422
    assert metric(api, "ckpt_dry_run_cache_total", result="miss") == misses + 2


def test_model_is_required(api: TestClient) -> None:
    response = api.post("/dry-run", json={"tier": "full"})
    assert response.status_code == 422
    assert response.json()["field"] == "model"


def test_saturated_pool_answers_429_while_resolve_still_answers() -> None:
    with service_client(dry_run_queue=0) as api:
        slow = {"model": {"config": SLOW_CONFIG}, "tier": "full"}
        thread, results = _in_background(lambda: api.post("/dry-run", json=slow))
        _wait_until(lambda: _busy(api))
        busy = api.post("/dry-run", json={"model": {"config": TINY_CONFIG}, "tier": "full"})
        resolve = api.post("/resolve", json={"tier": "auto", "gpu": "H200"})
        describe = api.get("/describe", params={"tier": "medium"})
        still_busy = _busy(api)
        thread.join()
    assert still_busy, "the slow dry run ended before the checks: make SLOW_CONFIG slower"
    assert busy.status_code == 429, busy.text
    assert busy.json()["error"] == "dry_run_busy"
    assert int(busy.headers["Retry-After"]) >= 1
    assert resolve.status_code == 200 and resolve.json()["granularity"] == "selective"
    assert describe.status_code == 200
    assert results[0].status_code == 200
    assert results[0].json()["blocks"] == SLOW_CONFIG["num_hidden_layers"]


def test_a_dry_run_over_the_time_limit_is_a_504_and_the_service_recovers() -> None:
    with service_client(dry_run_timeout_s=0.2) as api:
        slow = api.post("/dry-run", json={"model": {"config": SLOW_CONFIG}, "tier": "full"})
        assert slow.status_code == 504, slow.text
        assert slow.json()["error"] == "dry_run_timeout"
        assert api.get("/healthz").status_code == 200
        assert api.post("/resolve", json={"tier": "full"}).status_code == 200
        # The killed worker is replaced: a small dry run succeeds again.
        tiny = {"model": {"config": TINY_CONFIG}, "tier": "full"}
        _wait_until(lambda: api.post("/dry-run", json=tiny).status_code == 200)
        assert metric(api, "ckpt_dry_run_duration_seconds_count", outcome="timeout") == 1
        assert api.get("/readyz").status_code == 200


def test_a_worker_that_dies_mid_run_is_a_503_and_is_replaced() -> None:
    others = _worker_pids()
    with service_client() as api:
        slow = {"model": {"config": SLOW_CONFIG}, "tier": "selective"}
        thread, results = _in_background(lambda: api.post("/dry-run", json=slow))
        _wait_until(lambda: _busy(api))
        (pid,) = _worker_pids() - others  # this app's only worker
        os.kill(pid, signal.SIGKILL)
        thread.join()
        assert results[0].status_code == 503, results[0].text
        assert results[0].json()["error"] == "dry_run_worker_crashed"
        tiny = {"model": {"config": TINY_CONFIG}, "tier": "off"}
        _wait_until(lambda: api.post("/dry-run", json=tiny).status_code == 200)


def test_encoder_decoders_measure_as_ckpt_core_measures(api: TestClient) -> None:
    """BART (a mask check on tensor values) and T5 without decoder_start_token_id used to
    answer 422 dry_run_failed."""
    from tests._tiny_models import tiny_config

    t5 = json.loads(tiny_config("t5").to_json_string())
    del t5["decoder_start_token_id"]
    for config in (json.loads(tiny_config("bart").to_json_string()), t5):
        body = {"model": {"config": config}, "tier": "selective", "measure": {"seq_len": 32}}
        response = api.post("/dry-run", json=body)
        assert response.status_code == 200, response.text
        expected = dry_run({"config": config}, "selective", measure={"seq_len": 32}).measured
        assert response.json()["measured"] == expected
        assert expected is not None and expected["activation_bytes"] > 0


def test_report_fields_match_ckpt_core(api: TestClient) -> None:
    report = api.post("/dry-run", json={"model": {"preset": "gpt2"}, "tier": "off"}).json()
    assert report["granularity"] is None and report["hooked"] == 0 and report["modules"] == []
    assert report["blocks"] == 12
    assert report["parameters"] > 100_000_000
    assert ckpt_core.resolve_granularity("off") is None
