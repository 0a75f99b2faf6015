"""Helpers for tests of functions served over HTTP (``ss.serve``) and executed
by the server's pusher: register a served app in the store through the apps
registry's own transaction (``appsync.registration``: the endpoint of an
in-process test is reached through an ASGI transport, not a URL the server
could fetch), and run a ``Pusher`` on a loop of its own next to a test's
blocking code."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

import stepstone as ss
from stepstone import appsync
from stepstone.bridge import Portal
from stepstone.introspection import AppDocument, describe_app
from stepstone.pusher import Pusher, PushSettings
from stepstone.signing import SIGNATURE_HEADER, SigningKeys, sign, verify

KEY = "k" * 32
KEYS = SigningKeys.of(KEY)


def fetch_document(url: str, keys: SigningKeys = KEYS) -> AppDocument:
    """The endpoint's signed app document (a signed GET, the answer verified)."""
    response = httpx.get(url, headers={SIGNATURE_HEADER: sign(b"", keys)}, timeout=10)
    assert response.status_code == 200, response.text
    verify(response.headers.get(SIGNATURE_HEADER), response.content, keys)
    return AppDocument.from_json(response.json())


def register_served(client: ss.App, document: AppDocument, url: str) -> None:
    """Register ``document``'s functions as served at ``url`` (what ``sync`` commits)."""
    configs = appsync.function_configs(url, document)
    client.store.transact_sync(appsync.registration(url, document, configs, time.time()))
    client.catalog.invalidate()


def register_app(client: ss.App, served: ss.App, url: str) -> None:
    """``register_served`` with the document ``served``'s endpoint answers GET with."""
    register_served(
        client, describe_app(served.name, served.registry, app_version=None, max_duration=60), url
    )


@contextmanager
def pushing(
    client: ss.App,
    transport: httpx.AsyncBaseTransport | None = None,
    keys: SigningKeys = KEYS,
    **settings: Any,
) -> Iterator[Pusher]:
    """A pusher over ``client``'s database (as ``stepstone server`` runs one)."""
    portal = Portal("test-pusher")
    settings.setdefault("refresh", 0.1)
    pusher = Pusher(
        store=client.store,
        clock=client.clock,
        catalog=lambda: client.catalog.registry(client.store),
        keys=keys,
        settings=PushSettings(**settings),
        transport=transport,
    )
    portal.call(pusher.start())
    try:
        yield pusher
    finally:
        portal.call(pusher.stop(drain_timeout=5.0))
        portal.close()
