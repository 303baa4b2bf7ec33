"""Where the service's own time per request goes: the ASGI app called directly, layer by layer.

Run: ``.venv/bin/python -m bench.asgi_layers`` (``--requests`` 3000 per
timing, ``--rounds`` 5).

No server, no sockets: each request is a fresh ASGI scope handed to the app
in a loop, so the figures are the app's own microseconds per request, without
uvicorn's HTTP parsing (which both sides of ``bench/http_load.py`` pay alike).
Variants, each timed in turn per round (the table shows the minimum and the
median over rounds):

- the bare FastAPI app of ``bench/_http_server.py`` (the framework's ceiling);
- the service as configured by default (``Settings()``, access log at info,
  written to a temporary file as stderr would be);
- the same app with its access log off (level warning);
- the same app without its request-context middleware (id, metrics, log);
- the same app without any of its own middleware.

Differences between rows are the cost of what the row removes.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import time
from collections.abc import Callable
from typing import IO, Any

from bench._common import median, table
from bench._http_server import BARE_DESCRIBE, BARE_RESOLVE, bare_app

BODY = b'{"tier": "auto", "gpu": "A100-80GB"}'
QUERY = b"tier=auto&gpu=A100-80GB"
App = Callable[..., Any]


def _scope(method: str, path: str, query: bytes, body: bytes) -> dict[str, Any]:
    headers = [(b"host", b"127.0.0.1:8000"), (b"user-agent", b"bench"), (b"accept", b"*/*")]
    if body:
        headers += [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }


async def _call(app: App, method: str, path: str, query: bytes, body: bytes) -> None:
    status = 0

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(_scope(method, path, query, body), receive, send)
    if status != 200:
        raise RuntimeError(f"{method} {path} answered {status}")


async def _time(app: App, request: tuple[str, str, bytes, bytes], count: int) -> float:
    """Microseconds per request, after 200 untimed ones."""
    for _ in range(200):
        await _call(app, *request)
    started = time.perf_counter()
    for _ in range(count):
        await _call(app, *request)
    return (time.perf_counter() - started) / count * 1e6


def _service(strip: tuple[str, ...] = ()) -> App:
    """The default service app, without the middlewares named in `strip`."""
    from service.app import create_app
    from service.settings import Settings

    app = create_app(Settings())
    app.user_middleware = [m for m in app.user_middleware if m.cls.__name__ not in strip]
    return app


async def _rows(args: argparse.Namespace, log_stream: IO[str]) -> list[list[object]]:
    from service.logs import configure_logging

    configure_logging("info")
    service_log = logging.getLogger("service")
    for handler in service_log.handlers:  # stderr -> a file, as in a container
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(log_stream)
    resolve = ("POST", "/resolve", b"", BODY)
    describe = ("GET", "/describe", QUERY, b"")
    bare = bare_app()
    full = _service()
    no_context = _service(("RequestContextMiddleware",))
    no_middleware = _service(tuple(m.cls.__name__ for m in full.user_middleware))
    for app in (full, no_context, no_middleware):  # access lines -> the file, as stderr would
        app.state.request_log.stream = log_stream
    variants: list[tuple[str, App, tuple[str, str, bytes, bytes], str]] = [
        ("bare POST", bare, ("POST", BARE_RESOLVE, b"", BODY), "INFO"),
        ("service POST /resolve", full, resolve, "INFO"),
        ("  access log off", full, resolve, "WARNING"),
        ("  no request-context middleware", no_context, resolve, "INFO"),
        ("  no middleware of its own", no_middleware, resolve, "INFO"),
        ("bare GET", bare, ("GET", BARE_DESCRIBE, QUERY, b""), "INFO"),
        ("service GET /describe", full, describe, "INFO"),
        ("  access log off", full, describe, "WARNING"),
    ]
    times: dict[int, list[float]] = {i: [] for i in range(len(variants))}
    for _ in range(args.rounds):
        for index, (_, app, request, level) in enumerate(variants):
            service_log.setLevel(level)
            times[index].append(await _time(app, request, args.requests))
    service_log.setLevel("INFO")
    return [[name, min(times[i]), median(times[i])] for i, (name, *_) in enumerate(variants)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryFile("w") as log_stream:
        rows = asyncio.run(_rows(args, log_stream))
    print(table(["variant", "min us/request", "median us/request"], rows))


if __name__ == "__main__":
    main()
