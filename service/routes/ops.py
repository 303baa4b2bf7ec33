"""Probes and metrics, kept out of the OpenAPI document."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from service.errors import error_response
from service.state import State

router = APIRouter(include_in_schema=False)


@router.get("/healthz")
async def healthz() -> JSONResponse:
    """The process answers (liveness)."""
    return JSONResponse({"status": "ok"})


@router.get("/readyz")
async def readyz(state: State) -> JSONResponse:
    """200 once warm-up is done (torch and transformers imported, a tiny dry run run)."""
    runner = state.dry_runner
    if not runner.ready:
        why = runner.pool.last_start_error
        detail = f"dry-run workers failing to start: {why}" if why else "warming up"
        return error_response(503, "not_ready", detail)
    return JSONResponse({"status": "ready"})


@router.get("/metrics")
async def metrics(state: State) -> Response:
    """Prometheus exposition text (every request answered before this one counted)."""
    body, content_type = state.metrics.render()
    return Response(body, media_type=content_type)
