"""The FastAPI app: `create_app` wires settings, middleware, error handlers and routers.

Logic lives in ckpt_core; this package adds transport, validation of the
transport (JSON, sizes, content types), limits, metrics and logs.  Start it
with ``python -m service`` (settings from ``CKPT_*``) or
``uvicorn service.app:create_app --factory``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from importlib import metadata

from fastapi import FastAPI

from service.dry_runs import DryRunner
from service.errors import install_error_handlers
from service.logs import configure_logging
from service.metrics import Metrics
from service.middleware import BodyLimitMiddleware, RequestContextMiddleware
from service.routes import dry_runs, ops, plans, presets
from service.settings import Settings

log = logging.getLogger(__name__)

DESCRIPTION = """\
Decide how much activation (gradient) checkpointing a HuggingFace training job
should use, and what the worker must do to apply it.

Every error is `{"error": code, "detail": message, "field": path-or-null}`:
400 for a body that is not valid JSON, 413 / 415 for its size / content type,
422 for invalid values, 429 (with Retry-After) when the dry-run pool is full,
504 when a dry run hits its time limit.
"""


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
    settings = settings or Settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        configure_logging(settings.log_level)
        runner = DryRunner(settings, metrics)
        app.state.dry_runner = runner
        warm_up = asyncio.create_task(_warm_up(runner))
        try:
            yield
        finally:
            warm_up.cancel()
            with suppress(asyncio.CancelledError):
                await warm_up
            await runner.close()

    app = FastAPI(
        title="ckpt-advisor",
        version=_version(),
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    install_error_handlers(app)
    # Added last = outermost: the request id and the metrics see every answer,
    # the 413s of the body limit included.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestContextMiddleware, metrics=metrics)
    for module in (plans, dry_runs, presets, ops):
        app.include_router(module.router)
    return app


async def _warm_up(runner: DryRunner) -> None:
    try:
        await runner.start()
    except Exception:
        log.exception("warm-up failed: /readyz stays 503")
        return
    log.info("ready: dry-run workers warm")
