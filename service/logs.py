"""Structured logs: one JSON object per line on stderr, with the request id.

The request id lives in a context variable set by the request middleware, so
every log line written while a request is handled carries it, whichever
module writes it.  `uvicorn_log_config` routes uvicorn's own loggers through
the same formatter when the service is started with ``python -m service``.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from contextvars import ContextVar
from functools import lru_cache
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)

# LogRecord attributes that are not "extra" fields passed by the caller.
_STANDARD_ATTRS = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys()
    | {"message", "asctime", "color_message", "taskName"}
)


# CPython's C encoder, built once with `json.dumps`'s defaults (separators, NaN
# allowed) plus non-ASCII kept and `str` for anything else: `dumps` and
# `JSONEncoder.encode` build a new one on every call, about 1 us of a line's 3.
# No circular-reference check: a line is a flat dict.
_ENCODE = c_make_encoder(None, str, encode_basestring, None, ": ", ", ", False, False, True)


@lru_cache(maxsize=2)
def _utc_second(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


def timestamp(created: float) -> str:
    """`created` (``time.time()``) as ISO 8601 UTC to the millisecond, as
    ``datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")``
    writes it, in a third of the time: the part up to the second is formatted
    once per second, and the microseconds are rounded the way `datetime` does."""
    fraction, second = math.modf(created)
    micros = round(fraction * 1e6)
    if micros == 1_000_000:
        second, micros = second + 1, 0
    return f"{_utc_second(int(second))}.{micros // 1000:03d}+00:00"


def json_line(created: float, level: int, logger: str, message: str, fields: dict[str, Any]) -> str:
    """One log line: ``{"ts", "level", "logger", "message", ...fields}`` as JSON.

    The one definition of the line's shape, for `JsonFormatter` and for the
    access lines that `service.request_log` writes without a `LogRecord`.
    """
    entry: dict[str, Any] = {
        "ts": timestamp(created),
        "level": logging.getLevelName(level).lower(),
        "logger": logger,
        "message": message,
        **fields,
    }
    return "".join(_ENCODE(entry, 0))


def json_pairs(fields: dict[str, Any]) -> str:
    """``"key": value, ...`` exactly as `json_line` writes them, without the braces:
    pairs that repeat from line to line can be encoded once and spliced in."""
    return "".join(_ENCODE(fields, 0))[1:-1]


def json_string(text: str) -> str:
    """`text` as a JSON string, as `json_line` writes string values."""
    return encode_basestring(text)  # type: ignore[no-any-return]


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "message", "request_id", ...extra, "exc_info"?}``."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {}
        request_id = request_id_var.get()
        if request_id is not None:
            fields["request_id"] = request_id
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                fields[key] = value
        if record.exc_info:
            fields["exc_info"] = self.formatException(record.exc_info)
        return json_line(record.created, record.levelno, record.name, record.getMessage(), fields)


def configure_logging(level: str) -> None:
    """Send the ``service`` loggers to stderr as JSON (idempotent: one handler)."""
    logger = logging.getLogger("service")
    logger.setLevel(level.upper())
    logger.propagate = False
    if not any(isinstance(h.formatter, JsonFormatter) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        logger.addHandler(handler)


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
