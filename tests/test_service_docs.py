"""/docs and /redoc work without network: every asset they load is served by the service."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from tests.conftest import service_client

_ASSET = re.compile(r"""(?:src|href)=["']([^"']+)["']|url:\s*["']([^"']+)["']""")


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_page_and_its_assets_come_from_the_service(api: TestClient, page: str) -> None:
    response = api.get(page)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    urls = [a or b for a, b in _ASSET.findall(response.text)]
    assert urls, response.text
    for url in urls:
        assert url.startswith("/"), f"{page} loads {url} from elsewhere"
        asset = api.get(url)
        assert asset.status_code == 200, url
        assert asset.content, url
    assert "validatorUrl" not in response.text or '"validatorUrl": null' in response.text


def test_with_bearer_auth_the_pages_need_the_token_too() -> None:
    token = "docs-" + "0123456789abcdef" * 2
    with service_client(auth_tokens=token) as api:
        assert api.get("/docs").status_code == 401
        assert api.get("/openapi.json").status_code == 401
        authorized = {"Authorization": f"Bearer {token}"}
        assert api.get("/docs", headers=authorized).status_code == 200
        assert api.get("/openapi.json", headers=authorized).status_code == 200
