"""Strict JSON request bodies: the content type, and JSON that is really JSON.

Python's `json` accepts ``NaN`` / ``Infinity`` and turns ``1e999`` into
``inf``; FastAPI accepts any body when the content type is missing.  Routes
of `StrictJSONRoute` instead require ``application/json`` (or ``+json``) and
parse with `strict_loads`, which rejects non-finite numbers, integers beyond
64 bits, duplicate keys and lone UTF-16 surrogates (``"\\ud800"`` is valid
JSON syntax but no Unicode character: it cannot be encoded back into a UTF-8
answer or log line), naming the field where it can.
"""

from __future__ import annotations

import email.message
import functools
import inspect
import json
import re
from collections.abc import Callable, Coroutine
from typing import Any, Final

from fastapi import Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.dependencies.utils import request_body_to_args, request_params_to_args
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute, serialize_response
from pydantic_core import PydanticUndefined as Undefined

from service.cache import LRUCache
from service.errors import MalformedJSONError, UnsupportedMediaTypeError
from service.middleware import raw_header

INT64_MAX = (1 << 63) - 1
# Valid query strings of a direct route, up to this long, and their validated
# values (`_QueryValidator`).
QUERY_CACHE_SIZE: Final = 256
MAX_CACHED_QUERY_BYTES: Final = 1024
_IMMUTABLE_VALUES: Final = frozenset({str, int, float, bool, type(None)})
_MAX_INT_DIGITS = len(str(INT64_MAX))
_SURROGATE = re.compile("[\ud800-\udfff]")
_NOT_UNICODE = "holds a lone UTF-16 surrogate, which is not a Unicode character"


class _Rejected:
    """Placeholder for a number JSON cannot carry; `strict_loads` reports its path."""

    def __init__(self, why: str) -> None:
        self.why = why


def _parse_constant(name: str) -> _Rejected:
    return _Rejected(f"{name} is not valid JSON; send a finite number or null")


def _parse_float(text: str) -> float | _Rejected:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        return _Rejected(f"{text} is beyond the range of a 64-bit float")
    return value


def _parse_int(text: str) -> int | _Rejected:
    # Checked on the text first: int() of a 100k-digit string is slow.
    if len(text.lstrip("-")) > _MAX_INT_DIGITS or abs(int(text)) > INT64_MAX:
        return _Rejected(f"{text[:24]}{'...' if len(text) > 24 else ''} is beyond 64-bit range")
    return int(text)


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object; a repeated key is ambiguous (which one wins?), so an error."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if _SURROGATE.search(key):
            # !a (ascii): the key itself cannot go into the answer as it is.
            raise MalformedJSONError(f"the object key {key!a} {_NOT_UNICODE}")
        if key in result:
            raise MalformedJSONError(f"duplicate key {key!r} in a JSON object", field=key)
        result[key] = value
    return result


# Built once: `json.loads` with hooks builds a new decoder on every call (~2 us).
_DECODER = json.JSONDecoder(
    parse_constant=_parse_constant,
    parse_float=_parse_float,
    parse_int=_parse_int,
    object_pairs_hook=_object,
)


def strict_loads(body: bytes) -> Any:
    """Parse a request body as strict JSON or raise `MalformedJSONError`."""
    try:
        # As `json.loads` reads bytes: UTF-8, -16 or -32, detected.
        value = _DECODER.decode(body.decode(json.detect_encoding(body), "surrogatepass"))
    except json.JSONDecodeError as exc:
        raise MalformedJSONError(
            f"body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except UnicodeDecodeError:
        raise MalformedJSONError("body is not UTF-8 encoded JSON") from None
    except RecursionError:
        raise MalformedJSONError("body is nested too deeply") from None
    _reject_unrepresentable(value)
    return value


def _reject_unrepresentable(value: Any) -> None:
    """Raise for the first `_Rejected` number or surrogate string, with its path.

    Iterative: no recursion.  Keys were checked by `_object`, so paths are clean.
    """
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, _Rejected):
            raise MalformedJSONError(item.why, field=path or None)
        if isinstance(item, str) and _SURROGATE.search(item):
            why = f"the string {item[:40]!a} {_NOT_UNICODE}"
            raise MalformedJSONError(why, field=path or None)
        if isinstance(item, dict):
            stack.extend((f"{path}.{k}" if path else k, v) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(item))


