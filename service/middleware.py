"""Pure ASGI middlewares: request context (id, access log, metrics, 500 net), body limits.

Pure ASGI rather than Starlette's ``BaseHTTPMiddleware``: no extra task per
request, the body can be inspected before the app sees it, and nothing
buffers the response.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from random import getrandbits
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import (
    BodyTimeoutError,
    BodyTooLargeError,
    ServiceError,
    ServiceUnavailableError,
    error_response,
    service_error_response,
)
from service.logs import request_id_var
from service.metrics import Metrics

log = logging.getLogger(__name__)

REQUEST_ID_HEADER: Final = "X-Request-ID"
_REQUEST_ID_KEY: Final = REQUEST_ID_HEADER.lower().encode("latin-1")
# A caller's id is echoed only when it is short and plain (it goes into logs).
_VALID_REQUEST_ID: Final = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")
# The route label of answers given before or without routing (404, 413): the
# raw path would make the label set unbounded.
UNMATCHED_ROUTE: Final = "<unmatched>"
ACCESS_LOGGER: Final = "service.access"
# Probes and scrapes: logged at debug, not info, so they do not drown real traffic.
_QUIET_ROUTES: Final = frozenset({"/healthz", "/readyz", "/metrics"})
access_log = logging.getLogger(ACCESS_LOGGER)


class RequestContextMiddleware:
    """Request id in and out, the request recorded (metrics, access log), the 500 safety net.

    An exception no handler claimed is a bug: it is logged with its traceback
    and answered as a JSON 500 naming the request id (never a stack trace).
    """

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _request_id(raw_header(scope, _REQUEST_ID_KEY))
        id_header = (_REQUEST_ID_KEY, request_id.encode("latin-1"))
        token = request_id_var.set(request_id)
        start = time.perf_counter()
        status = 500
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                started = True
                status = message["status"]
                # Appended as raw bytes: no app sets this header, so there is
                # nothing to replace (MutableHeaders would scan for it first).
                message["headers"] = [*message.get("headers", ()), id_header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except asyncio.CancelledError:
            # uvicorn cancels the requests still running when the graceful-shutdown
            # period ends: answer a retryable 503 rather than its plain-text 500.
            if started:
                raise
            await service_error_response(_shutting_down())(scope, receive, send_with_id)
        except Exception:
            log.exception("unhandled error in %s %s", scope["method"], scope["path"])
            if started:
                raise  # the server aborts the half-sent response
            response = error_response(
                500, "internal_error", f"internal error (request id {request_id}); it was logged"
            )
            await response(scope, receive, send_with_id)
        finally:
            route = getattr(scope.get("route"), "path", None) or UNMATCHED_ROUTE
            seconds = time.perf_counter() - start
            self.metrics.observe_request(scope["method"], route, status, seconds)
            _log_access(scope["method"], scope["path"], route, status, seconds)
            request_id_var.reset(token)


def _log_access(method: str, path: str, route: str, status: int, seconds: float) -> None:
    """One access line (``service.access``): info, or debug for a successful probe."""
    level = logging.DEBUG if route in _QUIET_ROUTES and status < 400 else logging.INFO
    if access_log.isEnabledFor(level):
        # A record made and handled directly: `Logger.log` would also walk the stack
        # for the caller's file and line, which the JSON line does not carry.
        record = access_log.makeRecord(
            ACCESS_LOGGER,
            level,
            __file__,
            0,
            "%s %s %s",
            (method, path, status),
            None,
            extra={
                "method": method,
                "path": path,
                "route": route,
                "status": status,
                "duration_ms": round(seconds * 1000, 3),
            },
        )
        access_log.handle(record)


def raw_header(scope: Scope, name: bytes) -> str | None:
    """A request header's value by its lower-case name (ASGI servers send lower case).

    A plain scan of the raw list: Starlette's `Headers` would build an object
    and decode every header for one lookup, several us per request.
    """
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def _shutting_down() -> ServiceUnavailableError:
    return ServiceUnavailableError(
        "the service is shutting down and stopped this request at the end of its "
        "grace period; retry (another replica will answer)",
        headers={"Retry-After": "1", "Connection": "close"},
    )


def _request_id(given: str | None) -> str:
    if given is not None and _VALID_REQUEST_ID.match(given):
        return given
    # 128 bits (uuid4 has 122) from the process's Mersenne Twister: seeded from
    # os.urandom and reseeded in every forked child, so unique across replicas and
    # workers.  An id is echoed and logged, never trusted, so it need not be
    # unpredictable; os.urandom's system call cost ~3 us a request in the server.
    return f"{getrandbits(128):032x}"


# On a refused body the rest of it is unread: the connection cannot carry another
# request.  Left open, uvicorn would keep it for a client that goes on sending (every
# byte received cancels its keep-alive timer, re-armed only by a response): a
# trickler would hold it for good.  Closing ends both.
_CLOSE: Final = {"Connection": "close"}


class BodyLimitMiddleware:
    """Bound the request body in size (413) and in time (408) before the app sees it.

    Size: refused early from Content-Length, else while reading (every chunk of
    a chunked upload counts).  Time: the whole body must arrive within
    `timeout_s` of the headers; a client that trickles it (or never sends it)
    gets a 408 instead of holding a connection and a task forever -
    uvicorn has no body-read timeout of its own.  The body is then replayed to the
    app, so nothing is parsed before both checks pass.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = raw_header(scope, b"content-length")
        if length is None and raw_header(scope, b"transfer-encoding") is None:
            # No body in HTTP/1.1 (RFC 9112 6.3): nothing to bound or to wait for,
            # and a GET skips the timer and the replay.
            await self.app(scope, receive, send)
            return
        try:
            self._check_declared_length(length)
            body = await self._read_body_in_time(receive)
        except ServiceError as exc:
            await service_error_response(exc)(scope, receive, send)
            return
        if body is None:  # the client went away
            return
        await self.app(scope, _replay(body, receive), send)

    def _too_large(self, size: str) -> BodyTooLargeError:
        return BodyTooLargeError(
            f"request body of {size} bytes is over the limit of {self.max_bytes} bytes",
            headers=_CLOSE,
        )

    def _check_declared_length(self, value: str | None) -> None:
        if value is None:
            return
        digits = value.strip()
        if not (digits.isascii() and digits.isdigit()):  # isdigit alone admits '²'
            raise ServiceError(f"Content-Length {value!r} is not a byte count", headers=_CLOSE)
        if int(digits) > self.max_bytes:
            raise self._too_large(digits)

    async def _read_body_in_time(self, receive: Receive) -> bytes | None:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._read_body(receive)
        except TimeoutError:
            raise BodyTimeoutError(
                f"the request body did not arrive within {self.timeout_s:g} s of the headers",
                headers=_CLOSE,
            ) from None

    async def _read_body(self, receive: Receive) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise self._too_large(f"more than {self.max_bytes}")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that yields the buffered body once, then defers to the server."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
