"""The HTTP API through httpx: every endpoint, every error path, one error shape."""

from __future__ import annotations

import json
import multiprocessing
import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

import ckpt_core
from ckpt_core._configs.presets import list_presets
from tests.conftest import TINY_CONFIG, metric

JSON = {"content-type": "application/json"}


def _error(response: Any, status: int, code: str, field: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "detail", "field"}
    assert body["error"] == code, body
    assert body["field"] == field, body
    assert isinstance(body["detail"], str) and body["detail"]
    return body


# --- POST /resolve ------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_body", "kwargs"),
    [
        ({"tier": "auto", "gpu": "A100-80GB"}, {"gpu": "A100-80GB"}),
        ({"tier": " Selective ", "gpu_memory_gb": 23.6}, {"gpu_memory_gb": 23.6}),
        ({"tier": True, "transformers_version": "5.10.0"}, {"transformers_version": "5.10.0"}),
        ({"tier": "medium", "transformers_version": "5.10.0"}, {"transformers_version": "5.10.0"}),
        ({"tier": None}, {}),
        ({"tier": False}, {}),
        ({"tier": "off"}, {}),
    ],
)
def test_resolve_answers_the_plan_of_ckpt_core(
    api: TestClient, request_body: dict[str, Any], kwargs: dict[str, Any]
) -> None:
    response = api.post("/resolve", json=request_body)
    assert response.status_code == 200, response.text
    expected = ckpt_core.make_plan(request_body.get("tier"), **kwargs).to_dict()
    assert response.json() == json.loads(json.dumps(expected))


def test_resolve_with_a_model_and_workload_answers_the_estimate(api: TestClient) -> None:
    model = {"preset": "llama-3.2-1b"}
    workload = {"seq_len": 2048, "micro_batch_size": 2, "method": "lora"}
    body = {"tier": "auto", "gpu": "A100-80GB", "model": model, "workload": workload}
    response = api.post("/resolve", json=body)
    assert response.status_code == 200, response.text
    expected = ckpt_core.make_plan("auto", gpu="A100-80GB", model=model, workload=workload)
    assert response.json() == json.loads(json.dumps(expected.to_dict()))
    assert set(response.json()["estimate"]["tiers"]) == {"off", "selective", "medium", "full"}
    bad_workload = {**body, "workload": {"seq_len": 2048, "method": "prefix"}}
    _error(api.post("/resolve", json=bad_workload), 422, "invalid_workload", "workload.method")


def test_a_padded_workload_is_estimated_as_one(api: TestClient) -> None:
    """padded reaches the estimate: sdpa's masks and repeated K / V add activations."""
    model = {"preset": "llama-3.2-1b"}
    workload = {"seq_len": 1024, "micro_batch_size": 2, "method": "lora", "padded": True}
    body = {"tier": "auto", "gpu": "A100-80GB", "model": model, "workload": workload}
    padded = api.post("/resolve", json=body)
    plain = api.post("/resolve", json={**body, "workload": {**workload, "padded": False}})
    assert padded.status_code == plain.status_code == 200, padded.text
    expected = ckpt_core.make_plan("auto", gpu="A100-80GB", model=model, workload=workload)
    assert padded.json() == json.loads(json.dumps(expected.to_dict()))
    tiers = padded.json()["estimate"]["tiers"], plain.json()["estimate"]["tiers"]
    assert tiers[0]["off"]["activation_bytes"] > tiers[1]["off"]["activation_bytes"]


def test_the_load_path_reaches_the_estimate(api: TestClient) -> None:
    """A device-map load starts the step from one warm-up block: another pool."""
    model = {"preset": "qwen2.5-1.5b"}
    workload = {"seq_len": 1024, "micro_batch_size": 2, "method": "lora"}
    body = {"tier": "auto", "gpu": "H200", "model": model, "workload": workload}
    peaks = []
    for path in ("device_map", "to_device"):
        response = api.post("/resolve", json={**body, "workload": {**workload, "load_path": path}})
        assert response.status_code == 200, response.text
        peaks.append(response.json()["estimate"]["tiers"]["off"]["peak_bytes"])
    assert peaks[0] != peaks[1]


