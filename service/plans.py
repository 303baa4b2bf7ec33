"""Plans for ``/resolve`` and ``/describe``: ckpt_core's answers, kept in LRU caches.

Without a model an answer depends only on a few validated scalars (tier, GPU
memory or name, transformers version) and `make_plan` is a pure function of
them: each distinct set is planned, checked against the response model and
serialised once, on the event loop (microseconds).  With a model (or a
workload), the answer is as pure a function of the validated body and the
service's config bounds, but the estimate replays a training step through the
allocator model: tens of milliseconds to a second of pure Python, which in
this process would hold the GIL against every other request.  It runs in the
estimate worker pool (`service.jobs`, 429 / 504 / 503 as for dry runs), and
the answer is kept by the body as canonical JSON (sorted keys), up to
`MAX_MODEL_KEY_CHARS`.  Errors are raised before anything is stored, so bad
input is never cached.
"""

from __future__ import annotations

import json
from typing import Any, Final

from cachetools import LRUCache
from pydantic import BaseModel

from ckpt_core import make_plan
from service import worker
from service.jobs import PooledJobs
from service.metrics import Metrics
from service.pool import WorkerPool
from service.responses import DescribeResponse, PlanResponse
from service.schemas import ResolveRequest
from service.settings import Settings

ANSWER_CACHE_SIZE: Final = 1024
MODEL_ANSWER_CACHE_SIZE: Final = 256
MAX_MODEL_KEY_CHARS: Final = worker.MAX_MODEL_KEY_CHARS
# Retry-After of a 429 from the estimate pool: an estimate takes up to about a second.
ESTIMATE_RETRY_AFTER_S: Final = 1


def serialised(model: type[BaseModel], data: dict[str, Any]) -> bytes:
    """`data` validated by the response model and serialised, as FastAPI would do it."""
    return model.model_validate(data).model_dump_json().encode()


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class Planner:
    """The plan answers of one app, the caches behind them and the estimate pool."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.limits = settings.config_limits
        # Touched only on the event loop.
        self.answers: LRUCache[tuple[Any, ...], bytes] = LRUCache(ANSWER_CACHE_SIZE)
        self.descriptions: LRUCache[tuple[Any, ...], tuple[bytes, str]] = LRUCache(
            ANSWER_CACHE_SIZE
        )
        self.model_answers: LRUCache[str, bytes] = LRUCache(MODEL_ANSWER_CACHE_SIZE)
        pool = WorkerPool(
            name="estimate",
            job=worker.plan_job,
            warm_up=worker.warm_up_estimates,
            size=settings.estimate_workers,
            queue_limit=settings.estimate_queue,
            timeout_s=settings.estimate_timeout_s,
            preload=worker.PRELOAD,
        )
        self.jobs = PooledJobs(
            pool,
            code="estimate",
            retry_after_s=ESTIMATE_RETRY_AFTER_S,
            metrics=metrics.estimates,
            # make_plan raises only CkptErrors for bad input: anything else is a bug (500).
            failed=lambda text: RuntimeError(f"the estimate failed in its worker: {text}"),
        )

    async def resolve(self, body: ResolveRequest) -> bytes:
        """The JSON answer of ``POST /resolve`` for a validated body."""
        if body.model is None and body.workload is None:
            key = (body.tier, body.gpu_memory_gb, body.gpu, body.transformers_version)
            answer = self.answers.get(key)
            if answer is None:
                plan = make_plan(**body.plan_kwargs())  # raises before anything is kept
                answer = self.answers[key] = serialised(PlanResponse, plan.to_dict())
            return answer
        text = _canonical(body.model_dump())
        answer = self.model_answers.get(text)
        if answer is None:
            model = body.model.as_mapping() if body.model is not None else None
            request = {**body.plan_kwargs(), "model": model, "limits": self.limits}
            answer = serialised(PlanResponse, await self.jobs.run(request))
            if len(text) <= MAX_MODEL_KEY_CHARS:
                self.model_answers[text] = answer
        return answer

    def describe(
        self, tier: str | None, gpu_memory_gb: float | None, gpu: str | None
    ) -> tuple[bytes, str]:
        """(the JSON answer, the plain-text answer) of ``GET /describe``."""
        key = (tier, gpu_memory_gb, gpu)
        found = self.descriptions.get(key)
        if found is None:
            plan = make_plan(tier, gpu_memory_gb, gpu=gpu)
            data = {
                "tier": plan.tier,
                "granularity": plan.granularity,
                "description": plan.description,
            }
            found = self.descriptions[key] = (serialised(DescribeResponse, data), plan.description)
        return found
