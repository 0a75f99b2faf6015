"""``/docs`` works offline (issue 20): a page rendered from the OpenAPI schema by
the package itself, loading nothing from another host, and saying of every
endpoint which key it needs, or that it is open."""

from __future__ import annotations

import re
from collections.abc import Callable

import httpx

import stepstone as ss
from stepstone.server.auth import AuthConfig
from tests.server.conftest import Live, Shop


def test_docs_load_nothing_from_another_host(shop: Shop) -> None:
    page = httpx.get(f"{shop.live.url}/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assets = re.findall(r'(?:src|href)="([^"#]+)"', page.text)
    assert assets, page.text[:500]
    for asset in assets:
        assert asset.startswith(("/", "data:")), asset  # no CDN, no other host
        if asset.startswith(("/static/", "/openapi.json")):
            assert httpx.get(shop.live.url + asset).status_code == 200, asset
    assert httpx.get(f"{shop.live.url}/redoc").status_code == 404  # no CDN-backed page left


def test_docs_list_every_endpoint_with_the_key_it_needs(shop: Shop) -> None:
    schema = httpx.get(f"{shop.live.url}/openapi.json").json()
    page = httpx.get(f"{shop.live.url}/docs").text
    operations = [(m.upper(), p, op) for p, ops in schema["paths"].items() for m, op in ops.items()]
    assert len(operations) > 10
    for method, path, operation in operations:
        row = re.search(rf'<tr id="{method}-[^"]*"[^>]*data-path="{re.escape(path)}".*?</tr>', page, re.S)
        assert row, (method, path)
        expected = {"api": "API key", "ingest": "event key or API key"}.get(
            operation.get("x-stepstone-key"), "open"
        )
        assert f'data-key="{expected}"' in row.group(0), (method, path, row.group(0))
    keys = {(m, p): op.get("x-stepstone-key") for m, p, op in operations}
    assert keys[("GET", "/healthz")] is None
    assert keys[("POST", "/api/v1/events")] == "ingest"
    assert keys[("GET", "/api/v1/runs")] == "api"
    assert keys[("GET", "/metrics")] == "api"
    assert "open" in page and "/healthz" in page


def test_docs_of_a_server_without_keys_say_every_endpoint_is_open(
    serve: Callable[..., Live], make_app: Callable[..., ss.App]
) -> None:
    live = serve(make_app("open"), auth=AuthConfig.resolve(insecure=True, env={}))
    page = httpx.get(f"{live.url}/docs").text
    assert 'data-key="API key"' not in page and 'data-key="open"' in page
