"""Bearer-token authentication and CORS: off by default, configured from settings.

Authentication and CORS sit in front of every route; /resolve, /describe and
the probes answer while the dry-run worker still starts, so no test waits for it.
"""

from __future__ import annotations

import contextlib
import hmac
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.security import BearerAuthMiddleware
from service.settings import Settings

TOKEN = "a" * 24 + "0123456789abcdef"
OTHER_TOKEN = "Zm9vYmFyYmF6cXV4cXV1eGNvcmdlZ3JhdWx0Z2FycGx5d2FsZG8="
ORIGIN = "https://dash.example.com"
RESOLVE = {"tier": "auto", "gpu": "A100-80GB"}


# Clients whose lifespan (the service's state) runs until their test ends.
_open = contextlib.ExitStack()


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    with _open:
        yield


def _client(**settings: Any) -> TestClient:
    client = TestClient(create_app(Settings(**settings)), raise_server_exceptions=True)
    return _open.enter_context(client)


@pytest.fixture(scope="module")
def locked() -> Iterator[TestClient]:
    app = create_app(Settings(auth_tokens=f"{TOKEN},{OTHER_TOKEN}"))
    with TestClient(app, raise_server_exceptions=True) as client:
        yield client


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_auth_is_off_by_default() -> None:
    response = _client().post("/resolve", json=RESOLVE)
    assert response.status_code == 200, response.text
    assert "WWW-Authenticate" not in response.headers


def test_a_request_without_a_token_gets_401_with_a_bearer_challenge(locked: TestClient) -> None:
    response = locked.post("/resolve", json=RESOLVE)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="ckpt-advisor"'
    body = response.json()
    assert body["error"] == "unauthorized" and body["field"] == "authorization"
    assert "Bearer" in body["detail"]


@pytest.mark.parametrize(
    "header",
    [
        f"Bearer {TOKEN[:-1]}",  # a prefix
        f"Bearer {TOKEN}x",  # an extension
        f"Bearer {TOKEN.upper()}",  # tokens are case-sensitive
        f"Bearer {TOKEN},{OTHER_TOKEN}",  # the setting's text is not a token
    ],
)
def test_a_wrong_token_gets_invalid_token(locked: TestClient, header: str) -> None:
    response = locked.post("/resolve", json=RESOLVE, headers={"Authorization": header})
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == (
        'Bearer realm="ckpt-advisor", error="invalid_token"'
    )


@pytest.mark.parametrize(
    "header", ["Basic dXNlcjpwYXNz", TOKEN, "Bearer", "Bearer ", f"Token {TOKEN}"]
)
def test_another_scheme_or_no_token_is_refused(locked: TestClient, header: str) -> None:
    response = locked.post("/resolve", json=RESOLVE, headers={"Authorization": header})
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="ckpt-advisor"'


@pytest.mark.parametrize("header", [f"Bearer {TOKEN}", f"bearer {OTHER_TOKEN}"])
def test_every_configured_token_is_accepted_scheme_case_insensitive(
    locked: TestClient, header: str
) -> None:
    response = locked.post("/resolve", json=RESOLVE, headers={"Authorization": header})
    assert response.status_code == 200, response.text
    assert response.json()["granularity"] == "medium"


def test_probes_stay_open_and_everything_else_needs_the_token(locked: TestClient) -> None:
    assert locked.get("/healthz").status_code == 200
    # Ready or still warming up (the lifespan runs), but answered without a token.
    ready = locked.get("/readyz")
    assert ready.status_code in (200, 503) and "WWW-Authenticate" not in ready.headers
    assert ready.json().get("status") == "ready" or ready.json()["error"] == "not_ready"
    for path in ("/metrics", "/presets", "/openapi.json", "/docs", "/describe", "/nowhere"):
        assert locked.get(path).status_code == 401, path
        assert locked.get(path, headers=_bearer(TOKEN)).status_code in (200, 404), path


def test_the_token_is_checked_before_the_body_is_read(locked: TestClient) -> None:
    # Over the 1 MiB body limit: without a token the answer is 401, not 413.
    body = b"x" * (2 << 20)
    headers = {"content-type": "application/json"}
    assert locked.post("/resolve", content=body, headers=headers).status_code == 401
    authorized = locked.post("/resolve", content=body, headers={**headers, **_bearer(TOKEN)})
    assert authorized.status_code == 413


