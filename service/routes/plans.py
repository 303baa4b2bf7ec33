"""``POST /resolve`` and ``GET /describe``: plans from ckpt_core, in microseconds.

Without a model, an answer depends only on a few scalars (tier, GPU memory or
name, transformers version) and `make_plan` is a pure function of them: each
distinct set is planned, checked against the response model and serialised
ONCE, and later requests get the stored JSON bytes.  Per request that saves
the plan, its deep copy (`Plan.to_dict`) and FastAPI's response validation
and serialisation - most of the service's own time on these routes (see the
README's Performance section).  The caches are LRUs of `ANSWER_CACHE_SIZE`
entries keyed by value AND type (``true`` and ``1`` stay apart); an error is
raised before anything is stored, so bad input is never cached.

With a model, the answer is just as pure a function of the body (and the
service's config bounds), but takes milliseconds: it is computed in a thread
and kept in an LRU of `MODEL_ANSWER_CACHE_SIZE` keyed by the bounds and the
body as canonical JSON (sorted keys: the same request in another key order is
a hit; ``1`` and ``1.0`` stay apart).  Bodies whose key would exceed
`MAX_MODEL_KEY_CHARS` are answered but not kept, which bounds the memory.

A model asked about again with another workload (a new answer) reuses its
validated `ModelConfig` from a third LRU, keyed by the bounds and the model
as canonical JSON: building the transformers config is 1-2 ms of pure Python
per request, in a thread but holding the GIL against the event loop.  Shared
by the request threads, that LRU is used under a lock.
"""

from __future__ import annotations

import functools
import json
import threading
from typing import Annotated, Any, Final

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from ckpt_core import ConfigLimits, ModelConfig, Plan, load_model_config, make_plan
from service.cache import LRUCache
from service.jsonbody import StrictJSONRoute
from service.middleware import raw_header
from service.negotiation import prefers_text
from service.schemas import DescribeResponse, PlanResponse, ResolveRequest, error_responses

router = APIRouter(route_class=StrictJSONRoute, tags=["plans"])

ANSWER_CACHE_SIZE: Final = 1024
MODEL_ANSWER_CACHE_SIZE: Final = 256
MAX_MODEL_KEY_CHARS: Final = 16 * 1024  # an inline 70B config is ~0.5 KiB
JSON: Final = "application/json"
# JSON scalars: hashable, so a request made of them can be a cache key.
_SCALARS: Final = (str, int, float, type(None))

# Accept headers repeat (each client library sends its own): parse each once.
_prefers_text = functools.lru_cache(maxsize=64)(prefers_text)


def _serialised(model: type[BaseModel], data: dict[str, Any]) -> bytes:
    """`data` validated by the response model and serialised, as FastAPI would do it."""
    return model.model_validate(data).model_dump_json().encode()


@functools.lru_cache(maxsize=ANSWER_CACHE_SIZE, typed=True)
def _plan_answer(tier: Any, gpu_memory_gb: Any, gpu: Any, transformers_version: Any) -> bytes:
    """The JSON answer without a model (arguments as the client sent them; ckpt_core checks)."""
    plan = make_plan(tier, gpu_memory_gb, gpu=gpu, transformers_version=transformers_version)
    return _serialised(PlanResponse, plan.to_dict())


# Only the event loop touches it (lookups and stores happen in the route).
_model_answers = LRUCache(MODEL_ANSWER_CACHE_SIZE)


def _bounded_key(value: object, limits: ConfigLimits) -> tuple[ConfigLimits, str] | None:
    """(bounds, `value` as canonical JSON), or None when that is too long to keep."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return (limits, text) if len(text) <= MAX_MODEL_KEY_CHARS else None


@functools.lru_cache(maxsize=ANSWER_CACHE_SIZE, typed=True)
def _description(
    tier: str | None, gpu_memory_gb: float | None, gpu: str | None
) -> tuple[bytes, str]:
    """(the JSON answer, the plain-text answer)."""
    plan = make_plan(tier, gpu_memory_gb, gpu=gpu)
    data = {"tier": plan.tier, "granularity": plan.granularity, "description": plan.description}
    return _serialised(DescribeResponse, data), plan.description


# Read and written by request threads (`plan_for`): under the lock.
_model_configs = LRUCache(MODEL_ANSWER_CACHE_SIZE)
_model_configs_lock = threading.Lock()


def _validated_model(model: dict[str, Any], limits: ConfigLimits) -> ModelConfig:
    """`load_model_config`, remembered per model and bounds (never shared mutably:
    ckpt_core only reads a `ModelConfig`)."""
    key = _bounded_key(model, limits)
    with _model_configs_lock:
        config = _model_configs.get(key) if key is not None else None
    if config is None:
        config = load_model_config(model, limits=limits)  # raises before anything is kept
        if key is not None:
            with _model_configs_lock:
                _model_configs.put(key, config)
    return config


def plan_for(body: ResolveRequest, limits: ConfigLimits) -> Plan:
    """`make_plan` for a request; a model is checked against the service's bounds first."""
    model = _validated_model(body.model.as_mapping(), limits) if body.model else None
    return make_plan(
        body.tier,
        body.gpu_memory_gb,
        gpu=body.gpu,
        transformers_version=body.transformers_version,
        model=model,  # a validated ModelConfig: the estimate does not parse it again
        workload=body.workload,
    )


@router.post(
    "/resolve",
    response_model=PlanResponse,
    responses=error_responses(400, 413, 415, 422),
    summary="Resolve a tier into TrainingArguments kwargs and worker hooks",
)
async def resolve(body: ResolveRequest, request: Request) -> Any:
    limits: ConfigLimits = request.app.state.settings.config_limits
    if body.model is None and body.workload is None:
        scalars = (body.tier, body.gpu_memory_gb, body.gpu, body.transformers_version)
        if all(isinstance(value, _SCALARS) for value in scalars):
            return Response(_plan_answer(*scalars), media_type=JSON)
        return plan_for(body, limits).to_dict()  # ckpt_core names the bad field
    key = _bounded_key(body.model_dump(), limits)
    answer = _model_answers.get(key) if key is not None else None
    if answer is None:
        # A model's validation and estimate take milliseconds (more on a family's
        # first use, which imports its config code): not on the event loop.
        plan = await run_in_threadpool(plan_for, body, limits)
        answer = _serialised(PlanResponse, plan.to_dict())
        if key is not None:
            _model_answers.put(key, answer)
    return Response(answer, media_type=JSON)


@router.get(
    "/describe",
    response_model=DescribeResponse,
    responses={
        200: {
            "description": "The description; just its text when Accept prefers text/plain.",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **error_responses(422),
    },
    summary="Describe a tier for people",
)
async def describe(
    request: Request,
    tier: Annotated[
        str | None,
        Query(description="As for /resolve; absent means off.", examples=["auto"]),
    ] = None,
    gpu_memory_gb: Annotated[
        float | None, Query(description="GPU memory in GiB.", examples=[79.2])
    ] = None,
    gpu: Annotated[str | None, Query(description="A GPU name.", examples=["H100-80GB"])] = None,
) -> Any:
    answer, text = _description(tier, gpu_memory_gb, gpu)
    # Read raw: a Header parameter costs FastAPI a validation on every request.
    accept = raw_header(request.scope, b"accept")
    if accept and _prefers_text(accept):
        return PlainTextResponse(text)
    return Response(answer, media_type=JSON)
