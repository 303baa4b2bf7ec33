"""The service client: real answers from a real uvicorn, retries, fallback, errors.

A uvicorn process serves ``service.app:create_app`` on a free loopback port;
the retry paths (429, 5xx, timeouts) use httpx's MockTransport or a socket
that never answers, so they are exact and fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from ckpt_core import (
    CheckpointConflictError,
    InvalidTierError,
    UnknownGpuError,
    UnknownPresetError,
    describe_tier,
    make_plan,
)
from ckpt_core._dry_run import dry_run
from ckpt_core._planning.training_args import installed_transformers_version
from ckpt_core.client import (
    CkptClient,
    ServiceRequestError,
    ServiceUnavailableError,
    retry_after_seconds,
)
from tests._tiny_models import tiny_config

STARTUP_S = 60.0
# Requests whose answers must be the same from the service and from ckpt_core.
RESOLVE_CASES: list[dict[str, Any]] = [
    {"tier": "auto", "gpu": "A100-80GB"},
    {"tier": "auto", "gpu_memory_gb": 23.6},
    {"tier": " Selective "},
    {"tier": True},
    {"tier": None},
    {"tier": "medium", "transformers_version": "5.15.0"},
    {"tier": "full", "transformers_version": "4.57.0"},
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def uvicorn_service() -> Iterator[Callable[[], str]]:
    """Run the service in a uvicorn process; yields ``url()``, which also checks it is alive."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CKPT_DRY_RUN_WORKERS": "1"}
    command = [sys.executable, "-m", "uvicorn", "service.app:create_app", "--factory"]
    process = subprocess.Popen(
        [*command, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its dry-run workers share its process group
    )
    url = f"http://127.0.0.1:{port}"

    def alive_url() -> str:
        assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
        return url

    try:
        _wait_ready(url, process)
        yield alive_url
    finally:
        _stop(process)


def _wait_ready(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            err = process.stderr.read().decode() if process.stderr else ""
            raise RuntimeError(f"the service exited with {process.returncode}: {err[-2000:]}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the service did not answer /healthz within {STARTUP_S:g}s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group this fixture started, SIGKILL if it lingers."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)
    if process.stderr:
        process.stderr.close()


@pytest.fixture(scope="module")
def service_url() -> Iterator[Callable[[], str]]:
    with uvicorn_service() as url:
        yield url


def tiny_llama_config() -> dict[str, Any]:
    """The tiny Llama's config.json content (as the HF file has it: JSON, string keys)."""
    return json.loads(tiny_config("llama").to_json_string())


def without_timing(report: Any) -> dict[str, Any]:
    data = report.to_dict()
    del data["elapsed_ms"]  # wall time of each run: the only field allowed to differ
    return data


# --- against the real service ------------------------------------------------


@pytest.mark.parametrize("request_", RESOLVE_CASES, ids=json.dumps)
def test_resolve_from_the_service_equals_the_local_plan(
    service_url: Callable[[], str], request_: dict[str, Any]
) -> None:
    with CkptClient(service_url(), retries=0, fallback=False) as client:
        answer = client.resolve(**request_)
    assert answer.source == "service"
    assert answer.fallback_reason is None
    assert answer.value.to_dict() == make_plan(**request_).to_dict()


def test_describe_from_the_service_equals_describe_tier(service_url: Callable[[], str]) -> None:
    with CkptClient(service_url(), retries=0, fallback=False) as client:
        for tier, memory in (("auto", 30.0), ("selective", None), (None, None)):
            answer = client.describe(tier, memory)
            assert answer.source == "service"
            assert answer.value == describe_tier(tier, memory)


def test_dry_run_from_the_service_equals_the_local_report(service_url: Callable[[], str]) -> None:
    model = {"config": tiny_llama_config()}
    with CkptClient(service_url(), retries=0, fallback=False) as client:
        answer = client.dry_run(model, "selective")
    assert answer.source == "service"
    local = dry_run(model, "selective")
    assert without_timing(answer.value) == without_timing(local)
    assert answer.value.hooked == 3


@pytest.mark.parametrize(
    ("call", "error", "field"),
    [
        (lambda c: c.resolve("fulll"), InvalidTierError, "tier"),
        (lambda c: c.resolve("auto", gpu="Z9000"), UnknownGpuError, "gpu"),
        (lambda c: c.describe("0"), InvalidTierError, "tier"),
        (lambda c: c.dry_run({"preset": "no-such-model"}, "full"), UnknownPresetError, None),
    ],
    ids=["tier", "gpu", "describe", "preset"],
)
def test_client_errors_raise_the_ckpt_core_class_without_fallback(
    service_url: Callable[[], str],
    call: Callable[[CkptClient], Any],
    error: type,
    field: str | None,
) -> None:
    with (
        CkptClient(service_url(), retries=3, fallback=True) as client,
        pytest.raises(error) as info,
    ):
        call(client)
    if field is not None:
        assert info.value.field == field


def test_service_stopped_falls_back_to_the_same_answers(service_url: Callable[[], str]) -> None:
    """A replica is stopped between two identical requests: the fallback answers the same.

    The dry-run answer comes from the module's replica (the service is
    stateless; this saves a second dry-run worker warm-up).
    """
    requests = [{"tier": "auto", "gpu": "H100-80GB"}, {"tier": "medium", "gpu_memory_gb": 40}]
    model = {"config": tiny_llama_config()}
    with CkptClient(service_url(), retries=0, fallback=False) as client:
        report = client.dry_run(model, "medium")
    with uvicorn_service() as url, CkptClient(url(), retries=0, fallback=False) as client:
        from_service = [client.resolve(**r) for r in requests]
        described = client.describe("auto", 79.2)
        stopped_url = url()
    assert {a.source for a in [*from_service, described, report]} == {"service"}

    with CkptClient(stopped_url, retries=1, backoff=0.01) as client:
        fallback = [client.resolve(**r) for r in requests]
        described_locally = client.describe("auto", 79.2)
        report_locally = client.dry_run(model, "medium")
    for service_answer, local_answer in zip(from_service, fallback, strict=True):
        assert local_answer.source == "fallback"
        assert "ConnectError" in (local_answer.fallback_reason or "")
        assert local_answer.value.to_dict() == service_answer.value.to_dict()
        assert local_answer.value == service_answer.value
    assert (described_locally.source, described_locally.value) == ("fallback", described.value)
    assert report_locally.source == "fallback"
    assert without_timing(report_locally.value) == without_timing(report.value)


# --- retries, timeouts and fallback, exactly (MockTransport) -----------------


def plan_json(**request: Any) -> dict[str, Any]:
    return make_plan(**request).to_dict()


def scripted(*responses: httpx.Response | Exception) -> tuple[httpx.MockTransport, list[Any]]:
    """A transport that answers with ``responses`` in order and records each request."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        item = responses[min(len(seen), len(responses)) - 1]
        if isinstance(item, Exception):
            raise item
        return item

    return httpx.MockTransport(handler), seen


def mock_client(transport: httpx.MockTransport, **settings: Any) -> CkptClient:
    return CkptClient("http://ckpt.test", transport=transport, **settings)


def test_429_is_retried_after_retry_after() -> None:
    busy = httpx.Response(429, headers={"Retry-After": "1"}, json={"error": "dry_run_busy"})
    transport, seen = scripted(busy, httpx.Response(200, json=plan_json(tier="full")))
    started = time.monotonic()
    with mock_client(transport, retries=2, backoff=0.01, fallback=False) as client:
        answer = client.resolve("full")
    waited = time.monotonic() - started
    assert len(seen) == 2
    assert waited >= 0.95, "Retry-After: 1 must be honoured over the 0.01 s backoff"
    assert answer.source == "service"
    assert answer.value == make_plan("full")


def test_5xx_and_connection_errors_back_off_and_retry() -> None:
    transport, seen = scripted(
        httpx.ConnectError("refused"),
        httpx.Response(503, json={"error": "dry_run_worker_crashed"}),
        httpx.Response(200, json=plan_json(tier="selective")),
    )
    started = time.monotonic()
    with mock_client(transport, retries=3, backoff=0.05, fallback=False) as client:
        answer = client.resolve("selective")
    assert len(seen) == 3
    assert time.monotonic() - started >= 0.05 + 0.1  # backoff, then twice the backoff
    assert answer.source == "service"


def test_retries_are_bounded_then_fall_back() -> None:
    transport, seen = scripted(httpx.Response(500, text="boom"))
    with mock_client(transport, retries=2, backoff=0.01) as client:
        answer = client.resolve("auto", gpu="L4")
    assert len(seen) == 3
    assert answer.source == "fallback"
    assert answer.fallback_reason == "HTTP 500 from POST /resolve"
    assert answer.value == make_plan("auto", gpu="L4")


def test_without_fallback_an_unreachable_service_raises() -> None:
    transport, seen = scripted(httpx.ConnectError("refused"))
    with (
        mock_client(transport, retries=1, backoff=0.01, fallback=False) as client,
        pytest.raises(ServiceUnavailableError, match="refused"),
    ):
        client.resolve("full")
    assert len(seen) == 2


def test_retry_after_beyond_max_wait_stops_retrying_at_once() -> None:
    transport, seen = scripted(httpx.Response(429, headers={"Retry-After": "3600"}))
    started = time.monotonic()
    with mock_client(transport, retries=5, max_wait=2) as client:
        answer = client.resolve("medium")
    assert len(seen) == 1
    assert time.monotonic() - started < 1
    assert answer.source == "fallback"
    assert "exceeds max_wait" in (answer.fallback_reason or "")


def test_a_2xx_that_is_not_a_plan_falls_back() -> None:
    transport, _ = scripted(httpx.Response(200, text="<html>proxy login</html>"))
    with mock_client(transport, retries=0) as client:
        answer = client.resolve("full")
    assert answer.source == "fallback"
    assert "invalid answer" in (answer.fallback_reason or "")


def test_unknown_4xx_codes_and_501_are_raised_not_retried() -> None:
    too_large = httpx.Response(413, json={"error": "body_too_large", "detail": "too big"})
    transport, seen = scripted(too_large)
    with mock_client(transport, retries=3) as client, pytest.raises(ServiceRequestError) as info:
        client.resolve("full")
    assert (info.value.status, info.value.message, len(seen)) == (413, "too big", 1)

    transport, seen = scripted(httpx.Response(501, json={"error": "not_implemented"}))
    with mock_client(transport, retries=3) as client, pytest.raises(NotImplementedError):
        client.dry_run({"preset": "gpt2"}, "full", measure={"seq_len": 8})
    assert len(seen) == 1


def test_409_maps_to_the_state_error_class() -> None:
    conflict = {"error": "checkpoint_conflict", "detail": "HF is on", "field": "granularity"}
    transport, _ = scripted(httpx.Response(409, json=conflict))
    with mock_client(transport) as client, pytest.raises(CheckpointConflictError) as info:
        client.resolve("selective")
    assert info.value.field == "granularity"


def test_the_request_carries_the_workers_transformers_version() -> None:
    transport, seen = scripted(httpx.Response(200, json=plan_json(tier="auto", gpu="L4")))
    with mock_client(transport) as client:
        client.resolve("auto", gpu="L4")
    body = json.loads(seen[0].content)
    assert body == {
        "tier": "auto",
        "gpu": "L4",
        "transformers_version": installed_transformers_version(),
    }


def test_a_service_that_never_answers_times_out() -> None:
    """A listening socket nobody reads from: the request must end at the timeout."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        started = time.monotonic()
        with CkptClient(url, timeout=0.3, retries=1, backoff=0.01) as client:
            answer = client.describe("full")
    assert time.monotonic() - started < 5
    assert answer.source == "fallback"
    assert "Timeout" in (answer.fallback_reason or "")
    assert answer.value == describe_tier("full")


@pytest.mark.parametrize(
    ("header", "expected"),
    [("7", 7.0), (" 0 ", 0.0), ("soon", None), ("", None), (None, None)],
)
def test_retry_after_seconds(header: str | None, expected: float | None) -> None:
    assert retry_after_seconds(header) == expected


def test_retry_after_http_date() -> None:
    now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    header = format_datetime(now + timedelta(seconds=90), usegmt=True)
    assert retry_after_seconds(header, now=now) == 90.0
    assert (
        retry_after_seconds(format_datetime(now - timedelta(seconds=5), usegmt=True), now=now) == 0
    )


@pytest.mark.parametrize(
    "settings",
    [
        {"base_url": "ckpt.internal:8000"},
        {"retries": -1},
        {"retries": 100},
        {"timeout": 0},
        {"backoff": float("-1")},
    ],
)
def test_bad_client_settings_are_rejected(settings: dict[str, Any]) -> None:
    kwargs = {"base_url": "http://ckpt.test", **settings}
    with pytest.raises(ValueError):
        CkptClient(kwargs.pop("base_url"), **kwargs)