def test_every_token_is_compared_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Constant time across tokens: a match on the first token does not skip the others."""
    compare = hmac.compare_digest
    calls: list[tuple[bytes, bytes]] = []

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return compare(a, b)

    tokens = [TOKEN, OTHER_TOKEN, "c" * 40]
    middleware = BearerAuthMiddleware(app=None, tokens=tokens)  # type: ignore[arg-type]
    monkeypatch.setattr(hmac, "compare_digest", counting)
    for header, accepted in ((f"Bearer {TOKEN}", True), ("Bearer nope", False)):
        calls.clear()
        assert (middleware._problem(header) is None) is accepted
        assert len(calls) == len(tokens)
        # Digests: equal lengths whatever the tokens' lengths.
        assert {len(a) for a, _ in calls} | {len(b) for _, b in calls} == {32}


def test_unauthorized_answers_are_counted(locked: TestClient) -> None:
    locked.get("/presets")
    metrics = locked.get("/metrics", headers=_bearer(TOKEN)).text
    assert 'route="<unmatched>",status="401"' in metrics


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "empty item"),
        (f"{TOKEN},", "empty item"),
        ("short-token", "use at least 32"),
        (f"{TOKEN} x", "characters a Bearer token cannot carry"),
        ("é" * 40, "characters a Bearer token cannot carry"),
    ],
)
def test_bad_tokens_are_refused_at_startup_without_echoing_them(
    monkeypatch: pytest.MonkeyPatch, value: str, problem: str
) -> None:
    monkeypatch.setenv("CKPT_AUTH_TOKENS", value)
    with pytest.raises(ValueError, match=problem) as caught:
        Settings()
    if value:
        assert value not in str(caught.value)


def test_tokens_come_from_the_environment_and_never_show(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPT_AUTH_TOKENS", f" {TOKEN} , {OTHER_TOKEN}")
    settings = Settings()
    assert [t.get_secret_value() for t in settings.auth_tokens] == [TOKEN, OTHER_TOKEN]
    assert TOKEN not in repr(settings) and TOKEN not in str(settings.model_dump())


def test_cors_is_off_by_default() -> None:
    response = _client().post("/resolve", json=RESOLVE, headers={"Origin": ORIGIN})
    assert response.status_code == 200
    assert not any(h.lower().startswith("access-control-") for h in response.headers)


@pytest.fixture(scope="module")
def cors() -> TestClient:
    return _client(cors_origins=f"{ORIGIN},http://localhost:3000", auth_tokens=TOKEN)


def test_cors_allows_a_listed_origin_and_exposes_the_service_headers(cors: TestClient) -> None:
    response = cors.post("/resolve", json=RESOLVE, headers={"Origin": ORIGIN, **_bearer(TOKEN)})
    assert response.status_code == 200
    assert response.headers["Access-Control-Allow-Origin"] == ORIGIN
    exposed = response.headers["Access-Control-Expose-Headers"].lower().replace(" ", "")
    assert {"x-request-id", "x-cache", "retry-after"} <= set(exposed.split(","))
    assert "Access-Control-Allow-Credentials" not in response.headers


def test_a_preflight_needs_no_token_and_allows_the_authorization_header(cors: TestClient) -> None:
    response = cors.options(
        "/dry-run",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert response.status_code == 200
    assert response.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "authorization" in response.headers["Access-Control-Allow-Headers"].lower()


def test_a_browser_can_read_a_401(cors: TestClient) -> None:
    response = cors.post("/resolve", json=RESOLVE, headers={"Origin": ORIGIN})
    assert response.status_code == 401
    assert response.headers["Access-Control-Allow-Origin"] == ORIGIN


@pytest.mark.parametrize(
    ("origin", "method"),
    [("https://evil.example.com", "POST"), (ORIGIN, "DELETE")],
)
def test_a_refused_preflight_is_a_json_400(cors: TestClient, origin: str, method: str) -> None:
    response = cors.options(
        "/resolve", headers={"Origin": origin, "Access-Control-Request-Method": method}
    )
    assert response.status_code == 400
    assert response.json()["error"] == "cors_rejected"


def test_an_unlisted_origin_gets_no_cors_headers(cors: TestClient) -> None:
    response = cors.post(
        "/resolve", json=RESOLVE, headers={"Origin": "https://evil.example.com", **_bearer(TOKEN)}
    )
    assert response.status_code == 200  # the browser, not the server, withholds it
    assert "Access-Control-Allow-Origin" not in response.headers


@pytest.mark.parametrize(
    "origin", ["https://dash.example.com/", "dash.example.com", "https://a.example/path", "ftp://x"]
)
def test_malformed_origins_are_refused_at_startup(origin: str) -> None:
    with pytest.raises(ValueError, match="CORS origin"):
        Settings(cors_origins=origin)
