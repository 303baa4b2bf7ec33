"""Access lines and other log lines: JSON through the standard logging queue, off the loop.

The ``service`` loggers hand records to a `QueueHandler`; a listener thread
formats (python-json-logger) and writes them.  These tests check the line's
shape, that the request id reaches it from the request's context, that the
levels decide what is written, and that shutdown writes what is queued.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import logging.handlers
import math
import queue
import select
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from service.logs import (
    BatchingQueueListener,
    BatchStderrHandler,
    configure_logging,
    flush_logs,
    request_id_var,
)
from service.middleware import ACCESS_LOGGER, BodyLimitMiddleware
from tests.conftest import service_client

LINE_KEYS = ["ts", "level", "logger", "message"]


@pytest.fixture
def stderr_lines(capfd: pytest.CaptureFixture[str]) -> Iterator[Any]:
    """The JSON lines written to stderr, read after the queue is flushed."""

    def read() -> list[dict[str, Any]]:
        flush_logs()
        lines = capfd.readouterr().err.splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    yield read
    flush_logs()


def _at(level: str) -> Iterator[None]:
    logger = logging.getLogger("service")
    saved = logger.level
    configure_logging(level)
    yield
    logger.setLevel(saved)


@pytest.fixture
def info_level() -> Iterator[None]:
    yield from _at("info")


@pytest.mark.usefixtures("info_level")
def test_a_line_is_json_with_the_request_id_of_its_context(stderr_lines: Any) -> None:
    token = request_id_var.set("r-42")
    try:
        logging.getLogger(ACCESS_LOGGER).info(
            "POST %s %s", "/resolve", 200, extra={"route": "/resolve", "status": 200}
        )
    finally:
        request_id_var.reset(token)
    [line] = stderr_lines()
    assert list(line)[:4] == LINE_KEYS
    assert line["level"] == "info" and line["logger"] == ACCESS_LOGGER
    assert line["message"] == "POST /resolve 200"
    assert line["request_id"] == "r-42" and line["status"] == 200
    assert line["ts"].endswith("+00:00") and len(line["ts"]) == len("2026-01-01T00:00:00.000+00:00")


@pytest.mark.usefixtures("info_level")
def test_an_exception_is_formatted_with_its_traceback(stderr_lines: Any) -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("service.app").exception("it failed")
    [line] = stderr_lines()
    assert line["message"] == "it failed"
    assert "RuntimeError: boom" in line["exc_info"] and "Traceback" in line["exc_info"]


@pytest.mark.parametrize(
    ("level", "path", "logged"),
    [
        ("info", "/resolve", True),
        ("info", "/healthz", False),  # a successful probe is debug
        ("debug", "/healthz", True),
        ("warning", "/resolve", False),  # the access log off
    ],
)
def test_access_lines_obey_the_loggers_level(
    level: str, path: str, logged: bool, stderr_lines: Any
) -> None:
    with service_client(log_level=level) as client:
        stderr_lines()  # what the start-up wrote
        if path == "/resolve":
            assert client.post(path, json={"tier": "full"}).status_code == 200
        else:
            assert client.get(path).status_code == 200
        lines = [line for line in stderr_lines() if line["logger"] == ACCESS_LOGGER]
    assert bool([line for line in lines if line["path"] == path]) is logged


def test_every_request_is_counted_and_logged_once(stderr_lines: Any) -> None:
    with service_client(log_level="info") as client:
        stderr_lines()
        for _ in range(3):
            assert client.post("/resolve", json={"tier": "full"}).status_code == 200
        scrape = client.get("/metrics").text
    assert 'ckpt_http_requests_total{method="POST",route="/resolve",status="200"} 3.0' in scrape
    access = [line for line in stderr_lines() if line["logger"] == ACCESS_LOGGER]
    resolves = [line for line in access if line["route"] == "/resolve"]
    assert len(resolves) == 3
    assert all(line["request_id"] and line["duration_ms"] >= 0 for line in resolves)
    assert "ckpt_http_requests_created" not in scrape  # disable_created_metrics()


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


class _CountingStream(io.StringIO):
    """A stderr stand-in that keeps its writes."""

    def __init__(self) -> None:
        super().__init__()
        self.pieces: list[str] = []

    @property
    def writes(self) -> int:
        return len(self.pieces)

    def write(self, text: str) -> int:
        self.pieces.append(text)
        return super().write(text)


def _listener(stream: _CountingStream) -> tuple[logging.Logger, BatchingQueueListener]:
    handler = logging.handlers.QueueHandler(queue.SimpleQueue())
    logger = logging.getLogger(f"test.batching.{id(stream)}")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel("INFO")
    output = BatchStderrHandler()
    output.setFormatter(logging.Formatter("%(message)s"))
    listener = BatchingQueueListener(handler.queue, output)
    return logger, listener


def test_lines_queued_together_are_written_in_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = _CountingStream()
    monkeypatch.setattr(sys, "stderr", stream)
    logger, listener = _listener(stream)
    for number in range(50):
        logger.info("line %d", number)
    listener.start()  # the thread finds all 50 queued
    listener.stop()
    assert stream.getvalue().splitlines() == [f"line {n}" for n in range(50)]
    assert stream.writes == 1


def test_a_large_batch_is_written_in_pipe_sized_pieces_cut_at_line_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pipe writes up to PIPE_BUF bytes whole: other processes sharing stderr (the
    workers) cannot land inside one of those writes, so no line is split."""
    stream = _CountingStream()
    monkeypatch.setattr(sys, "stderr", stream)
    logger, listener = _listener(stream)
    lines = [f"{number:03d} " + "x" * 96 for number in range(100)]  # 101 bytes a line
    for line in lines:
        logger.info(line)
    listener.start()
    listener.stop()
    assert stream.getvalue().splitlines() == lines
    per_piece = select.PIPE_BUF // 101
    assert stream.writes == math.ceil(len(lines) / per_piece)
    assert all(len(piece) <= select.PIPE_BUF and piece.endswith("\n") for piece in stream.pieces)


def test_a_line_is_written_without_a_flush_within_the_batch_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = _CountingStream()
    monkeypatch.setattr(sys, "stderr", stream)
    logger, listener = _listener(stream)
    listener.start()
    try:
        logger.info("first")
        deadline = time.monotonic() + 5  # generous: a loaded CI machine
        while "first" not in stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stream.getvalue() == "first\n"
        logger.info("second")  # the thread now sleeps a batch interval, then writes it
        while "second" not in stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stream.getvalue() == "first\nsecond\n"
    finally:
        listener.stop()
