"""``POST /resolve`` and ``GET /describe``: plans from ckpt_core, in microseconds."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import PlainTextResponse
from starlette.concurrency import run_in_threadpool

from ckpt_core._models import ConfigLimits, load_model_config
from ckpt_core._plan import Plan, make_plan
from service.jsonbody import StrictJSONRoute
from service.negotiation import prefers_text
from service.schemas import DescribeResponse, PlanResponse, ResolveRequest, error_responses

router = APIRouter(route_class=StrictJSONRoute, tags=["plans"])


def plan_for(body: ResolveRequest, limits: ConfigLimits) -> Plan:
    """`make_plan` for a request; a model is checked against the service's bounds first."""
    model = load_model_config(body.model.as_mapping(), limits=limits) if body.model else None
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
    if body.model is None:
        return plan_for(body, limits).to_dict()
    # A model's validation and estimate take milliseconds (more on a family's
    # first use, which imports its config code): not on the event loop.
    return (await run_in_threadpool(plan_for, body, limits)).to_dict()


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
    tier: Annotated[
        str | None,
        Query(description="As for /resolve; absent means off.", examples=["auto"]),
    ] = None,
    gpu_memory_gb: Annotated[
        float | None, Query(description="GPU memory in GiB.", examples=[79.2])
    ] = None,
    gpu: Annotated[str | None, Query(description="A GPU name.", examples=["H100-80GB"])] = None,
    accept: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Any:
    plan = make_plan(tier, gpu_memory_gb, gpu=gpu)
    if prefers_text(accept):
        return PlainTextResponse(plan.description)
    return {"tier": plan.tier, "granularity": plan.granularity, "description": plan.description}