def test_the_fused_optimizer_reaches_the_estimate(api: TestClient) -> None:
    """A full fine-tune whose foreach AdamW temporary does not fit fits with the fused step."""
    model = {"preset": "llama-3.1-8b"}
    workload = {"seq_len": 2048, "method": "full"}
    body = {"tier": "auto", "gpu": "A100-80GB", "model": model, "workload": workload}
    foreach = api.post("/resolve", json=body)
    fused = api.post(
        "/resolve", json={**body, "workload": {**workload, "optimizer": "adamw_fused"}}
    )
    assert foreach.status_code == fused.status_code == 200, fused.text
    assert foreach.json()["estimate"]["chosen"]["fits"] is False
    assert fused.json()["estimate"]["chosen"]["fits"] is True
    alternative = foreach.json()["estimate"]["alternatives"][0]
    assert alternative["changes"] == {"optimizer": "adamw_fused"}


@pytest.mark.parametrize("path", ["/resolve", "/dry-run"])
def test_a_missing_tier_is_a_422_naming_it(api: TestClient, path: str) -> None:
    """A forgotten tier must not silently mean "off": null, false and "off" say it."""
    body = {} if path == "/resolve" else {"model": {"preset": "gpt2"}}
    _error(api.post(path, json=body), 422, "invalid_request", "tier")


def test_plan_answer_round_trips_into_a_plan(api: TestClient) -> None:
    data = api.post("/resolve", json={"tier": "medium"}).json()
    assert ckpt_core.Plan.from_dict(data).to_dict() == data


# --- error paths: one table, each with its status, code and field --------------

NAN_BODY = b'{"tier": "auto", "gpu_memory_gb": NaN}'
INF_BODY = b'{"tier": "auto", "gpu_memory_gb": Infinity}'
OVERFLOW_BODY = b'{"tier": "auto", "gpu_memory_gb": 1e999}'
HUGE_INT_BODY = b'{"tier": "auto", "gpu_memory_gb": 100000000000000000000000000000}'
LARGE_CONFIG = {**TINY_CONFIG, "num_hidden_layers": 100_000}


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        ({"tier": "fulll"}, 422, "invalid_tier", "tier"),
        ({"tier": "selective-ish"}, 422, "invalid_tier", "tier"),
        ({"tier": 1}, 422, "invalid_tier", "tier"),
        ({"tier": "auto", "gpu_memory_gb": -1}, 422, "invalid_gpu_memory", "gpu_memory_gb"),
        ({"tier": "auto", "gpu_memory_gb": 0}, 422, "invalid_gpu_memory", "gpu_memory_gb"),
        ({"tier": "auto", "gpu_memory_gb": 1e300}, 422, "invalid_gpu_memory", "gpu_memory_gb"),
        ({"tier": "auto", "gpu_memory_gb": "80"}, 422, "invalid_gpu_memory", "gpu_memory_gb"),
        ({"tier": "auto", "gpu": "Z80"}, 422, "unknown_gpu", "gpu"),
        (
            {"tier": "auto", "gpu": "H200", "gpu_memory_gb": 80},
            422,
            "invalid_gpu_memory",
            "gpu_memory_gb",
        ),
        (
            {"tier": "full", "transformers_version": "4.30.0"},
            422,
            "unsupported_transformers_version",
            "transformers_version",
        ),
        ({"tier": "auto", "model": {"preset": "nope"}}, 422, "unknown_preset", "model.preset"),
        (
            {"tier": "auto", "model": {"config": {**TINY_CONFIG, "model_type": "nopeformer"}}},
            422,
            "invalid_model_config",
            "model.config.model_type",
        ),
        (
            {"tier": "auto", "model": {"config": LARGE_CONFIG}},
            422,
            "config_too_large",
            "model.config.num_hidden_layers",
        ),
        (
            {"tier": "auto", "model": {"config": {**TINY_CONFIG, "auto_map": {"x": "y.Z"}}}},
            422,
            "invalid_model_config",
            "model.config.auto_map",
        ),
        ({"tier": "auto", "model": {}}, 422, "invalid_model_config", "model"),
        ({"tier": "auto", "model": {"preset": 7}}, 422, "invalid_request", "model.preset"),
        ({"tier": "auto", "workload": {"seq_len": 512}}, 422, "invalid_model_config", "model"),
        ({"tier": "auto", "model": {"preset": "gpt2"}}, 422, "invalid_workload", "workload"),
        (
            {"tier": "auto", "model": {"preset": "gpt2"}, "workload": {"micro_batch_size": 2}},
            422,
            "invalid_workload",
            "workload.seq_len",
        ),
        (
            {"tier": "auto", "model": {"preset": "gpt2"}, "workload": {"seq_len": 8, "padded": 1}},
            422,
            "invalid_workload",
            "workload.padded",
        ),
        (
            {
                "tier": "auto",
                "model": {"preset": "gpt2"},
                "workload": {"seq_len": 8, "load_path": "gpu"},
            },
            422,
            "invalid_workload",
            "workload.load_path",
        ),
        (
            {
                "tier": "auto",
                "model": {"preset": "gpt2"},
                "workload": {"seq_len": 8, "optimizer": "adamw_torch_fused"},  # HF's name
            },
            422,
            "invalid_workload",
            "workload.optimizer",
        ),
        ({"tier": "auto", "teir": "full"}, 422, "invalid_request", "teir"),
        ([1, 2], 422, "invalid_request", "body"),
    ],
)
def test_resolve_rejects_bad_values_with_the_field(
    api: TestClient, body: Any, status: int, code: str, field: str | None
) -> None:
    _error(api.post("/resolve", json=body), status, code, field)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (NAN_BODY, "gpu_memory_gb"),
        (INF_BODY, "gpu_memory_gb"),
        (OVERFLOW_BODY, "gpu_memory_gb"),
        (HUGE_INT_BODY, "gpu_memory_gb"),
        (b'{"tier": "auto", "tier": "off"}', "tier"),
        (b'{"tier": "auto"', None),
        (b"\xff\xfe{}", None),
        (b"[" * 50_000, None),
    ],
)
def test_body_that_is_not_strict_json_is_a_400(
    api: TestClient, raw: bytes, field: str | None
) -> None:
    _error(api.post("/resolve", content=raw, headers=JSON), 400, "malformed_json", field)


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_body_that_is_not_json_content_is_a_415(api: TestClient, content_type: str | None) -> None:
    headers = {"content-type": content_type} if content_type else {}
    response = api.post("/resolve", content=b'{"tier": "auto"}', headers=headers)
    _error(response, 415, "unsupported_media_type", None)


