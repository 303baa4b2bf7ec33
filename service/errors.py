"""Every error the service answers, as ``{"error": code, "detail": message, "field": path}``.

Status codes, one rule each:

- 400: the body is not acceptable JSON (syntax, NaN / Infinity, numbers out of range,
  duplicate keys, lone UTF-16 surrogates), or a CORS preflight the settings refuse;
- 401 (+ ``WWW-Authenticate: Bearer``): a bearer token is required (``CKPT_AUTH_TOKENS``)
  and the request has none, or a wrong one;
- 408: the client did not send its whole body within ``CKPT_BODY_TIMEOUT_S``;
- 413: the body is larger than ``CKPT_MAX_BODY_BYTES``;
- 415: a body that is not ``application/json``;
- 422: valid JSON (or query) whose values are wrong: request-schema errors and
  every ckpt_core `CkptError` that is a `ValueError` (unknown tier, bad GPU
  memory, unknown preset, config over the bounds, ...);
- 409: a ckpt_core error about state, not values (`CheckpointConflictError`);
- 429 (+ ``Retry-After``): a worker pool (dry runs, estimates with a model) and its
  queue are full;
- 501: the dry run asked for a feature this build lacks;
- 503: a pool's worker died mid-job (it is replaced), or (+ ``Retry-After``) the
  service is shutting down and its grace period ended mid-request; retry;
- 504: a dry run or an estimate hit its time limit (its worker was killed and replaced);
- 500: a bug in the service, never input (logged with a traceback).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ckpt_core import CkptError, InvalidWorkloadError

log = logging.getLogger(__name__)

_LOCATIONS = frozenset({"body", "query", "path", "header", "cookie"})


class ServiceError(Exception):
    """An error of the transport layer (not of ckpt_core) with its HTTP status."""

    status = 400
    code = "bad_request"

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.headers = headers
        if code is not None:  # one class, several codes: the pool errors name their pool
            self.code = code


class MalformedJSONError(ServiceError):
    """The body is not JSON the service accepts."""

    status = 400
    code = "malformed_json"


class UnsupportedMediaTypeError(ServiceError):
    """A request body that is not ``application/json``."""

    status = 415
    code = "unsupported_media_type"


class BodyTooLargeError(ServiceError):
    """A body over the size limit."""

    status = 413
    code = "body_too_large"


class BodyTimeoutError(ServiceError):
    """The client sent its body too slowly (or not at all) after the headers."""

    status = 408
    code = "body_timeout"


class ServiceUnavailableError(ServiceError):
    """The service stopped the request while shutting down (SIGTERM, grace period over)."""

    status = 503
    code = "shutting_down"


class UnauthorizedError(ServiceError):
    """No valid bearer token where one is required."""

    status = 401
    code = "unauthorized"


class PoolBusyServiceError(ServiceError):
    """Every worker of a pool is busy and its queue is full (``<pool>_busy``)."""

    status = 429
    code = "busy"


class JobTimeoutServiceError(ServiceError):
    """A job of a worker pool exceeded its time limit (``<pool>_timeout``)."""

    status = 504
    code = "timeout"


class WorkerCrashedServiceError(ServiceError):
    """A worker process died during its job (``<pool>_worker_crashed``)."""

    status = 503
    code = "worker_crashed"


class DryRunFailedError(ServiceError):
    """Building or hooking the model failed in a way ckpt_core did not classify.

    The input is a config transformers accepted; the build itself raised.  The
    worker logs the traceback; the caller gets the exception's type and text.
    """

    status = 422
    code = "dry_run_failed"


class DryRunUnavailableError(ServiceError):
    """The dry run needs a feature this build does not have (e.g. measurement)."""

    status = 501
    code = "not_implemented"


def error_body(code: str, detail: str, field: str | None) -> dict[str, Any]:
    """The one error shape every non-2xx answer has."""
    return {"error": code, "detail": detail, "field": field}


def error_response(
    status: int,
    code: str,
    detail: str,
    field: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(code, detail, field), status_code=status, headers=headers)


def service_error_response(exc: ServiceError) -> JSONResponse:
    """The answer for a transport error, whoever raised it (handler or middleware)."""
    return error_response(exc.status, exc.code, exc.message, exc.field, exc.headers)


def ckpt_status(exc: CkptError) -> int:
    """422 for bad values (every ValueError subclass), 409 for bad state."""
    return 422 if isinstance(exc, ValueError) else 409


def field_path(loc: Sequence[int | str]) -> str | None:
    """``("body", "model", "config", "layers", 0)`` -> ``"model.config.layers[0]"``."""
    parts = list(loc)
    if parts and parts[0] in _LOCATIONS:
        location = parts.pop(0)
        if not parts:
            return str(location)
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or None


async def _ckpt_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, CkptError)
    return error_response(ckpt_status(exc), exc.code, exc.message, exc.field)


async def _service_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    return service_error_response(exc)


# Schema errors inside these request objects are workload errors, as ckpt_core names them.
_WORKLOAD_OBJECTS = frozenset({"workload", "measure"})


def _validation_error_body(error: Mapping[str, Any]) -> tuple[str, str, str | None]:
    """(code, detail, field) of one pydantic error; a ckpt_core error raised by a
    validator keeps its own code and message."""
    field = field_path(error["loc"])
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, CkptError):
        return cause.code, cause.message, field
    loc = list(error["loc"])
    top = loc[1] if len(loc) > 1 and loc[0] == "body" else None
    code = InvalidWorkloadError.code if top in _WORKLOAD_OBJECTS else "invalid_request"
    message = str(cause) if cause is not None else error["msg"]
    return code, f"{field or 'request'}: {message}", field


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    # An unknown field first: it explains the rest (a misspelt seq_len is also missing).
    errors = sorted(exc.errors(), key=lambda e: e.get("type") != "extra_forbidden")
    if not errors:
        return error_response(422, "invalid_request", "the request is invalid", None)
    code, detail, field = _validation_error_body(errors[0])
    others = [f"{field_path(e['loc']) or 'request'}: {e['msg']}" for e in errors[1:5]]
    if len(errors) > 5:
        others.append(f"... and {len(errors) - 5} more")
    return error_response(422, code, "; ".join([detail, *others]), field)


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    return error_response(
        exc.status_code,
        codes.get(exc.status_code, "http_error"),
        str(exc.detail),
        headers=dict(exc.headers or {}),
    )


def install_error_handlers(app: FastAPI) -> None:
    """Map every expected exception to the error shape (the 500 path is in the middleware)."""
    app.add_exception_handler(CkptError, _ckpt_error)
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
