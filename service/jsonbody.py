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
import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from service.errors import MalformedJSONError, UnsupportedMediaTypeError
from service.middleware import raw_header

INT64_MAX = (1 << 63) - 1
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


@functools.lru_cache(maxsize=64)  # clients repeat their content type
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


class StrictJSONRequest(Request):
    """A request whose body `StrictJSONRoute` has read and parsed strictly.

    FastAPI reads a JSON body through `Request.body` and `Request.json`
    (FastAPI's documented custom-request pattern); these return the checked
    body and its strict parse.
    """

    def __init__(self, request: Request, body: bytes, parsed: Any) -> None:
        super().__init__(request.scope, request.receive)
        self._strict_body = body
        self._strict_json = parsed

    async def body(self) -> bytes:
        return self._strict_body

    async def json(self) -> Any:
        return self._strict_json


class StrictJSONRoute(APIRoute):
    """An `APIRoute` whose JSON body is checked by content type and parsed strictly.

    A non-empty body must be ``application/json`` (415) and strict JSON (400)
    before FastAPI validates it against the route's model; an empty body is
    left to FastAPI ("body: Field required", a 422).
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def strict_handler(request: Request) -> Response:
            body = await request.body()
            if not body:
                return await handler(request)
            content_type = raw_header(request.scope, b"content-type")
            if not is_json_media_type(content_type):
                raise UnsupportedMediaTypeError(
                    f"send the body as application/json, not {content_type or 'no content type'}"
                )
            return await handler(StrictJSONRequest(request, body, strict_loads(body)))

        return strict_handler
