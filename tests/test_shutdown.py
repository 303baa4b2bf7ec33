"""Graceful shutdown of a real ``python -m service`` process on SIGTERM.

In-flight requests - a dry run running in a worker included - finish within
``CKPT_GRACEFUL_SHUTDOWN_S``; new connections are refused at once; the
dry-run workers and their forkserver are gone afterwards (no orphans).  A
dry run that outlives the grace period is cut, and the process still exits.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests._server import LOOPBACK, ServerProcess, forkserver_processes, start_server
from tests.conftest import SLOW_CONFIG

# About 3 s here (measured): a 512-layer build plus a meta forward/backward.
SLOW_DRY_RUN: dict[str, Any] = {
    "model": {"config": SLOW_CONFIG},
    "tier": "full",
    "measure": {"seq_len": 512},
}


def _in_background(call: Callable[[], httpx.Response]) -> tuple[threading.Thread, list[Any]]:
    """Run `call` in a thread; its response (or exception) lands in the returned list."""
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append(call())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def _wait_until_busy(server: ServerProcess, timeout_s: float = 30.0) -> None:
    """Until the worker pool reports a running dry run (the gauge, read from /metrics)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = httpx.get(f"{server.base_url}/metrics", timeout=5).text
        if "ckpt_dry_run_workers_busy 1.0" in text:
            return
        time.sleep(0.02)
    raise AssertionError("the dry run never started")


def _refused(port: int) -> bool:
    try:
        socket.create_connection((LOOPBACK, port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def _wait_refused(port: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _refused(port):
            return True
        time.sleep(0.02)
    return False


def _leftovers(since: float, timeout_s: float = 10.0) -> list[int]:
    """PIDs of forkservers / dry-run workers started since `since` still running after
    `timeout_s` (those orphaned by the dead service included).

    The workers are killed by the app's shutdown; the forkserver exits on its
    own once the service is gone (EOF on its pipe), after 1-2 s of interpreter
    teardown here - hence a wait, not an immediate check.
    """
    deadline = time.monotonic() + timeout_s
    while (left := forkserver_processes(since)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [process.pid for process in left]


@contextmanager
def _running(tmp_path: Path, grace_s: int) -> Iterator[ServerProcess]:
    """A service with one worker; stopped on the way out whatever happened, and then
    (when the test passed) its forkserver and workers checked gone."""
    server = start_server(
        tmp_path / "server.log",
        {"DRY_RUN_WORKERS": "1", "GRACEFUL_SHUTDOWN_S": str(grace_s), "DRY_RUN_TIMEOUT_S": "60"},
    )
    try:
        since = server.started_at()
        # The scan that must come back empty finds the running ones: forkserver + worker.
        assert len(forkserver_processes(since)) >= 2, "expected a forkserver and a dry-run worker"
        yield server
    finally:
        server.stop()
    assert _leftovers(since) == [], "dry-run workers or their forkserver outlived the service"


def test_sigterm_lets_a_running_dry_run_finish_and_refuses_new_connections(
    tmp_path: Path,
) -> None:
    grace_s = 20
    with _running(tmp_path, grace_s) as server:
        thread, outcome = _in_background(
            lambda: httpx.post(f"{server.base_url}/dry-run", json=SLOW_DRY_RUN, timeout=60)
        )
        _wait_until_busy(server)
        server.process.send_signal(signal.SIGTERM)
        sent = time.monotonic()

        assert _wait_refused(server.port), "new connections still accepted after SIGTERM"
        assert thread.is_alive(), "the dry run ended before new connections were refused"
        thread.join(timeout=grace_s)
        [response] = outcome
        assert isinstance(response, httpx.Response), (response, server.log_text()[-4000:])
        assert response.status_code == 200, response.text
        assert response.json()["measured"]["activation_bytes"] > 0

        # uvicorn re-raises the SIGTERM it handled once shutdown is complete.
        assert server.process.wait(timeout=grace_s) in (0, -signal.SIGTERM)
        assert time.monotonic() - sent < grace_s
    assert "Application shutdown complete." in server.log_text()


def test_a_dry_run_past_the_grace_period_is_cut_and_nothing_is_left(tmp_path: Path) -> None:
    grace_s = 1
    with _running(tmp_path, grace_s) as server:
        thread, outcome = _in_background(
            lambda: httpx.post(f"{server.base_url}/dry-run", json=SLOW_DRY_RUN, timeout=60)
        )
        _wait_until_busy(server)
        server.process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        assert server.process.wait(timeout=grace_s + 10) in (0, -signal.SIGTERM)
        # The grace, then the cancelled request and the pool's shutdown: well under 3 s here.
        assert time.monotonic() - sent < grace_s + 3
        thread.join(timeout=10)
        [response] = outcome
        assert isinstance(response, httpx.Response), (response, server.log_text()[-4000:])
        assert response.status_code == 503, response.text
        assert response.json()["error"] == "shutting_down"
        assert response.headers["Retry-After"] == "1"
    assert "timeout graceful shutdown exceeded" in server.log_text()
