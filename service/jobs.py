"""Jobs run in a worker pool for a request: the pool's failures as HTTP errors.

The dry runs and the estimates with a model each have a `WorkerPool` (see
`service.pool` for why processes).  `PooledJobs.run` sends one job, waits,
and turns what can go wrong into the service's errors, named after the pool
(``dry_run_busy``, ``estimate_timeout``, ...): a full queue is 429 with
``Retry-After``, a job past its time limit 504, a worker that died 503.  The
worker's answer (`service.worker`: exactly one of ``result``, ``error``,
``unavailable``, ``failed``) becomes the result or the error it carries.
Every job's duration is observed by outcome.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ckpt_core import CkptError
from service.errors import (
    DryRunUnavailableError,
    JobTimeoutServiceError,
    PoolBusyServiceError,
    WorkerCrashedServiceError,
)
from service.metrics import PoolMetrics
from service.pool import JobTimeoutError, PoolBusyError, WorkerCrashedError, WorkerPool

log = logging.getLogger(__name__)


class PooledJobs:
    """A `WorkerPool` whose jobs answer requests; ``code`` prefixes its error codes."""

    def __init__(
        self,
        pool: WorkerPool,
        *,
        code: str,
        retry_after_s: int,
        metrics: PoolMetrics,
        failed: Callable[[str], Exception],
    ) -> None:
        """`failed` makes the error for a job that raised something ckpt_core did not
        classify (its traceback is logged here)."""
        self.pool = pool
        self.code = code
        self.retry_after_s = retry_after_s
        self.metrics = metrics
        self.failed = failed
        metrics.track(pool)

    @property
    def ready(self) -> bool:
        return self.pool.ready

    async def start(self) -> None:
        await self.pool.start()

    async def close(self) -> None:
        await self.pool.close()

    async def run(self, payload: Any) -> Any:
        """The job's result; raise the service error for anything else."""
        started = time.perf_counter()
        try:
            answer = await self.pool.run(payload)
        except PoolBusyError as exc:
            raise PoolBusyServiceError(
                f"{exc}; retry in {self.retry_after_s} s",
                headers={"Retry-After": str(self.retry_after_s)},
                code=f"{self.code}_busy",
            ) from None
        except JobTimeoutError as exc:
            self._observe("timeout", started)
            raise JobTimeoutServiceError(
                f"{exc}; the service is unaffected", code=f"{self.code}_timeout"
            ) from None
        except WorkerCrashedError as exc:
            self._observe("crashed", started)
            raise WorkerCrashedServiceError(
                f"{exc}; it is being replaced, retry", code=f"{self.code}_worker_crashed"
            ) from None
        self._observe("ok" if "result" in answer else next(iter(answer)), started)
        return self._unwrap(answer)

    def _observe(self, outcome: str, started: float) -> None:
        self.metrics.durations.labels(outcome).observe(time.perf_counter() - started)

    def _unwrap(self, answer: dict[str, Any]) -> Any:
        if "result" in answer:
            return answer["result"]
        if "error" in answer:
            error = answer["error"]
            assert isinstance(error, CkptError)
            raise error
        if "unavailable" in answer:
            raise DryRunUnavailableError(answer["unavailable"])
        log.error(
            "%s job failed in the worker: %s\n%s",
            self.pool.name,
            answer["failed"],
            answer["traceback"],
        )
        raise self.failed(answer["failed"])
