"""The service as it is deployed: ``python -m service`` under uvicorn, on a loopback port."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import READY_TIMEOUT_S, TINY_CONFIG

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """A running service process: (base URL, the process, its stderr log file)."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("uvicorn") / "stderr.log"
    env = {
        **os.environ,
        "CKPT_PORT": str(port),
        "CKPT_DRY_RUN_WORKERS": "1",
        "CKPT_MAX_BODY_BYTES": "65536",
        "HF_HUB_OFFLINE": "1",
    }
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "service"], cwd=REPO, env=env, stdout=log, stderr=log
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base_url, process, log_path)
        yield base_url, process, log_path
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def _wait_ready(base_url: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, f"service exited: {log_path.read_text()}"
        try:
            if httpx.get(f"{base_url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    lines = [line for line in log_path.read_text().splitlines() if "/readyz" not in line]
    pytest.fail(f"service not ready after {READY_TIMEOUT_S} s: " + "\n".join(lines))


def test_resolve_and_dry_run_over_real_http(
    server: tuple[str, subprocess.Popen[bytes], Path],
) -> None:
    base_url, _, _ = server
    with httpx.Client(base_url=base_url, timeout=60) as http:
        plan = http.post(
            "/resolve", json={"tier": "auto", "gpu": "A100-80GB"}, headers={"X-Request-ID": "uv-1"}
        )
        assert plan.status_code == 200 and plan.json()["granularity"] == "medium"
        assert plan.headers["X-Request-ID"] == "uv-1"
        report = http.post("/dry-run", json={"model": {"config": TINY_CONFIG}, "tier": "selective"})
        assert report.status_code == 200, report.text
        assert report.json()["hooked"] == TINY_CONFIG["num_hidden_layers"]
        text = http.get("/describe", params={"tier": "full"}, headers={"Accept": "text/plain"})
        assert text.text == "full (every block)"
        assert "ckpt_http_requests_total" in http.get("/metrics").text


def test_limits_hold_over_real_http(server: tuple[str, subprocess.Popen[bytes], Path]) -> None:
    base_url, _, _ = server

    def chunks() -> Iterator[bytes]:
        yield b'{"tier": "auto", "pad": "'
        for _ in range(10):
            yield b"x" * 16_384
        yield b'"}'

    with httpx.Client(base_url=base_url, timeout=60) as http:
        chunked = http.post(
            "/resolve", content=chunks(), headers={"content-type": "application/json"}
        )
        assert chunked.status_code == 413 and chunked.json()["error"] == "body_too_large"
        nan = http.post(
            "/resolve",
            content=b'{"tier": "auto", "gpu_memory_gb": NaN}',
            headers={"content-type": "application/json"},
        )
        assert nan.status_code == 400 and nan.json()["field"] == "gpu_memory_gb"


def test_sigterm_shuts_down_cleanly_with_json_logs(
    server: tuple[str, subprocess.Popen[bytes], Path],
) -> None:
    base_url, process, log_path = server
    assert httpx.get(f"{base_url}/healthz", timeout=10).status_code == 200
    process.send_signal(signal.SIGTERM)
    # uvicorn re-raises the signal it handled once shutdown is complete.
    assert process.wait(timeout=60) in (0, -signal.SIGTERM)
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    assert any(entry["message"] == "Application shutdown complete." for entry in lines)
    assert any(entry.get("route") == "/resolve" and entry.get("status") == 200 for entry in lines)
    assert any(entry["logger"].startswith("uvicorn") for entry in lines)
    assert all({"ts", "level", "logger", "message"} <= set(entry) for entry in lines)
