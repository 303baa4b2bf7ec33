"""Plans for ``/resolve`` and ``/describe``: ckpt_core's answers, kept in LRU caches.

Without a model an answer depends only on a few validated scalars (tier, GPU
memory or name, transformers version) and `make_plan` is a pure function of
them: each distinct set is planned, checked against the response model and
serialised once.  With a model, the answer is as pure a function of the
validated body and the service's config bounds, but takes milliseconds: it is
computed in a thread and kept by the body as canonical JSON (sorted keys), up
to `MAX_MODEL_KEY_CHARS`.  A model asked about again with another workload
reuses its validated `ModelConfig` (building the transformers config is 1-2 ms
of pure Python that holds the GIL against the event loop).  Errors are raised
before anything is stored, so bad input is never cached.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Final

from cachetools import LRUCache
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from ckpt_core import ConfigLimits, ModelConfig, Plan, load_model_config, make_plan
from service.responses import DescribeResponse, PlanResponse
from service.schemas import ResolveRequest

ANSWER_CACHE_SIZE: Final = 1024
MODEL_ANSWER_CACHE_SIZE: Final = 256
MAX_MODEL_KEY_CHARS: Final = 16 * 1024  # an inline 70B config is ~0.5 KiB


def serialised(model: type[BaseModel], data: dict[str, Any]) -> bytes:
    """`data` validated by the response model and serialised, as FastAPI would do it."""
    return model.model_validate(data).model_dump_json().encode()


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class Planner:
    """The plan answers of one app, and the caches behind them."""

    def __init__(self, limits: ConfigLimits) -> None:
        self.limits = limits
        # Touched only on the event loop.
        self.answers: LRUCache[tuple[Any, ...], bytes] = LRUCache(ANSWER_CACHE_SIZE)
        self.descriptions: LRUCache[tuple[Any, ...], tuple[bytes, str]] = LRUCache(
            ANSWER_CACHE_SIZE
        )
        self.model_answers: LRUCache[str, bytes] = LRUCache(MODEL_ANSWER_CACHE_SIZE)
        # Read and written by request threads (`plan_for`): under the lock.
        self.model_configs: LRUCache[str, ModelConfig] = LRUCache(MODEL_ANSWER_CACHE_SIZE)
        self._model_configs_lock = threading.Lock()

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
            # A model's validation and estimate take milliseconds (more on a family's
            # first use, which imports its config code): not on the event loop.
            plan = await run_in_threadpool(self.plan_for, body)
            answer = serialised(PlanResponse, plan.to_dict())
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

    def plan_for(self, body: ResolveRequest) -> Plan:
        """`make_plan` for a request; a model is checked against the bounds first."""
        model = self.validated_model(body.model.as_mapping()) if body.model else None
        # A validated ModelConfig: the estimate does not parse it again.
        return make_plan(**body.plan_kwargs(), model=model)

    def validated_model(self, model: dict[str, Any]) -> ModelConfig:
        """`load_model_config`, remembered per model (ckpt_core only reads a `ModelConfig`)."""
        text = _canonical(model)
        keep = len(text) <= MAX_MODEL_KEY_CHARS
        with self._model_configs_lock:
            config = self.model_configs.get(text) if keep else None
        if config is None:
            config = load_model_config(model, limits=self.limits)  # raises before it is kept
            if keep:
                with self._model_configs_lock:
                    self.model_configs[text] = config
        return config
