"""Background dry-run load that keeps every worker of the service's pool busy.

`workers + 1` client threads post distinct 70B-class inline configs (the
vocabulary size differs per request, so every one is a cache miss and a real
build on meta): each worker always has a job, and one more waits in the
queue, so a worker never idles between jobs.  Blocking ``http.client`` in
threads is enough here: a handful of requests a second, each waiting seconds.
"""

from __future__ import annotations

import http.client
import itertools
import json
import threading
import time
from types import TracebackType
from urllib.parse import urlsplit

from bench._common import median

# Llama-3.1-70B's shape: a build on meta takes around a second here.
BIG_LLAMA = {
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
}
BUSY_TIMEOUT_S = 120.0
# One counter for the whole run: a config is never requested twice, even by
# two loads, so the service's report cache never answers.
_SERIAL = itertools.count()


class DryRunLoad:
    """A context manager: dry runs posted back to back until it exits."""

    def __init__(self, base_url: str, workers: int | None = None) -> None:
        if workers is None:
            from service.settings import Settings

            workers = Settings().dry_run_workers
        parts = urlsplit(base_url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.clients = workers + 1
        self.workers = workers
        self._stop = threading.Event()
        self._lock = threading.Lock()
        # (finished at, status, elapsed_ms of the report or None)
        self.finished: list[tuple[float, int, float | None]] = []
        self._threads = [
            threading.Thread(target=self._client, daemon=True) for _ in range(self.clients)
        ]
        self.window: tuple[float, float] | None = None

    def __enter__(self) -> DryRunLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.window is not None:
            self.window = (self.window[0], time.perf_counter())
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=BUSY_TIMEOUT_S)

    def wait_busy(self) -> None:
        """Return once a first dry run has finished: from then on the pool runs back to back."""
        deadline = time.perf_counter() + BUSY_TIMEOUT_S
        while not self.finished:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"no dry run finished within {BUSY_TIMEOUT_S:g} s")
            time.sleep(0.05)
        self.window = (time.perf_counter(), time.perf_counter())

    def _body(self) -> str:
        config = {**BIG_LLAMA, "vocab_size": BIG_LLAMA["vocab_size"] + next(_SERIAL)}
        return json.dumps({"tier": "selective", "model": {"config": config}})

    def _client(self) -> None:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=BUSY_TIMEOUT_S)
        headers = {"Content-Type": "application/json"}
        while not self._stop.is_set():
            connection.request("POST", "/dry-run", body=self._body(), headers=headers)
            response = connection.getresponse()
            payload = response.read()
            built = response.status == 200 and response.getheader("X-Cache") == "miss"
            elapsed = json.loads(payload)["elapsed_ms"] if built else None
            with self._lock:
                self.finished.append((time.perf_counter(), response.status, elapsed))
        connection.close()


def summarize(loads: list[DryRunLoad]) -> str:
    """Dry runs finished while /resolve was measured, and how busy that kept the pool."""
    inside = [
        item
        for load in loads
        if load.window is not None
        for item in load.finished
        if load.window[0] <= item[0] <= load.window[1]
    ]
    seconds = sum(load.window[1] - load.window[0] for load in loads if load.window is not None)
    if not seconds:
        return "dry-run load: never busy"
    statuses = sorted({status for _, status, _ in inside})
    counts = ", ".join(
        f"{status}: {sum(1 for _, s, _ in inside if s == status)}" for status in statuses
    )
    elapsed = [ms for _, _, ms in inside if ms is not None]
    workers = loads[0].workers
    busy = sum(elapsed) / 1000 / seconds / workers
    typical = f"median {median(elapsed):.0f} ms each" if elapsed else "none finished"
    return (
        f"dry-run load: {loads[0].clients} clients, {workers} worker(s); {len(inside)} dry runs "
        f"finished in {seconds:.0f} s of measurement ({counts}), {typical}; workers busy "
        f"~{busy:.0%} of that time (sum of the reports' elapsed_ms)"
    )
