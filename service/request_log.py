"""Finished requests: counted at once, their access lines written in batches.

A request is observed in the metrics and formatted into its JSON access line
as it finishes (a few microseconds, no object that outlives the call); only
the write is deferred: one write per batch, `FLUSH_AFTER_S` after the batch's
first line or as soon as it holds `FLUSH_AT` lines (nginx's ``access_log ...
buffer= flush=``, in effect).  Why not a write per request: with one client
at a time, that cost 15% of ``/resolve``'s requests/s (``bench/http.py`` at 1
connection, access log on vs off).  Why not defer the formatting too, as this
module once did: a batch then stalled the loop for ~3.5 ms every 0.1 s
(~20 us a line, measured by a client timing each request; the same lines
cost ~8 us each formatted in a tight loop), and at 8 connections every
request in flight waited behind it: about 3% of requests, enough to double
the p99.  Shutdown writes what is left.

Access lines have the shape of every other log line (`service.logs.json_line`)
and bypass the `logging` machinery (a record, a lock and a flush per line
would cost more than the line).  The pairs that repeat from request to request
(level, logger, message, method, path, route, status) are encoded once per
distinct request kind and the varying ones spliced around them: in the
server a whole line measured ~20 us a request (~6 us in a tight loop), the
spliced one ~13 us.  They obey the ``service.access`` logger's
level: info for requests, debug for successful probes and scrapes, so
``CKPT_LOG_LEVEL=warning`` turns the access log off.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
from typing import Final, NamedTuple, TextIO

from service.logs import json_pairs, json_string, timestamp
from service.metrics import Metrics

ACCESS_LOGGER: Final = "service.access"
# A line waits at most this long; a batch is at most this many lines (~75 KB).
FLUSH_AFTER_S: Final = 0.1
FLUSH_AT: Final = 256
# Distinct (level, method, path, route, status) whose encoded pairs are kept:
# paths repeat for the real routes; a scan of random paths only evicts.
REPEATED_PAIRS_CACHE_SIZE: Final = 512
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
    """Observe finished requests in `metrics`; write their access lines in batches.

    `stream` defaults to ``sys.stderr`` as it is when a batch is written (so a
    replaced stderr, as under pytest, receives the lines).
    """

    def __init__(self, metrics: Metrics, stream: TextIO | None = None) -> None:
        self.metrics = metrics
        self.stream = stream
        self.logger = logging.getLogger(ACCESS_LOGGER)
        self._lines: list[str] = []
        self._timer: asyncio.TimerHandle | None = None

    def add(self, request: FinishedRequest) -> None:
        """Record one answered request (called by the request middleware, on the loop)."""
        self.metrics.observe_request(request.method, request.route, request.status, request.seconds)
        line = self._access_line(request)
        if line is None:
            return
        self._lines.append(line)
        if len(self._lines) == 1:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_AFTER_S, self.flush)
        elif len(self._lines) >= FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        """Write every access line waiting (idempotent; cheap when none)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        lines, self._lines = self._lines, []
        if lines:
            stream = self.stream or sys.stderr
            stream.write("".join(lines))
            stream.flush()

    def _access_line(self, request: FinishedRequest) -> str | None:
        quiet = request.route in _QUIET_ROUTES and request.status < 400
        level = logging.DEBUG if quiet else logging.INFO
        if not self.logger.isEnabledFor(level):
            return None
        head, tail = _repeated_pairs(
            level, request.method, request.path, request.route, request.status
        )
        duration_ms = round(request.seconds * 1000, 3)
        return (
            f'{{"ts": "{timestamp(request.finished_at)}", {head}, '
            f'"request_id": {json_string(request.request_id)}, {tail}, '
            f'"duration_ms": {duration_ms!r}}}\n'
        )


@functools.lru_cache(maxsize=REPEATED_PAIRS_CACHE_SIZE)
def _repeated_pairs(level: int, method: str, path: str, route: str, status: int) -> tuple[str, str]:
    """The pairs of an access line that repeat across requests, JSON-encoded once:
    (level, logger, message) and (method, path, route, status).

    The line is `json_line`'s (a test checks them equal on awkward input); its
    varying pairs (ts, request_id, duration_ms) are spliced in around these.
    """
    head = json_pairs(
        {
            "level": logging.getLevelName(level).lower(),
            "logger": ACCESS_LOGGER,
            "message": f"{method} {path} {status}",
        }
    )
    tail = json_pairs({"method": method, "path": path, "route": route, "status": status})
    return head, tail
