"""The service's speed-ups keep its answers: cached plan answers, metrics children, frozen heap.

Speed itself is measured by ``bench/http_load.py``; these tests check that what
was made fast is still right.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
from typing import Annotated
from unittest import mock

import pytest
from fastapi import FastAPI, Query
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

import ckpt_core
from service import jsonbody
from service.cache import LRUCache
from service.metrics import Metrics, RequestStats
from service.pool import CpuPriority, WorkerPool
from service.routes import plans
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


def test_model_answers_are_kept_by_canonical_body(api: TestClient) -> None:
    reordered = dict(reversed(list(MODEL_BODY.items())))
    longer = {**MODEL_BODY, "workload": {"seq_len": 2048, "micro_batch_size": 1}}
    with mock.patch.object(plans, "plan_for", wraps=plans.plan_for) as plan_for:
        first = api.post("/resolve", json=MODEL_BODY)
        again = api.post("/resolve", json=reordered)
        other = api.post("/resolve", json=longer)
    assert first.status_code == again.status_code == other.status_code == 200
    assert first.content == again.content
    assert first.json()["estimate"]["assumptions"]["workload"]["seq_len"] == 1024
    assert other.json()["estimate"]["assumptions"]["workload"]["seq_len"] == 2048
    assert plan_for.call_count == 2  # the reordered body was a hit


def test_large_model_bodies_are_answered_but_not_kept(api: TestClient) -> None:
    config = {**TINY_CONFIG, "_name_or_path": "x" * plans.MAX_MODEL_KEY_CHARS}
    body = {"tier": "full", "model": {"config": config}, "workload": {"seq_len": 64}}
    with mock.patch.object(plans, "plan_for", wraps=plans.plan_for) as plan_for:
        answers = [api.post("/resolve", json=body) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 200], answers[0].text
    assert plan_for.call_count == 2


@pytest.fixture
def fresh_model_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty validated-model cache: other tests' models do not count."""
    monkeypatch.setattr(plans, "_model_configs", LRUCache(plans.MODEL_ANSWER_CACHE_SIZE))


def test_a_model_asked_again_with_new_workloads_is_validated_once(
    api: TestClient, fresh_model_configs: None
) -> None:
    model = {"config": {**TINY_CONFIG, "num_hidden_layers": 5}}
    bodies = [
        {"tier": "auto", "gpu": "A100-80GB", "model": model, "workload": {"seq_len": n}}
        for n in (96, 160, 224)
    ]
    with mock.patch.object(plans, "load_model_config", wraps=plans.load_model_config) as load:
        answers = [api.post("/resolve", json=body) for body in bodies]
    assert [a.status_code for a in answers] == [200, 200, 200], answers[0].text
    assert load.call_count == 1
    # The same answers as a plan computed from scratch.
    for body, answer in zip(bodies, answers, strict=True):
        fresh = ckpt_core.make_plan(
            "auto", gpu="A100-80GB", model=model, workload=body["workload"]
        ).to_dict()
        assert answer.json() == json.loads(json.dumps(fresh))


def test_a_preset_and_its_inline_config_keep_their_own_validated_model(
    api: TestClient, fresh_model_configs: None
) -> None:
    preset = {"preset": "llama-3.2-1b"}
    inline = {"config": ckpt_core.load_preset("llama-3.2-1b")}
    body = {"tier": "auto", "gpu": "A100-80GB", "workload": {"seq_len": 64}}
    with mock.patch.object(plans, "load_model_config", wraps=plans.load_model_config) as load:
        api.post("/resolve", json={**body, "model": preset})
        api.post("/resolve", json={**body, "model": inline})
    assert load.call_count == 2
    assert [c.args[0] for c in load.call_args_list] == [preset, inline]


def test_an_invalid_model_is_never_kept(api: TestClient, fresh_model_configs: None) -> None:
    model = {"config": {**TINY_CONFIG, "hidden_size": 33}}  # heads do not divide it
    with mock.patch.object(plans, "load_model_config", wraps=plans.load_model_config) as load:
        for seq_len in (64, 128):
            body = {"tier": "full", "model": model, "workload": {"seq_len": seq_len}}
            response = api.post("/resolve", json=body)
            assert response.status_code == 422, response.text
            assert response.json()["field"] == "model.config"
    assert load.call_count == 2


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


