"""Dry runs for the service: validate here, look up the cache, else run in the pool.

Everything cheap and everything that bounds the cost - tier, GPU memory,
measurement shape, the config's JSON, size fields and model type - is checked
in the server process BEFORE a worker is involved; only a bounded config
reaches the pool.  What needs transformers' config class (its own checks, the
parameter and expert totals) the worker checks before it builds: 1-2 ms of
pure Python per config, which in this process would hold the GIL against the
event loop at every dry run (``bench/http_load.py``'s saturation run).  Reports are
cached by what determines them: the canonical config key, tier, granularity,
GPU memory, measurement shape and the library versions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Mapping
from dataclasses import fields
from importlib import metadata
from typing import Any, Final

from cachetools import LRUCache
from starlette.concurrency import run_in_threadpool

from ckpt_core import (
    MEASURE_FIELDS,
    ConfigLimits,
    installed_transformers_version,
    make_plan,
    measure_shape,
    model_config_key,
)
from service import worker
from service.errors import DryRunFailedError
from service.jobs import PooledJobs
from service.metrics import Metrics
from service.pool import WorkerPool
from service.settings import Settings


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


# The workers run in this environment: a report depends on these versions.
_LIBRARY_VERSIONS: Final = (_version("torch"), installed_transformers_version())


class DryRunner:
    """The dry-run pool, its report cache and its metrics, for one app."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.limits: ConfigLimits = settings.config_limits
        self.metrics = metrics
        # Touched only on the event loop.
        self.cache: LRUCache[Hashable, dict[str, Any]] = LRUCache(settings.dry_run_cache_size)
        pool = WorkerPool(
            name="dry-run",
            job=worker.run_job,
            warm_up=worker.warm_up,
            size=settings.dry_run_workers,
            queue_limit=settings.dry_run_queue,
            timeout_s=settings.dry_run_timeout_s,
            preload=worker.PRELOAD,
            cpu_priority=settings.dry_run_cpu_priority,
        )
        self.jobs = PooledJobs(
            pool,
            code="dry_run",
            retry_after_s=settings.dry_run_retry_after_s,
            metrics=metrics.dry_runs,
            failed=lambda text: DryRunFailedError(f"the dry run failed: {text}"),
        )

    @property
    def pool(self) -> WorkerPool:
        return self.jobs.pool

    async def start(self) -> None:
        """Start the workers and, in a thread, import what this process's own checks
        need (transformers' table of model types: seconds, once, that would otherwise
        stall the first dry run)."""
        await asyncio.gather(
            run_in_threadpool(model_config_key, worker.WARM_UP_MODEL, limits=self.limits),
            self.jobs.start(),
        )

    async def run(self, request: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """The report for a dry-run request and whether it came from the cache.

        ``request`` holds `ckpt_core.dry_run`'s arguments: model, tier,
        gpu_memory_gb, gpu, transformers_version, measure.
        """
        kwargs = {**request, "limits": self.limits}
        key = await self._validated_key(kwargs)
        cached = self.cache.get(key)
        self.metrics.cache.labels("hit" if cached is not None else "miss").inc()
        if cached is not None:
            return cached, True
        report: dict[str, Any] = await self.jobs.run(kwargs)
        if self.cache.maxsize:
            self.cache[key] = report
        return report, False

    async def _validated_key(self, kwargs: Mapping[str, Any]) -> Hashable:
        """Validate the inputs that bound the cost, without transformers; return the cache key."""
        plan = make_plan(
            kwargs["tier"],
            kwargs.get("gpu_memory_gb"),
            gpu=kwargs.get("gpu"),
            transformers_version=kwargs.get("transformers_version"),
        )
        shape = measure_shape(kwargs.get("measure"))
        measured = (
            tuple(getattr(shape, f.name) for f in fields(shape) if f.name in MEASURE_FIELDS)
            if shape is not None
            else None
        )
        # A thread: the walk is linear in the config, up to `max_config_bytes` nodes.
        key = await run_in_threadpool(model_config_key, kwargs["model"], limits=self.limits)
        return (
            key,
            plan.tier,
            plan.granularity,
            plan.gpu_memory_gb,
            measured,
            plan.transformers_version,
            *_LIBRARY_VERSIONS,
        )