@functools.lru_cache(maxsize=64)  # clients repeat their content type; parsing it costs ~2 us
def is_json_media_type(content_type: str | None) -> bool:
    """``application/json`` or ``application/*+json``, parameters (charset) allowed."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


class _ParsedRequest(Request):
    """A request whose body was already read and parsed by `StrictJSONRoute`."""

    def __init__(self, request: Request, body: bytes, parsed: Any) -> None:
        super().__init__(request.scope, request.receive)
        self._parsed_body = body
        self._parsed_json = parsed

    async def body(self) -> bytes:
        return self._parsed_body

    async def json(self) -> Any:
        return self._parsed_json


async def _read_json(request: Request) -> tuple[bytes, Any]:
    """The body and its strict parse (`Undefined` for an empty body: FastAPI's
    "body: Field required"); a non-JSON content type is a 415."""
    body = await request.body()
    if not body:
        return body, Undefined
    # Raw: FastAPI parses the headers of the request it is handed anyway.
    content_type = raw_header(request.scope, b"content-type")
    if not is_json_media_type(content_type):
        raise UnsupportedMediaTypeError(
            f"send the body as application/json, not {content_type or 'no content type'}"
        )
    return body, strict_loads(body)


def _is_direct(dependant: Dependant) -> bool:
    """An async endpoint of query parameters, at most one JSON body and maybe the request."""
    others = (
        dependant.path_params,
        dependant.header_params,
        dependant.cookie_params,
        dependant.dependencies,
        dependant.response_param_name,
        dependant.background_tasks_param_name,
        dependant.websocket_param_name,
        dependant.http_connection_param_name,
        dependant.security_scopes_param_name,
    )
    return (
        len(dependant.body_params) <= 1
        and not any(others)
        and inspect.iscoroutinefunction(dependant.call)
    )


class _QueryValidator:
    """A direct route's query parameters, validated by FastAPI, remembered per query string.

    The values are a pure function of the raw query string, and FastAPI's
    `request_params_to_args` inspects every parameter's annotation again on
    every call: ~30 us of ``/describe``'s ~80 (``bench/asgi_layers.py``, min),
    most of what the service spent beyond the bare app.  Only error-free
    results of immutable values are kept (errors are never cached, and an
    endpoint cannot alter a stored value); a request gets its own dict.
    """

    def __init__(self, fields: list[Any]) -> None:
        self.fields = fields
        self._valid = LRUCache(QUERY_CACHE_SIZE)

    def __call__(self, request: Request) -> tuple[dict[str, Any], list[Any]]:
        raw: bytes = request.scope["query_string"]
        cacheable = len(raw) <= MAX_CACHED_QUERY_BYTES
        known = self._valid.get(raw) if cacheable else None
        if known is not None:
            return dict(known), []
        values, errors = request_params_to_args(self.fields, request.query_params)
        if cacheable and not errors and all(type(v) in _IMMUTABLE_VALUES for v in values.values()):
            self._valid.put(raw, dict(values))
        return values, errors


class StrictJSONRoute(APIRoute):
    """An `APIRoute` whose JSON body is checked by content type and parsed strictly.

    An endpoint of just query parameters, a body and the request is called
    directly: its inputs are validated with FastAPI's own
    `request_params_to_args` / `request_body_to_args` (the same errors, the
    same 422s; valid query strings remembered), without the rest of FastAPI's per-request machinery
    (dependency solving, endpoint context, telemetry) - ~45 us a request,
    more than uvicorn leaves for the whole service (``bench/asgi_layers.py``).
    Any other signature goes through FastAPI's handler, after the strict parse.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        if _is_direct(self.dependant):
            return self._direct_handler()
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def strict_handler(request: Request) -> Response:
            body, parsed = await _read_json(request)
            if parsed is Undefined:
                return await handler(request)
            return await handler(_ParsedRequest(request, body, parsed))

        return strict_handler

    def _direct_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        endpoint = self.dependant.call
        assert endpoint is not None
        validate_query = _QueryValidator(self.dependant.query_params)
        body_field = self.body_field
        request_name = self.dependant.request_param_name
        status_code = self.status_code or 200

        async def direct_handler(request: Request) -> Response:
            # FastAPI's order: the body is read (400 / 415) before anything is
            # validated, and query errors come before body errors.
            parsed = (await _read_json(request))[1] if body_field is not None else Undefined
            values, errors = validate_query(request)
            if body_field is not None:
                body_values, body_errors = await request_body_to_args(
                    body_fields=[body_field], received_body=parsed, embed_body_fields=False
                )
                values.update(body_values)
                errors.extend(body_errors)
            if errors:
                raise RequestValidationError(errors, body=parsed)
            if request_name is not None:
                values[request_name] = request
            answer = await endpoint(**values)
            if isinstance(answer, Response):
                return answer
            content = await serialize_response(field=self.response_field, response_content=answer)
            return JSONResponse(content, status_code=status_code)

        return direct_handler
