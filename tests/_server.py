"""A real service process for tests and scripts: ``python -m service`` on a loopback port.

Used where the TestClient is not enough: slow clients, RSS, signals, worker
processes, the network guard.  `start_server` returns once ``/readyz`` is 200
(the dry-run workers warm); `ServerProcess.stop` sends SIGTERM, then SIGKILL
if the process outlives its grace.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 120.0
LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerProcess:
    """A started service: its URL, process and log file."""

    base_url: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    def rss_bytes(self) -> int:
        """Resident memory of the server process itself (not its dry-run workers)."""
        return int(psutil.Process(self.process.pid).memory_info().rss)

    def descendants(self) -> list[psutil.Process]:
        """The forkserver and the dry-run workers (every process below the server)."""
        return psutil.Process(self.process.pid).children(recursive=True)

    def started_at(self) -> float:
        """The process's start time (seconds since the epoch)."""
        return float(psutil.Process(self.process.pid).create_time())

    def log_text(self) -> str:
        return self.log_path.read_text("utf-8", errors="replace")

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, wait up to `timeout_s`, then SIGKILL; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait(timeout=30)


def forkserver_processes(since: float) -> list[psutil.Process]:
    """Running multiprocessing forkservers and their workers started at or after `since`.

    Found by command line (a forkserver's children share it), so workers
    orphaned by a dead service are found too, whoever adopted them; those of
    this process (the test session's own apps) are left out.
    """
    ours = set()  # this process's own forkserver (the in-process apps') and its workers
    for child in psutil.Process().children():
        if _is_forkserver(child):
            ours |= {child.pid, *(worker.pid for worker in child.children())}
    found = []
    for process in psutil.process_iter(["create_time", "status"]):
        info = process.info
        if (
            process.pid not in ours
            and info["status"] != psutil.STATUS_ZOMBIE
            and (info["create_time"] or 0) >= since
            and _is_forkserver(process)
        ):
            found.append(process)
    return found


def _is_forkserver(process: psutil.Process) -> bool:
    try:
        return any("multiprocessing.forkserver" in part for part in process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def start_server(
    log_path: Path, settings: dict[str, str] | None = None, extra_env: dict[str, str] | None = None
) -> ServerProcess:
    """Start ``python -m service`` with these ``CKPT_*`` settings; return once it is ready.

    `settings` are setting names without the prefix (``{"DRY_RUN_WORKERS": "1"}``);
    `extra_env` is any other environment (``PYTHONPATH`` for a shim).  The
    host is always loopback.  On failure the process is killed and its log is
    in the error.
    """
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.upper().startswith("CKPT_")},
        "HF_HUB_OFFLINE": "1",
        "CKPT_HOST": LOOPBACK,
        "CKPT_PORT": str(port),
        **{f"CKPT_{name}": value for name, value in (settings or {}).items()},
        **(extra_env or {}),
    }
    log: IO[bytes]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "service"], cwd=REPO, env=env, stdout=log, stderr=log
        )
    server = ServerProcess(f"http://{LOOPBACK}:{port}", port, process, log_path)
    try:
        _wait_ready(server)
    except BaseException:
        process.kill()
        process.wait(timeout=30)
        raise
    return server


def _wait_ready(server: ServerProcess) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"service exited {server.process.returncode}: {server.log_text()}")
        try:
            if httpx.get(f"{server.base_url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"service not ready after {READY_TIMEOUT_S} s: {server.log_text()[-4000:]}")
