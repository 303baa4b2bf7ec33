"""Who may call the service: optional bearer-token authentication and CORS.

Both are off by default and configured from settings (``CKPT_AUTH_TOKENS``,
``CKPT_CORS_ORIGINS``).  With tokens set, every request except the probes
(``/healthz``, ``/readyz``) needs ``Authorization: Bearer <token>``; that
includes ``/metrics`` (Prometheus sends the token with ``authorization:`` in
its scrape config) and the OpenAPI pages.  Probes stay open because kubelets
and load balancers cannot send one, and they reveal nothing.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import Final

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import UnauthorizedError, error_response, service_error_response
from service.middleware import raw_header

OPEN_PATHS: Final = frozenset({"/healthz", "/readyz"})
REALM: Final = "ckpt-advisor"
_SCHEME: Final = "bearer"  # auth-scheme names are case-insensitive (RFC 9110 11.1)


def _digest(token: str) -> bytes:
    """SHA-256 of a token: equal-length inputs keep `hmac.compare_digest` constant-time."""
    return hashlib.sha256(token.encode()).digest()


class BearerAuthMiddleware:
    """401 with ``WWW-Authenticate: Bearer`` unless the request carries an accepted token.

    Runs before the body limit: a caller without a token never gets its body
    read.  Tokens are compared as SHA-256 digests with `hmac.compare_digest`,
    all of them every time, so the answer's timing says nothing about how
    much of a token matched, or which one.
    """

    def __init__(self, app: ASGIApp, tokens: Iterable[str]) -> None:
        self.app = app
        self._digests = tuple(_digest(token) for token in tokens)
        if not self._digests:
            raise ValueError("BearerAuthMiddleware needs at least one token")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        problem = self._problem(raw_header(scope, b"authorization"))
        if problem is None:
            await self.app(scope, receive, send)
            return
        await service_error_response(problem)(scope, receive, send)

    def _problem(self, header: str | None) -> UnauthorizedError | None:
        """None when `header` carries an accepted token, else the 401 to answer."""
        if header is None:
            return _unauthorized("send Authorization: Bearer <token>", error=None)
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != _SCHEME or not token.strip():
            return _unauthorized("the Authorization header is not 'Bearer <token>'", error=None)
        given = _digest(token.strip())
        accepted = False
        for digest in self._digests:  # no early exit: the same work whichever matches
            accepted |= hmac.compare_digest(given, digest)
        if accepted:
            return None
        return _unauthorized("the bearer token is not accepted", error="invalid_token")


def _unauthorized(detail: str, *, error: str | None) -> UnauthorizedError:
    """The 401 and its RFC 6750 challenge (``error="invalid_token"`` for a wrong token)."""
    challenge = f'Bearer realm="{REALM}"' + (f', error="{error}"' if error else "")
    return UnauthorizedError(detail, field="authorization", headers={"WWW-Authenticate": challenge})


class JSONCORSMiddleware(CORSMiddleware):
    """Starlette's CORS, with a refused preflight answered in the service's error shape."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        # Keep the CORS / Vary headers; the body and its framing are replaced.
        headers = {
            name: value
            for name, value in response.headers.items()
            if name not in ("content-length", "content-type")
        }
        detail = f"{bytes(response.body).decode()}; allowed: see CKPT_CORS_ORIGINS"
        return error_response(response.status_code, "cors_rejected", detail, headers=headers)


def cors_options(origins: Iterable[str]) -> dict[str, object]:
    """`JSONCORSMiddleware` keyword arguments for the allowed `origins`.

    No credentials mode: the bearer token travels in a header that the
    preflight allows, not as a cookie.  Browsers may read the request id, the
    cache marker and Retry-After.
    """
    return {
        "allow_origins": list(origins),
        "allow_methods": ["GET", "POST"],
        "allow_headers": ["Authorization", "Content-Type", "X-Request-ID"],
        "expose_headers": ["X-Request-ID", "X-Cache", "Retry-After"],
        "max_age": 600,
    }
