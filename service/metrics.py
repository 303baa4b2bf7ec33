"""Prometheus metrics, one registry per app (several apps in one process never collide)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

# No ``*_created`` series: a scrape reads totals, and they double its size.
disable_created_metrics()

# Request latency buckets (s): /resolve answers in well under a millisecond,
# dry runs in tenths of a second to seconds.
_HTTP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_JOB_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_REQUEST_LABELS = ("method", "route", "status")


class _Pool(Protocol):
    @property
    def queue_depth(self) -> int: ...
    @property
    def busy(self) -> int: ...


@dataclass(frozen=True, slots=True)
class PoolMetrics:
    """One worker pool's series: ``ckpt_<pool>_duration_seconds`` by outcome,
    ``ckpt_<pool>_queue_depth`` and ``ckpt_<pool>_workers_busy``."""

    durations: Histogram
    queue_depth: Gauge
    busy: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry, pool: str, jobs: str) -> PoolMetrics:
        return cls(
            Histogram(
                f"ckpt_{pool}_duration_seconds",
                f"{jobs} in the worker pool (cache hits excluded), by outcome.",
                ("outcome",),
                buckets=_JOB_BUCKETS,
                registry=registry,
            ),
            Gauge(
                f"ckpt_{pool}_queue_depth",
                f"{jobs} waiting for a free worker.",
                registry=registry,
            ),
            Gauge(
                f"ckpt_{pool}_workers_busy",
                f"Workers running one of the {jobs.lower()}.",
                registry=registry,
            ),
        )

    def track(self, pool: _Pool) -> None:
        """Read the pool's gauges at scrape time (always current, no bookkeeping)."""
        self.queue_depth.set_function(lambda: pool.queue_depth)
        self.busy.set_function(lambda: pool.busy)


class Metrics:
    """The service's metrics; labels use route templates (``/dry-run``), never raw paths."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "ckpt_http_requests",
            "HTTP requests answered.",
            _REQUEST_LABELS,
            registry=self.registry,
        )
        self.latency = Histogram(
            "ckpt_http_request_duration_seconds",
            "Time from request start to the end of the response body.",
            _REQUEST_LABELS,
            buckets=_HTTP_BUCKETS,
            registry=self.registry,
        )
        # The label children of each (method, route, status): `labels()` looks
        # them up under a lock on every call.  Bounded: routes are templates.
        self._children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        self.dry_runs = PoolMetrics.create(self.registry, "dry_run", "Dry runs")
        self.estimates = PoolMetrics.create(self.registry, "estimate", "Estimates with a model")
        self.cache = Counter(
            "ckpt_dry_run_cache",
            "Dry-run report cache lookups.",
            ("result",),
            registry=self.registry,
        )

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route, status)
        children = self._children.get(key)
        if children is None:
            labels = (method, route, str(status))
            children = self._children[key] = (
                self.requests.labels(*labels),
                self.latency.labels(*labels),
            )
        children[0].inc()
        children[1].observe(seconds)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
