"""``POST /resolve`` and ``GET /describe``: plans from ckpt_core (see `service.plans`)."""

from __future__ import annotations

from typing import Annotated, Any, Final

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import PlainTextResponse
from pydantic import AfterValidator, BeforeValidator, WithJsonSchema

from ckpt_core import InvalidTierError, UnknownGpuError, parse_tier
from service.contract import (
    CHOICE_RULE,
    GPU_CHOICE,
    GPU_MEMORY_SCHEMA,
    TIER_CHOICE,
    choice_validator,
    gpu_memory,
)
from service.jsonbody import StrictJSONRoute
from service.negotiation import prefers_text
from service.responses import DescribeResponse, PlanResponse, error_responses
from service.schemas import ResolveRequest, refuse_gpu
from service.state import service_state

router = APIRouter(route_class=StrictJSONRoute, tags=["plans"])

JSON: Final = "application/json"


@router.post(
    "/resolve",
    response_model=PlanResponse,
    responses=error_responses(400, 413, 415, 422, 429, 503, 504),
    summary="Resolve a tier into TrainingArguments kwargs and worker hooks",
)
async def resolve(body: ResolveRequest, request: Request) -> Any:
    planner = service_state(request).planner
    return Response(await planner.resolve(body), media_type=JSON)


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
        BeforeValidator(
            choice_validator(
                TIER_CHOICE, parse_tier, nullable=True, error=InvalidTierError, field="tier"
            )
        ),
        WithJsonSchema(TIER_CHOICE.schema(examples=["auto"])),
        Query(
            description="As for /resolve (true / false as words); absent means off. " + CHOICE_RULE,
            examples=["auto"],
        ),
    ] = None,
    gpu_memory_gb: Annotated[
        float | None,
        AfterValidator(gpu_memory),  # on the parsed number
        WithJsonSchema({**GPU_MEMORY_SCHEMA, "examples": [79.2]}),
        Query(description="GPU memory in GiB; > 0, <= 4096.", examples=[79.2]),
    ] = None,
    gpu: Annotated[
        str | None,
        BeforeValidator(
            choice_validator(
                GPU_CHOICE, refuse_gpu, nullable=True, error=UnknownGpuError, field="gpu"
            )
        ),
        WithJsonSchema(GPU_CHOICE.schema(examples=["H100-80GB"])),
        Query(description="A GPU name. " + CHOICE_RULE, examples=["H100-80GB"]),
    ] = None,
) -> Any:
    answer, text = service_state(request).planner.describe(tier, gpu_memory_gb, gpu)
    accept = request.headers.get("accept")
    if accept and prefers_text(accept):
        return PlainTextResponse(text)
    return Response(answer, media_type=JSON)
