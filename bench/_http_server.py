"""The HTTP benchmark's server process: the service, and a bare FastAPI app beside it.

Run by ``bench/http_load.py`` as ``python -m bench._http_server SERVICE_PORT BARE_PORT``
(``CKPT_*`` settings from the environment, as for ``python -m service``).

The service is configured exactly as ``python -m service`` configures it:
`service.__main__.main` runs with ``uvicorn.run`` intercepted, and its
arguments (app, host, proxy headers, log config, ...) build the server here.

The bare app is the framework's ceiling: FastAPI with a pydantic body model
of the same shape as ``/resolve``'s and a response model of the same shape
as its answer, nothing else - no middleware, no strict JSON parsing, no
ckpt_core per request (its answers are one plan computed at startup, so the
bytes on the wire are the service's).  It is a SECOND uvicorn server in the
SAME process, on the same event loop and with the same uvicorn settings, on
its own port; mounted under a path of the service app it would run inside the
service's middlewares and measure them too.  One process, one loop: both
sides get the same interpreter, the same CPU share and the same loop
implementation, so the ratio isolates the service's own per-request work.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Iterator
from typing import Annotated, Any
from unittest import mock

import uvicorn
from fastapi import FastAPI, Query
from pydantic import BaseModel, ConfigDict

from ckpt_core import make_plan

BARE_RESOLVE = "/bare/resolve"
BARE_DESCRIBE = "/bare/describe"


class BareResolveRequest(BaseModel):
    """``/resolve``'s body without a model: the same fields, plain pydantic types."""

    model_config = ConfigDict(extra="forbid")

    tier: bool | str | None = None
    gpu_memory_gb: float | None = None
    gpu: str | None = None
    transformers_version: str | None = None


class BarePlan(BaseModel):
    """The shape of ``/resolve``'s answer."""

    tier: str
    granularity: str | None
    training_arguments: dict[str, Any]
    hooks: str | None
    description: str
    reason: str
    gpu_memory_gb: float | None
    gpu: str | None
    transformers_version: str
    estimate: dict[str, Any] | None


class BareDescription(BaseModel):
    tier: str
    granularity: str | None
    description: str


def bare_app() -> FastAPI:
    """FastAPI with two routes of the service's shapes and a canned answer."""
    app = FastAPI()  # as shipped: its docs routes are matched before ours, as in the service
    plan = make_plan("auto", gpu="A100-80GB").to_dict()

    @app.post(BARE_RESOLVE, response_model=BarePlan)
    async def resolve(body: BareResolveRequest) -> Any:
        return {**plan, "gpu": body.gpu or plan["gpu"]}

    @app.get(BARE_DESCRIBE, response_model=BareDescription)
    async def describe(
        tier: Annotated[str | None, Query()] = None,
        gpu_memory_gb: Annotated[float | None, Query()] = None,
        gpu: Annotated[str | None, Query()] = None,
    ) -> Any:
        return {"tier": plan["tier"], "granularity": plan["granularity"], "description": tier}

    return app


def production_settings() -> tuple[Any, dict[str, Any]]:
    """The app and the ``uvicorn.run`` keyword arguments of ``python -m service``."""
    from service.__main__ import main

    captured: dict[str, Any] = {}

    def capture(app: Any, **kwargs: Any) -> None:
        captured.update(app=app, kwargs=kwargs)

    with mock.patch.object(uvicorn, "run", capture):
        main()
    return captured["app"], captured["kwargs"]


class _SharedSignalsServer(uvicorn.Server):
    """A uvicorn server that leaves SIGINT / SIGTERM to `serve_both` (two servers share them)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_both(service: uvicorn.Config, bare: uvicorn.Config) -> None:
    """Serve both apps on this loop until SIGINT / SIGTERM."""
    servers = [_SharedSignalsServer(service), _SharedSignalsServer(bare)]

    def stop_both() -> None:
        for server in servers:
            server.should_exit = True

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop_both)
    await asyncio.gather(*(server.serve() for server in servers))


def main() -> None:
    service_port, bare_port = (int(arg) for arg in sys.argv[1:3])
    app, kwargs = production_settings()
    # The bare server takes every uvicorn setting of the service's but its app and port.
    service = uvicorn.Config(app, **{**kwargs, "port": service_port})
    bare = uvicorn.Config(bare_app(), **{**kwargs, "port": bare_port})
    with asyncio.Runner(loop_factory=service.get_loop_factory()) as runner:
        runner.run(serve_both(service, bare))


if __name__ == "__main__":
    main()