def test_describe_validates_each_distinct_query_string_once(api: TestClient) -> None:
    query = "/describe?tier=medium&gpu_memory_gb=41.5"
    validate = mock.patch.object(
        jsonbody, "request_params_to_args", wraps=jsonbody.request_params_to_args
    )
    with validate as validated:
        answers = [api.get(query) for _ in range(3)]
        reordered = api.get("/describe?gpu_memory_gb=41.5&tier=medium")
        after_hits = validated.call_count
        bad = [api.get("/describe?tier=medium&gpu_memory_gb=lots") for _ in range(2)]
        long_query = query + "&gpu_memory_gb=41.5" * 60  # over MAX_CACHED_QUERY_BYTES
        assert len(long_query) > jsonbody.MAX_CACHED_QUERY_BYTES
        long_answers = [api.get(long_query) for _ in range(2)]
    assert [a.json() for a in answers] == [reordered.json()] * 3
    assert answers[0].json()["granularity"] == "medium"
    assert after_hits == 2  # the query string, not its meaning, is the key
    assert [b.status_code for b in bad] == [422, 422]
    assert bad[1].json()["field"] == "gpu_memory_gb"
    assert [a.status_code for a in long_answers] == [200, 200]
    assert validated.call_count == 2 + 2 + 2  # errors and long queries: never kept


def test_remembered_query_values_are_never_shared_with_an_endpoint() -> None:
    """A list value (mutable) is validated afresh each time, so an endpoint that
    alters it cannot change what the next request sees."""
    app = FastAPI()
    app.router.route_class = jsonbody.StrictJSONRoute

    @app.get("/tags")
    async def tags(tag: Annotated[list[str], Query()], n: int = 0) -> dict[str, object]:
        tag.append("seen")
        return {"tag": tag, "n": n}

    with TestClient(app) as client:
        answers = [client.get("/tags?tag=a&n=1").json() for _ in range(3)]
    assert answers == [{"tag": ["a", "seen"], "n": 1}] * 3


def test_request_metrics_count_every_answer_by_labels() -> None:
    metrics = Metrics()
    for status in (200, 200, 422):
        metrics.observe_request("POST", "/resolve", status, 0.002)
    text = metrics.render()[0].decode()
    assert 'ckpt_http_requests_total{method="POST",route="/resolve",status="200"} 2.0' in text
    assert 'ckpt_http_requests_total{method="POST",route="/resolve",status="422"} 1.0' in text
    count = 'ckpt_http_request_duration_seconds_count{method="POST",route="/resolve",status="200"}'
    assert f"{count} 2.0" in text


def _exposition_without_created(registry: CollectorRegistry) -> list[str]:
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if "_created" not in line]


def test_request_stats_expose_what_prometheus_counter_and_histogram_would() -> None:
    """Same samples as prometheus_client's own classes fed the same requests,
    including latencies on a bucket bound, past the last one, and at zero."""
    buckets = (0.0005, 0.001, 0.0025, 1, 10)
    ours = CollectorRegistry()
    stats = RequestStats("reqs", "Requests.", "lat_seconds", "Latency.", buckets)
    ours.register(stats)
    theirs = CollectorRegistry()
    labels = ("method", "route", "status")
    counter = Counter("reqs", "Requests.", labels, registry=theirs)
    histogram = Histogram("lat_seconds", "Latency.", labels, buckets=buckets, registry=theirs)
    requests = [
        ("POST", "/resolve", 200, 0.0),
        ("POST", "/resolve", 200, 0.0005),
        ("POST", "/resolve", 200, 0.00051),
        ("POST", "/resolve", 422, 0.0025),
        ("GET", "/describe", 200, 1.0),
        ("GET", "/describe", 200, 12.5),
        ("POST", "/resolve", 200, 0.3),
    ]
    for method, route, status, seconds in requests:
        stats.observe(method, route, status, seconds)
        counter.labels(method, route, str(status)).inc()
        histogram.labels(method, route, str(status)).observe(seconds)
    ours_text = _exposition_without_created(ours)
    on_bound = 'lat_seconds_bucket{le="0.0005",method="POST",route="/resolve",status="200"} 2.0'
    assert on_bound in ours_text
    assert ours_text == _exposition_without_created(theirs)


@pytest.mark.parametrize("buckets", [(0.1, 0.05), (0.1, 0.1), (0.1, math.inf)])
def test_request_stats_refuse_buckets_not_increasing_and_finite(
    buckets: tuple[float, ...],
) -> None:
    with pytest.raises(ValueError, match="increasing and finite"):
        RequestStats("reqs", "Requests.", "lat_seconds", "Latency.", buckets)


def test_request_stats_names_cannot_be_registered_twice() -> None:
    registry = CollectorRegistry()
    registry.register(RequestStats("reqs", "Requests.", "lat_seconds", "Latency.", (1.0,)))
    with pytest.raises(ValueError, match="Duplicated"):
        Counter("reqs", "Again.", registry=registry)


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
