"""Finished requests: recorded as tuples on the hot path, then counted and logged in batches.

Turning a finished request into metrics and a JSON access-log line costs tens
of microseconds when done inline - more than the rest of the service's own
work on ``/resolve`` (``bench/asgi_layers.py``).  So the request middleware
only appends a tuple here, and `flush` handles a whole batch, off the
request's path and with the code and data hot: `FLUSH_AFTER_S` after the
batch's first request, or on the loop's next turn once `FLUSH_AT` requests
are waiting (nginx's ``access_log ... buffer= flush=``, in effect).  Why not
every loop turn: with one client at a time, a flush per request delayed the
next request by its formatting and write, 15% of ``/resolve``'s requests/s
(``bench/http.py`` at 1 connection, access log on vs off).  `/metrics` and
shutdown flush first, so nothing counted is lost or late there.

Access lines have the shape of every other log line (`service.logs.json_line`)
and are written straight to the stream, one write per batch: the `logging`
machinery (a record, a lock and a flush per line) would cost more than the
line.  They obey the ``service.access`` logger's level: info for requests,
debug for successful probes and scrapes, so ``CKPT_LOG_LEVEL=warning`` turns
the access log off.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Final, NamedTuple, TextIO

from service.logs import json_line
from service.metrics import Metrics

ACCESS_LOGGER: Final = "service.access"
# A line waits at most this long; a batch is at most about this many lines.  A
# flush stalls the loop ~5 us a line; with one client at a time, the request
# after it waits: 1 in FLUSH_AT requests, which keeps them out of the p99.
FLUSH_AFTER_S: Final = 0.1
FLUSH_AT: Final = 256
# Probes and scrapes: logged at debug, not info, so they do not drown real traffic.
_QUIET_ROUTES: Final = frozenset({"/healthz", "/readyz", "/metrics"})


class FinishedRequest(NamedTuple):
    method: str
    path: str
    route: str  # the route template, bounded: the metrics label
    status: int
    seconds: float
    request_id: str
    finished_at: float  # time.time(), the line's timestamp


class RequestLog:
    """Collect finished requests; `flush` observes them in `metrics` and writes access lines.

    `stream` defaults to ``sys.stderr`` as it is when a batch is written (so a
    replaced stderr, as under pytest, receives the lines).
    """

    def __init__(self, metrics: Metrics, stream: TextIO | None = None) -> None:
        self.metrics = metrics
        self.stream = stream
        self.logger = logging.getLogger(ACCESS_LOGGER)
        self._pending: list[FinishedRequest] = []
        self._timer: asyncio.TimerHandle | None = None

    def add(self, request: FinishedRequest) -> None:
        """Record one answered request (called by the request middleware, on the loop)."""
        self._pending.append(request)
        if len(self._pending) == 1:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_AFTER_S, self.flush)
        elif len(self._pending) == FLUSH_AT:
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Observe and log every request recorded so far (idempotent; cheap when empty)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        if not batch:
            return
        for request in batch:
            self.metrics.observe_request(
                request.method, request.route, request.status, request.seconds
            )
        lines = [line for request in batch if (line := self._access_line(request)) is not None]
        if lines:
            stream = self.stream or sys.stderr
            stream.write("".join(lines))
            stream.flush()

    def _access_line(self, request: FinishedRequest) -> str | None:
        quiet = request.route in _QUIET_ROUTES and request.status < 400
        level = logging.DEBUG if quiet else logging.INFO
        if not self.logger.isEnabledFor(level):
            return None
        fields = {
            "request_id": request.request_id,
            "method": request.method,
            "path": request.path,
            "route": request.route,
            "status": request.status,
            "duration_ms": round(request.seconds * 1000, 3),
        }
        message = f"{request.method} {request.path} {request.status}"
        return json_line(request.finished_at, level, ACCESS_LOGGER, message, fields) + "\n"
