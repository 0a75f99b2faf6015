"""The endpoint of ``ss.serve``: unsigned or badly signed requests get 401 and
run nothing; a signed introspection request gets the app's functions, signed."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

import stepstone as ss
from stepstone.introspection import AppDocument
from stepstone.signing import SIGNATURE_HEADER, SigningKeys, sign, verify

KEYS = SigningKeys.of("endpoint-key-0123456789")


def _app() -> ss.App:
    app = ss.App("served", database_url="sqlite:///never-opened.db", app_version="v7")

    @app.function(id="charge", trigger=ss.on_event("order/placed"), retries=2)
    async def charge(ctx: ss.Context) -> None:
        return None

    return app


def _get(app: ss.App, header: str | None) -> httpx.Response:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=ss.serve(app, signing_key=KEYS.current, max_duration=30))
        async with httpx.AsyncClient(transport=transport, base_url="http://endpoint") as client:
            return await client.get("/", headers={SIGNATURE_HEADER: header} if header else {})

    return asyncio.run(call())


def test_a_signed_introspection_lists_the_functions_and_is_signed() -> None:
    app = _app()
    response = _get(app, sign(b"", KEYS))
    assert response.status_code == 200
    verify(response.headers[SIGNATURE_HEADER], response.content, KEYS)
    document = AppDocument.from_json(response.json())
    assert (document.app, document.app_version, document.max_duration) == ("served", "v7", 30.0)
    [charge] = document.functions
    assert charge["id"] == "charge" and charge["retries"] == 2
    assert charge["triggers"] == [{"event": "order/placed", "if": None}]
    assert app._store is None  # the endpoint opened no database


def test_a_missing_wrong_or_stale_signature_gets_401() -> None:
    app = _app()
    other = SigningKeys.of("another-key-0123456789")
    for header in (None, sign(b"", other), sign(b"", KEYS, time.time() - 3600), "t=1,s=zz"):
        response = _get(app, header)
        assert response.status_code == 401, header
        assert "functions" not in json.loads(response.content)
