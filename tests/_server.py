"""A real service process for tests and scripts: ``python -m service`` on a loopback port.

Used where the TestClient is not enough: slow clients, RSS, signals, worker
processes, the network guard.  `start_server` returns once ``/readyz`` is 200
(the dry-run workers warm); `ServerProcess.stop` sends SIGTERM, then SIGKILL
if the process outlives its grace.  `raw_exchange` talks to it over a plain
socket, for clients httpx will not imitate.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

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
    """A forkserver (or its worker) of a service started from this checkout.

    The working directory tells this checkout's servers from those of another
    checkout whose tests run on the same machine at the same time.
    """
    try:
        return process.cwd() == str(REPO) and any(
            "multiprocessing.forkserver" in part for part in process.cmdline()
        )
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


@dataclass
class RawAnswer:
    status: int
    headers: dict[str, str]
    body: dict[str, Any]
    seconds: float  # from the first byte sent to the whole answer received
    closed: bool  # the server closed the connection within answer_within_s of it


def raw_exchange(
    port: int, head: bytes, chunks: Iterator[bytes], answer_within_s: float = 1.0
) -> RawAnswer:
    """Send `head`, then `chunks` from a background thread while reading the answer.

    For clients httpx will not imitate: one that trickles its body, or keeps
    uploading after the server has answered.
    """
    sock = socket.create_connection((LOOPBACK, port), timeout=10)
    started = time.monotonic()
    sock.sendall(head)
    stop = threading.Event()

    def feed() -> None:
        for chunk in chunks:
            if stop.is_set():
                return
            try:
                sock.sendall(chunk)
            except OSError:  # the server answered and closed: expected
                return

    threading.Thread(target=feed, daemon=True).start()
    try:
        received = b""
        while b"\r\n\r\n" not in received:
            received += _receive(sock)
        head_text, _, body = received.partition(b"\r\n\r\n")
        lines = head_text.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        while len(body) < int(headers["content-length"]):
            body += _receive(sock)
        seconds = time.monotonic() - started
        sock.settimeout(answer_within_s)
        try:
            closed = sock.recv(1) == b""
        except ConnectionResetError:
            closed = True  # closed with our unread upload in its buffer
        except TimeoutError:
            closed = False
    finally:
        stop.set()
        sock.close()
    return RawAnswer(int(lines[0].split(" ", 2)[1]), headers, json.loads(body), seconds, closed)


def _receive(sock: socket.socket) -> bytes:
    chunk = sock.recv(65536)
    if not chunk:
        raise ConnectionError("the server closed the connection before a whole answer")
    return chunk
