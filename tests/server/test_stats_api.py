"""The database's size over HTTP (issue 17): ``GET /api/v1/stats`` and
``ss.Client.stats()`` give the figures ``stepstone stats`` gives, behind the
API key; on both stores."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import pytest

import stepstone as ss
from stepstone.inventory import DatabaseStats, EndedRun, database_stats
from tests.server.conftest import API_KEY, EVENT_KEY, Shop


def test_stats_over_http_and_the_client_are_the_databases(shop: Shop) -> None:
    first = shop.wait(shop.run_of(shop.send("hello", {"name": "ada"}))["id"])
    shop.wait(shop.run_of(shop.send("hello", {"name": "bob"}))["id"])
    local = shop.app.store.read_sync(database_stats)
    body = shop.http.get("/api/v1/stats").json()
    tables = {t["name"]: t for t in body["tables"]}
    expected = {t.name: t.rows for t in local.tables}
    assert set(tables) == set(expected) and tables["runs"]["rows"] == expected["runs"] == 2
    assert tables["steps"]["rows"] == expected["steps"] == 4
    assert body["oldest_ended"]["id"] == first["id"] and body["oldest_ended"]["status"] == "completed"
    assert body["total_bytes"] > 0

    with ss.Client(shop.live.url, api_key=API_KEY) as client:
        remote = client.stats()
        assert _same(remote.oldest_ended, local.oldest_ended)  # the same record, through JSON
        assert {t.name: t.rows for t in remote.tables}["runs"] == 2
        assert {t.name for t in remote.tables} == set(expected)

    async def remotely() -> DatabaseStats:
        async with ss.Client(shop.live.url, api_key=API_KEY) as client:
            return await client.stats_async()

    assert _same(asyncio.run(remotely()).oldest_ended, local.oldest_ended)


def _same(remote: EndedRun | None, local: EndedRun | None) -> bool:
    """Equal records, the time to the microsecond (an RFC 3339 date-time's precision)."""
    assert remote is not None and local is not None
    return remote == dataclasses.replace(local, ended_at=remote.ended_at) and (
        abs(remote.ended_at - local.ended_at) < 1e-5
    )


def test_stats_need_the_api_key(shop: Shop) -> None:
    for headers in ({}, {"Authorization": f"Bearer {EVENT_KEY}"}, {"Authorization": "Bearer wrong"}):
        response = httpx.get(f"{shop.live.url}/api/v1/stats", headers=headers)
        assert response.status_code == 401, (headers, response.text)
    with ss.Client(shop.live.url, api_key="wrong") as client, pytest.raises(ss.AuthenticationError):
        client.stats()


def test_an_empty_database_has_no_oldest_ended_run(shop: Shop) -> None:
    body = shop.http.get("/api/v1/stats").json()
    assert body["oldest_ended"] is None
    with ss.Client(shop.live.url, api_key=API_KEY) as client:
        assert client.stats().oldest_ended is None
