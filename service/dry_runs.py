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
import gc
import logging
import time
from collections.abc import Hashable, Mapping
from dataclasses import fields
from importlib import metadata
from typing import Any, Final

from cachetools import LRUCache
from starlette.concurrency import run_in_threadpool

from ckpt_core import (
    MEASURE_FIELDS,
    CkptError,
    ConfigLimits,
    installed_transformers_version,
    load_model_config,
    make_plan,
    measure_shape,
    model_config_key,
)
from service import worker
from service.errors import (
    DryRunBusyError,
    DryRunCrashedError,
    DryRunFailedError,
    DryRunTimeoutError,
    DryRunUnavailableError,
)
from service.metrics import Metrics
from service.pool import JobTimeoutError, PoolBusyError, WorkerCrashedError, WorkerPool
from service.settings import Settings

log = logging.getLogger(__name__)


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
        self.retry_after_s = settings.dry_run_retry_after_s
        self.metrics = metrics
        # Touched only on the event loop.
        self.cache: LRUCache[Hashable, dict[str, Any]] = LRUCache(settings.dry_run_cache_size)
        self.pool = WorkerPool(
            job=worker.run_job,
            warm_up=worker.warm_up,
            size=settings.dry_run_workers,
            queue_limit=settings.dry_run_queue,
            timeout_s=settings.dry_run_timeout_s,
            preload=worker.PRELOAD,
            cpu_priority=settings.dry_run_cpu_priority,
        )
        metrics.track_pool(lambda: self.pool.queue_depth, lambda: self.pool.busy)
        self._started = False

    @property
    def ready(self) -> bool:
        """`start` has finished and the pool is up."""
        return self._started and self.pool.ready

    async def start(self) -> None:
        """Warm up the workers and, in a thread, this process's config validation.

        Then freeze the heap: validation imported transformers and torch, some
        380k objects that live as long as the process, and a full garbage
        collection over them takes ~150 ms here - a stall of the event loop
        that showed as the p99 of ``/resolve``.  Frozen objects are never
        scanned again; what is allocated later is collected as usual.
        """
        await asyncio.gather(
            run_in_threadpool(load_model_config, worker.WARM_UP_MODEL, limits=self.limits),
            self.pool.start(),
        )
        gc.collect()  # garbage now is not frozen for good
        gc.freeze()
        self._started = True

    async def close(self) -> None:
        await self.pool.close()
        gc.unfreeze()  # several apps in one process (tests): let the heap be collected

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
        report = await self._run_in_pool(kwargs)
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

    async def _run_in_pool(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            result = await self.pool.run(kwargs)
        except PoolBusyError as exc:
            raise DryRunBusyError(
                f"{exc}; retry in {self.retry_after_s} s",
                headers={"Retry-After": str(self.retry_after_s)},
            ) from None
        except JobTimeoutError as exc:
            self._observe("timeout", started)
            raise DryRunTimeoutError(f"{exc}; the service is unaffected") from None
        except WorkerCrashedError as exc:
            self._observe("crashed", started)
            raise DryRunCrashedError(f"{exc}; it is being replaced, retry") from None
        self._observe("ok" if "report" in result else next(iter(result)), started)
        return _unwrap(result)

    def _observe(self, outcome: str, started: float) -> None:
        self.metrics.dry_runs.labels(outcome).observe(time.perf_counter() - started)


def _unwrap(result: dict[str, Any]) -> dict[str, Any]:
    """The report from `worker.run_job`'s answer, or the error it carries."""
    if "report" in result:
        return result["report"]
    if "error" in result:
        error = result["error"]
        assert isinstance(error, CkptError)
        raise error
    if "unavailable" in result:
        raise DryRunUnavailableError(result["unavailable"])
    log.error("dry run failed in the worker: %s\n%s", result["failed"], result["traceback"])
    raise DryRunFailedError(f"the dry run failed: {result['failed']}")
