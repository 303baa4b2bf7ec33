"""The service's speed-ups keep its answers: cached plan answers, metrics children, frozen heap.

Speed itself is measured by ``bench/http_load.py``; these tests check that what
was made fast is still right.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
from collections.abc import Iterator
from unittest import mock

import pytest
from fastapi.testclient import TestClient

import ckpt_core
from service import plans, worker
from service.metrics import Metrics
from service.pool import CpuPriority, WorkerPool
from tests.conftest import TINY_CONFIG, metric, service_client


def test_resolve_answers_are_made_once_per_distinct_request(api: TestClient) -> None:
    body = {"tier": "medium", "gpu_memory_gb": 33.25, "transformers_version": "5.20.0"}
    with mock.patch.object(plans, "make_plan", wraps=ckpt_core.make_plan) as make_plan:
        answers = [api.post("/resolve", json=body) for _ in range(3)]
        other = api.post("/resolve", json={**body, "gpu_memory_gb": 33.5})
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert answers[0].content == answers[1].content == answers[2].content
    assert answers[0].headers["content-type"] == "application/json"
    expected = ckpt_core.make_plan("medium", 33.25, transformers_version="5.20.0").to_dict()
    assert answers[0].json() == expected
    assert other.json()["gpu_memory_gb"] == 33.5
    assert make_plan.call_count == 2  # once per distinct body


def test_cache_keys_keep_json_types_apart(api: TestClient) -> None:
    """``true`` is full; ``1`` (equal to True in Python) is no tier at all."""
    assert api.post("/resolve", json={"tier": True}).json()["granularity"] == "full"
    one = api.post("/resolve", json={"tier": 1})
    assert one.status_code == 422, one.text
    assert one.json()["field"] == "tier"
    assert api.post("/resolve", json={"tier": "full", "gpu_memory_gb": 40}).status_code == 200
    as_float = api.post("/resolve", json={"tier": "full", "gpu_memory_gb": 40.0})
    assert as_float.json()["gpu_memory_gb"] == 40.0


def test_unhashable_values_get_ckpt_core_errors_not_a_crash(api: TestClient) -> None:
    for body, field in (
        ({"tier": ["full"]}, "tier"),
        ({"tier": "full", "gpu_memory_gb": {"GiB": 40}}, "gpu_memory_gb"),
        ({"tier": "full", "gpu": ["A100-80GB"]}, "gpu"),
    ):
        response = api.post("/resolve", json=body)
        assert response.status_code == 422, response.text
        assert response.json()["field"] == field


def test_bad_input_is_never_cached(api: TestClient) -> None:
    for _ in range(2):
        response = api.post("/resolve", json={"tier": "fulll"})
        assert response.status_code == 422
        assert response.json()["error"] == "invalid_tier"


MODEL_BODY: dict[str, object] = {
    "tier": "auto",
    "gpu": "A100-80GB",
    "model": {"preset": "llama-3.2-1b"},
    "workload": {"seq_len": 1024, "micro_batch_size": 1},
}


def _estimates_run(api: TestClient) -> float:
    """Estimates the pool has run to completion (cache hits never reach it)."""
    return metric(api, "ckpt_estimate_duration_seconds_count", outcome="ok")


def test_model_answers_are_kept_by_canonical_body(api: TestClient) -> None:
    reordered = dict(reversed(list(MODEL_BODY.items())))
    longer = {**MODEL_BODY, "workload": {"seq_len": 2048, "micro_batch_size": 1}}
    before = _estimates_run(api)
    first = api.post("/resolve", json=MODEL_BODY)
    again = api.post("/resolve", json=reordered)
    other = api.post("/resolve", json=longer)
    assert first.status_code == again.status_code == other.status_code == 200
    assert first.content == again.content
    assert first.json()["estimate"]["assumptions"]["workload"]["seq_len"] == 1024
    assert other.json()["estimate"]["assumptions"]["workload"]["seq_len"] == 2048
    assert _estimates_run(api) == before + 2  # the reordered body was a hit


def test_large_model_bodies_are_answered_but_not_kept(api: TestClient) -> None:
    config = {**TINY_CONFIG, "_name_or_path": "x" * plans.MAX_MODEL_KEY_CHARS}
    body = {"tier": "full", "model": {"config": config}, "workload": {"seq_len": 64}}
    before = _estimates_run(api)
    answers = [api.post("/resolve", json=body) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 200], answers[0].text
    assert _estimates_run(api) == before + 2


def test_model_answers_are_the_libraries_answers(api: TestClient) -> None:
    model = {"config": {**TINY_CONFIG, "num_hidden_layers": 5}}
    for seq_len in (96, 160):
        workload = {"seq_len": seq_len}
        body = {"tier": "auto", "gpu": "A100-80GB", "model": model, "workload": workload}
        answer = api.post("/resolve", json=body)
        assert answer.status_code == 200, answer.text
        fresh = ckpt_core.make_plan("auto", gpu="A100-80GB", model=model, workload=workload)
        assert answer.json() == json.loads(json.dumps(fresh.to_dict()))


@pytest.fixture
def counted_validation() -> Iterator[mock.MagicMock]:
    """`load_model_config` as the estimate job calls it, counted, on an empty model cache."""
    worker._models.clear()
    with mock.patch.object(worker, "load_model_config", wraps=worker.load_model_config) as load:
        yield load
    worker._models.clear()


def _plan_job(model: dict[str, object], **workload: object) -> dict[str, object]:
    request = {
        "tier": "auto",
        "gpu_memory_gb": None,
        "gpu": "A100-80GB",
        "transformers_version": None,
        "workload": dict(workload),
        "model": model,
        "limits": ckpt_core.ConfigLimits(),
    }
    return worker.plan_job(request)


def test_a_model_asked_again_with_new_workloads_is_validated_once(
    counted_validation: mock.MagicMock,
) -> None:
    model = {"config": {**TINY_CONFIG, "num_hidden_layers": 5}}
    answers = [_plan_job(model, seq_len=n) for n in (96, 160, 224)]
    assert counted_validation.call_count == 1
    for seq_len, answer in zip((96, 160, 224), answers, strict=True):
        fresh = ckpt_core.make_plan(
            "auto", gpu="A100-80GB", model=model, workload={"seq_len": seq_len}
        )
        assert answer == {"result": fresh.to_dict()}


def test_a_preset_and_its_inline_config_keep_their_own_validated_model(
    counted_validation: mock.MagicMock,
) -> None:
    preset = {"preset": "llama-3.2-1b"}
    inline = {"config": ckpt_core.load_preset("llama-3.2-1b")}
    for model in (preset, inline):
        assert "result" in _plan_job(model, seq_len=64)
    assert [c.args[0] for c in counted_validation.call_args_list] == [preset, inline]


def test_an_invalid_model_is_never_kept(counted_validation: mock.MagicMock) -> None:
    model = {"config": {**TINY_CONFIG, "hidden_size": 33}}  # heads do not divide it
    for seq_len in (64, 128):
        answer = _plan_job(model, seq_len=seq_len)
        assert isinstance(answer["error"], ckpt_core.CkptError)
        assert answer["error"].field == "model.config"
    assert counted_validation.call_count == 2


def test_an_invalid_model_is_a_422_from_the_estimate_pool(api: TestClient) -> None:
    model = {"config": {**TINY_CONFIG, "hidden_size": 33}}
    response = api.post(
        "/resolve", json={"tier": "full", "model": model, "workload": {"seq_len": 64}}
    )
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "model.config"


def test_describe_answers_json_and_text_from_one_plan(api: TestClient) -> None:
    params = {"tier": "auto", "gpu_memory_gb": 47.5}
    description = ckpt_core.describe_tier("auto", 47.5)
    with mock.patch.object(plans, "make_plan", wraps=ckpt_core.make_plan) as make_plan:
        as_json = api.get("/describe", params=params)
        as_text = api.get("/describe", params=params, headers={"accept": "text/plain"})
    assert as_json.json() == {"tier": "auto", "granularity": "medium", "description": description}
    assert as_json.headers["content-type"] == "application/json"
    assert as_text.text == description
    assert as_text.headers["content-type"].startswith("text/plain")
    assert make_plan.call_count == 1


def test_request_metrics_count_every_answer_by_labels() -> None:
    metrics = Metrics()
    for status in (200, 200, 422):
        metrics.observe_request("POST", "/resolve", status, 0.002)
    text = metrics.render()[0].decode()
    assert 'ckpt_http_requests_total{method="POST",route="/resolve",status="200"} 2.0' in text
    assert 'ckpt_http_requests_total{method="POST",route="/resolve",status="422"} 1.0' in text
    count = 'ckpt_http_request_duration_seconds_count{method="POST",route="/resolve",status="200"}'
    assert f"{count} 2.0" in text


def test_label_children_are_cached_and_exposed_as_prometheus_client_writes_them() -> None:
    metrics = Metrics()
    metrics.observe_request("GET", "/describe", 200, 12.5)  # past the last bucket
    metrics.observe_request("GET", "/describe", 200, 0.0005)  # on a bucket bound
    text = metrics.render()[0].decode()
    assert 'le="0.0005",method="GET",route="/describe",status="200"} 1.0' in text
    assert 'le="+Inf",method="GET",route="/describe",status="200"} 2.0' in text
    assert "_created" not in text


def test_heap_is_frozen_while_the_service_runs_and_released_after() -> None:
    with service_client() as client:
        assert client.get("/readyz").status_code == 200
        assert gc.get_freeze_count() > 0
        # garbage made after the freeze is still collected
        cycle: list[object] = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1
        assert metric(client, "ckpt_dry_run_workers_busy") == 0.0
    assert gc.get_freeze_count() == 0


def _own_priority(_: object) -> tuple[int, int]:
    return os.nice(0), os.sched_getscheduler(0)


def _no_warm_up() -> None:
    return None


def test_pool_workers_run_at_the_given_cpu_priority() -> None:
    priorities: tuple[CpuPriority, ...] = ("normal", "low", "idle")

    async def priority_of_workers() -> list[tuple[int, int]]:
        pools = [
            WorkerPool(
                name="priority-test",
                job=_own_priority,
                warm_up=_no_warm_up,
                size=1,
                queue_limit=0,
                timeout_s=30,
                cpu_priority=priority,
            )
            for priority in priorities
        ]
        try:
            await asyncio.gather(*(pool.start() for pool in pools))
            return [await pool.run(None) for pool in pools]
        finally:
            await asyncio.gather(*(pool.close() for pool in pools))

    normal, low, idle = asyncio.run(priority_of_workers())
    assert normal == (os.nice(0), os.sched_getscheduler(0))
    assert low == (min(normal[0] + 10, 19), os.SCHED_OTHER)
    assert idle[1] == os.SCHED_IDLE