def test_json_with_charset_and_vendor_suffix_is_accepted(api: TestClient) -> None:
    for content_type in ("application/json; charset=utf-8", "application/vnd.ckpt+json"):
        headers = {"content-type": content_type}
        response = api.post("/resolve", content=b'{"tier": "full"}', headers=headers)
        assert response.status_code == 200, (content_type, response.text)


def test_body_over_the_limit_is_a_413_from_content_length(api: TestClient) -> None:
    body = b'{"tier": "auto", "pad": "' + b"x" * (1 << 20) + b'"}'
    response = api.post("/resolve", content=body, headers=JSON)
    _error(response, 413, "body_too_large", None)
    # Refused before routing: counted without a route template.
    labels = {"method": "POST", "route": "<unmatched>", "status": "413"}
    assert metric(api, "ckpt_http_requests_total", **labels) >= 1


def test_chunked_body_over_the_limit_is_a_413(api: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"tier": "auto", "pad": "'
        for _ in range(40):
            yield b"x" * 32_768
        yield b'"}'

    response = api.post("/resolve", content=chunks(), headers=JSON)
    _error(response, 413, "body_too_large", None)


def test_empty_body_is_a_missing_body(api: TestClient) -> None:
    _error(api.post("/resolve", content=b"", headers=JSON), 422, "invalid_request", "body")


# --- GET /describe ---------------------------------------------------------------


def test_describe_answers_json_by_default(api: TestClient) -> None:
    response = api.get("/describe", params={"tier": "auto", "gpu_memory_gb": 40})
    assert response.status_code == 200
    assert response.json() == {
        "tier": "auto",
        "granularity": "medium",
        "description": ckpt_core.describe_tier("auto", 40),
    }


@pytest.mark.parametrize(
    ("accept", "text"),
    [
        ("text/plain", True),
        ("text/plain, application/json;q=0.5", True),
        ("application/json, text/plain;q=0.9", False),
        ("text/*;q=0.8, */*;q=0.1", True),
        ("*/*", False),
    ],
)
def test_describe_follows_the_accept_header(api: TestClient, accept: str, text: bool) -> None:
    response = api.get(
        "/describe", params={"tier": "auto", "gpu": "H200"}, headers={"accept": accept}
    )
    assert response.status_code == 200
    description = ckpt_core.describe_tier("auto", gpu="H200")
    if text:
        assert response.headers["content-type"].startswith("text/plain")
        assert response.text == description
    else:
        assert response.json()["description"] == description


@pytest.mark.parametrize(
    ("params", "code", "field"),
    [
        ({"tier": "fulll"}, "invalid_tier", "tier"),
        ({"tier": "auto", "gpu_memory_gb": "nan"}, "invalid_gpu_memory", "gpu_memory_gb"),
        ({"tier": "auto", "gpu_memory_gb": "inf"}, "invalid_gpu_memory", "gpu_memory_gb"),
        ({"tier": "auto", "gpu_memory_gb": "-3"}, "invalid_gpu_memory", "gpu_memory_gb"),
        ({"tier": "auto", "gpu_memory_gb": "1e400"}, "invalid_gpu_memory", "gpu_memory_gb"),
        ({"tier": "auto", "gpu_memory_gb": "lots"}, "invalid_request", "gpu_memory_gb"),
        ({"tier": "auto", "gpu": "Z80"}, "unknown_gpu", "gpu"),
    ],
)
def test_describe_rejects_bad_query_values(
    api: TestClient, params: dict[str, str], code: str, field: str
) -> None:
    _error(api.get("/describe", params=params), 422, code, field)


# --- GET /presets, probes, metrics, plumbing ----------------------------------------


def test_presets_lists_every_bundled_preset(api: TestClient) -> None:
    response = api.get("/presets")
    assert response.status_code == 200
    assert response.json() == {"presets": [preset.to_dict() for preset in list_presets()]}
    assert len(response.json()["presets"]) >= 3


def test_probes(api: TestClient) -> None:
    assert api.get("/healthz").json() == {"status": "ok"}
    assert api.get("/readyz").json() == {"status": "ready"}


def test_metrics_count_requests_by_route_template_and_status(api: TestClient) -> None:
    labels = {"method": "GET", "route": "/describe", "status": "200"}
    before = metric(api, "ckpt_http_requests_total", **labels)
    api.get("/describe", params={"tier": "full"})
    assert metric(api, "ckpt_http_requests_total", **labels) == before + 1
    text = api.get("/metrics").text
    assert "ckpt_http_request_duration_seconds_bucket" in text
    assert "ckpt_dry_run_queue_depth 0.0" in text


def test_request_id_is_echoed_or_generated(api: TestClient) -> None:
    given = api.get("/healthz", headers={"X-Request-ID": "job-42.a"})
    assert given.headers["X-Request-ID"] == "job-42.a"
    generated = api.get("/healthz", headers={"X-Request-ID": "bad id\twith spaces"})
    assert len(generated.headers["X-Request-ID"]) == 32
    assert generated.headers["X-Request-ID"] != api.get("/healthz").headers["X-Request-ID"]
    error = api.post("/resolve", json={"tier": "nope"}, headers={"X-Request-ID": "r-1"})
    assert error.headers["X-Request-ID"] == "r-1"


def test_generated_request_ids_differ_in_a_forked_worker() -> None:
    """The ids come from a seeded generator: a forked process (uvicorn workers,
    a pool) must not replay its parent's sequence."""
    from service.middleware import _request_id

    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        child = pool.apply(_request_id, (None,))
    parent = _request_id(None)
    assert re.fullmatch(r"[0-9a-f]{32}", parent)
    assert child != parent


def test_unknown_path_and_method_use_the_error_shape(api: TestClient) -> None:
    _error(api.get("/nope"), 404, "not_found", None)
    response = api.delete("/resolve")
    _error(response, 405, "method_not_allowed", None)
    assert response.headers["allow"] == "POST"


def test_a_bug_is_a_json_500_not_a_traceback() -> None:
    from tests.conftest import service_client

    with service_client() as api:

        @api.app.get("/boom")  # type: ignore[attr-defined]
        async def boom() -> None:
            raise RuntimeError("a bug")

        response = api.get("/boom", headers={"X-Request-ID": "boom-1"})
    body = _error(response, 500, "internal_error", None)
    assert "boom-1" in body["detail"] and "a bug" not in body["detail"]
    assert response.headers["X-Request-ID"] == "boom-1"
