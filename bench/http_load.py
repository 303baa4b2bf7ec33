"""HTTP requests/s and latency of the service next to a bare FastAPI endpoint, under wrk.

Run: ``.venv/bin/python -m bench.http_load`` (needs ``apt-get install -y wrk``);
``--duration`` seconds per wrk run (2), ``--rounds`` (5), ``--concurrency``
(1 8 32 64), ``--part`` (all, matrix or saturation), ``--no-pin``.

One server process (``bench/_http_server.py``) serves the service, configured
as ``python -m service`` configures it (``CKPT_*`` settings, JSON access log
to a temporary file), and a bare FastAPI app of the same request and answer
shapes on a second port of the same event loop.  wrk (see ``bench/_wrk.py``
for why) drives one endpoint at a time over loopback, at each concurrency,
for a bounded time; the endpoints take turns within a round so drift on this
shared machine hits all of them alike, and the tables show the median over
rounds.  Ratios compare ``POST /resolve`` (no model) with the bare POST and
``GET /describe`` with the bare GET.  ``POST /resolve`` with a model runs
twice: the same body on every request (``same``: answered from the service's
cache after the first) and a new sequence length on every request (``new``:
the estimate computed each time, in the estimate worker pool: what it measures
is the pool's throughput, and beyond its queue the 429s are counted as
errors).  After every run the script waits until the worker pools are idle
(`settle`), so that queued estimates do not run on into the next run.

Pinning, for the service-vs-bare part (default, on a machine with 2 CPUs or
more; ``--no-pin`` leaves placement to the OS): the threads of the server
process (the event loop and its request threads) are bound to the first
CPU, everything else (the pool's fork server and idle workers, this script
and so wrk) to the others - as a client on another machine in production.
Unpinned, wrk and the server migrate onto each other's CPU, and a 2-second
round at 1 connection swung from ~1,200 to ~3,000 req/s for the same
endpoint (pinned: ~1,600 to ~2,800 for the bare POST, ~2,200 to ~2,600 for
``/resolve``).  The saturation part always runs unpinned: on 2 CPUs a busy
dry-run worker must share a CPU either with the server (its busy p99 at 1
connection then ~3 ms, idle ~0.7 to 1.5) or with wrk (whose own wake-ups
then set the p99), where in production the workers have cores of their own.

The saturation run then measures ``POST /resolve`` twice per round: idle,
then while every dry-run worker is kept busy - distinct 70B-class inline
configs (cache misses), one more in flight than there are workers, so one
always waits in the queue.  Its p99 ratio is the median over rounds of busy
p99 / idle p99 (each pair back to back).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from bench._common import ROOT, bench_env, free_port, median, stop, table, wait_for_status
from bench._dry_run_load import DryRunLoad, summarize
from bench._wrk import COUNTER, Result, require_wrk, run_wrk

NO_MODEL = json.dumps({"tier": "auto", "gpu": "A100-80GB"})
MODEL = {"tier": "auto", "gpu": "A100-80GB", "model": {"preset": "llama-3.1-8b"}}
WITH_MODEL = json.dumps({**MODEL, "workload": {"seq_len": 4096, "method": "lora"}})
# Every request a new sequence length: the estimate is computed, never cached.
NEW_MODEL_REQUESTS = json.dumps({**MODEL, "workload": {"seq_len": 0, "method": "lora"}}).replace(
    '"seq_len": 0', f'"seq_len": {COUNTER}'
)
DESCRIBE_QUERY = "?tier=auto&gpu=A100-80GB"
READY_TIMEOUT_S = 180.0


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str
    bare: bool  # served by the bare app's port
    path: str
    body: str | None = None


BARE_POST = Endpoint("bare POST", True, "/bare/resolve", NO_MODEL)
RESOLVE = Endpoint("POST /resolve", False, "/resolve", NO_MODEL)
BARE_GET = Endpoint("bare GET", True, "/bare/describe" + DESCRIBE_QUERY)
DESCRIBE = Endpoint("GET /describe", False, "/describe" + DESCRIBE_QUERY)
RESOLVE_MODEL = Endpoint("POST /resolve + model, same", False, "/resolve", WITH_MODEL)
RESOLVE_NEW_MODEL = Endpoint("POST /resolve + model, new", False, "/resolve", NEW_MODEL_REQUESTS)
ENDPOINTS = (BARE_POST, RESOLVE, BARE_GET, DESCRIBE, RESOLVE_MODEL, RESOLVE_NEW_MODEL)

Runs = dict[tuple[str, int], list[Result]]


class Server:
    """The benchmark server process and the URLs of its two apps."""

    def __init__(self, log_path: Path) -> None:
        self.service_port, self.bare_port = free_port(), free_port()
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench._http_server",
                    str(self.service_port),
                    str(self.bare_port),
                ],
                cwd=ROOT,
                env=bench_env(),
                stdout=log,
                stderr=log,
            )

    def url(self, endpoint: Endpoint) -> str:
        port = self.bare_port if endpoint.bare else self.service_port
        return f"http://127.0.0.1:{port}{endpoint.path}"

    @property
    def service_url(self) -> str:
        return f"http://127.0.0.1:{self.service_port}"

    def place(self, pinned: bool) -> str:
        """Pinned: the server's threads alone on the first CPU, all else on the
        others.  Not: every process free on every CPU.  Says which."""
        cpus = set(os.sched_getaffinity(0)) | set(os.sched_getaffinity(self.process.pid))
        first, others = min(cpus), cpus - {min(cpus)}
        if not (pinned and others):
            server_cpus = rest = cpus
            where = f"not pinned ({len(cpus)} CPUs)"
        else:
            server_cpus, rest = {first}, others
            where = f"server's threads on CPU {first}, all else on CPU {sorted(others)}"
        # New threads and processes inherit their creator's binding, so the
        # server's later threads and the fork server's later workers follow.
        _bind(self.process.pid, server_cpus)
        for child in _descendants(self.process.pid):  # fork server, workers
            _bind(child, rest)
        os.sched_setaffinity(0, rest)  # wrk and the dry-run clients start from here
        return where


def _bind(pid: int, cpus: set[int]) -> None:
    """Bind every thread of process `pid` to `cpus`."""
    for thread in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.sched_setaffinity(int(thread.name), cpus)


def _descendants(pid: int) -> list[int]:
    """The processes below `pid`, from each one's parent in ``/proc/PID/stat``."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # a process that just ended
                # The command name (in parentheses) may hold spaces: split after it.
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                parents[int(entry.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, ppid in parents.items() if ppid == parent]
        found += children
        frontier += children
    return found


def measure(server: Server, endpoint: Endpoint, connections: int, seconds: float) -> Result:
    result = run_wrk(
        server.url(endpoint), connections=connections, seconds=seconds, body=endpoint.body
    )
    if result.non_2xx or result.socket_errors:
        print(
            f"  ! {endpoint.name} c={connections}: {result.non_2xx} non-2xx, "
            f"{result.socket_errors} socket errors",
            flush=True,
        )
    return result


# The worker pools' gauges that say the service has work left in the background.
_POOL_GAUGES = tuple(
    f"ckpt_{pool}_{gauge}"
    for pool in ("estimate", "dry_run")
    for gauge in ("workers_busy", "queue_depth")
)


def settle(server: Server, timeout_s: float = 120.0) -> None:
    """Wait until the worker pools are idle: estimates queued by a round (``+ model,
    new``) would otherwise run on into the next one and take CPU from it."""
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{server.service_url}/metrics", timeout=10) as response:
            lines = response.read().decode().splitlines()
        values = [float(line.split()[-1]) for line in lines if line.startswith(_POOL_GAUGES)]
        if not any(values):
            return
        time.sleep(0.1)
    raise RuntimeError(f"the service's worker pools were still busy after {timeout_s:g} s")


def warm_up(server: Server, endpoints: tuple[Endpoint, ...]) -> None:
    """One second each: first-use imports (a model family's config code) happen here."""
    for endpoint in endpoints:
        measure(server, endpoint, 8, 1)
        settle(server)


def run_matrix(
    server: Server, endpoints: tuple[Endpoint, ...], concurrency: list[int], rounds: int, s: float
) -> Runs:
    runs: Runs = defaultdict(list)
    for connections in concurrency:
        for round_number in range(rounds):
            for endpoint in endpoints:
                result = measure(server, endpoint, connections, s)
                settle(server)
                runs[endpoint.name, connections].append(result)
                print(
                    f"  c={connections:<3} round {round_number + 1}/{rounds} {endpoint.name:22} "
                    f"{result.rps:8.0f} req/s  p50 {result.p50_ms:6.2f} ms  "
                    f"p99 {result.p99_ms:6.2f} ms",
                    flush=True,
                )
    return runs


def _medians(results: list[Result]) -> tuple[float, float, float]:
    return (
        median([r.rps for r in results]),
        median([r.p50_ms for r in results]),
        median([r.p99_ms for r in results]),
    )


def _paired(ours: list[Result], base: list[Result]) -> tuple[float, float]:
    """Median over rounds of (req/s ratio, p99 ratio), each round's two runs back to back."""
    pairs = list(zip(ours, base, strict=True))
    return (
        median([a.rps / b.rps for a, b in pairs]),
        median([a.p99_ms / b.p99_ms for a, b in pairs]),
    )


def throughput_table(runs: Runs, endpoints: tuple[Endpoint, ...], concurrency: list[int]) -> str:
    rows = []
    for endpoint in endpoints:
        for connections in concurrency:
            rps, p50, p99 = _medians(runs[endpoint.name, connections])
            errors = sum(r.non_2xx + r.socket_errors for r in runs[endpoint.name, connections])
            rows.append([endpoint.name, connections, rps, p50, p99, errors])
    return table(["endpoint", "conc.", "req/s", "p50 ms", "p99 ms", "errors"], rows)


def ratio_table(runs: Runs, concurrency: list[int]) -> tuple[str, bool]:
    """Service vs bare per concurrency; the targets: req/s >= 0.8x, p99 <= 1.5x."""
    rows, all_met = [], True
    for ours, bare in ((RESOLVE, BARE_POST), (DESCRIBE, BARE_GET)):
        for connections in concurrency:
            rps_ratio, p99_ratio = _paired(
                runs[ours.name, connections], runs[bare.name, connections]
            )
            met = rps_ratio >= RPS_TARGET and p99_ratio <= 1.5
            all_met &= met
            rows.append(
                [f"{ours.name} / {bare.name}", connections, rps_ratio, p99_ratio, _yes(met)]
            )
    headers = ["pair", "conc.", f"req/s ratio (>= {RPS_TARGET})", "p99 ratio (<= 1.5)", "met"]
    return table(headers, rows), all_met


def run_saturation(
    server: Server, concurrency: list[int], rounds: int, s: float
) -> tuple[Runs, list[DryRunLoad]]:
    """Per round: /resolve idle, then /resolve while dry runs keep the pool busy."""
    runs: Runs = defaultdict(list)
    loads = []
    for connections in concurrency:
        for round_number in range(rounds):
            idle = measure(server, RESOLVE, connections, s)
            with DryRunLoad(server.service_url) as load:
                load.wait_busy()
                busy = measure(server, RESOLVE, connections, s)
            loads.append(load)
            runs["idle", connections].append(idle)
            runs["busy", connections].append(busy)
            print(
                f"  c={connections:<3} round {round_number + 1}/{rounds} /resolve idle "
                f"{idle.rps:6.0f} req/s p99 {idle.p99_ms:6.2f} ms | busy {busy.rps:6.0f} req/s "
                f"p99 {busy.p99_ms:6.2f} ms",
                flush=True,
            )
    return runs, loads


def saturation_table(runs: Runs, concurrency: list[int]) -> tuple[str, bool]:
    rows, all_met = [], True
    for connections in concurrency:
        idle, busy = runs["idle", connections], runs["busy", connections]
        _, p99_ratio = _paired(busy, idle)
        met = p99_ratio <= 1.5
        all_met &= met
        rows.append(
            [
                connections,
                _medians(idle)[0],
                _medians(busy)[0],
                _medians(idle)[2],
                _medians(busy)[2],
                p99_ratio,
                _yes(met),
            ]
        )
    headers = [
        "conc.",
        "idle req/s",
        "busy req/s",
        "idle p99 ms",
        "busy p99 ms",
        "p99 ratio (<= 1.5)",
        "met",
    ]
    return table(headers, rows), all_met


def _yes(met: bool) -> str:
    return "yes" if met else "NO"


# The service on public APIs only (its access log through `logging`) against a
# bare FastAPI app: at least 0.8x the requests per second.
RPS_TARGET = 0.8


def _verdict(met: bool | None) -> str:
    return "not run" if met is None else _yes(met)


def _load() -> str:
    """The 1, 5 and 15 minute load averages: how busy the machine was around the run."""
    return " / ".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--part", choices=("all", "matrix", "saturation"), default="all")
    parser.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="service vs bare: leave CPU placement to the OS",
    )
    args = parser.parse_args()
    require_wrk()
    with tempfile.TemporaryDirectory() as folder:
        server = Server(Path(folder) / "server.log")
        try:
            ready_s = wait_for_status(
                server.service_url + "/readyz", server.process, READY_TIMEOUT_S
            )
            print(f"server ready in {ready_s:.1f} s; load average {_load()}", flush=True)
            warm_up(server, ENDPOINTS)
            _report(server, args)
        finally:
            stop(server.process)


