#!/usr/bin/env python3
"""Soak test: mixed traffic against a real ``python -m service`` for a fixed time, then a verdict.

Usage: .venv/bin/python scripts/soak.py [--duration 300] [--warmup 20] [--concurrency 8]
                                        [--max-requests 2000000] [--json result.json]

Bounded by construction: it starts its own server on a loopback port
(nothing else is contacted), sends at most --max-requests requests for at
most --duration seconds after a --warmup, then stops the server and exits.
Traffic: /resolve (plain and with a model estimate), /describe (JSON and
text), /presets, dry runs that hit the report cache and dry runs that miss
it (a new tiny config each time), and a share of bad requests (invalid
values, malformed JSON, wrong content type, configs over the bounds).

Prints the 5xx and 429 counts, latency percentiles and the server's RSS at
the end of the warm-up and at the end; exits 1 unless there was no 5xx, no
transport error and RSS grew less than 10%.  tests/test_soak.py runs 30 s.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests._server import ServerProcess, start_server  # noqa: E402

MAX_RSS_GROWTH = 0.10
_TINY = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 128,
}
# Dry runs the cache answers after their first miss.
_CACHED = [{**_TINY, "num_hidden_layers": layers} for layers in (1, 2, 3, 4)]
_JSON = {"content-type": "application/json"}
_TEXT = {"accept": "text/plain"}


@dataclass(frozen=True)
class Request:
    kind: str
    method: str
    path: str
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)


def _post(kind: str, path: str, value: Any) -> Request:
    return Request(kind, "POST", path, json.dumps(value).encode(), _JSON)


_misses = itertools.count()


def _dry_run_miss() -> Request:
    """A config never sent before (a vocabulary size of its own): a cache miss."""
    config = {**_TINY, "vocab_size": 128 + next(_misses)}
    return _post("dry-run miss", "/dry-run", {"model": {"config": config}, "tier": "selective"})


# (weight, request maker): about 15% of the traffic is bad requests.
_MIX: list[tuple[int, Callable[[], Request]]] = [
    (25, lambda: _post("resolve", "/resolve", {"tier": "auto", "gpu": "A100-80GB"})),
    (
        10,
        lambda: _post(
            "resolve estimate",
            "/resolve",
            {
                "tier": "auto",
                "gpu": "H100-80GB",
                "model": {"preset": random.choice(["llama-3.1-8b", "qwen2.5-7b", "gpt2"])},
                "workload": {"seq_len": random.choice([1024, 4096]), "method": "lora"},
            },
        ),
    ),
    (10, lambda: Request("describe", "GET", "/describe?tier=auto&gpu_memory_gb=40")),
    (
        5,
        lambda: Request(
            "describe text", "GET", "/describe?tier=full", None, {"accept": "text/plain"}
        ),
    ),
    (5, lambda: Request("presets", "GET", "/presets")),
    (
        20,
        lambda: _post(
            "dry-run hit", "/dry-run", {"model": {"config": random.choice(_CACHED)}, "tier": "full"}
        ),
    ),
    (5, _dry_run_miss),
    (4, lambda: _post("bad tier", "/resolve", {"tier": "fulll"})),
    (3, lambda: Request("malformed JSON", "POST", "/resolve", b'{"tier": NaN', _JSON)),
    (
        3,
        lambda: Request(
            "wrong content type", "POST", "/resolve", b"tier=full", {"content-type": "text/plain"}
        ),
    ),
    (
        3,
        lambda: _post(
            "config too large",
            "/dry-run",
            {"model": {"config": {**_TINY, "num_hidden_layers": 10**6}}, "tier": "full"},
        ),
    ),
    (2, lambda: _post("unknown preset", "/dry-run", {"model": {"preset": "nope"}, "tier": "full"})),
]
_WEIGHTS = [weight for weight, _ in _MIX]
_MAKERS = [maker for _, maker in _MIX]


@dataclass
class Tally:
    """What the clients saw after the warm-up."""

    statuses: Counter[int] = field(default_factory=Counter)
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    transport_errors: Counter[str] = field(default_factory=Counter)

    def record(self, kind: str, status: int, seconds: float) -> None:
        self.statuses[status] += 1
        self.latencies[kind].append(seconds)


async def _client_loop(
    client: httpx.AsyncClient, until: float, budget: itertools.count, limit: int, tally: Tally
) -> None:
    while time.monotonic() < until and next(budget) < limit:
        request = random.choices(_MAKERS, _WEIGHTS)[0]()
        started = time.perf_counter()
        try:
            response = await client.request(
                request.method, request.path, content=request.body, headers=request.headers
            )
        except httpx.TransportError as exc:
            tally.transport_errors[type(exc).__name__] += 1
            continue
        tally.record(request.kind, response.status_code, time.perf_counter() - started)


async def _traffic(base_url: str, seconds: float, concurrency: int, limit: int) -> Tally:
    tally = Tally()
    budget = itertools.count()
    until = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as client:
        await asyncio.gather(
            *(_client_loop(client, until, budget, limit, tally) for _ in range(concurrency))
        )
    return tally


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _latency_ms(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(statistics.median(values) * 1000, 2),
        "p99": round(_percentile(values, 0.99) * 1000, 2),
        "max": round(max(values) * 1000, 2),
    }


def _workers_rss(server: ServerProcess) -> int:
    return sum(process.memory_info().rss for process in server.descendants())


def run(duration_s: float, warmup_s: float, concurrency: int, max_requests: int) -> dict[str, Any]:
    """Start a server, warm it up, soak it, stop it; the figures as a dict."""
    with tempfile.TemporaryDirectory(prefix="ckpt-soak-") as tmp:
        server = start_server(
            Path(tmp) / "server.log", {"DRY_RUN_WORKERS": "1", "LOG_LEVEL": "warning"}
        )
        try:
            asyncio.run(_traffic(server.base_url, warmup_s, concurrency, max_requests))
            rss_start, workers_start = server.rss_bytes(), _workers_rss(server)
            started = time.monotonic()
            tally = asyncio.run(_traffic(server.base_url, duration_s, concurrency, max_requests))
            elapsed = time.monotonic() - started
            rss_end, workers_end = server.rss_bytes(), _workers_rss(server)
        finally:
            exit_status = server.stop()
    every = [seconds for values in tally.latencies.values() for seconds in values]
    total = len(every)
    return {
        "duration_s": round(elapsed, 1),
        "requests": total,
        "requests_per_s": round(total / elapsed, 1),
        "statuses": dict(sorted(tally.statuses.items())),
        "5xx": sum(n for status, n in tally.statuses.items() if status >= 500),
        "429": tally.statuses[429],
        "transport_errors": dict(tally.transport_errors),
        "latency_ms": _latency_ms(every) if every else {},
        "latency_ms_by_kind": {k: _latency_ms(v) for k, v in sorted(tally.latencies.items())},
        "rss_start_mib": round(rss_start / 2**20, 1),
        "rss_end_mib": round(rss_end / 2**20, 1),
        "rss_growth": round(rss_end / rss_start - 1, 4),
        "workers_rss_start_mib": round(workers_start / 2**20, 1),
        "workers_rss_end_mib": round(workers_end / 2**20, 1),
        "server_exit_status": exit_status,
    }


def _passed(result: dict[str, Any]) -> bool:
    return (
        result["5xx"] == 0
        and not result["transport_errors"]
        and result["rss_growth"] < MAX_RSS_GROWTH
    )


def _print(result: dict[str, Any]) -> None:
    latency = result["latency_ms"]
    print(
        f"{result['requests']} requests in {result['duration_s']} s ({result['requests_per_s']}/s)"
    )
    print(f"statuses {result['statuses']}; 5xx {result['5xx']}; 429 {result['429']}")
    print(f"transport errors {result['transport_errors'] or 0}")
    print(f"latency ms: p50 {latency['p50']}, p99 {latency['p99']}, max {latency['max']}")
    for kind, figures in result["latency_ms_by_kind"].items():
        print(f"  {kind:20s} p50 {figures['p50']:8.2f}  p99 {figures['p99']:8.2f}")
    print(
        f"server RSS {result['rss_start_mib']} -> {result['rss_end_mib']} MiB "
        f"({result['rss_growth']:+.2%}); dry-run workers {result['workers_rss_start_mib']} -> "
        f"{result['workers_rss_end_mib']} MiB"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=300.0, help="seconds measured")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds before measuring")
    parser.add_argument("--concurrency", type=int, default=8, help="clients in parallel")
    parser.add_argument("--max-requests", type=int, default=2_000_000, help="per phase")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if not (0 < args.duration <= 3600 and 0 <= args.warmup <= 600 and 1 <= args.concurrency <= 64):
        parser.error("bounds: 0 < --duration <= 3600, 0 <= --warmup <= 600, 1..64 clients")
    result = run(args.duration, args.warmup, args.concurrency, args.max_requests)
    _print(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    verdict = _passed(result)
    print("PASS" if verdict else "FAIL", f"(0 5xx and RSS growth < {MAX_RSS_GROWTH:.0%} wanted)")
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
