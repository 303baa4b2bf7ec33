"""Prometheus metrics, one registry per app (several apps in one process never collide)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

# Request latency buckets (s): /resolve answers in well under a millisecond,
# dry runs in tenths of a second to seconds.
_HTTP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_DRY_RUN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    """The service's metrics; labels use route templates (``/dry-run``), never raw paths."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = RequestStats(
            "ckpt_http_requests",
            "HTTP requests answered.",
            "ckpt_http_request_duration_seconds",
            "Time from request start to the end of the response body.",
            _HTTP_BUCKETS,
        )
        self.registry.register(self.requests)
        self.dry_runs = Histogram(
            "ckpt_dry_run_duration_seconds",
            "Dry runs in the worker pool (cache hits excluded), by outcome.",
            ("outcome",),
            buckets=_DRY_RUN_BUCKETS,
            registry=self.registry,
        )
        self.cache = Counter(
            "ckpt_dry_run_cache",
            "Dry-run report cache lookups.",
            ("result",),
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "ckpt_dry_run_queue_depth",
            "Dry runs waiting for a free worker.",
            registry=self.registry,
        )
        self.busy_workers = Gauge(
            "ckpt_dry_run_workers_busy", "Dry-run workers running a job.", registry=self.registry
        )

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.observe(method, route, status, seconds)

    def track_pool(self, queue_depth: Callable[[], float], busy: Callable[[], float]) -> None:
        """Read the pool's gauges at scrape time (always current, no bookkeeping)."""
        self.queue_depth.set_function(queue_depth)
        self.busy_workers.set_function(busy)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _Series:
    """One (method, route, status): requests per latency bucket (not cumulative) and their sum."""

    __slots__ = ("per_bucket", "seconds")

    def __init__(self, buckets: int) -> None:
        self.per_bucket = [0] * buckets
        self.seconds = 0.0


class RequestStats:
    """Requests answered and their latency by (method, route, status), exposed as a
    Prometheus counter and histogram (the samples a `Counter` and a `Histogram`
    with these labels expose, without their ``_created`` series).

    Why not those classes: every `inc` and `observe` takes a lock and scans the
    buckets in Python, ~5 us a request in the server (``bench/asgi_layers.py``),
    to guard values that only the event loop's thread touches: requests are
    recorded by the request middleware and scraped by an ``async`` route, both
    on the loop.  Not thread-safe for that reason: record and collect from one
    thread.
    """

    def __init__(
        self,
        counter: str,
        counter_help: str,
        histogram: str,
        histogram_help: str,
        buckets: tuple[float, ...],
    ) -> None:
        if list(buckets) != sorted(set(buckets)) or math.inf in buckets:
            raise ValueError(f"buckets must be increasing and finite, got {buckets}")
        self._names = (counter, counter_help, histogram, histogram_help)
        self._bounds = tuple(float(b) for b in buckets)
        self._le = [*(floatToGoString(b) for b in self._bounds), "+Inf"]
        self._series: dict[tuple[str, str, int], _Series] = {}

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        series = self._series.get((method, route, status))
        if series is None:
            series = self._series[(method, route, status)] = _Series(len(self._le))
        # bisect_left: the first bound >= seconds, Prometheus's "le"; past the last, +Inf.
        series.per_bucket[bisect.bisect_left(self._bounds, seconds)] += 1
        series.seconds += seconds

    def describe(self) -> list[Metric]:
        """The families' names, so that the registry refuses a duplicate."""
        counter, counter_help, histogram, histogram_help = self._names
        labels = ("method", "route", "status")
        return [
            CounterMetricFamily(counter, counter_help, labels=labels),
            HistogramMetricFamily(histogram, histogram_help, labels=labels),
        ]

    def collect(self) -> Iterator[Metric]:
        counts, latency = self.describe()
        for (method, route, status), series in self._series.items():
            labels = (method, route, str(status))
            cumulative, buckets = 0, []
            for le, count in zip(self._le, series.per_bucket, strict=True):
                cumulative += count
                buckets.append((le, float(cumulative)))
            counts.add_metric(labels, float(cumulative))
            latency.add_metric(labels, buckets, series.seconds)
        yield counts
        yield latency
