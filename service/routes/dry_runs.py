"""``POST /dry-run``: build on meta in the worker pool, cached."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from service.jsonbody import StrictJSONRoute
from service.responses import DryRunResponse, error_responses
from service.schemas import DryRunRequest
from service.state import service_state

router = APIRouter(route_class=StrictJSONRoute, tags=["dry runs"])

CACHE_HEADER = "X-Cache"
_STRING = {"type": "string"}


@router.post(
    "/dry-run",
    response_model=DryRunResponse,
    responses={
        200: {"headers": {CACHE_HEADER: {"description": "hit or miss", "schema": _STRING}}},
        **error_responses(400, 413, 415, 422, 429, 501, 503, 504),
    },
    summary="Build a model on the meta device and report what the tier checkpoints",
)
async def dry_run(body: DryRunRequest, request: Request, response: Response) -> Any:
    report, cached = await service_state(request).dry_runner.run(body.as_kwargs())
    response.headers[CACHE_HEADER] = "hit" if cached else "miss"
    return report
