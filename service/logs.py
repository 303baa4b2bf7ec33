"""Structured logs: one JSON object per line on stderr, with the request id, off the loop.

Records of the ``service`` loggers (the access log included) go through a
`QueueHandler` to a `QueueListener` thread that formats them as JSON
(python-json-logger) and writes them: the event loop only builds the record
and puts it on the queue, never waits for the stream.  The thread works in
batches (`BatchingQueueListener`): what is queued is formatted, then written
in one write, and the thread sleeps a moment before it waits again.  The request id lives
in a context variable set by the request middleware; the queue handler copies
it into the record while still in the request's context, so every line
written while a request is handled carries it.  `uvicorn_log_config` routes
uvicorn's own loggers through the same formatter.
"""

from __future__ import annotations

import atexit
import logging
import queue
import select
import sys
import threading
import time
from contextvars import ContextVar
from datetime import UTC, datetime
from logging.handlers import QueueHandler, QueueListener
from typing import Any, Final

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.orjson import OrjsonFormatter

request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)

SERVICE_LOGGER = "service"
# How long the writer thread lets lines gather once the queue has run dry: the most a
# line waits before it is written, and the fewest wake-ups of the thread a second.
BATCH_INTERVAL_S: Final = 0.05


class JsonFormatter(OrjsonFormatter):
    """``{"ts", "level", "logger", "message", "request_id"?, ...extra, "exc_info"?}``.

    python-json-logger's orjson flavour: a line formats in about 60% of the time
    of its standard-library ``json`` flavour, in the writer thread that shares
    the GIL with the event loop.  Non-ASCII text is written as UTF-8.
    """

    def __init__(self) -> None:
        super().__init__(
            "{message}",
            style="{",
            json_default=str,
            # uvicorn adds a coloured copy of its message.
            reserved_attrs=[*RESERVED_ATTRS, "color_message", "taskName"],
        )

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        log_data["ts"] = datetime.fromtimestamp(record.created, UTC).isoformat(
            timespec="milliseconds"
        )
        log_data["level"] = record.levelname.lower()
        log_data["logger"] = record.name
        super().add_fields(log_data, record, message_dict)
        if "request_id" not in log_data:
            request_id = request_id_var.get()  # formatted in the caller's context
            if request_id is not None:
                log_data["request_id"] = request_id


class BatchStderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Formats each record as it comes and writes them all to ``sys.stderr`` on `flush`.

    A few writes per batch instead of one per line: every write releases and
    retakes the GIL, which the event loop then waits for.  A batch is cut at
    line ends into writes of at most ``select.PIPE_BUF`` bytes, which a pipe
    writes whole: the worker processes share the service's stderr, and a
    larger write could have their output land inside a line.  ``sys.stderr``
    is looked up at each write (pytest replaces it).
    """

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self._lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._lines.append(self.format(record))
        except Exception:  # a record that cannot be formatted: reported as logging does
            self.handleError(record)

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr] - Handler.createLock always sets it
            if not self._lines:
                return
            lines = [line + self.terminator for line in self._lines]
            self._lines.clear()
            self.stream = sys.stderr
            for chunk in _pipe_sized(lines):
                self.stream.write(chunk)
                self.stream.flush()


def _pipe_sized(lines: list[str]) -> list[str]:
    """``lines`` joined into pieces of at most ``select.PIPE_BUF`` bytes (a longer line alone)."""
    pieces: list[str] = []
    piece: list[str] = []
    size = 0
    for line in lines:
        length = len(line.encode())
        if piece and size + length > select.PIPE_BUF:
            pieces.append("".join(piece))
            piece, size = [], 0
        piece.append(line)
        size += length
    if piece:
        pieces.append("".join(piece))
    return pieces


class BatchingQueueListener(QueueListener):
    """A `QueueListener` that writes what is queued in batches, waking once a batch.

    Woken for every record, the thread took the GIL from the event loop once
    per access line, which cost a busy service far more than formatting the
    line.  Once the queue has run dry it flushes its handlers (one write),
    sleeps `BATCH_INTERVAL_S` so that lines gather, then waits as usual: an idle
    service's thread sleeps, a busy one's wakes at most 1 / `BATCH_INTERVAL_S`
    times a second.
    """

    def dequeue(self, block: bool) -> Any:
        try:
            return self.queue.get_nowait()
        except queue.Empty:
            if not block:
                raise
        self._flush_handlers()
        time.sleep(BATCH_INTERVAL_S)
        return self.queue.get(block)

    def stop(self) -> None:
        """Write everything queued before the call, then stop the thread."""
        super().stop()
        self._flush_handlers()

    def _flush_handlers(self) -> None:
        for handler in self.handlers:
            handler.flush()


class ContextQueueHandler(QueueHandler):
    """A `QueueHandler` that keeps what the listener thread cannot see: the request
    id (a context variable) and the exception, formatted here as text."""

    _exceptions = logging.Formatter()

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        # In place, not on a copy (the base class copies for the other handlers of
        # the chain): this is the ``service`` loggers' only handler, and a copy was
        # a fifth of the event loop's work per access line.  A handler added to
        # them still reads a complete record: the message merged, the traceback
        # as text.
        record.message = record.getMessage()
        record.msg, record.args = record.message, None
        if "request_id" not in record.__dict__:
            request_id = request_id_var.get()
            if request_id is not None:
                record.request_id = request_id
        if record.exc_info:
            record.exc_text = self._exceptions.formatException(record.exc_info)
            record.exc_info = None
        return record


_lock = threading.Lock()
_listener: BatchingQueueListener | None = None


def _start_listener(handler: ContextQueueHandler) -> None:
    global _listener  # noqa: PLW0603 - one writer thread per process, shared by every app
    output = BatchStderrHandler()
    output.setFormatter(JsonFormatter())
    _listener = BatchingQueueListener(handler.queue, output, respect_handler_level=False)
    _listener.start()


def configure_logging(level: str) -> None:
    """Send the ``service`` loggers to stderr as JSON through the queue (idempotent).

    Log records of this process skip the thread and process names (the logging
    HOWTO's "Optimization"): no line carries them, and looking them up was a
    fifth of building each access record.
    """
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logger = logging.getLogger(SERVICE_LOGGER)
    logger.setLevel(level.upper())
    logger.propagate = False
    with _lock:
        handler = next((h for h in logger.handlers if isinstance(h, ContextQueueHandler)), None)
        if handler is None:
            handler = ContextQueueHandler(queue.SimpleQueue())
            logger.addHandler(handler)
        if _listener is None:
            _start_listener(handler)


def flush_logs() -> None:
    """Write every line queued so far (the writer thread is stopped, then started again)."""
    with _lock:
        if _listener is not None:
            _listener.stop()  # processes what is queued, then joins the thread
            _listener.start()


def _stop_listener() -> None:
    global _listener  # noqa: PLW0603
    with _lock:
        if _listener is not None:
            _listener.stop()
            _listener = None


atexit.register(_stop_listener)


def uvicorn_log_config(level: str) -> dict[str, Any]:
    """`logging.config.dictConfig` for uvicorn: JSON lines; its access log off (ours is JSON)."""
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {"stderr": handler},
        "loggers": {
            "uvicorn": {"handlers": ["stderr"], "level": level.upper(), "propagate": False},
            "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
        },
    }
