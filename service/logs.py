"""Structured logs: one JSON object per line on stderr, with the request id.

The request id lives in a context variable set by the request middleware, so
every log line written while a request is handled carries it, whichever
module writes it.  `uvicorn_log_config` routes uvicorn's own loggers through
the same formatter when the service is started with ``python -m service``.
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)

# LogRecord attributes that are not "extra" fields passed by the caller.
_STANDARD_ATTRS = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys()
    | {"message", "asctime", "color_message", "taskName"}
)


# Built once: `json.dumps` with options builds a new encoder on every call.
_ENCODER = json.JSONEncoder(default=str, ensure_ascii=False)


def json_line(created: float, level: int, logger: str, message: str, fields: dict[str, Any]) -> str:
    """One log line: ``{"ts", "level", "logger", "message", ...fields}`` as JSON.

    The one definition of the line's shape, for `JsonFormatter` and for the
    access lines that `service.request_log` writes without a `LogRecord`.
    """
    entry: dict[str, Any] = {
        "ts": datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds"),
        "level": logging.getLevelName(level).lower(),
        "logger": logger,
        "message": message,
        **fields,
    }
    return _ENCODER.encode(entry)


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