def _report(server: Server, args: argparse.Namespace) -> None:
    started = time.perf_counter()
    ratios_met = saturation_met = None
    if args.part in ("all", "matrix"):
        print(f"service vs bare: {server.place(args.pin)}", flush=True)
        idle = run_matrix(server, ENDPOINTS, args.concurrency, args.rounds, args.duration)
        print("\n## Requests/s and latency (median of rounds)\n")
        print(throughput_table(idle, ENDPOINTS, args.concurrency))
        ratios, ratios_met = ratio_table(idle, args.concurrency)
        print("\n## Service vs bare FastAPI (same process, same loop)\n")
        print(ratios)
    if args.part in ("all", "saturation"):
        print(f"under dry-run load: {server.place(False)}", flush=True)
        runs, loads = run_saturation(server, args.concurrency, args.rounds, args.duration)
        print("\n## POST /resolve while dry runs saturate their pool\n")
        text, saturation_met = saturation_table(runs, args.concurrency)
        print(f"{text}\n\n{summarize(loads)}")
    print(
        f"\ntargets: service vs bare {_verdict(ratios_met)}; under dry-run load "
        f"{_verdict(saturation_met)} ({time.perf_counter() - started:.0f} s of measurement; "
        f"load average {_load()})"
    )


if __name__ == "__main__":
    main()
