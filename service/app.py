"""The FastAPI app: `create_app` wires settings, middleware, error handlers and routers.

Logic lives in ckpt_core; this package adds transport, validation of the
transport (JSON, sizes, content types), limits, metrics and logs.  Start it
with ``python -m service`` (settings from ``CKPT_*``) or
``uvicorn service.app:create_app --factory``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from importlib import metadata
from typing import Any, Final

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from service.dry_runs import DryRunner
from service.errors import install_error_handlers
from service.logs import configure_logging, flush_logs
from service.metrics import Metrics
from service.middleware import BodyLimitMiddleware, RequestContextMiddleware
from service.plans import Planner
from service.pool import MAIN_GUARD_HINT
from service.routes import dry_runs, ops, plans, presets
from service.security import BearerAuthMiddleware, JSONCORSMiddleware, cors_options
from service.settings import Settings
from service.state import LifespanState, ServiceState

log = logging.getLogger(__name__)

DESCRIPTION = """\
Decide how much activation (gradient) checkpointing a HuggingFace training job
should use, and what the worker must do to apply it.

Every error is `{"error": code, "detail": message, "field": path-or-null}`:
400 for a body that is not valid JSON, 413 / 415 for its size / content type,
408 for a body that arrives too slowly, 422 for invalid values, 429 (with
Retry-After) when the dry-run pool is full, 504 when a dry run hits its time
limit, 503 when a request is still running as a shutdown's grace period
ends. 401 (with `WWW-Authenticate: Bearer`) when the deployment requires a
bearer token (`CKPT_AUTH_TOKENS`) and the request lacks it.
"""

# Answers the middlewares can give on any operation, whatever its route declares.
_TRANSPORT_ERRORS: Final = {
    "401": "A bearer token is required (CKPT_AUTH_TOKENS is set) and none, "
    "or a wrong one, was sent; see WWW-Authenticate.",
    "408": "The request body did not arrive within the time limit.",
    "413": "The body is larger than the limit.",
    "503": "The service is shutting down and its grace period ended before the answer; "
    "retry (see Retry-After).",
}
_ERROR_SCHEMA: Final = {"$ref": "#/components/schemas/ErrorResponse"}
BEARER_SCHEME: Final = "bearerAuth"


def _version() -> str:
    try:
        return metadata.version("ckpt-advisor")
    except metadata.PackageNotFoundError:  # running from a source tree without install
        return "0+unknown"


def create_app(settings: Settings | None = None) -> FastAPI:
    """A new app; `settings` default to the ``CKPT_*`` environment.

    Worker processes start in the lifespan, in the background: ``/healthz``
    answers at once, ``/readyz`` once the workers are warm.
    """
    main = sys.modules.get("__mp_main__")
    if main is not None and main is not sys.modules.get("__main__"):
        # multiprocessing runs the main script as __mp_main__ in a new worker
        # (runpy): this is a dry-run worker importing the script that started us.
        raise RuntimeError(
            f"create_app() ran while a worker process imported the main module; {MAIN_GUARD_HINT}"
        )
    settings = settings or Settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[LifespanState]:
        configure_logging(settings.log_level)
        state = ServiceState(
            settings, metrics, Planner(settings, metrics), DryRunner(settings, metrics)
        )
        warm_up = asyncio.create_task(_warm_up(state))
        try:
            yield {"service": state}
        finally:
            warm_up.cancel()
            with suppress(asyncio.CancelledError):
                await warm_up
            await asyncio.gather(state.planner.jobs.close(), state.dry_runner.jobs.close())
            gc.unfreeze()  # several apps in one process (tests): let the heap be collected
            flush_logs()

    # Swagger UI and ReDoc from assets the service serves itself (no CDN): the
    # clusters it runs on often have no internet.  No validator badge: it calls out.
    app = FastAPIOffline(
        title="ckpt-advisor",
        version=_version(),
        description=DESCRIPTION,
        lifespan=lifespan,
        swagger_ui_parameters={"validatorUrl": None},
    )
    install_error_handlers(app)
    _add_middlewares(app, settings, metrics)
    for module in (plans, dry_runs, presets, ops):
        app.include_router(module.router)
    _document_transport_errors(app)
    return app


def _add_middlewares(app: FastAPI, settings: Settings, metrics: Metrics) -> None:
    """Outermost first: request context, CORS, auth, body limits, then the app.

    The request id and the metrics see every answer (401s, 408s and 413s
    included); CORS answers preflights before auth (browsers send no token
    with them) and adds its headers to every answer, errors included; auth
    refuses a caller before its body is read.
    """
    # add_middleware puts each one outside the previous: added innermost first.
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=settings.max_body_bytes,
        timeout_s=settings.body_timeout_s,
    )
    if settings.auth_tokens:
        tokens = [token.get_secret_value() for token in settings.auth_tokens]
        app.add_middleware(BearerAuthMiddleware, tokens=tokens)
    if settings.cors_origins:
        app.add_middleware(JSONCORSMiddleware, **cors_options(settings.cors_origins))
    app.add_middleware(RequestContextMiddleware, metrics=metrics)


def _document_transport_errors(app: FastAPI) -> None:
    """Add the middlewares' answers (401, 408, 413) and the optional bearer scheme to the
    OpenAPI document, so it lists every status an operation can return whatever the
    deployment's settings.  The document does not depend on them: one contract.
    """
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            _add_transport_errors(generate())
        assert app.openapi_schema is not None
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


# Query parameters that exclude each other: OpenAPI cannot relate two parameters,
# but one form-exploded object parameter serialises to the same query string
# (``?tier=auto&gpu=H200``) and its schema can say "not both".
_EXCLUSIVE_QUERY: Final = {"/describe": ("gpu", "gpu_memory_gb")}


def _exclusive_query_parameters(document: dict[str, Any]) -> None:
    for path, (first, second) in _EXCLUSIVE_QUERY.items():
        operation = document["paths"][path]["get"]
        parameters = operation["parameters"]
        properties = {
            p["name"]: {**p["schema"], "description": p.get("description", "")} for p in parameters
        }
        numbers = {"type": "number"} if "number" in str(properties[second]) else {}
        operation["parameters"] = [
            {
                "name": "query",
                "in": "query",
                "style": "form",
                "explode": True,
                "required": False,
                "description": f"The query parameters; `{first}` and `{second}` exclude "
                "each other. Other parameters are ignored.",
                "schema": {
                    "type": "object",
                    "properties": properties,
                    "not": {
                        "required": [first, second],
                        "properties": {first: {"type": "string"}, second: numbers},
                    },
                },
            }
        ]


def _add_transport_errors(document: dict[str, Any]) -> None:
    _exclusive_query_parameters(document)
    components = document.setdefault("components", {})
    components.setdefault("securitySchemes", {})[BEARER_SCHEME] = {
        "type": "http",
        "scheme": "bearer",
        "description": "Required only when the service runs with CKPT_AUTH_TOKENS.",
    }
    # Either no credentials (the default deployment) or a bearer token.
    document["security"] = [{}, {BEARER_SCHEME: []}]
    for item in document["paths"].values():
        for operation in item.values():
            responses = operation["responses"]
            for status, description in _TRANSPORT_ERRORS.items():
                response: dict[str, Any] = {
                    "description": description,
                    "content": {"application/json": {"schema": _ERROR_SCHEMA}},
                }
                if status == "401":
                    response["headers"] = {
                        "WWW-Authenticate": {
                            "description": 'Bearer realm="ckpt-advisor"[, error="invalid_token"]',
                            "schema": {"type": "string"},
                        }
                    }
                responses.setdefault(status, response)


async def _warm_up(state: ServiceState) -> None:
    """Start the worker pools; then freeze the heap.

    What is alive once the service is up lives as long as the process: frozen,
    it is never scanned by a full garbage collection again (one over the
    imported modules stalled the event loop for tens of milliseconds, seen as
    the p99 of ``/resolve``); what is allocated later is collected as usual.
    """
    try:
        await asyncio.gather(state.planner.jobs.start(), state.dry_runner.start())
    except Exception:
        log.exception("warm-up failed: /readyz stays 503")
        return
    gc.collect()  # garbage now is not frozen for good
    gc.freeze()
    log.info("ready: estimate and dry-run workers warm")
