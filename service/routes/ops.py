"""Probes and metrics, kept out of the OpenAPI document."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from service.errors import error_response
from service.state import service_state

router = APIRouter(include_in_schema=False)


@router.get("/healthz")
async def healthz() -> JSONResponse:
    """The process answers (liveness)."""
    return JSONResponse({"status": "ok"})


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """200 once both worker pools are warm (a tiny estimate and a tiny dry run ran)."""
    state = service_state(request)
    for pool in (state.planner.jobs.pool, state.dry_runner.pool):
        if not pool.ready:
            why = pool.last_start_error
            detail = f"{pool.name} workers failing to start: {why}" if why else "warming up"
            return error_response(503, "not_ready", detail)
    return JSONResponse({"status": "ready"})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus exposition text (every request answered before this one counted)."""
    body, content_type = service_state(request).metrics.render()
    return Response(body, media_type=content_type)
