"""Finished requests are counted at once; their JSON access lines are written in batches.

`RequestLog` defers the write (see its module); these tests check that the
deferral keeps every line, in the shape of the other log lines, that the
metrics never wait for it, and that the app's shutdown writes what waits.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from service import request_log as request_log_module
from service.logs import JsonFormatter, configure_logging, json_line, request_id_var
from service.metrics import Metrics
from service.middleware import BodyLimitMiddleware
from service.request_log import ACCESS_LOGGER, FLUSH_AFTER_S, FLUSH_AT, FinishedRequest, RequestLog
from tests.conftest import service_client

LINE_KEYS = ["ts", "level", "logger", "message", "request_id"]


@pytest.fixture
def info_level() -> Iterator[None]:
    """The service loggers at info, as ``python -m service`` sets them; restored after."""
    logger = logging.getLogger("service")
    level = logger.level
    configure_logging("info")
    yield
    logger.setLevel(level)


def _finished(
    route: str = "/resolve", status: int = 200, request_id: str = "r-1"
) -> FinishedRequest:
    return FinishedRequest("POST", route, route, status, 0.0025, request_id, 1_700_000_000.5)


def _flushed(log: RequestLog, *requests: FinishedRequest) -> None:
    """Add `requests` as the middleware does (on a loop), then flush whatever is left."""

    async def add_all() -> None:
        for request in requests:
            log.add(request)

    asyncio.run(add_all())
    log.flush()


def _count(metrics: Metrics, route: str, status: int) -> float:
    labels = {"method": "POST", "route": route, "status": str(status)}
    value = metrics.registry.get_sample_value("ckpt_http_requests_total", labels)
    return value or 0.0


@pytest.mark.usefixtures("info_level")
@pytest.mark.parametrize("count", [3, FLUSH_AT])
def test_a_batch_is_written_when_full_or_when_its_time_is_up(count: int) -> None:
    metrics, stream = Metrics(), io.StringIO()
    log = RequestLog(metrics, stream)

    async def answer(number: int) -> tuple[str, float, float]:
        for serial in range(number):
            log.add(_finished(request_id=f"r-{serial}"))
        at_once, counted = stream.getvalue(), _count(metrics, "/resolve", 200)
        started = time.monotonic()
        while not stream.getvalue() and time.monotonic() - started < 10 * FLUSH_AFTER_S:
            await asyncio.sleep(FLUSH_AFTER_S / 10)
        return at_once, counted, time.monotonic() - started

    at_once, counted, waited = asyncio.run(answer(count))
    assert counted == count  # the metrics never wait for a batch
    assert bool(at_once) is (count == FLUSH_AT)  # a full batch is written at once
    if count < FLUSH_AT:
        assert FLUSH_AFTER_S * 0.5 <= waited < FLUSH_AFTER_S * 5
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["request_id"] for line in lines] == [f"r-{n}" for n in range(count)]


@pytest.mark.usefixtures("info_level")
def test_access_lines_have_the_shape_of_every_other_log_line() -> None:
    stream = io.StringIO()
    _flushed(RequestLog(Metrics(), stream), _finished(status=422, request_id="abc"))
    access = json.loads(stream.getvalue())

    record = logging.LogRecord(ACCESS_LOGGER, logging.INFO, "", 0, "POST /resolve 422", (), None)
    record.created = 1_700_000_000.5
    token = request_id_var.set("abc")
    try:
        formatted = json.loads(JsonFormatter().format(record))
    finally:
        request_id_var.reset(token)

    assert list(access)[: len(LINE_KEYS)] == LINE_KEYS == list(formatted)
    assert {key: access[key] for key in LINE_KEYS} == formatted
    assert access["ts"] == "2023-11-14T22:13:20.500+00:00"
    expected = {"method": "POST", "path": "/resolve", "route": "/resolve", "status": 422}
    assert expected.items() <= access.items()
    assert access["duration_ms"] == 2.5


@pytest.mark.usefixtures("info_level")
def test_a_line_is_byte_for_byte_what_json_line_writes() -> None:
    """Its repeated pairs are encoded once and spliced: the result must not differ."""
    paths = [
        "/resolve",
        '/a"b\\c',
        "/caf\u00e9/\u2603/\U0001f600",
        "/nul\x00/tab\t/nl\n",
        "/\ud800",
    ]
    durations = [0.0, 0.0000004, 0.0025, 1.2345678, 98765.4321, 1e-9]
    stamps = [1_700_000_000.5, 1_700_000_000.9996, 0.0, 1_800_000_123.123456]
    stream = io.StringIO()
    log = RequestLog(Metrics(), stream)
    expected = []
    for index, (path, seconds, stamp) in enumerate(
        (p, d, t) for p in paths for d in durations for t in stamps
    ):
        route = "/healthz" if index % 7 == 0 else path
        status = (200, 404, 422, 500, 503)[index % 5]
        request = FinishedRequest("GET", path, route, status, seconds, f"id-{index}", stamp)
        line = log._access_line(request)
        quiet = route == "/healthz" and status < 400
        if quiet:  # debug: not written at info
            assert line is None
            continue
        fields = {
            "request_id": f"id-{index}",
            "method": "GET",
            "path": path,
            "route": route,
            "status": status,
            "duration_ms": round(seconds * 1000, 3),
        }
        message = f"GET {path} {status}"
        expected.append(json_line(stamp, logging.INFO, ACCESS_LOGGER, message, fields) + "\n")
        assert line == expected[-1]
    assert len(expected) > 80


@pytest.mark.parametrize(
    ("level", "route", "status", "logged"),
    [
        ("info", "/resolve", 200, True),
        ("info", "/healthz", 200, False),  # probes at debug
        ("info", "/healthz", 503, True),  # a failing probe is news
        ("debug", "/metrics", 200, True),
        ("warning", "/resolve", 500, False),  # the access log off
    ],
)
def test_lines_obey_the_access_loggers_level(
    level: str, route: str, status: int, logged: bool
) -> None:
    logger = logging.getLogger("service")
    saved = logger.level
    configure_logging(level)
    try:
        metrics, stream = Metrics(), io.StringIO()
        _flushed(RequestLog(metrics, stream), _finished(route=route, status=status))
    finally:
        logger.setLevel(saved)
    assert bool(stream.getvalue()) is logged
    assert _count(metrics, route, status) == 1.0  # counted whatever is logged


def test_metrics_see_every_answered_request_and_shutdown_writes_the_waiting_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(request_log_module, "FLUSH_AFTER_S", 3600.0)  # only shutdown writes
    with service_client() as client:
        request_log: RequestLog = client.app.state.request_log  # type: ignore[attr-defined]
        stream = request_log.stream = io.StringIO()
        for _ in range(3):
            assert client.post("/resolve", json={"tier": "full"}).status_code == 200
        scrape = client.get("/metrics").text
        written_before_shutdown = stream.getvalue()
    assert 'ckpt_http_requests_total{method="POST",route="/resolve",status="200"} 3.0' in scrape
    assert written_before_shutdown == ""
    # the app has shut down: its lifespan wrote the lines still waiting
    routes = [json.loads(line)["route"] for line in stream.getvalue().splitlines()]
    assert routes.count("/resolve") == 3
    assert "/metrics" not in routes  # a successful scrape is logged at debug


def test_a_request_without_a_body_is_not_read_or_timed() -> None:
    """No Content-Length and no Transfer-Encoding: no body (RFC 9112 6.3), so the
    middleware neither waits for one nor arms its timer; the app gets `receive` as is."""
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen["receive"] = receive

    async def never_answers() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {}

    async def refuse(message: Any) -> None:
        raise AssertionError(f"nothing should be sent, got {message}")

    scope = {"type": "http", "method": "GET", "headers": [(b"host", b"x")]}
    middleware = BodyLimitMiddleware(app, max_bytes=10, timeout_s=0.01)
    asyncio.run(asyncio.wait_for(middleware(scope, never_answers, refuse), timeout=5))
    assert seen["receive"] is never_answers
